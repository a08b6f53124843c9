//! What the statements return, decoded from their rows by `FromQueryResult` (columns by
//! name; `JobState`, [`Names`] and [`MachineStatus`] read their columns themselves).

use std::time::Duration;

use sea_orm::{FromQueryResult, QueryResult};
use serde::Serialize;

use super::fence::Fence;
#[cfg(doc)]
use super::pool::Queue;
use super::route::Names;
use crate::error::{Error, Result};
use crate::job::{event, JobState};

/// A job this machine now holds. Its `fence` must accompany every later write.
#[derive(Clone, Debug, Serialize, PartialEq, FromQueryResult)]
pub struct Claim {
    /// The job and this claim's token (the `id` and `claim_token` columns).
    #[sea_orm(nested)]
    pub fence: Fence,
    pub orchestrator_id: String,
    /// jsonb on PostgreSQL, JSON text on SQLite: sea-orm reads both as JSON.
    pub payload: serde_json::Value,
    pub title: Option<String>,
    /// The attempt this claim is (the `attempts` column).
    #[sea_orm(alias = "attempts")]
    pub attempt: i32,
    /// The branch a hand-off pushed this job's work in progress to, if one did.
    pub resume_branch: Option<String>,
    /// The machine that handed it off.
    pub resumed_from: Option<String>,
    /// The repo the pick routed it by (the `repo` column); the runner checks that the
    /// payload says the same before it runs anything.
    pub repo: Option<String>,
    /// The tracker source the job came from (a stranger's issue), or None for the user's own.
    pub source_id: Option<i64>,
    /// Which follow-up of its pull request's review this attempt answers (0: none, the job's
    /// own first run).
    pub follow_ups: i32,
    /// What the job has spent against its own cap before this attempt (USD): its cost since a
    /// person last let it go past the cap.
    pub spent_usd: f64,
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
    pub(super) fn of_state(state: JobState) -> Self {
        match state {
            JobState::Dead => FailOutcome::Dead,
            JobState::Cancelled => FailOutcome::Cancelled,
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
#[derive(Clone, Debug, Serialize, PartialEq, FromQueryResult)]
pub struct JobRow {
    pub id: i64,
    pub orchestrator_id: String,
    pub title: Option<String>,
    /// Serialized as its snake_case name, as stored.
    pub state: JobState,
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
    /// The `result_url` column.
    #[sea_orm(alias = "result_url")]
    pub url: Option<String>,
    pub cancel_requested_by: Option<String>,
    pub finished_at: Option<i64>,
    pub repo: Option<String>,
    /// The labels it requires (a JSON array column; NULL or unreadable: none).
    pub requires: Names,
    pub resume_branch: Option<String>,
    pub resumed_from: Option<String>,
    /// Where a kept worktree is (`machine:path (why)`).
    pub worktree: Option<String>,
    pub release_requested_by: Option<String>,
    /// Where a completion pushed the job's branch (the remote's URL, without credentials).
    pub pushed_remote: Option<String>,
    /// The commits its branch had beyond its start when it completed (0: no changes).
    pub commits: Option<i32>,
    /// The follow-ups its pull request's review queued so far.
    pub follow_ups: i32,
    /// The account its latest attempt ran as (the governor's holds and spend name it).
    pub account: Option<String>,
    /// Why a governed park holds it: `limit`, `day_cap` or `job_cap` (`ParkedFor`); None
    /// for any other state or park.
    pub parked_for: Option<String>,
    /// 1: it resumes by itself when its account's hold ends; 0: it waits for a person.
    pub resume_after_limit: i32,
    /// What the agent CLI of its last attempt reported.
    #[sea_orm(nested)]
    pub agent: AgentRun,
    /// The tracker issue it came from: its identifier (`ENG-7`) and URL.
    pub issue: Option<String>,
    pub issue_url: Option<String>,
    /// The name of the tracker source that added it (`payload.source.name`).
    pub source: Option<String>,
    /// When its last attempt was claimed (kept after it ends, unlike `claimed_at`).
    pub started_at: Option<i64>,
    /// The database clock when the row was read, so ages need no local clock.
    pub now: i64,
}

impl JobRow {
    /// The branch every machine names this job's work by (a job with a repo), from its
    /// `payload`.
    pub fn branch(&self, payload: &serde_json::Value) -> Option<String> {
        self.repo.as_ref()?;
        crate::spec::JobSpec::parse(payload).ok().map(|s| s.branch(self.id)).filter(|b| !b.is_empty())
    }

    /// The job's pull request: its result link, when that is one (DevPilot opens GitHub's).
    pub fn pull_request(&self) -> Option<&str> {
        self.url.as_deref().filter(|u| u.starts_with("https://") && u.contains("/pull/"))
    }

    /// A row with only its identity and state, every other field empty: what renderers are
    /// tested against (a real row comes from a listing).
    pub fn bare(id: i64, orchestrator_id: &str, state: JobState) -> Self {
        Self {
            id,
            orchestrator_id: orchestrator_id.into(),
            title: None,
            state,
            attempts: 1,
            claimed_by: None,
            claim_token: 1,
            created_at: 0,
            claimed_at: None,
            heartbeat_at: None,
            completed_at: None,
            last_error: None,
            max_attempts: 3,
            unique_key: None,
            priority: 0,
            run_at: 0,
            summary: None,
            url: None,
            cancel_requested_by: None,
            finished_at: None,
            repo: None,
            requires: Names(vec![]),
            resume_branch: None,
            resumed_from: None,
            worktree: None,
            release_requested_by: None,
            pushed_remote: None,
            commits: None,
            follow_ups: 0,
            account: None,
            parked_for: None,
            resume_after_limit: 1,
            agent: AgentRun::default(),
            issue: None,
            issue_url: None,
            source: None,
            started_at: None,
            now: 0,
        }
    }

    /// How long until a waiting job may be claimed, if it is waiting for a time.
    pub fn wait(&self) -> Option<Duration> {
        let claimable = JobState::CLAIMABLE.contains(&self.state);
        (claimable && self.run_at > self.now).then(|| Duration::from_millis((self.run_at - self.now) as u64))
    }

    /// "retry in 1m 20s" (a failed attempt's backoff), "starts in 10m" (a scheduled or parked
    /// job), or nothing.
    pub fn waiting_text(&self) -> Option<String> {
        let wait = self.wait()?;
        let text = humantime::format_duration(Duration::from_secs(Ord::max(wait.as_secs(), 1))).to_string();
        Some(if self.state == JobState::Failed { format!("retry in {text}") } else { format!("starts in {text}") })
    }
}

/// What the CLI of a job's last attempt reported: read with the job ([`JobRow`]).
#[derive(Clone, Debug, Default, Serialize, PartialEq, FromQueryResult)]
pub struct AgentRun {
    /// The preset that ran it (`claude`, `codex`, `aider`, `gemini`).
    pub agent: Option<String>,
    /// The CLI's session id.
    pub agent_session: Option<String>,
    /// What the CLI said its model calls cost, summed over attempts.
    pub cost_usd: Option<f64>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    /// The machine whose conversation the last attempt resumed.
    pub session_from: Option<String>,
}

/// One entry of a job's history: why it moved.
#[derive(Clone, Debug, Serialize, PartialEq, FromQueryResult)]
pub struct JobEvent {
    pub id: i64,
    pub job_id: i64,
    pub at: i64,
    pub kind: String,
    pub machine: Option<String>,
    pub claim_token: Option<i64>,
    pub detail: Option<String>,
}

/// The stored tail of a job's agent log.
#[derive(Clone, Debug, Serialize, PartialEq, FromQueryResult)]
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
    /// The completions the poll carried ([`PollExtras::done`](super::PollExtras::done))
    /// that it ended, with the state each ended in. A fence missing here was not ended by
    /// this poll (fenced off, or ended by an earlier try): complete it with
    /// [`Queue::complete_many`](super::Queue::complete_many), which says which and notes a
    /// fenced one.
    pub completed: Vec<(Fence, JobState)>,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, FromQueryResult)]
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
    pub release: Vec<Fence>,
    pub kept: Vec<Fence>,
    pub cancel: Vec<Fence>,
}

impl From<Vec<Fence>> for Renewed {
    fn from(kept: Vec<Fence>) -> Self {
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
     release_requested_by, pushed_remote, commits, follow_ups, account, parked_for, resume_after_limit, agent, agent_session, \
     cost_usd, tokens_in, tokens_out, session_from";

/// Every row of `rows` as a `T`.
pub(super) fn decode<T: FromQueryResult>(rows: &[QueryResult]) -> Result<Vec<T>> {
    rows.iter().map(|r| Ok(T::from_query_result(r, "")?)).collect()
}

/// The first row of `rows` as a `T`, if there is one.
pub(super) fn decode_first<T: FromQueryResult>(rows: &[QueryResult]) -> Result<Option<T>> {
    Ok(rows.first().map(|r| T::from_query_result(r, "")).transpose()?)
}

/// The first row of `rows` as a `T`; none is an error (for a row every answer has).
pub(super) fn decode_one<T: FromQueryResult>(rows: &[QueryResult]) -> Result<T> {
    match rows.first() {
        Some(r) => Ok(T::from_query_result(r, "")?),
        None => Err(Error::Db(sea_orm::DbErr::RecordNotFound("no row returned".into()))),
    }
}

/// A row's `state`.
#[derive(FromQueryResult)]
pub(super) struct Stated {
    pub(super) state: JobState,
}

/// A row's `id` and `state`.
#[derive(FromQueryResult)]
pub(super) struct IdState {
    pub(super) id: i64,
    pub(super) state: JobState,
}

/// A claim that ended, and the state it ended in.
#[derive(FromQueryResult)]
struct Ended {
    #[sea_orm(nested)]
    fence: Fence,
    state: JobState,
}

/// The fences of ended claims, with the state each ended in.
pub(super) fn ended_of(rows: &[QueryResult]) -> Result<Vec<(Fence, JobState)>> {
    Ok(decode::<Ended>(rows)?.into_iter().map(|e| (e.fence, e.state)).collect())
}

/// The fences of the rows (their `id` and `claim_token`).
pub(super) fn pairs_of(rows: &[QueryResult]) -> Result<Vec<Fence>> {
    decode(rows)
}

/// A row's `id`.
#[derive(FromQueryResult)]
struct Id {
    id: i64,
}

pub(super) fn ids_of(rows: &[QueryResult]) -> Result<Vec<i64>> {
    Ok(decode::<Id>(rows)?.into_iter().map(|r| r.id).collect())
}

/// The one value of column `col` of the first row (a count, the clock).
pub(super) fn first_i64(rows: &[QueryResult], col: &str) -> Result<i64> {
    match rows.first() {
        Some(r) => Ok(r.try_get("", col)?),
        None => Err(Error::Db(sea_orm::DbErr::RecordNotFound(format!("no row returned for {col}")))),
    }
}
