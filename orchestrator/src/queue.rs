//! Every statement that touches the queue tables lives here, and only here.
//!
//! "Where is the claim?" [`Queue::claim_by_id`] (the article's conditional UPDATE) and
//! [`Queue::claim_next`] (the herd-free pick-and-claim the orchestrator uses).
//!
//! Rules every statement in this file keeps:
//! - One statement per decision. The precondition lives in the WHERE clause and a zero-row
//!   result means "lost the race" or "you no longer own this"; neither is an error.
//! - No transaction is held open across a round trip to the application.
//! - Every lease time comes from the database clock (`{NOW}`), never from this machine.
//! - Every write after a claim names the job's `claim_token` (the fencing token), which every
//!   claim increments, so a machine that slept through losing its lease cannot write.

use std::time::Duration;

use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait, QueryFilter, QueryResult, Statement,
    Value,
};
use serde::Serialize;

use crate::entity::dispatch_queue as dq;
use crate::error::{Error, Result};

/// Milliseconds since the epoch, from the database's clock.
const PG_NOW: &str = "((extract(epoch from now()) * 1000)::bigint)";
const SQLITE_NOW: &str = "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))";

/// The states a job can be in. `failed` is a failed attempt waiting for its retry.
pub const CLAIMABLE: &str = "state IN ('queued','failed')";

/// The herd-free pick: the oldest claimable rows, skipping rows another claimer holds.
/// `{LIMIT}` is the placeholder of the batch size. Ordered by `(created_at, id)`, which only
/// the partial index `dispatch_queue_pick` serves (ordering by `id` alone let the planner walk
/// the primary key past every claimed row; see the migration that made the index).
const PICK: &str = "SELECT id FROM dispatch_queue
                     WHERE orchestrator_id = $1
                       AND claimed_at IS NULL AND state IN ('queued','failed')
                     ORDER BY created_at, id
                     LIMIT {LIMIT}
                     {SKIP_LOCKED}";

/// The claim of what `picked` chose ($2 is the machine). The precondition is repeated in
/// the WHERE so that a row claimed by someone else in between is simply not ours.
const CLAIM_PICKED: &str = "UPDATE dispatch_queue
                    SET state = 'running', claimed_at = {NOW}, heartbeat_at = {NOW},
                        claimed_by = $2, claim_token = claim_token + 1, attempts = attempts + 1
                  WHERE id IN (SELECT id FROM picked)
                    AND claimed_at IS NULL AND state IN ('queued','failed')
                 RETURNING id, orchestrator_id, payload, title, claim_token, attempts";

/// The "claimed" history of the rows in `claimed`, inside the claim statement (PostgreSQL).
const CLAIM_HISTORY: &str = "history AS (
                 INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
                 SELECT id, orchestrator_id, 'claimed', $2, claim_token, 'attempt ' || attempts, {NOW}
                   FROM claimed)";

/// A machine's presence row, $1..$7 in the order of [`presence_values`].
const PRESENCE_UPSERT: &str = "INSERT INTO machines
                 (orchestrator_id, machine, last_seen_at, status, dispatch_enabled, paused_until,
                  running, concurrency)
             VALUES ($1, $2, {NOW}, $3, $4, $5, $6, $7)
             ON CONFLICT (orchestrator_id, machine) DO UPDATE SET
                 last_seen_at = excluded.last_seen_at, status = excluded.status,
                 dispatch_enabled = excluded.dispatch_enabled,
                 paused_until = excluded.paused_until, running = excluded.running,
                 concurrency = excluded.concurrency";

/// The text of [`Queue::claim_next`] before dialect substitution ($1 orchestrator, $2
/// machine, $3 limit), so the benchmark can hand pgbench exactly this statement.
pub fn claim_next_sql() -> String {
    format!("WITH picked AS MATERIALIZED ({PICK}) {CLAIM_PICKED}").replace("{LIMIT}", "$3")
}

/// [`claim_next_sql`] as PostgreSQL receives it.
pub fn claim_next_sql_postgres() -> String {
    postgres_dialect(&claim_next_sql())
}

fn postgres_dialect(sql: &str) -> String {
    sql.replace("{NOW}", PG_NOW).replace("{SKIP_LOCKED}", "FOR UPDATE SKIP LOCKED")
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
    ]
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
}

impl Queue {
    pub fn new(db: DatabaseConnection) -> Self {
        let backend = db.get_database_backend();
        Self { db, backend }
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
    /// database clock and `{SKIP_LOCKED}` where PostgreSQL should skip rows others hold.
    /// SQLite serialises writers, so it needs no SKIP LOCKED and takes `?n` placeholders.
    fn stmt(&self, sql: &str, values: Vec<Value>) -> Statement {
        let sql = match self.backend {
            DbBackend::Postgres => postgres_dialect(sql),
            _ => sql.replace("{NOW}", SQLITE_NOW).replace("{SKIP_LOCKED}", "").replace('$', "?"),
        };
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    async fn query(&self, sql: &str, values: Vec<Value>) -> Result<Vec<QueryResult>> {
        Ok(self.db.query_all_raw(self.stmt(sql, values)).await?)
    }

    async fn exec(&self, sql: &str, values: Vec<Value>) -> Result<u64> {
        Ok(self.db.execute_raw(self.stmt(sql, values)).await?.rows_affected())
    }

    /// The database clock, in milliseconds since the epoch.
    pub async fn now_ms(&self) -> Result<i64> {
        let rows = self.query("SELECT {NOW} AS now", vec![]).await?;
        first_i64(&rows, "now")
    }

    // ---------------------------------------------------------------- enqueue

    /// Adds a job. The payload must be a JSON object or array; its `title` (or `identifier`)
    /// becomes the job's label.
    pub async fn enqueue(&self, orchestrator_id: &str, payload: &serde_json::Value) -> Result<i64> {
        Ok(self.enqueue_many(orchestrator_id, std::slice::from_ref(payload)).await?[0])
    }

    /// Adds many jobs in one statement (in chunks that stay under bind-parameter limits).
    pub async fn enqueue_many(&self, orchestrator_id: &str, payloads: &[serde_json::Value]) -> Result<Vec<i64>> {
        validate_orchestrator(orchestrator_id)?;
        let mut ids = Vec::with_capacity(payloads.len());
        for chunk in payloads.chunks(250) {
            let mut sql = String::from("INSERT INTO dispatch_queue (orchestrator_id, payload, title) VALUES ");
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 3);
            for (i, p) in chunk.iter().enumerate() {
                if !(p.is_object() || p.is_array()) {
                    return Err(Error::Payload("the payload must be a JSON object or array".into()));
                }
                if i > 0 {
                    sql.push(',');
                }
                let n = values.len();
                sql.push_str(&format!("(${}, ${}, ${})", n + 1, n + 2, n + 3));
                values.push(orchestrator_id.into());
                values.push(Value::from(p.clone()));
                values.push(title_of(p).into());
            }
            sql.push_str(" RETURNING id");
            let rows = self.query(&sql, values).await?;
            for r in rows {
                ids.push(r.try_get::<i64>("", "id")?);
            }
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
        let rows = dq::Entity::update_many()
            .col_expr(dq::Column::State, Expr::value("running"))
            .col_expr(dq::Column::ClaimedAt, now.clone())
            .col_expr(dq::Column::HeartbeatAt, now)
            .col_expr(dq::Column::ClaimedBy, Expr::value(machine))
            .col_expr(dq::Column::ClaimToken, Expr::col(dq::Column::ClaimToken).add(1))
            .col_expr(dq::Column::Attempts, Expr::col(dq::Column::Attempts).add(1))
            .filter(dq::Column::Id.eq(id))
            .filter(dq::Column::OrchestratorId.eq(orchestrator_id))
            .filter(dq::Column::ClaimedAt.is_null())
            .filter(dq::Column::State.is_in(["queued", "failed"]))
            .exec_with_returning(&self.db)
            .await?;
        let claims: Vec<Claim> = rows
            .into_iter()
            .map(|m| Claim {
                id: m.id,
                orchestrator_id: m.orchestrator_id,
                payload: m.payload,
                title: m.title,
                token: m.claim_token,
                attempt: m.attempts,
            })
            .collect();
        self.record_claims(&claims, machine).await;
        Ok(claims.into_iter().next())
    }

    /// Claimable job ids, oldest first: the read half of the article's naive path.
    pub async fn candidates(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<i64>> {
        let rows = self
            .query(
                "SELECT id FROM dispatch_queue
                  WHERE orchestrator_id = $1 AND claimed_at IS NULL AND state IN ('queued','failed')
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
        if limit == 0 {
            return Ok(vec![]);
        }
        if self.backend == DbBackend::Postgres {
            return Ok(self.claim_next_with(orchestrator_id, machine, limit, &PollExtras::default()).await?.claims);
        }
        self.claim_next_separate_history(orchestrator_id, machine, limit).await
    }

    /// The claim, then its history in a second statement (SQLite: no data-modifying CTEs).
    async fn claim_next_separate_history(
        &self,
        orchestrator_id: &str,
        machine: &str,
        limit: u32,
    ) -> Result<Vec<Claim>> {
        let rows = self
            .query(&claim_next_sql(), vec![orchestrator_id.into(), machine.into(), i64::from(limit).into()])
            .await?;
        let mut claims = rows.iter().map(claim_from_row).collect::<Result<Vec<_>>>()?;
        claims.sort_by_key(|c| c.id);
        self.record_claims(&claims, machine).await;
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
    /// On PostgreSQL the claims' history rows are written by the same statement too, so a
    /// claim and its "claimed" event commit together.
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
            let claims = if limit == 0 {
                vec![]
            } else {
                self.claim_next_separate_history(orchestrator_id, machine, limit).await?
            };
            return Ok(Polled { claims, stale: extras.stale_after.is_some() });
        }
        // $1 orchestrator, $2 machine, then the presence values ($3..$7, as in
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
                    "EXISTS (SELECT 1 FROM dispatch_queue WHERE orchestrator_id = $1 AND state = 'running'
                               AND COALESCE(heartbeat_at, claimed_at) < {{NOW}} - ${})",
                    values.len()
                )
            }
            None => "false".to_string(),
        };
        let sql = format!(
            "WITH {ctes}picked AS MATERIALIZED ({PICK}), claimed AS ({CLAIM_PICKED}), {CLAIM_HISTORY}
             SELECT c.*, s.stale FROM (SELECT {stale} AS stale) s LEFT JOIN claimed c ON true"
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

    /// History is best effort: a claim is valid whether or not its event was written.
    async fn record_claims(&self, claims: &[Claim], machine: &str) {
        let events: Vec<NewEvent> = claims
            .iter()
            .map(|c| NewEvent {
                job_id: c.id,
                orchestrator_id: &c.orchestrator_id,
                kind: "claimed",
                machine: Some(machine),
                token: Some(c.token),
                detail: Some(format!("attempt {}", c.attempt)),
                at: None,
            })
            .collect();
        if let Err(e) = self.record_events(&events).await {
            tracing::warn!(error = %e, "could not record claim history");
        }
    }

    // ---------------------------------------------------------------- fenced writes

    /// Renews the leases of the jobs this machine holds, in one statement. Returns the ids
    /// whose lease is still ours; every id missing from the answer has been lost.
    pub async fn renew(&self, held: &[(i64, i64)]) -> Result<Vec<i64>> {
        if held.is_empty() {
            return Ok(vec![]);
        }
        let (pairs, values) = pair_list(held, 0);
        let rows = self
            .query(
                &format!(
                    "UPDATE dispatch_queue SET heartbeat_at = {{NOW}}
                      WHERE (id, claim_token) IN ({pairs}) AND state = 'running'
                     RETURNING id"
                ),
                values,
            )
            .await?;
        ids_of(&rows)
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
        let (pairs, mut values) = pair_list(done, 0);
        let update = format!(
            "UPDATE dispatch_queue
                SET state = 'completed', completed_at = {{NOW}}, last_error = NULL
              WHERE (id, claim_token) IN ({pairs}) AND state = 'running'
             RETURNING id, claim_token, orchestrator_id"
        );
        // On PostgreSQL the completion and its history row commit in one statement.
        let in_statement = self.backend == DbBackend::Postgres;
        let sql = if in_statement {
            values.push(machine.into());
            format!(
                "WITH done AS ({update}), history AS (
                    INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, at)
                    SELECT id, orchestrator_id, 'completed', ${}, claim_token, {{NOW}} FROM done)
                 SELECT * FROM done",
                values.len()
            )
        } else {
            update
        };
        let rows = self.query(&sql, values).await?;
        let mut accepted = Vec::with_capacity(rows.len());
        let mut orchestrators = Vec::with_capacity(rows.len());
        for r in &rows {
            accepted.push((r.try_get::<i64>("", "id")?, r.try_get::<i64>("", "claim_token")?));
            orchestrators.push(r.try_get::<String>("", "orchestrator_id")?);
        }
        // PostgreSQL wrote the accepted completions' history in the statement; SQLite writes it here.
        let mut events: Vec<NewEvent> = accepted
            .iter()
            .zip(&orchestrators)
            .filter(|_| !in_statement)
            .map(|((id, token), o)| NewEvent {
                job_id: *id,
                orchestrator_id: o,
                kind: "completed",
                machine: Some(machine),
                token: Some(*token),
                detail: None,
                at: None,
            })
            .collect();
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
            let mut ours = Vec::with_capacity(rows.len());
            for r in &rows {
                ours.push((r.try_get::<i64>("", "id")?, r.try_get::<i64>("", "claim_token")?));
            }
            rejected.retain(|p| !ours.contains(p));
            accepted.extend(ours);
        }
        let rejected_orch = self.orchestrators_of(&rejected).await.unwrap_or_default();
        for ((id, token), orch) in rejected.iter().zip(&rejected_orch) {
            events.push(NewEvent {
                job_id: *id,
                orchestrator_id: orch,
                kind: "completion_rejected",
                machine: Some(machine),
                token: Some(*token),
                detail: Some("completion fenced: this machine no longer held the lease".into()),
                at: None,
            });
        }
        if let Err(e) = self.record_events(&events).await {
            tracing::warn!(error = %e, "could not record completion history");
        }
        Ok(accepted)
    }

    async fn orchestrators_of(&self, jobs: &[(i64, i64)]) -> Result<Vec<String>> {
        let mut out = Vec::with_capacity(jobs.len());
        for (id, _) in jobs {
            let rows =
                self.query("SELECT orchestrator_id FROM dispatch_queue WHERE id = $1", vec![(*id).into()]).await?;
            out.push(match rows.first() {
                Some(r) => r.try_get::<String>("", "orchestrator_id")?,
                None => String::new(),
            });
        }
        Ok(out)
    }

    /// Fails the current attempt if we still own it: back to the queue, or dead once it has
    /// used `max_attempts`. `Ok(None)` means the lease was lost; nothing was written.
    pub async fn fail(
        &self,
        id: i64,
        token: i64,
        machine: &str,
        error: &str,
        max_attempts: i32,
    ) -> Result<Option<FailOutcome>> {
        let rows = self
            .query(
                "UPDATE dispatch_queue
                    SET state = CASE WHEN attempts >= $3 THEN 'dead' ELSE 'failed' END,
                        dead_at = CASE WHEN attempts >= $3 THEN {NOW} ELSE NULL END,
                        failed_at = {NOW}, claimed_at = NULL, last_error = $4
                  WHERE id = $1 AND claim_token = $2 AND state = 'running'
                 RETURNING orchestrator_id, state",
                vec![id.into(), token.into(), max_attempts.into(), truncate(error, 2000).into()],
            )
            .await?;
        let Some(row) = rows.first() else {
            self.note(id, "lease_lost", machine, Some(token), "failure not recorded: lease lost").await;
            return Ok(None);
        };
        let orch: String = row.try_get("", "orchestrator_id")?;
        let dead = row.try_get::<String>("", "state")? == "dead";
        let ev = NewEvent {
            job_id: id,
            orchestrator_id: &orch,
            kind: if dead { "dead" } else { "failed" },
            machine: Some(machine),
            token: Some(token),
            detail: Some(truncate(error, 500)),
            at: None,
        };
        if let Err(e) = self.record_events(&[ev]).await {
            tracing::warn!(error = %e, "could not record failure history");
        }
        Ok(Some(if dead { FailOutcome::Dead } else { FailOutcome::WillRetry }))
    }

    /// Hands a job back so another machine can take it at once. The attempt is not counted
    /// against the job: handing off is a choice, not a failure.
    pub async fn release(&self, id: i64, token: i64, machine: &str, reason: &str) -> Result<bool> {
        let rows = self
            .query(
                "UPDATE dispatch_queue
                    SET state = 'queued', claimed_at = NULL, attempts = attempts - 1
                  WHERE id = $1 AND claim_token = $2 AND state = 'running'
                 RETURNING orchestrator_id, {NOW} AS at",
                vec![id.into(), token.into()],
            )
            .await?;
        let Some(row) = rows.first() else {
            self.note(
                id,
                "lease_lost",
                machine,
                Some(token),
                &format!("release not needed: lease already lost ({reason})"),
            )
            .await;
            return Ok(false);
        };
        let orch: String = row.try_get("", "orchestrator_id")?;
        let ev = NewEvent {
            job_id: id,
            orchestrator_id: &orch,
            kind: "handed_off",
            machine: Some(machine),
            token: Some(token),
            detail: Some(reason.to_string()),
            at: Some(row.try_get("", "at")?),
        };
        // The hand-off happened; its history row is retried like any loss note.
        if let Err(e) = retry_briefly(|| self.record_events(std::slice::from_ref(&ev))).await {
            tracing::warn!(error = %e, job = id, "could not record the hand-off");
        }
        Ok(true)
    }

    /// Administrative hand-off of everything `machine` holds (for `devpilot release` when
    /// the machine itself cannot do it). The holder's later writes fail its fencing check.
    pub async fn release_machine(&self, orchestrator_id: &str, machine: &str) -> Result<Vec<i64>> {
        let rows = self
            .query(
                "UPDATE dispatch_queue
                    SET state = 'queued', claimed_at = NULL, attempts = attempts - 1
                  WHERE orchestrator_id = $1 AND claimed_by = $2 AND state = 'running'
                 RETURNING id, claim_token, {NOW} AS at",
                vec![orchestrator_id.into(), machine.into()],
            )
            .await?;
        let mut ids = Vec::new();
        let mut events = Vec::new();
        for r in &rows {
            let id: i64 = r.try_get("", "id")?;
            ids.push(id);
            events.push(NewEvent {
                job_id: id,
                orchestrator_id,
                kind: "handed_off",
                machine: Some(machine),
                token: Some(r.try_get("", "claim_token")?),
                detail: Some("released by `devpilot release`".into()),
                at: Some(r.try_get("", "at")?),
            });
        }
        if let Err(e) = self.record_events(&events).await {
            tracing::warn!(error = %e, "could not record release history");
        }
        ids.sort_unstable();
        Ok(ids)
    }

    // ---------------------------------------------------------------- sweep

    /// Releases every claim whose last sign of life is older than `claim_timeout`; a job that
    /// has used `max_attempts` becomes dead instead. The staleness test is in this same
    /// statement's WHERE, so a sweep can never touch a fresh claim or a finished job.
    /// `orchestrator_id = None` sweeps every orchestrator (the backstop command).
    pub async fn sweep(
        &self,
        orchestrator_id: Option<&str>,
        claim_timeout: Duration,
        max_attempts: i32,
    ) -> Result<Vec<Swept>> {
        let timeout_ms = i64::try_from(claim_timeout.as_millis()).unwrap_or(i64::MAX / 4);
        let mut values: Vec<Value> = vec![timeout_ms.into(), max_attempts.into()];
        let scope = match orchestrator_id {
            Some(o) => {
                values.push(o.into());
                "AND orchestrator_id = $3"
            }
            None => "",
        };
        let rows = self
            .query(
                &format!(
                    "UPDATE dispatch_queue
                        SET state = CASE WHEN attempts >= $2 THEN 'dead' ELSE 'queued' END,
                            dead_at = CASE WHEN attempts >= $2 THEN {{NOW}} ELSE NULL END,
                            claimed_at = NULL,
                            last_error = 'lease expired: no heartbeat from '
                                         || COALESCE(claimed_by, '?')
                      WHERE state = 'running'
                        AND COALESCE(heartbeat_at, claimed_at) < {{NOW}} - $1
                        {scope}
                     RETURNING id, orchestrator_id, claimed_by, claim_token, state, {{NOW}} AS at"
                ),
                values,
            )
            .await?;
        let mut swept = Vec::with_capacity(rows.len());
        for r in &rows {
            swept.push(Swept {
                id: r.try_get("", "id")?,
                orchestrator_id: r.try_get("", "orchestrator_id")?,
                previous_holder: r.try_get("", "claimed_by")?,
                token: r.try_get("", "claim_token")?,
                dead: r.try_get::<String>("", "state")? == "dead",
                at: r.try_get("", "at")?,
            });
        }
        swept.sort_by_key(|s| s.id);
        let events: Vec<NewEvent> = swept
            .iter()
            .map(|s| NewEvent {
                job_id: s.id,
                orchestrator_id: &s.orchestrator_id,
                kind: if s.dead { "dead" } else { "swept" },
                machine: s.previous_holder.as_deref(),
                token: Some(s.token),
                detail: Some(format!("no heartbeat for {}", humantime::format_duration(claim_timeout))),
                at: Some(s.at),
            })
            .collect();
        if let Err(e) = self.record_events(&events).await {
            tracing::warn!(error = %e, "could not record sweep history");
        }
        Ok(swept)
    }

    // ---------------------------------------------------------------- user actions

    /// Puts a dead (or failed) job back in the queue with a fresh attempt budget.
    pub async fn requeue(&self, id: i64, by: &str) -> Result<bool> {
        let rows = self
            .query(
                "UPDATE dispatch_queue
                    SET state = 'queued', attempts = 0, claimed_at = NULL, dead_at = NULL
                  WHERE id = $1 AND state IN ('dead','failed','cancelled')
                 RETURNING id",
                vec![id.into()],
            )
            .await?;
        if rows.is_empty() {
            return Ok(false);
        }
        self.note(id, "requeued", by, None, "requeued by the user").await;
        Ok(true)
    }

    /// Cancels a job that nobody has claimed yet.
    pub async fn cancel(&self, id: i64, by: &str) -> Result<bool> {
        let rows = self
            .query(
                "UPDATE dispatch_queue SET state = 'cancelled'
                  WHERE id = $1 AND claimed_at IS NULL AND state IN ('queued','failed')
                 RETURNING id",
                vec![id.into()],
            )
            .await?;
        if rows.is_empty() {
            return Ok(false);
        }
        self.note(id, "cancelled", by, None, "cancelled by the user").await;
        Ok(true)
    }

    // ---------------------------------------------------------------- history

    /// Writes history entries in one statement.
    pub async fn record_events(&self, events: &[NewEvent<'_>]) -> Result<()> {
        for chunk in events.chunks(150) {
            if chunk.is_empty() {
                continue;
            }
            let mut sql = String::from(
                "INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at) VALUES ",
            );
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 7);
            for (i, e) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                let n = values.len();
                sql.push_str(&format!(
                    "(${}, ${}, ${}, ${}, ${}, ${}, COALESCE(${}, {{NOW}}))",
                    n + 1,
                    n + 2,
                    n + 3,
                    n + 4,
                    n + 5,
                    n + 6,
                    n + 7
                ));
                values.push(e.job_id.into());
                values.push(e.orchestrator_id.into());
                values.push(e.kind.into());
                values.push(e.machine.map(str::to_string).into());
                values.push(e.token.into());
                values.push(e.detail.clone().into());
                values.push(e.at.into());
            }
            self.exec(&sql, values).await?;
        }
        Ok(())
    }

    /// Records one history entry for a job (a loss, a hand-off, a user action). These entries
    /// are the only trace of why a job moved without a state change of ours, so a database
    /// blip is retried for a while before giving up.
    pub async fn note(&self, id: i64, kind: &str, machine: &str, token: Option<i64>, detail: &str) {
        if let Err(e) = retry_briefly(|| self.note_once(id, kind, machine, token, detail)).await {
            tracing::warn!(error = %e, job = id, kind, "could not record history");
        }
    }

    async fn note_once(&self, id: i64, kind: &str, machine: &str, token: Option<i64>, detail: &str) -> Result<()> {
        let orch = self.orchestrators_of(&[(id, 0)]).await?.pop().unwrap_or_default();
        let ev = NewEvent {
            job_id: id,
            orchestrator_id: &orch,
            kind,
            machine: Some(machine),
            token,
            detail: Some(detail.to_string()),
            at: None,
        };
        self.record_events(&[ev]).await
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
            match r.try_get::<String>("", "state")?.as_str() {
                "queued" => c.queued = n,
                "running" => c.running = n,
                "failed" => c.failed = n,
                "completed" => c.completed = n,
                "dead" => c.dead = n,
                "cancelled" => c.cancelled = n,
                _ => {}
            }
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
                      WHERE orchestrator_id = $1 AND state = 'running' ORDER BY claimed_at, id"
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
                        concurrency, {NOW} AS now
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
                    now: r.try_get("", "now")?,
                })
            })
            .collect()
    }
}

/// A history entry to write.
#[derive(Clone, Debug)]
pub struct NewEvent<'a> {
    pub job_id: i64,
    pub orchestrator_id: &'a str,
    pub kind: &'a str,
    pub machine: Option<&'a str>,
    pub token: Option<i64>,
    pub detail: Option<String>,
    /// When the job moved, if the statement that moved it said so (its `{NOW}`); else the
    /// time the history row is written.
    pub at: Option<i64>,
}

const JOB_COLUMNS: &str = "id, orchestrator_id, title, state, attempts, claimed_by, claim_token, \
     created_at, claimed_at, heartbeat_at, completed_at, last_error";

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

/// Retries a history write through a database blip: six tries over about six seconds.
async fn retry_briefly<F, Fut>(mut write: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut wait = Duration::from_millis(200);
    let mut last = write().await;
    for _ in 0..5 {
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
        last = write().await;
    }
    last
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

fn ids_of(rows: &[QueryResult]) -> Result<Vec<i64>> {
    rows.iter().map(|r| Ok(r.try_get::<i64>("", "id")?)).collect()
}

fn first_i64(rows: &[QueryResult], col: &str) -> Result<i64> {
    match rows.first() {
        Some(r) => Ok(r.try_get("", col)?),
        None => Err(Error::Db(format!("no row returned for {col}"))),
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
