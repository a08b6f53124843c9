// The fleet's limits and budgets in the window (issue 42): the Fleet tab's Limits card (each
// account held or near its cap, the day's spend against its cap, the fleet's switch) and a
// job page's Spend section (each attempt against the job's cap, the job's own switch) and its
// "Let it go on". Shown only when there is something to say, as the tray's menu does. Uses
// app.js's invoke, $, el, usd, when, clock, notice and errText.
'use strict';

// The last limits read (the job page asks whether this machine runs as a known account).
let lastLimits = null;
// The job switches set from this window, by job: the job's row does not say it (yet).
const noResume = new Map();

// Whether the card has anything to say: an account held, near or past its cap; something
// spent today; a cap; or the switch off. A new user sees no card (the tray: tray_limits.rs).
function limitsWorthShowing(v) {
  return v.accounts.some((a) => a.state !== 'ok' || a.cap_usd != null)
    || v.day.spent_usd > 0 || v.day.cap_usd != null || v.job_cap_usd != null || v.limits_paused;
}

async function refreshLimits() {
  try {
    renderLimits(await invoke('limits'));
  } catch (e) {
    // The database still opening, or gone: the fleet table says so; the card keeps its last.
    console.error(e);
  }
}

const ACCOUNT_CLASS = { ok: 'ok', near_cap: 'warn', limited: 'bad', capped: 'bad' };

function renderLimits(v) {
  lastLimits = v;
  const card = $('limits');
  card.hidden = !limitsWorthShowing(v);
  if (card.hidden) return;
  const day = v.day;
  const share = day.share != null ? Math.min(1, day.share) : null;
  let bar = '';
  if (share != null) {
    const fill = el('span', {});
    // Through the CSSOM: the page's CSP allows no inline style attribute.
    fill.style.width = `${(share * 100).toFixed(1)}%`;
    bar = el('span', { class: 'bar' + (share >= 0.8 ? ' hot' : ''), title: `${Math.floor(day.share * 100)} % of the fleet's daily cap (the day in ${day.time_zone})` }, fill);
  }
  $('limits-day').replaceChildren(day.line, bar);
  $('limits-accounts').replaceChildren(...v.accounts.map((a) => {
    const mine = a.account === v.this_account;
    const spent = a.spent_today_usd > 0 ? ` · ${usd(a.spent_today_usd)} today${a.cap_usd != null ? ' of ' + usd(a.cap_usd) : ''}` : '';
    const release = a.state === 'limited'
      ? el('button', { type: 'button', class: 'release', title: 'End the hold before its reset: machines under this account claim again (devpilot limits release)',
        onclick: async () => {
          try {
            notice(await invoke('release_account', { account: a.account }) ? `${a.label} is no longer held.` : `${a.label} was not held any more.`);
          } catch (e) { notice(errText(e)); }
          refreshLimits();
        } }, 'Release now')
      : '';
    return el('li', { class: ACCOUNT_CLASS[a.state] || '', dataset: { account: a.account, state: a.state } },
      el('b', {}, a.label), mine ? el('span', { class: 'muted small' }, ' (this machine)') : '', ` · ${a.line}${spent}`, release);
  }));
  $('limits-job').textContent = v.job_cap_usd != null ? `Each job may spend up to ${usd(v.job_cap_usd)}, all its attempts together.` : '';
  $('limits-job').hidden = v.job_cap_usd == null;
  $('limits-resume').checked = !v.limits_paused;
}

// The switch: unchecked, jobs parked on a usage limit wait for a person.
async function setResumeAfterLimits(e) {
  const resume = e.target.checked;
  try {
    renderLimits(await invoke('set_resume_after_limits', { resume }));
  } catch (err) {
    notice(errText(err));
    refreshLimits();
  }
}

// An account as the tray names it: "claude · work", "claude · key 3f9a1c…".
function accountLabel(account) {
  if (!account) return '';
  const known = lastLimits && lastLimits.accounts.find((a) => a.account === account);
  if (known) return known.label;
  const at = account.indexOf(':');
  const [preset, name] = at < 0 ? ['', account] : [account.slice(0, at), account.slice(at + 1)];
  const short = (hex) => hex.slice(0, 6) + '…';
  let who = name;
  if (name.startsWith('key-')) who = 'key ' + short(name.slice(4));
  else if (name.startsWith('login-')) who = 'login ' + short(name.slice(6));
  else if (name.startsWith('machine-')) who = 'this machine';
  return preset ? `${preset} · ${who}` : who;
}

// Stopped at a spend cap and not let go since: the park that holds it says so.
function cappedPark(d) {
  return ['job_cap', 'day_cap'].includes(d.job.parked_for) && ['queued', 'failed'].includes(d.job.state);
}

// The verdict of a job stopped at a cap, or null.
function cappedVerdict(d) {
  if (!cappedPark(d)) return null;
  return d.job.parked_for === 'job_cap'
    ? { cls: 'warn', text: 'Stopped at its spend cap: it waits for you. "Let it go on" runs it again, its work and conversation resumed.' }
    : { cls: 'warn', text: 'Stopped at today\'s spend cap: it goes on when the day\'s spend allows.' };
}

// "Let it go on", beside Cancel, for a job stopped at a cap.
function letGoButton(d) {
  if (!cappedPark(d)) return null;
  const id = d.job.id;
  return el('button', { type: 'button', class: 'let-go primary', title: 'Claimable now: its cap counts again from what it has spent (devpilot requeue)',
    onclick: async () => {
      try {
        notice(await invoke('let_go', { id }) ? `Job #${id} goes on: the next free machine takes it.` : `Job #${id} is not parked at a cap any more.`);
      } catch (e) { notice(errText(e)); }
      showJob(id);
    } }, 'Let it go on');
}

// The job page's Spend section: each attempt (machine, account, cost, when) against the
// job's cap, and for a live job its own switch.
function renderSpend(d) {
  const j = d.job;
  const s = d.spend;
  const live = ['queued', 'failed', 'running'].includes(j.state);
  const box = $('detail-spend');
  box.hidden = !s && !(live && lastLimits && lastLimits.this_account);
  if (box.hidden) return;
  const total = s ? s.total_usd : 0;
  const cap = s ? s.cap_usd : null;
  $('detail-spend-total').textContent = cap != null
    ? `${usd(total)} of this job's ${usd(cap)} cap (${Math.floor((total / cap) * 100)} %)`
    : (s && s.attempts.length ? `${usd(total)} in all; no cap on a job` : 'nothing spent yet');
  const rows = s ? s.attempts : [];
  $('detail-spend-rows').replaceChildren(...rows.map((a, i) => el('tr', {},
    el('td', {}, `#${i + 1}`),
    el('td', {}, a.machine || '?'),
    el('td', { title: a.account || '' }, accountLabel(a.account) || el('span', { class: 'muted' }, 'none known')),
    el('td', { class: 'num' }, usd(a.cost_usd)),
    el('td', {}, when(a.at)))));
  $('detail-spend-table').hidden = !rows.length;
  const opts = [];
  if (live) {
    const set = j.resume_after_limit != null ? !j.resume_after_limit : noResume.get(j.id);
    const input = el('input', { type: 'checkbox', id: 'detail-no-resume', checked: !!set,
      onchange: async (e) => {
        const resume = !e.target.checked;
        try {
          if (await invoke('set_resume_after_limit', { id: j.id, resume })) noResume.set(j.id, !resume);
          else { notice(`Job #${j.id} is not live any more.`); e.target.checked = !e.target.checked; }
        } catch (err) { notice(errText(err)); e.target.checked = !e.target.checked; }
      } });
    opts.push(el('label', { class: 'check', title: 'After a usage limit, this job waits for you instead of resuming by itself when its account\'s hold ends (devpilot limits no-resume)' },
      input, 'Don\'t resume after a usage limit'));
  }
  $('detail-spend-actions').replaceChildren(...opts);
  $('detail-spend-actions').hidden = !opts.length;
}

document.addEventListener('DOMContentLoaded', () => {
  $('limits-resume').addEventListener('change', setResumeAfterLimits);
});
