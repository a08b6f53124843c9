//! The claims: one known job by id, and the herd-free pick-and-claim with a poll's
//! housekeeping.

use std::time::Duration;

use sea_orm::{DbBackend, Value};

use super::dialect::postgres_dialect;
use super::history::{Detail, History, ATTEMPT};
use super::options::{millis, ms_duration};
use super::presence::{presence_values, PollExtras, PRESENCE_UPSERT};
use super::route::Route;
use super::rows::{claim_from_row, ids_of, Claim, Polled};
use super::Queue;
use crate::error::Result;

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

/// The claim of job $1 of orchestrator $2 by machine $3, if nobody holds it and it is due.
const CLAIM_BY_ID: &str = "UPDATE dispatch_queue
                    SET state = 'running', claimed_at = {NOW}, heartbeat_at = {NOW},
                        claimed_by = $3, claim_token = claim_token + 1, attempts = attempts + 1,
                        release_requested_at = NULL
                  WHERE id = $1 AND orchestrator_id = $2
                    AND claimed_at IS NULL AND {CLAIMABLE} AND run_at <= {NOW}";

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

/// The history of a claim: kind and detail over the claimed row.
const CLAIMED: History<'static> = History { kind: "'claimed'", machine: None, detail: Detail::Attempt };

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

impl Queue {
    /// The claim of one known job, as "Claiming work exactly once, with one UPDATE" writes
    /// it: the precondition in the WHERE clause ([`CLAIM_BY_ID`]), its history in the same
    /// statement. `Ok(None)` means another machine won (or the job is finished): move on.
    pub async fn claim_by_id(&self, id: i64, orchestrator_id: &str, machine: &str) -> Result<Option<Claim>> {
        let sql = format!("{CLAIM_BY_ID} RETURNING {CLAIM_COLUMNS}");
        let rows = self.change(&sql, vec![id.into(), orchestrator_id.into(), machine.into()], &CLAIMED).await?;
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
            let next_due =
                if (claims.len() as u32) < limit { self.next_waiting(orchestrator_id, route).await? } else { None };
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

    /// How long until the next claimable job of the orchestrator that `route` may take is
    /// due: zero or less when one is due already (SQLite's half of a poll's `next_due`).
    async fn next_waiting(&self, orchestrator_id: &str, route: &Route) -> Result<Option<Duration>> {
        let mut values: Vec<Value> = vec![orchestrator_id.into()];
        let sql = NEXT_WAITING.replace("{ROUTE}", &route.sql(&mut values));
        let rows = self.query(&sql, values).await?;
        let ms = match rows.first() {
            Some(r) => r.try_get::<Option<i64>>("", "next_due")?,
            None => None,
        };
        Ok(ms.map(ms_duration))
    }
}
