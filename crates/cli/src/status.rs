//! `devpilot status`: jobs by state, who holds what and for how long, machines, and the
//! fleet's limits and spend today, as text or as JSON.

use std::time::Duration;

use devpilot_store::db::PoolSettings;
use devpilot_store::error::Result;
use devpilot_store::job::JobState;
use devpilot_store::queue::{Counts, JobRow, MachineRow, Queue};

use crate::open::open_queue;
use crate::output::{agent_line, human, shown};

pub async fn status(orchestrator: &str, json: bool) -> Result<()> {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let counts = queue.counts(orchestrator).await?;
    let running = queue.running(orchestrator).await?;
    let machines = queue.machines(orchestrator).await?;
    let waiting = queue.waiting(orchestrator, 20).await?;
    let stuck = unroutable(&queue, orchestrator, &machines).await?;
    let recent = queue.jobs(orchestrator, None, 20).await?;
    let settings = crate::limits::settings();
    let here = devpilot_engine::orchestrator::confine::Confining::new(&settings.sandbox);
    // The limits are read apart: what cannot be read of them is said, and the rest printed.
    let limits = crate::limits::view(&queue, orchestrator, &settings).await.map_err(|e| e.to_string());
    if json {
        let v = serde_json::json!({
            "orchestrator": orchestrator,
            "counts": counts,
            "running": running,
            "waiting": with_wait(&waiting),
            "recent": with_wait(&recent),
            "unroutable": stuck.iter().map(|(j, why)| serde_json::json!({"id": j.id, "title": j.title, "why": why})).collect::<Vec<_>>(),
            "machines": machines,
            "sandbox": {"confined": here.confinement.is_confined(), "text": here.describe()},
            "limits": limits.as_ref().ok(),
            "limits_error": limits.as_ref().err(),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    print_counts(orchestrator, &counts);
    println!("  this machine: {}", here.describe());
    print_running(&running);
    print_waiting(&waiting);
    print_unroutable(&stuck);
    print_finished(&recent);
    print_machines(&machines);
    match &limits {
        Ok(v) => crate::limits::print_block(v, &settings.limits, None),
        Err(e) => println!("limits: cannot be read: {}", shown(Some(e))),
    }
    Ok(())
}

/// Queued jobs that no online machine can take, and why.
async fn unroutable(queue: &Queue, orchestrator: &str, machines: &[MachineRow]) -> Result<Vec<(JobRow, String)>> {
    Ok(queue
        .unclaimed(orchestrator, 200)
        .await?
        .into_iter()
        .filter_map(|j| devpilot_store::queue::unroutable(j.repo.as_deref(), &j.requires, machines).map(|why| (j, why)))
        .collect())
}

/// Jobs as JSON, each with what it is waiting for.
fn with_wait(rows: &[JobRow]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|j| {
            let mut v = serde_json::to_value(j).unwrap_or_default();
            v["waiting"] = j.waiting_text().into();
            v
        })
        .collect()
}

fn print_counts(orchestrator: &str, counts: &Counts) {
    println!("orchestrator {}", shown(Some(orchestrator)));
    println!(
        "  queued {}  running {}  failed {}  completed {}  dead {}  cancelled {}",
        counts.queued, counts.running, counts.failed, counts.completed, counts.dead, counts.cancelled
    );
}

fn print_running(running: &[JobRow]) {
    println!("running:");
    if running.is_empty() {
        println!("  (none)");
    }
    for j in running {
        let held = Duration::from_millis(j.now.saturating_sub(j.claimed_at.unwrap_or(j.now)).max(0) as u64);
        let beat = Duration::from_millis(j.now.saturating_sub(j.heartbeat_at.unwrap_or(j.now)).max(0) as u64);
        println!(
            "  #{:<6} {:<30} held by {} for {} (last heartbeat {} ago, attempt {})",
            j.id,
            shown(j.title.as_deref()),
            shown(j.claimed_by.as_deref()),
            human(held),
            human(beat),
            j.attempts
        );
        print_agent(j);
    }
}

fn print_waiting(waiting: &[JobRow]) {
    if !waiting.is_empty() {
        println!("waiting:");
    }
    for j in waiting {
        let why = match (j.state, &j.last_error) {
            (JobState::Failed, Some(e)) => {
                format!(" after attempt {} of {}: {}", j.attempts, j.max_attempts, shown(Some(e)))
            }
            _ => String::new(),
        };
        println!("  #{:<6} {:<30} {}{why}", j.id, shown(j.title.as_deref()), j.waiting_text().unwrap_or_default());
        print_agent(j);
    }
}

/// The last few finished jobs among `recent` (newest first), each with the start of its
/// summary and what its agent reported.
fn print_finished(recent: &[JobRow]) {
    let finished: Vec<&JobRow> = recent.iter().filter(|j| j.state.is_finished()).take(5).collect();
    if !finished.is_empty() {
        println!("recently finished:");
    }
    for j in finished {
        let summary = j.summary.as_deref().map(|s| s.lines().next().unwrap_or_default()).unwrap_or_default();
        let mut summary: String = summary.chars().take(100).collect();
        if !summary.is_empty() {
            summary.insert_str(0, ": ");
        }
        println!("  #{:<6} {:<30} {}{}", j.id, shown(j.title.as_deref()), j.state, shown(Some(&summary)));
        print_agent(j);
    }
}

/// `agent: claude · session … · $0.0997 · …` under a job, when its agent reported any.
fn print_agent(j: &JobRow) {
    if let Some(line) = agent_line(&j.agent) {
        println!("  {:<7} {line}", "");
    }
}

fn print_unroutable(stuck: &[(JobRow, String)]) {
    if !stuck.is_empty() {
        println!("no machine can take:");
    }
    for (j, why) in stuck {
        println!("  #{:<6} {:<30} {}", j.id, shown(j.title.as_deref()), shown(Some(why)));
    }
}

fn print_machines(machines: &[MachineRow]) {
    println!("machines:");
    if machines.is_empty() {
        println!("  (none)");
    }
    for m in machines {
        let ago = Duration::from_millis(m.now.saturating_sub(m.last_seen_at).max(0) as u64);
        println!(
            "  {:<20} {:<8} running {}/{}  last seen {} ago",
            shown(Some(&m.machine)),
            shown(Some(m.status.as_str())),
            m.running,
            m.concurrency,
            human(ago)
        );
        if let Some(p) = &m.problem {
            println!("  {:<20} not claiming: {}", "", shown(Some(p)));
        }
        if !m.repos.is_empty() || !m.labels.is_empty() {
            println!(
                "  {:<20} repos: {}  labels: {}",
                "",
                shown(Some(&m.repos.join(", "))),
                shown(Some(&m.labels.join(", ")))
            );
        }
    }
}
