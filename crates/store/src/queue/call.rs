//! How every statement is sent: bounded, prepared or inlined (pooled mode), never with a NUL;
//! a state change with its history ([`Queue::change`]); the clock and NOTIFY.

use std::sync::atomic::Ordering;

use sea_orm::{ConnectionTrait, DbBackend, QueryResult, Statement, TransactionTrait, Value};

use super::dialect::Sql;
use super::history::History;
use super::pool::Queue;
use super::rows::{first_i64, ids_of};
use crate::error::{Error, Result};

/// Which table [`Queue::history_of`] writes.
#[derive(Clone, Copy)]
enum Target {
    History,
    Outbox,
}

/// A write that commits with a state change ([`Queue::change_after`]): its text in dialect
/// `d`, whose parameters start after the first `n` (`d.p(n + 1)` is its first value), and
/// its values. It must be guarded by the same fence as the change it goes with.
pub(super) struct Before {
    pub(super) sql: fn(&super::dialect::Dialect, usize) -> String,
    pub(super) values: Vec<Value>,
}

/// What the history CTE of a PostgreSQL state change returns, for [`outbox_cte`].
pub(super) const HISTORY_RETURNING: &str =
    "RETURNING id, job_id, orchestrator_id, kind, machine, claim_token, detail, at";

/// PostgreSQL's outbox CTE over a CTE `history` (an INSERT into `job_events` ending in
/// [`HISTORY_RETURNING`]): the reportable events of jobs from a tracker source. The
/// statement's snapshot shows `dispatch_queue` as it was before the change, which is
/// enough: `source_id` never changes. Each outbox row names the history row it goes with
/// (`history_id`): a row no state change wrote names none, and is never delivered.
/// A completion writes a second row, [`crate::job::event::PULL_REQUEST`], after its own: the
/// pull request is opened after the completion's comment, so that a PR that cannot be opened
/// (its base was deleted, no machine has a GitHub token) never holds the comment back.
pub(super) fn outbox_cte() -> String {
    format!(
        "outbox AS (
            INSERT INTO outbox (orchestrator_id, job_id, source_id, event, machine, claim_token, detail, created_at, next_at,
                                history_id)
            SELECT h.orchestrator_id, h.job_id, q.source_id, {event}, h.machine, h.claim_token, h.detail, h.at, h.at, h.id
              FROM history h JOIN dispatch_queue q ON q.id = h.job_id {rows}
             WHERE q.source_id IS NOT NULL AND h.kind IN ({reportable})
             ORDER BY h.job_id, x.n)",
        event = event_of("h.kind", "q.follow_ups"),
        rows = rows_of("h.kind"),
        reportable = reportable()
    )
}

/// The outbox rows one history event writes, as a join (`x.n`): the event's own (0) and,
/// after a completion, its pull request's (1). `kind` below is the event's SQL expression.
const ROWS_OF_EVENT: &str = "JOIN (SELECT 0 AS n UNION ALL SELECT 1 AS n) x ON x.n = 0 OR {kind} = 'completed'";

/// The event of outbox row `x.n` of an event of kind `kind` (see [`ROWS_OF_EVENT`]) of a job
/// whose follow-ups are `follow_ups`: a follow-up's completion answers its feedback on the
/// pull request it already has, where a first completion opens one.
fn event_of(kind: &str, follow_ups: &str) -> String {
    format!(
        "CASE WHEN x.n = 0 THEN {kind} WHEN {follow_ups} > 0 THEN '{answers}' ELSE '{pr}' END",
        answers = crate::job::event::FOLLOW_UP_ANSWERS,
        pr = crate::job::event::PULL_REQUEST
    )
}

/// [`ROWS_OF_EVENT`] for events of kind `kind`.
fn rows_of(kind: &str) -> String {
    debug_assert_eq!(crate::job::event::COMPLETED, "completed");
    ROWS_OF_EVENT.replace("{kind}", kind)
}

/// The reportable event kinds, as an SQL list.
fn reportable() -> String {
    let kinds: Vec<String> = crate::job::event::REPORTABLE.iter().map(|k| format!("'{k}'")).collect();
    kinds.join(", ")
}

/// An empty NOTIFY on channel $1.
static NOTIFY: Sql = Sql::new(|_| "SELECT pg_notify($1, '') IS NULL AS sent".to_string());

/// The database clock.
static NOW: Sql = Sql::new(|d| format!("SELECT {now} AS now", now = d.now));

impl Queue {
    /// Runs `call` within this queue's bound.
    pub(super) async fn bounded<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
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

    /// Runs `sql` (in this backend's dialect) and returns its rows.
    pub(super) async fn query(&self, sql: &str, values: Vec<Value>) -> Result<Vec<QueryResult>> {
        let values = without_nul(values);
        self.sending(1);
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

    /// Runs `sql` (in this backend's dialect) and returns how many rows it touched.
    pub(super) async fn exec(&self, sql: &str, values: Vec<Value>) -> Result<u64> {
        let values = without_nul(values);
        self.sending(1);
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

    /// A statement of this module with its values written in (pooled mode, PostgreSQL: the
    /// text is PostgreSQL's already).
    fn inlined(&self, sql: &str, values: &[Value]) -> String {
        crate::db::inline_values(sql, values)
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

    /// A state change, its history and its outbox rows, committed together. `update` is an
    /// UPDATE, in this backend's dialect, whose RETURNING names at least `id, orchestrator_id,
    /// claim_token, claimed_by, state`; the rows it returns are the answer. On PostgreSQL the
    /// history INSERT rides in the same statement as a data-modifying CTE over the returned
    /// rows, and the outbox INSERT over the history it wrote. SQLite has no such CTEs, so the
    /// UPDATE and the INSERTs run in one short transaction: they read the changed rows back,
    /// which inside the transaction are exactly what the UPDATE left.
    ///
    /// The outbox row: a job that came from a tracker source (`source_id`) owes that tracker
    /// each reportable event ([`crate::job::event::REPORTABLE`]). Writing it here, with the
    /// change itself, is what makes it impossible to lose: a machine that dies right after
    /// a completion has already left the row for any other machine to deliver.
    pub(super) async fn change(&self, update: &str, values: Vec<Value>, h: &History<'_>) -> Result<Vec<QueryResult>> {
        self.change_after(None, update, values, h).await
    }

    /// [`Queue::change`], with a write that goes first and commits with it ([`Before`]): on
    /// PostgreSQL a data-modifying CTE of the same statement, on SQLite a statement of the same
    /// transaction. The governor's hold is written so, with the park of the job that hit it.
    pub(super) async fn change_after(
        &self,
        before: Option<Before>,
        update: &str,
        mut values: Vec<Value>,
        h: &History<'_>,
    ) -> Result<Vec<QueryResult>> {
        let d = self.dialect();
        if d.postgres {
            let before = before.map(|b| {
                let first = values.len();
                values.extend(b.values);
                format!("first_write AS ({} RETURNING 1), ", (b.sql)(d, first))
            });
            values.push(h.machine.map(str::to_string).into());
            let machine = format!("COALESCE({}, claimed_by)", d.p(values.len()));
            let detail = h.detail.sql(d, &mut values);
            let sql = format!(
                "WITH {before}changed AS ({update}), history AS (
                    INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
                    SELECT id, orchestrator_id, {kind}, {machine}, claim_token, {detail}, {now} FROM changed
                    {HISTORY_RETURNING}), {outbox}
                 SELECT * FROM changed",
                kind = h.kind,
                now = d.now,
                before = before.unwrap_or_default(),
                outbox = outbox_cte(),
            );
            return self.query(&sql, values).await;
        }
        self.bounded(async {
            self.sending(3);
            let txn = self.db.begin().await?;
            if let Some(b) = before {
                self.sending(1);
                txn.execute_raw(self.stmt(&(b.sql)(d, 0), b.values)).await?;
            }
            let rows = txn.query_all_raw(self.stmt(update, values)).await?;
            if !rows.is_empty() {
                self.sending(2);
                let ids = ids_of(&rows)?;
                txn.execute_raw(self.history_of(&ids, h, Target::History)).await?;
                txn.execute_raw(self.history_of(&ids, h, Target::Outbox)).await?;
            }
            txn.commit().await?;
            Ok(rows)
        })
        .await
    }

    /// SQLite's half of [`Queue::change`]: the history (or the outbox rows) of rows `ids`
    /// as they are now. Both are computed by the same expressions over the same rows. An
    /// outbox row names its job's newest history row, the one just written: SQLite has one
    /// writer at a time, and the transaction holds it.
    fn history_of(&self, ids: &[i64], h: &History<'_>, into: Target) -> Statement {
        let d = self.dialect();
        let mut values: Vec<Value> = vec![h.machine.map(str::to_string).into()];
        let detail = h.detail.sql(d, &mut values);
        let first = values.len();
        let list: Vec<String> = (0..ids.len()).map(|i| d.p(first + i + 1)).collect();
        values.extend(ids.iter().map(|id| Value::from(*id)));
        let (kind, machine, now, list) = (h.kind, d.p(1), d.now, list.join(", "));
        let sql = match into {
            Target::History => format!(
                "INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
                 SELECT id, orchestrator_id, {kind}, COALESCE({machine}, claimed_by), claim_token, {detail}, {now}
                   FROM dispatch_queue WHERE id IN ({list})"
            ),
            Target::Outbox => format!(
                "INSERT INTO outbox (orchestrator_id, job_id, source_id, event, machine, claim_token, detail,
                                     created_at, next_at, history_id)
                 SELECT orchestrator_id, id, source_id, {event}, COALESCE({machine}, claimed_by), claim_token,
                        {detail}, {now}, {now},
                        (SELECT MAX(e.id) FROM job_events e WHERE e.job_id = dispatch_queue.id)
                   FROM dispatch_queue {rows} WHERE id IN ({list}) AND source_id IS NOT NULL
                    AND ({kind}) IN ({reportable})
                  ORDER BY id, x.n",
                event = event_of(&format!("({kind})"), "dispatch_queue.follow_ups"),
                rows = rows_of(&format!("({kind})")),
                reportable = reportable()
            ),
        };
        self.stmt(&sql, values)
    }

    /// Sends an empty NOTIFY on `channel`: the LISTEN probe's (see [`crate::listen`]), on this
    /// queue's pool, so that the probe costs a machine no connection of its own.
    pub async fn notify(&self, channel: &str) -> Result<()> {
        self.query(self.sql(&NOTIFY), vec![channel.into()]).await.map(drop)
    }

    /// The database clock, in milliseconds since the epoch.
    pub async fn now_ms(&self) -> Result<i64> {
        let rows = self.query(self.sql(&NOW), vec![]).await?;
        first_i64(&rows, "now")
    }
}

/// The last net under every statement: PostgreSQL cannot store a NUL in text (and through a
/// pooler, inlined into the query string, it would end the statement early: SQLSTATE 08P01),
/// so a NUL that got past the checks at the door is replaced by U+FFFD, never sent. Text
/// from people is refused at enqueue ([`crate::spec::check_payload`]); text from agents is
/// cleaned where it is read (the engine's `agent::clean_text`).
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
