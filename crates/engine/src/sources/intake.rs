//! One intake turn of a source: take the fleet's turn (one conditional UPDATE; zero rows
//! means another machine has it), read what changed since the cursor, make each issue the
//! source takes into exactly one job, update the waiting ones, cancel those whose issue left
//! the filter, and end the turn with a write fenced by it.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::error::TrackerError;
use super::linear;
use super::settings::SourceSettings;
use super::tracker::{self, Item, TrackerClient};
use devpilot_store::job::JobState;
use devpilot_store::queue::{JobOptions, KeyedJob, Queue, Turn, TurnEnd};

/// Below this many requests left in the tracker's window, the source rests until the reset.
pub const RATE_FLOOR: i64 = 100;

/// A configured source, bound to its row.
#[derive(Clone, Debug)]
pub struct Bound {
    pub name: String,
    pub id: i64,
    pub settings: SourceSettings,
}

impl Bound {
    /// Who the intake's own writes name (a cancel's `cancel_requested_by`, history).
    pub fn actor(&self) -> String {
        format!("intake:{}", self.name)
    }
}

/// What a turn did, by unique key.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PollReport {
    pub source: String,
    pub added: Vec<(String, i64)>,
    pub updated: Vec<(String, i64)>,
    pub cancelled: Vec<(String, i64)>,
    /// How many issues the tracker returned.
    pub seen: usize,
}

impl PollReport {
    /// `added linear:ENG-7 as job #12`, one line each.
    pub fn lines(&self) -> Vec<String> {
        let each = |verb: &str, list: &[(String, i64)]| -> Vec<String> {
            list.iter().map(|(k, id)| format!("{verb} {k} as job #{id}")).collect()
        };
        let mut out = each("added", &self.added);
        out.extend(each("updated", &self.updated));
        out.extend(each("cancelled", &self.cancelled));
        out
    }
}

/// Why a turn did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error(transparent)]
    Tracker(#[from] TrackerError),
    #[error(transparent)]
    Store(#[from] devpilot_store::Error),
}

/// What a try at the turn did: the turn's report if this machine took it, and when the
/// source's next turn is due (so a machine that lost waits until then, not a tick).
#[derive(Debug)]
pub struct Tried {
    pub report: Option<PollReport>,
    pub next_in: Duration,
}

/// Runs one turn of `source` if it is due (or `force`).
pub async fn poll(
    queue: &Queue,
    orchestrator_id: &str,
    machine: &str,
    source: &Bound,
    client: &TrackerClient,
    max_attempts: i32,
    force: bool,
) -> Result<Tried, IntakeError> {
    let tried = queue.try_turn(source.id, machine, force).await?;
    let next_in = Duration::from_millis(tried.next_in_ms.max(0) as u64);
    let Some(turn) = tried.turn else { return Ok(Tried { report: None, next_in }) };
    let (cursor, etag) = (turn.cursor.as_deref(), turn.etag.as_deref());
    let read = match tracker::read(client, &source.name, &source.settings, cursor, etag).await {
        Ok(read) => read,
        Err(e) => {
            fail_turn(queue, &turn, &e).await;
            return Err(e.into());
        }
    };
    if read.truncated {
        tracing::warn!(source = %source.name, "more changed issues than one turn reads; the next turn goes on");
    }
    let report = apply(queue, orchestrator_id, source, &read.items, max_attempts).await?;
    let end = TurnEnd {
        cursor: read.newest.clone(),
        etag: read.etag.clone(),
        hold_until: read.rate.hold_until(RATE_FLOOR),
        rate_remaining: read.rate.remaining,
        rate_reset_at: read.rate.reset_at_ms,
    };
    if !queue.end_turn(&turn, &end).await? {
        tracing::info!(source = %source.name, "a newer intake turn ended first; its cursor stands");
    }
    Ok(Tried { report: Some(report), next_in })
}

/// Keeps the error on the source's row; a rate limit holds the source until its reset.
async fn fail_turn(queue: &Queue, turn: &Turn, e: &TrackerError) {
    if let Err(db) = queue.turn_failed(turn, &e.to_string(), e.reset_at_ms()).await {
        tracing::warn!(error = %db, "could not record the source's error");
    }
}

/// Makes the issues read into jobs: add, update or cancel, each at most once per key.
async fn apply(
    queue: &Queue,
    orchestrator_id: &str,
    source: &Bound,
    items: &[Item],
    max_attempts: i32,
) -> Result<PollReport, IntakeError> {
    let mut report = PollReport { source: source.name.clone(), seen: items.len(), ..Default::default() };
    // The same issue may come twice across pages if it changed during the read: the
    // newest version wins.
    let mut latest: HashMap<&str, &Item> = HashMap::new();
    for i in items {
        let newer = latest.get(i.key.as_str()).is_none_or(|seen| seen.version <= i.version);
        if newer {
            latest.insert(&i.key, i);
        }
    }
    let keys: Vec<String> = latest.keys().map(|k| k.to_string()).collect();
    let mut newest_job: HashMap<String, KeyedJob> = HashMap::new();
    for job in queue.jobs_by_key(orchestrator_id, &keys).await? {
        newest_job.entry(job.unique_key.clone()).or_insert(job);
    }
    let mut ordered: Vec<&Item> = latest.into_values().collect();
    ordered.sort_by(|a, b| a.key.cmp(&b.key));
    for item in ordered {
        let key = item.key.clone();
        let job = newest_job.get(&key);
        // Another source's job (or a job of the same key added by hand) is never this
        // source's to update or cancel; while it exists, this source adds none either.
        if job.is_some_and(|j| j.source_id != Some(source.id)) {
            continue;
        }
        // A read older than what the job already reflects (a turn that stalled while a newer
        // one ran) changes nothing.
        if job.is_some_and(|j| linear::version_of(&j.payload).is_some_and(|v| v > item.version.as_str())) {
            continue;
        }
        if item.matches {
            take(queue, orchestrator_id, source, item, job, max_attempts, &mut report).await?;
        } else if let Some(job) = job.filter(|j| j.live() && item.left) {
            if let Some(outcome) = queue.cancel(job.id, &source.actor()).await? {
                tracing::info!(key, job = job.id, ?outcome, "the issue left the source's filter: cancelled");
                report.cancelled.push((key, job.id));
            }
        }
    }
    Ok(report)
}

/// An issue the source takes: a job if it has none (or only one the intake itself cancelled
/// when the issue left the filter), or its waiting job brought up to date. A job that
/// completed, died or was cancelled by a person is never added again by the intake: the
/// same issue is never dispatched twice (a person requeues it on purpose).
async fn take(
    queue: &Queue,
    orchestrator_id: &str,
    source: &Bound,
    item: &Item,
    job: Option<&KeyedJob>,
    max_attempts: i32,
    report: &mut PollReport,
) -> Result<(), IntakeError> {
    let (key, payload) = (item.key.as_str(), &item.payload);
    let again = |j: &KeyedJob| j.state == JobState::Cancelled && j.cancelled_by.as_deref() == Some(&source.actor());
    match job {
        Some(j) if j.waiting() && !linear::same_task(&j.payload, payload) => {
            if queue.update_waiting(j.id, payload, &source.actor()).await? {
                report.updated.push((key.to_string(), j.id));
            }
        }
        Some(j) if !again(j) => {}
        _ => {
            let opts = JobOptions {
                key: Some(key.to_string()),
                priority: item.priority,
                max_attempts,
                source: Some(source.id),
                ..Default::default()
            };
            let added = queue.enqueue_keyed(orchestrator_id, payload, &opts).await?;
            if added.existing.is_none() {
                report.added.push((key.to_string(), added.id));
            }
        }
    }
    Ok(())
}
