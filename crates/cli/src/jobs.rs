//! The commands on jobs and machines: cancel, requeue (which also lets a job parked by the
//! governor go), prune, sweep, release, worktrees and the hidden claim.

use std::time::Duration;

use devpilot_engine::config::Paths;
use devpilot_engine::orchestrator;
use devpilot_engine::span::parse_duration;
use devpilot_store::db::PoolSettings;
use devpilot_store::error::{Error, Result};
use devpilot_store::job::{event, JobState};
use devpilot_store::queue::{CancelOutcome, Fence, Queue};

use crate::exit::{Code, Fail, Out};
use crate::open::open_queue;
use crate::output::{fmt_ids, human, json, shown};

/// This machine's name, as history records who asked.
pub(crate) fn who() -> String {
    Paths::for_app("devpilot")
        .and_then(|p| p.load())
        .map(|s| s.machine_name())
        .unwrap_or_else(|_| devpilot_engine::settings::default_machine_name())
}

pub async fn cancel(id: i64, as_json: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let (outcome, holder, text, code) = match queue.cancel(id, &who()).await? {
        Some(CancelOutcome::Cancelled) => ("cancelled", None, format!("cancelled #{id}"), Code::Ok),
        Some(CancelOutcome::Requested { holder }) => {
            let text = format!(
                "asked {} to stop #{id}; it stops the agent at its next renewal and the job ends cancelled",
                shown(Some(holder.as_deref().unwrap_or("its holder")))
            );
            ("requested", holder, text, Code::Ok)
        }
        None => {
            let (job, _) = queue.job(id).await?.ok_or(Error::NoJob(id))?;
            match job.state {
                JobState::Cancelled => ("already", None, format!("#{id} is already cancelled"), Code::Nothing),
                JobState::Running => {
                    let text = format!(
                        "a cancel of #{id} was already asked for (by {}); {} stops it",
                        shown(Some(job.cancel_requested_by.as_deref().unwrap_or("?"))),
                        shown(Some(job.claimed_by.as_deref().unwrap_or("its holder")))
                    );
                    ("already", job.claimed_by, text, Code::Nothing)
                }
                other => return Err(Fail::new(Code::Nothing, format!("#{id} is {other}: there is nothing to cancel"))),
            }
        }
    };
    if as_json {
        json(&serde_json::json!({"id": id, "outcome": outcome, "holder": holder}));
    } else {
        println!("{text}");
    }
    Ok(code)
}

/// `devpilot requeue ID`: a job parked by the governor (at its spend cap, on a limit) is let
/// go; a dead, failed or cancelled one goes back in the queue with a fresh attempt budget.
pub async fn requeue(id: i64, as_json: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let (job, _) = queue.job(id).await?.ok_or(Error::NoJob(id))?;
    let let_go = job.state == JobState::Queued && queue.let_go(&job.orchestrator_id, id, &who()).await?;
    if let_go || queue.requeue(id, &who()).await? {
        if as_json {
            json(&serde_json::json!({"id": id, "requeued": true, "let_go": let_go}));
        } else if let_go {
            println!("let #{id} go past its spend cap / hold; claimable now");
        } else {
            println!("requeued #{id}");
        }
        return Ok(Code::Ok);
    }
    let (job, _) = queue.job(id).await?.ok_or(Error::NoJob(id))?;
    Err(Fail::new(
        Code::Nothing,
        format!(
            "#{id} is {}: only dead, failed or cancelled jobs, or jobs parked at a spend cap or on a usage limit, \
             can be requeued",
            job.state
        ),
    ))
}

pub async fn prune(
    older_than: Option<&str>,
    dead_older_than: Option<&str>,
    orchestrator: Option<&str>,
    as_json: bool,
) -> Out {
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    let mut r = settings.retention();
    if let Some(t) = older_than {
        r.finished = parse_duration(t)?;
    }
    if let Some(t) = dead_older_than {
        r.dead = parse_duration(t)?;
    }
    if r.finished < Duration::from_secs(60) || r.dead < Duration::from_secs(60) {
        return Err(Fail::new(Code::Usage, "--older-than and --dead-older-than must be at least a minute"));
    }
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let pruned = queue.prune(orchestrator, &r, 500).await?;
    let dirs = vec![paths.job_log_dir(), orchestrator::payload_dir(&paths.data_dir)];
    let files = tokio::task::spawn_blocking(move || orchestrator::prune_files(&dirs, orchestrator::file_retention(&r)))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))?;
    if as_json {
        json(&serde_json::json!({"jobs": pruned.jobs, "machines": pruned.machines, "files": files}));
    } else {
        println!(
            "deleted {} finished job(s) with their history, {} machine(s) not seen for {}, {} old agent file(s)",
            pruned.jobs,
            pruned.machines,
            human(r.machines),
            files
        );
    }
    Ok(Code::Ok)
}

/// `devpilot sweep`: release stale claims once.
pub async fn sweep(claim_timeout: &str, orchestrator: Option<&str>, as_json: bool) -> Out {
    let timeout = parse_duration(claim_timeout)?;
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let swept = queue.sweep(orchestrator, timeout).await?;
    let dead = swept.iter().filter(|s| s.dead).count();
    if as_json {
        json(&serde_json::json!({"released": swept.len() - dead, "dead": dead}));
    } else {
        println!("released {} stale claim(s), {} job(s) now dead", swept.len() - dead, dead);
    }
    Ok(Code::Ok)
}

/// `devpilot release`: ask the holder to hand off, wait for it, and say what moved; release
/// directly what it does not hand off in time.
pub async fn release(orchestrator: &str, machine: &str, wait: Duration, as_json: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let asked = queue.request_release(orchestrator, machine, &who()).await?;
    let say = |line: String| {
        if !as_json {
            println!("{line}");
        }
    };
    if asked.is_empty() {
        say(format!("{machine} holds no job"));
    }
    let deadline = tokio::time::Instant::now() + wait;
    let (mut left, mut handed) = (asked.clone(), vec![]);
    while !left.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut still = vec![];
        for fence in left {
            let id = fence.job;
            match queue.job(id).await? {
                Some((j, _)) if j.state == JobState::Running && j.claim_token == fence.token => still.push(fence),
                Some(_) => {
                    handed.push(id);
                    say(format!("#{id} handed off by {machine}{}", moved(&queue, fence).await?));
                }
                None => say(format!("#{id} is gone")),
            }
        }
        left = still;
    }
    let mut released = vec![];
    if !left.is_empty() {
        let why = format!("{machine} did not answer within {}; released directly", human(wait));
        released = queue.release_unanswered(&left, machine, &why).await?;
    }
    if !released.is_empty() {
        say(format!(
            "{machine} did not answer within {}: released {} job(s) directly{}; their work in progress stayed on {machine}",
            human(wait),
            released.len(),
            fmt_ids(&released)
        ));
    }
    let busy: Vec<i64> = left.iter().map(|f| f.job).filter(|id| !released.contains(id)).collect();
    if !busy.is_empty() {
        say(format!(
            "{machine} answered and is still handing off{}; it releases them once their work in progress is pushed",
            fmt_ids(&busy)
        ));
    }
    if as_json {
        json(&serde_json::json!({"machine": machine, "handed_off": handed, "released": released, "handing_off": busy}));
    }
    Ok(if asked.is_empty() { Code::Nothing } else { Code::Ok })
}

/// What this claim's hand-off carried, from its history, for `release`'s report.
async fn moved(queue: &Queue, fence: Fence) -> Result<String> {
    let id = fence.job;
    let history = queue.history(id).await?;
    let handed = history.iter().rev().find(|e| e.kind == event::HANDED_OFF && e.claim_token == Some(fence.token));
    let detail = handed.and_then(|e| e.detail.as_deref()).unwrap_or_default();
    Ok(match (detail.find("pushed to "), queue.job(id).await?) {
        (Some(_), Some((j, _))) if j.resume_branch.is_some() => {
            format!("; its work in progress is on branch {}", shown(j.resume_branch.as_deref()))
        }
        _ if detail.contains("stayed on") => format!("; {}", shown(detail.split("; ").last())),
        _ => "; it carried no work in progress".into(),
    })
}

/// `devpilot worktrees [--prune]`.
pub async fn worktrees(orchestrator: &str, prune: bool, as_json: bool) -> Out {
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    let root = orchestrator::worktree_root(&paths.data_dir, orchestrator);
    let ws = devpilot_engine::worktree::Workspaces::new(
        root.clone(),
        settings.repos()?,
        &settings.machine_name(),
        Duration::from_secs(10),
    );
    let records = ws.records();
    if records.is_empty() {
        if as_json {
            json(&serde_json::json!([]));
        } else {
            println!("no worktrees under {}", root.display());
        }
        return Ok(Code::Ok);
    }
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let ids: Vec<i64> = records.iter().map(|r| r.job).collect();
    let states: std::collections::HashMap<i64, devpilot_store::job::JobState> =
        queue.job_states(&ids).await?.into_iter().collect();
    let state_of = |id: i64| states.get(&id).map(|s| s.as_str()).unwrap_or("gone");
    let row = |r: &devpilot_engine::worktree::Record, removed: bool| {
        serde_json::json!({
            "id": r.job, "path": r.path, "branch": r.branch, "repo": r.repo, "state": state_of(r.job),
            "kept": r.kept.is_some() || r.pending_push, "why": r.kept, "pending_push": r.pending_push,
            "removed": removed,
        })
    };
    if prune {
        let finished = |id: i64| states.get(&id).is_none_or(|s| s.is_finished());
        let (removed, kept) = ws.prune(&finished).await;
        if as_json {
            let rows: Vec<_> = removed.iter().map(|r| row(r, true)).chain(kept.iter().map(|r| row(r, false))).collect();
            json(&serde_json::Value::Array(rows));
            return Ok(Code::Ok);
        }
        for r in &removed {
            println!("removed #{} {} ({})", r.job, r.path.display(), r.branch);
        }
        for r in &kept {
            println!("kept    #{} {}: {}", r.job, r.path.display(), r.kept.clone().unwrap_or_default());
        }
        println!("{} removed, {} kept", removed.len(), kept.len());
        return Ok(Code::Ok);
    }
    if as_json {
        json(&serde_json::Value::Array(records.iter().map(|r| row(r, false)).collect()));
        return Ok(Code::Ok);
    }
    for r in &records {
        let note = match (&r.kept, r.pending_push) {
            (_, true) => " (work in progress waiting to be pushed)".to_string(),
            (Some(k), _) => format!(" (kept: {k})"),
            _ => String::new(),
        };
        println!("#{:<6} {:<10} {} {} [{}]{note}", r.job, state_of(r.job), r.path.display(), r.branch, r.repo);
    }
    Ok(Code::Ok)
}

/// `devpilot claim`: `claimed ID TOKEN` (exit 0) on a win, `lost ID` (exit 3) when the
/// conditional UPDATE matched no row. On stderr, `statement START END`: the wall clock (ns since
/// the epoch) just before the statement was sent and just after its answer, so that a race
/// between processes on one machine can show its claims were really in flight together.
pub async fn claim(orchestrator: &str, machine: &str, wait_stdin: bool, id: i64) -> Result<()> {
    use std::io::Write;
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    if wait_stdin {
        println!("ready");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line)? == 0 {
            return Err(Error::Invalid("stdin closed before the line that starts the claim".into()));
        }
        // A line that names an instant (ns since the epoch) starts the claim then: racers
        // woken by one clock start closer together than racers woken one pipe after another.
        if let Ok(at) = line.trim().parse::<u128>() {
            let wait = at.saturating_sub(epoch_ns()).min(10_000_000_000);
            std::thread::sleep(std::time::Duration::from_nanos(wait as u64));
        }
    }
    let start = epoch_ns();
    let claimed = queue.claim_by_id(id, orchestrator, machine).await;
    eprintln!("statement {start} {}", epoch_ns());
    match claimed? {
        Some(c) => println!("claimed {id} {}", c.fence.token),
        None => {
            println!("lost {id}");
            std::io::stdout().flush()?;
            std::process::exit(3);
        }
    }
    Ok(())
}

/// Nanoseconds since the epoch: one clock every process on the machine shares.
fn epoch_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}
