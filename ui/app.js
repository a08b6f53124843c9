// DevPilot window. Talks to Rust only through Tauri commands (invoke) and events (listen).
// No timers tick while nothing changes: lists refresh on engine events.
'use strict';

const T = window.__TAURI__;
const invoke = (cmd, args) => T.core.invoke(cmd, args || {});
const $ = (id) => document.getElementById(id);

let status = null;
let filter = 'all';
let openJob = null;
let logTimer = null;
let beforeClose = null;

/** `u` as an absolute http(s) URL, or null. */
function webLink(u) {
  try {
    const x = new URL(u);
    return x.protocol === 'http:' || x.protocol === 'https:' ? x.href : null;
  } catch {
    return null;
  }
}

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? '' : String(c)));
  return e;
}

function ago(ms) {
  if (ms == null) return '';
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd';
}

// A wall-clock time on the user's clock: "14:30" today, "Wed 14:30" another day (as the tray says it).
function clock(ms) {
  const t = new Date(ms);
  const two = (n) => String(n).padStart(2, '0');
  const hhmm = `${two(t.getHours())}:${two(t.getMinutes())}`;
  return t.toDateString() === new Date().toDateString() ? hhmm : `${t.toLocaleDateString([], { weekday: 'short' })} ${hhmm}`;
}

function errText(e) {
  if (e && typeof e === 'object' && e.message) return e.message;
  return String(e);
}

// ---------------------------------------------------------------- status

const WORDS = {
  starting: 'Starting…', idle: 'Idle', working: 'Working', paused: 'Paused', off: 'Dispatch off',
  offline: 'Offline', error: 'Needs attention', needs_agent: 'Set an agent command', stopped: 'Stopped',
};

function renderStatus(st) {
  status = st;
  const pill = $('state');
  pill.dataset.state = st.state;
  let text = WORDS[st.state] || st.state;
  if (st.state === 'working') text += ` (${st.running.length})`;
  if (st.state === 'paused' && st.paused_until_unix_ms != null) text += ` until ${clock(st.paused_until_unix_ms)}`;
  if (st.agent === 'demo') text += ' · demo agent';
  pill.textContent = text;
  pill.title = `${st.orchestrator_id} on ${st.machine} · ${st.backend} ${st.database}`;
  $('dispatch').checked = !!st.dispatch_enabled;
  $('pause-btn').textContent = st.paused ? 'Resume' : 'Pause';
  const banner = $('banner');
  if (st.message) {
    banner.textContent = st.message;
    banner.hidden = false;
  } else {
    banner.hidden = true;
  }
  $('fleet-orch').textContent = st.orchestrator_id ? `orchestrator ${st.orchestrator_id}` : '';
}

// The settings file could not be parsed at start: it was kept aside and the defaults are in
// force. Stays until dismissed (the file stays where it was kept).
function renderSetAside(kept) {
  const n = $('config-notice');
  if (!kept) { n.hidden = true; return; }
  $('config-notice-text').textContent = `DevPilot could not read its settings file (${kept.reason}). `
    + `It was kept as ${kept.kept_as}, nothing was overwritten, and DevPilot started with default settings. `
    + 'Check Settings, and copy back from that file what you need.';
  n.hidden = false;
}

// What an action did, when it did not do the obvious (a key that was live, a cancel asked
// of another machine). Stays until the next action's notice or ten seconds.
let noticeTimer = null;
function notice(text) {
  const n = $('notice');
  n.textContent = text;
  n.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { n.hidden = true; }, 10000);
}

async function refreshStatus() {
  try { renderStatus(await invoke('get_status')); } catch (e) { console.error(e); }
}

// ---------------------------------------------------------------- fleet

async function refreshFleet() {
  const body = $('machines');
  try {
    const f = await invoke('fleet');
    body.replaceChildren();
    const holds = {};
    for (const j of f.running) {
      (holds[j.claimed_by] = holds[j.claimed_by] || []).push(j);
    }
    for (const m of f.machines) {
      const seen = m.now - m.last_seen_at;
      const stale = seen > 120000 && m.status !== 'stopped';
      const word = stale ? 'offline' : m.status;
      const held = (holds[m.machine] || []).map((j) => `${j.title || '#' + j.id} (#${j.id}, ${ago(j.now - (j.claimed_at || j.now))})`).join(', ');
      body.append(el('tr', { dataset: { machine: m.machine } },
        el('td', {}, m.machine),
        el('td', { class: 'state' }, word + (m.dispatch_enabled ? '' : ' (dispatch off)')),
        el('td', {}, ago(seen) + ' ago'),
        el('td', {}, `${m.running}/${m.concurrency}`),
        el('td', {}, held || '—')));
    }
    $('fleet-empty').hidden = f.machines.length > 0;
  } catch (e) {
    body.replaceChildren(el('tr', {}, el('td', { colSpan: 5 }, errText(e))));
  }
}

// ---------------------------------------------------------------- queue

async function refreshJobs() {
  const body = $('jobs');
  try {
    const r = await invoke('list_jobs', { jobState: filter, limit: 200 });
    const c = r.counts;
    $('counts').textContent = `queued ${c.queued} · running ${c.running} · failed ${c.failed} · completed ${c.completed} · dead ${c.dead} · cancelled ${c.cancelled}`;
    body.replaceChildren();
    for (const j of r.jobs) {
      const actions = el('td', {});
      if (j.state === 'dead' || j.state === 'failed') {
        actions.append(el('button', { type: 'button', class: 'requeue', onclick: (ev) => { ev.stopPropagation(); act('requeue', j.id); } }, 'Requeue'));
      }
      // Running jobs too, wherever they run: the holder stops the agent at its next renewal.
      if ((j.state === 'queued' || j.state === 'failed' || j.state === 'running') && !j.cancel_requested_by) {
        actions.append(el('button', { type: 'button', class: 'cancel', onclick: (ev) => { ev.stopPropagation(); act('cancel', j.id); } }, 'Cancel'));
      }
      body.append(el('tr', { class: 'clickable', dataset: { id: j.id, state: j.state }, onclick: () => showJob(j.id) },
        el('td', {}, j.id),
        el('td', {}, j.title || '', issueLink(j)),
        el('td', { class: `state state-${j.state}` }, stateText(j),
          r.unroutable[j.id] ? el('div', { class: 'warn', title: 'Only a machine that has the repo and every label takes it' }, r.unroutable[j.id]) : ''),
        el('td', {}, j.attempts),
        el('td', {}, j.claimed_by || ''),
        el('td', {}, ago(j.now - j.created_at)),
        actions));
    }
    if (openJob != null) showJob(openJob);
  } catch (e) {
    body.replaceChildren(el('tr', {}, el('td', { colSpan: 7 }, errText(e))));
  }
}

// The tracker issue a job came from ("ENG-7"), as a link the user's browser opens: the
// window itself never navigates away. Only an http(s) address is a link.
function issueLink(j) {
  if (!j.issue) return '';
  const url = webLink(j.issue_url);
  if (!url) return el('span', { class: 'issue' }, j.issue);
  return el('a', {
    class: 'issue', href: url, title: `Open ${j.issue} in the browser`,
    onclick: (ev) => {
      ev.preventDefault();
      ev.stopPropagation();
      invoke('open_link', { url }).catch((e) => notice(errText(e)));
    },
  }, j.issue);
}

// "failed · retry in 1m 20s", "running · cancelling", "queued · starts in 10m".
function stateText(j) {
  const claimable = j.state === 'queued' || j.state === 'failed';
  if (claimable && j.run_at > j.now) {
    return `${j.state} · ${j.state === 'failed' ? 'retry' : 'starts'} in ${ago(j.run_at - j.now)}`;
  }
  if (j.state === 'running' && j.cancel_requested_by) return 'running · cancelling';
  return j.state;
}

async function act(cmd, id) {
  try {
    const ok = await invoke(cmd, { id });
    if (!ok) alert(`Job #${id} could not be ${cmd === 'cancel' ? 'cancelled' : 'requeued'} (its state changed).`);
    else if (ok.outcome === 'requested') notice(`Asked ${ok.holder || 'its machine'} to stop job #${id}; it ends cancelled at that machine's next renewal.`);
  } catch (e) { alert(errText(e)); }
  refreshJobs();
}

// What the agent CLI of a job's last attempt reported: "claude · session b5f7c2d1… · $0.10 ·
// 24,693 in / 45 out tokens · resumed from laptop" (the whole session id on hover). Nothing
// for a plain command, which reports none.
function agentRun(a) {
  const parts = [];
  if (!a) return parts;
  if (a.agent) parts.push(el('b', { class: 'agent-name', title: 'The preset that ran the last attempt' }, a.agent));
  if (a.agent_session) {
    const short = a.agent_session.length > 8 ? a.agent_session.slice(0, 8) + '…' : a.agent_session;
    parts.push(el('code', { class: 'agent-session', title: `${a.agent || 'agent'} session ${a.agent_session}` }, 'session ' + short));
  }
  if (a.cost_usd != null) {
    parts.push(el('span', { class: 'agent-cost', title: `$${a.cost_usd} as the CLI reported it, summed over attempts` }, usd(a.cost_usd)));
  }
  if (a.tokens_in != null || a.tokens_out != null) parts.push(`${count(a.tokens_in)} in / ${count(a.tokens_out)} out tokens`);
  if (a.session_from) {
    parts.push(el('span', { class: 'agent-resumed', title: 'This attempt resumed the conversation its agent had on that machine' }, 'resumed from ' + a.session_from));
  }
  return parts;
}

// "$0.10"; a fraction of a cent keeps its digits ("$0.0042").
function usd(x) { return '$' + (x === 0 || x >= 0.01 ? x.toFixed(2) : x.toFixed(4)); }

// 24693 as "24,693"; unknown as "?".
function count(n) { return n == null ? '?' : n.toLocaleString('en-US'); }

async function showJob(id) {
  openJob = id;
  try {
    const d = await invoke('job_detail', { id });
    const j = d.job;
    $('detail-title').textContent = `#${j.id} ${j.title || ''}`;
    const where = [];
    if (j.repo) where.push('repo ' + j.repo);
    if (j.requires && j.requires.length) where.push('needs ' + j.requires.join(', '));
    if (j.resume_branch) where.push(`resumes ${j.resume_branch} from ${j.resumed_from || '?'}`);
    if (j.worktree) where.push('worktree kept at ' + j.worktree);
    $('detail-meta').textContent = `${stateText(j)} · attempts ${j.attempts} · priority ${j.priority} · ${j.claimed_by ? 'held by ' + j.claimed_by : 'unclaimed'}${j.unique_key ? ' · key ' + j.unique_key : ''}${where.length ? ' · ' + where.join(' · ') : ''}${j.last_error ? ' · last error: ' + j.last_error : ''}`;
    if (d.unroutable) $('detail-meta').append(' · ', el('span', { class: 'warn' }, d.unroutable));
    const run = agentRun(j.agent);
    $('detail-agent').replaceChildren(...run.flatMap((p, i) => (i ? [' · ', p] : [p])));
    $('detail-agent').hidden = !run.length;
    const res = $('detail-result');
    res.replaceChildren();
    if (j.summary) res.append(el('span', {}, j.summary));
    // Only an http(s) link is a link (a row written by hand may say `javascript:`).
    const link = webLink(j.url);
    if (link) res.append(' ', el('a', { href: link, target: '_blank', rel: 'noopener' }, j.url));
    else if (j.url) res.append(' ', el('span', {}, j.url));
    res.hidden = !(j.summary || j.url);
    const h = $('detail-history');
    h.replaceChildren();
    for (const ev of d.history) {
      h.append(el('li', {}, `${new Date(ev.at).toLocaleTimeString()} ${ev.kind}${ev.machine ? ' by ' + ev.machine : ''}${ev.detail ? ': ' + ev.detail : ''}`));
    }
    $('detail-payload').textContent = JSON.stringify(d.payload, null, 2);
    const live = d.log_from && d.log_from !== 'local';
    $('detail-log-title').textContent = live
      ? `Agent log (last 16 KiB from ${d.log_from}${j.state === 'running' ? ', live' : ''})`
      : 'Agent log (this machine)';
    $('detail-log').classList.toggle('live', !!live);
    $('detail-log').textContent = d.log_tail || '(no log yet)';
    // A job running on another machine: follow its log as its holder stores it.
    clearTimeout(logTimer);
    if (live && j.state === 'running' && openJob === j.id) logTimer = setTimeout(() => { if (openJob === j.id) showJob(j.id); }, 3000);
    $('detail').hidden = false;
  } catch (e) {
    $('detail-title').textContent = errText(e);
    $('detail').hidden = false;
  }
}

// ---------------------------------------------------------------- settings

let view = null;

function dbModeChanged() {
  const m = $('db-mode').value;
  $('pg-fields').hidden = m !== 'postgres';
  $('url-fields').hidden = m !== 'url';
}

async function loadSettings() {
  try {
    view = await invoke('get_settings');
  } catch (e) {
    $('settings-msg').textContent = errText(e);
    $('settings-msg').className = 'err';
    return;
  }
  const s = view.settings;
  const d = view.db;
  $('db-mode').value = d.mode || 'embedded';
  $('db-host').value = d.host || '';
  $('db-port').value = d.port || '';
  $('db-name').value = d.database || '';
  $('db-user').value = d.user || '';
  $('db-sslmode').value = d.sslmode || '';
  $('db-sslrootcert').value = d.sslrootcert || '';
  $('db-url').value = d.url || '';
  $('db-password').value = '';
  $('db-password').placeholder = view.password_stored ? 'stored in the keychain (type to replace)' : '';
  $('pw-state').textContent = view.keychain_error
    ? `Keychain: ${view.keychain_error}`
    : (view.password_stored ? 'A password is stored in the OS keychain. It is never shown.' : 'No password stored.');
  for (const k of ['orchestrator_id', 'claim_timeout', 'heartbeat', 'poll_interval']) $('s-' + k).value = s[k];
  $('s-machine').value = s.machine || '';
  $('s-agent').value = s.agent || '';
  $('s-labels').value = (s.labels || []).join(', ');
  renderRepos();
  $('s-max_attempts').value = s.max_attempts;
  $('s-concurrency').value = s.concurrency;
  $('s-sleep_action').value = s.sleep_action;
  $('s-autostart').checked = !!s.autostart;
  $('s-keep_awake').checked = !!s.keep_awake;
  for (const k of Object.keys(s.notify)) { const c = $('n-' + k); if (c) c.checked = !!s.notify[k]; }
  const ov = view.overrides.length ? ` Environment overrides in force: ${view.overrides.join(', ')}.` : '';
  $('settings-paths').textContent = `Settings file: ${view.config_file}. Logs: ${view.log_dir}.${ov}`;
  dbModeChanged();
}

async function saveSettings(ev) {
  ev.preventDefault();
  if (!view) return;
  const msg = $('settings-msg');
  const s = Object.assign({}, view.settings);
  for (const k of ['orchestrator_id', 'claim_timeout', 'heartbeat', 'poll_interval']) s[k] = $('s-' + k).value;
  s.machine = $('s-machine').value || null;
  s.agent = $('s-agent').value || null;
  s.labels = $('s-labels').value.split(',').map((l) => l.trim()).filter((l) => l);
  s.max_attempts = parseInt($('s-max_attempts').value, 10) || 0;
  s.concurrency = parseInt($('s-concurrency').value, 10) || 0;
  s.sleep_action = $('s-sleep_action').value;
  s.autostart = $('s-autostart').checked;
  s.keep_awake = $('s-keep_awake').checked;
  s.notify = Object.assign({}, s.notify);
  for (const k of Object.keys(s.notify)) { const c = $('n-' + k); if (c) s.notify[k] = c.checked; }
  const db = {
    mode: $('db-mode').value,
    host: $('db-host').value,
    port: $('db-port').value ? parseInt($('db-port').value, 10) : null,
    database: $('db-name').value,
    user: $('db-user').value,
    sslmode: $('db-sslmode').value,
    sslrootcert: $('db-sslrootcert').value.trim(),
    url: $('db-url').value,
  };
  const pw = $('db-password').value;
  msg.textContent = 'Checking…';
  msg.className = '';
  $('save-settings').disabled = true;
  try {
    // Repos and sources are saved by their own buttons: take them as the file has them now,
    // not as this form was loaded, so this save never undoes one.
    const fresh = await invoke('get_settings');
    s.repos = fresh.settings.repos;
    s.sources = fresh.settings.sources;
    await invoke('save_settings', { input: { settings: s, db, password: pw || null } });
    $('db-password').value = '';
    msg.textContent = 'Saved.';
    msg.className = 'ok';
    await loadSettings();
  } catch (e) {
    msg.textContent = errText(e);
    msg.className = 'err';
  } finally {
    $('save-settings').disabled = false;
  }
}

// ---------------------------------------------------------------- sources

// What the list last showed of the machine's health, so a status event redraws it only on a change.
let sourcesHealth = '';

async function loadSources() {
  try {
    renderSources(await invoke('get_sources'));
  } catch (e) {
    $('sources-list').replaceChildren(el('li', { class: 'bad' }, errText(e)));
  }
}

// The last view, for what the form says of the stored key of the kind it shows.
let sourcesView = null;

function renderSources(v) {
  sourcesView = v;
  sourcesHealth = JSON.stringify(status ? status.sources || [] : []);
  $('sources-list').replaceChildren(...v.sources.map((s) => el('li', { class: s.ok ? 'ok' : 'bad', dataset: { source: s.name } },
    el('span', { class: 'line' }, s.line,
      el('span', { class: 'runs-in ' + (s.runs_in_warn ? 'warn' : 'muted') }, s.runs_in ? `${s.name}: ${s.runs_in}` : '')),
    el('button', { type: 'button', class: 'edit', onclick: () => fillSource(s.form) }, 'Edit'),
    el('button', { type: 'button', class: 'remove', onclick: () => removeSource(s.name) }, 'Remove'))));
  $('sources-empty').hidden = v.sources.length > 0;
  const from = (f) => ({ keychain: 'the OS keychain', 'keychain (imported from gh)': 'the OS keychain (imported from gh)' })[f] || f;
  const parts = [v.key_from
    ? `This machine's Linear API key comes from ${from(v.key_from)}.`
    : 'No Linear API key on this machine yet: type it below.'];
  parts.push(v.github_key_from
    ? `Its GitHub token comes from ${from(v.github_key_from)}.`
    : 'No GitHub token yet: type one below, or import it from the GitHub CLI.');
  if (v.key_error) parts.push(`Keychain: ${v.key_error}`);
  if (v.db_error) parts.push(`The fleet's view of the sources is unavailable: ${v.db_error}`);
  $('sources-key').textContent = parts.join(' ');
  const sel = $('source-repo');
  const keep = sel.value;
  sel.replaceChildren(el('option', { value: '' }, '(none)'), ...v.repos.map((r) => el('option', { value: r }, r)));
  sel.value = v.repos.includes(keep) ? keep : '';
  showSourceKind();
}

// Shows the fields of the tracker the form is set to (Linear: teams and states; GitHub: the
// repository and Import from gh), and what its key is called.
function showSourceKind() {
  const kind = $('source-kind').value;
  for (const e of document.querySelectorAll('#sources-form [data-kind]')) e.hidden = e.dataset.kind !== kind;
  const gh = kind === 'github';
  const stored = sourcesView && (gh ? sourcesView.github_key_from : sourcesView.key_from);
  $('source-key-name').textContent = gh ? 'Token' : 'API key';
  $('source-key').placeholder = stored ? 'stored (type to replace)' : (gh ? 'github_pat_… or ghp_…' : 'lin_api_…');
  $('source-name').placeholder = gh ? '(the repository, e.g. webapp)' : '(the first team, e.g. eng)';
  $('source-api-url').placeholder = gh ? "(empty: GitHub's, https://api.github.com)" : "(empty: Linear's, https://api.linear.app/graphql)";
}

// The form as the engine reads it (SourceForm).
function sourceForm() {
  return {
    kind: $('source-kind').value,
    name: $('source-name').value,
    teams: $('source-teams').value,
    repo: $('source-gh-repo').value.trim(),
    label: $('source-label').value,
    states: [...document.querySelectorAll('#source-states input[data-state]:checked')].map((c) => c.dataset.state),
    assigned_to_me: $('source-assigned').checked,
    interval: $('source-interval').value,
    api_url: $('source-api-url').value.trim(),
    maps_to: $('source-repo').value,
    key: $('source-key').value || null,
  };
}

// "Edit": a listed source back in the form (never its key).
function fillSource(f) {
  $('source-kind').value = f.kind || 'linear';
  $('source-name').value = f.name;
  $('source-teams').value = f.teams;
  $('source-gh-repo').value = f.repo || '';
  $('source-label').value = f.label;
  for (const c of document.querySelectorAll('#source-states input[data-state]')) c.checked = f.states.includes(c.dataset.state);
  $('source-assigned').checked = !!f.assigned_to_me;
  $('source-interval').value = f.interval;
  $('source-api-url').value = f.api_url;
  $('source-advanced').open = !!f.api_url;
  if ([...$('source-repo').options].some((o) => o.value === f.maps_to)) $('source-repo').value = f.maps_to;
  $('source-key').value = '';
  showSourceKind();
  $(f.kind === 'github' ? 'source-gh-repo' : 'source-teams').focus();
}

function sourceMsg(text, cls) {
  $('source-msg').textContent = text;
  $('source-msg').className = cls || '';
}

async function testSource() {
  sourceMsg('Testing…');
  $('source-test').disabled = true;
  try {
    sourceMsg(await invoke('test_source', { source: sourceForm() }), 'ok');
  } catch (e) {
    sourceMsg(errText(e), 'err');
  } finally {
    $('source-test').disabled = false;
  }
}

async function saveSource(ev) {
  ev.preventDefault();
  sourceMsg('Saving…');
  $('source-save').disabled = true;
  try {
    const form = sourceForm();
    const v = await invoke('save_source', { source: form });
    renderSources(v);
    $('source-key').value = '';
    // The saved source is the one whose form matches (its name may come from a default).
    const saved = v.sources.find((s) => s.form.kind === form.kind
      && (form.name.trim() ? s.name === form.name.trim() : (form.kind === 'github' ? s.form.repo === form.repo : true)));
    const where = saved && saved.runs_in ? ` ${saved.runs_in[0].toUpperCase()}${saved.runs_in.slice(1)}.` : '';
    sourceMsg(`Saved. The fleet polls it within its interval.${where}`, saved && saved.runs_in_warn ? 'warn' : 'ok');
  } catch (e) {
    sourceMsg(errText(e), 'err');
  } finally {
    $('source-save').disabled = false;
  }
}

async function removeSource(name) {
  try {
    renderSources(await invoke('remove_source', { name }));
    sourceMsg(`Removed ${name}.`, 'ok');
  } catch (e) {
    sourceMsg(errText(e), 'err');
  }
}

// "Import from gh": the GitHub CLI's token into the keychain; says which token is used now.
async function importGhToken() {
  sourceMsg('Importing…');
  $('source-gh-import').disabled = true;
  try {
    sourceMsg(await invoke('import_gh_token'), 'ok');
    await loadSources();
  } catch (e) {
    sourceMsg(errText(e), 'err');
  } finally {
    $('source-gh-import').disabled = false;
  }
}

// ---------------------------------------------------------------- repos and new jobs

async function renderRepos() {
  let repos = [];
  try { repos = await invoke('list_repos'); } catch (e) { repoMsg(errText(e), 'err'); }
  $('repos').replaceChildren(...repos.map(repoRow));
  $('repos-empty').hidden = repos.length > 0;
  return repos;
}

// One repo row: its switches act at once, its health says what keeps a finished job from
// a pull request, Check tries a push, Remove forgets it (never the clone).
function repoRow(r) {
  const push = el('input', { type: 'checkbox', class: 'push', title: 'Push the job\'s branch when it completes' });
  push.checked = r.push;
  const pr = el('select', { class: 'pr', title: 'The pull request a finished tracker job opens' },
    el('option', { value: 'draft' }, 'Draft'), el('option', { value: 'ready' }, 'Ready for review'),
    el('option', { value: 'off' }, 'None'));
  pr.value = r.pull_request;
  pr.disabled = !r.push;
  const change = () => setRepo(r.name, { push: push.checked, pull_request: pr.value });
  push.addEventListener('change', change);
  pr.addEventListener('change', change);
  const remote = r.github ? `GitHub ${r.github}` : (r.remote_url || '');
  return el('tr', { dataset: { repo: r.name } },
    el('td', {}, r.name),
    el('td', {}, el('div', {}, r.path), el('div', { class: 'muted small' }, remote)),
    el('td', {}, el('label', { class: 'switch' }, push, r.push ? ' On' : ' Off')),
    el('td', {}, pr),
    el('td', { class: 'health ' + (r.problems.length ? 'bad' : 'ok') }, r.line),
    el('td', { class: 'row-actions' },
      el('button', { type: 'button', class: 'check', onclick: () => checkRepo(r.name) }, 'Check'),
      el('button', { type: 'button', class: 'remove', onclick: () => removeRepo(r.name) }, 'Remove')));
}

function repoMsg(text, cls) {
  $('repo-msg').textContent = text;
  $('repo-msg').className = cls || '';
}

async function setRepo(name, switches) {
  try {
    await invoke('set_repo', { name, switches });
    repoMsg(`Saved ${name}.`, 'ok');
  } catch (e) {
    repoMsg(errText(e), 'err');
  }
  await renderRepos();
}

async function checkRepo(name) {
  repoMsg(`Checking ${name}…`);
  try {
    repoMsg(await invoke('check_repo', { name }), 'ok');
  } catch (e) {
    repoMsg(errText(e), 'err');
  }
}

async function removeRepo(name) {
  try {
    await invoke('remove_repo', { name });
    repoMsg(`Removed ${name} from this machine's settings (its clone is untouched).`, 'ok');
  } catch (e) {
    repoMsg(errText(e), 'err');
  }
  await renderRepos();
}

async function addRepo() {
  try {
    await invoke('add_repo', { name: $('repo-name').value, path: $('repo-path').value });
    repoMsg(`Added ${$('repo-name').value.trim()}: a finished job pushes its branch and opens a draft pull request.`, 'ok');
    $('repo-name').value = '';
    $('repo-path').value = '';
    await renderRepos();
  } catch (e) {
    repoMsg(errText(e), 'err');
  }
}

async function loadNewJob() {
  const sel = $('nj-repo');
  const keep = sel.value;
  const repos = await renderRepos();
  sel.replaceChildren(el('option', { value: '' }, '(none: runs anywhere, no worktree)'),
    ...repos.map((r) => el('option', { value: r.name }, `${r.name} (${r.path})`)));
  sel.value = repos.some((r) => r.name === keep) ? keep : '';
  const agent = status && status.agent;
  $('nj-hint').textContent = repos.length
    ? 'A job with a repo runs in a git worktree of it, on a machine that has the repo; a hand-off carries its work in progress.'
    : 'Add this machine\'s repos in Settings to run jobs in git worktrees.';
  $('demo-btn').hidden = agent !== 'demo';
}

async function submitNewJob(ev) {
  ev.preventDefault();
  const msg = $('nj-msg');
  const job = {
    title: $('nj-title').value,
    prompt: $('nj-prompt').value,
    repo: $('nj-repo').value || null,
    labels: $('nj-labels').value,
    priority: parseInt($('nj-priority').value, 10) || 0,
    key: $('nj-key').value.trim() || null,
  };
  try {
    const r = await invoke('enqueue_job', { job });
    if (r.existing) notice(`Job #${r.id} with key "${job.key}" is already ${r.existing}; nothing was added.`);
    msg.textContent = `Added job #${r.id}.`;
    msg.className = 'ok';
    $('nj-title').value = '';
    $('nj-prompt').value = '';
    openJob = r.id;
    location.hash = '#queue';
  } catch (e) {
    msg.textContent = errText(e);
    msg.className = 'err';
  }
}

// ---------------------------------------------------------------- navigation

function show(section) {
  let name = (section || 'fleet').replace(/^#/, '');
  // job-ID (a notification's "Open"): the queue, with that job's detail.
  const job = /^job-(\d+)$/.exec(name);
  if (job) { openJob = parseInt(job[1], 10); name = 'queue'; }
  for (const s of document.querySelectorAll('main > section')) s.hidden = s.id !== name;
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('on', a.dataset.tab === name);
  if (name === 'fleet') refreshFleet();
  if (name === 'queue') refreshJobs();
  if (name === 'settings') { loadSettings(); loadSources(); }
  if (name === 'new') loadNewJob();
  if (name === 'guide') showGuide();
  if (name === 'quit') {
    const n = status ? status.running.length : 0;
    $('quit-text').textContent = n
      ? `${n} job${n === 1 ? ' is' : 's are'} running on this machine: ${status.running.map((r) => '#' + r.job.id).join(', ')}.`
      : 'Nothing is running.';
  }
}

// The last hand-off's verdict, green ("Safe to close the lid") or red (which job's work
// stayed on this machine, and why), until claiming resumes.
function renderHandOff(v) {
  const box = $('handoff-notice');
  box.hidden = !v;
  if (!v) return;
  box.classList.toggle('safe', v.safe);
  box.classList.toggle('unsafe', !v.safe);
  $('handoff-title').textContent = v.title + (v.before_sleep ? ' (handed off before sleep)' : '') + '.';
  $('handoff-text').textContent = v.text;
  $('handoff-resume').hidden = !v.paused;
}

// No tray host: the header says so (and closing asks; see window.rs).
function renderTrayHost(present) {
  $('tray-notice').hidden = !!present;
  if (present && current() === 'close') location.hash = '#fleet';
}

function current() { return (location.hash || '#fleet').slice(1); }

async function quit(mode) {
  try { await invoke('quit', { mode }); } catch (e) { alert(errText(e)); }
}

window.addEventListener('hashchange', () => show(current()));

document.addEventListener('DOMContentLoaded', async () => {
  $('dispatch').addEventListener('change', async (e) => {
    try { renderStatus(await invoke('set_dispatch', { enabled: e.target.checked })); } catch (err) { alert(errText(err)); refreshStatus(); }
  });
  $('pause-btn').addEventListener('click', async () => {
    try { await invoke(status && status.paused ? 'resume' : 'pause', {}); } catch (e) { alert(errText(e)); }
  });
  $('handoff-btn').addEventListener('click', async () => {
    $('handoff-btn').disabled = true;
    try { renderHandOff(await invoke('hand_off', { pause: true })); } catch (e) { notice(`Hand off failed: ${errText(e)}`); }
    finally { $('handoff-btn').disabled = false; }
  });
  $('handoff-resume').addEventListener('click', async () => {
    try { await invoke('resume', {}); renderHandOff(null); } catch (e) { notice(errText(e)); }
  });
  $('new-btn').addEventListener('click', () => { location.hash = '#new'; });
  $('new-form').addEventListener('submit', submitNewJob);
  $('repo-add').addEventListener('click', addRepo);
  $('sources-form').addEventListener('submit', saveSource);
  $('source-test').addEventListener('click', testSource);
  $('source-kind').addEventListener('change', showSourceKind);
  $('source-gh-import').addEventListener('click', importGhToken);
  $('demo-btn').addEventListener('click', async () => {
    try {
      const key = $('nj-key').value.trim();
      const r = await invoke('enqueue_demo', { key: key || null });
      if (r.existing) notice(`Job #${r.id} with key "${key}" is already ${r.existing}; nothing was added.`);
      openJob = r.id; location.hash = '#queue'; refreshJobs();
    } catch (e) { alert(errText(e)); }
  });
  for (const b of document.querySelectorAll('#filters button')) {
    b.addEventListener('click', () => {
      filter = b.dataset.filter;
      for (const o of document.querySelectorAll('#filters button')) o.classList.toggle('on', o === b);
      refreshJobs();
    });
  }
  $('detail-close').addEventListener('click', () => { openJob = null; $('detail').hidden = true; });
  $('db-mode').addEventListener('change', dbModeChanged);
  $('settings-form').addEventListener('submit', saveSettings);
  $('forget-pw').addEventListener('click', async () => {
    try { await invoke('forget_password'); await loadSettings(); } catch (e) { alert(errText(e)); }
  });
  $('config-notice-settings').addEventListener('click', () => { location.hash = '#settings'; });
  $('config-notice-dismiss').addEventListener('click', async () => {
    try { await invoke('dismiss_set_aside'); } catch (e) { console.error(e); }
    renderSetAside(null);
  });
  $('quit-handoff').addEventListener('click', () => quit('hand_off'));
  $('close-quit').addEventListener('click', () => quit('hand_off'));
  $('close-background').addEventListener('click', () => invoke('close_window').catch((e) => alert(errText(e))));
  // Cancel goes back to what the window showed before the question (the guide, a form...).
  $('close-cancel').addEventListener('click', () => { location.hash = '#' + (beforeClose || 'fleet'); });
  $('quit-drain').addEventListener('click', () => quit('drain'));
  $('quit-cancel').addEventListener('click', () => { location.hash = '#fleet'; });

  await T.event.listen('status', (e) => {
    renderStatus(e.payload);
    if (current() === 'settings' && JSON.stringify(e.payload.sources || []) !== sourcesHealth) loadSources();
  });
  await T.event.listen('config-set-aside', (e) => renderSetAside(e.payload));
  await T.event.listen('hand-off', (e) => renderHandOff(e.payload));
  await T.event.listen('tray-host', (e) => renderTrayHost(e.payload));
  await T.event.listen('navigate', (e) => {
    if (e.payload === 'close' && current() !== 'close') beforeClose = current();
    if (current() === e.payload) show(e.payload); else location.hash = '#' + e.payload;
  });
  let pending = null;
  await T.event.listen('engine-event', (e) => {
    const t = e.payload && e.payload.type;
    if (t === 'state_changed' || t === 'lost_race') return;
    // Coalesce bursts: one refresh per 300 ms.
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      const s = current();
      if (s === 'queue') refreshJobs();
      if (s === 'fleet') refreshFleet();
    }, 300);
  });
  await refreshStatus();
  try { renderSetAside(await invoke('set_aside_config')); } catch (e) { console.error(e); }
  try { renderHandOff(await invoke('last_hand_off')); } catch (e) { console.error(e); }
  try { renderTrayHost(await invoke('tray_host')); } catch (e) { console.error(e); }
  show(current());
});
