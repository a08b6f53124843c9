//! The SQL dialect of each backend ([`Dialect`]), the statements rendered once per backend
//! from it ([`Sql`]), and the SQL fragments the state changes share.

use std::sync::{LazyLock, OnceLock};

use sea_orm::{DbBackend, Statement, Value};

use super::pool::Queue;
use crate::job::{event, state_in, JobState};

/// What differs between the backends' SQL, and the state predicates of [`JobState`]'s sets,
/// which both share. One per backend: [`POSTGRES`] and [`SQLITE`].
#[derive(Debug)]
pub(super) struct Dialect {
    /// PostgreSQL (else SQLite).
    pub(super) postgres: bool,
    /// Milliseconds since the epoch, from the database's clock.
    pub(super) now: &'static str,
    /// Where PostgreSQL should skip rows others hold; empty on SQLite, which serialises
    /// writers.
    pub(super) skip_locked: &'static str,
    /// `run_at` as RFC 3339 (UTC), for history details.
    pub(super) run_at_iso: &'static str,
    /// The labels a job requires, as a table `r` with a column `value`.
    pub(super) requires_each: &'static str,
    /// The tracker issue a job came from (`payload.source`): `issue` (its identifier) and
    /// `issue_url`, and the name of the source that added it (`source`), for listings.
    pub(super) issue_columns: &'static str,
    /// How parameter n is written: `$n` on PostgreSQL, `?n` on SQLite.
    pub(super) param: char,
    /// `state IN (…)` of [`JobState::CLAIMABLE`].
    pub(super) claimable: String,
    /// `state IN ('running')`.
    pub(super) running: String,
    /// `state IN (…)` of [`JobState::FINISHED`].
    pub(super) finished: String,
    /// `state IN (…)` of [`JobState::REQUEUEABLE`].
    pub(super) requeueable: String,
    /// `state IN (…)` of [`JobState::LIVE`].
    pub(super) live: String,
}

/// PostgreSQL's dialect.
pub(super) static POSTGRES: LazyLock<Dialect> = LazyLock::new(|| Dialect {
    postgres: true,
    now: "((extract(epoch from now()) * 1000)::bigint)",
    skip_locked: "FOR UPDATE SKIP LOCKED",
    run_at_iso: "to_char(to_timestamp(run_at / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
    requires_each: "jsonb_array_elements_text(dispatch_queue.requires::jsonb) AS r(value)",
    issue_columns: "payload->'source'->>'identifier' AS issue, payload->'source'->>'url' AS issue_url, \
                    payload->'source'->>'name' AS source",
    param: '$',
    ..Dialect::shared()
});

/// SQLite's dialect.
pub(super) static SQLITE: LazyLock<Dialect> = LazyLock::new(|| Dialect {
    postgres: false,
    now: "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))",
    skip_locked: "",
    run_at_iso: "strftime('%Y-%m-%dT%H:%M:%SZ', run_at / 1000, 'unixepoch')",
    requires_each: "json_each(dispatch_queue.requires) AS r",
    // The same operators as PostgreSQL's (SQLite 3.38+): a `$` path would be read as a
    // parameter when the statement is rendered.
    issue_columns: "payload -> 'source' ->> 'identifier' AS issue, payload -> 'source' ->> 'url' AS issue_url, \
                    payload -> 'source' ->> 'name' AS source",
    param: '?',
    ..Dialect::shared()
});

impl Dialect {
    /// The state predicates, and SQLite's fragments until a backend's own replace them.
    fn shared() -> Self {
        Self {
            postgres: false,
            now: "",
            skip_locked: "",
            run_at_iso: "",
            requires_each: "",
            issue_columns: "",
            param: '?',
            claimable: state_in(&JobState::CLAIMABLE),
            running: state_in(&[JobState::Running]),
            finished: state_in(&JobState::FINISHED),
            requeueable: state_in(&JobState::REQUEUEABLE),
            live: state_in(&JobState::LIVE),
        }
    }

    /// The dialect of `backend` (anything but PostgreSQL is SQLite).
    pub(super) fn of(backend: DbBackend) -> &'static Dialect {
        match backend {
            DbBackend::Postgres => &POSTGRES,
            _ => &SQLITE,
        }
    }

    /// Parameter `n`, as this backend writes it.
    pub(super) fn p(&self, n: usize) -> String {
        format!("{}{n}", self.param)
    }

    /// Parameters `from`, `from + 1`, …: `let [a, b] = d.params(1);`.
    pub(super) fn params<const N: usize>(&self, from: usize) -> [String; N] {
        std::array::from_fn(|i| self.p(from + i))
    }
}

/// A statement whose text depends on the backend only: written once, as a render function
/// over the [`Dialect`] with `$n` parameters, and rendered once per backend at first use
/// (`$n` becomes `?n` on SQLite then, never per call).
pub(super) struct Sql {
    render: fn(&Dialect) -> String,
    /// The text on PostgreSQL, and on SQLite.
    texts: [OnceLock<String>; 2],
}

impl Sql {
    /// A statement rendered by `render`.
    pub(super) const fn new(render: fn(&Dialect) -> String) -> Self {
        Self { render, texts: [OnceLock::new(), OnceLock::new()] }
    }

    /// The text in dialect `d`.
    pub(super) fn of(&'static self, d: &Dialect) -> &'static str {
        self.texts[usize::from(!d.postgres)].get_or_init(|| {
            let sql = (self.render)(d);
            if d.param == '$' {
                sql
            } else {
                sql.replace('$', &d.param.to_string())
            }
        })
    }
}

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

impl Queue {
    /// This queue's dialect.
    pub(super) fn dialect(&self) -> &'static Dialect {
        Dialect::of(self.backend)
    }

    /// The text of `sql` on this queue's backend.
    pub(super) fn sql(&self, sql: &'static Sql) -> &'static str {
        sql.of(self.dialect())
    }

    /// A statement whose text is in this backend's dialect already (a [`Sql`], or one built
    /// per call from the [`Dialect`]'s fields).
    pub(super) fn stmt(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend, sql, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static EXAMPLE: Sql =
        Sql::new(|d| format!("SELECT {now} WHERE id = $1 AND {running}", now = d.now, running = d.running));

    /// A statement is rendered once per backend, with SQLite's parameters as `?n`.
    #[test]
    fn rendered_once_per_backend() {
        let pg = EXAMPLE.of(&POSTGRES);
        assert_eq!(pg, format!("SELECT {} WHERE id = $1 AND state IN ('running')", POSTGRES.now));
        assert!(std::ptr::eq(pg, EXAMPLE.of(&POSTGRES)), "the same text, not a new one");
        assert_eq!(EXAMPLE.of(&SQLITE), format!("SELECT {} WHERE id = ?1 AND state IN ('running')", SQLITE.now));
        let [a, b] = SQLITE.params(3);
        assert_eq!((a.as_str(), b.as_str(), POSTGRES.p(2).as_str()), ("?3", "?4", "$2"));
    }
}
