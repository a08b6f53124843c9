//! Adding jobs: one statement per batch, deduped by key.

use sea_orm::Value;

use super::dialect::{Dialect, Sql};
use super::options::{title_of, validate_orchestrator, JobOptions};
use super::pool::Queue;
use super::rows::{decode_first, ids_of, Enqueued, IdState};
use crate::error::{Error, Result};

/// The live job of orchestrator $1 with key $2.
static LIVE_KEY: Sql = Sql::new(|d| {
    format!(
        "SELECT id, state FROM dispatch_queue
                      WHERE orchestrator_id = $1 AND unique_key = $2 AND unique_key IS NOT NULL AND {live}",
        live = d.live
    )
});

impl Queue {
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
            let (sql, values) =
                insert_jobs(self.dialect(), orchestrator_id, std::slice::from_ref(payload), &routes, opts);
            if let Some(id) = ids_of(&self.query(&sql, values).await?)?.first() {
                return Ok(Enqueued { id: *id, existing: None });
            }
            let Some(key) = &opts.key else { break };
            let rows = self.query(self.sql(&LIVE_KEY), vec![orchestrator_id.into(), key.clone().into()]).await?;
            if let Some(r) = decode_first::<IdState>(&rows)? {
                return Ok(Enqueued { id: r.id, existing: Some(r.state) });
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
            let (sql, values) = insert_jobs(self.dialect(), orchestrator_id, chunk, routes, &opts);
            ids.extend(ids_of(&self.query(&sql, values).await?)?);
        }
        ids.sort_unstable();
        Ok(ids)
    }
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

/// One INSERT of `payloads` with `opts`, in dialect `d`: claimable from `COALESCE(at, now +
/// delay)`, and a no-op for a key that is live already (`ON CONFLICT DO NOTHING` over the
/// partial unique index). The producer's SQL in the README is this statement.
fn insert_jobs(
    d: &Dialect,
    orchestrator_id: &str,
    payloads: &[serde_json::Value],
    routes: &[RouteColumns],
    opts: &JobOptions,
) -> (String, Vec<Value>) {
    const PER_ROW: usize = 13;
    let mut sql = String::from(
        "INSERT INTO dispatch_queue (orchestrator_id, payload, title, max_attempts, unique_key, priority, run_at, \
         retry_backoff_ms, retry_backoff_max_ms, repo, requires, source_id) VALUES ",
    );
    let mut values: Vec<Value> = Vec::with_capacity(payloads.len() * PER_ROW);
    let (at, delay) = opts.start_values();
    let (base, max) = match opts.backoff.map(|b| b.ms()) {
        Some([base, max]) => (Some(base), Some(max)),
        None => (None, None),
    };
    for (i, (p, (repo, requires))) in payloads.iter().zip(routes).enumerate() {
        if i > 0 {
            sql.push(',');
        }
        let n = values.len();
        let ph: Vec<String> = (1..=PER_ROW).map(|k| d.p(n + k)).collect();
        sql.push_str(&format!(
            "({}, {}, {}, {}, {}, {}, COALESCE({}, {} + {}), {}, {}, {}, {}, {})",
            ph[0], ph[1], ph[2], ph[3], ph[4], ph[5], ph[6], d.now, ph[7], ph[8], ph[9], ph[10], ph[11], ph[12]
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
        values.push(opts.source.into());
    }
    sql.push_str(" ON CONFLICT DO NOTHING RETURNING id");
    (sql, values)
}
