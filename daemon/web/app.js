// turnd's built-in chat page: plain JS on the /api routes and reply streams of SPEC §6.
// It is also the reference client: everything it does, another web UI can do the same way.

const DEFS = 'network.sharedcomputer.chat.defs';
const TEXT = `${DEFS}#textPart`;
const PART_TYPES = {
  [`${DEFS}#textPart`]: 'text', [`${DEFS}#reasoningPart`]: 'reasoning',
  [`${DEFS}#toolCallPart`]: 'toolCall', [`${DEFS}#toolResultPart`]: 'toolResult',
  [`${DEFS}#sourcePart`]: 'source', [`${DEFS}#imagePart`]: 'image', [`${DEFS}#filePart`]: 'file',
};
// A reply's stream that was not there yet (not claimed) is asked for again this much later;
// everything else the page learns from the event streams, never by polling.
const RETRY_MS = 1500;
// While a text part streams, its finished blocks are rendered as Markdown at most this often,
// each block once: never the whole reply per token.
const RENDER_EVERY_MS = 250;

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
  did: null,
  preferences: {},
  tools: [],
  traces: new Map(), // reply key -> [{event, data}] seen on its stream
  blobs: new Map(), // blob cid -> object URL (or a promise of one)
  finals: new Map(), // reply key -> its stream's final status event (latency, cost)
  usage: new Map(), // reply key -> its usage, cost and latency (GET .../usage), for history
  search: '',
  convEvents: null, // {skey, ctrl}
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

async function api(path, { method = 'GET', json, body, headers = {}, raw = false } = {}) {
  const init = { method, headers: { Authorization: `Bearer ${state.token}`, ...headers } };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers['Content-Type'] = 'application/json';
  } else if (body !== undefined) {
    init.body = body;
  }
  const res = await fetch(path, init);
  if (raw && res.ok) return res;
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
    state.did = models.did || null;
  } catch (err) {
    state.token = null;
    localStorage.removeItem('turnd.token');
    $('signin-error').textContent = err.status === 401 ? 'That token is not valid.' : err.message;
    showSignIn();
    return;
  }
  $('signin').hidden = true;
  fillModels();
  // The composer shows the account's default model from its first frame, not a flip after it.
  await Promise.all([loadPreferences(), loadTools()]).catch(showError);
  if (!state.token) return; // refused meanwhile: the sign-in form is showing
  $('app').hidden = false;
  followAccount();
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
  accountCtrl?.abort();
  state.convEvents?.ctrl.abort();
  state.convEvents = null;
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

// -- settings: the preferences record (GET/PUT /api/preferences) ------------------------------

async function loadPreferences() {
  const { preferences } = await api('/api/preferences');
  state.preferences = preferences || {};
  const pref = state.preferences;
  // The account's defaults, unless this browser chose otherwise.
  const values = [...$('model').options].map((o) => o.value);
  const ref = pref.defaultModel && `${pref.defaultModel.provider}:${pref.defaultModel.id}`;
  if (ref && values.includes(ref) && !localStorage.getItem('turnd.model')) $('model').value = ref;
  if (pref.defaultEffort && !localStorage.getItem('turnd.effort')) $('effort').value = pref.defaultEffort;
}

function openSettings() {
  const pref = state.preferences;
  const select = $('pref-model');
  select.replaceChildren(h('option', { value: '', text: "the server's default" }),
    ...state.models.models.map((m) => h('option', { value: `${m.provider}:${m.id}`, text: m.label })));
  select.value = pref.defaultModel ? `${pref.defaultModel.provider}:${pref.defaultModel.id}` : '';
  $('pref-effort').value = pref.defaultEffort || '';
  $('pref-instructions').value = pref.customInstructions || '';
  $('pref-timezone').value = pref.timezone || Intl.DateTimeFormat().resolvedOptions().timeZone || '';
  if (!$('timezones').childElementCount && Intl.supportedValuesOf) {
    $('timezones').replaceChildren(...Intl.supportedValuesOf('timeZone').map((z) => h('option', { value: z })));
  }
  $('pref-titles').checked = pref.generateTitles !== false;
  $('settings-error').textContent = '';
  $('settings').showModal();
}

async function saveSettings(ev) {
  ev.preventDefault();
  const next = { ...state.preferences };
  delete next.updatedAt;
  const [provider, ...rest] = $('pref-model').value.split(':');
  if (provider && rest.length) next.defaultModel = { provider, id: rest.join(':') }; else delete next.defaultModel;
  if ($('pref-effort').value) next.defaultEffort = $('pref-effort').value; else delete next.defaultEffort;
  const instructions = $('pref-instructions').value.trim();
  if (instructions) next.customInstructions = instructions; else delete next.customInstructions;
  const zone = $('pref-timezone').value.trim();
  if (zone) next.timezone = zone; else delete next.timezone;
  next.generateTitles = $('pref-titles').checked;
  try {
    const { preferences } = await api('/api/preferences', { method: 'PUT', json: { preferences: next } });
    state.preferences = preferences;
    localStorage.removeItem('turnd.model');
    localStorage.removeItem('turnd.effort');
    fillModels();
    await loadPreferences();
    $('settings').close();
    announce('Settings saved');
  } catch (err) {
    $('settings-error').textContent = err.message;
  }
}

// -- the tool picker (GET /api/tools) ---------------------------------------------------------

async function loadTools() {
  const { tools } = await api('/api/tools');
  state.tools = tools;
  const chosen = new Set(JSON.parse(localStorage.getItem('turnd.tools') || '[]'));
  $('tool-list').replaceChildren($('tool-list').querySelector('legend'), ...tools.map((t) => h('label', {
    class: `tool${t.available ? '' : ' unavailable'}`, title: t.description || '',
  }, h('input', {
    type: 'checkbox', value: t.name, checked: chosen.has(t.name), disabled: !t.available,
    onchange: saveTools,
  }), h('span', { text: t.name }),
  t.needsApproval ? h('span', { class: 'muted', text: ' (asks first)' }) : null,
  t.available ? null : h('span', { class: 'muted', text: ' (unavailable)' }))));
  $('tools').hidden = !tools.length;
  updateToolCount();
}

function chosenTools() {
  return [...$('tool-list').querySelectorAll('input:checked')].map((i) => i.value);
}

function saveTools() {
  localStorage.setItem('turnd.tools', JSON.stringify(chosenTools()));
  updateToolCount();
}

function updateToolCount() {
  const n = chosenTools().length;
  $('tools-count').textContent = n ? `(${n})` : '';
}

function generation() {
  const [provider, ...rest] = $('model').value.split(':');
  const out = {};
  if (provider && rest.length) out.model = { provider, id: rest.join(':') };
  if ($('effort').value) out.effort = $('effort').value;
  const tools = chosenTools();
  if (tools.length) out.tools = tools;
  return out;
}

// -- conversations ---------------------------------------------------------------------------

async function loadConversations() {
  const q = state.search;
  const { conversations } = await api(`/api/conversations?limit=100${q ? `&q=${encodeURIComponent(q)}` : ''}`);
  if (q !== state.search) return; // a newer search is on its way
  state.conversations = conversations;
  renderConversations();
}

// A title as a person reads it: a model may answer "**Trip plan**" or "# Trip plan".
function plainTitle(title) {
  return String(title || '').replace(/^#+\s*/, '').replace(/[*_`~]+/g, '').replace(/\s+/g, ' ').trim();
}

// When a conversation last changed, as a list shows it: the time today, else the date.
function shortWhen(iso) {
  const at = new Date(iso);
  const now = new Date();
  if (at.toDateString() === now.toDateString()) return at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  return at.toLocaleDateString([], { day: 'numeric', month: 'short', year: at.getFullYear() === now.getFullYear() ? undefined : 'numeric' });
}

function renderConversations() {
  const list = $('conversations');
  if (list.querySelector('.rename:focus')) return; // renaming: not under the cursor
  list.replaceChildren(...state.conversations.map((c) => {
    const when = c.updatedAt ? shortWhen(c.updatedAt) : '';
    const title = plainTitle(c.title) || 'New conversation';
    return h('li', { class: 'conv-item', 'data-skey': c.skey },
      h('button', {
        type: 'button', class: 'conversation', 'data-skey': c.skey,
        'aria-current': c.skey === state.skey ? 'page' : null,
        onclick: () => { selectConversation(c.skey); closeMenu(); },
      }, h('span', { class: 'title', text: title }), h('time', { text: when })),
      h('span', { class: 'conv-actions' },
        h('button', { type: 'button', class: 'ghost icon', 'aria-label': `Rename ${title}`, title: 'Rename', text: '✎', onclick: () => startRename(c) }),
        h('button', { type: 'button', class: 'ghost icon', 'aria-label': `Delete ${title}`, title: 'Delete', text: '×', onclick: () => removeConversation(c) })));
  }));
  if (!state.conversations.length) {
    list.append(h('li', { class: 'muted none', text: state.search ? 'No conversation matches.' : 'No conversations yet.' }));
  }
  const current = state.conversations.find((c) => c.skey === state.skey);
  const shown = plainTitle(current?.title || state.info?.title);
  $('conv-title').textContent = state.skey ? (shown || 'New conversation') : 'New conversation';
}

function startRename(c) {
  const li = $('conversations').querySelector(`li[data-skey="${CSS.escape(c.skey)}"]`);
  if (!li) return;
  const input = h('input', { class: 'rename', 'aria-label': 'New title', maxlength: 300 });
  input.value = plainTitle(c.title);
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (save && title && title !== c.title) {
      try {
        await api(`/api/conversations/${c.skey}`, { method: 'PATCH', json: { title } });
        c.title = title;
      } catch (err) { showError(err); }
    }
    input.blur();
    renderConversations();
  };
  input.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter') { ev.preventDefault(); finish(true); }
    if (ev.key === 'Escape') { ev.stopPropagation(); finish(false); }
  });
  input.addEventListener('blur', () => finish(true));
  li.replaceChildren(input);
  input.focus();
  input.select();
}

async function removeConversation(c) {
  if (!window.confirm(`Delete “${plainTitle(c.title) || 'New conversation'}” and all its messages?`)) return;
  try {
    await api(`/api/conversations/${c.skey}`, { method: 'DELETE' });
    state.conversations = state.conversations.filter((x) => x.skey !== c.skey);
    if (state.skey === c.skey) await selectConversation(null);
    renderConversations();
    announce('Conversation deleted');
  } catch (err) {
    showError(err);
  }
}

async function selectConversation(skey) {
  state.skey = skey;
  state.messages = new Map();
  state.signature = '';
  state.editing = null;
  state.chosen = skey ? JSON.parse(sessionStorage.getItem(`turnd.chosen.${skey}`) || '{}') : {};
  state.info = null;
  state.usage = new Map();
  history.replaceState(null, '', skey ? `#c=${skey}` : location.pathname);
  followConversation(skey);
  renderConversations();
  renderThread();
  if (skey) {
    await loadConversation();
    scrollToEnd(true); // a conversation opens at its newest message
  }
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
  renderConversations();
  renderThread();
  renderMarkdownLater();
  loadUsage(skey).catch(console.warn);
}

// Usage, cost and latency of the replies this page did not see finish (their records hold
// tokens only): asked when the conversation changed and a finished reply has none yet, and
// once more a moment later, since a turn's usage is stored just after its final record.
async function loadUsage(skey, again = true) {
  const lacking = () => [...state.messages.values()].some((m) => isReply(m) && !isPending(m)
    && !state.usage.has(m.key) && !state.finals.has(m.key));
  if (!lacking()) return;
  const { replies } = await api(`/api/conversations/${skey}/usage`);
  if (skey !== state.skey) return;
  let changed = false;
  for (const [key, u] of Object.entries(replies)) {
    if (!state.usage.has(key)) changed = true;
    state.usage.set(key, u);
  }
  if (changed) renderThread();
  if (again && lacking()) setTimeout(() => { if (state.skey === skey) loadUsage(skey, false).catch(console.warn); }, 1000);
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
    if (Date.now() - (state.missing.get(message.key) || 0) < RETRY_MS - 100) { retryLater(); continue; }
    if (message.placeholder) {
      // No record yet: it is being claimed right now, or queued. Ask once it has waited a bit.
      const since = state.missing.get(`wait:${message.key}`) ?? state.missing.set(`wait:${message.key}`, Date.now()).get(`wait:${message.key}`);
      if (Date.now() - since < RETRY_MS) { retryLater(); continue; }
    }
    follow(state.skey, message.key);
  }
}

// One timer for the replies whose stream was not there yet (not a poll of the conversation:
// the record events say when anything changes; this only asks a missing stream again).
let retryTimer = null;
function retryLater() {
  if (retryTimer) return;
  retryTimer = setTimeout(() => { retryTimer = null; if (state.skey) followPending(); }, RETRY_MS);
}

let atBottom = true; // the reader is at the newest message: keep them there
function scrollToEnd(force = false) {
  const main = document.scrollingElement;
  if (force || atBottom || main.scrollHeight - main.scrollTop - main.clientHeight < 200) {
    main.scrollTop = main.scrollHeight;
    atBottom = true;
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
  const body = h('div', { class: 'body' }, parts.map((p, i) => renderPart({ ...p, done: p.done || !live || i < parts.length - 1, reply: key }, key, i)));
  const header = [];
  if (status === 'queued') header.push(h('p', { class: 'badge queued', text: 'Queued — waiting for the rate limit…' }));
  if (status === 'pending' && !parts.length) header.push(h('p', { class: 'badge thinking', text: 'Waiting for the model…' }));
  li.replaceChildren(...[...header, traceLines(key), body].filter(Boolean));
  const error = live ? null : (st?.final?.error || value.error);
  if (status === 'error') {
    li.append(h('div', { class: 'reply-error', role: 'alert' },
      h('span', { text: `Error: ${error || 'the reply failed'}` }),
      h('button', { type: 'button', id: `retry-${key}`, onclick: () => regenerate(value.parent), text: 'Retry' })));
  }
  if (status === 'cancelled') li.append(h('p', { class: 'badge', text: `Cancelled${error ? `: ${error}` : ''}` }));
  li.append(h('div', { class: 'actions' },
    siblingNav(message, siblings, 'attempt'),
    // A running reply is cancelled from the composer (its Cancel takes Send's place, or
    // Escape): one Cancel on the screen, never one per card. An error reply has its Retry
    // above: one way to ask again, not two.
    live || status === 'error' ? null
      : h('button', { type: 'button', class: 'ghost', id: `regen-${key}`, onclick: () => regenerate(value.parent), text: 'Regenerate', disabled: message.placeholder }),
    live || message.placeholder ? null : h('button', {
      type: 'button', class: 'ghost copy-reply', id: `copy-${key}`, 'aria-label': 'Copy reply', text: 'Copy',
      onclick: (ev) => copyText(replyText(parts), ev.currentTarget),
    }),
    live || message.placeholder ? null : h('span', { class: 'meta', text: metaLine(value, st?.final || state.finals.get(key) || storedUsage(key), done, key) })));
}

function replyText(parts) {
  return parts.filter((p) => p.type === 'text').map((p) => p.text).join('\n\n');
}

// step / retry / fallback / context events of the reply's stream: one small line each.
function traceLine(ev) {
  const d = ev.data;
  const model = (m) => (m ? `${m.provider}:${m.id}` : '?');
  switch (ev.event) {
    case 'step': return `Step ${d.index + 1} · ${model(d.model)}`;
    case 'retry': return `Retry ${d.attempt} of step ${d.step + 1} in ${d.waitSeconds} s · ${d.reason}`;
    case 'fallback': return `Fell back from ${model(d.from)} to ${model(d.to)} · ${d.reason}`;
    case 'context': {
      const n = d.dropped || 0;
      const what = `${n} earlier message${n === 1 ? '' : 's'}`;
      return `Context: ${what} ${d.summarized ? 'summarized' : 'left out'} to fit the model's window`;
    }
    default: return ev.event;
  }
}

// A reply's trace events live in its stream only; this tab keeps them (sessionStorage), so
// a reload, mid-stream or after, still shows the lines of the replies it followed.
const traceKey = (skey, key) => `turnd.traces.${skey}.${key}`;
function tracesOf(key) {
  if (!state.traces.has(key) && state.skey) {
    const kept = JSON.parse(sessionStorage.getItem(traceKey(state.skey, key)) || 'null');
    if (kept) state.traces.set(key, kept);
  }
  return state.traces.get(key);
}

function traceLines(key) {
  const events = tracesOf(key);
  if (!events?.length) return null;
  return h('div', { class: 'traces' }, events.map((ev, i) => details(`${key}-trace-${i}`, `trace trace-${ev.event}`,
    traceLine(ev), h('pre', { text: JSON.stringify(ev.data, null, 2) }), traceLine(ev))));
}

async function decide(replyKeyValue, callId, approve) {
  try {
    await api(`/api/conversations/${state.skey}/messages/${replyKeyValue}/approvals/${encodeURIComponent(callId)}`, {
      method: 'POST', json: { approve },
    });
    announce(approve ? 'Approved' : 'Denied');
  } catch (err) {
    showError(err);
  }
}

// A reply's stored usage (GET .../usage) in the shape of its stream's final status event.
function storedUsage(key) {
  const u = state.usage.get(key);
  if (!u) return undefined;
  const { cost, latencyMs, ttftMs, steps, ...usage } = u;
  return { usage, cost, latencyMs, ttftMs, steps };
}

// 840 ms, 3.6 s: milliseconds under a second, tenths above.
function duration(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

// Model calls of a reply the page followed: its step events, a step tried on two models
// (a fallback) counted once, as GET .../usage counts them.
function streamedSteps(key) {
  return new Set((tracesOf(key) || []).filter((ev) => ev.event === 'step').map((ev) => ev.data.index)).size;
}

function metaLine(value, final, done, key) {
  const model = final?.model || value.model;
  const usage = final?.usage || value.usage;
  const steps = final?.steps ?? streamedSteps(key);
  const bits = [];
  if (model) bits.push(`${model.provider}:${model.id}`);
  if (value.effort) bits.push(`effort ${value.effort}`);
  if (usage) {
    const tokens = [`${usage.inputTokens ?? 0} in`, `${usage.outputTokens ?? 0} out`];
    if (usage.reasoningTokens) tokens.push(`${usage.reasoningTokens} reasoning`);
    bits.push(`${tokens.join(' / ')} tokens`);
  }
  if (usage?.cachedTokens) bits.push(`${usage.cachedTokens} cached`);
  if (steps > 1) bits.push(`${steps} steps`);
  if (typeof final?.cost === 'number') bits.push(`$${final.cost < 0.01 ? final.cost.toPrecision(2) : final.cost.toFixed(4)}`);
  if (typeof final?.ttftMs === 'number') bits.push(`first token ${duration(final.ttftMs)}`);
  if (typeof final?.latencyMs === 'number') bits.push(`total ${duration(final.latencyMs)}`);
  else if (done?.ms) bits.push(`total ${duration(done.ms)}`);
  if (value.createdAt) bits.push(new Date(value.createdAt).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }));
  return bits.join(' · ');
}

function details(id, cls, summary, content, title) {
  const el = h('details', { class: cls, id, open: state.open.has(id) },
    h('summary', { title }, summary), content);
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
      if (html !== undefined && html !== false && p.done) return wrap(markdownDiv(html));
      if (p.chunks?.length) {
        // Streaming: the finished blocks rendered, the block being written as plain text.
        const tail = p.text.slice(p.upto);
        return wrap(markdownDiv(p.chunks.join('')), tail ? h('div', { class: 'plain', text: tail }) : null);
      }
      return wrap(h('div', { class: 'plain', text: p.text }));
    }
    case 'reasoning':
      return wrap(details(id, 'reasoning', 'Reasoning', h('div', { class: 'plain', text: p.text })));
    case 'toolCall': {
      const approval = p.part?.approval;
      if (approval === 'pending') {
        // An approval card: the turn waits for this decision (SPEC §14).
        return wrap(h('div', { class: 'approval-card', role: 'group', 'aria-label': `Approve ${p.part.tool}?` },
          h('p', {}, h('strong', { text: p.part.tool }), ' wants to run with:'),
          h('pre', { text: pretty(p.part.input) }),
          h('p', { class: 'muted hint', text: 'The reply waits for your answer.' }),
          h('div', { class: 'actions' },
            h('button', { type: 'button', class: 'primary', id: `approve-${p.part.callId}`, text: 'Approve', onclick: () => decide(p.reply, p.part.callId, true) }),
            h('button', { type: 'button', class: 'danger', id: `deny-${p.part.callId}`, text: 'Deny', onclick: () => decide(p.reply, p.part.callId, false) }))));
      }
      const label = approval ? ` · ${approval}` : '';
      return wrap(details(id, `tool-card tool-call${approval ? ` approval-${approval}` : ''}`, p.part ? `Tool call · ${p.part.tool}${label}` : 'Tool call…',
        h('pre', { text: p.part ? pretty(p.part.input) : '' })));
    }
    case 'toolResult': {
      const err = p.part?.isError;
      return wrap(details(id, `tool-card tool-result${err ? ' is-error' : ''}`,
        p.part ? `${err ? 'Tool error' : 'Tool result'} · ${p.part.callId}` : 'Tool result…',
        h('pre', { text: p.part ? (pretty(p.part.output) || (p.part.outputBlob ? '(output stored as a blob)' : '')) : '' })));
    }
    case 'source':
      return wrap(p.part ? sourceLink(p.part) : 'Source…');
    case 'image':
      return wrap(imagePreview(p.part));
    case 'file':
      return wrap(h('span', { class: 'chip', text: `File: ${p.part.name || 'file'} (${p.part.file?.mimeType || 'file'})` }));
    default:
      return wrap(h('span', { class: 'muted', text: '(a part this page does not show)' }));
  }
}

// Safe: rendered on the server with raw HTML off and images as links (/api/render).
function markdownDiv(html) {
  const div = h('div', { class: 'markdown' });
  div.innerHTML = html;
  for (const pre of div.querySelectorAll('pre')) {
    const box = h('div', { class: 'code-block' });
    const lang = /language-(\S+)/.exec(pre.querySelector('code')?.className || '')?.[1];
    pre.replaceWith(box);
    box.append(h('div', { class: 'code-head' }, h('span', { class: 'lang', text: lang || 'code' }),
      h('button', { type: 'button', class: 'ghost copy', text: 'Copy', 'aria-label': 'Copy code', onclick: (ev) => copyText(pre.textContent, ev.currentTarget) })), pre);
  }
  return div;
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    if (button) {
      const was = button.textContent;
      button.textContent = 'Copied';
      setTimeout(() => { button.textContent = was; }, 1500);
    }
    announce('Copied');
  } catch (err) {
    console.warn('copy failed', err);
    announce('Could not copy: the browser refused the clipboard.');
  }
}

// An attached image, fetched with the token (getBlob) and shown from a blob: URL.
function imagePreview(part) {
  const alt = part.alt || 'attached image';
  const cid = part.image?.ref?.$link;
  const fig = h('figure', { class: 'image-preview' });
  const img = h('img', { alt }); // not lazy: a re-rendered thread would leave it unloaded
  // A caption only when the part has alt text: a bare "image/png" under a picture says nothing.
  fig.append(img);
  if (part.alt) fig.append(h('figcaption', { class: 'muted', text: part.alt }));
  // A picture that loads after the thread was drawn makes it taller: stay at the newest.
  img.addEventListener('load', () => scrollToEnd());
  if (!cid || !state.did) return fig;
  let url = state.blobs.get(cid);
  if (!url) {
    url = api(`/xrpc/com.atproto.sync.getBlob?did=${encodeURIComponent(state.did)}&cid=${encodeURIComponent(cid)}`, { raw: true })
      .then((res) => res.blob()).then((b) => URL.createObjectURL(b));
    state.blobs.set(cid, url);
    url.then((u) => state.blobs.set(cid, u)).catch((err) => { state.blobs.delete(cid); console.warn('image not loaded', err); });
  }
  Promise.resolve(url).then((u) => { img.src = u; }).catch(() => {});
  return fig;
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

// While a reply runs, Cancel stands where Send was: the one place to stop it.
function updateComposer() {
  const live = state.skey ? liveReplyOnBranch() : null;
  $('cancel').hidden = !live;
  $('send').hidden = Boolean(live);
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
  tracesOf(key); // the lines seen before a reload, kept by this tab
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
    saveTraces(skey, key);
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
      if (p.type === 'text') renderBlocksSoon(st, d.index);
      structural = false;
      break;
    }
    case 'part': {
      const prev = st.parts[d.index];
      st.parts[d.index] = { type: PART_TYPES[d.part.$type] || 'unknown', part: d.part, done: true };
      if (prev?.part?.approval && !d.part.approval) st.parts[d.index].part = { ...d.part, approval: prev.part.approval };
      break;
    }
    case 'approval': {
      const p = st.parts[d.index];
      const part = p?.part || { $type: `${DEFS}#toolCallPart`, callId: d.callId, tool: d.tool, input: d.input };
      st.parts[d.index] = { type: 'toolCall', part: { ...part, approval: 'pending' }, done: true };
      announce(`${d.tool} asks for approval`);
      break;
    }
    case 'step': case 'retry': case 'fallback': case 'context': {
      const list = state.traces.get(st.key) || [];
      list.push({ event: ev.event, data: d });
      state.traces.set(st.key, list);
      break;
    }
    case 'status':
      st.final = d;
      state.finals.set(st.key, d);
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
    if (el) { el.textContent = st.parts[d.index].text.slice(st.parts[d.index].upto || 0); scrollToEnd(); } else redrawReply(st.key);
  }
}

// Where the finished blocks of a streaming text end: after the last blank line that is not
// inside a fenced code block (the block after it may still change as tokens arrive).
function blockEnd(text) {
  let fence = null;
  let end = 0;
  let at = 0;
  for (const line of text.split('\n')) {
    const next = at + line.length + 1;
    const mark = /^ {0,3}(`{3,}|~{3,})/.exec(line);
    if (mark) {
      if (!fence) fence = mark[1][0];
      else if (mark[1][0] === fence) fence = null;
    } else if (!fence && line.trim() === '' && next <= text.length) {
      end = next;
    }
    at = next;
  }
  return end;
}

// Render the blocks finished since the last batch, at most once per RENDER_EVERY_MS and one
// request at a time per part: each block is sent to /api/render once, never the whole reply.
function renderBlocksSoon(st, index) {
  const p = st.parts[index];
  if (p.rendering || p.renderTimer) return;
  p.renderTimer = setTimeout(async () => {
    p.renderTimer = null;
    const upto = p.upto || 0;
    const end = blockEnd(p.text);
    if (end <= upto || st.final || st.stopped) return;
    p.rendering = true;
    try {
      const { html } = await api('/api/render', { method: 'POST', json: { texts: [p.text.slice(upto, end)] } });
      if ((p.upto || 0) === upto) {
        p.chunks = [...(p.chunks || []), html[0]];
        p.upto = end;
        if (!st.final) redrawReply(st.key);
      }
    } catch (err) {
      console.warn('streaming render failed; the text stays plain', err);
    } finally {
      p.rendering = false;
    }
    if (blockEnd(p.text) > (p.upto || 0)) renderBlocksSoon(st, index);
  }, RENDER_EVERY_MS);
}

function saveSoon(st) {
  if (st.saveTimer) return;
  st.saveTimer = setTimeout(() => { st.saveTimer = null; saveStream(st); }, 150);
}

function saveStream(st) {
  if (st.final || st.stopped) return;
  const { id, queued, started } = st;
  const parts = st.parts.map(({ renderTimer, rendering, ...kept }) => kept);
  sessionStorage.setItem(streamKey(st.skey, st.key), JSON.stringify({ id, parts, queued, started }));
  saveTraces(st.skey, st.key);
}

function saveTraces(skey, key) {
  const events = state.traces.get(key);
  if (events?.length) sessionStorage.setItem(traceKey(skey, key), JSON.stringify(events));
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
      // turnd names the conversation after its first reply (a generated title); with title
      // generation turned off in the settings, the first line of the first message does.
      const title = state.preferences.generateTitles === false
        ? (text.split('\n')[0] || state.attachments[0]?.name || '').slice(0, 80) : '';
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
    for (const a of state.attachments) if (a.preview) URL.revokeObjectURL(a.preview);
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
      const preview = file.type.startsWith('image/') ? URL.createObjectURL(file) : null;
      state.attachments.push({ name: file.name, part, preview });
    } catch (err) {
      showError(err);
    }
  }
  renderAttachments();
}

function renderAttachments() {
  $('attachments').replaceChildren(...state.attachments.map((a, i) => h('li', { class: `chip${a.preview ? ' with-thumb' : ''}` },
    a.preview ? h('img', { class: 'thumb', src: a.preview, alt: '' }) : null,
    h('span', { text: a.name }),
    h('button', {
      type: 'button', class: 'ghost', 'aria-label': `Remove ${a.name}`, text: '×',
      onclick: () => { const [gone] = state.attachments.splice(i, 1); if (gone?.preview) URL.revokeObjectURL(gone.preview); renderAttachments(); },
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

// -- live record events (GET /api/events, /api/conversations/{skey}/events) --------------------

// Follows an event stream with fetch (EventSource cannot send the token), resuming after
// the last event id it saw; until ctrl is aborted.
async function followEvents(path, ctrl, onEvent) {
  let last = null;
  let delay = 500;
  while (!ctrl.signal.aborted && state.token) {
    try {
      const res = await fetch(last === null ? path : `${path}?lastEventId=${last}`, {
        headers: { Authorization: `Bearer ${state.token}`, Accept: 'text/event-stream' },
        signal: ctrl.signal, cache: 'no-store',
      });
      if (res.status === 401) return signOut('The token was refused; sign in again.');
      if (res.status === 404) return; // the conversation is gone
      if (!res.ok) throw new Error(`events: HTTP ${res.status}`);
      delay = 500;
      await readEvents(res.body, (ev) => {
        if (ev.id !== null) last = ev.id;
        onEvent(ev);
      });
    } catch (err) {
      if (ctrl.signal.aborted) return;
      console.warn('event stream dropped, resuming', err);
    }
    await sleep(delay);
    delay = Math.min(delay * 2, 8000);
  }
}

// Coalesces a burst of events into one reload.
function debounce(fn, ms) {
  let timer = null;
  return () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
}

let accountCtrl = null;
const reloadList = debounce(() => loadConversations().catch(console.warn), 150);
function followAccount() {
  accountCtrl?.abort();
  accountCtrl = new AbortController();
  followEvents('/api/events', accountCtrl, (ev) => {
    if (ev.event !== 'conversation') return;
    const { action, skey, title } = ev.data;
    if (action === 'delete' && skey === state.skey) selectConversation(null);
    const known = state.conversations.find((c) => c.skey === skey);
    if (known && action !== 'delete' && title !== undefined && title !== null) {
      known.title = title;
      renderConversations();
    }
    reloadList();
  });
}

const reloadConversation = debounce(() => {
  loadConversation().then(() => followPending()).catch(console.warn);
}, 60);
function followConversation(skey) {
  if (state.convEvents?.skey === skey) return;
  state.convEvents?.ctrl.abort();
  state.convEvents = null;
  if (!skey) return;
  const ctrl = new AbortController();
  state.convEvents = { skey, ctrl };
  followEvents(`/api/conversations/${skey}/events`, ctrl, (ev) => {
    if (state.skey !== skey) return;
    if (ev.event === 'title') {
      if (state.info) state.info.title = ev.data.title;
      const known = state.conversations.find((c) => c.skey === skey);
      if (known) known.title = ev.data.title;
      renderConversations();
    } else if (ev.event === 'record') {
      reloadConversation();
    }
  });
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
  window.addEventListener('scroll', () => {
    const main = document.scrollingElement;
    atBottom = main.scrollHeight - main.scrollTop - main.clientHeight < 80;
  }, { passive: true });
  // A rotated phone or a resized window reflows the thread: stay at the newest message.
  window.addEventListener('resize', () => { if (atBottom) scrollToEnd(true); });
  // A phone's two-line box has no room for the keyboard hints (and no Shift key to hint at).
  const narrow = window.matchMedia('(max-width: 48rem)');
  const hint = $('input').placeholder;
  const placeholder = () => { $('input').placeholder = narrow.matches ? 'Message' : hint; };
  narrow.addEventListener('change', placeholder);
  placeholder();
  $('settings-btn').addEventListener('click', openSettings);
  $('settings-form').addEventListener('submit', saveSettings);
  $('settings-close').addEventListener('click', () => $('settings').close());
  const searchSoon = debounce(() => loadConversations().catch(showError), 200);
  $('search').addEventListener('input', () => { state.search = $('search').value.trim(); searchSoon(); });
  if (state.token) signIn(state.token); else showSignIn();
}

main();
