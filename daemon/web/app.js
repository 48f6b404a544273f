// turnd's built-in chat page: plain JS on the /api routes and reply streams of SPEC §6.
// It is also the reference client: everything it does, another web UI can do the same way.

const DEFS = 'network.sharedcomputer.chat.defs';
const TEXT = `${DEFS}#textPart`;
const PART_TYPES = {
  [`${DEFS}#textPart`]: 'text', [`${DEFS}#reasoningPart`]: 'reasoning',
  [`${DEFS}#toolCallPart`]: 'toolCall', [`${DEFS}#toolResultPart`]: 'toolResult',
  [`${DEFS}#sourcePart`]: 'source', [`${DEFS}#imagePart`]: 'image', [`${DEFS}#filePart`]: 'file',
};
const POLL_MS = 2500;

const $ = (id) => document.getElementById(id);
const state = {
  token: localStorage.getItem('turnd.token'),
  conversations: [],
  skey: null,
  info: null,
  messages: new Map(), // key -> {key, cid, value}
  signature: '',
  chosen: {}, // parent key ('' for roots) -> chosen child key
  streams: new Map(), // reply key -> live stream state
  finished: new Map(), // reply key -> {ms, text} measured while streaming
  html: new Map(), // markdown text -> rendered html
  attachments: [],
  editing: null, // {key, text}
  open: new Set(), // open <details>, by id
  models: [],
  missing: new Map(), // reply key -> when its stream was last not found
};

// -- small helpers ---------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'text') el.textContent = value;
    else el.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) el.append(child);
  }
  return el;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Links open only http:, https: and mailto: URLs (SPEC §12): a sourcePart's url comes
// from a model or a tool, and javascript:/data: would run in or replace this page.
const SAFE_PROTOCOLS = new Set(['http:', 'https:', 'mailto:']);
function safeHref(url) {
  try {
    return SAFE_PROTOCOLS.has(new URL(String(url), window.location.href).protocol) ? String(url) : null;
  } catch {
    return null;
  }
}
function sourceLink(part) {
  const href = safeHref(part.url);
  const text = part.title || part.url || 'source';
  if (!href) return h('span', { class: 'source-unsafe', text: `${text} (link not opened: ${String(part.url).slice(0, 80)})` });
  return h('a', { href, target: '_blank', rel: 'noopener noreferrer nofollow', text });
}
const attemptOf = (key) => Number((/\.r(\d+)$/.exec(key) || [0, -1])[1]);
const replyKey = (userKey, attempt) => `${userKey}.r${attempt}`;
const isReply = (m) => m.value.role === 'assistant';

function announce(text) {
  $('announce').textContent = text;
}

class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
  }
}

async function api(path, { method = 'GET', json, body, headers = {} } = {}) {
  const init = { method, headers: { Authorization: `Bearer ${state.token}`, ...headers } };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers['Content-Type'] = 'application/json';
  } else if (body !== undefined) {
    init.body = body;
  }
  const res = await fetch(path, init);
  const data = res.headers.get('content-type')?.includes('json') ? await res.json() : null;
  if (res.status === 401) signOut('The token was refused; sign in again.');
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

function showError(err) {
  console.error(err);
  announce(`Error: ${err.message}`);
  const note = $('composer').querySelector('.form-error') || h('p', { class: 'form-error error', role: 'alert' });
  note.textContent = err.message;
  $('composer').prepend(note);
}

function clearError() {
  $('composer').querySelector('.form-error')?.remove();
}

// -- sign in ---------------------------------------------------------------------------------

async function signIn(token) {
  state.token = token;
  try {
    const models = await api('/api/models');
    localStorage.setItem('turnd.token', token);
    state.models = models;
  } catch (err) {
    state.token = null;
    localStorage.removeItem('turnd.token');
    $('signin-error').textContent = err.status === 401 ? 'That token is not valid.' : err.message;
    showSignIn();
    return;
  }
  $('signin').hidden = true;
  $('app').hidden = false;
  fillModels();
  await loadConversations();
  await selectConversation(location.hash.startsWith('#c=') ? location.hash.slice(3) : null);
  $('input').focus();
}

function showSignIn() {
  $('app').hidden = true;
  $('signin').hidden = false;
  $('token').focus();
}

function signOut(message = '') {
  state.token = null;
  localStorage.removeItem('turnd.token');
  for (const st of state.streams.values()) stopStream(st);
  state.streams.clear();
  $('signin-error').textContent = message;
  showSignIn();
}

function fillModels() {
  const select = $('model');
  const saved = localStorage.getItem('turnd.model');
  select.replaceChildren(...state.models.models.map((m) => h('option', {
    value: `${m.provider}:${m.id}`, text: m.label,
  })));
  const values = [...select.options].map((o) => o.value);
  select.value = values.includes(saved) ? saved : state.models.default;
  $('effort').value = localStorage.getItem('turnd.effort') || '';
}

function generation() {
  const [provider, ...rest] = $('model').value.split(':');
  const out = {};
  if (provider && rest.length) out.model = { provider, id: rest.join(':') };
  if ($('effort').value) out.effort = $('effort').value;
  return out;
}

// -- conversations ---------------------------------------------------------------------------

async function loadConversations() {
  const { conversations } = await api('/api/conversations');
  state.conversations = conversations;
  renderConversations();
}

function renderConversations() {
  const list = $('conversations');
  list.replaceChildren(...state.conversations.map((c) => {
    const when = c.updatedAt ? new Date(c.updatedAt).toLocaleString() : '';
    return h('li', {},
      h('button', {
        type: 'button', class: 'conversation', 'data-skey': c.skey,
        'aria-current': c.skey === state.skey ? 'page' : null,
        onclick: () => { selectConversation(c.skey); closeMenu(); },
      }, h('span', { class: 'title', text: c.title || 'Untitled' }), h('time', { text: when })));
  }));
  const current = state.conversations.find((c) => c.skey === state.skey);
  $('conv-title').textContent = state.skey ? (current?.title || 'Untitled') : 'New conversation';
}

async function selectConversation(skey) {
  state.skey = skey;
  state.messages = new Map();
  state.signature = '';
  state.editing = null;
  state.chosen = skey ? JSON.parse(sessionStorage.getItem(`turnd.chosen.${skey}`) || '{}') : {};
  history.replaceState(null, '', skey ? `#c=${skey}` : location.pathname);
  renderConversations();
  renderThread();
  if (skey) await loadConversation();
}

async function loadConversation() {
  const skey = state.skey;
  if (!skey) return;
  let data;
  try {
    data = await api(`/api/conversations/${skey}`);
  } catch (err) {
    if (err.status === 404) return selectConversation(null);
    throw err;
  }
  if (skey !== state.skey) return;
  const signature = data.messages.map((m) => `${m.key}@${m.cid}`).join(',');
  if (signature === state.signature) return;
  state.signature = signature;
  state.info = data.info;
  state.messages = new Map(data.messages.map((m) => [m.key, m]));
  renderThread();
  renderMarkdownLater();
}

function choose(parent, key) {
  state.chosen[parent] = key;
  if (state.skey) sessionStorage.setItem(`turnd.chosen.${state.skey}`, JSON.stringify(state.chosen));
}

// -- the branch ------------------------------------------------------------------------------

function children() {
  const out = new Map();
  for (const m of state.messages.values()) {
    const parent = m.value.parent || '';
    if (!out.has(parent)) out.set(parent, []);
    out.get(parent).push(m);
  }
  // Replies by attempt number (".r10" after ".r2"), user messages by key (TIDs sort by time).
  for (const list of out.values()) {
    list.sort((a, b) => (isReply(a) && isReply(b) ? attemptOf(a.key) - attemptOf(b.key)
      : a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }
  return out;
}

// The branch from the root to the chosen leaf: [{message, siblings}], plus a placeholder
// for a requested reply whose record is not written yet (queued, or about to be claimed).
function branch() {
  const kids = children();
  const path = [];
  let parent = '';
  for (;;) {
    const siblings = kids.get(parent);
    if (!siblings?.length) break;
    const message = siblings.find((m) => m.key === state.chosen[parent]) || siblings.at(-1);
    path.push({ message, siblings });
    parent = message.key;
  }
  const last = path.at(-1)?.message;
  const gen = last && !isReply(last) && last.value.generation;
  if (gen) {
    const key = replyKey(last.key, gen.attempt || 0);
    const waiting = { key, cid: null, value: { role: 'assistant', parent: last.key, status: 'pending', content: { parts: [] } }, placeholder: true };
    path.push({ message: waiting, siblings: [waiting] });
  }
  return path;
}

function currentLeafKey() {
  const path = branch().filter((p) => !p.message.placeholder);
  return path.at(-1)?.message.key;
}

function liveReplyOnBranch() {
  return branch().map((p) => p.message).find((m) => isReply(m) && isPending(m));
}

function isPending(m) {
  const st = state.streams.get(m.key);
  if (st) return !st.final;
  return m.value.status === 'pending' || m.value.status === undefined;
}

// -- rendering -------------------------------------------------------------------------------

function renderThread() {
  // Typing in an edit box: a poll or a finished stream must not rebuild it under the cursor.
  if (state.editing && document.activeElement?.id === `edit-${state.editing.key}`) return;
  const thread = $('thread');
  const focused = document.activeElement?.id;
  const path = state.skey ? branch() : [];
  thread.replaceChildren(...path.map(({ message, siblings }) => renderMessage(message, siblings)));
  $('empty').hidden = path.length > 0;
  if (focused && $(focused) && !$(focused).disabled) $(focused).focus();
  followPending(path);
  updateComposer();
  scrollToEnd();
}

// Every reply on the branch still being written gets followed; a reply that has no stream
// yet (a direct write not seen by the change feed yet) is asked for again a bit later.
function followPending(path = branch()) {
  for (const { message } of path) {
    if (!isReply(message) || !isPending(message) || state.streams.has(message.key)) continue;
    if (Date.now() - (state.missing.get(message.key) || 0) < POLL_MS - 100) continue;
    if (message.placeholder) {
      // No record yet: it is being claimed right now, or queued. Ask once it has waited a bit.
      const since = state.missing.get(`wait:${message.key}`) ?? state.missing.set(`wait:${message.key}`, Date.now()).get(`wait:${message.key}`);
      if (Date.now() - since < 1500) continue;
    }
    follow(state.skey, message.key);
  }
}

function scrollToEnd(force = false) {
  const main = document.scrollingElement;
  if (force || main.scrollHeight - main.scrollTop - main.clientHeight < 200) {
    main.scrollTop = main.scrollHeight;
  }
}

function siblingNav(message, siblings, noun) {
  if (siblings.length < 2) return null;
  const i = siblings.findIndex((m) => m.key === message.key);
  const at = message.value.parent || 'root';
  const go = (delta) => () => {
    const next = siblings[i + delta];
    if (!next) return;
    choose(message.value.parent || '', next.key);
    renderThread();
    renderMarkdownLater();
  };
  return h('span', { class: 'nav', role: 'group', 'aria-label': `${noun}s` },
    h('button', { type: 'button', class: 'ghost', id: `${noun}-prev-${at}`, 'aria-label': `Previous ${noun}`, 'aria-disabled': i === 0 ? 'true' : null, onclick: go(-1), text: '‹' }),
    h('span', { class: 'count', text: `${i + 1}/${siblings.length}` }),
    h('button', { type: 'button', class: 'ghost', id: `${noun}-next-${at}`, 'aria-label': `Next ${noun}`, 'aria-disabled': i === siblings.length - 1 ? 'true' : null, onclick: go(1), text: '›' }));
}

function renderMessage(message, siblings) {
  return isReply(message) ? renderReply(message, siblings) : renderUser(message, siblings);
}

function recordParts(value) {
  return (value.content?.parts || []).map((p) => {
    const type = PART_TYPES[p.$type] || 'unknown';
    return type === 'text' || type === 'reasoning' ? { type, text: p.text || '', done: true } : { type, part: p, done: true };
  });
}

function renderUser(message, siblings) {
  const { key, value } = message;
  const li = h('li', { class: 'message user', 'data-key': key });
  if (value.content?.$type && value.content.$type !== `${DEFS}#plainContent`) {
    li.append(h('p', { class: 'muted', text: 'Encrypted message (turnd cannot read it).' }));
    return li;
  }
  if (state.editing?.key === key) {
    const area = h('textarea', { id: `edit-${key}`, class: 'edit', rows: 3, 'aria-label': 'Edit message' });
    area.value = state.editing.text;
    area.addEventListener('input', () => { state.editing.text = area.value; });
    area.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); saveEdit(message); }
      if (ev.key === 'Escape') { ev.stopPropagation(); state.editing = null; renderThread(); }
    });
    li.append(area, h('div', { class: 'actions' },
      h('button', { type: 'button', class: 'primary', onclick: () => saveEdit(message), text: 'Save & send' }),
      h('button', { type: 'button', class: 'ghost', onclick: () => { state.editing = null; renderThread(); }, text: 'Cancel' })));
    return li;
  }
  const body = h('div', { class: 'body' }, recordParts(value).map((p, i) => renderPart(p, key, i)));
  const text = textOf(value);
  li.append(body, h('div', { class: 'actions' },
    siblingNav(message, siblings, 'version'),
    h('button', {
      type: 'button', class: 'ghost', id: `edit-btn-${key}`, text: 'Edit',
      onclick: () => { state.editing = { key, text }; renderThread(); $(`edit-${key}`)?.focus(); },
    })));
  return li;
}

function textOf(value) {
  return (value.content?.parts || []).filter((p) => p.$type === TEXT).map((p) => p.text).join('\n\n');
}

function renderReply(message, siblings) {
  const { key } = message;
  const li = h('li', { class: 'message reply', 'data-key': key });
  fillReply(li, message, siblings);
  return li;
}

function fillReply(li, message, siblings) {
  const { key, value } = message;
  const st = state.streams.get(key);
  const live = st && !st.final;
  // Until the final record is loaded, the stream's parts are the freshest there are.
  const parts = st && (live || !value.status || value.status === 'pending') ? st.parts : recordParts(value);
  const status = live ? (st.queued && !st.parts.length ? 'queued' : 'pending') : (st?.final?.status || value.status || 'complete');
  li.dataset.status = status;
  const done = state.finished.get(key);
  if (done) li.dataset.streamText = done.text;
  const body = h('div', { class: 'body' }, parts.map((p, i) => renderPart({ ...p, done: p.done || !live || i < parts.length - 1 }, key, i)));
  const header = [];
  if (status === 'queued') header.push(h('p', { class: 'badge queued', text: 'Queued — waiting for the rate limit…' }));
  if (status === 'pending' && !parts.length) header.push(h('p', { class: 'badge thinking', text: 'Waiting for the model…' }));
  li.replaceChildren(...header, body);
  const error = live ? null : (st?.final?.error || value.error);
  if (status === 'error') {
    li.append(h('div', { class: 'reply-error', role: 'alert' },
      h('span', { text: `Error: ${error || 'the reply failed'}` }),
      h('button', { type: 'button', id: `retry-${key}`, onclick: () => regenerate(value.parent), text: 'Retry' })));
  }
  if (status === 'cancelled') li.append(h('p', { class: 'badge', text: `Cancelled${error ? `: ${error}` : ''}` }));
  li.append(h('div', { class: 'actions' },
    siblingNav(message, siblings, 'attempt'),
    live ? h('button', { type: 'button', class: 'danger', id: `cancel-${key}`, onclick: () => cancel(key), text: 'Cancel' })
      : h('button', { type: 'button', class: 'ghost', id: `regen-${key}`, onclick: () => regenerate(value.parent), text: 'Regenerate', disabled: message.placeholder }),
    live || message.placeholder ? null : h('span', { class: 'meta', text: metaLine(value, st?.final, done) })));
}

function metaLine(value, final, done) {
  const model = final?.model || value.model;
  const usage = final?.usage || value.usage;
  const bits = [];
  if (model) bits.push(`${model.provider}:${model.id}`);
  if (value.effort) bits.push(`effort ${value.effort}`);
  if (usage) {
    const tokens = [`${usage.inputTokens ?? 0} in`, `${usage.outputTokens ?? 0} out`];
    if (usage.reasoningTokens) tokens.push(`${usage.reasoningTokens} reasoning`);
    bits.push(`${tokens.join(' / ')} tokens`);
  }
  if (done?.ms) bits.push(`${(done.ms / 1000).toFixed(1)} s`);
  if (value.createdAt) bits.push(new Date(value.createdAt).toLocaleTimeString());
  return bits.join(' · ');
}

function details(id, cls, summary, content) {
  const el = h('details', { class: cls, id, open: state.open.has(id) },
    h('summary', {}, summary), content);
  el.addEventListener('toggle', () => (el.open ? state.open.add(id) : state.open.delete(id)));
  return el;
}

function pretty(json) {
  try { return JSON.stringify(JSON.parse(json), null, 2); } catch { return json ?? ''; }
}

function renderPart(p, key, i) {
  const id = `${key}-${i}`;
  const wrap = (...c) => h('div', { class: `part ${p.type}`, 'data-part': i }, ...c);
  switch (p.type) {
    case 'text': {
      const html = p.done && state.html.get(p.text);
      if (html !== undefined && html !== false && p.done) {
        const div = h('div', { class: 'markdown' });
        // Safe: rendered on the server with raw HTML off and images as links (/api/render).
        div.innerHTML = html;
        return wrap(div);
      }
      return wrap(h('div', { class: 'plain', text: p.text }));
    }
    case 'reasoning':
      return wrap(details(id, 'reasoning', 'Reasoning', h('div', { class: 'plain', text: p.text })));
    case 'toolCall':
      return wrap(details(id, 'tool-card tool-call', p.part ? `Tool call · ${p.part.tool}` : 'Tool call…',
        h('pre', { text: p.part ? pretty(p.part.input) : '' })));
    case 'toolResult': {
      const err = p.part?.isError;
      return wrap(details(id, `tool-card tool-result${err ? ' is-error' : ''}`,
        p.part ? `${err ? 'Tool error' : 'Tool result'} · ${p.part.callId}` : 'Tool result…',
        h('pre', { text: p.part ? (pretty(p.part.output) || (p.part.outputBlob ? '(output stored as a blob)' : '')) : '' })));
    }
    case 'source':
      return wrap(p.part ? sourceLink(p.part) : 'Source…');
    case 'image':
      return wrap(h('span', { class: 'chip', text: `Image: ${p.part.alt || 'image'} (${p.part.image?.mimeType || 'image'})` }));
    case 'file':
      return wrap(h('span', { class: 'chip', text: `File: ${p.part.name || 'file'} (${p.part.file?.mimeType || 'file'})` }));
    default:
      return wrap(h('span', { class: 'muted', text: '(a part this page does not show)' }));
  }
}

// Finished text parts get their Markdown rendered once, on the server.
async function renderMarkdownLater() {
  const texts = new Set();
  for (const { message } of branch()) {
    if (!isReply(message) || isPending(message)) continue;
    for (const p of recordParts(message.value)) {
      if (p.type === 'text' && p.text && !state.html.has(p.text)) texts.add(p.text);
    }
  }
  if (!texts.size) return;
  // Batches that stay well under the server's body and list limits.
  const batches = [[]];
  let size = 0;
  for (const t of texts) {
    if (batches.at(-1).length >= 50 || (size + t.length > 400_000 && batches.at(-1).length)) {
      batches.push([]);
      size = 0;
    }
    batches.at(-1).push(t);
    size += t.length;
    state.html.set(t, false); // asked for
  }
  for (const list of batches) {
    try {
      const { html } = await api('/api/render', { method: 'POST', json: { texts: list } });
      list.forEach((t, i) => state.html.set(t, html[i]));
    } catch (err) {
      for (const t of list) state.html.delete(t);
      console.warn('markdown render failed; showing plain text', err);
    }
  }
  renderThread();
}

function updateComposer() {
  const live = state.skey ? liveReplyOnBranch() : null;
  $('cancel').hidden = !live;
  $('send').disabled = Boolean(live);
}

// -- reply streams ---------------------------------------------------------------------------

const streamKey = (skey, key) => `turnd.stream.${skey}.${key}`;

// Follow one reply's stream with fetch (EventSource cannot send the token). The last event
// id and the parts seen so far are kept in sessionStorage, so a reload resumes with
// Last-Event-ID exactly where it left off: no gap, no repeat.
async function follow(skey, key) {
  if (state.streams.has(key)) return;
  const saved = JSON.parse(sessionStorage.getItem(streamKey(skey, key)) || 'null');
  const st = {
    skey, key, id: saved?.id || 0, parts: saved?.parts || [], queued: saved?.queued || false,
    started: saved?.started || Date.now(), final: null, stopped: false, ctrl: null, saveTimer: null,
  };
  state.streams.set(key, st);
  let delay = 300;
  while (!st.final && !st.stopped) {
    st.ctrl = new AbortController();
    try {
      const res = await fetch(`/api/conversations/${skey}/messages/${key}/stream`, {
        headers: { Authorization: `Bearer ${state.token}`, Accept: 'text/event-stream', 'Last-Event-ID': String(st.id) },
        signal: st.ctrl.signal, cache: 'no-store',
      });
      if (res.status === 401) return signOut('The token was refused; sign in again.');
      if (res.status === 404) { // not claimed yet, or gone
        state.missing.set(key, Date.now());
        st.stopped = true;
        break;
      }
      if (!res.ok) throw new Error(`stream: HTTP ${res.status}`);
      await readEvents(res.body, (ev) => apply(st, ev));
      delay = 300;
    } catch (err) {
      if (st.stopped) break;
      console.warn('stream dropped, resuming', err);
    }
    if (!st.final && !st.stopped) {
      await sleep(delay);
      delay = Math.min(delay * 2, 4000);
    }
  }
  if (st.final) {
    sessionStorage.removeItem(streamKey(skey, key));
    clearTimeout(st.saveTimer);
    announce(`Reply ${st.final.status}${st.final.error ? `: ${st.final.error}` : ''}`);
    if (state.skey === skey) await loadConversation().catch(showError);
  }
  if (state.streams.get(key) === st) state.streams.delete(key);
  if (state.skey === skey) { renderThread(); renderMarkdownLater(); }
}

function stopStream(st) {
  st.stopped = true;
  st.ctrl?.abort();
}

// Parses text/event-stream lines as a browser's EventSource does.
async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let ev = { id: null, event: 'message', data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === '') {
        if (ev.data.length) onEvent({ id: ev.id, event: ev.event, data: JSON.parse(ev.data.join('\n')) });
        ev = { id: null, event: 'message', data: [] };
      } else if (!line.startsWith(':')) {
        const at = line.indexOf(':');
        const field = at < 0 ? line : line.slice(0, at);
        const val = at < 0 ? '' : line.slice(at + 1).replace(/^ /, '');
        if (field === 'data') ev.data.push(val);
        else if (field === 'id') ev.id = val;
        else if (field === 'event') ev.event = val;
      }
    }
  }
}

function apply(st, ev) {
  const id = Number(ev.id);
  if (ev.id !== null && id <= st.id) return; // already seen (never applied twice)
  const d = ev.data;
  if (ev.event === 'status' && d.status === 'pending') {
    st.ctrl?.abort(); // running in another process: look again later
    return;
  }
  if (ev.id !== null) st.id = id;
  let structural = true;
  switch (ev.event) {
    case 'queued': st.queued = true; break;
    case 'part-start': st.parts[d.index] = { type: d.type, text: '' }; break;
    case 'delta': {
      const p = st.parts[d.index] || (st.parts[d.index] = { type: 'text', text: '' });
      p.text += d.text;
      structural = false;
      break;
    }
    case 'part': st.parts[d.index] = { type: PART_TYPES[d.part.$type] || 'unknown', part: d.part, done: true }; break;
    case 'status':
      st.final = d;
      // What the stream showed, kept for the finished reply (data-stream-text) with its time.
      state.finished.set(st.key, { ms: Date.now() - st.started, text: st.parts.filter((p) => p.type === 'text').map((p) => p.text).join('') });
      stopStream(st);
      break;
    default: return;
  }
  if (!st.final) saveSoon(st);
  if (structural) {
    redrawReply(st.key);
  } else {
    const el = document.querySelector(`li[data-key="${CSS.escape(st.key)}"] [data-part="${d.index}"] .plain`);
    if (el) { el.textContent = st.parts[d.index].text; scrollToEnd(); } else redrawReply(st.key);
  }
}

function saveSoon(st) {
  if (st.saveTimer) return;
  st.saveTimer = setTimeout(() => { st.saveTimer = null; saveStream(st); }, 150);
}

function saveStream(st) {
  if (st.final || st.stopped) return;
  const { id, parts, queued, started } = st;
  sessionStorage.setItem(streamKey(st.skey, st.key), JSON.stringify({ id, parts, queued, started }));
}

function redrawReply(key) {
  const li = document.querySelector(`li[data-key="${CSS.escape(key)}"]`);
  if (!li) return;
  const entry = branch().find((p) => p.message.key === key);
  if (entry) fillReply(li, entry.message, entry.siblings);
  updateComposer();
  scrollToEnd();
}

// -- actions ---------------------------------------------------------------------------------

async function send(ev) {
  ev?.preventDefault();
  clearError();
  const text = $('input').value.trim();
  if (!text && !state.attachments.length) return;
  if (liveReplyOnBranch()) return;
  const parts = [...(text ? [{ $type: TEXT, text }] : []), ...state.attachments.map((a) => a.part)];
  $('send').disabled = true;
  try {
    if (!state.skey) {
      // The first line of the first message names the conversation (turnd makes no titles).
      const title = (text.split('\n')[0] || state.attachments[0]?.name || '').slice(0, 80);
      const { skey } = await api('/api/conversations', { method: 'POST', json: title ? { title } : {} });
      await selectConversation(skey);
    }
    const parent = currentLeafKey();
    const posted = await api(`/api/conversations/${state.skey}/messages`, {
      method: 'POST', json: { parent, parts, generation: generation() },
    });
    choose(parent || '', posted.userKey);
    $('input').value = '';
    autosize();
    state.attachments = [];
    renderAttachments();
    await loadConversation();
    renderThread();
    scrollToEnd(true);
    loadConversations().catch(console.error);
  } catch (err) {
    showError(err);
  } finally {
    updateComposer();
  }
}

async function saveEdit(message) {
  const text = (state.editing?.text || '').trim();
  if (!text) return;
  const others = (message.value.content?.parts || []).filter((p) => p.$type !== TEXT);
  const parent = message.value.parent;
  try {
    const posted = await api(`/api/conversations/${state.skey}/messages`, {
      method: 'POST', json: { parent, parts: [{ $type: TEXT, text }, ...others], generation: generation() },
    });
    state.editing = null;
    choose(parent || '', posted.userKey);
    await loadConversation();
    renderThread();
  } catch (err) {
    showError(err);
  }
}

async function regenerate(userKey) {
  clearError();
  const gen = generation();
  try {
    const { replyKey: key } = await api(`/api/conversations/${state.skey}/messages/${userKey}/regenerate`, {
      method: 'POST', json: { model: gen.model, effort: gen.effort },
    });
    choose(userKey, key);
    await loadConversation();
    renderThread();
  } catch (err) {
    showError(err);
  }
}

async function cancel(key) {
  try {
    await api(`/api/conversations/${state.skey}/messages/${key}/cancel`, { method: 'POST' });
  } catch (err) {
    showError(err);
  }
}

async function attach(files) {
  clearError();
  for (const file of files) {
    try {
      const { part } = await api('/api/attachments', {
        method: 'POST', body: file,
        headers: { 'Content-Type': file.type || 'application/octet-stream', 'X-Filename': encodeURIComponent(file.name) },
      });
      state.attachments.push({ name: file.name, part });
    } catch (err) {
      showError(err);
    }
  }
  renderAttachments();
}

function renderAttachments() {
  $('attachments').replaceChildren(...state.attachments.map((a, i) => h('li', { class: 'chip' },
    h('span', { text: a.name }),
    h('button', {
      type: 'button', class: 'ghost', 'aria-label': `Remove ${a.name}`, text: '×',
      onclick: () => { state.attachments.splice(i, 1); renderAttachments(); },
    }))));
}

function autosize() {
  const area = $('input');
  area.style.height = 'auto';
  area.style.height = `${Math.min(area.scrollHeight, 240)}px`;
}

function closeMenu() {
  document.body.classList.remove('menu-open');
  $('menu').setAttribute('aria-expanded', 'false');
}

// -- wiring ----------------------------------------------------------------------------------

async function poll() {
  for (;;) {
    await sleep(POLL_MS);
    if (!state.token || document.visibilityState !== 'visible') continue;
    try {
      await loadConversation();
      followPending();
      await loadConversations();
    } catch (err) {
      console.warn('poll failed', err);
    }
  }
}

function main() {
  $('signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    $('signin-error').textContent = '';
    signIn($('token').value.trim());
  });
  $('signout').addEventListener('click', () => signOut());
  $('new').addEventListener('click', () => { selectConversation(null); closeMenu(); $('input').focus(); });
  $('menu').addEventListener('click', () => {
    const open = document.body.classList.toggle('menu-open');
    $('menu').setAttribute('aria-expanded', String(open));
  });
  $('composer').addEventListener('submit', send);
  $('input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) send(ev);
  });
  $('input').addEventListener('input', autosize);
  $('file').addEventListener('change', (ev) => { attach([...ev.target.files]); ev.target.value = ''; });
  $('cancel').addEventListener('click', () => { const live = liveReplyOnBranch(); if (live) cancel(live.key); });
  $('model').addEventListener('change', () => localStorage.setItem('turnd.model', $('model').value));
  $('effort').addEventListener('change', () => localStorage.setItem('turnd.effort', $('effort').value));
  document.addEventListener('keydown', (ev) => {
    if (ev.key !== 'Escape') return;
    if (document.body.classList.contains('menu-open')) return closeMenu();
    const live = state.skey && liveReplyOnBranch();
    if (live) { ev.preventDefault(); cancel(live.key); }
  });
  window.addEventListener('hashchange', () => {
    const skey = location.hash.startsWith('#c=') ? location.hash.slice(3) : null;
    if (skey !== state.skey && state.token) selectConversation(skey);
  });
  window.addEventListener('pagehide', () => { for (const st of state.streams.values()) saveStream(st); });
  if (state.token) signIn(state.token); else showSignIn();
  poll();
}

main();
