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

/// The herd-free pick: the oldest claimable rows, skipping rows another claimer holds.
/// `{LIMIT}` is the placeholder of the batch size. Ordered by `(created_at, id)`, which only
/// the partial index `dispatch_queue_pick` serves (ordering by `id` alone let the planner walk
/// the primary key past every claimed row; see the migration that made the index).
const PICK: &str = "SELECT id FROM dispatch_queue
                     WHERE orchestrator_id = $1
                       AND claimed_at IS NULL AND {CLAIMABLE}
                     ORDER BY created_at, id
                     LIMIT {LIMIT}
                     {SKIP_LOCKED}";

/// The claim of what `picked` chose ($2 is the machine). The precondition is repeated in
/// the WHERE so that a row claimed by someone else in between is simply not ours.
const CLAIM_PICKED: &str = "UPDATE dispatch_queue
                    SET state = 'running', claimed_at = {NOW}, heartbeat_at = {NOW},
                        claimed_by = $2, claim_token = claim_token + 1, attempts = attempts + 1
                  WHERE id IN (SELECT id FROM picked)
                    AND claimed_at IS NULL AND {CLAIMABLE}
                 RETURNING id, orchestrator_id, payload, title, claim_token, attempts, claimed_by, state";

/// The history of a claim: kind and detail over the claimed row.
const CLAIMED: History<'static> =
    History { kind: "'claimed'", machine: None, detail: Detail::Expr("'attempt ' || attempts") };

/// A machine's presence row, $1..$8 in the order of [`presence_values`].
const PRESENCE_UPSERT: &str = "INSERT INTO machines
                 (orchestrator_id, machine, last_seen_at, status, dispatch_enabled, paused_until,
                  running, concurrency, problem)
             VALUES ($1, $2, {NOW}, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (orchestrator_id, machine) DO UPDATE SET
                 last_seen_at = excluded.last_seen_at, status = excluded.status,
                 dispatch_enabled = excluded.dispatch_enabled,
                 paused_until = excluded.paused_until, running = excluded.running,
                 concurrency = excluded.concurrency, problem = excluded.problem";

/// The text of [`Queue::claim_next`] before dialect substitution ($1 orchestrator, $2
/// machine, $3 limit), so the benchmark can hand pgbench exactly this statement.
pub fn claim_next_sql() -> String {
    format!("WITH picked AS MATERIALIZED ({PICK}) {CLAIM_PICKED}").replace("{LIMIT}", "$3")
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
}

fn postgres_dialect(sql: &str) -> String {
    states(sql).replace("{NOW}", PG_NOW).replace("{SKIP_LOCKED}", "FOR UPDATE SKIP LOCKED")
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
    Text(String),
    /// An SQL expression over the changed row.
    Expr(&'static str),
}

/// `'dead'` when the change left the row dead, else `other`.
fn dead_or(other: &str) -> String {
    format!("CASE WHEN state = 'dead' THEN '{}' ELSE '{other}' END", event::DEAD)
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
}

/// What a fenced failure did to the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailOutcome {
    /// Back in the queue for another attempt.
    WillRetry,
    /// Out of attempts.
    Dead,
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
    /// The database clock when the row was read, so ages need no local clock.
    pub now: i64,
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
}

/// What a poll does besides claiming; see [`Queue::claim_next_with`].
#[derive(Clone, Debug, Default)]
pub struct PollExtras<'a> {
    /// Write this machine's presence row in the same statement.
    pub presence: Option<Presence<'a>>,
    /// Ask whether any of the orchestrator's leases is older than this.
    pub stale_after: Option<Duration>,
}

/// A poll's answer: the claims, and whether a sweep has something to do.
#[derive(Clone, Debug, Default)]
pub struct Polled {
    pub claims: Vec<Claim>,
    pub stale: bool,
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

/// The queue, over one sea-orm connection pool (PostgreSQL or SQLite).
#[derive(Clone, Debug)]
pub struct Queue {
    db: DatabaseConnection,
    backend: DbBackend,
    /// The bound on every call (see [`Queue::with_call_timeout`]).
    bound: Duration,
}

/// Jobs added to the queue carry these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobOptions {
    /// Attempts before the job is dead; stored on the row, read by the sweep and the fail path.
    pub max_attempts: i32,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self { max_attempts: 3 }
    }
}

impl Queue {
    pub fn new(db: DatabaseConnection) -> Self {
        let backend = db.get_database_backend();
        Self { db, backend, bound: Duration::from_secs(30) }
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
            _ => states(sql).replace("{NOW}", SQLITE_NOW).replace("{SKIP_LOCKED}", "").replace('$', "?"),
        };
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    /// Runs `call` within this queue's bound.
    async fn bounded<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.bound, call).await.map_err(|_| Error::Timeout(self.bound))?
    }

    async fn query(&self, sql: &str, values: Vec<Value>) -> Result<Vec<QueryResult>> {
        self.bounded(async { Ok(self.db.query_all_raw(self.stmt(sql, values)).await?) }).await
    }

    async fn exec(&self, sql: &str, values: Vec<Value>) -> Result<u64> {
        self.bounded(async { Ok(self.db.execute_raw(self.stmt(sql, values)).await?.rows_affected()) }).await
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
            let detail = match &h.detail {
                Detail::None => "NULL".to_string(),
                Detail::Expr(e) => e.to_string(),
                Detail::Text(t) => {
                    values.push(t.clone().into());
                    format!("${}", values.len())
                }
            };
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
        let detail = match &h.detail {
            Detail::None => "NULL".to_string(),
            Detail::Expr(e) => e.to_string(),
            Detail::Text(t) => {
                values.push(t.clone().into());
                "$2".to_string()
            }
        };
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

    /// Adds a job with `opts`.
    pub async fn enqueue_with(
        &self,
        orchestrator_id: &str,
        payload: &serde_json::Value,
        opts: JobOptions,
    ) -> Result<i64> {
        Ok(self.enqueue_many_with(orchestrator_id, std::slice::from_ref(payload), opts).await?[0])
    }

    /// Adds many jobs with the default options.
    pub async fn enqueue_many(&self, orchestrator_id: &str, payloads: &[serde_json::Value]) -> Result<Vec<i64>> {
        self.enqueue_many_with(orchestrator_id, payloads, JobOptions::default()).await
    }

    /// Adds many jobs in one statement (in chunks that stay under bind-parameter limits).
    pub async fn enqueue_many_with(
        &self,
        orchestrator_id: &str,
        payloads: &[serde_json::Value],
        opts: JobOptions,
    ) -> Result<Vec<i64>> {
        validate_orchestrator(orchestrator_id)?;
        if opts.max_attempts < 1 {
            return Err(Error::Invalid("max attempts must be at least 1".into()));
        }
        if let Some(bad) = payloads.iter().position(|p| !(p.is_object() || p.is_array())) {
            return Err(Error::Payload(format!("payload {} is not a JSON object or array", bad + 1)));
        }
        let mut ids = Vec::with_capacity(payloads.len());
        for chunk in payloads.chunks(200) {
            let mut sql =
                String::from("INSERT INTO dispatch_queue (orchestrator_id, payload, title, max_attempts) VALUES ");
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 4);
            for (i, p) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                let n = values.len();
                sql.push_str(&format!("(${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4));
                values.push(orchestrator_id.into());
                values.push(Value::from(p.clone()));
                values.push(title_of(p).into());
                values.push(opts.max_attempts.into());
            }
            sql.push_str(" RETURNING id");
            let rows = self.query(&sql, values).await?;
            ids.extend(ids_of(&rows)?);
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
    ///    AND claimed_at IS NULL AND state IN ('queued','failed')
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
            .col_expr(dq::Column::HeartbeatAt, now)
            .col_expr(dq::Column::ClaimedBy, Expr::value(machine))
            .col_expr(dq::Column::ClaimToken, Expr::col(dq::Column::ClaimToken).add(1))
            .col_expr(dq::Column::Attempts, Expr::col(dq::Column::Attempts).add(1))
            .filter(dq::Column::Id.eq(id))
            .filter(dq::Column::OrchestratorId.eq(orchestrator_id))
            .filter(dq::Column::ClaimedAt.is_null())
            .filter(dq::Column::State.is_in(claimable));
        // The builder's UPDATE with the RETURNING that `change` needs: then the claim and its
        // history are one statement on PostgreSQL too.
        let built = update.build(self.backend);
        let sql = format!(
            "{} RETURNING id, orchestrator_id, payload, title, claim_token, attempts, claimed_by, state",
            built.sql
        );
        let rows = self.change(&sql, built.values.map(|v| v.0).unwrap_or_default(), &CLAIMED).await?;
        rows.first().map(claim_from_row).transpose()
    }

    /// Claimable job ids, oldest first: the read half of the article's naive path.
    pub async fn candidates(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<i64>> {
        let rows = self
            .query(
                "SELECT id FROM dispatch_queue
                  WHERE orchestrator_id = $1 AND claimed_at IS NULL AND {CLAIMABLE}
                  ORDER BY created_at, id LIMIT $2",
                vec![orchestrator_id.into(), i64::from(limit).into()],
            )
            .await?;
        ids_of(&rows)
    }

    /// The herd-free pick-and-claim: up to `limit` of the oldest claimable jobs, in ONE
    /// statement. On PostgreSQL the pick skips rows another claimer has locked, so N machines
    /// take N different rows instead of all fighting over the oldest; on SQLite the statement
    /// runs under the database's single writer lock, which gives the same guarantee.
    pub async fn claim_next(&self, orchestrator_id: &str, machine: &str, limit: u32) -> Result<Vec<Claim>> {
        Ok(self.claim_next_with(orchestrator_id, machine, limit, &PollExtras::default()).await?.claims)
    }

    /// The claim and its history on SQLite ([`Queue::change`]: one short transaction).
    async fn claim_next_sqlite(&self, orchestrator_id: &str, machine: &str, limit: u32) -> Result<Vec<Claim>> {
        let values = vec![orchestrator_id.into(), machine.into(), i64::from(limit).into()];
        let rows = self.change(&claim_next_sql(), values, &CLAIMED).await?;
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
        if self.backend != DbBackend::Postgres {
            if let Some(p) = &extras.presence {
                if let Err(e) = self.heartbeat_machine(p).await {
                    tracing::debug!(error = %e, "presence update failed");
                }
            }
            let claims =
                if limit == 0 { vec![] } else { self.claim_next_sqlite(orchestrator_id, machine, limit).await? };
            return Ok(Polled { claims, stale: extras.stale_after.is_some() });
        }
        // $1 orchestrator, $2 machine, then the presence values ($3..$8, as in
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
                values.push(i64::try_from(after.as_millis()).unwrap_or(i64::MAX / 4).into());
                format!(
                    "EXISTS (SELECT 1 FROM dispatch_queue WHERE orchestrator_id = $1 AND {{RUNNING}}
                               AND COALESCE(heartbeat_at, claimed_at) < {{NOW}} - ${})",
                    values.len()
                )
            }
            None => "false".to_string(),
        };
        let sql = format!(
            "WITH {ctes}picked AS MATERIALIZED ({PICK}), claimed AS ({CLAIM_PICKED}), history AS (
                 INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
                 SELECT id, orchestrator_id, {kind}, $2, claim_token, {detail}, {{NOW}} FROM claimed)
             SELECT c.*, s.stale FROM (SELECT {stale} AS stale) s LEFT JOIN claimed c ON true",
            kind = CLAIMED.kind,
            detail = match CLAIMED.detail {
                Detail::Expr(e) => e,
                _ => "NULL",
            },
        )
        .replace("{LIMIT}", &limit_at);
        let rows = self.query(&sql, values).await?;
        let stale = match rows.first() {
            Some(r) => r.try_get("", "stale")?,
            None => false,
        };
        let mut claims = vec![];
        for r in &rows {
            if r.try_get::<Option<i64>>("", "id")?.is_some() {
                claims.push(claim_from_row(r)?);
            }
        }
        claims.sort_by_key(|c| c.id);
        Ok(Polled { claims, stale })
    }

    // ---------------------------------------------------------------- fenced writes

    /// Renews the leases of the jobs this machine holds, in one statement. Returns the
    /// (id, token) pairs whose lease is still ours; every pair missing from the answer has
    /// been lost. Matching by pair matters: a late answer about an old claim of a job must
    /// never be read as news about a newer claim of the same job.
    pub async fn renew(&self, held: &[(i64, i64)]) -> Result<Vec<(i64, i64)>> {
        if held.is_empty() {
            return Ok(vec![]);
        }
        let (pairs, values) = pair_list(held, 0);
        let rows = self
            .query(
                &format!(
                    "UPDATE dispatch_queue SET heartbeat_at = {{NOW}}
                      WHERE (id, claim_token) IN ({pairs}) AND {{RUNNING}}
                     RETURNING id, claim_token"
                ),
                values,
            )
            .await?;
        pairs_of(&rows)
    }

    /// Completes one job if we still own it. `Ok(false)` means the lease was lost and the
    /// completion was rejected (and recorded as such).
    pub async fn complete(&self, id: i64, token: i64, machine: &str) -> Result<bool> {
        Ok(self.complete_many(&[(id, token)], machine).await?.contains(&(id, token)))
    }

    /// Completes many claims in one fenced statement; returns the (id, token) pairs accepted.
    /// Rejected ones (lease lost) get a `completion_rejected` history entry. One batch may
    /// name the same job twice, under an old claim and a new one: only the current one wins.
    pub async fn complete_many(&self, done: &[(i64, i64)], machine: &str) -> Result<Vec<(i64, i64)>> {
        if done.is_empty() {
            return Ok(vec![]);
        }
        let (pairs, values) = pair_list(done, 0);
        let update = format!(
            "UPDATE dispatch_queue
                SET state = 'completed', completed_at = {{NOW}}, last_error = NULL
              WHERE (id, claim_token) IN ({pairs}) AND {{RUNNING}}
             RETURNING id, claim_token, orchestrator_id, claimed_by, state"
        );
        let history = History { kind: "'completed'", machine: Some(machine), detail: Detail::None };
        let rows = self.change(&update, values, &history).await?;
        let mut accepted = pairs_of(&rows)?;
        let mut rejected: Vec<(i64, i64)> = done.iter().copied().filter(|p| !accepted.contains(p)).collect();
        if !rejected.is_empty() {
            // A retry after a lost reply (say, the server restarted just after committing)
            // finds its own earlier completion: same token, already completed. That is ours.
            let (pairs, values) = pair_list(&rejected, 0);
            let rows = self
                .query(
                    &format!(
                        "SELECT id, claim_token FROM dispatch_queue
                          WHERE (id, claim_token) IN ({pairs}) AND state = 'completed'"
                    ),
                    values,
                )
                .await?;
            let ours = pairs_of(&rows)?;
            rejected.retain(|p| !ours.contains(p));
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

    /// Fails the current attempt if we still own it: back to the queue, or dead once it has
    /// used the job's own `max_attempts`. `Ok(None)` means the lease was lost; nothing was
    /// written but a note.
    pub async fn fail(&self, id: i64, token: i64, machine: &str, error: &str) -> Result<Option<FailOutcome>> {
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'failed' END,
                        dead_at = CASE WHEN attempts >= max_attempts THEN {NOW} ELSE NULL END,
                        failed_at = {NOW}, claimed_at = NULL, last_error = $3
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into(), token.into(), truncate(error, 2000).into()],
                &History {
                    kind: &dead_or(event::FAILED),
                    machine: Some(machine),
                    detail: Detail::Text(truncate(error, 500)),
                },
            )
            .await?;
        let Some(row) = rows.first() else {
            // A retry whose first try committed but lost its answer finds its own event.
            if let Some(kind) = self.own_event(id, token, machine, &[event::FAILED, event::DEAD]).await? {
                return Ok(Some(if kind == event::DEAD { FailOutcome::Dead } else { FailOutcome::WillRetry }));
            }
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "failure not recorded: lease lost").await;
            return Ok(None);
        };
        let dead = row.try_get::<String>("", "state")? == JobState::Dead.as_str();
        Ok(Some(if dead { FailOutcome::Dead } else { FailOutcome::WillRetry }))
    }

    /// Hands a job back so another machine can take it at once. The attempt is not counted
    /// against the job: handing off is a choice, not a failure.
    pub async fn release(&self, id: i64, token: i64, machine: &str, reason: &str) -> Result<bool> {
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = 'queued', claimed_at = NULL, attempts = attempts - 1
                  WHERE id = $1 AND claim_token = $2 AND {RUNNING}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into(), token.into()],
                &History { kind: "'handed_off'", machine: Some(machine), detail: Detail::Text(reason.to_string()) },
            )
            .await?;
        if rows.is_empty() {
            // A retry whose first try committed but lost its answer finds its own hand-off.
            if self.own_event(id, token, machine, &[event::HANDED_OFF]).await?.is_some() {
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
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = 'queued', claimed_at = NULL, attempts = attempts - 1
                  WHERE orchestrator_id = $1 AND claimed_by = $2 AND {RUNNING}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![orchestrator_id.into(), machine.into()],
                &History {
                    kind: "'handed_off'",
                    machine: Some(machine),
                    detail: Detail::Text("released by `devpilot release`".into()),
                },
            )
            .await?;
        let mut ids = ids_of(&rows)?;
        ids.sort_unstable();
        Ok(ids)
    }

    // ---------------------------------------------------------------- sweep

    /// Releases every claim whose last sign of life is older than `claim_timeout`; a job that
    /// has used its own `max_attempts` becomes dead instead. The staleness test is in this
    /// same statement's WHERE, so a sweep can never touch a fresh claim or a finished job.
    /// `orchestrator_id = None` sweeps every orchestrator (the backstop command).
    pub async fn sweep(&self, orchestrator_id: Option<&str>, claim_timeout: Duration) -> Result<Vec<Swept>> {
        let timeout_ms = i64::try_from(claim_timeout.as_millis()).unwrap_or(i64::MAX / 4);
        let mut values: Vec<Value> = vec![timeout_ms.into()];
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $2"
            }
            None => "",
        };
        let detail = format!("no heartbeat for {}", humantime::format_duration(claim_timeout));
        let rows = self
            .change(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END,
                            dead_at = CASE WHEN attempts >= max_attempts THEN {{NOW}} ELSE NULL END,
                            claimed_at = NULL,
                            last_error = 'lease expired: no heartbeat from ' || COALESCE(claimed_by, '?')
                      WHERE {{RUNNING}}
                        AND COALESCE(heartbeat_at, claimed_at) < {{NOW}} - $1
                        {scope}
                     RETURNING id, orchestrator_id, claimed_by, claim_token, state, {{NOW}} AS at"
                ),
                values,
                &History { kind: &dead_or(event::SWEPT), machine: None, detail: Detail::Text(detail) },
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

    // ---------------------------------------------------------------- user actions

    /// Puts a dead (or failed, or cancelled) job back in the queue with a fresh attempt budget.
    pub async fn requeue(&self, id: i64, by: &str) -> Result<bool> {
        let rows = self
            .change(
                "UPDATE dispatch_queue
                    SET state = 'queued', attempts = 0, claimed_at = NULL, dead_at = NULL
                  WHERE id = $1 AND {REQUEUEABLE}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into()],
                &History { kind: "'requeued'", machine: Some(by), detail: Detail::Text("requeued by the user".into()) },
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Cancels a job that nobody has claimed yet.
    pub async fn cancel(&self, id: i64, by: &str) -> Result<bool> {
        let rows = self
            .change(
                "UPDATE dispatch_queue SET state = 'cancelled'
                  WHERE id = $1 AND claimed_at IS NULL AND {CLAIMABLE}
                 RETURNING id, orchestrator_id, claim_token, claimed_by, state",
                vec![id.into()],
                &History {
                    kind: "'cancelled'",
                    machine: Some(by),
                    detail: Detail::Text("cancelled by the user".into()),
                },
            )
            .await?;
        Ok(!rows.is_empty())
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
                        concurrency, problem, {NOW} AS now
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
                    now: r.try_get("", "now")?,
                })
            })
            .collect()
    }
}

const JOB_COLUMNS: &str = "id, orchestrator_id, title, state, attempts, claimed_by, claim_token, \
     created_at, claimed_at, heartbeat_at, completed_at, last_error, max_attempts";

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
    })
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
