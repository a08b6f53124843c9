//! The claims: one known job by id, and the herd-free pick-and-claim with a poll's
//! housekeeping.

use std::borrow::Cow;
use std::time::Duration;

use sea_orm::{FromQueryResult, Value};

use super::call::{outbox_cte, HISTORY_RETURNING};
use super::dialect::{kind_of_end, Dialect, Sql, POSTGRES};
use super::fence::{pair_list, Fence};
use super::fenced::completion_sql;
use super::history::{Detail, History, ATTEMPT};
use super::options::{millis, ms_duration};
use super::pool::Queue;
use super::presence::{presence_values, PollExtras, PRESENCE_UPSERT};
use super::route::Route;
use super::rows::{decode, decode_first, ids_of, Claim, Polled};
use crate::error::Result;
use crate::job::{event, JobState};

/// The herd-free pick: the claimable rows that are due, highest priority first, then by when
/// they became claimable (`run_at`: enqueue, scheduled start or end of a retry backoff), then
/// by id; skipping rows another claimer holds. `limit` is the batch size: a placeholder, or the number itself.
/// The order is exactly the key of the partial index `dispatch_queue_pick`, so the index
/// serves it with no sort, and no other index can (ordering by `id` alone once let the
/// planner walk the primary key past every claimed row; see the claim-order migration).
/// `route` is the machine's routing predicate ([`Route`]): its repos and labels.
fn pick(d: &Dialect, route: &str, limit: &str) -> String {
    format!(
        "SELECT id FROM dispatch_queue
                     WHERE orchestrator_id = {o}
                       AND claimed_at IS NULL AND {claimable} AND run_at <= {now} AND {route}
                     ORDER BY priority DESC, run_at, id
                     LIMIT {limit}
                     {skip_locked}",
        o = d.p(1),
        claimable = d.claimable,
        now = d.now,
        skip_locked = d.skip_locked,
    )
}

/// Milliseconds from now until the earliest claimable job of orchestrator $1 that `route`
/// lets through is due (negative when it is due already), for a poll that claimed less than
/// it asked for: its timer is capped by it. `AND run_at > now` narrows it to the jobs not
/// yet due.
fn next_waiting_sql(d: &Dialect, route: &str) -> String {
    format!(
        "SELECT MIN(run_at) - {now} AS next_due FROM dispatch_queue
                             WHERE orchestrator_id = {o} AND claimed_at IS NULL AND {claimable} AND {route}",
        now = d.now,
        o = d.p(1),
        claimable = d.claimable,
    )
}

/// The claim of job $1 of orchestrator $2 by machine $3, if nobody holds it and it is due.
static CLAIM_BY_ID: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue
                    SET state = 'running', claimed_at = {now}, heartbeat_at = {now},
                        claimed_by = $3, claim_token = claim_token + 1, attempts = attempts + 1,
                        release_requested_at = NULL, parked_for = NULL, account = NULL
                  WHERE id = $1 AND orchestrator_id = $2
                    AND claimed_at IS NULL AND {claimable} AND run_at <= {now} RETURNING {CLAIM_COLUMNS}",
        now = d.now,
        claimable = d.claimable,
    )
});

/// The claim of what `picked` chose ($2 is the machine). The precondition is repeated in
/// the WHERE so that a row claimed by someone else in between is simply not ours.
static CLAIM_PICKED: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue
                    SET state = 'running', claimed_at = {now}, heartbeat_at = {now},
                        claimed_by = $2, claim_token = claim_token + 1, attempts = attempts + 1,
                        release_requested_at = NULL, parked_for = NULL, account = NULL
                  WHERE id IN (SELECT id FROM picked)
                    AND claimed_at IS NULL AND {claimable} AND run_at <= {now}
                 RETURNING {CLAIM_COLUMNS}",
        now = d.now,
        claimable = d.claimable,
    )
});

/// What a claim returns ([`Claim`]).
const CLAIM_COLUMNS: &str =
    "id, orchestrator_id, payload, title, claim_token, attempts, claimed_by, state, resume_branch, resumed_from, repo, source_id, follow_ups,
     CAST(COALESCE(cost_usd, 0) - cap_base_usd AS DOUBLE PRECISION) AS spent_usd";

/// The history of a claim: kind and detail over the claimed row.
const CLAIMED: History<'static> = History { kind: "'claimed'", machine: None, detail: Detail::Attempt };

/// [`Queue::claim_next`] for a machine with no route (only jobs with no repo and no labels):
/// $1 orchestrator, $2 machine, $3 limit.
static CLAIM_NEXT: Sql = Sql::new(|d| claim_next_routed(d, &Route::default(), &mut vec![]));

/// The text of [`Queue::claim_next`] as PostgreSQL receives it ($1 orchestrator, $2
/// machine, $3 limit), so the benchmark can hand pgbench exactly this statement.
pub fn claim_next_sql_postgres() -> &'static str {
    CLAIM_NEXT.of(&POSTGRES)
}

/// [`Queue::claim_next`]'s statement in dialect `d` for a machine with `route`, whose names
/// become parameters after `values` ($1 orchestrator, $2 machine, $3 limit).
fn claim_next_routed(d: &Dialect, route: &Route, values: &mut Vec<Value>) -> String {
    format!("WITH picked AS MATERIALIZED ({}) {}", pick(d, &route.sql(d, values), &d.p(3)), CLAIM_PICKED.of(d))
}

/// The first row of a poll on PostgreSQL: its housekeeping answers, and whether it claimed.
#[derive(FromQueryResult)]
struct PollRow {
    stale: bool,
    next_due: Option<i64>,
    /// The completions it carried that ended their claims ([`Ended`]), as JSON; NULL when
    /// it carried none or none was ours any more.
    ended: Option<serde_json::Value>,
    /// NULL on the one row of a poll that claimed nothing.
    id: Option<i64>,
}

/// One completion a poll carried, as its `ended` column says it.
#[derive(serde::Deserialize)]
struct Ended {
    id: i64,
    claim_token: i64,
    state: JobState,
}

/// What `ended` says: the fences and their end states.
fn ended_of_json(ended: Option<serde_json::Value>) -> Result<Vec<(Fence, JobState)>> {
    let Some(v) = ended else { return Ok(vec![]) };
    let rows: Vec<Ended> =
        serde_json::from_value(v).map_err(|e| crate::error::Error::Invalid(format!("a poll's completions: {e}")))?;
    Ok(rows.into_iter().map(|e| (Fence { job: e.id, token: e.claim_token }, e.state)).collect())
}

/// The completions riding a poll on PostgreSQL ($2 is the machine): the fenced UPDATE of
/// `complete_many` as a CTE `done` added to `ctes`, its pairs added to `values`. Returns the
/// poll's `ended` column and the history rows to add to the claims'. Its rows are this
/// machine's running claims and the pick's are unclaimed ones, so no row changes twice.
fn carried(d: &Dialect, done: &[Fence], values: &mut Vec<Value>, ctes: &mut String) -> (String, String) {
    if done.is_empty() {
        return ("NULL::json".into(), String::new());
    }
    let (pairs, more) = pair_list(d, done, values.len());
    values.extend(more);
    ctes.push_str(&format!("done AS ({}), ", completion_sql(d, &pairs)));
    let ended = "(SELECT json_agg(json_build_object('id', id, 'claim_token', claim_token, 'state', state)) FROM done)";
    let history = format!(
        " UNION ALL SELECT id, orchestrator_id, {kind}, $2, claim_token, NULL, {now} FROM done",
        kind = kind_of_end(event::COMPLETED),
        now = d.now
    );
    (ended.into(), history)
}

/// How long until the next waiting job is due (SQLite's half of a poll).
#[derive(FromQueryResult)]
struct NextDue {
    next_due: Option<i64>,
}

impl Queue {
    /// The claim of one known job, as "Claiming work exactly once, with one UPDATE" writes
    /// it: the precondition in the WHERE clause ([`CLAIM_BY_ID`]), its history in the same
    /// statement. `Ok(None)` means another machine won (or the job is finished): move on.
    pub async fn claim_by_id(&self, id: i64, orchestrator_id: &str, machine: &str) -> Result<Option<Claim>> {
        let values = vec![id.into(), orchestrator_id.into(), machine.into()];
        decode_first(&self.change(self.sql(&CLAIM_BY_ID), values, &CLAIMED).await?)
    }

    /// Claimable job ids, oldest first: the read half of the article's naive path.
    pub async fn candidates(&self, orchestrator_id: &str, limit: u32) -> Result<Vec<i64>> {
        self.candidates_for(orchestrator_id, limit, &Route::default()).await
    }

    /// [`Queue::candidates`] a machine with `route` may take.
    pub async fn candidates_for(&self, orchestrator_id: &str, limit: u32, route: &Route) -> Result<Vec<i64>> {
        let d = self.dialect();
        let mut values: Vec<Value> = vec![orchestrator_id.into(), i64::from(limit).into()];
        let [o, n] = d.params(1);
        let sql = format!(
            "SELECT id FROM dispatch_queue
              WHERE orchestrator_id = {o} AND claimed_at IS NULL AND {claimable} AND run_at <= {now} AND {route}
              ORDER BY priority DESC, run_at, id LIMIT {n}",
            claimable = d.claimable,
            now = d.now,
            route = route.sql(d, &mut values)
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
        let sql = if *route == Route::default() {
            Cow::Borrowed(self.sql(&CLAIM_NEXT))
        } else {
            Cow::Owned(claim_next_routed(self.dialect(), route, &mut values))
        };
        let rows = self.change(&sql, values, &CLAIMED).await?;
        let mut claims: Vec<Claim> = decode(&rows)?;
        claims.sort_by_key(|c| c.fence.job);
        Ok(claims)
    }

    /// [`Queue::claim_next`] plus an idle machine's housekeeping, so that a backed-off poll
    /// is ONE statement on PostgreSQL (a serverless database can then sleep between polls):
    /// the presence upsert rides along as a data-modifying CTE, and the stale-lease test is a
    /// read-only `EXISTS`. The sweep itself stays a separate statement that the caller
    /// spawns only when `stale` says there is something to sweep, so a failing sweep can
    /// still never fail a poll. SQLite has no data-modifying CTEs: there the presence row is
    /// written by its own statement, `stale` is always true when asked (sweep as before), and
    /// the claim's transaction runs only when a read of the next due time says a job is due.
    ///
    /// A machine whose agents succeeded names their claims in `extras.done`: they are
    /// completed by [`Queue::complete_many`]'s fenced UPDATE, on PostgreSQL in this same
    /// statement (a data-modifying CTE), on SQLite in the statement before it. So a machine
    /// with a completion and a free slot sends one statement for both. The poll says which
    /// it ended and nothing more: a fence it did not end goes to `complete_many`, which tells
    /// a fenced-off claim (and notes it) from one this machine had ended already.
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
        if self.dialect().postgres {
            return self.poll_postgres(orchestrator_id, machine, limit, extras, route).await;
        }
        // No data-modifying CTEs: the completions go first, in their own statement.
        let completed =
            if extras.done.is_empty() { vec![] } else { self.complete_fenced(extras.done, machine).await? };
        if let Some(p) = &extras.presence {
            if let Err(e) = self.heartbeat_machine(p).await {
                tracing::debug!(error = %e, "presence update failed");
            }
        }
        if limit == 0 {
            return Ok(Polled { claims: vec![], stale: extras.stale_after.is_some(), next_due: None, completed });
        }
        // The read first: the claim picks from the jobs it counts, those due now. An idle
        // machine's poll is then this read and no transaction (BEGIN, an UPDATE of no row,
        // COMMIT): three round trips to the connection's thread, and its ping, fewer.
        let waiting = self.next_waiting(orchestrator_id, route).await?;
        if waiting.is_none_or(|wait| !wait.is_zero()) {
            return Ok(Polled { claims: vec![], stale: extras.stale_after.is_some(), next_due: waiting, completed });
        }
        let claims = self.claim_next_sqlite(orchestrator_id, machine, limit, route).await?;
        // Its own statement again, so a job that fell due after the claim is due now (a
        // wait of zero), not skipped: on SQLite no NOTIFY would tell.
        let next_due =
            if (claims.len() as u32) < limit { self.next_waiting(orchestrator_id, route).await? } else { None };
        Ok(Polled { claims, stale: extras.stale_after.is_some(), next_due, completed })
    }

    /// PostgreSQL's [`Queue::claim_next_with`]: the poll in one statement.
    async fn poll_postgres(
        &self,
        orchestrator_id: &str,
        machine: &str,
        limit: u32,
        extras: &PollExtras<'_>,
        route: &Route,
    ) -> Result<Polled> {
        let d = self.dialect();
        // PostgreSQL's text, so `$n` as it is. $1 orchestrator, $2 machine, then the presence
        // values ($3..$12, as in PRESENCE_UPSERT), then the staleness threshold.
        let mut values: Vec<Value> = vec![orchestrator_id.into(), machine.into()];
        let mut ctes = String::new();
        if let Some(p) = &extras.presence {
            values.extend(presence_values(p).into_iter().skip(2));
            ctes = format!("presence AS ({} RETURNING 1), ", self.sql(&PRESENCE_UPSERT));
        }
        // The limit is written into the text, never a parameter: a prepared statement whose
        // generic plan knows its LIMIT claims what it picked by the primary key, so after five
        // calls PostgreSQL keeps that plan and stops planning the poll at every call (0.9 ms
        // of its 3.1). With `LIMIT $n` the generic plan guessed a tenth of the table and
        // hashed a scan of all of it, so every call was planned anew (`bench/NOTES.md`). One
        // prepared statement per number of free slots a machine has had: a handful.
        let limit_at = limit.to_string();
        let stale = match extras.stale_after {
            Some(after) => {
                values.push(millis(after).into());
                format!(
                    "EXISTS (SELECT 1 FROM dispatch_queue WHERE orchestrator_id = $1 AND {running}
                               AND COALESCE(heartbeat_at, claimed_at) < {now} - {after})",
                    running = d.running,
                    now = d.now,
                    after = d.p(values.len())
                )
            }
            None => "false".to_string(),
        };
        let route_sql = route.sql(d, &mut values);
        let (ended, ended_history) = carried(d, extras.done, &mut values, &mut ctes);
        let sql = format!(
            "WITH {ctes}picked AS MATERIALIZED ({pick}), claimed AS ({claim}), history AS (
                 INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
                 SELECT id, orchestrator_id, {kind}, $2, claim_token, {detail}, {now} FROM claimed{ended_history}
                 {HISTORY_RETURNING}), {outbox}
             SELECT c.*, s.stale, s.next_due, s.ended FROM (SELECT {stale} AS stale, {ended} AS ended,
                    CASE WHEN (SELECT COUNT(*) FROM claimed) < {limit_at} THEN ({next_waiting} AND run_at > {now}) END AS next_due) s
               LEFT JOIN claimed c ON true",
            pick = pick(d, &route_sql, &limit_at),
            claim = self.sql(&CLAIM_PICKED),
            next_waiting = next_waiting_sql(d, &route_sql),
            kind = CLAIMED.kind,
            detail = ATTEMPT,
            now = d.now,
            outbox = outbox_cte(),
        );
        let rows = self.query(&sql, values).await?;
        let mut head = None;
        let mut claims = vec![];
        for (row, r) in decode::<PollRow>(&rows)?.into_iter().zip(&rows) {
            if row.id.is_some() {
                claims.push(Claim::from_query_result(r, "")?);
            }
            head.get_or_insert((row.stale, row.next_due, row.ended));
        }
        let (stale, next_due, ended) = head.unwrap_or((false, None, None));
        claims.sort_by_key(|c| c.fence.job);
        // Committed: from here nothing may fail the poll, or its claims would be neither run
        // nor held until the sweep. A carried completion the answer does not name is left to
        // its job's task ([`Polled::completed`]).
        let completed = ended_of_json(ended).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not read which carried completions ended; their jobs complete them");
            vec![]
        });
        Ok(Polled { claims, stale, next_due: next_due.map(ms_duration), completed })
    }

    /// How long until the next claimable job of the orchestrator that `route` may take is
    /// due: zero or less when one is due already (SQLite's half of a poll's `next_due`).
    async fn next_waiting(&self, orchestrator_id: &str, route: &Route) -> Result<Option<Duration>> {
        let d = self.dialect();
        let mut values: Vec<Value> = vec![orchestrator_id.into()];
        let sql = next_waiting_sql(d, &route.sql(d, &mut values));
        let rows = self.query(&sql, values).await?;
        Ok(decode_first::<NextDue>(&rows)?.and_then(|r| r.next_due).map(ms_duration))
    }
}
