// a2a-lifecycle console. A client of the server's own HTTP+JSON binding
// (spec §11) and its Server-Sent Events, like any other: no private API.
// Every piece of agent or user text goes into the page as a text node
// (never innerHTML), links only to http(s) URLs or the page's own blobs,
// and the Content-Security-Policy the server sends allows no other script.
'use strict';
(() => {
  const body = document.body;
  const TENANTS = JSON.parse(body.dataset.tenants || '[""]');
  const AUTH = body.dataset.auth === 'bearer';
  // The transition log extension (README, "The transition log").
  const TRANSITIONS = 'urn:a2a-lifecycle:ext:transitions:v1';
  const STATES = ['SUBMITTED', 'WORKING', 'INPUT_REQUIRED', 'AUTH_REQUIRED',
    'COMPLETED', 'FAILED', 'CANCELED', 'REJECTED'];
  const TERMINAL = new Set(['COMPLETED', 'FAILED', 'CANCELED', 'REJECTED']);
  const TOKEN_KEY = 'a2a-console-token';
  // How often a list and an interrupted task are read again, and the
  // counts by state (each a ListTasks call of one row).
  const POLL_MS = 2000;
  const COUNTS_MS = 5000;
  const PAGE_SIZE = 20;
  // A dropped stream is taken up again after this, doubling to the most.
  const RETRY_MS = 500;
  const RETRY_MAX_MS = 8000;

  const main = document.getElementById('main');
  const notice = document.getElementById('notice');
  let current = { stop() {} };

  // ---- building the page: text nodes only ----

  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'href') e.setAttribute('href', safeHref(v));
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid == null || kid === false) continue;
      e.append(kid instanceof Node ? kid : String(kid));
    }
    return e;
  }

  // The page's own routes, its own blob: downloads, and http(s) URLs.
  function safeHref(v) {
    const s = String(v);
    if (s.startsWith('#') || s.startsWith('blob:')) return s;
    try {
      const u = new URL(s, location.href);
      if (u.protocol === 'http:' || u.protocol === 'https:') return u.href;
    } catch (_) { /* not a URL */ }
    return '#';
  }

  function show(...kids) {
    main.replaceChildren(...kids.flat());
  }

  function say(text) {
    notice.textContent = text || '';
    notice.hidden = !text;
  }

  const enc = encodeURIComponent;
  const short = (state) => String(state || '').replace(/^TASK_STATE_/, '');
  const kebab = (state) => short(state).toLowerCase().replace(/_/g, '-');
  const tenantName = (t) => t || 'default';
  const base = (t) => (t ? '/' + enc(t) : '');
  const listHref = (t, q) => '#/' + (t ? enc(t) + '/' : '') + 'tasks' + (q && String(q) ? '?' + q : '');
  const taskHref = (t, id) => '#/' + (t ? enc(t) + '/' : '') + 'tasks/' + enc(id);

  function when(ts) {
    if (!ts) return '';
    const d = new Date(ts);
    return isNaN(d) ? String(ts) : d.toLocaleString();
  }

  function newId() {
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const x = Array.from(b, (n) => n.toString(16).padStart(2, '0')).join('');
    return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
  }

  // ---- the client's next step (the lifecycle manual: wait, act, stop) ----

  function nextStep(task) {
    const state = short(task && task.status && task.status.state);
    if (TERMINAL.has(state)) return { kind: 'stop', what: 'stop', why: 'ended ' + state.toLowerCase().replace('_', ' ') };
    if (state === 'INPUT_REQUIRED') return { kind: 'act', what: 'act', why: 'answer the agent' };
    if (state === 'AUTH_REQUIRED') {
      return { kind: 'act', what: 'act', why: 'authorize (or wait: an approval given elsewhere resumes it)' };
    }
    return { kind: 'wait', what: 'wait', why: 'the agent is on it' };
  }

  function stateBadge(state) {
    return h('span', { class: 'badge s-' + kebab(state), 'data-state': short(state) }, short(state) || '?');
  }

  function nextBadge(task) {
    const n = nextStep(task);
    return h('span', { class: 'badge n-' + n.kind, 'data-next': n.kind, title: n.why }, n.what);
  }

  // ---- talking to the server ----

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  }

  class CallError extends Error {
    constructor(status, message, reason) {
      super(message);
      this.status = status;
      this.reason = reason;
    }
  }

  async function call(method, path, opts) {
    const o = opts || {};
    const headers = { 'A2A-Version': '1.0', Accept: o.accept || 'application/json' };
    if (o.body !== undefined) headers['Content-Type'] = 'application/json';
    if (o.transitions) headers['A2A-Extensions'] = TRANSITIONS;
    const t = token();
    if (t) headers.Authorization = 'Bearer ' + t;
    const res = await fetch(path, {
      method,
      headers,
      body: o.body === undefined ? undefined : JSON.stringify(o.body),
      signal: o.signal,
      cache: 'no-store',
    });
    if (!res.ok) throw await failure(res);
    return res;
  }

  async function failure(res) {
    let message = `${res.status} ${res.statusText}`;
    let reason = '';
    try {
      const j = await res.json();
      const e = j.error || j;
      if (e.message) message = e.message;
      const info = (e.details || []).find((d) => d && d.reason);
      reason = info ? info.reason : e.status || '';
    } catch (_) { /* not JSON */ }
    if (res.status === 401) {
      // The view stops asking until a token is given (it starts again).
      current.stop();
      askToken(message);
    }
    return new CallError(res.status, message, reason);
  }

  const getJson = async (path, opts) => (await call('GET', path, opts)).json();
  const postJson = async (path, b, opts) => (await call('POST', path, { ...opts, body: b })).json();

  function errorText(err) {
    if (err instanceof CallError) return err.reason ? `${err.message} (${err.reason})` : err.message;
    return 'The server did not answer: ' + (err && err.message ? err.message : String(err));
  }

  // ---- authentication: a token for this tab only ----

  const login = document.getElementById('login');
  const signout = document.getElementById('signout');

  function askToken(why) {
    login.hidden = false;
    document.getElementById('login-error').textContent = token() ? why || '' : '';
    signout.hidden = !token();
    document.getElementById('token').focus();
  }

  document.getElementById('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = document.getElementById('token');
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = '';
    login.hidden = true;
    signout.hidden = false;
    route();
  });

  signout.addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    signout.hidden = true;
    current.stop();
    show();
    askToken('');
  });

  // ---- agents ----

  const cards = new Map();

  async function card(tenant) {
    if (!cards.has(tenant)) {
      const p = fetch(base(tenant) + '/.well-known/agent-card.json', { cache: 'no-store' })
        .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`card: ${r.status}`))));
      cards.set(tenant, p);
      p.catch(() => cards.delete(tenant));
    }
    return cards.get(tenant);
  }

  function navAgents(active) {
    const nav = document.getElementById('agents');
    nav.replaceChildren(...TENANTS.map((t) => h('a', {
      href: listHref(t),
      'aria-current': active === t ? 'page' : null,
    }, tenantName(t))));
  }

  function cardPanel(tenant, c, full) {
    const caps = c.capabilities || {};
    const capList = [];
    if (caps.streaming) capList.push('streaming');
    if (caps.pushNotifications) capList.push('push notifications');
    if (caps.extendedAgentCard) capList.push('extended card');
    const exts = (caps.extensions || []).map((e) => e.uri);
    return h('section', { class: 'panel card', 'data-tenant': tenant },
      h('h2', {}, c.name || tenantName(tenant), ' ', h('span', { class: 'muted' }, '(tenant ', tenantName(tenant), ')')),
      c.description ? h('p', {}, c.description) : null,
      h('dl', { class: 'kv' },
        h('dt', {}, 'Input'), h('dd', {}, (c.defaultInputModes || []).join(', ') || '-'),
        h('dt', {}, 'Output'), h('dd', {}, (c.defaultOutputModes || []).join(', ') || '-'),
        h('dt', {}, 'Capabilities'), h('dd', {}, capList.join(', ') || '-'),
        full && exts.length ? [h('dt', {}, 'Extensions'), h('dd', { class: 'mono' }, exts.join(' '))] : null,
        h('dt', {}, 'Version'), h('dd', {}, c.version || '-')),
      h('h3', {}, 'Skills'),
      h('ul', {}, (c.skills || []).map((s) => h('li', {},
        h('strong', {}, s.name || s.id), s.description ? ' - ' + s.description : '',
        (s.examples || []).length ? h('div', { class: 'muted' }, 'e.g. ', s.examples.join(' / ')) : null))),
      full ? null : h('a', { href: listHref(tenant) }, 'Tasks and a new task'));
  }

  function homeView() {
    navAgents(null);
    const grid = h('div', { class: 'grid' });
    show(h('h1', {}, 'Agents'), grid);
    for (const t of TENANTS) {
      const slot = h('section', { class: 'panel' }, h('h2', {}, tenantName(t)));
      grid.append(slot);
      card(t).then((c) => slot.replaceWith(cardPanel(t, c, false)),
        (e) => slot.append(h('p', { class: 'error' }, errorText(e))));
    }
    return { stop() {} };
  }

  // ---- starting a task ----

  function startForm(tenant) {
    const text = h('textarea', { id: 'start-text', name: 'text', required: true, rows: 2 });
    const out = h('div', { role: 'status' });
    const form = h('form', {
      class: 'panel', id: 'start',
      onsubmit: async (ev) => {
        ev.preventDefault();
        out.replaceChildren();
        const button = form.querySelector('button');
        button.disabled = true;
        try {
          const answer = await postJson(base(tenant) + '/message:send', {
            message: { messageId: newId(), role: 'ROLE_USER', parts: [{ text: text.value }] },
            configuration: { returnImmediately: true },
          });
          if (answer.task) {
            location.hash = taskHref(tenant, answer.task.id);
          } else if (answer.message) {
            out.replaceChildren(messageBlock(answer.message, 'reply'));
          }
        } catch (e) {
          out.replaceChildren(h('p', { class: 'error' }, errorText(e)));
        } finally {
          button.disabled = false;
        }
      },
    },
    h('label', { for: 'start-text' }, h('h2', {}, 'New task for ', tenantName(tenant))),
    text, h('div', { class: 'row' }, h('button', { type: 'submit' }, 'Send')), out);
    return form;
  }

  // ---- task lists ----

  const pageStacks = new Map();

  function listView(tenant, q) {
    navAgents(tenant);
    let state = short((q.get('state') || '').toUpperCase().replace(/-/g, '_'));
    if (state && !STATES.includes(state)) state = '';
    const context = q.get('context') || '';
    const pageToken = q.get('page') || '';
    const key = `${tenant}\n${state}\n${context}`;
    if (!pageToken) pageStacks.set(key, []);
    const stack = pageStacks.get(key) || [];
    const query = (extra) => {
      const p = new URLSearchParams();
      if (state) p.set('state', kebab(state));
      if (context) p.set('context', context);
      for (const [k, v] of Object.entries(extra || {})) if (v) p.set(k, v);
      return p;
    };

    const cardSlot = h('div');
    card(tenant).then((c) => cardSlot.replaceChildren(cardPanel(tenant, c, true)), () => {});
    const counts = h('ul', { class: 'chips', id: 'counts', 'aria-label': 'Tasks by state' });
    const stateSelect = h('select', { id: 'f-state', name: 'state' },
      h('option', { value: '' }, 'every state'),
      STATES.map((s) => h('option', { value: kebab(s), selected: s === state }, s.toLowerCase().replace(/_/g, ' '))));
    const contextInput = h('input', { id: 'f-context', name: 'context', value: context, placeholder: 'context id', spellcheck: 'false' });
    const filters = h('form', {
      class: 'filters',
      onsubmit: (ev) => {
        ev.preventDefault();
        const p = new URLSearchParams();
        if (stateSelect.value) p.set('state', stateSelect.value);
        if (contextInput.value.trim()) p.set('context', contextInput.value.trim());
        location.hash = listHref(tenant, p);
      },
    },
    h('label', {}, 'State', stateSelect),
    h('label', {}, 'Context', contextInput),
    h('button', { type: 'submit' }, 'Filter'));
    const rows = h('tbody', { id: 'task-rows' });
    const status = h('p', { class: 'muted', role: 'status' });
    const newer = h('a', { href: '#', id: 'newer' }, 'Newer');
    const older = h('a', { href: '#', id: 'older' }, 'Older');
    const total = h('span', { class: 'muted' });
    show(h('h1', {}, 'Tasks of ', tenantName(tenant)),
      h('div', { class: 'cols' },
        h('div', {},
          h('section', { class: 'panel' }, counts, filters),
          h('section', { class: 'panel' },
            h('table', {}, h('thead', {}, h('tr', {},
              h('th', {}, 'Task'), h('th', {}, 'State'), h('th', {}, 'Next'),
              h('th', {}, 'Status message'), h('th', {}, 'Updated'))), rows),
            status,
            h('div', { class: 'pager' }, newer, older, total))),
        h('div', {}, startForm(tenant), cardSlot)));

    const byId = new Map();
    function row(task) {
      const sig = JSON.stringify(task.status);
      let tr = byId.get(task.id);
      if (tr && tr.dataset.sig === sig) return tr;
      const msg = statusText(task);
      const next = h('tr', { 'data-task': task.id, 'data-sig': sig },
        h('td', { class: 'id mono' }, h('a', { href: taskHref(tenant, task.id) }, task.id),
          task.contextId ? h('div', { class: 'muted' }, 'context ', h('a', { href: listHref(tenant, new URLSearchParams({ context: task.contextId })) }, task.contextId)) : null),
        h('td', {}, stateBadge(task.status && task.status.state)),
        h('td', {}, nextBadge(task)),
        h('td', {}, msg.length > 160 ? msg.slice(0, 160) + '...' : msg),
        h('td', {}, when(task.status && task.status.timestamp)));
      if (tr) tr.replaceWith(next);
      byId.set(task.id, next);
      return next;
    }

    let stopped = false;
    let timer = 0;
    let countsAt = 0;
    async function refresh() {
      timer = 0;
      if (stopped) return;
      if (document.hidden) {
        timer = setTimeout(refresh, POLL_MS);
        return;
      }
      const p = new URLSearchParams({ pageSize: String(PAGE_SIZE), historyLength: '0' });
      if (state) p.set('status', 'TASK_STATE_' + state);
      if (context) p.set('contextId', context);
      if (pageToken) p.set('pageToken', pageToken);
      try {
        const page = await getJson(base(tenant) + '/tasks?' + p);
        if (stopped) return;
        const tasks = page.tasks || [];
        const seen = new Set(tasks.map((t) => t.id));
        for (const id of [...byId.keys()]) if (!seen.has(id)) byId.delete(id);
        const wanted = tasks.map(row);
        // Rows not changed stay the same nodes (and keep the focus).
        wanted.forEach((tr, i) => {
          if (rows.children[i] !== tr) rows.insertBefore(tr, rows.children[i] || null);
        });
        while (rows.children.length > wanted.length) rows.lastChild.remove();
        status.textContent = tasks.length ? '' : 'No task matches.';
        total.textContent = `${page.totalSize || 0} in all`;
        newer.hidden = !pageToken;
        older.hidden = !page.nextPageToken;
        older.dataset.token = page.nextPageToken || '';
        say('');
        if (Date.now() - countsAt >= COUNTS_MS) {
          countsAt = Date.now();
          refreshCounts();
        }
      } catch (e) {
        if (stopped) return;
        status.textContent = errorText(e);
      }
      if (!stopped) timer = setTimeout(refresh, POLL_MS);
    }

    async function refreshCounts() {
      const got = await Promise.all(STATES.map(async (s) => {
        const p = new URLSearchParams({ pageSize: '1', historyLength: '0', status: 'TASK_STATE_' + s });
        if (context) p.set('contextId', context);
        try {
          return [s, (await getJson(base(tenant) + '/tasks?' + p)).totalSize || 0];
        } catch (_) {
          return [s, null];
        }
      }));
      if (stopped) return;
      counts.replaceChildren(...got.map(([s, n]) => {
        const p = new URLSearchParams({ state: kebab(s) });
        if (context) p.set('context', context);
        return h('li', {}, h('a', {
          class: 'chip s-' + kebab(s), href: listHref(tenant, p),
          'aria-current': s === state ? 'true' : null, 'data-count': s,
        }, s.toLowerCase().replace(/_/g, ' '), ' ', n == null ? '?' : String(n)));
      }));
    }

    newer.addEventListener('click', (ev) => {
      ev.preventDefault();
      const prev = stack.pop();
      location.hash = listHref(tenant, query({ page: prev || '' }));
    });
    older.addEventListener('click', (ev) => {
      ev.preventDefault();
      stack.push(pageToken);
      pageStacks.set(key, stack);
      location.hash = listHref(tenant, query({ page: older.dataset.token }));
    });
    refresh();
    return {
      stop() {
        stopped = true;
        clearTimeout(timer);
      },
    };
  }

  // ---- a task ----

  function textOf(parts) {
    return (parts || []).filter((p) => typeof p.text === 'string').map((p) => p.text).join('');
  }

  function statusText(task) {
    return textOf(task && task.status && task.status.message && task.status.message.parts);
  }

  function base64Blob(b64, type) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Blob([bytes], { type: type || 'application/octet-stream' });
  }

  // The blob: URLs of the file parts on show, revoked when redrawn.
  const blobs = [];

  // Consecutive text parts (an artifact's chunks) read as one text.
  function partsBlock(parts) {
    const out = [];
    let text = null;
    for (const p of parts || []) {
      if (typeof p.text === 'string') {
        if (text) {
          text.textContent += p.text;
          continue;
        }
        text = h('pre', { class: 'part text' }, p.text);
        out.push(text);
        continue;
      }
      text = null;
      if (p.data !== undefined) {
        out.push(h('div', { class: 'part data' }, h('pre', {}, JSON.stringify(p.data, null, 2))));
      } else if (typeof p.raw === 'string') {
        let href = '#';
        try {
          href = URL.createObjectURL(base64Blob(p.raw, p.mediaType));
          blobs.push(href);
        } catch (_) { /* not base64 */ }
        out.push(h('div', { class: 'part file' }, h('a', { href, download: p.filename || 'file' },
          'Download ', p.filename || 'file'), ' ', h('span', { class: 'muted' }, p.mediaType || '')));
      } else if (typeof p.url === 'string') {
        out.push(h('div', { class: 'part file' }, h('a', { href: p.url, rel: 'noopener noreferrer', target: '_blank' },
          p.filename || p.url), ' ', h('span', { class: 'muted' }, p.mediaType || '')));
      }
    }
    return out;
  }

  function messageBlock(m, kind) {
    const role = m.role === 'ROLE_AGENT' ? 'agent' : 'user';
    return h('article', { class: `msg ${role} ${kind || ''}`, 'data-message': m.messageId || '' },
      h('header', {}, role, kind === 'status' ? ' (status)' : '', m.messageId ? ' - ' + m.messageId : ''),
      partsBlock(m.parts));
  }

  function taskView(tenant, id) {
    navAgents(tenant);
    let task = null;
    let transitions = null;
    let stopped = false;
    let live = false;
    let streamCtl = null;
    let timer = 0;
    let retry = RETRY_MS;
    let actionsFor = '';
    let refreshTimer = 0;

    const title = h('h1', {}, 'Task ', h('span', { class: 'mono' }, id));
    const meta = h('dl', { class: 'kv', id: 'task-meta' });
    const liveNote = h('p', { class: 'live', id: 'live', role: 'status' });
    const actions = h('section', { class: 'panel next', id: 'next' });
    const conversation = h('div', { id: 'conversation' });
    const artifacts = h('div', { id: 'artifacts' });
    const timeline = h('ol', { class: 'timeline', id: 'timeline' });
    const problem = h('p', { class: 'error', role: 'alert' });
    show(title, problem,
      h('section', { class: 'panel' }, meta, liveNote),
      actions,
      h('div', { class: 'cols' },
        h('div', {},
          h('section', { class: 'panel' }, h('h2', {}, 'Conversation'), conversation),
          h('section', { class: 'panel' }, h('h2', {}, 'Artifacts'), artifacts)),
        h('section', { class: 'panel' }, h('h2', {}, 'Transitions'), timeline)));

    const state = () => short(task && task.status && task.status.state);

    function render() {
      if (!task) return;
      blobs.splice(0).forEach((u) => URL.revokeObjectURL(u));
      meta.replaceChildren(
        h('dt', {}, 'Agent'), h('dd', {}, h('a', { href: listHref(tenant) }, tenantName(tenant))),
        h('dt', {}, 'Context'), h('dd', { class: 'mono' }, task.contextId
          ? h('a', { href: listHref(tenant, new URLSearchParams({ context: task.contextId })) }, task.contextId) : '-'),
        h('dt', {}, 'State'), h('dd', { id: 'state' }, stateBadge(task.status && task.status.state), ' ', nextBadge(task)),
        h('dt', {}, 'Updated'), h('dd', {}, when(task.status && task.status.timestamp)));
      const shown = new Set();
      const msgs = [];
      for (const m of task.history || []) {
        shown.add(m.messageId);
        msgs.push(messageBlock(m, ''));
      }
      const sm = task.status && task.status.message;
      if (sm && !shown.has(sm.messageId)) msgs.push(messageBlock(sm, 'status'));
      conversation.replaceChildren(...(msgs.length ? msgs : [h('p', { class: 'muted' }, 'No messages.')]));
      const arts = (task.artifacts || []).map((a) => h('article', { class: 'artifact', 'data-artifact': a.artifactId },
        h('h3', {}, a.name || a.artifactId), a.description ? h('p', { class: 'muted' }, a.description) : null,
        partsBlock(a.parts)));
      artifacts.replaceChildren(...(arts.length ? arts : [h('p', { class: 'muted' }, 'None yet.')]));
      renderTimeline();
      renderActions();
    }

    function renderTimeline() {
      if (!transitions) {
        timeline.replaceChildren(h('li', { class: 'muted' }, 'Not known.'));
        return;
      }
      timeline.replaceChildren(...transitions.map((t) => h('li', { 'data-state': short(t.state), 'data-cause': t.cause },
        stateBadge(t.state), ' ', h('span', {}, t.cause), ' ',
        h('div', { class: 'muted' }, when(t.timestamp), t.messageId ? ' - ' + t.messageId : ''))));
    }

    // The action area is rebuilt only when the state changes, so an
    // answer being typed, or the focus on a button, survives the task's
    // progress updates; the status message is updated in place.
    function renderActions() {
      const s = state();
      const n = nextStep(task);
      const why = statusText(task);
      if (s === actionsFor) {
        const p = actions.querySelector('#why');
        if (p) p.textContent = why;
        return;
      }
      actionsFor = s;
      actions.className = 'panel next n-' + n.kind;
      const parts = [h('h2', {}, 'Next: ', nextBadge(task), ' ', n.why), h('p', { id: 'why' }, why)];
      if (s === 'INPUT_REQUIRED' || s === 'AUTH_REQUIRED') parts.push(answerForm());
      if (!TERMINAL.has(s)) {
        parts.push(h('div', { class: 'row' }, h('button', { type: 'button', class: 'danger', id: 'cancel', onclick: cancel }, 'Cancel task')));
      }
      actions.replaceChildren(...parts);
    }

    function answerForm() {
      const text = h('textarea', { id: 'answer-text', name: 'answer', required: true, rows: 3 });
      const form = h('form', {
        id: 'answer',
        onsubmit: async (ev) => {
          ev.preventDefault();
          const button = form.querySelector('button');
          button.disabled = true;
          try {
            const answer = await postJson(base(tenant) + '/message:send', {
              message: {
                messageId: newId(), role: 'ROLE_USER', taskId: id,
                contextId: task.contextId || undefined, parts: [{ text: text.value }],
              },
              configuration: { returnImmediately: true },
            });
            problem.textContent = '';
            if (answer.task) absorb(answer.task, true);
            follow();
          } catch (e) {
            problem.textContent = errorText(e);
            button.disabled = false;
          }
        },
      },
      h('label', { for: 'answer-text' }, 'Your answer'), text,
      h('div', { class: 'row' }, h('button', { type: 'submit' }, 'Send answer')));
      return form;
    }

    async function cancel() {
      try {
        const t = await postJson(base(tenant) + '/tasks/' + enc(id) + ':cancel', {});
        problem.textContent = '';
        absorb(t, !live);
        loadTransitions();
      } catch (e) {
        problem.textContent = errorText(e);
      }
    }

    // A task read by GetTask: its history (with the client's messages the
    // stream does not carry) is merged in; status and artifacts replace
    // the model's only when no stream is feeding it, or when newer.
    function absorb(got, whole) {
      if (!task || whole || !live) {
        task = got;
      } else {
        const merged = (got.history || []).slice();
        const have = new Set(merged.map((m) => m.messageId));
        for (const m of task.history || []) if (!have.has(m.messageId)) merged.push(m);
        task.history = merged;
        if (newer(got, task)) task.status = got.status;
      }
      const log = got.metadata && got.metadata[TRANSITIONS];
      if (log && Array.isArray(log.transitions)) transitions = log.transitions;
      render();
    }

    function newer(a, b) {
      const ta = Date.parse(a.status && a.status.timestamp);
      const tb = Date.parse(b.status && b.status.timestamp);
      return ta > tb;
    }

    async function load() {
      const got = await getJson(base(tenant) + '/tasks/' + enc(id), { transitions: true });
      if (stopped) return null;
      absorb(got, false);
      return got;
    }

    function loadTransitions() {
      clearTimeout(refreshTimer);
      refreshTimer = setTimeout(() => {
        load().catch((e) => { problem.textContent = errorText(e); });
      }, 150);
    }

    function apply(ev) {
      if (ev.task) {
        // A snapshot (the first event, or after falling behind):
        // everything before it is in it, so it replaces the model.
        const log = transitions;
        task = ev.task;
        transitions = log;
        loadTransitions();
      } else if (ev.statusUpdate && task) {
        const before = state();
        const old = task.status && task.status.message;
        task.history = task.history || [];
        if (old && old.messageId && !task.history.some((m) => m.messageId === old.messageId)) {
          task.history.push(old);
        }
        task.status = ev.statusUpdate.status;
        if (state() !== before) loadTransitions();
      } else if (ev.artifactUpdate && task) {
        const u = ev.artifactUpdate;
        const list = task.artifacts = task.artifacts || [];
        const i = list.findIndex((a) => a.artifactId === u.artifact.artifactId);
        if (u.append && i >= 0) {
          const a = list[i];
          a.parts = (a.parts || []).concat(u.artifact.parts || []);
          if (u.artifact.name) a.name = u.artifact.name;
        } else if (i >= 0) {
          list[i] = u.artifact;
        } else {
          list.push(u.artifact);
        }
      }
      render();
    }

    function setLive(text) {
      liveNote.textContent = text;
    }

    // Follows the task: a stream while it is active, reading it again
    // every POLL_MS while it is interrupted (its stream ends then), and
    // nothing once it is terminal.
    function follow() {
      clearTimeout(timer);
      timer = 0;
      if (stopped || live) return;
      const s = state();
      if (TERMINAL.has(s)) {
        setLive('Ended.');
        // The task ended by an answer's or a cancel's reply, say: the log
        // is read once more if it does not yet end in this state.
        const last = transitions && transitions[transitions.length - 1];
        if (!last || short(last.state) !== s) loadTransitions();
        return;
      }
      if (s === 'INPUT_REQUIRED' || s === 'AUTH_REQUIRED') {
        setLive('Waiting; read again every few seconds.');
        timer = setTimeout(async () => {
          try {
            const before = s;
            const got = await load();
            if (got && short(got.status.state) !== before) retry = RETRY_MS;
          } catch (e) {
            problem.textContent = errorText(e);
          }
          follow();
        }, POLL_MS);
        return;
      }
      stream();
    }

    async function stream() {
      live = true;
      streamCtl = new AbortController();
      setLive('Live.');
      let ended = 'closed';
      try {
        const res = await call('POST', base(tenant) + '/tasks/' + enc(id) + ':subscribe',
          { accept: 'text/event-stream', signal: streamCtl.signal });
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let cut;
          while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(buffer.slice(cut).match(/^\r?\n\r?\n/)[0].length + cut);
            let event = 'message';
            const data = [];
            for (const line of block.split(/\r?\n/)) {
              if (line.startsWith('event:')) event = line.slice(6).trim();
              else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
            }
            if (!data.length) continue;
            const parsed = JSON.parse(data.join('\n'));
            if (event === 'error') {
              const e = parsed.error || parsed;
              ended = 'error: ' + (e.message || 'stream error');
              continue;
            }
            retry = RETRY_MS;
            apply(parsed);
          }
        }
      } catch (e) {
        if (stopped) return;
        if (e instanceof CallError && e.reason !== 'UNAVAILABLE') {
          // A terminal task cannot be subscribed to (spec §3.1.6): read it.
          live = false;
          if (e.status === 401) return;
          try {
            await load();
          } catch (e2) {
            problem.textContent = errorText(e2);
            return;
          }
          if (TERMINAL.has(state())) {
            follow();
            return;
          }
          problem.textContent = errorText(e);
        }
        ended = 'dropped';
      }
      live = false;
      if (stopped) return;
      // Read it once more: the stream ends when the task ends or waits,
      // and the client's own messages are only in GetTask's history.
      try {
        await load();
      } catch (_) { /* the next attempt says */ }
      if (stopped) return;
      const s = state();
      if (!TERMINAL.has(s) && s !== 'INPUT_REQUIRED' && s !== 'AUTH_REQUIRED') {
        setLive(`Connection ${ended}; reconnecting...`);
        timer = setTimeout(follow, retry);
        retry = Math.min(retry * 2, RETRY_MAX_MS);
        return;
      }
      follow();
    }

    load().then((got) => {
      if (got) follow();
    }, (e) => {
      problem.textContent = errorText(e);
      if (e.status === 404 || e.reason === 'TASK_NOT_FOUND') {
        title.replaceChildren('No task ', h('span', { class: 'mono' }, id), ' for ', tenantName(tenant));
      }
    });

    return {
      stop() {
        stopped = true;
        clearTimeout(timer);
        clearTimeout(refreshTimer);
        if (streamCtl) streamCtl.abort();
      },
    };
  }

  // ---- routes: #/, #/tasks, #/{tenant}/tasks, #/tasks/{id}, #/{tenant}/tasks/{id} ----

  function parse() {
    const raw = location.hash.replace(/^#\/?/, '');
    const at = raw.indexOf('?');
    const path = at < 0 ? raw : raw.slice(0, at);
    const q = new URLSearchParams(at < 0 ? '' : raw.slice(at + 1));
    let parts;
    try {
      parts = path.split('/').filter((p) => p !== '').map(decodeURIComponent);
    } catch (_) {
      return { view: 'missing' };
    }
    if (parts.length === 0) return { view: 'home' };
    if (parts[0] === 'tasks' && !TENANTS.includes('tasks')) {
      return parts.length === 1 ? { view: 'list', tenant: '', q } : { view: 'task', tenant: '', id: parts.slice(1).join('/') };
    }
    if (parts.length === 1) return { view: 'list', tenant: parts[0], q };
    if (parts[1] === 'tasks') {
      return parts.length === 2 ? { view: 'list', tenant: parts[0], q } : { view: 'task', tenant: parts[0], id: parts.slice(2).join('/') };
    }
    return { view: 'missing' };
  }

  function route() {
    current.stop();
    say('');
    const r = parse();
    if (r.tenant !== undefined && !TENANTS.includes(r.tenant)) {
      navAgents(null);
      show(h('section', { class: 'panel' }, h('h1', {}, 'No agent ', JSON.stringify(r.tenant)),
        h('p', {}, 'This server serves: ', TENANTS.map(tenantName).join(', '), '.')));
      current = { stop() {} };
      return;
    }
    if (AUTH && !token()) {
      askToken('');
      if (r.view !== 'home') {
        show();
        current = { stop() {} };
        return;
      }
    }
    if (r.view === 'home') current = homeView();
    else if (r.view === 'list') current = listView(r.tenant, r.q);
    else if (r.view === 'task') current = taskView(r.tenant, r.id);
    else {
      show(h('section', { class: 'panel' }, h('h1', {}, 'Nothing here'), h('a', { href: '#/' }, 'Agents')));
      current = { stop() {} };
    }
    main.focus({ preventScroll: true });
  }

  document.getElementById('follow').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = document.getElementById('follow-id');
    const id = input.value.trim();
    if (!id) return;
    const r = parse();
    input.value = '';
    location.hash = taskHref(r.tenant || '', id);
  });

  signout.hidden = !token();
  window.addEventListener('hashchange', route);
  route();
})();
