//! The SQL dialect of this module's statements and its substitution per backend, and the SQL
//! fragments the state changes share.

use sea_orm::{DbBackend, Statement, Value};

use super::Queue;
use crate::job::{event, state_in, JobState};

/// Milliseconds since the epoch, from the database's clock.
const PG_NOW: &str = "((extract(epoch from now()) * 1000)::bigint)";
const SQLITE_NOW: &str = "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))";

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
pub(super) fn backoff_ms(b: &str, m: &str, j: &str) -> String {
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
pub(super) fn unless_cancelled(otherwise: &str) -> String {
    format!("CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE {otherwise} END")
}

/// The history kind over a changed row: `cancelled` if it ended cancelled, `dead` if dead,
/// else `other`.
pub(super) fn kind_of_end(other: &str) -> String {
    format!(
        "CASE WHEN state = 'cancelled' THEN '{}' WHEN state = 'dead' THEN '{}' ELSE '{other}' END",
        event::CANCELLED,
        event::DEAD
    )
}

pub(super) fn postgres_dialect(sql: &str) -> String {
    states(sql)
        .replace("{NOW}", PG_NOW)
        .replace("{SKIP_LOCKED}", "FOR UPDATE SKIP LOCKED")
        .replace("{RUN_AT_ISO}", PG_RUN_AT_ISO)
        .replace("{REQUIRES_EACH}", "jsonb_array_elements_text(dispatch_queue.requires::jsonb) AS r(value)")
}

impl Queue {
    /// Builds a statement from this module's SQL dialect: `$n` placeholders, `{NOW}` for the
    /// database clock, `{SKIP_LOCKED}` where PostgreSQL should skip rows others hold, and the
    /// state sets of [`JobState`]. SQLite serialises writers, so it needs no SKIP LOCKED and
    /// takes `?n` placeholders.
    pub(super) fn stmt(&self, sql: &str, values: Vec<Value>) -> Statement {
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
}
