//! What the statements return, and the decoders of their rows.

use std::time::Duration;

use sea_orm::QueryResult;
use serde::Serialize;

use super::route::{names_of, Route};
#[cfg(doc)]
use super::Queue;
use crate::error::{Error, Result};
use crate::job::{event, JobState};

/// A job this machine now holds. `token` must accompany every later write.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Claim {
    pub id: i64,
    pub orchestrator_id: String,
    pub payload: serde_json::Value,
    pub title: Option<String>,
    pub token: i64,
    pub attempt: i32,
    /// The branch a hand-off pushed this job's work in progress to, if one did.
    pub resume_branch: Option<String>,
    /// The machine that handed it off.
    pub resumed_from: Option<String>,
    /// The repo the pick routed it by (the `repo` column); the runner checks that the
    /// payload says the same before it runs anything.
    pub repo: Option<String>,
}

/// What a fenced failure did to the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailOutcome {
    /// Back in the queue for another attempt, after the retry backoff.
    WillRetry,
    /// Out of attempts.
    Dead,
    /// A cancel had been asked for: the job ends cancelled.
    Cancelled,
}

impl FailOutcome {
    pub(super) fn of_state(state: &str) -> Self {
        match JobState::parse(state) {
            Some(JobState::Dead) => FailOutcome::Dead,
            Some(JobState::Cancelled) => FailOutcome::Cancelled,
            _ => FailOutcome::WillRetry,
        }
    }

    pub(super) fn of_event(kind: &str) -> Self {
        match kind {
            event::DEAD => FailOutcome::Dead,
            event::CANCELLED => FailOutcome::Cancelled,
            _ => FailOutcome::WillRetry,
        }
    }
}

/// A claim the sweep released (or killed).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Swept {
    pub id: i64,
    pub orchestrator_id: String,
    pub previous_holder: Option<String>,
    pub token: i64,
    pub dead: bool,
    /// The database time of the sweep: when the lease ended.
    pub at: i64,
}

/// One row of a job listing.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobRow {
    pub id: i64,
    pub orchestrator_id: String,
    pub title: Option<String>,
    pub state: String,
    pub attempts: i32,
    pub claimed_by: Option<String>,
    pub claim_token: i64,
    pub created_at: i64,
    pub claimed_at: Option<i64>,
    pub heartbeat_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub last_error: Option<String>,
    pub max_attempts: i32,
    pub unique_key: Option<String>,
    pub priority: i32,
    /// Claimable from this database time (ms).
    pub run_at: i64,
    /// What the agent said it did, and a link (its result file).
    pub summary: Option<String>,
    pub url: Option<String>,
    pub cancel_requested_by: Option<String>,
    pub finished_at: Option<i64>,
    pub repo: Option<String>,
    pub requires: Vec<String>,
    pub resume_branch: Option<String>,
    pub resumed_from: Option<String>,
    /// Where a kept worktree is (`machine:path (why)`).
    pub worktree: Option<String>,
    pub release_requested_by: Option<String>,
    /// The database clock when the row was read, so ages need no local clock.
    pub now: i64,
}

impl JobRow {
    /// How long until a waiting job may be claimed, if it is waiting for a time.
    pub fn wait(&self) -> Option<Duration> {
        let claimable = JobState::parse(&self.state).is_some_and(|s| JobState::CLAIMABLE.contains(&s));
        (claimable && self.run_at > self.now).then(|| Duration::from_millis((self.run_at - self.now) as u64))
    }

    /// "retry in 1m 20s" (a failed attempt's backoff), "starts in 10m" (a scheduled or parked
    /// job), or nothing.
    pub fn waiting_text(&self) -> Option<String> {
        let wait = self.wait()?;
        let text = humantime::format_duration(Duration::from_secs(Ord::max(wait.as_secs(), 1))).to_string();
        Some(if self.state == JobState::Failed.as_str() {
            format!("retry in {text}")
        } else {
            format!("starts in {text}")
        })
    }
}

/// One entry of a job's history: why it moved.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobEvent {
    pub id: i64,
    pub job_id: i64,
    pub at: i64,
    pub kind: String,
    pub machine: Option<String>,
    pub claim_token: Option<i64>,
    pub detail: Option<String>,
}

/// A machine's presence row.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MachineRow {
    pub machine: String,
    pub status: String,
    pub last_seen_at: i64,
    pub dispatch_enabled: bool,
    pub paused_until: Option<i64>,
    pub running: i32,
    pub concurrency: i32,
    /// Why this machine is not claiming, if something keeps it from it.
    pub problem: Option<String>,
    pub repos: Vec<String>,
    pub labels: Vec<String>,
    pub now: i64,
}

impl MachineRow {
    /// What this machine said it can take.
    pub fn route(&self) -> Route {
        Route { repos: self.repos.clone(), labels: self.labels.clone() }
    }

    /// Whether it is there to take work: seen in the last 15 minutes and not stopped.
    pub fn online(&self) -> bool {
        self.status != "stopped" && self.now - self.last_seen_at < 15 * 60 * 1000
    }
}

/// The stored tail of a job's agent log.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LogTail {
    pub machine: String,
    pub claim_token: i64,
    pub tail: String,
    pub updated_at: i64,
    pub now: i64,
}

/// A poll's answer: the claims, whether a sweep has something to do, and, when the poll
/// claimed fewer than it asked for, how long until the next waiting job is due.
#[derive(Clone, Debug, Default)]
pub struct Polled {
    pub claims: Vec<Claim>,
    pub stale: bool,
    pub next_due: Option<Duration>,
}

/// Counts of an orchestrator's jobs by state.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Counts {
    pub queued: i64,
    pub running: i64,
    pub failed: i64,
    pub completed: i64,
    pub dead: i64,
    pub cancelled: i64,
}

impl Counts {
    /// Work that is claimable or still running.
    pub fn open(&self) -> i64 {
        self.queued + self.failed + self.running
    }
}

/// What is left for a machine that drains until empty ([`Queue::open_work`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpenWork {
    /// Running jobs (on any machine: they may come back), and claimable ones this machine
    /// can take.
    pub open: i64,
    /// Claimable jobs this machine cannot take (another repo or label).
    pub unroutable: i64,
}

/// What an enqueue did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    pub id: i64,
    /// Set when nothing was added because a live job has the same key: its state.
    pub existing: Option<JobState>,
}

/// What a renewal found: the claims still held, and those of them whose cancel was asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Renewed {
    /// The held jobs whose release a user asked for (`devpilot release --machine`).
    pub release: Vec<(i64, i64)>,
    pub kept: Vec<(i64, i64)>,
    pub cancel: Vec<(i64, i64)>,
}

impl From<Vec<(i64, i64)>> for Renewed {
    fn from(kept: Vec<(i64, i64)>) -> Self {
        Self { kept, cancel: vec![], release: vec![] }
    }
}

/// What a cancel did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum CancelOutcome {
    /// It was waiting; now it is cancelled.
    Cancelled,
    /// It is running: its holder stops the agent at its next renewal (or at once on NOTIFY).
    Requested { holder: Option<String> },
}

/// What a prune deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub jobs: u64,
    pub machines: u64,
}

pub(super) const JOB_COLUMNS: &str = "id, orchestrator_id, title, state, attempts, claimed_by, claim_token, \
     created_at, claimed_at, heartbeat_at, completed_at, last_error, max_attempts, unique_key, priority, run_at, \
     summary, result_url, cancel_requested_by, finished_at, repo, requires, resume_branch, resumed_from, worktree, \
     release_requested_by";

pub(super) fn job_from_row(r: &QueryResult) -> Result<JobRow> {
    Ok(JobRow {
        id: r.try_get("", "id")?,
        orchestrator_id: r.try_get("", "orchestrator_id")?,
        title: r.try_get("", "title")?,
        state: r.try_get("", "state")?,
        attempts: r.try_get("", "attempts")?,
        claimed_by: r.try_get("", "claimed_by")?,
        claim_token: r.try_get("", "claim_token")?,
        created_at: r.try_get("", "created_at")?,
        claimed_at: r.try_get("", "claimed_at")?,
        heartbeat_at: r.try_get("", "heartbeat_at")?,
        completed_at: r.try_get("", "completed_at")?,
        last_error: r.try_get("", "last_error")?,
        max_attempts: r.try_get("", "max_attempts")?,
        unique_key: r.try_get("", "unique_key")?,
        priority: r.try_get("", "priority")?,
        run_at: r.try_get("", "run_at")?,
        summary: r.try_get("", "summary")?,
        url: r.try_get("", "result_url")?,
        cancel_requested_by: r.try_get("", "cancel_requested_by")?,
        finished_at: r.try_get("", "finished_at")?,
        repo: r.try_get("", "repo")?,
        requires: names_of(r.try_get("", "requires")?),
        resume_branch: r.try_get("", "resume_branch")?,
        resumed_from: r.try_get("", "resumed_from")?,
        worktree: r.try_get("", "worktree")?,
        release_requested_by: r.try_get("", "release_requested_by")?,
        now: r.try_get("", "now")?,
    })
}

pub(super) fn event_from_row(r: &QueryResult) -> Result<JobEvent> {
    Ok(JobEvent {
        id: r.try_get("", "id")?,
        job_id: r.try_get("", "job_id")?,
        at: r.try_get("", "at")?,
        kind: r.try_get("", "kind")?,
        machine: r.try_get("", "machine")?,
        claim_token: r.try_get("", "claim_token")?,
        detail: r.try_get("", "detail")?,
    })
}

pub(super) fn claim_from_row(r: &QueryResult) -> Result<Claim> {
    Ok(Claim {
        id: r.try_get("", "id")?,
        orchestrator_id: r.try_get("", "orchestrator_id")?,
        payload: r.try_get("", "payload")?,
        title: r.try_get("", "title")?,
        token: r.try_get("", "claim_token")?,
        attempt: r.try_get("", "attempts")?,
        resume_branch: r.try_get("", "resume_branch")?,
        resumed_from: r.try_get("", "resumed_from")?,
        repo: r.try_get("", "repo")?,
    })
}

/// The (id, token) pairs of ended claims, with the state each ended in.
pub(super) fn ended_of(rows: &[QueryResult]) -> Result<Vec<((i64, i64), JobState)>> {
    rows.iter()
        .map(|r| {
            let state = JobState::parse(&r.try_get::<String>("", "state")?).unwrap_or(JobState::Completed);
            Ok(((r.try_get::<i64>("", "id")?, r.try_get::<i64>("", "claim_token")?), state))
        })
        .collect()
}

pub(super) fn pairs_of(rows: &[QueryResult]) -> Result<Vec<(i64, i64)>> {
    rows.iter().map(|r| Ok((r.try_get::<i64>("", "id")?, r.try_get::<i64>("", "claim_token")?))).collect()
}

pub(super) fn ids_of(rows: &[QueryResult]) -> Result<Vec<i64>> {
    rows.iter().map(|r| Ok(r.try_get::<i64>("", "id")?)).collect()
}

pub(super) fn first_i64(rows: &[QueryResult], col: &str) -> Result<i64> {
    match rows.first() {
        Some(r) => Ok(r.try_get("", col)?),
        None => Err(Error::Db(sea_orm::DbErr::RecordNotFound(format!("no row returned for {col}")))),
    }
}
