// The first-run guide (the window opens on it when there is no settings file): where jobs
// live, which agent runs them, GitHub or Linear (a source, its key, the local clone its jobs
// run in), a first job. Finishing saves the settings (the same command as
// the Settings tab, with its checks); skipping saves the defaults. Either way a settings file
// exists afterwards, so the guide never shows again. Uses app.js's invoke, $ and errText.
'use strict';

const guide = { step: 1, state: null };

function gPick(name) {
  const c = document.querySelector(`input[name="${name}"]:checked`);
  return c ? c.value : null;
}

function gSay(id, text, cls) {
  $(id).textContent = text;
  $(id).className = cls || '';
}

function gShared() { return gPick('g-db') === 'postgres'; }

function gDb() {
  if (!gShared()) return { mode: 'embedded' };
  return {
    mode: 'postgres',
    host: $('g-host').value.trim(),
    port: $('g-port').value ? parseInt($('g-port').value, 10) : null,
    database: $('g-name').value.trim(),
    user: $('g-user').value.trim(),
    sslmode: $('g-sslmode').value,
  };
}

// The agent setting: null for the demo agent, a preset's name, or the command line.
function gAgent() {
  const v = gPick('g-agent');
  if (v === 'demo' || v == null) return null;
  return v === 'command' ? $('g-command').value.trim() : v;
}

function gChoice(value, title, text) {
  const input = el('input', { type: 'radio', name: 'g-agent', value });
  return el('label', { class: 'check' }, input, ' ', el('span', {}, el('b', {}, title), ' ', text));
}

function gRender() {
  const shared = gShared();
  $('g-pg').hidden = !shared;
  // A shared queue never gets the demo agent (its jobs are real work for a real agent).
  const demo = document.querySelector('input[name="g-agent"][value="demo"]');
  if (demo) {
    demo.disabled = shared;
    if (shared && demo.checked) document.querySelector('#g-agents input:not([value="demo"])').checked = true;
  }
  const agent = gPick('g-agent');
  $('g-command').disabled = agent !== 'command';
  $('g-check').hidden = agent === 'demo';
  // The demo job is the demo agent's; a real agent gets a real job.
  const demoJob = document.querySelector('input[name="g-job"][value="demo"]');
  demoJob.disabled = agent !== 'demo';
  $('g-demo-choice').classList.toggle('muted', demoJob.disabled);
  if (demoJob.disabled && demoJob.checked) document.querySelector('input[name="g-job"][value="real"]').checked = true;
  const tracker = gPick('g-tracker');
  $('g-connect').hidden = tracker === 'none';
  for (const e of document.querySelectorAll('#g-connect [data-tracker]')) e.hidden = e.dataset.tracker !== tracker;
  $('g-key-name').textContent = tracker === 'github' ? 'Token' : 'API key';
  // A connected tracker's first job is an issue: the choice is offered, and taken by default.
  const issue = document.querySelector('input[name="g-job"][value="issue"]');
  $('g-issue-choice').hidden = tracker === 'none';
  issue.disabled = tracker === 'none';
  if (issue.disabled && issue.checked) document.querySelector('input[name="g-job"][value="none"]').checked = true;
  $('g-issue-label').textContent = $('g-label').value.trim() || 'any label';
  $('g-real').hidden = gPick('g-job') !== 'real';
  $('g-job-agent').textContent = agent === 'command' ? 'your command' : (agent === 'demo' ? 'the demo agent' : agent);
  for (const li of document.querySelectorAll('#g-steps li')) {
    const n = parseInt(li.dataset.step, 10);
    li.classList.toggle('on', n === guide.step);
    li.classList.toggle('done', n < guide.step);
  }
  for (const s of document.querySelectorAll('#guide .step')) s.hidden = parseInt(s.dataset.step, 10) !== guide.step;
  $('g-back').hidden = guide.step === 1;
  $('g-next').textContent = guide.step === 4 ? 'Finish' : 'Next';
}

// The password only with PostgreSQL: typed and then switched to this machine only, it must
// not reach the save (which refuses a password for the embedded database).
function gPassword() { return gShared() ? ($('g-password').value || null) : null; }

function gConnection() {
  return { input: { db: gDb(), password: gPassword() } };
}

// One request at a time: the buttons wait while one is out.
async function gBusy(f) {
  const buttons = ['g-test', 'g-setup', 'g-check', 'g-next', 'g-back', 'g-skip', 'g-source-test', 'g-gh-import'].map($);
  for (const b of buttons) b.disabled = true;
  try { return await f(); } finally { for (const b of buttons) b.disabled = false; }
}

// What a test found: works, or connected to a new database that needs DevPilot's tables.
function gTested(r) {
  $('g-setup').hidden = !r.needs_schema;
  if (r.needs_schema) gSay('g-db-msg', `Connected to ${r.text.replace(/^connected to /, '')}, but this database has no DevPilot tables yet.`, 'warn');
  else gSay('g-db-msg', `Works: ${r.text}.`, 'ok');
  return !r.needs_schema;
}

async function gTest() {
  gSay('g-db-msg', 'Connecting…');
  $('g-setup').hidden = true;
  try {
    return gTested(await invoke('test_connection', gConnection()));
  } catch (e) {
    gSay('g-db-msg', errText(e), 'err');
    return false;
  }
}

async function gSetUp() {
  gSay('g-db-msg', 'Setting up…');
  try {
    return gTested(await invoke('set_up_database', gConnection()));
  } catch (e) {
    gSay('g-db-msg', errText(e), 'err');
    return false;
  }
}

async function gCheck() {
  const line = gAgent();
  if (line === null) return true;
  gSay('g-agent-msg', 'Checking…');
  try {
    gSay('g-agent-msg', `Found: ${await invoke('check_agent', { line })}`, 'ok');
    return true;
  } catch (e) {
    gSay('g-agent-msg', errText(e), 'err');
    return false;
  }
}

async function gNext() {
  gSay('g-msg', '');
  if (guide.step === 1 && gShared() && !(await gTest())) return;
  if (guide.step === 2 && !(await gCheck())) return;
  if (guide.step === 3 && !gConnectReady()) return;
  if (guide.step < 4) {
    if (guide.step === 3 && gPick('g-tracker') !== 'none' && !gIssueTaken) {
      document.querySelector('input[name="g-job"][value="issue"]').checked = true;
      gIssueTaken = true;
    }
    guide.step += 1;
    gRender();
    return;
  }
  try {
    await gFinish();
  } catch (e) {
    gSay('g-msg', errText(e), 'err');
  }
}

// Saving restarts the engine on the chosen database; a job can be added once it is up.
async function gConnected() {
  for (let i = 0; i < 60; i++) {
    const st = await invoke('get_status');
    if (st.state !== 'starting') return;
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function gFinish() {
  const job = gPick('g-job');
  if (job === 'real' && !$('g-title').value.trim()) throw new Error('give the job a title (or choose "No job for now")');
  gSay('g-msg', 'Saving…');
  const view = await invoke('get_settings');
  const settings = Object.assign({}, view.settings, { agent: gAgent() });
  await invoke('save_settings', { input: { settings, db: gDb(), password: gPassword() } });
  $('g-password').value = '';
  await gConnected();
  let added = null;
  if (job === 'demo') added = await invoke('enqueue_demo', { key: null });
  if (job === 'real') {
    added = await invoke('enqueue_job', {
      job: { title: $('g-title').value, prompt: $('g-prompt').value, repo: null, labels: '', priority: 0, key: null },
    });
  }
  const connected = await gConnect();
  gSay('g-msg', 'Saved.', 'ok');
  if (job === 'issue' && connected) {
    location.hash = '#queue';
    gAwaitFirstIssue(connected);
    return;
  }
  location.hash = added ? `#job-${added.id}` : '#fleet';
}

// The source the guide connected, and its first job: the banner says it waits for a labelled
// issue, then which job the issue became, and opens that job's page. It looks every few
// seconds, for half an hour at most.
let gSourceName = null;
async function gAwaitFirstIssue(connected) {
  const banner = $('first-issue');
  banner.className = 'banner notice';
  banner.textContent = `${connected} Waiting for the first one…`;
  banner.hidden = false;
  const until = Date.now() + 30 * 60 * 1000;
  while (gSourceName && Date.now() < until) {
    try {
      const r = await invoke('list_jobs', { jobState: null, limit: 50 });
      const j = r.jobs.find((x) => x.source === gSourceName);
      if (j) {
        banner.textContent = `${j.title || (j.issue ? 'Issue ' + j.issue : 'An issue')} became job #${j.id}. Its page is open.`;
        banner.className = 'banner notice ok';
        location.hash = `#job-${j.id}`;
        setTimeout(() => { banner.hidden = true; }, 15000);
        return;
      }
    } catch (e) {
      console.error(e);
    }
    await new Promise((res) => setTimeout(res, 3000));
  }
}

// Whether step 3 is filled in enough to go on (or "Not now").
let gIssueTaken = false;
function gConnectReady() {
  const tracker = gPick('g-tracker');
  if (tracker === 'none') return true;
  if (tracker === 'github' && !/^[\w.-]+\/[\w.-]+$/.test($('g-gh-repo').value.trim())) {
    gSay('g-source-msg', 'Name the repository as OWNER/REPO, e.g. acme/webapp.', 'err');
    return false;
  }
  if (tracker === 'linear' && !$('g-teams').value.trim()) {
    gSay('g-source-msg', 'Name the team key, e.g. ENG.', 'err');
    return false;
  }
  return true;
}

// The repo name for a clone: its directory's name ("~/src/webapp" is webapp).
function gRepoName() {
  const path = $('g-clone').value.trim().replace(/\/+$/, '');
  return path ? path.split('/').pop().replace(/[^A-Za-z0-9._-]/g, '-') : '';
}

// The source as Settings → Sources' form sends it.
function gSourceForm() {
  const tracker = gPick('g-tracker');
  return {
    kind: tracker, name: '', teams: $('g-teams').value, repo: $('g-gh-repo').value.trim(), label: $('g-label').value,
    states: ['unstarted', 'started'], assigned_to_me: false, interval: '60s', api_url: '', maps_to: gRepoName(),
    key: $('g-key').value || null,
  };
}

async function gSourceTest() {
  gSay('g-source-msg', 'Testing…');
  try {
    gSay('g-source-msg', await invoke('test_source', { source: gSourceForm() }), 'ok');
  } catch (e) {
    gSay('g-source-msg', errText(e), 'err');
  }
}

async function gImportGh() {
  gSay('g-source-msg', 'Importing…');
  try {
    gSay('g-source-msg', await invoke('import_gh_token'), 'ok');
  } catch (e) {
    gSay('g-source-msg', errText(e), 'err');
  }
}

// After the settings are saved: the clone as a repo (pushing, with a draft PR), then the
// source whose jobs run in it. What the first job will be, in words; null if nothing was
// connected. A failure is said, and the rest of the guide's settings stay saved.
async function gConnect() {
  const tracker = gPick('g-tracker');
  if (tracker === 'none') return null;
  const repo = gRepoName();
  if (repo) await invoke('add_repo', { name: repo, path: $('g-clone').value.trim() });
  const v = await invoke('save_source', { source: gSourceForm() });
  $('g-key').value = '';
  const saved = v.sources.find((s) => s.form.kind === tracker);
  gSourceName = saved ? saved.name : null;
  const where = saved && saved.runs_in ? ` ${saved.runs_in[0].toUpperCase()}${saved.runs_in.slice(1)}.` : '';
  const what = tracker === 'github' ? `an issue of ${$('g-gh-repo').value.trim()}` : `a ${$('g-teams').value.trim().toUpperCase()} issue`;
  const label = $('g-label').value.trim();
  return `Connected. Label ${what}${label ? ' with "' + label + '"' : ''}: it becomes a job within a minute.${where}`;
}

async function gSkip() {
  $('g-password').value = '';
  try {
    await invoke('skip_guide');
    location.hash = '#fleet';
  } catch (e) {
    gSay('g-msg', errText(e), 'err');
  }
}

// Called by app.js's show() when the guide's section is shown.
async function showGuide() {
  try { guide.state = await invoke('guide_state'); } catch (e) { console.error(e); return; }
  if (!guide.state.needed) { location.hash = '#fleet'; return; }
  $('g-embedded-path').textContent = guide.state.embedded_path;
  if (!$('g-agents').children.length) gAgentChoices(guide.state.presets);
  gRender();
}

// The demo agent, then the engine's presets (their CLIs, in words where we have them).
function gAgentChoices(presets) {
  const words = {
    claude: 'Claude Code (the claude CLI).', codex: 'OpenAI Codex CLI (codex).',
    aider: 'Aider (aider).', gemini: 'Gemini CLI (gemini).',
  };
  const demo = gChoice('demo', 'The demo agent.', 'Built in: it logs each job and succeeds after a few seconds (this machine only).');
  demo.querySelector('input').checked = true;
  $('g-agents').append(demo, ...presets.map((name) => gChoice(name, name, words[name] || 'a preset.')));
  for (const input of $('g-agents').querySelectorAll('input')) input.addEventListener('change', gRender);
}

document.addEventListener('DOMContentLoaded', () => {
  for (const input of document.querySelectorAll('#guide input[type=radio]')) input.addEventListener('change', gRender);
  $('g-test').addEventListener('click', () => gBusy(gTest));
  $('g-setup').addEventListener('click', () => gBusy(gSetUp));
  $('g-check').addEventListener('click', () => gBusy(gCheck));
  $('g-next').addEventListener('click', () => gBusy(gNext));
  $('g-back').addEventListener('click', () => { guide.step = Math.max(1, guide.step - 1); gRender(); });
  $('g-skip').addEventListener('click', gSkip);
  $('g-source-test').addEventListener('click', () => gBusy(gSourceTest));
  $('g-gh-import').addEventListener('click', () => gBusy(gImportGh));
  $('g-label').addEventListener('input', gRender);
});
