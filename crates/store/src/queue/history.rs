//! A job's history (`job_events`): the row a state change writes with itself, notes that go
//! with no state change, and reading it back.

use sea_orm::Value;

use super::dialect::{Dialect, Sql};
use super::pool::Queue;
use super::rows::{decode, JobEvent};
use crate::error::Result;
use crate::retry::{self, Budget};

/// The history row that a state change writes with itself, as SQL over the changed row
/// (its columns after the change), so both backends compute it the same way.
#[derive(Clone, Debug)]
pub(super) struct History<'a> {
    /// An SQL expression for `kind`, e.g. `'completed'` or a CASE on the new state.
    pub(super) kind: &'a str,
    /// The machine to name; `None` names the row's `claimed_by`.
    pub(super) machine: Option<&'a str>,
    pub(super) detail: Detail,
}

#[derive(Clone, Debug)]
pub(super) enum Detail {
    None,
    /// `attempt N` (a claim's detail).
    Attempt,
    Text(String),
    /// An SQL expression over the changed row (built here, never from user text).
    Expr(String),
}

impl Detail {
    /// The detail as SQL over the changed row, in dialect `d`; a text becomes the next
    /// parameter of `values`.
    pub(super) fn sql(&self, d: &Dialect, values: &mut Vec<Value>) -> String {
        match self {
            Detail::None => "NULL".to_string(),
            Detail::Attempt => ATTEMPT.to_string(),
            Detail::Expr(e) => e.clone(),
            Detail::Text(t) => {
                values.push(t.clone().into());
                d.p(values.len())
            }
        }
    }
}

/// A claim's history detail, over the claimed row.
pub(super) const ATTEMPT: &str = "'attempt ' || attempts";

/// A history entry of job $1 that goes with no state change: kind $2, machine $3, token $4,
/// detail $5.
static NOTE: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO job_events (job_id, orchestrator_id, kind, machine, claim_token, detail, at)
             SELECT id, orchestrator_id, $2, $3, $4, $5, {now} FROM dispatch_queue WHERE id = $1",
        now = d.now
    )
});

/// The history of job $1, oldest first.
static HISTORY: Sql = Sql::new(|_| {
    "SELECT id, job_id, at, kind, machine, claim_token, detail
                   FROM job_events WHERE job_id = $1 ORDER BY id"
        .to_string()
});

/// The history entries of orchestrator $1 of kind $2, oldest first.
static EVENTS_OF_KIND: Sql = Sql::new(|_| {
    "SELECT id, job_id, at, kind, machine, claim_token, detail
                   FROM job_events WHERE orchestrator_id = $1 AND kind = $2 ORDER BY id"
        .to_string()
});

impl Queue {
    /// Records a history entry that goes with no state change of ours (a loss, a rejected
    /// completion, an expired lease): the only trace of why a job moved, so a database blip
    /// is retried for a while before giving up.
    pub async fn note(&self, id: i64, kind: &str, machine: &str, token: Option<i64>, detail: &str) {
        let write = || self.note_once(id, kind, machine, token, detail);
        let what = format!("recording the {kind} note of job {id}");
        if let Err(e) = retry::transient(&what, Budget::NOTE, write).await {
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
        self.exec(self.sql(&NOTE), vec![id.into(), kind.into(), machine.into(), token.into(), detail.into()]).await?;
        Ok(())
    }

    /// A job's history, oldest first.
    pub async fn history(&self, id: i64) -> Result<Vec<JobEvent>> {
        decode(&self.query(self.sql(&HISTORY), vec![id.into()]).await?)
    }

    /// Every history entry of one kind for an orchestrator (for audits and tests).
    pub async fn events_of_kind(&self, orchestrator_id: &str, kind: &str) -> Result<Vec<JobEvent>> {
        decode(&self.query(self.sql(&EVENTS_OF_KIND), vec![orchestrator_id.into(), kind.into()]).await?)
    }
}
