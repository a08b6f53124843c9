// DevPilot window. Talks to Rust only through Tauri commands (invoke) and events (listen).
// No timers tick while nothing changes: lists refresh on engine events.
'use strict';

const T = window.__TAURI__;
const invoke = (cmd, args) => T.core.invoke(cmd, args || {});
const $ = (id) => document.getElementById(id);

let status = null;
let filter = 'all';
let openJob = null;
// A notification's "View log" opened the job: its page is shown scrolled to the transcript.
let scrollToLog = false;
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
  problemsFrom.status = statusProblems(st);
  renderProblems();
  status = st;
  const pill = $('state');
  pill.dataset.state = st.state;
  let text = WORDS[st.state] || st.state;
  if (st.state === 'working') text += ` (${st.running.length})`;
  if (st.state === 'paused' && st.paused_until_unix_ms != null) text += ` until ${clock(st.paused_until_unix_ms)}`;
  if (st.agent === 'demo') text += ' · demo agent';
  pill.textContent = text;
  pill.title = `${st.orchestrator_id} on ${st.machine} · ${st.backend} ${st.database}`;
  renderClaiming(st);
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

// An edit of the settings file (by hand, or by the CLI): applied, and Settings shows it; or
// not, and why, until the next edit.
function renderConfigNote(note) {
  const n = $('config-reload');
  if (!note) { n.hidden = true; return; }
  n.textContent = note.text;
  n.className = note.ok ? 'banner notice' : 'banner warn-banner';
  n.hidden = false;
  if (note.ok) {
    setTimeout(() => { if (n.textContent === note.text) n.hidden = true; }, 10000);
    if (!$('settings').hidden) { loadSettings(); loadSources(); }
  }
  refreshStatus();
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
  refreshLimits();
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
      const me = status && m.machine === status.machine;
      const ask = (holds[m.machine] || []).length && !stale
        ? el('button', { type: 'button', class: 'ask-handoff', title: 'It releases its jobs at its next renewal, pushing their work, so another machine takes them',
          onclick: async () => {
            try {
              if (me) renderHandOff(await invoke('hand_off', { pause: false }));
              else notice(await invoke('ask_hand_off', { machine: m.machine }));
            } catch (e) { notice(errText(e)); }
            refreshFleet();
          } }, me ? 'Hand off' : 'Ask to hand off')
        : '';
      body.append(el('tr', { dataset: { machine: m.machine } },
        el('td', {}, m.machine, me ? el('span', { class: 'muted small' }, ' (this machine)') : ''),
        el('td', { class: 'state' }, word + (m.dispatch_enabled ? '' : ' (dispatch off)'),
          m.problem ? el('div', { class: 'warn small' }, 'not claiming: ' + m.problem) : ''),
        el('td', {}, ago(seen) + ' ago'),
        el('td', {}, `${m.running}/${m.concurrency}`),
        el('td', {}, held || '—'),
        el('td', {}, (m.repos || []).join(', ') || el('span', { class: 'muted' }, 'none')),
        el('td', {}, (m.labels || []).join(', ') || el('span', { class: 'muted' }, 'none')),
        el('td', {}, ask)));
    }
    $('fleet-empty').hidden = f.machines.length > 0;
  } catch (e) {
    body.replaceChildren(el('tr', {}, el('td', { colSpan: 8 }, errText(e))));
  }
}

// ---------------------------------------------------------------- queue

// Where a job came from, for the Source filter: the tracker part of its key
// ("github:acme/webapp", "linear"), else "added here".
function sourceOf(j) {
  const k = j.unique_key || '';
  if (k.startsWith('github:')) return k.split('#')[0];
  if (k.startsWith('linear:')) return 'linear';
  return 'added here';
}

// The machine that ran (or runs) a job, as far as its row says.
function machineOf(j) { return j.claimed_by || ''; }

// Fills a filter's options from the rows, keeping what was chosen.
function fillFilter(id, values, any) {
  const sel = $(id);
  const keep = sel.value;
  const sorted = [...new Set(values.filter(Boolean))].sort();
  sel.replaceChildren(el('option', { value: '' }, any), ...sorted.map((v) => el('option', { value: v }, v)));
  sel.value = sorted.includes(keep) ? keep : '';
}

let lastJobs = null;

async function refreshJobs() {
  const body = $('jobs');
  try {
    const r = await invoke('list_jobs', { jobState: filter, limit: 200 });
    lastJobs = r;
    const c = r.counts;
    $('counts').textContent = `queued ${c.queued} · running ${c.running} · failed ${c.failed} · completed ${c.completed} · dead ${c.dead} · cancelled ${c.cancelled}`;
    fillFilter('q-machine', r.jobs.map(machineOf), 'Any machine');
    fillFilter('q-repo', r.jobs.map((j) => j.repo), 'Any repo');
    fillFilter('q-source', r.jobs.map(sourceOf), 'Any source');
    renderJobRows();
    if (openJob != null) {
      const toLog = scrollToLog;
      scrollToLog = false;
      showJob(openJob).then(() => { if (toLog) $('detail-log-title').scrollIntoView(); });
    }
  } catch (e) {
    body.replaceChildren(el('tr', {}, el('td', { colSpan: 10 }, errText(e))));
  }
}

// The listed jobs through the filters and the search.
function renderJobRows() {
  const r = lastJobs;
  if (!r) return;
  const q = $('q-search').value.trim().toLowerCase();
  const [m, repo, src] = [$('q-machine').value, $('q-repo').value, $('q-source').value];
  const shown = r.jobs.filter((j) => (!m || machineOf(j) === m) && (!repo || j.repo === repo) && (!src || sourceOf(j) === src)
    && (!q || `#${j.id} ${j.title || ''} ${j.issue || ''}`.toLowerCase().includes(q)));
  $('jobs').replaceChildren(...shown.map((j) => jobRow(j, r.unroutable[j.id])));
  const total = Object.values(r.counts).reduce((a, b) => a + (typeof b === 'number' ? b : 0), 0);
  $('jobs-empty').hidden = shown.length > 0;
  $('jobs-empty-text').textContent = total === 0
    ? 'No jobs yet. Add one by hand, or connect GitHub or Linear and label an issue.'
    : 'No job matches these filters.';
}

function jobRow(j, unroutable) {
  const actions = el('td', {});
  if (j.state === 'dead' || j.state === 'failed') {
    actions.append(el('button', { type: 'button', class: 'requeue', onclick: (ev) => { ev.stopPropagation(); act('requeue', j.id); } }, 'Retry'));
  }
  // Running jobs too, wherever they run: the holder stops the agent at its next renewal.
  if ((j.state === 'queued' || j.state === 'failed' || j.state === 'running') && !j.cancel_requested_by) {
    actions.append(el('button', { type: 'button', class: 'cancel', onclick: (ev) => { ev.stopPropagation(); act('cancel', j.id); } }, 'Cancel'));
  }
  const pr = j.url && j.url.includes('/pull/') && webLink(j.url);
  return el('tr', { class: 'clickable', dataset: { id: j.id, state: j.state }, onclick: () => showJob(j.id) },
    el('td', {}, j.id),
    el('td', {}, j.title || ''),
    el('td', {}, j.repo || ''),
    el('td', {}, issueLink(j)),
    el('td', { class: `state state-${j.state}` }, stateText(j),
      unroutable ? el('div', { class: 'warn', title: 'Only a machine that has the repo and every label takes it' }, unroutable) : ''),
    el('td', {}, machineOf(j)),
    el('td', {}, jobSpan(j)),
    el('td', {}, j.agent && j.agent.cost_usd != null ? usd(j.agent.cost_usd) : ''),
    el('td', {}, pr ? el('a', { class: 'pr', href: pr, onclick: (ev) => { ev.preventDefault(); ev.stopPropagation(); invoke('open_link', { url: pr }).catch((e) => notice(errText(e))); } }, '#' + pr.split('/pull/')[1]) : ''),
    actions);
}

// How long a job ran: its last attempt's start (kept after it ends) to its end, or to now.
function jobSpan(j) {
  const start = j.claimed_at || j.started_at;
  if (!start || j.state === 'queued') return '';
  const end = j.state === 'running' ? j.now : (j.finished_at || j.completed_at);
  return end ? span(end - start) : '';
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
    if (!ok) notice(`Job #${id} could not be ${cmd === 'cancel' ? 'cancelled' : 'retried'}: its state changed.`);
    else if (ok.outcome === 'requested') notice(`Asked ${ok.holder || 'its machine'} to stop job #${id}; it ends cancelled at that machine's next renewal.`);
    else notice(cmd === 'cancel' ? `Cancelled job #${id}.` : `Job #${id} is queued again.`);
  } catch (e) { notice(errText(e)); }
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

// "12 min", "1 h 5 min", "40 s".
function span(ms) {
  if (ms == null || ms < 0) return '';
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

// A date and time on the local clock: "Dec 5, 14:02".
function when(ms) {
  if (ms == null) return '';
  return new Date(ms).toLocaleString('en-US', { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', hour12: false });
}

// What the job's state means, in words, for the top of its page.
function verdictOf(d) {
  const j = d.job;
  const by = (kind) => [...d.history].reverse().find((h) => h.kind === kind);
  switch (j.state) {
    case 'completed': {
      const done = by('completed');
      const on = done && done.machine ? ` on ${done.machine}` : '';
      return { cls: 'ok', text: `Completed${on}` + (j.commits === 0 ? ': no changes (the agent changed no file, so no branch and no pull request)' : '.') };
    }
    case 'running':
      return { cls: 'run', text: `Running on ${j.claimed_by || '?'} for ${span(j.now - (j.claimed_at || j.now))}` + (j.cancel_requested_by ? ', cancelling.' : '.') };
    case 'failed':
      if (cappedVerdict(d)) return cappedVerdict(d);
      return { cls: 'bad', text: `Failed (attempt ${j.attempts} of ${j.max_attempts})` + (j.run_at > j.now ? `; it is tried again in ${ago(j.run_at - j.now)}.` : '; it is tried again.') };
    case 'dead':
      return { cls: 'bad', text: `Dead after ${j.attempts} attempt${j.attempts === 1 ? '' : 's'}: nothing will try it again until it is retried.` };
    case 'cancelled': {
      const c = by('cancelled');
      return { cls: 'muted', text: `Cancelled${c && c.machine ? ' by ' + c.machine : ''}.` };
    }
    default:
      if (cappedVerdict(d)) return cappedVerdict(d);
      if (d.unroutable) return { cls: 'warn', text: `Waiting: ${d.unroutable}.` };
      if (j.run_at > j.now) return { cls: 'muted', text: `Queued; it starts in ${ago(j.run_at - j.now)}.` };
      return { cls: 'muted', text: 'Queued: the next free machine takes it.' };
  }
}

// A button that opens an http(s) link in the user's browser (never in the window).
function linkButton(label, url, cls) {
  const u = webLink(url);
  if (!u) return null;
  return el('button', { type: 'button', class: cls, title: u, onclick: () => invoke('open_link', { url: u }).catch((e) => notice(errText(e))) }, label);
}

// One line per report to the tracker: what it is, and done, waiting or failed (with why).
const DELIVERY = {
  claimed: 'Said it started', completed: 'Posted the result', failed: 'Posted the failure', dead: 'Posted that it gave up',
  cancelled: 'Posted the cancel', parked: 'Said it is parked', pull_request: 'Pull request', updated: 'Said it was updated',
  edited_after_approval: 'Said the issue changed after approval',
  follow_up_answers: 'Answered the review on the pull request', handed_back: 'Handed the pull request back',
};

// The review loop: the PR and whether it is still read, each follow-up (what fed it, who
// answered, the reply to each piece), what waits, and what no agent was fed.
function feedbackTitle(f) {
  if (f.kind === 'review_comment' && f.path) return `${f.author}'s comment on ${f.path}${f.line != null ? ':' + f.line : ''}`;
  if (f.kind === 'review') return `${f.author}'s review (changes requested)`;
  if (f.kind === 'check_run') return `check ${f.author} failed`;
  if (f.kind === 'status') return `status ${f.author} failed`;
  if (f.kind === 'linear_comment') return `${f.author}'s comment on the Linear issue`;
  return `${f.author}'s comment`;
}
const LOOP_STATE = { open: 'watching for review', merged: 'merged: the loop ended', closed: 'closed: the loop ended',
  unlabelled: 'the issue left the source: the loop ended', handed_back: 'handed back to the reviewer at the cap' };
// A reply's text as GitHub shows it: `code` spans as code, the rest as text.
function codeSpans(text) {
  return text.split('`').map((part, i) => (i % 2 ? el('code', {}, part) : part));
}
function renderReviewLoop(r) {
  const box = $('detail-review');
  box.hidden = !r;
  if (!r) return;
  $('detail-review-state').textContent = LOOP_STATE[r.state] || r.state;
  const items = [];
  for (const f of r.follow_ups) {
    const who = f.answered_by ? `answered by ${f.answered_by} ${when(f.answered_at)}` : 'running';
    const answers = f.answers ? ` · replies ${f.answers}` : '';
    const fed = el('ul', { class: 'fed' }, ...f.fed.map((p) => el('li', {}, el('b', {}, feedbackTitle(p)),
      p.body ? el('q', {}, p.body.length > 140 ? p.body.slice(0, 140) + '…' : p.body) : '',
      p.reply ? el('div', { class: 'reply' }, '↳ ', ...codeSpans(p.reply)) : '')));
    items.push(el('li', { class: f.answered_by ? 'ok' : 'warn' }, el('b', {}, `Follow-up ${f.n}`), ` · ${who}${answers}`, fed));
  }
  if (r.waiting.length) items.push(el('li', { class: 'warn' }, el('b', {}, 'Waiting'), ` · ${r.waiting.map(feedbackTitle).join('; ')}`));
  if (r.ignored.length) {
    items.push(el('li', {}, el('b', {}, 'Not fed to an agent'),
      ` · ${r.ignored.length} comment${r.ignored.length === 1 ? '' : 's'} from ${[...new Set(r.ignored.map((p) => p.author))].join(', ')}`));
  }
  $('detail-follow-ups').replaceChildren(...items);
}
function deliveryLine(r, j) {
  const what = DELIVERY[r.event] || r.event;
  let state; let cls;
  if (r.outcome === 'delivered') {
    cls = 'ok';
    state = r.event === 'pull_request' ? (webLink(j.url) && j.url.includes('/pull/') ? `opened ${j.url}` : (j.commits === 0 ? 'none: no changes' : 'none')) : 'done';
  } else if (r.outcome) {
    cls = 'bad';
    state = `failed: ${r.last_error || r.outcome}`;
  } else {
    cls = 'warn';
    state = r.tries ? `waiting (tried ${r.tries}×${r.last_error ? ': ' + r.last_error : ''})` : 'waiting';
  }
  return el('li', { class: cls, dataset: { event: r.event } }, el('b', {}, what), ' · ', state);
}

async function showJob(id) {
  openJob = id;
  try {
    const d = await invoke('job_detail', { id });
    const j = d.job;
    // A tracker's title starts with its own number ("#3 Rate-limit…"): the job's is said apart.
    $('detail-title').textContent = j.title ? `${j.title} · job ${j.id}` : `Job #${j.id}`;
    const v = verdictOf(d);
    $('detail-verdict').className = 'verdict ' + v.cls;
    $('detail-verdict').replaceChildren(el('div', { class: 'verdict-text' }, v.text),
      j.last_error && j.state !== 'completed' ? el('pre', { class: 'error' }, j.last_error) : '');
    const links = [linkButton(j.url && j.url.includes('/pull/') ? 'Open pull request' : 'Open result', j.url, 'pr primary'),
      j.issue ? linkButton(`Open ${j.issue}`, j.issue_url, 'issue-btn') : null].filter(Boolean);
    $('detail-links').replaceChildren(...links);
    $('detail-links').hidden = !links.length;
    const facts = [];
    const fact = (k, val) => { if (val) facts.push(el('dt', {}, k), el('dd', {}, val)); };
    fact('Repo', j.repo);
    fact('Branch', d.branch ? d.branch + (j.commits != null ? ` (${j.commits} commit${j.commits === 1 ? '' : 's'})` : '') : null);
    fact('Machine', j.claimed_by || ([...d.history].reverse().find((h) => h.machine && h.kind !== 'requeued') || {}).machine);
    // A finished job's row no longer holds its claim: its last claim is in the history.
    const claimed = [...d.history].reverse().find((h) => h.kind === 'claimed');
    const started = j.claimed_at || j.started_at || (claimed && claimed.at);
    fact('Started', when(started));
    const end = j.finished_at || j.completed_at;
    fact('Ended', j.state === 'running' ? null : when(end));
    fact('Duration', started ? span((j.state === 'running' ? j.now : (end || j.now)) - started) : null);
    fact('Attempts', `${j.attempts} of ${j.max_attempts}`);
    fact('Added', when(j.created_at));
    if (j.resume_branch) fact('Resumes', `${j.resume_branch} from ${j.resumed_from || '?'}`);
    if (j.worktree) fact('Worktree kept', j.worktree);
    $('detail-facts').replaceChildren(...facts);
    const run = agentRun(j.agent);
    $('detail-agent').replaceChildren(...run.flatMap((p, i) => (i ? [' · ', p] : [p])));
    $('detail-agent').hidden = !run.length;
    const res = $('detail-result');
    res.replaceChildren();
    if (j.summary) res.append(el('span', {}, j.summary));
    res.hidden = !j.summary;
    $('detail-actions').replaceChildren(...jobActions(d));
    $('detail-deliveries').replaceChildren(...d.deliveries.map((r) => deliveryLine(r, j)));
    $('detail-tracker').hidden = !d.deliveries.length;
    renderReviewLoop(d.review_loop);
    renderSpend(d);
    const h = $('detail-history');
    h.replaceChildren();
    for (const ev of d.history) {
      h.append(el('li', {}, `${when(ev.at)} ${ev.kind}${ev.machine ? ' by ' + ev.machine : ''}${ev.detail ? ': ' + ev.detail : ''}`));
    }
    $('detail-payload').textContent = JSON.stringify(d.payload, null, 2);
    $('detail-meta').textContent = `job #${j.id} · priority ${j.priority}${j.unique_key ? ' · key ' + j.unique_key : ''}${j.requires && j.requires.length ? ' · needs ' + j.requires.join(', ') : ''}`;
    renderLog(d);
    $('detail').hidden = false;
  } catch (e) {
    $('detail-title').textContent = errText(e);
    $('detail').hidden = false;
  }
}

// The agent's log: the transcript a preset streams, or the plain lines a command prints.
// A running job's log is followed (here or on another machine) while Follow is on.
function renderLog(d) {
  const j = d.job;
  const live = d.log_from && d.log_from !== 'local';
  $('detail-log-title').textContent = live
    ? `Agent log (last 16 KiB from ${d.log_from}${j.state === 'running' ? ', live' : ''})`
    : `Agent log (this machine${j.state === 'running' ? ', live' : ''})`;
  const pre = $('detail-log');
  const tr = transcriptOf(d.log_tail || '');
  const box = tr ? $('detail-transcript') : pre;
  $('detail-transcript').hidden = !tr;
  pre.hidden = !!tr;
  box.classList.toggle('live', j.state === 'running');
  const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
  // What the user opened stays open across a refresh.
  const open = new Set([...box.querySelectorAll('details[open]')].map((x) => x.dataset.key));
  if (tr) {
    box.replaceChildren(...tr.lines);
    for (const x of box.querySelectorAll('details')) x.open = open.has(x.dataset.key);
    $('detail-log-title').append(tr.cost ? ` · ${tr.cost}` : '');
  } else {
    pre.textContent = d.log_tail || '(no log yet)';
  }
  if ($('detail-follow').checked && atEnd) box.scrollTop = box.scrollHeight;
  $('detail-full-log').hidden = !d.log_path;
  $('detail-full-log').onclick = () => invoke('open_job_log', { id: j.id }).catch((e) => notice(errText(e)));
  clearTimeout(logTimer);
  if (j.state === 'running' && openJob === j.id && $('detail-follow').checked) {
    logTimer = setTimeout(() => { if (openJob === j.id) showJob(j.id); }, 2000);
  }
}

// The log as a transcript, when the agent streams JSON events (claude's stream-json,
// codex's --json): its messages as lines, each tool call, command and file edit as a line
// that expands to its input and output, and the cost so far. `null`: plain output.
function transcriptOf(text) {
  const lines = [];
  let events = 0;
  let cost = null;
  let tokens = 0;
  const say = (cls, head, body, key) => {
    if (body == null || body === '') { lines.push(el('div', { class: 't-line ' + cls }, head)); return; }
    const d = el('details', { class: 't-line ' + cls, dataset: { key: key || String(lines.length) } },
      el('summary', {}, head), el('pre', {}, typeof body === 'string' ? body : JSON.stringify(body, null, 2)));
    lines.push(d);
  };
  const short = (x, n) => { const t = String(x == null ? '' : x).replace(/\s+/g, ' ').trim(); return t.length > n ? t.slice(0, n) + '…' : t; };
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line) continue;
    let ev = null;
    if (line.startsWith('{')) { try { ev = JSON.parse(line); } catch (e) { ev = null; } }
    if (!ev || typeof ev.type !== 'string') { lines.push(el('div', { class: 't-line plain' }, raw)); continue; }
    events++;
    switch (ev.type) {
      case 'system':
        if (ev.subtype === 'init') say('sys', `Started ${ev.model ? 'with ' + ev.model : ''}${ev.session_id ? ' · session ' + short(ev.session_id, 8) : ''}`);
        else if (ev.subtype === 'api_retry') say('warn', 'Retrying the model call…', ev);
        break;
      case 'assistant':
        for (const c of (ev.message && ev.message.content) || []) {
          if (c.type === 'text' && c.text) say('msg', c.text);
          else if (c.type === 'tool_use') {
            const i = c.input || {};
            const target = i.file_path || i.path || i.command || i.pattern || i.url || '';
            say('tool', `▸ ${c.name}${target ? ' ' + short(target, 90) : ''}`, i, c.id);
          }
        }
        if (ev.message && ev.message.usage) tokens += (ev.message.usage.output_tokens || 0);
        break;
      case 'user':
        for (const c of (ev.message && ev.message.content) || []) {
          if (c.type !== 'tool_result') continue;
          const out = Array.isArray(c.content) ? c.content.map((x) => x.text || '').join('\n') : c.content;
          say(c.is_error ? 'bad' : 'result', `  ↳ ${c.is_error ? 'failed' : 'result'}: ${short(out, 80)}`, out, c.tool_use_id && c.tool_use_id + ':r');
        }
        break;
      // gemini's stream-json: init, message (its words as deltas), tool_use, tool_result, result.
      case 'init':
        say('sys', `Started ${ev.model ? 'with ' + ev.model : ''}${ev.session_id ? ' · session ' + short(ev.session_id, 8) : ''}`);
        break;
      case 'message': {
        if (ev.role !== 'assistant' || !ev.content) break;
        const last = lines[lines.length - 1];
        if (ev.delta && last && last.dataset && last.dataset.gemini === '1') last.textContent += ev.content;
        else { say('msg', ev.content); lines[lines.length - 1].dataset.gemini = '1'; }
        break;
      }
      case 'tool_use': {
        const i = ev.parameters || {};
        const target = i.file_path || i.path || i.command || i.pattern || i.dir_path || '';
        say('tool', `▸ ${ev.tool_name}${target ? ' ' + short(target, 90) : ''}`, i, ev.tool_id);
        break;
      }
      case 'tool_result': {
        const bad = ev.status === 'error';
        const out = bad && ev.error ? ev.error.message : ev.output;
        say(bad ? 'bad' : 'result', `  ↳ ${bad ? 'failed' : 'result'}: ${short(out, 80)}`, out, ev.tool_id && ev.tool_id + ':r');
        break;
      }
      case 'result':
        if (ev.status) {
          if (ev.stats && ev.stats.output_tokens) tokens += ev.stats.output_tokens;
          const bad = ev.status === 'error';
          say(bad ? 'bad' : 'done', bad ? `✗ ${(ev.error && ev.error.message) || 'Ended with an error'}` : '✓ Done', ev.stats);
          break;
        }
        if (ev.total_cost_usd != null) cost = usd(ev.total_cost_usd);
        say(ev.is_error ? 'bad' : 'done', `${ev.is_error ? '✗ Ended with an error' : '✓ Done'}${cost ? ' · ' + cost : ''}${ev.num_turns ? ' · ' + ev.num_turns + ' turns' : ''}`, ev.result);
        break;
      case 'item.completed':
      case 'item.started': {
        const it = ev.item || {};
        if (ev.type === 'item.started' && it.type !== 'command_execution') break;
        if (it.type === 'agent_message') say('msg', it.text || '');
        else if (it.type === 'reasoning') say('sys', `thinking: ${short(it.text, 100)}`, it.text);
        else if (it.type === 'command_execution') {
          if (ev.type === 'item.started') say('tool', `▸ ${short(it.command, 100)}`, null);
          else say(it.exit_code ? 'bad' : 'result', `  ↳ exit ${it.exit_code == null ? '?' : it.exit_code}: ${short(it.aggregated_output, 80)}`, it.aggregated_output, it.id);
        } else if (it.type === 'file_change') say('tool', `▸ edited ${(it.changes || []).map((c) => c.path).join(', ')}`, it.changes, it.id);
        else if (it.type === 'error') say('bad', it.message || 'error', it);
        break;
      }
      case 'turn.completed':
        if (ev.usage) tokens += ev.usage.output_tokens || 0;
        break;
      case 'turn.failed':
      case 'error':
        say(ev.severity === 'warning' ? 'warn' : 'bad', `${ev.severity === 'warning' ? '⚠' : '✗'} ${(ev.error && ev.error.message) || ev.message || 'error'}`, ev);
        break;
      default:
        break;
    }
  }
  if (!events) return null;
  if (!cost && tokens) cost = `${count(tokens)} tokens out so far`;
  return { lines, cost };
}

// What can be done with the job from here: Cancel, Retry, Hand off, Open worktree.
function jobActions(d) {
  const j = d.job;
  const out = [];
  const btn = (label, cls, f, title) => out.push(el('button', { type: 'button', class: cls, title: title || '', onclick: f }, label));
  const letGo = letGoButton(d);
  if (letGo) out.push(letGo);
  if (['queued', 'failed', 'running'].includes(j.state) && !j.cancel_requested_by) btn('Cancel', 'cancel', () => act('cancel', j.id));
  if (['dead', 'failed', 'cancelled'].includes(j.state)) btn('Retry', 'retry', () => act('requeue', j.id), 'Queue it again now, with its attempts reset');
  if (j.state === 'running' && j.claimed_by) {
    const here = status && j.claimed_by === status.machine;
    btn(here ? 'Hand off' : `Ask ${j.claimed_by} to hand off`, 'handoff',
      async () => {
        try {
          if (here) renderHandOff(await invoke('hand_off', { pause: false }));
          else notice(await invoke('ask_hand_off', { machine: j.claimed_by }));
        } catch (e) { notice(errText(e)); }
        showJob(j.id);
      }, here ? 'Release this machine\'s jobs now, pushing their work, so another machine takes them' : 'That machine releases its jobs at its next renewal');
  }
  if (d.worktree_here) btn('Open worktree', 'worktree', () => invoke('open_worktree', { id: j.id }).catch((e) => notice(errText(e))));
  return out;
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
  checkAgent();
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

// The agent's health line under its field: found, its version, logged in; or what is wrong.
// Asked again as the field changes (a moment after the last key).
let agentTimer = null;
async function checkAgent() {
  const line = $('s-agent').value.trim();
  const out = $('agent-health');
  try {
    const h = await invoke('agent_health', { line: line || null });
    if ($('s-agent').value.trim() !== line) return;
    out.textContent = h.line;
    out.className = 'health ' + (h.ok ? 'ok' : 'bad');
    problemsFrom.agent = h.ok ? [] : [{ text: `Agent: ${h.line}`, fix: 'fs-machine' }];
  } catch (e) {
    out.textContent = errText(e);
    out.className = 'health bad';
  }
  renderProblems();
}

// ---------------------------------------------------------------- problems

// What is wrong on this machine, from each part of Settings: "Problems (N)" at the top,
// each row with a Fix that goes to where it is set.
const problemsFrom = { status: [], repos: [], sources: [], agent: [] };

function statusProblems(st) {
  const out = [];
  if (!st) return out;
  if (!st.db_online && st.state !== 'starting') out.push({ text: `The database cannot be reached${st.message ? ': ' + st.message : ''}.`, fix: 'fs-database' });
  else if (st.state === 'needs_agent') out.push({ text: 'No agent is set: this machine claims nothing. Name one (claude, codex, aider, gemini, or a command).', fix: 'fs-machine' });
  else if (st.state === 'error' && st.message) out.push({ text: st.message, fix: 'fs-machine' });
  for (const w of st.sandbox || []) out.push({ text: w.text, fix: 'fs-machine' });
  return out;
}

function renderProblems() {
  const all = [...problemsFrom.status, ...problemsFrom.agent, ...problemsFrom.repos, ...problemsFrom.sources];
  $('problems').hidden = !all.length;
  $('problems-title').textContent = `Problems (${all.length})`;
  $('problems-list').replaceChildren(...all.map((p) => el('li', {}, el('span', {}, p.text),
    el('button', { type: 'button', onclick: () => $(p.fix).scrollIntoView({ block: 'start' }) }, 'Fix'))));
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
  problemsFrom.sources = v.sources.flatMap((x) => [
    ...(x.ok ? [] : [{ text: x.line, fix: 'sources' }]),
    ...(x.runs_in_warn ? [{ text: `${x.name}: ${x.runs_in}`, fix: 'sources' }] : []),
  ]);
  renderProblems();
  sourcesHealth = JSON.stringify(status ? status.sources || [] : []);
  $('sources-list').replaceChildren(...v.sources.map((s) => el('li', { class: s.ok ? 'ok' : 'bad', dataset: { source: s.name } },
    el('span', { class: 'line' }, s.line),
    el('span', { class: 'runs-in ' + (s.runs_in_warn ? 'warn' : 'muted') }, s.runs_in ? `${s.name}: ${s.runs_in}` : ''),
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
  problemsFrom.repos = repos.filter((r) => r.problems.length).map((r) => ({ text: `Repo ${r.name}: ${r.line}`, fix: 'fs-repos' }));
  renderProblems();
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
  // job-ID (a notification's "Open"): the queue, with that job's detail; job-ID-log ("View
  // log"): scrolled to its transcript.
  const job = /^job-(\d+)(-log)?$/.exec(name);
  if (job) { openJob = parseInt(job[1], 10); scrollToLog = !!job[2]; name = 'queue'; }
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
  // The bold title says the verdict: the sentence need not end with it again.
  $('handoff-text').textContent = v.text.replace(/ Safe to close the lid\.$/, '');
  $('handoff-resume').hidden = !v.paused;
}

// No tray host: the header says so (and closing asks; see window.rs).
function renderTrayHost(present) {
  $('tray-notice').hidden = !!present;
  if (present && current() === 'close') location.hash = '#fleet';
}

function current() { return (location.hash || '#fleet').slice(1); }

async function quit(mode) {
  try { await invoke('quit', { mode }); } catch (e) { notice(errText(e)); }
}

window.addEventListener('hashchange', () => show(current()));

// The one claiming control: On, Paused (until a time, or until resumed), Off. A timed pause
// shows as "Paused until 14:30", an entry of its own that is never picked.
function renderClaiming(st) {
  const sel = $('claiming');
  const timed = sel.querySelector('option[value="paused"]');
  let value = 'on';
  if (!st.dispatch_enabled) value = 'off';
  else if (st.paused && st.paused_until_unix_ms != null) {
    timed.textContent = `Paused until ${clock(st.paused_until_unix_ms)}`;
    value = 'paused';
  } else if (st.paused) value = 'pause_indef';
  timed.hidden = value !== 'paused';
  sel.value = value;
  sel.dataset.state = value === 'on' ? 'on' : (value === 'off' ? 'off' : 'paused');
}

const claimingOf = {
  on: { mode: 'on' }, off: { mode: 'off' }, pause_indef: { mode: 'paused', minutes: null },
  pause_30: { mode: 'paused', minutes: 30 }, pause_60: { mode: 'paused', minutes: 60 },
};

document.addEventListener('DOMContentLoaded', async () => {
  $('s-agent').addEventListener('input', () => { clearTimeout(agentTimer); agentTimer = setTimeout(checkAgent, 400); });
  $('claiming').addEventListener('change', async (e) => {
    const claiming = claimingOf[e.target.value];
    if (!claiming) return;
    try { renderStatus(await invoke('set_claiming', { claiming })); } catch (err) { notice(errText(err)); refreshStatus(); }
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
    } catch (e) { notice(errText(e)); }
  });
  for (const b of document.querySelectorAll('#filters button')) {
    b.addEventListener('click', () => {
      filter = b.dataset.filter;
      for (const o of document.querySelectorAll('#filters button')) o.classList.toggle('on', o === b);
      refreshJobs();
    });
  }
  $('detail-close').addEventListener('click', () => { openJob = null; clearTimeout(logTimer); $('detail').hidden = true; });
  $('detail-follow').addEventListener('change', () => { if (openJob != null) showJob(openJob); });
  for (const id of ['q-search', 'q-machine', 'q-repo', 'q-source']) $(id).addEventListener('input', renderJobRows);
  $('empty-new').addEventListener('click', () => { location.hash = '#new'; });
  $('empty-connect').addEventListener('click', () => { location.hash = '#settings'; setTimeout(() => $('sources').scrollIntoView({ block: 'start' }), 200); });
  $('db-mode').addEventListener('change', dbModeChanged);
  $('settings-form').addEventListener('submit', saveSettings);
  $('forget-pw').addEventListener('click', async () => {
    try { await invoke('forget_password'); await loadSettings(); } catch (e) { notice(errText(e)); }
  });
  $('config-notice-settings').addEventListener('click', () => { location.hash = '#settings'; });
  $('config-notice-dismiss').addEventListener('click', async () => {
    try { await invoke('dismiss_set_aside'); } catch (e) { console.error(e); }
    renderSetAside(null);
  });
  $('quit-handoff').addEventListener('click', () => quit('hand_off'));
  $('close-quit').addEventListener('click', () => quit('hand_off'));
  $('close-background').addEventListener('click', () => invoke('close_window').catch((e) => notice(errText(e))));
  // Cancel goes back to what the window showed before the question (the guide, a form...).
  $('close-cancel').addEventListener('click', () => { location.hash = '#' + (beforeClose || 'fleet'); });
  $('quit-drain').addEventListener('click', () => quit('drain'));
  $('quit-cancel').addEventListener('click', () => { location.hash = '#fleet'; });

  await T.event.listen('status', (e) => {
    renderStatus(e.payload);
    if (current() === 'settings' && JSON.stringify(e.payload.sources || []) !== sourcesHealth) loadSources();
  });
  await T.event.listen('config-set-aside', (e) => renderSetAside(e.payload));
  await T.event.listen('config-note', (e) => renderConfigNote(e.payload));
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
