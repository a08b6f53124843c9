//! Every statement that touches the queue tables lives here, and only here.
//!
//! "Where is the claim?" [`Queue::claim_by_id`] (the article's conditional UPDATE) and
//! [`Queue::claim_next`] (the herd-free pick-and-claim the orchestrator uses).
//!
//! Rules every statement in this file keeps:
//! - One statement per decision. The precondition lives in the WHERE clause and a zero-row
//!   result means "lost the race" or "you no longer own this"; neither is an error.
//! - A state change and its history row commit together: one statement on PostgreSQL (a
//!   data-modifying CTE), one short transaction on SQLite (no network round trip inside it).
//!   See [`Queue::change`].
//! - No transaction is held open across a round trip to the application.
//! - Every lease time comes from the database clock (`{NOW}`), never from this machine.
//! - Every write after a claim names the job's `claim_token` (the fencing token), which every
//!   claim increments, so a machine that slept through losing its lease cannot write.
//! - State predicates come from [`JobState`]'s sets (`{CLAIMABLE}`, `{RUNNING}`), never
//!   spelled out by hand.
//! - Every call is bounded ([`Queue::with_call_timeout`]): no answer in time is
//!   [`Error::Timeout`], never a hang.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait, QueryFilter, QueryResult, QueryTrait,
    Statement, TransactionTrait, Value,
};
use serde::Serialize;

use crate::entity::dispatch_queue as dq;
use crate::error::{Error, Result};
use crate::job::{event, state_in, JobState};
use crate::retry::{self, Budget};

/// Milliseconds since the epoch, from the database's clock.
const PG_NOW: &str = "((extract(epoch from now()) * 1000)::bigint)";
const SQLITE_NOW: &str = "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))";

/// The herd-free pick: the claimable rows that are due, highest priority first, then by when
/// they became claimable (`run_at`: enqueue, scheduled start or end of a retry backoff), then
/// by id; skipping rows another claimer holds. `{LIMIT}` is the placeholder of the batch size.
/// The order is exactly the key of the partial index `dispatch_queue_pick`, so the index
/// serves it with no sort, and no other index can (ordering by `id` alone once let the
/// planner walk the primary key past every claimed row; see the claim-order migration).
/// `{ROUTE}` is the machine's routing predicate ([`Route`]): its repos and labels.
const PICK: &str = "SELECT id FROM dispatch_queue
                     WHERE orchestrator_id = $1
                       AND claimed_at IS NULL AND {CLAIMABLE} AND run_at <= {NOW} AND {ROUTE}
                     ORDER BY priority DESC, run_at, id
                     LIMIT {LIMIT}
                     {SKIP_LOCKED}";

/// Milliseconds from now until the earliest claimable job of orchestrator $1 is due (negative
/// when it is due already), for a poll that claimed less than it asked for: its timer is
/// capped by it. `AND run_at > {NOW}` narrows it to the jobs not yet due.
const NEXT_WAITING: &str = "SELECT MIN(run_at) - {NOW} AS next_due FROM dispatch_queue
                             WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {CLAIMABLE} AND {ROUTE}";

/// The claim of what `picked` chose ($2 is the machine). The precondition is repeated in
/// the WHERE so that a row claimed by someone else in between is simply not ours.
const CLAIM_PICKED: &str = "UPDATE dispatch_queue
                    SET state = 'running', claimed_at = {NOW}, heartbeat_at = {NOW},
                        claimed_by = $2, claim_token = claim_token + 1, attempts = attempts + 1,
                        release_requested_at = NULL
                  WHERE id IN (SELECT id FROM picked)
                    AND claimed_at IS NULL AND {CLAIMABLE} AND run_at <= {NOW}
                 RETURNING {CLAIM_COLUMNS}";

/// What a claim returns ([`claim_from_row`]).
const CLAIM_COLUMNS: &str =
    "id, orchestrator_id, payload, title, claim_token, attempts, claimed_by, state, resume_branch, resumed_from, repo";

impl Detail {
    /// The detail as SQL over the changed row; a text becomes the next parameter of `values`.
    fn sql(&self, values: &mut Vec<Value>) -> String {
        match self {
            Detail::None => "NULL".to_string(),
            Detail::Attempt => ATTEMPT.to_string(),
            Detail::Expr(e) => e.clone(),
            Detail::Text(t) => {
                values.push(t.clone().into());
                format!("${}", values.len())
            }
        }
    }
}

/// A claim's history detail, over the claimed row.
const ATTEMPT: &str = "'attempt ' || attempts";

/// The history of a claim: kind and detail over the claimed row.
const CLAIMED: History<'static> = History { kind: "'claimed'", machine: None, detail: Detail::Attempt };

/// A machine's presence row, $1..$12 in the order of [`presence_values`]. A write replaces
/// the row only if it is a later write of the same run of the machine (`seq`), or a write of
/// another run (a restart): a write that timed out here but committed late can never undo
/// a later one, such as the final `stopped`.
const PRESENCE_UPSERT: &str = "INSERT INTO machines
                 (orchestrator_id, machine, last_seen_at, status, dispatch_enabled, paused_until,
                  running, concurrency, problem, repos, labels, run_id, seq)
             VALUES ($1, $2, {NOW}, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (orchestrator_id, machine) DO UPDATE SET
                 last_seen_at = excluded.last_seen_at, status = excluded.status,
                 dispatch_enabled = excluded.dispatch_enabled,
                 paused_until = excluded.paused_until, running = excluded.running,
                 concurrency = excluded.concurrency, problem = excluded.problem,
                 repos = excluded.repos, labels = excluded.labels,
                 run_id = excluded.run_id, seq = excluded.seq
             WHERE excluded.run_id IS NULL OR machines.run_id IS NULL OR machines.seq IS NULL
                OR machines.run_id <> excluded.run_id OR machines.seq < excluded.seq";

/// The text of [`Queue::claim_next`] before dialect substitution ($1 orchestrator, $2
/// machine, $3 limit), so the benchmark can hand pgbench exactly this statement.
pub fn claim_next_sql() -> String {
    claim_next_routed(&Route::default(), &mut vec![])
}

/// [`claim_next_sql`] for a machine with `route`, whose names become parameters after
/// `values` ($1 orchestrator, $2 machine, $3 limit).
fn claim_next_routed(route: &Route, values: &mut Vec<Value>) -> String {
    format!("WITH picked AS MATERIALIZED ({PICK}) {CLAIM_PICKED}")
        .replace("{LIMIT}", "$3")
        .replace("{ROUTE}", &route.sql(values))
        .replace("{CLAIM_COLUMNS}", CLAIM_COLUMNS)
}

/// [`claim_next_sql`] as PostgreSQL receives it.
pub fn claim_next_sql_postgres() -> String {
    postgres_dialect(&claim_next_sql())
}

/// The state predicates both dialects share.
fn states(sql: &str) -> String {
    sql.replace("{CLAIMABLE}", &state_in(&JobState::CLAIMABLE))
        .replace("{RUNNING}", &state_in(&[JobState::Running]))
        .replace("{FINISHED}", &state_in(&JobState::FINISHED))
        .replace("{REQUEUEABLE}", &state_in(&JobState::REQUEUEABLE))
        .replace("{LIVE}", &state_in(&JobState::LIVE))
}

/// `run_at` as RFC 3339 (UTC), for history details.
const PG_RUN_AT_ISO: &str =
    "to_char(to_timestamp(run_at / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')";
const SQLITE_RUN_AT_ISO: &str = "strftime('%Y-%m-%dT%H:%M:%SZ', run_at / 1000, 'unixepoch')";

/// The retry backoff of the row's current attempt, in ms: `base * 2^(attempts-1)`, capped,
/// times the jitter factor `$j`. The job's own values win; `$b`/`$m` are the runner's. Integer
/// shifts and CASE keep it the same SQL on both backends (SQLite has no `power`).
fn backoff_ms(b: &str, m: &str, j: &str) -> String {
    let base = format!("COALESCE(retry_backoff_ms, {b})");
    let cap = format!("COALESCE(retry_backoff_max_ms, {m})");
    let raw = format!(
        "({base} * (CAST(1 AS BIGINT) << (CASE WHEN attempts > 31 THEN 30 WHEN attempts < 1 THEN 0 \
         ELSE attempts - 1 END)))"
    );
    format!("CAST((CASE WHEN {raw} > {cap} THEN {cap} ELSE {raw} END) * {j} AS BIGINT)")
}

/// `CASE` of the state a job ends a claim in: `cancelled` when a cancel was asked for, else
/// `otherwise` (an SQL expression). Every statement that ends a claim uses it, so a cancel
/// that was accepted is never overwritten by a completion, a retry or a hand-off.
fn unless_cancelled(otherwise: &str) -> String {
    format!("CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE {otherwise} END")
}

/// The history kind over a changed row: `cancelled` if it ended cancelled, `dead` if dead,
/// else `other`.
fn kind_of_end(other: &str) -> String {
    format!(
        "CASE WHEN state = 'cancelled' THEN '{}' WHEN state = 'dead' THEN '{}' ELSE '{other}' END",
        event::CANCELLED,
        event::DEAD
    )
}

fn postgres_dialect(sql: &str) -> String {
    states(sql)
        .replace("{NOW}", PG_NOW)
        .replace("{SKIP_LOCKED}", "FOR UPDATE SKIP LOCKED")
        .replace("{RUN_AT_ISO}", PG_RUN_AT_ISO)
        .replace("{REQUIRES_EACH}", "jsonb_array_elements_text(dispatch_queue.requires::jsonb) AS r(value)")
}

/// What a machine may pick: jobs with no repo or one of `repos`, and jobs whose `requires`
/// labels are all among `labels`. It is part of the pick's WHERE, so the pick stays one
/// herd-free statement; the repo and label names are parameters, never SQL.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Route {
    pub repos: Vec<String>,
    pub labels: Vec<String>,
}

impl Route {
    /// The routing predicate over `dispatch_queue`; the names become parameters after `values`.
    fn sql(&self, values: &mut Vec<Value>) -> String {
        let mut list = |names: &[String]| -> String {
            let ph: Vec<String> = names
                .iter()
                .map(|n| {
                    values.push(n.clone().into());
                    format!("${}", values.len())
                })
                .collect();
            ph.join(", ")
        };
        let repo = if self.repos.is_empty() {
            "dispatch_queue.repo IS NULL".to_string()
        } else {
            format!("(dispatch_queue.repo IS NULL OR dispatch_queue.repo IN ({}))", list(&self.repos))
        };
        let requires = if self.labels.is_empty() {
            "dispatch_queue.requires IS NULL".to_string()
        } else {
            format!(
                "(dispatch_queue.requires IS NULL OR NOT EXISTS (SELECT 1 FROM {{REQUIRES_EACH}} WHERE r.value NOT IN ({})))",
                list(&self.labels)
            )
        };
        format!("{repo} AND {requires}")
    }

    /// Why a machine with this route cannot take a job of `repo` needing `requires`.
    pub fn refuses(&self, repo: Option<&str>, requires: &[String]) -> Option<String> {
        if let Some(r) = repo.filter(|r| !self.repos.iter().any(|x| x == r)) {
            return Some(format!("repo {r}"));
        }
        let missing: Vec<&str> = requires.iter().filter(|l| !self.labels.contains(l)).map(String::as_str).collect();
        (!missing.is_empty()).then(|| format!("label {}", missing.join(", ")))
    }
}

/// A JSON array of names, or NULL for none.
fn names_json(names: &[String]) -> Option<String> {
    (!names.is_empty()).then(|| serde_json::Value::from(names.to_vec()).to_string())
}

/// A JSON array column as names (NULL or unreadable: none).
fn names_of(col: Option<String>) -> Vec<String> {
    col.and_then(|c| serde_json::from_str(&c).ok()).unwrap_or_default()
}

fn presence_values(p: &Presence<'_>) -> Vec<Value> {
    vec![
        p.orchestrator_id.into(),
        p.machine.into(),
        p.status.into(),
        p.dispatch_enabled.into(),
        p.paused_until.into(),
        p.running.into(),
        p.concurrency.into(),
        p.problem.map(str::to_string).into(),
        p.route.and_then(|r| names_json(&r.repos)).into(),
        p.route.and_then(|r| names_json(&r.labels)).into(),
        p.order.map(|(run, _)| run).into(),
        p.order.map(|(_, seq)| seq).into(),
    ]
}

/// The history row that a state change writes with itself, as SQL over the changed row
/// (its columns after the change), so both backends compute it the same way.
#[derive(Clone, Debug)]
struct History<'a> {
    /// An SQL expression for `kind`, e.g. `'completed'` or a CASE on the new state.
    kind: &'a str,
    /// The machine to name; `None` names the row's `claimed_by`.
    machine: Option<&'a str>,
    detail: Detail,
}

#[derive(Clone, Debug)]
enum Detail {
    None,
    /// `attempt N` (a claim's detail).
    Attempt,
    Text(String),
    /// An SQL expression over the changed row (built here, never from user text).
    Expr(String),
}

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
    fn of_state(state: &str) -> Self {
        match JobState::parse(state) {
            Some(JobState::Dead) => FailOutcome::Dead,
            Some(JobState::Cancelled) => FailOutcome::Cancelled,
            _ => FailOutcome::WillRetry,
        }
    }

    fn of_event(kind: &str) -> Self {
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

/// Why no online machine can take a job of `repo` needing `requires` (`None`: one can).
pub fn unroutable(repo: Option<&str>, requires: &[String], machines: &[MachineRow]) -> Option<String> {
    let online: Vec<&MachineRow> = machines.iter().filter(|m| m.online()).collect();
    if online.is_empty() {
        return (repo.is_some() || !requires.is_empty()).then(|| "no machine is online".to_string());
    }
    let reasons: Vec<String> = online.iter().filter_map(|m| m.route().refuses(repo, requires)).collect();
    if reasons.len() < online.len() {
        return None;
    }
    // Name the first reason: every online machine refuses it for one.
    Some(format!("no online machine has {}", reasons[0]))
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

/// What a machine reports about itself.
#[derive(Clone, Debug)]
pub struct Presence<'a> {
    pub orchestrator_id: &'a str,
    pub machine: &'a str,
    pub status: &'a str,
    pub dispatch_enabled: bool,
    pub paused_until: Option<i64>,
    pub running: i32,
    pub concurrency: i32,
    /// Why this machine is not claiming (e.g. its agent program is missing).
    pub problem: Option<&'a str>,
    /// What it can take (for `status`: which queued jobs no online machine can run).
    pub route: Option<&'a Route>,
    /// This run of the machine and the number of this write in it: a write lands only
    /// after the earlier ones of its run (see `PRESENCE_UPSERT`). `None`: always lands.
    pub order: Option<(i64, i64)>,
}

/// What a poll does besides claiming; see [`Queue::claim_next_with`].
#[derive(Clone, Debug, Default)]
pub struct PollExtras<'a> {
    /// Write this machine's presence row in the same statement.
    pub presence: Option<Presence<'a>>,
    /// Ask whether any of the orchestrator's leases is older than this.
    pub stale_after: Option<Duration>,
    /// What this machine may pick (none: only jobs with no repo and no labels).
    pub route: Option<&'a Route>,
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

/// The queue, over one sea-orm connection pool (PostgreSQL or SQLite).
#[derive(Clone, Debug)]
pub struct Queue {
    db: DatabaseConnection,
    backend: DbBackend,
    /// The bound on every call (see [`Queue::with_call_timeout`]).
    bound: Duration,
    /// A reconnect is under way in the background (see [`Queue::reconnect_in_background`]).
    reconnecting: Arc<AtomicBool>,
    /// Behind a transaction-mode pooler: statements go over the simple protocol (see
    /// [`Queue::pooled`]). Shared by the clones, so what one call learns all of them know.
    pooled: Arc<AtomicBool>,
}

/// The longest dedupe key, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// When a new job may first be claimed (on the database clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Start {
    #[default]
    Now,
    /// At this time, in milliseconds since the epoch.
    At(i64),
    /// This long after the database receives the job.
    After(Duration),
}

/// A retry backoff: attempt n waits `base * 2^(n-1)`, at most `max`, with ±10 % jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Backoff {
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    #[serde(with = "humantime_serde")]
    pub max: Duration,
}

impl Backoff {
    pub const DEFAULT: Backoff = Backoff { base: Duration::from_secs(30), max: Duration::from_secs(3600) };

    /// Refuses a backoff the statements cannot compute (zero, or past 30 days).
    pub fn validate(&self) -> Result<()> {
        let month = Duration::from_secs(30 * 86_400);
        if self.base.is_zero() || self.base > month || self.max > month * 12 {
            return Err(Error::Invalid(
                "the retry backoff must be between 1 ms and 30 days (its cap at most a year)".into(),
            ));
        }
        if self.max < self.base {
            return Err(Error::Invalid("the retry backoff's maximum must not be below its base".into()));
        }
        Ok(())
    }

    /// The wait after failed attempt `attempt` (1-based), before jitter.
    pub fn delay(&self, attempt: i32) -> Duration {
        let shift = attempt.clamp(1, 31) as u32 - 1;
        Ord::min(self.base.saturating_mul(1u32 << Ord::min(shift, 30)), self.max)
    }

    fn ms(&self) -> (i64, i64) {
        (millis(self.base), millis(self.max))
    }
}

/// ±10 %, so jobs that failed together do not come back together.
fn jitter() -> f64 {
    use rand::Rng;
    rand::rng().random_range(0.9..=1.1)
}

/// A non-negative count of milliseconds as a duration.
fn ms_duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Jobs added to the queue carry these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOptions {
    /// Attempts before the job is dead; stored on the row, read by the sweep and the fail path.
    pub max_attempts: i32,
    /// A dedupe key: while a job with this key is live on the orchestrator, no other is added.
    pub key: Option<String>,
    /// Higher runs first.
    pub priority: i32,
    pub start: Start,
    /// The job's own retry backoff; `None` leaves it to the runner's setting.
    pub backoff: Option<Backoff>,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self { max_attempts: 3, key: None, priority: 0, start: Start::Now, backoff: None }
    }
}

impl JobOptions {
    fn validate(&self) -> Result<()> {
        if self.max_attempts < 1 {
            return Err(Error::Invalid("max attempts must be at least 1".into()));
        }
        if let Some(k) = &self.key {
            validate_key(k)?;
        }
        if let Some(b) = &self.backoff {
            b.validate()?;
        }
        Ok(())
    }

    /// `(absolute ms, delay ms)` for the insert's `COALESCE($abs, {NOW} + $delay)`.
    fn start_values(&self) -> (Option<i64>, i64) {
        match self.start {
            Start::Now => (None, 0),
            Start::At(ms) => (Some(ms), 0),
            Start::After(d) => (None, millis(d)),
        }
    }
}

/// A dedupe key is non-empty, printable and at most [`MAX_KEY_LEN`] bytes.
pub fn validate_key(key: &str) -> Result<()> {
    if key.trim().is_empty() {
        return Err(Error::Invalid("the key must not be empty".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::Invalid(format!(
            "the key is {} bytes long; at most {MAX_KEY_LEN} are allowed (hash a longer identifier)",
            key.len()
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::Invalid("the key must not contain control characters".into()));
    }
    Ok(())
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

/// Why an agent asked to be tried later, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    /// At this time (ms since the epoch).
    At(i64),
    /// This long from now (database clock).
    In(Duration),
    /// After the job's retry backoff.
    Backoff,
}

/// How long finished work is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Completed and cancelled jobs, with their history.
    pub finished: Duration,
    /// Dead jobs, with their history.
    pub dead: Duration,
    /// Machines not seen for this long.
    pub machines: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        let day = Duration::from_secs(86_400);
        Self { finished: day * 14, dead: day * 30, machines: day * 30 }
    }
}

/// What a prune deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub jobs: u64,
    pub machines: u64,
}

impl Queue {
    pub fn new(db: DatabaseConnection) -> Self {
        let backend = db.get_database_backend();
        Self { db, backend, bound: Duration::from_secs(30), reconnecting: Arc::default(), pooled: Arc::default() }
    }

    /// The same queue in pooled mode (or not): for PostgreSQL behind a transaction-mode pooler
    /// (PgBouncer 1.18, Supabase's or Neon's pooled endpoints), which may give each
    /// transaction another server connection. Nothing is prepared then: each statement goes
    /// over the simple query protocol with its values written inline as escaped literals,
    /// one round trip, as drivers do for such poolers (pgx's simple protocol, libpq's
    /// PQexec). Every statement of this module is one statement on PostgreSQL (history rides
    /// in a CTE), so none needs a transaction across round trips.
    ///
    /// Unprepared is the safe side: through a transaction pooler a prepared statement's Bind
    /// may reach a server where another client prepared a statement of the same name, and run
    /// that. So the CLI's commands and a machine start this way, and a machine prepares only
    /// once its LISTEN has heard its own probe ([`crate::listen::Hint::Direct`]). A queue that
    /// prepares and still meets a pooler's symptom (a prepared statement that already exists,
    /// or has vanished) switches back, and says so in the log. No-op on SQLite.
    pub fn pooled(self, on: bool) -> Self {
        self.set_pooled(on);
        self
    }

    /// Switches this queue and its clones to pooled mode (or back).
    pub fn set_pooled(&self, on: bool) {
        self.pooled.store(on && self.backend == DbBackend::Postgres, Ordering::SeqCst);
    }

    /// Whether statements go unprepared (see [`Queue::pooled`]).
    pub fn is_pooled(&self) -> bool {
        self.pooled.load(Ordering::Relaxed)
    }

    /// The same queue with every call bounded by `bound`: a statement (or a transaction on
    /// SQLite) that has not answered by then fails with [`Error::Timeout`]. A machine sets this
    /// below its heartbeat, so a silent network (no RST, every query just hangs) is noticed
    /// within one heartbeat.
    pub fn with_call_timeout(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    pub fn backend(&self) -> DbBackend {
        self.backend
    }

    fn now(&self) -> &'static str {
        match self.backend {
            DbBackend::Postgres => PG_NOW,
            _ => SQLITE_NOW,
        }
    }

    /// Builds a statement from this module's SQL dialect: `$n` placeholders, `{NOW}` for the
    /// database clock, `{SKIP_LOCKED}` where PostgreSQL should skip rows others hold, and the
    /// state sets of [`JobState`]. SQLite serialises writers, so it needs no SKIP LOCKED and
    /// takes `?n` placeholders.
    fn stmt(&self, sql: &str, values: Vec<Value>) -> Statement {
        let sql = match self.backend {
            DbBackend::Postgres => postgres_dialect(sql),
            _ => states(sql)
                .replace("{NOW}", SQLITE_NOW)
                .replace("{SKIP_LOCKED}", "")
                .replace("{RUN_AT_ISO}", SQLITE_RUN_AT_ISO)
                .replace("{REQUIRES_EACH}", "json_each(dispatch_queue.requires) AS r")
                .replace('$', "?"),
        };
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    /// Runs `call` within this queue's bound.
    async fn bounded<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.bound, call).await {
            Ok(answer) => answer,
            Err(_) => {
                self.reconnect_in_background();
                Err(Error::Timeout(self.bound))
            }
        }
    }

    /// A call cut at its bound may have been waiting for a connection to be established (after
    /// a database restart, or on a loaded machine where the password handshake alone takes
    /// longer than the bound): cutting it also cut the connect. So the connect goes on here, in
    /// a task of its own bounded only by the pool's connect timeout, and the next call finds
    /// the connection ready. Without it, forty machines reconnecting at once after a restart
    /// each cut their own handshake short, forever.
    fn reconnect_in_background(&self) {
        if self.reconnecting.swap(true, Ordering::SeqCst) {
            return;
        }
        let (db, flag) = (self.db.clone(), self.reconnecting.clone());
        tokio::spawn(async move {
            if let Err(e) = db.ping().await {
                // Only the kind: a raw driver error is not run through the URL's redaction.
                let kind = Error::from(e).kind();
                tracing::debug!(kind, "reconnecting in the background failed; the next call tries again");
            }
            flag.store(false, Ordering::SeqCst);
        });
    }

    async fn query(&self, sql: &str, values: Vec<Value>) -> Result<Vec<QueryResult>> {
        let values = without_nul(values);
        self.bounded(async {
            if !self.is_pooled() {
                match self.db.query_all_raw(self.stmt(sql, values.clone())).await {
                    Err(e) if self.pooler_symptom(&e) => {}
                    answer => return Ok(answer?),
                }
            }
            Ok(crate::db::query_simple(&self.db, self.inlined(sql, &values)).await?)
        })
        .await
    }

    async fn exec(&self, sql: &str, values: Vec<Value>) -> Result<u64> {
        let values = without_nul(values);
        self.bounded(async {
            if !self.is_pooled() {
                match self.db.execute_raw(self.stmt(sql, values.clone())).await {
                    Err(e) if self.pooler_symptom(&e) => {}
                    answer => return Ok(answer?.rows_affected()),
                }
            }
            Ok(crate::db::exec_simple(&self.db, self.inlined(sql, &values)).await?)
        })
        .await
    }

    /// A statement of this module with its values written in (pooled mode, PostgreSQL).
    fn inlined(&self, sql: &str, values: &[Value]) -> String {
        crate::db::inline_values(&postgres_dialect(sql), values)
    }

    /// Whether `e` is what a transaction-mode pooler does to prepared statements: SQLSTATE
    /// 42P05 (`prepared statement "sqlx_s_1" already exists`: another client prepared it on
    /// this server) or 26000 (it was prepared on another server). Either fails at Parse or
    /// Bind, before anything ran, so the statement is safe to send again unprepared. If so,
    /// this queue (and its clones) switch to pooled mode for good.
    fn pooler_symptom(&self, e: &sea_orm::DbErr) -> bool {
        if self.backend != DbBackend::Postgres || !crate::error::is_prepared_statement_error(e) {
            return false;
        }
        if !self.pooled.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "the database connection goes through a transaction-mode pooler (a prepared statement \
                 was found on the wrong server): switching to pooled mode, with no prepared statements \
                 and no LISTEN; add pooled=true to the database URL to start that way"
            );
        }
        true
    }

    /// A state change and its history, committed together. `update` is an UPDATE whose
    /// RETURNING names at least `id, orchestrator_id, claim_token, claimed_by, state`; the
    /// rows it returns are the answer. On PostgreSQL the history INSERT rides in the same
    /// statement as a data-modifying CTE over the returned rows. SQLite has no such CTEs, so
    /// the UPDATE and the INSERT run in one short transaction: the INSERT reads the changed
    /// rows back, which inside the transaction are exactly what the UPDATE left.
    async fn change(&self, update: &str, mut values: Vec<Value>, h: &History<'_>) -> Result<Vec<QueryResult>> {
        if self.backend == DbBackend::Postgres {
            values.push(h.machine.map(str::to_string).into());
            let machine = format!("COALESCE(${}, claimed_by)", values.len());
            let detail = h.detail.sql(&mut values);
            let sql = format!(
                "WITH changed AS ({update}), history AS (
                    INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
                    SELECT id, orchestrator_id, {kind}, {machine}, claim_token, {detail}, {{NOW}} FROM changed)
                 SELECT * FROM changed",
                kind = h.kind
            );
            return self.query(&sql, values).await;
        }
        self.bounded(async {
            let txn = self.db.begin().await?;
            let rows = txn.query_all_raw(self.stmt(update, values)).await?;
            if !rows.is_empty() {
                txn.execute_raw(self.history_of(&ids_of(&rows)?, h)).await?;
            }
            txn.commit().await?;
            Ok(rows)
        })
        .await
    }

    /// SQLite's half of [`Queue::change`]: the history of rows `ids` as they are now.
    fn history_of(&self, ids: &[i64], h: &History<'_>) -> Statement {
        let mut values: Vec<Value> = vec![h.machine.map(str::to_string).into()];
        let detail = h.detail.sql(&mut values);
        let first = values.len();
        let list: Vec<String> = (0..ids.len()).map(|i| format!("${}", first + i + 1)).collect();
        values.extend(ids.iter().map(|id| Value::from(*id)));
        let sql = format!(
            "INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
             SELECT id, orchestrator_id, {kind}, COALESCE($1, claimed_by), claim_token, {detail}, {{NOW}}
               FROM dispatch_queue WHERE id IN ({list})",
            kind = h.kind,
            list = list.join(", ")
        );
        self.stmt(&sql, values)
    }

    /// Sends an empty NOTIFY on `channel`: the LISTEN probe's (see [`crate::listen`]), on this
    /// queue's pool, so that the probe costs a machine no connection of its own.
    pub async fn notify(&self, channel: &str) -> Result<()> {
        self.query("SELECT pg_notify($1, '') IS NULL AS sent", vec![channel.into()]).await.map(drop)
    }

    /// The database clock, in milliseconds since the epoch.
    pub async fn now_ms(&self) -> Result<i64> {
        let rows = self.query("SELECT {NOW} AS now", vec![]).await?;
        first_i64(&rows, "now")
    }

    // ---------------------------------------------------------------- enqueue

    /// Adds a job with the default options. The payload must be a JSON object or array; its
    /// `title` (or `identifier`) becomes the job's label.
    pub async fn enqueue(&self, orchestrator_id: &str, payload: &serde_json::Value) -> Result<i64> {
        self.enqueue_with(orchestrator_id, payload, JobOptions::default()).await
    }

    /// Adds a job with `opts`; the id of the job added, or of the live job with the same key.
    pub async fn enqueue_with(
        &self,
        orchestrator_id: &str,
        payload: &serde_json::Value,
        opts: JobOptions,
    ) -> Result<i64> {
        Ok(self.enqueue_keyed(orchestrator_id, payload, &opts).await?.id)
    }

    /// Adds a job, or, when `opts.key` names a live job of this orchestrator, adds nothing and
    /// says which job that is. "Live" is the partial unique index `dispatch_queue_live_key`:
    /// the insert is `ON CONFLICT DO NOTHING`, never a read-then-insert, so two producers
    /// racing with the same key add one job. The read that follows a conflict names the
    /// winner; if that job finished in between, the insert is simply tried again.
    pub async fn enqueue_keyed(
        &self,
        orchestrator_id: &str,
        payload: &serde_json::Value,
        opts: &JobOptions,
    ) -> Result<Enqueued> {
        validate_orchestrator(orchestrator_id)?;
        opts.validate()?;
        let routes = check_payloads(std::slice::from_ref(payload))?;
        for _ in 0..5 {
            let (sql, values) = insert_jobs(orchestrator_id, std::slice::from_ref(payload), &routes, opts);
            if let Some(id) = ids_of(&self.query(&sql, values).await?)?.first() {
                return Ok(Enqueued { id: *id, existing: None });
            }
            let Some(key) = &opts.key else { break };
            let rows = self
                .query(
                    "SELECT id, state FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND unique_key = $2 AND unique_key IS NOT NULL AND {LIVE}",
                    vec![orchestrator_id.into(), key.clone().into()],
                )
                .await?;
            if let Some(r) = rows.first() {
                let state = JobState::parse(&r.try_get::<String>("", "state")?).unwrap_or(JobState::Queued);
                return Ok(Enqueued { id: r.try_get("", "id")?, existing: Some(state) });
            }
        }
        Err(Error::Invalid("the job could not be added: its key kept changing hands; try again".into()))
    }

    /// Adds many jobs with the default options.
    pub async fn enqueue_many(&self, orchestrator_id: &str, payloads: &[serde_json::Value]) -> Result<Vec<i64>> {
        self.enqueue_many_with(orchestrator_id, payloads, JobOptions::default()).await
    }

    /// Adds many jobs in one statement (in chunks that stay under bind-parameter limits).
    /// A key names one job, so `opts.key` must be unset here.
    pub async fn enqueue_many_with(
        &self,
        orchestrator_id: &str,
        payloads: &[serde_json::Value],
        opts: JobOptions,
    ) -> Result<Vec<i64>> {
        validate_orchestrator(orchestrator_id)?;
        opts.validate()?;
        if opts.key.is_some() {
            return Err(Error::Invalid("a key names one job: enqueue keyed jobs one at a time".into()));
        }
        let routes = check_payloads(payloads)?;
        let mut ids = Vec::with_capacity(payloads.len());
        for (chunk, routes) in payloads.chunks(200).zip(routes.chunks(200)) {
            let (sql, values) = insert_jobs(orchestrator_id, chunk, routes, &opts);
            ids.extend(ids_of(&self.query(&sql, values).await?)?);
        }
        ids.sort_unstable();
        Ok(ids)
    }

    // ---------------------------------------------------------------- claims

    /// The article's claim of one known job, through sea-orm's builder:
    ///
    /// ```sql
    /// UPDATE dispatch_queue
    ///    SET state = 'running', claimed_at = {NOW}, heartbeat_at = {NOW}, claimed_by = $3,
    ///        claim_token = claim_token + 1, attempts = attempts + 1
    ///  WHERE id = $1 AND orchestrator_id = $2
    ///    AND claimed_at IS NULL AND state IN ('queued','failed') AND run_at <= {NOW}
    /// RETURNING *
    /// ```
    ///
    /// `Ok(None)` means another machine won (or the job is finished): move on.
    pub async fn claim_by_id(&self, id: i64, orchestrator_id: &str, machine: &str) -> Result<Option<Claim>> {
        let now = Expr::cust(self.now());
        let claimable: Vec<&str> = JobState::CLAIMABLE.iter().map(|s| s.as_str()).collect();
        let update = dq::Entity::update_many()
            .col_expr(dq::Column::State, Expr::value(JobState::Running.as_str()))
            .col_expr(dq::Column::ClaimedAt, now.clone())
            .col_expr(dq::Column::HeartbeatAt, now.clone())
            .col_expr(dq::Column::ClaimedBy, Expr::value(machine))
            .col_expr(dq::Column::ClaimToken, Expr::col(dq::Column::ClaimToken).add(1))
            .col_expr(dq::Column::Attempts, Expr::col(dq::Column::Attempts).add(1))
            .col_expr(dq::Column::ReleaseRequestedAt, Expr::cust("NULL"))
            .filter(dq::Column::Id.eq(id))
            .filter(dq::Column::OrchestratorId.eq(orchestrator_id))
            .filter(dq::Column::ClaimedAt.is_null())
            .filter(dq::Column::State.is_in(claimable))
            .filter(Expr::col(dq::Column::RunAt).lte(now));
        // The builder's UPDATE with the RETURNING that `change` needs: then the claim and its
        // history are one statement on PostgreSQL too.
        let built = update.build(self.backend);
        let sql = format!("{} RETURNING {CLAIM_COLUMNS}", built.sql);
        let rows = self.change(&sql, built.values.map(|v| v.0).unwrap_or_default(), &CLAIMED).await?;
        rows.first().map(claim_from_row).transpose()
    }

    /// Claimable job ids, oldest first: the read half of the article's naive path.
    pub async fn candidates(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<i64>> {
        self.candidates_for(orchestrator_id, limit, &Route::default()).await
    }

    /// [`Queue::candidates`] a machine with `route` may take.
    pub async fn candidates_for(&self, orchestrator_id: &str, limit: u32, route: &Route) -> Result<Vec<i64>> {
        let mut values: Vec<Value> = vec![orchestrator_id.into(), i64::from(limit).into()];
        let sql = format!(
            "SELECT id FROM dispatch_queue
              WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {{CLAIMABLE}} AND run_at <= {{NOW}} AND {}
              ORDER BY priority DESC, run_at, id LIMIT $2",
            route.sql(&mut values)
        );
        ids_of(&self.query(&sql, values).await?)
    }

    /// The herd-free pick-and-claim: up to `limit` of the oldest claimable jobs, in ONE
    /// statement. On PostgreSQL the pick skips rows another claimer has locked, so N machines
    /// take N different rows instead of all fighting over the oldest; on SQLite the statement
    /// runs under the database's single writer lock, which gives the same guarantee.
    pub async fn claim_next(&self, orchestrator_id: &str, machine: &str, limit: u32) -> Result<Vec<Claim>> {
        Ok(self.claim_next_with(orchestrator_id, machine, limit, &PollExtras::default()).await?.claims)
    }

    /// The claim and its history on SQLite ([`Queue::change`]: one short transaction).
    async fn claim_next_sqlite(
        &self,
        orchestrator_id: &str,
        machine: &str,
        limit: u32,
        route: &Route,
    ) -> Result<Vec<Claim>> {
        let mut values = vec![orchestrator_id.into(), machine.into(), i64::from(limit).into()];
        let sql = claim_next_routed(route, &mut values);
        let rows = self.change(&sql, values, &CLAIMED).await?;
        let mut claims = rows.iter().map(claim_from_row).collect::<Result<Vec<_>>>()?;
        claims.sort_by_key(|c| c.id);
        Ok(claims)
    }

    /// [`Queue::claim_next`] plus an idle machine's housekeeping, so that a backed-off poll
    /// is ONE statement on PostgreSQL (a serverless database can then sleep between polls):
    /// the presence upsert rides along as a data-modifying CTE, and the stale-lease test is a
    /// read-only `EXISTS`. The sweep itself stays a separate statement that the caller
    /// spawns only when `stale` says there is something to sweep, so a failing sweep can
    /// still never fail a poll. SQLite has no data-modifying CTEs: there the presence row is
    /// written by its own statement and `stale` is always true when asked (sweep as before).
    ///
    /// On both backends the claims and their "claimed" events commit together.
    pub async fn claim_next_with(
        &self,
        orchestrator_id: &str,
        machine: &str,
        limit: u32,
        extras: &PollExtras<'_>,
    ) -> Result<Polled> {
        let default_route = Route::default();
        let route = extras.route.unwrap_or(&default_route);
        if self.backend != DbBackend::Postgres {
            if let Some(p) = &extras.presence {
                if let Err(e) = self.heartbeat_machine(p).await {
                    tracing::debug!(error = %e, "presence update failed");
                }
            }
            let claims = if limit == 0 {
                vec![]
            } else {
                self.claim_next_sqlite(orchestrator_id, machine, limit, route).await?
            };
            // Its own statement here, so a job that fell due after the claim is due now (a
            // wait of zero), not skipped: on SQLite no NOTIFY would tell.
            let next_due = if (claims.len() as u32) < limit {
                self.next_waiting(orchestrator_id, true, route).await?
            } else {
                None
            };
            return Ok(Polled { claims, stale: extras.stale_after.is_some(), next_due });
        }
        // $1 orchestrator, $2 machine, then the presence values ($3..$12, as in
        // PRESENCE_UPSERT), then the limit and the staleness threshold.
        let mut values: Vec<Value> = vec![orchestrator_id.into(), machine.into()];
        let mut ctes = String::new();
        if let Some(p) = &extras.presence {
            values.extend(presence_values(p).into_iter().skip(2));
            ctes = format!("presence AS ({PRESENCE_UPSERT} RETURNING 1), ");
        }
        values.push(i64::from(limit).into());
        let limit_at = format!("${}", values.len());
        let stale = match extras.stale_after {
            Some(after) => {
                values.push(millis(after).into());
                format!(
                    "EXISTS (SELECT 1 FROM dispatch_queue WHERE orchestrator_id = $1 AND {{RUNNING}}
                               AND COALESCE(heartbeat_at, claimed_at) < {{NOW}} - ${})",
                    values.len()
                )
            }
            None => "false".to_string(),
        };
        let route_sql = route.sql(&mut values);
        let sql = format!(
            "WITH {ctes}picked AS MATERIALIZED ({PICK}), claimed AS ({CLAIM_PICKED}), history AS (
                 INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
                 SELECT id, orchestrator_id, {kind}, $2, claim_token, {detail}, {{NOW}} FROM claimed)
             SELECT c.*, s.stale, s.next_due FROM (SELECT {stale} AS stale,
                    CASE WHEN (SELECT COUNT(*) FROM claimed) < {{LIMIT}} THEN ({NEXT_WAITING} AND run_at > {{NOW}}) END AS next_due) s
               LEFT JOIN claimed c ON true",
            kind = CLAIMED.kind,
            detail = ATTEMPT,
        )
        .replace("{LIMIT}", &limit_at)
        .replace("{ROUTE}", &route_sql)
        .replace("{CLAIM_COLUMNS}", CLAIM_COLUMNS);
        let rows = self.query(&sql, values).await?;
        let (stale, next_due) = match rows.first() {
            Some(r) => (r.try_get("", "stale")?, r.try_get::<Option<i64>>("", "next_due")?),
            None => (false, None),
        };
        let mut claims = vec![];
        for r in &rows {
            if r.try_get::<Option<i64>>("", "id")?.is_some() {
                claims.push(claim_from_row(r)?);
            }
        }
        claims.sort_by_key(|c| c.id);
        Ok(Polled { claims, stale, next_due: next_due.map(ms_duration) })
    }

    /// How long until the next waiting job of the orchestrator is due, if one is waiting.
    pub async fn next_due(&self, orchestrator_id: &str) -> Result<Option<Duration>> {
        self.next_waiting(orchestrator_id, false, &Route::default()).await
    }

    /// [`Queue::next_due`] of the jobs `route` may take; `due_too` also counts jobs that are
    /// due already (a wait of zero).
    async fn next_waiting(&self, orchestrator_id: &str, due_too: bool, route: &Route) -> Result<Option<Duration>> {
        let mut values: Vec<Value> = vec![orchestrator_id.into()];
        let sql = NEXT_WAITING.replace("{ROUTE}", &route.sql(&mut values));
        let sql = if due_too { sql } else { format!("{sql} AND run_at > {{NOW}}") };
        let rows = self.query(&sql, values).await?;
        let ms = match rows.first() {
            Some(r) => r.try_get::<Option<i64>>("", "next_due")?,
            None => None,
        };
        Ok(ms.map(ms_duration))
    }

    // ---------------------------------------------------------------- fenced writes

    /// Renews the leases of the jobs this machine holds, in one statement. Returns the
    /// (id, token) pairs whose lease is still ours; every pair missing from the answer has
    /// been lost. Matching by pair matters: a late answer about an old claim of a job must
    /// never be read as news about a newer claim of the same job.
    pub async fn renew(&self, held: &[(i64, i64)]) -> Result<Vec<(i64, i64)>> {
        Ok(self.renew_leases(held).await?.kept)
    }

    /// [`Queue::renew`], also naming the held jobs whose cancel a user asked for: the holder
    /// learns it from the renewal it sends anyway, with no extra statement.
    pub async fn renew_leases(&self, held: &[(i64, i64)]) -> Result<Renewed> {
        if held.is_empty() {
            return Ok(Renewed::default());
        }
        let (pairs, values) = pair_list(held, 0);
        let rows = self
            .query(
                &format!(
                    "UPDATE dispatch_queue SET heartbeat_at = {{NOW}}
                      WHERE (id, claim_token) IN ({pairs}) AND {{RUNNING}}
                     RETURNING id, claim_token, cancel_requested_at, release_requested_at"
                ),
                values,
            )
            .await?;
        let mut out = Renewed { kept: pairs_of(&rows)?, ..Renewed::default() };
        for r in &rows {
            let pair = (r.try_get("", "id")?, r.try_get("", "claim_token")?);
            if r.try_get::<Option<i64>>("", "cancel_requested_at")?.is_some() {
                out.cancel.push(pair);
            } else if r.try_get::<Option<i64>>("", "release_requested_at")?.is_some() {
                out.release.push(pair);
            }
        }
        Ok(out)
    }

    /// Completes one job if we still own it. `Ok(false)` means the lease was lost and the
    /// completion was rejected (and recorded as such). A job whose cancel was accepted first
    /// ends cancelled, not completed (still `Ok(true)`: the claim ended as it should).
    pub async fn complete(&self, id: i64, token: i64, machine: &str) -> Result<bool> {
        Ok(self.complete_many(&[(id, token)], machine).await?.iter().any(|(p, _)| *p == (id, token)))
    }

    /// Completes many claims in one fenced statement; returns the (id, token) pairs accepted,
    /// each with the state it ended in (`completed`, or `cancelled` when a cancel had been
    /// asked for). Rejected ones (lease lost) get a `completion_rejected` history entry. One
    /// batch may name the same job twice, under an old claim and a new one: only the current
    /// one wins.
    pub async fn complete_many(&self, done: &[(i64, i64)], machine: &str) -> Result<Vec<((i64, i64), JobState)>> {
        if done.is_empty() {
            return Ok(vec![]);
        }
        let (pairs, values) = pair_list(done, 0);
        let update = format!(
            "UPDATE dispatch_queue
                SET state = {ends}, finished_at = {{NOW}}, claimed_at = NULL,
                    completed_at = CASE WHEN cancel_requested_at IS NULL THEN {{NOW}} ELSE NULL END,
                    last_error = CASE WHEN cancel_requested_at IS NULL THEN NULL
                                      ELSE 'cancelled by ' || COALESCE(cancel_requested_by, '?') END
              WHERE (id, claim_token) IN ({pairs}) AND {{RUNNING}}
             RETURNING id, claim_token, orchestrator_id, claimed_by, state",
            ends = unless_cancelled("'completed'")
        );
        let history = History { kind: &kind_of_end(event::COMPLETED), machine: Some(machine), detail: Detail::None };
        let rows = self.change(&update, values, &history).await?;
        let mut accepted = ended_of(&rows)?;
        let mut rejected: Vec<(i64, i64)> =
            done.iter().copied().filter(|p| !accepted.iter().any(|(a, _)| a == p)).collect();
        if !rejected.is_empty() {
            // A retry after a lost reply (say, the server restarted just after committing)
            // finds its own earlier completion: same token, already ended. That is ours.
            let (pairs, values) = pair_list(&rejected, 0);
            let rows = self
                .query(
                    &format!(
                        "SELECT id, claim_token, state FROM dispatch_queue
                          WHERE (id, claim_token) IN ({pairs}) AND state IN ('completed','cancelled')
                            AND claimed_by = ${}",
                        2 * rejected.len() + 1
                    ),
                    values.into_iter().chain([Value::from(machine)]).collect(),
                )
                .await?;
            let ours = ended_of(&rows)?;
            rejected.retain(|p| !ours.iter().any(|(o, _)| o == p));
            accepted.extend(ours);
        }
        for (id, token) in rejected {
            // Not a state change: the only trace of a fenced completion. One try, so that the
            // batch of completions behind this one is not held up by a database that is gone.
            self.note_now(
                id,
                event::COMPLETION_REJECTED,
                machine,
                Some(token),
                "completion fenced: this machine no longer held the lease",
            )
            .await;
        }
        Ok(accepted)
    }

    /// Fails the current attempt if we still own it: claimable again after the retry backoff
    /// (the job's own, else `defaults`), or dead once it has used the job's own
    /// `max_attempts`, or cancelled if a cancel was asked for. `Ok(None)` means the lease was
    /// lost; nothing was written but a note.
    pub async fn fail(&self, id: i64, token: i64, machine: &str, error: &str) -> Result<Option<FailOutcome>> {
        self.fail_with(id, token, machine, error, Backoff::DEFAULT).await
    }

    /// [`Queue::fail`] with the runner's backoff for jobs that carry none.
    pub async fn fail_with(
        &self,
        id: i64,
        token: i64,
        machine: &str,
        error: &str,
        defaults: Backoff,
    ) -> Result<Option<FailOutcome>> {
        let (base, max) = defaults.ms();
        let ends = unless_cancelled("CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'failed' END");
        let finished = "(cancel_requested_at IS NOT NULL OR attempts >= max_attempts)";
        let dead = "(cancel_requested_at IS NULL AND attempts >= max_attempts)";
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends},
                            dead_at = CASE WHEN {dead} THEN {{NOW}} ELSE NULL END,
                            finished_at = CASE WHEN {finished} THEN {{NOW}} ELSE NULL END,
                            run_at = CASE WHEN {finished} THEN run_at ELSE {{NOW}} + {backoff} END,
                            failed_at = {{NOW}}, claimed_at = NULL, last_error = $3
                      WHERE id = $1 AND claim_token = $2 AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                    backoff = backoff_ms("$4", "$5", "$6")
                ),
                vec![id.into(), token.into(), truncate(error, 2000).into(), base.into(), max.into(), jitter().into()],
                &History {
                    kind: &kind_of_end(event::FAILED),
                    machine: Some(machine),
                    detail: Detail::Text(truncate(error, 500)),
                },
            )
            .await?;
        let Some(row) = rows.first() else {
            // A retry whose first try committed but lost its answer finds its own event.
            let kinds = [event::FAILED, event::DEAD, event::CANCELLED];
            if let Some(kind) = self.own_event(id, token, machine, &kinds).await? {
                return Ok(Some(FailOutcome::of_event(&kind)));
            }
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "failure not recorded: lease lost").await;
            return Ok(None);
        };
        Ok(Some(FailOutcome::of_state(&row.try_get::<String>("", "state")?)))
    }

    /// Parks the current attempt (the agent exited 75, "try later"): handed back without
    /// counting the attempt, claimable again at `after`. A job whose cancel was asked for ends
    /// cancelled instead. `Ok(None)` means the lease was lost. On success, the database time
    /// (ms) from which the job is claimable again.
    pub async fn park(
        &self,
        id: i64,
        token: i64,
        machine: &str,
        after: RetryAfter,
        defaults: Backoff,
    ) -> Result<Option<(JobState, i64)>> {
        let (base, max) = defaults.ms();
        let (at, wait): (Option<i64>, Option<i64>) = match after {
            RetryAfter::At(ms) => (Some(ms), None),
            RetryAfter::In(d) => (None, Some(millis(d))),
            RetryAfter::Backoff => (None, None),
        };
        let why = match after {
            RetryAfter::At(_) | RetryAfter::In(_) => "the agent asked to be tried later (exit 75, retry_after)",
            RetryAfter::Backoff => "the agent asked to be tried later (exit 75; no retry_after, so the retry backoff)",
        };
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends},
                            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {{NOW}} ELSE NULL END,
                            run_at = CASE WHEN cancel_requested_at IS NOT NULL THEN run_at
                                          WHEN COALESCE($3, {{NOW}} + COALESCE($4, {backoff})) < {{NOW}} THEN {{NOW}}
                                          ELSE COALESCE($3, {{NOW}} + COALESCE($4, {backoff})) END,
                            claimed_at = NULL, attempts = attempts - 1, last_error = $8
                      WHERE id = $1 AND claim_token = $2 AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state, run_at",
                    ends = unless_cancelled("'queued'"),
                    backoff = backoff_ms("$5", "$6", "$7"),
                ),
                vec![
                    id.into(),
                    token.into(),
                    at.into(),
                    wait.into(),
                    base.into(),
                    max.into(),
                    jitter().into(),
                    why.into(),
                ],
                &History {
                    kind: &kind_of_end(event::PARKED),
                    machine: Some(machine),
                    detail: Detail::Expr(format!(
                        "CASE WHEN state = 'cancelled' THEN 'cancelled: a cancel was asked for' \
                         ELSE '{why}; claimable again at ' || {{RUN_AT_ISO}} END"
                    )),
                },
            )
            .await?;
        let Some(row) = rows.first() else {
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "park not recorded: lease lost").await;
            return Ok(None);
        };
        let state = JobState::parse(&row.try_get::<String>("", "state")?).unwrap_or(JobState::Queued);
        Ok(Some((state, row.try_get("", "run_at")?)))
    }

    /// Keeps what the agent said it did (its result file) on the job, if we still hold it.
    pub async fn record_result(&self, id: i64, token: i64, summary: Option<&str>, url: Option<&str>) -> Result<bool> {
        let n = self
            .exec(
                "UPDATE dispatch_queue SET summary = $3, result_url = $4
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING}",
                vec![
                    id.into(),
                    token.into(),
                    summary.map(|s| truncate(s, 4000)).into(),
                    url.map(|s| truncate(s, 2000)).into(),
                ],
            )
            .await?;
        Ok(n > 0)
    }

    /// Says where the job's kept worktree is (`machine:path (why)`), if we still hold it.
    pub async fn record_worktree(&self, id: i64, token: i64, worktree: &str) -> Result<bool> {
        let n = self
            .exec(
                "UPDATE dispatch_queue SET worktree = $3 WHERE id = $1 AND claim_token = $2 AND {RUNNING}",
                vec![id.into(), token.into(), truncate(worktree, 1000).into()],
            )
            .await?;
        Ok(n > 0)
    }

    /// A branch pushed after its hand-off could not push: the job resumes from it, if it is
    /// still waiting for a machine and names no newer branch. History says so either way.
    pub async fn resume_later(&self, id: i64, branch: &str, machine: &str) -> Result<bool> {
        let rows = self
            .change(
                "UPDATE dispatch_queue SET resume_branch = $2, resumed_from = $3
                  WHERE id = $1 AND claimed_at IS NULL AND {CLAIMABLE} AND resume_branch IS NULL
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into(), branch.into(), machine.into()],
                &History {
                    kind: &format!("'{}'", event::WORK_PUSHED),
                    machine: Some(machine),
                    detail: Detail::Text(format!(
                        "work in progress pushed later to {branch}; the next claim resumes it"
                    )),
                },
            )
            .await?;
        if rows.is_empty() {
            let detail = format!("work in progress pushed later to {branch}");
            self.note(id, event::WORK_PUSHED, machine, None, &detail).await;
        }
        Ok(!rows.is_empty())
    }

    /// Stores the tail of a running job's agent log, fenced by claim token: a machine that
    /// lost the claim cannot overwrite the new holder's log.
    pub async fn store_log_tail(&self, id: i64, token: i64, machine: &str, tail: &str) -> Result<bool> {
        let n = self
            .exec(
                "INSERT INTO job_logs (job_id, orchestrator_id, claim_token, machine, tail, updated_at)
                 SELECT id, orchestrator_id, claim_token, $3, $4, {NOW} FROM dispatch_queue
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING}
                 ON CONFLICT (job_id) DO UPDATE SET
                     claim_token = excluded.claim_token, machine = excluded.machine,
                     tail = excluded.tail, updated_at = excluded.updated_at",
                vec![id.into(), token.into(), machine.into(), tail.into()],
            )
            .await?;
        Ok(n > 0)
    }

    /// The stored tail of a job's agent log, if its holder stored one.
    pub async fn log_tail(&self, id: i64) -> Result<Option<LogTail>> {
        let rows = self
            .query(
                "SELECT machine, claim_token, tail, updated_at, {NOW} AS now FROM job_logs WHERE job_id = $1",
                vec![id.into()],
            )
            .await?;
        let Some(r) = rows.first() else { return Ok(None) };
        Ok(Some(LogTail {
            machine: r.try_get("", "machine")?,
            claim_token: r.try_get("", "claim_token")?,
            tail: r.try_get("", "tail")?,
            updated_at: r.try_get("", "updated_at")?,
            now: r.try_get("", "now")?,
        }))
    }

    /// The states of jobs `ids` (a job that is gone is missing from the answer).
    pub async fn job_states(&self, ids: &[i64]) -> Result<Vec<(i64, JobState)>> {
        let mut out = vec![];
        for chunk in ids.chunks(500) {
            let list: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let values = chunk.iter().map(|i| Value::from(*i)).collect();
            let sql = format!("SELECT id, state FROM dispatch_queue WHERE id IN ({})", list.join(", "));
            for r in self.query(&sql, values).await? {
                let state = JobState::parse(&r.try_get::<String>("", "state")?).unwrap_or(JobState::Queued);
                out.push((r.try_get("", "id")?, state));
            }
        }
        Ok(out)
    }

    /// Ends a claim whose cancel was asked for, after its holder stopped the agent. History
    /// names the holder (who stopped it) and, in the detail, who asked.
    pub async fn finish_cancel(&self, id: i64, token: i64, machine: &str) -> Result<bool> {
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = 'cancelled', finished_at = {NOW}, claimed_at = NULL,
                        last_error = 'cancelled by ' || COALESCE(cancel_requested_by, '?')
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING} AND cancel_requested_at IS NOT NULL
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, cancel_requested_by",
                vec![id.into(), token.into()],
                &History {
                    kind: "'cancelled'",
                    machine: Some(machine),
                    detail: Detail::Expr(
                        "'agent stopped on ' || COALESCE(claimed_by, '?') || '; cancel asked by ' \
                         || COALESCE(cancel_requested_by, '?')"
                            .into(),
                    ),
                },
            )
            .await?;
        if rows.is_empty() {
            return Ok(self.own_event(id, token, machine, &[event::CANCELLED]).await?.is_some());
        }
        Ok(true)
    }

    /// Hands a job back so another machine can take it at once. The attempt is not counted
    /// against the job: handing off is a choice, not a failure. A job whose cancel was asked
    /// for ends cancelled instead.
    pub async fn release(&self, id: i64, token: i64, machine: &str, reason: &str) -> Result<bool> {
        self.release_with(id, token, machine, reason, None).await
    }

    /// [`Queue::release`] that also names the branch the work in progress was pushed to
    /// (`resume`), in the same fenced statement: the job is claimable only once its work is
    /// on the remote, and the next claimer resumes from it.
    pub async fn release_with(
        &self,
        id: i64,
        token: i64,
        machine: &str,
        reason: &str,
        resume: Option<&str>,
    ) -> Result<bool> {
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends}, claimed_at = NULL, attempts = attempts - 1,
                            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {{NOW}} ELSE NULL END,
                            resume_branch = COALESCE($3, resume_branch),
                            resumed_from = CASE WHEN $3 IS NULL THEN resumed_from ELSE claimed_by END,
                            release_requested_at = NULL
                      WHERE id = $1 AND claim_token = $2 AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                    ends = unless_cancelled("'queued'")
                ),
                vec![id.into(), token.into(), resume.map(str::to_string).into()],
                &History {
                    kind: &kind_of_end(event::HANDED_OFF),
                    machine: Some(machine),
                    detail: Detail::Text(reason.to_string()),
                },
            )
            .await?;
        if rows.is_empty() {
            // A retry whose first try committed but lost its answer finds its own hand-off.
            if self.own_event(id, token, machine, &[event::HANDED_OFF, event::CANCELLED]).await?.is_some() {
                return Ok(true);
            }
            let detail = format!("release not needed: lease already lost ({reason})");
            self.note_now(id, event::LEASE_LOST, machine, Some(token), &detail).await;
            return Ok(false);
        }
        Ok(true)
    }

    /// The kind of this machine's own history event for claim (id, token) among `kinds`, if
    /// there is one. History commits with its state change, so this is exact.
    async fn own_event(&self, id: i64, token: i64, machine: &str, kinds: &[&str]) -> Result<Option<String>> {
        let list: Vec<String> = kinds.iter().map(|k| format!("'{k}'")).collect();
        let rows = self
            .query(
                &format!(
                    "SELECT kind FROM job_events
                      WHERE job_id = $1 AND claim_token = $2 AND machine = $3 AND kind IN ({})
                      ORDER BY id DESC LIMIT 1",
                    list.join(",")
                ),
                vec![id.into(), token.into(), machine.into()],
            )
            .await?;
        rows.first().map(|r| r.try_get::<String>("", "kind")).transpose().map_err(Error::from)
    }

    /// Administrative hand-off of everything `machine` holds (for `devpilot release` when
    /// the machine itself cannot do it). The holder's later writes fail its fencing check.
    pub async fn release_machine(&self, orchestrator_id: &str, machine: &str) -> Result<Vec<i64>> {
        self.release_machine_because(orchestrator_id, machine, "released by `devpilot release`").await
    }

    /// Asks `machine` to hand off what it holds (`devpilot release --machine`, from anywhere):
    /// the holder learns it at its next renewal (at once through NOTIFY), pushes the work in
    /// progress and releases. Returns the (id, token) of the claims asked about.
    pub async fn request_release(&self, orchestrator_id: &str, machine: &str, by: &str) -> Result<Vec<(i64, i64)>> {
        let rows = self
            .change(
                "UPDATE dispatch_queue SET release_requested_at = {NOW}, release_requested_by = $3
                  WHERE orchestrator_id = $1 AND claimed_by = $2 AND {RUNNING}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, release_requested_by",
                vec![orchestrator_id.into(), machine.into(), by.into()],
                &History {
                    kind: &format!("'{}'", event::RELEASE_REQUESTED),
                    machine: Some(by),
                    detail: Detail::Expr("'hand-off asked of ' || claimed_by || ' by ' || release_requested_by".into()),
                },
            )
            .await?;
        let mut pairs = pairs_of(&rows)?;
        pairs.sort_unstable();
        Ok(pairs)
    }

    /// Releases the claims `pairs` (fenced by token) whose holder has not renewed since a
    /// release was asked of it: a holder that renewed is handing off (pushing its work in
    /// progress), and releasing under it would make the job claimable before the push. The
    /// ids released.
    pub async fn release_unanswered(&self, pairs: &[(i64, i64)], machine: &str, why: &str) -> Result<Vec<i64>> {
        if pairs.is_empty() {
            return Ok(vec![]);
        }
        let (list, values) = pair_list(pairs, 0);
        let unanswered = format!(
            "(id, claim_token) IN ({list}) AND release_requested_at IS NOT NULL
             AND COALESCE(heartbeat_at, claimed_at) <= release_requested_at"
        );
        self.hand_back(&unanswered, values, machine, why).await
    }

    /// [`Queue::release_machine`] with the history's reason.
    async fn release_machine_because(&self, orchestrator_id: &str, machine: &str, why: &str) -> Result<Vec<i64>> {
        let values = vec![orchestrator_id.into(), machine.into()];
        self.hand_back("orchestrator_id = $1 AND claimed_by = $2", values, machine, why).await
    }

    /// Hands back, without the holder, the running jobs that `filter` selects: the attempt is
    /// not counted, and a job whose cancel was asked for ends cancelled. The ids, sorted.
    async fn hand_back(&self, filter: &str, values: Vec<Value>, machine: &str, why: &str) -> Result<Vec<i64>> {
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends}, claimed_at = NULL, attempts = attempts - 1,
                            finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {{NOW}} ELSE NULL END,
                            release_requested_at = NULL
                      WHERE {filter} AND {{RUNNING}}
                     RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                    ends = unless_cancelled("'queued'")
                ),
                values,
                &History {
                    kind: &kind_of_end(event::HANDED_OFF),
                    machine: Some(machine),
                    detail: Detail::Text(why.into()),
                },
            )
            .await?;
        let mut ids = ids_of(&rows)?;
        ids.sort_unstable();
        Ok(ids)
    }

    // ---------------------------------------------------------------- sweep

    /// Releases every claim whose last sign of life is older than `claim_timeout`; a job that
    /// has used its own `max_attempts` becomes dead instead, and one whose cancel was asked
    /// for becomes cancelled. The staleness test is in this same statement's WHERE, so a
    /// sweep can never touch a fresh claim or a finished job. `orchestrator_id = None` sweeps
    /// every orchestrator (the backstop command).
    pub async fn sweep(&self, orchestrator_id: Option<&str>, claim_timeout: Duration) -> Result<Vec<Swept>> {
        let mut values: Vec<Value> = vec![millis(claim_timeout).into()];
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $2"
            }
            None => "",
        };
        let detail = format!("no heartbeat for {}", humantime::format_duration(claim_timeout));
        let ends = unless_cancelled("CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END");
        let finished = "(cancel_requested_at IS NOT NULL OR attempts >= max_attempts)";
        let dead = "(cancel_requested_at IS NULL AND attempts >= max_attempts)";
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = {ends},
                            dead_at = CASE WHEN {dead} THEN {{NOW}} ELSE NULL END,
                            finished_at = CASE WHEN {finished} THEN {{NOW}} ELSE NULL END,
                            claimed_at = NULL,
                            last_error = 'lease expired: no heartbeat from ' || COALESCE(claimed_by, '?')
                      WHERE {{RUNNING}}
                        AND COALESCE(heartbeat_at, claimed_at) < {{NOW}} - $1
                        {scope}
                     RETURNING id, orchestrator_id, claimed_by, claim_token, state, {{NOW}} AS at"
                ),
                values,
                &History { kind: &kind_of_end(event::SWEPT), machine: None, detail: Detail::Text(detail) },
            )
            .await?;
        let mut swept = Vec::with_capacity(rows.len());
        for r in &rows {
            swept.push(Swept {
                id: r.try_get("", "id")?,
                orchestrator_id: r.try_get("", "orchestrator_id")?,
                previous_holder: r.try_get("", "claimed_by")?,
                token: r.try_get("", "claim_token")?,
                dead: r.try_get::<String>("", "state")? == JobState::Dead.as_str(),
                at: r.try_get("", "at")?,
            });
        }
        swept.sort_by_key(|s| s.id);
        Ok(swept)
    }

    // ---------------------------------------------------------------- retention

    /// Deletes, in batches of at most `batch` jobs (one short statement each, so no lock is
    /// held long), the completed and cancelled jobs finished longer than `r.finished` ago and
    /// the dead ones finished longer than `r.dead` ago, each with its history; then the
    /// machines not seen for `r.machines`. Only finished jobs are touched, so a live job's
    /// history is never deleted. `orchestrator_id = None` prunes every orchestrator.
    pub async fn prune(&self, orchestrator_id: Option<&str>, r: &Retention, batch: u32) -> Result<Pruned> {
        let mut pruned = Pruned::default();
        loop {
            let batch = Ord::max(batch, 1);
            let n = self.prune_batch(orchestrator_id, r, batch).await?;
            pruned.jobs += n;
            if n < u64::from(batch) {
                break;
            }
        }
        let mut values: Vec<Value> = vec![millis(r.machines).into()];
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $2"
            }
            None => "",
        };
        pruned.machines =
            self.exec(&format!("DELETE FROM machines WHERE last_seen_at < {{NOW}} - $1 {scope}"), values).await?;
        Ok(pruned)
    }

    /// One batch of [`Queue::prune`]: how many jobs it deleted.
    async fn prune_batch(&self, orchestrator_id: Option<&str>, r: &Retention, batch: u32) -> Result<u64> {
        let (finished, dead) = (millis(r.finished), millis(r.dead));
        let mut values: Vec<Value> =
            vec![finished.into(), dead.into(), Ord::min(finished, dead).into(), i64::from(batch).into()];
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $5"
            }
            None => "",
        };
        // `{FINISHED} AND finished_at < now - min` lets `dispatch_queue_finished` find them.
        let pick = format!(
            "SELECT id FROM dispatch_queue
              WHERE {{FINISHED}} AND finished_at < {{NOW}} - $3 {scope}
                AND ((state = 'dead' AND finished_at < {{NOW}} - $2)
                     OR (state <> 'dead' AND finished_at < {{NOW}} - $1))
              ORDER BY finished_at, id LIMIT $4"
        );
        if self.backend == DbBackend::Postgres {
            let sql = format!(
                "WITH gone AS (DELETE FROM dispatch_queue
                                WHERE id IN ({pick} FOR UPDATE SKIP LOCKED) AND {{FINISHED}}
                               RETURNING id),
                      events AS (DELETE FROM job_events WHERE job_id IN (SELECT id FROM gone)),
                      logs AS (DELETE FROM job_logs WHERE job_id IN (SELECT id FROM gone))
                 SELECT COUNT(*) AS n FROM gone"
            );
            let rows = self.query(&sql, values).await?;
            return Ok(u64::try_from(first_i64(&rows, "n")?).unwrap_or(0));
        }
        // SQLite: two DELETEs over the same pick in one transaction. Writing first (rather
        // than reading the ids, then deleting) takes the write lock at once, so a writer
        // committing in between cannot make the transaction's upgrade fail.
        self.bounded(async {
            let txn = self.db.begin().await?;
            txn.execute_raw(self.stmt(&format!("DELETE FROM job_events WHERE job_id IN ({pick})"), values.clone()))
                .await?;
            txn.execute_raw(self.stmt(&format!("DELETE FROM job_logs WHERE job_id IN ({pick})"), values.clone()))
                .await?;
            let n = txn
                .execute_raw(
                    self.stmt(&format!("DELETE FROM dispatch_queue WHERE id IN ({pick}) AND {{FINISHED}}"), values),
                )
                .await?
                .rows_affected();
            txn.commit().await?;
            Ok(n)
        })
        .await
    }

    // ---------------------------------------------------------------- user actions

    /// Puts a dead, failed or cancelled job back in the queue with a fresh attempt budget,
    /// claimable now. `Ok(false)`: the job is in no state to be requeued. A job whose key is
    /// live again (a newer job with the same key) is refused with a clear error.
    pub async fn requeue(&self, id: i64, by: &str) -> Result<bool> {
        let result = self
            .change(
                "UPDATE dispatch_queue
                    SET state = 'queued', attempts = 0, claimed_at = NULL, dead_at = NULL, finished_at = NULL,
                        run_at = {NOW}, cancel_requested_at = NULL, cancel_requested_by = NULL
                  WHERE id = $1 AND {REQUEUEABLE}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into()],
                &History { kind: "'requeued'", machine: Some(by), detail: Detail::Text("requeued by the user".into()) },
            )
            .await;
        match result {
            Ok(rows) => Ok(!rows.is_empty()),
            Err(e) if e.is_unique_violation() => Err(Error::Invalid(format!(
                "job #{id} cannot be requeued: another job with the same key is live; cancel that one first"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Cancels a job, from any machine. A waiting job is cancelled at once. For a running
    /// job the cancel is *asked for*, in the same statement: its holder sees it at its next
    /// renewal (or at once, through NOTIFY), stops the agent, and ends the claim cancelled;
    /// from now on no completion, retry or hand-off of it can end it otherwise. `Ok(None)`:
    /// the job is finished, or its cancel was asked for already.
    pub async fn cancel(&self, id: i64, by: &str) -> Result<Option<CancelOutcome>> {
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = CASE WHEN {RUNNING} THEN state ELSE 'cancelled' END,
                        finished_at = CASE WHEN {RUNNING} THEN finished_at ELSE {NOW} END,
                        cancel_requested_at = {NOW}, cancel_requested_by = $2
                  WHERE id = $1
                    AND (({CLAIMABLE} AND claimed_at IS NULL) OR ({RUNNING} AND cancel_requested_at IS NULL))
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state, cancel_requested_by",
                vec![id.into(), by.into()],
                &History {
                    kind: "CASE WHEN state = 'running' THEN 'cancel_requested' ELSE 'cancelled' END",
                    machine: Some(by),
                    detail: Detail::Expr(
                        "CASE WHEN state = 'running' THEN 'cancel asked by ' || cancel_requested_by || \
                         '; ' || COALESCE(claimed_by, '?') || ' stops the agent' \
                         ELSE 'cancelled by ' || cancel_requested_by END"
                            .into(),
                    ),
                },
            )
            .await?;
        let Some(r) = rows.first() else { return Ok(None) };
        Ok(Some(if r.try_get::<String>("", "state")? == JobState::Running.as_str() {
            CancelOutcome::Requested { holder: r.try_get("", "claimed_by")? }
        } else {
            CancelOutcome::Cancelled
        }))
    }

    // ---------------------------------------------------------------- history

    /// Records a history entry that goes with no state change of ours (a loss, a rejected
    /// completion, an expired lease): the only trace of why a job moved, so a database blip
    /// is retried for a while before giving up.
    pub async fn note(&self, id: i64, kind: &str, machine: &str, token: Option<i64>, detail: &str) {
        let write = || self.note_once(id, kind, machine, token, detail);
        if let Err(e) = retry::transient("recording history", Budget::NOTE, write).await {
            tracing::warn!(error = %e, job = id, kind, "could not record history");
        }
    }

    /// [`Queue::note`] with one try: for a note written on a path that must not wait (a
    /// fenced write's answer, a batch of completions). A failure is logged.
    pub async fn note_now(&self, id: i64, kind: &str, machine: &str, token: Option<i64>, detail: &str) {
        if let Err(e) = self.note_once(id, kind, machine, token, detail).await {
            tracing::warn!(error = %e, job = id, kind, "could not record history");
        }
    }

    /// One try of [`Queue::note`].
    pub async fn note_once(&self, id: i64, kind: &str, machine: &str, token: Option<i64>, detail: &str) -> Result<()> {
        self.exec(
            "INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
             SELECT id, orchestrator_id, $2, $3, $4, $5, {NOW} FROM dispatch_queue WHERE id = $1",
            vec![id.into(), kind.into(), machine.into(), token.into(), detail.into()],
        )
        .await?;
        Ok(())
    }

    /// A job's history, oldest first.
    pub async fn history(&self, id: i64) -> Result<Vec<JobEvent>> {
        let rows = self
            .query(
                "SELECT id, job_id, at, kind, machine, claim_token, detail
                   FROM job_events WHERE job_id = $1 ORDER BY id",
                vec![id.into()],
            )
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Every history entry of one kind for an orchestrator (for audits and tests).
    pub async fn events_of_kind(&self, orchestrator_id: &str, kind: &str) -> Result<Vec<JobEvent>> {
        let rows = self
            .query(
                "SELECT id, job_id, at, kind, machine, claim_token, detail
                   FROM job_events WHERE orchestrator_id = $1 AND kind = $2 ORDER BY id",
                vec![orchestrator_id.into(), kind.into()],
            )
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    // ---------------------------------------------------------------- reads

    /// Job counts by state.
    pub async fn counts(&self, orchestrator_id: &str) -> Result<Counts> {
        let rows = self
            .query(
                "SELECT state, COUNT(*) AS n FROM dispatch_queue
                  WHERE orchestrator_id = $1 GROUP BY state",
                vec![orchestrator_id.into()],
            )
            .await?;
        let mut c = Counts::default();
        for r in &rows {
            let n: i64 = r.try_get("", "n")?;
            let Some(state) = JobState::parse(&r.try_get::<String>("", "state")?) else { continue };
            *match state {
                JobState::Queued => &mut c.queued,
                JobState::Running => &mut c.running,
                JobState::Failed => &mut c.failed,
                JobState::Completed => &mut c.completed,
                JobState::Dead => &mut c.dead,
                JobState::Cancelled => &mut c.cancelled,
            } = n;
        }
        Ok(c)
    }

    /// The orchestrator's open work as a machine with `route` sees it: what it may still
    /// get (running anywhere, or claimable and routable to it), and what only another
    /// machine can take.
    pub async fn open_work(&self, orchestrator_id: &str, route: &Route) -> Result<OpenWork> {
        let mut values: Vec<Value> = vec![orchestrator_id.into()];
        let mine = format!("({{RUNNING}} OR ({}))", route.sql(&mut values));
        let rows = self
            .query(
                &format!(
                    "SELECT COALESCE(SUM(CASE WHEN {mine} THEN 1 ELSE 0 END), 0) AS open,
                            COALESCE(SUM(CASE WHEN {mine} THEN 0 ELSE 1 END), 0) AS unroutable
                       FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND ({{RUNNING}} OR (claimed_at IS NULL AND {{CLAIMABLE}}))"
                ),
                values,
            )
            .await?;
        Ok(OpenWork { open: first_i64(&rows, "open")?, unroutable: first_i64(&rows, "unroutable")? })
    }

    /// Jobs of an orchestrator, newest first, optionally of one state.
    pub async fn jobs(&self, orchestrator_id: &str, state: Option<&str>, limit: u32) -> Result<Vec<JobRow>> {
        let mut values: Vec<Value> = vec![orchestrator_id.into(), i64::from(limit).into()];
        let filter = match state {
            Some(s) => {
                values.push(s.into());
                "AND state = $3"
            }
            None => "",
        };
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 {filter}
                      ORDER BY id DESC LIMIT $2"
                ),
                values,
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The running jobs of an orchestrator, oldest claim first.
    pub async fn running(&self, orchestrator_id: &str) -> Result<Vec<JobRow>> {
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND {{RUNNING}} ORDER BY claimed_at, id"
                ),
                vec![orchestrator_id.into()],
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The claimable jobs that wait for a time (backoff, schedule, park), soonest first.
    pub async fn waiting(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<JobRow>> {
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {{CLAIMABLE}} AND run_at > {{NOW}}
                      ORDER BY run_at, id LIMIT $2"
                ),
                vec![orchestrator_id.into(), i64::from(limit).into()],
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The claimable jobs no machine holds, in the order the pick takes them.
    pub async fn unclaimed(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<JobRow>> {
        let rows = self
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {{NOW}} AS now FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {{CLAIMABLE}}
                      ORDER BY priority DESC, run_at, id LIMIT $2"
                ),
                vec![orchestrator_id.into(), i64::from(limit).into()],
            )
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// One job with its payload.
    pub async fn job(&self, id: i64) -> Result<Option<(JobRow, serde_json::Value)>> {
        let rows = self
            .query(
                &format!("SELECT {JOB_COLUMNS}, payload, {{NOW}} AS now FROM dispatch_queue WHERE id = $1"),
                vec![id.into()],
            )
            .await?;
        match rows.first() {
            Some(r) => Ok(Some((job_from_row(r)?, r.try_get("", "payload")?))),
            None => Ok(None),
        }
    }

    // ---------------------------------------------------------------- presence

    /// Upserts this machine's presence row.
    pub async fn heartbeat_machine(&self, p: &Presence<'_>) -> Result<()> {
        self.exec(PRESENCE_UPSERT, presence_values(p)).await?;
        Ok(())
    }

    /// The machines of an orchestrator.
    pub async fn machines(&self, orchestrator_id: &str) -> Result<Vec<MachineRow>> {
        let rows = self
            .query(
                "SELECT machine, status, last_seen_at, dispatch_enabled, paused_until, running,
                        concurrency, problem, repos, labels, {NOW} AS now
                   FROM machines WHERE orchestrator_id = $1 ORDER BY machine",
                vec![orchestrator_id.into()],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(MachineRow {
                    machine: r.try_get("", "machine")?,
                    status: r.try_get("", "status")?,
                    last_seen_at: r.try_get("", "last_seen_at")?,
                    dispatch_enabled: r.try_get("", "dispatch_enabled")?,
                    paused_until: r.try_get("", "paused_until")?,
                    running: r.try_get("", "running")?,
                    concurrency: r.try_get("", "concurrency")?,
                    problem: r.try_get("", "problem")?,
                    repos: names_of(r.try_get("", "repos")?),
                    labels: names_of(r.try_get("", "labels")?),
                    now: r.try_get("", "now")?,
                })
            })
            .collect()
    }
}

const JOB_COLUMNS: &str = "id, orchestrator_id, title, state, attempts, claimed_by, claim_token, \
     created_at, claimed_at, heartbeat_at, completed_at, last_error, max_attempts, unique_key, priority, run_at, \
     summary, result_url, cancel_requested_by, finished_at, repo, requires, resume_branch, resumed_from, worktree, \
     release_requested_by";

fn job_from_row(r: &QueryResult) -> Result<JobRow> {
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

fn event_from_row(r: &QueryResult) -> Result<JobEvent> {
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

fn claim_from_row(r: &QueryResult) -> Result<Claim> {
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

/// The last net under every statement: PostgreSQL cannot store a NUL in text (and through a
/// pooler, inlined into the query string, it would end the statement early: SQLSTATE 08P01),
/// so a NUL that got past the checks at the door is replaced by U+FFFD, never sent. Text
/// from people is refused at enqueue ([`crate::spec::check_payload`]); text from agents is
/// cleaned where it is read ([`crate::agent::clean_text`]).
fn without_nul(mut values: Vec<Value>) -> Vec<Value> {
    for v in &mut values {
        if let Value::String(Some(s)) = v {
            if s.contains('\0') {
                *s = s.replace('\0', "\u{fffd}");
            }
        }
    }
    values
}

/// `($1, $2), ($3, $4), …` for a list of (id, token) pairs.
fn pair_list(pairs: &[(i64, i64)], offset: usize) -> (String, Vec<Value>) {
    let mut sql = String::with_capacity(pairs.len() * 12);
    let mut values = Vec::with_capacity(pairs.len() * 2);
    for (i, (id, token)) in pairs.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let n = offset + values.len();
        sql.push_str(&format!("(${}, ${})", n + 1, n + 2));
        values.push((*id).into());
        values.push((*token).into());
    }
    (sql, values)
}

/// A job's routing columns: `repo`, and `requires` as JSON.
type RouteColumns = (Option<String>, Option<String>);

/// Every payload must be a JSON object or array within the caps, and read as the schema
/// says ([`crate::spec::check_payload`]); the routing columns of each, in order.
fn check_payloads(payloads: &[serde_json::Value]) -> Result<Vec<RouteColumns>> {
    if let Some(bad) = payloads.iter().position(|p| !(p.is_object() || p.is_array())) {
        return Err(Error::Payload(format!("payload {} is not a JSON object or array", bad + 1)));
    }
    payloads.iter().map(|p| Ok(crate::spec::check_payload(p)?.route_columns())).collect()
}

/// One INSERT of `payloads` with `opts`: claimable from `COALESCE(at, {NOW} + delay)`, and a
/// no-op for a key that is live already (`ON CONFLICT DO NOTHING` over the partial unique
/// index). The producer's SQL in the README is this statement.
fn insert_jobs(
    orchestrator_id: &str,
    payloads: &[serde_json::Value],
    routes: &[RouteColumns],
    opts: &JobOptions,
) -> (String, Vec<Value>) {
    const PER_ROW: usize = 12;
    let mut sql = String::from(
        "INSERT INTO dispatch_queue (orchestrator_id, payload, title, max_attempts, unique_key, priority, run_at, \
         retry_backoff_ms, retry_backoff_max_ms, repo, requires) VALUES ",
    );
    let mut values: Vec<Value> = Vec::with_capacity(payloads.len() * PER_ROW);
    let (at, delay) = opts.start_values();
    let (base, max) = match opts.backoff {
        Some(b) => (Some(b.ms().0), Some(b.ms().1)),
        None => (None, None),
    };
    for (i, (p, (repo, requires))) in payloads.iter().zip(routes).enumerate() {
        if i > 0 {
            sql.push(',');
        }
        let n = values.len();
        let ph: Vec<String> = (1..=PER_ROW).map(|k| format!("${}", n + k)).collect();
        sql.push_str(&format!(
            "({}, {}, {}, {}, {}, {}, COALESCE({}, {{NOW}} + {}), {}, {}, {}, {})",
            ph[0], ph[1], ph[2], ph[3], ph[4], ph[5], ph[6], ph[7], ph[8], ph[9], ph[10], ph[11]
        ));
        values.push(orchestrator_id.into());
        values.push(Value::from(p.clone()));
        values.push(title_of(p).into());
        values.push(opts.max_attempts.into());
        values.push(opts.key.clone().into());
        values.push(opts.priority.into());
        values.push(at.into());
        values.push(delay.into());
        values.push(base.into());
        values.push(max.into());
        values.push(repo.clone().into());
        values.push(requires.clone().into());
    }
    sql.push_str(" ON CONFLICT DO NOTHING RETURNING id");
    (sql, values)
}

/// The (id, token) pairs of ended claims, with the state each ended in.
fn ended_of(rows: &[QueryResult]) -> Result<Vec<((i64, i64), JobState)>> {
    rows.iter()
        .map(|r| {
            let state = JobState::parse(&r.try_get::<String>("", "state")?).unwrap_or(JobState::Completed);
            Ok(((r.try_get::<i64>("", "id")?, r.try_get::<i64>("", "claim_token")?), state))
        })
        .collect()
}

fn pairs_of(rows: &[QueryResult]) -> Result<Vec<(i64, i64)>> {
    rows.iter().map(|r| Ok((r.try_get::<i64>("", "id")?, r.try_get::<i64>("", "claim_token")?))).collect()
}

fn ids_of(rows: &[QueryResult]) -> Result<Vec<i64>> {
    rows.iter().map(|r| Ok(r.try_get::<i64>("", "id")?)).collect()
}

fn first_i64(rows: &[QueryResult], col: &str) -> Result<i64> {
    match rows.first() {
        Some(r) => Ok(r.try_get("", col)?),
        None => Err(Error::Db(sea_orm::DbErr::RecordNotFound(format!("no row returned for {col}")))),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The label shown for a job: the payload's `title`, else `identifier`, else `id`.
pub fn title_of(payload: &serde_json::Value) -> Option<String> {
    ["title", "identifier", "id"].iter().find_map(|k| match payload.get(k) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Some(truncate(s, 120)),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

/// An orchestrator id is a short printable name.
pub fn validate_orchestrator(id: &str) -> Result<()> {
    if id.trim().is_empty() {
        return Err(Error::Invalid("the orchestrator id must not be empty".into()));
    }
    if id.len() > 200 || id.chars().any(|c| c.is_control()) {
        return Err(Error::Invalid("the orchestrator id must be at most 200 printable characters".into()));
    }
    Ok(())
}
