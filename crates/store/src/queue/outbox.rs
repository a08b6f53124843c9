//! The outbox: what each reportable state change of a tracker's job owes the tracker.
//!
//! Rows are written by [`Queue::change`] with the change itself, never here. Here they are
//! delivered: any machine with the source's credentials takes one with a conditional UPDATE
//! (the same "take it if nobody has" as a claim), which bumps the row's `token`; the finish
//! names that token, so a deliverer that stalled past its lease cannot mark a row another
//! machine has since taken. Rows of one job go out in order: a row waits while an older row
//! of its job is undelivered.

use std::time::Duration;

use sea_orm::{FromQueryResult, Value};
use serde::Serialize;

use super::dialect::Sql;
use super::options::{millis, truncate};
use super::pool::Queue;
use super::rows::{decode, decode_first, first_i64};
use crate::error::Result;

/// An outbox row this machine is delivering: `token` fences its finish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, FromQueryResult)]
pub struct Delivery {
    pub id: i64,
    pub token: i64,
    pub job_id: i64,
    pub source_id: i64,
    /// The history kind it reports (`claimed`, `completed`, …).
    pub event: String,
    /// The machine the history names.
    pub machine: Option<String>,
    /// The claim the event belongs to.
    pub claim_token: Option<i64>,
    /// The history detail (an error, a hand-off's reason, a park's time).
    pub detail: Option<String>,
    /// Tries so far, this one included.
    pub tries: i32,
    pub created_at: i64,
}

/// An outbox row, for status, a job's page and tests.
#[derive(Clone, Debug, Serialize, PartialEq, FromQueryResult)]
pub struct OutboxRow {
    pub id: i64,
    pub job_id: i64,
    pub source_id: i64,
    pub event: String,
    pub claim_token: Option<i64>,
    pub tries: i32,
    pub next_at: i64,
    pub done_at: Option<i64>,
    /// `delivered`, `gave_up` or `refused`, once done.
    pub outcome: Option<String>,
    pub last_error: Option<String>,
}

impl OutboxRow {
    /// Whether a job with these deliveries still has its pull request to open.
    pub fn pr_pending(outbox: &[OutboxRow]) -> bool {
        outbox.iter().any(|d| d.event == crate::job::event::PULL_REQUEST && d.done_at.is_none())
    }
}

/// How a delivery ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryEnd {
    /// The tracker has it.
    Delivered,
    /// Try again after this long (the tracker was unreachable, or said to wait).
    Retry { after: Duration, error: String },
    /// It can never be delivered (the issue is gone, the tracker refused the content): done,
    /// with its error kept.
    GiveUp { error: String },
    /// It must never be delivered: it names an issue, repo or remote that is not its
    /// source's, or no state change of its job wrote it. Done, acting on nothing, with why.
    Refused { reason: String },
}

/// The finish of delivery ($1, $2): done now with outcome $3 when $4, else due again in $5
/// ms; error $6.
static FINISH: Sql = Sql::new(|d| {
    format!(
        "UPDATE outbox SET claimed_at = NULL,
                           done_at = CASE WHEN $4 THEN {now} ELSE NULL END,
                           outcome = $3, next_at = {now} + $5, last_error = $6
          WHERE id = $1 AND token = $2 AND done_at IS NULL",
        now = d.now
    )
});

/// The outbox of job $1, oldest first.
static OF_JOB: Sql = Sql::new(|_| {
    "SELECT id, job_id, source_id, event, claim_token, tries, next_at, done_at, outcome, last_error
       FROM outbox WHERE job_id = $1 ORDER BY id"
        .to_string()
});

/// Whether outbox row $1 was written by a state change of its job: the history row it names
/// (`history_id`, written in the same statement or transaction) is there, of the same job,
/// kind (a pull request or answers row's is its completion), claim, machine and detail.
static WITNESS: Sql = Sql::new(|_| {
    format!(
        "SELECT COUNT(*) AS n FROM outbox o JOIN job_events e ON e.id = o.history_id
          WHERE o.id = $1 AND e.job_id = o.job_id
            AND e.kind = CASE WHEN o.event IN ('{pr}', '{answers}') THEN '{completed}' ELSE o.event END
            AND COALESCE(e.claim_token, -1) = COALESCE(o.claim_token, -1)
            AND COALESCE(e.machine, '') = COALESCE(o.machine, '')
            AND COALESCE(e.detail, '') = COALESCE(o.detail, '')",
        pr = crate::job::event::PULL_REQUEST,
        answers = crate::job::event::FOLLOW_UP_ANSWERS,
        completed = crate::job::event::COMPLETED,
    )
});

impl Queue {
    /// Whether a state change of its job wrote `delivery`: the history row it names, which
    /// the change wrote in the same statement (or transaction), is there and says the same.
    /// A row inserted by hand names none (or one another row already has), and is never
    /// delivered.
    pub async fn witnessed(&self, delivery: &Delivery) -> Result<bool> {
        Ok(first_i64(&self.query(self.sql(&WITNESS), vec![delivery.id.into()]).await?, "n")? > 0)
    }

    /// Takes the oldest deliverable outbox row of `sources` (those this machine has
    /// credentials for): due, not held by another deliverer within `lease`, and with no older
    /// undelivered row of its job. `Ok(None)`: nothing to deliver, or another machine took it.
    pub async fn take_delivery(
        &self,
        orchestrator_id: &str,
        sources: &[i64],
        machine: &str,
        lease: Duration,
    ) -> Result<Option<Delivery>> {
        if sources.is_empty() {
            return Ok(None);
        }
        let d = self.dialect();
        let [o, m, l] = d.params(1);
        let mut values: Vec<Value> = vec![orchestrator_id.into(), machine.into(), millis(lease).into()];
        let list = source_list(d, &mut values, sources);
        let free = format!("(claimed_at IS NULL OR claimed_at <= {now} - {l})", now = d.now);
        let sql = format!(
            "UPDATE outbox SET token = token + 1, tries = tries + 1, claimed_by = {m}, claimed_at = {now}
              WHERE id = (SELECT o.id FROM outbox o
                           WHERE o.orchestrator_id = {o} AND o.done_at IS NULL AND o.next_at <= {now}
                             AND o.source_id IN ({list}) AND {free_o}
                             AND NOT EXISTS (SELECT 1 FROM outbox e
                                              WHERE e.job_id = o.job_id AND e.id < o.id AND e.done_at IS NULL)
                           ORDER BY o.id LIMIT 1 {skip})
                AND done_at IS NULL AND {free}
             RETURNING id, token, job_id, source_id, event, machine, claim_token, detail, tries, created_at",
            now = d.now,
            free_o = free.replace("claimed_at", "o.claimed_at"),
            skip = d.skip_locked,
        );
        decode_first(&self.query(&sql, values).await?)
    }

    /// How long until a row of `sources` can be taken: its retry is due, or the lease of the
    /// machine delivering it ends (that machine may have died holding it). `None`: no row
    /// of `sources` waits to be taken. A pass that ends sleeps until then, so a dead deliverer's row goes out
    /// at its lease's end, not at the next pass a source interval brings.
    pub async fn next_delivery_in(
        &self,
        orchestrator_id: &str,
        sources: &[i64],
        lease: Duration,
    ) -> Result<Option<Duration>> {
        if sources.is_empty() {
            return Ok(None);
        }
        let d = self.dialect();
        let [o, l] = d.params(1);
        let mut values: Vec<Value> = vec![orchestrator_id.into(), millis(lease).into()];
        let list = source_list(d, &mut values, sources);
        let sql = format!(
            "SELECT MIN(CASE WHEN o.claimed_at IS NOT NULL AND o.claimed_at + {l} > o.next_at
                             THEN o.claimed_at + {l} ELSE o.next_at END) - {now} AS n
               FROM outbox o
              WHERE o.orchestrator_id = {o} AND o.done_at IS NULL AND o.source_id IN ({list})
                AND NOT EXISTS (SELECT 1 FROM outbox e
                                 WHERE e.job_id = o.job_id AND e.id < o.id AND e.done_at IS NULL)",
            now = d.now,
        );
        let rows = self.query(&sql, values).await?;
        let ms = match rows.first() {
            Some(r) => r.try_get::<Option<i64>>("", "n")?,
            None => None,
        };
        Ok(ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    /// Ends a delivery. `Ok(false)`: this machine's lease on the row had expired and another
    /// machine took it; its finish stands.
    pub async fn finish_delivery(&self, delivery: &Delivery, end: &DeliveryEnd) -> Result<bool> {
        let (done, outcome, after, error) = match end {
            DeliveryEnd::Delivered => (true, Some("delivered"), Duration::ZERO, None),
            DeliveryEnd::Retry { after, error } => (false, None, *after, Some(error.as_str())),
            DeliveryEnd::GiveUp { error } => (true, Some("gave_up"), Duration::ZERO, Some(error.as_str())),
            DeliveryEnd::Refused { reason } => (true, Some("refused"), Duration::ZERO, Some(reason.as_str())),
        };
        let values = vec![
            delivery.id.into(),
            delivery.token.into(),
            outcome.map(str::to_string).into(),
            done.into(),
            millis(after).into(),
            error.map(|e| truncate(e, 1000)).into(),
        ];
        Ok(self.exec(self.sql(&FINISH), values).await? > 0)
    }

    /// The pull request a finished job's outbox row opened becomes its result link.
    pub async fn set_result_url(&self, job: i64, url: &str) -> Result<bool> {
        /// Finished job $1's result link is $2.
        static RESULT_URL: Sql = Sql::new(|d| {
            format!("UPDATE dispatch_queue SET result_url = $2 WHERE id = $1 AND {finished}", finished = d.finished)
        });
        Ok(self.exec(self.sql(&RESULT_URL), vec![job.into(), truncate(url, 2000).into()]).await? > 0)
    }

    /// A job's outbox rows, oldest first.
    pub async fn outbox_of(&self, job: i64) -> Result<Vec<OutboxRow>> {
        decode(&self.query(self.sql(&OF_JOB), vec![job.into()]).await?)
    }
}

/// `sources` as a list of parameters appended to `values`: `$4, $5, …`.
fn source_list(d: &super::dialect::Dialect, values: &mut Vec<Value>, sources: &[i64]) -> String {
    let list: Vec<String> = sources
        .iter()
        .map(|s| {
            values.push((*s).into());
            d.p(values.len())
        })
        .collect();
    list.join(", ")
}
