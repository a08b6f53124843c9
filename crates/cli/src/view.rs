//! Reading jobs: `jobs` (a list, like `gh run list`), `show` (one job, as the window's job
//! page shows it), `watch` (until it ends; its exit status says how) and `open` (its pull
//! request, else its issue). `logs` is in [`crate::logs`].

use std::time::{Duration, UNIX_EPOCH};

use devpilot_store::db::PoolSettings;
use devpilot_store::error::Error;
use devpilot_store::job::JobState;
use devpilot_store::queue::{JobEvent, JobFilter, JobRow, OutboxRow, Queue};

use devpilot_app::limits::{job_spend, JobSpend};
use devpilot_app::review::{feedback_title, ReviewLoopView};

use crate::cli::JobsArgs;
use crate::exit::{Code, Fail, Out};
use crate::open::open_queue;
use crate::output::{account_label, agent_line, human, inert, json, ms, shown, usd};

/// `devpilot jobs`: the queue's jobs that match the filters, newest first.
pub async fn jobs(orchestrator: &str, a: JobsArgs) -> Out {
    let filter = JobFilter { state: a.state, repo: a.repo, source: a.source, machine: a.machine };
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let rows = queue.jobs_matching(orchestrator, &filter, a.limit.clamp(1, 10_000)).await?;
    if a.json {
        json(&serde_json::Value::Array(rows.iter().map(job_json).collect()));
        return Ok(Code::Ok);
    }
    if rows.is_empty() {
        println!("no jobs in queue '{}' match", shown(Some(orchestrator)));
        println!("(`devpilot enqueue --title ...` adds one; a labelled issue of a source becomes one)");
        return Ok(Code::Ok);
    }
    println!("{:<6} {:<10} {:<12} {:<12} {:>8}  TITLE", "ID", "STATE", "REPO", "MACHINE", "AGE");
    for j in &rows {
        let age = Duration::from_millis(j.now.saturating_sub(j.created_at).max(0) as u64);
        println!(
            "{:<6} {:<10} {:<12} {:<12} {:>8}  {}",
            j.id,
            j.state.as_str(),
            clip(&shown(j.repo.as_deref().or(Some("-"))), 12),
            clip(&shown(j.claimed_by.as_deref().or(Some("-"))), 12),
            short_age(age),
            shown(j.title.as_deref().or(Some("(untitled)")))
        );
    }
    Ok(Code::Ok)
}

/// A job as `--json` prints it: its row (documented fields) and what it waits for.
pub fn job_json(j: &JobRow) -> serde_json::Value {
    let mut v = serde_json::to_value(j).unwrap_or_default();
    v["waiting"] = j.waiting_text().into();
    v["pull_request"] = j.pull_request().into();
    v
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

/// 42s, 5m, 3h, 2d.
fn short_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Everything `show` prints about a job.
struct Detail {
    job: JobRow,
    payload: serde_json::Value,
    branch: Option<String>,
    history: Vec<JobEvent>,
    deliveries: Vec<OutboxRow>,
    log: crate::logs::Tail,
    unroutable: Option<String>,
    review_loop: Option<ReviewLoopView>,
    /// Its spend by attempt, against this machine's cap on a job's spend.
    spend: Option<JobSpend>,
}

async fn detail(queue: &Queue, id: i64) -> Result<Detail, Fail> {
    let (job, payload) = queue.job(id).await?.ok_or(Fail::not_found_job(id))?;
    let branch = job.branch(&payload);
    let unroutable = queue.why_unroutable(&job).await?;
    let log = crate::logs::tail(queue, &job, 64 * 1024).await?;
    let (history, deliveries) = (queue.history(id).await?, queue.outbox_of(id).await?);
    let review_loop = devpilot_app::review::review_loop(queue, id, &history, &deliveries).await?;
    let spend = job_spend(queue, id, &crate::limits::settings().limits).await?;
    Ok(Detail { history, deliveries, review_loop, spend, job, payload, branch, log, unroutable })
}

/// `devpilot show ID`.
pub async fn show(id: i64, as_json: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let d = detail(&queue, id).await?;
    if as_json {
        json(&serde_json::json!({
            "job": job_json(&d.job),
            "payload": d.payload,
            "branch": d.branch,
            "issue": d.job.issue,
            "issue_url": d.job.issue_url,
            "pull_request": d.job.pull_request(),
            "unroutable": d.unroutable,
            "history": d.history,
            "deliveries": d.deliveries,
            "review_loop": d.review_loop,
            "spend": d.spend,
            "log": {"from": d.log.from, "tail": d.log.text},
        }));
        return Ok(Code::Ok);
    }
    print_head(&d);
    print_deliveries(&d.deliveries);
    if let Some(r) = &d.review_loop {
        print_review_loop(r);
    }
    print_history(&d.history);
    let lines: Vec<&str> = d.log.text.lines().collect();
    if !lines.is_empty() {
        println!(
            "log (last {} lines, from {}; `devpilot logs {id} -f` follows it):",
            lines.len().min(15),
            d.log.from.as_deref().unwrap_or("?")
        );
        for l in &lines[lines.len().saturating_sub(15)..] {
            println!("  {}", inert(l));
        }
    }
    Ok(Code::Ok)
}

/// The state in words, then the links and facts, as the job page leads with them.
fn print_head(d: &Detail) {
    let j = &d.job;
    println!("#{} · {}", j.id, shown(j.title.as_deref().or(Some("(untitled)"))));
    println!("  state     {}", state_words(j));
    if let Some(why) = &d.unroutable {
        println!("  waiting   no online machine can take it: {}", shown(Some(why)));
    }
    if let Some(pr) = j.pull_request() {
        println!("  pull req  {}", shown(Some(pr)));
    } else if let Some(u) = &j.url {
        println!("  result    {}", shown(Some(u)));
    }
    if j.issue.is_some() || j.issue_url.is_some() {
        println!("  issue     {} {}", shown(j.issue.as_deref()), shown(j.issue_url.as_deref()));
    }
    if let Some(repo) = &j.repo {
        println!("  repo      {}  branch {}", shown(Some(repo)), shown(d.branch.as_deref().or(Some("-"))));
    }
    let machine = j.claimed_by.clone().or_else(|| last_machine(&d.history));
    println!("  machine   {}", shown(machine.as_deref().or(Some("-"))));
    let started = j.started_at.map(when).unwrap_or_else(|| "-".into());
    let ended = j.finished_at.map(when).unwrap_or_else(|| "-".into());
    let took = j.started_at.map(|s| human(ms(j.finished_at.unwrap_or(j.now) - s)));
    println!("  started   {started}   finished {ended}{}", took.map(|t| format!("   took {t}")).unwrap_or_default());
    println!("  attempts  {} of {}", j.attempts, j.max_attempts);
    if let Some(line) = agent_line(&j.agent) {
        println!("  {line}");
    }
    if let Some(spend) = &d.spend {
        println!("  spend     {}", spend_line(spend));
    }
    if let Some(s) = &j.summary {
        println!("  summary   {}", shown(Some(s)));
    }
}

/// `$0.04 (attempt 1 on laptop, claude · work), $0.02 (attempt 2 on desktop, claude · work);
/// cap $0.05`: each attempt's spend, then the total when there are more, then the cap.
fn spend_line(s: &JobSpend) -> String {
    let attempts: Vec<String> = s
        .attempts
        .iter()
        .enumerate()
        .map(|(n, a)| {
            let on = a.machine.as_deref().map(|m| format!(" on {}", shown(Some(m)))).unwrap_or_default();
            let account =
                a.account.as_deref().map(|x| format!(", {}", shown(Some(&account_label(x))))).unwrap_or_default();
            format!("{} (attempt {}{on}{account})", usd(a.cost_usd), n + 1)
        })
        .collect();
    let mut line = if attempts.is_empty() { "nothing yet".to_string() } else { attempts.join(", ") };
    if s.attempts.len() > 1 {
        line.push_str(&format!("; {} in all", usd(s.total_usd)));
    }
    if let Some(cap) = s.cap_usd {
        line.push_str(&format!("; cap {}", usd(cap)));
    }
    line
}

fn state_words(j: &JobRow) -> String {
    let err = j.last_error.as_deref().map(|e| format!(": {}", shown(Some(e)))).unwrap_or_default();
    match j.state {
        JobState::Running => format!("running on {}", shown(j.claimed_by.as_deref())),
        JobState::Queued => match j.waiting_text() {
            Some(w) => format!("queued ({w})"),
            None => "queued".into(),
        },
        JobState::Failed => format!("failed, will be retried{err}"),
        JobState::Dead => format!("dead after {} attempt(s){err}", j.attempts),
        JobState::Completed if j.commits == Some(0) => "completed (no changes)".into(),
        other => format!("{other}{err}"),
    }
}

fn last_machine(history: &[JobEvent]) -> Option<String> {
    history.iter().rev().find(|e| e.kind == devpilot_store::job::event::CLAIMED).and_then(|e| e.machine.clone())
}

/// A database time (ms since the epoch) as `2026-12-06 10:00:00 UTC`.
fn when(at: i64) -> String {
    let t = UNIX_EPOCH + ms(at);
    humantime::format_rfc3339_seconds(t).to_string().replace('T', " ").replace('Z', " UTC")
}

fn print_deliveries(rows: &[OutboxRow]) {
    if rows.is_empty() {
        return;
    }
    println!("reports to the tracker:");
    for o in rows {
        let how = match (&o.outcome, &o.last_error) {
            (Some(out), _) => out.replace('_', " "),
            (None, Some(e)) => format!("waiting (try {}: {})", o.tries, shown(Some(e))),
            (None, None) => "waiting".into(),
        };
        println!("  {:<22} {how}", shown(Some(&o.event)));
    }
}

/// The review loop: its pull request and state, each follow-up with what fed it and the
/// replies, what waits, and how many comments were not fed to any agent.
fn print_review_loop(r: &ReviewLoopView) {
    println!("review loop: {} ({})", shown(Some(&r.pull_request)), r.state.replace('_', " "));
    for f in &r.follow_ups {
        let by = match (&f.answered_by, f.answered_at) {
            (Some(m), Some(at)) => format!("answered by {} at {}", shown(Some(m)), when(at)),
            _ => "running".to_string(),
        };
        let answers = f.answers.as_deref().map(|a| format!("; answers {}", a.replace('_', " "))).unwrap_or_default();
        println!(
            "  follow-up {} ({} piece{}), {by}{answers}",
            f.n,
            f.fed.len(),
            if f.fed.len() == 1 { "" } else { "s" }
        );
        for p in &f.fed {
            let reply = p.reply.as_deref().map(|r| format!(" → {}", shown(Some(r)))).unwrap_or_default();
            println!("    {}{reply}", shown(Some(&feedback_title(p))));
        }
    }
    for p in &r.waiting {
        println!("  waiting: {}", shown(Some(&feedback_title(p))));
    }
    if !r.ignored.is_empty() {
        let who: Vec<String> = r.ignored.iter().map(|p| p.author.clone()).collect();
        println!("  not fed to an agent: {} comment(s) (from {})", r.ignored.len(), shown(Some(&who.join(", "))));
    }
}

fn print_history(rows: &[JobEvent]) {
    println!("history:");
    for e in rows {
        let detail = e.detail.as_deref().map(|d| format!("  {}", shown(Some(d)))).unwrap_or_default();
        println!("  {}  {:<14} {}{detail}", when(e.at), shown(Some(&e.kind)), shown(e.machine.as_deref()));
    }
}

/// `devpilot watch ID`: one line per change, until the job ends.
pub async fn watch(id: i64, every: Duration, as_json: bool) -> Out {
    let every = every.clamp(Duration::from_millis(100), Duration::from_secs(60));
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let mut last = String::new();
    loop {
        let (j, _) = queue.job(id).await?.ok_or(Fail::not_found_job(id))?;
        let line = state_words(&j);
        if line != last && !as_json {
            println!("#{id} {line}");
        }
        last = line;
        if j.state.is_finished() {
            let j = if j.state == JobState::Completed { with_pull_request(&queue, j).await? } else { j };
            if as_json {
                json(&job_json(&j));
            } else if let Some(u) = j.pull_request().or(j.url.as_deref()) {
                println!("#{id} {}", shown(Some(u)));
            }
            return Ok(match j.state {
                JobState::Completed => Code::Ok,
                JobState::Cancelled => Code::JobCancelled,
                _ => Code::JobFailed,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// How long `watch` waits, after a completion, for the pull request being opened.
const PR_WAIT: Duration = Duration::from_secs(60);

/// The completed job once its pull request is opened, when one is on its way (its outbox
/// has an undelivered `pull_request` report): what the user watched for. Bounded.
async fn with_pull_request(queue: &Queue, mut j: JobRow) -> Result<JobRow, Fail> {
    let pending = OutboxRow::pr_pending;
    if !pending(&queue.outbox_of(j.id).await?) {
        return Ok(j);
    }
    eprintln!("#{} completed; waiting for its pull request to be opened…", j.id);
    let deadline = tokio::time::Instant::now() + PR_WAIT;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        j = queue.job(j.id).await?.ok_or(Fail::not_found_job(j.id))?.0;
        if !pending(&queue.outbox_of(j.id).await?) {
            break;
        }
    }
    Ok(j)
}

/// `devpilot open ID`: its pull request, else its issue, in the browser.
pub async fn open(id: i64, print: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let (j, _) = queue.job(id).await?.ok_or(Fail::not_found_job(id))?;
    let link = [j.pull_request(), j.url.as_deref(), j.issue_url.as_deref()].into_iter().flatten().find(|u| openable(u));
    let Some(url) = link else {
        return Err(Fail::new(Code::NotFound, format!("#{id} has no pull request or issue link yet"))
            .fix(format!("`devpilot show {id}` says where it stands")));
    };
    if print {
        println!("{url}");
        return Ok(Code::Ok);
    }
    // The link came from a tracker (strangers' text): only http(s), and it is an argument
    // after `--`-free xdg-open, which takes exactly one URL.
    match std::process::Command::new("xdg-open").arg(url).status() {
        Ok(s) if s.success() => {
            println!("opened {url}");
            Ok(Code::Ok)
        }
        Ok(s) => Err(Fail::new(Code::Error, format!("xdg-open could not open {url} ({s})"))
            .fix(format!("`devpilot open {id} --print` prints the link"))),
        Err(e) => Err(Fail::from(Error::io("cannot run xdg-open", e))
            .fix(format!("`devpilot open {id} --print` prints the link"))),
    }
}

/// An http(s) link with nothing a shell or terminal would read as more than a link.
fn openable(u: &str) -> bool {
    (u.starts_with("https://") || u.starts_with("http://")) && !u.chars().any(|c| c.is_control() || c.is_whitespace())
}
