//! What an agent CLI reported about its run (the preset, its session id, cost and tokens),
//! and the conversation a hand-off carries (`job_sessions`): written fenced by the holder,
//! read by the next claimer.

use sea_orm::{FromQueryResult, Value};

use super::dialect::Sql;
use super::fence::Fence;
use super::options::truncate;
use super::pool::Queue;
use super::rows::{decode_first, first_i64};
use crate::error::Result;
use crate::job::event;
use sea_orm::{ConnectionTrait, TransactionTrait};

/// What an attempt's CLI reported at its end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub session: Option<String>,
    pub cost_usd: Option<f64>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
}

/// A carried conversation: the CLI's session files as the engine bundled them (compressed,
/// base64), and where they were written.
#[derive(Clone, Debug, PartialEq, FromQueryResult)]
pub struct SavedSession {
    pub job_id: i64,
    /// The claim that saved it.
    pub claim_token: i64,
    pub machine: String,
    pub agent: String,
    pub session_id: String,
    /// The worktree (or scratch dir) the session was written under, on `machine`.
    pub cwd: String,
    /// `None` when the stored bundle is over [`SESSION_BUNDLE_CAP`]: it is never read.
    pub bundle: Option<String>,
    /// The session's size before compression.
    pub raw_size: i64,
    pub saved_at: i64,
}

/// The most a carried session's `bundle` holds, in bytes of base64 text. The database
/// refuses a longer one (`m20261209_000002_session_caps`), and the read leaves one that is
/// there already unread, so a claim never fetches or decodes more than this.
pub const SESSION_BUNDLE_CAP: usize = 16 << 20;

/// The most a carried session's `cwd` holds, in bytes (the longest path Linux takes).
pub const SESSION_CWD_CAP: usize = 4096;

/// The preset $3, the resumed machine $4 and the account $5 of claim ($1, $2), at its start.
static AGENT_START: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue SET agent = $3, session_from = $4, account = $5
          WHERE id = $1 AND claim_token = $2 AND {running}",
        running = d.running
    )
});

/// What claim ($1, $2)'s CLI reported: its session $3, and cost $4 and tokens $5, $6 added.
static AGENT_USAGE: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue SET agent_session = COALESCE($3, agent_session),
                cost_usd = CASE WHEN $4 IS NULL THEN cost_usd ELSE COALESCE(cost_usd, 0) + $4 END,
                tokens_in = CASE WHEN $5 IS NULL THEN tokens_in ELSE COALESCE(tokens_in, 0) + $5 END,
                tokens_out = CASE WHEN $6 IS NULL THEN tokens_out ELSE COALESCE(tokens_out, 0) + $6 END
          WHERE id = $1 AND claim_token = $2 AND {running}",
        running = d.running
    )
});

/// Claim ($1, $2) on machine $3 saves its agent $4's session $5, written under $6: bundle
/// $7 of $8 bytes raw. One row per job: the newest conversation wins.
static SAVE_SESSION: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO job_sessions
                (job_id, orchestrator_id, claim_token, machine, agent, session_id, cwd, bundle, raw_size, saved_at)
         SELECT id, orchestrator_id, claim_token, $3, $4, $5, $6, $7, $8, {now} FROM dispatch_queue
          WHERE id = $1 AND claim_token = $2 AND {running}
         ON CONFLICT (job_id) DO UPDATE SET
             claim_token = excluded.claim_token, machine = excluded.machine, agent = excluded.agent,
             session_id = excluded.session_id, cwd = excluded.cwd, bundle = excluded.bundle,
             raw_size = excluded.raw_size, saved_at = excluded.saved_at",
        now = d.now,
        running = d.running
    )
});

/// The session saved for job $1, if the job is still live. A bundle over the cap (a row
/// from before the cap, or written with the trigger dropped) comes back NULL: its length is
/// read, not its text. The session id and the path come back cut to one byte past their
/// caps, so the restore refuses them without fetching more.
static LOAD_SESSION: Sql = Sql::new(|d| {
    // `octet_length` reads a value's size, not the value: PostgreSQL's from the TOAST
    // header, SQLite's (3.43+, bundled) from the record header.
    format!(
        "SELECT s.job_id, s.claim_token, s.machine, s.agent, substr(s.session_id, 1, 201) AS session_id,
                substr(s.cwd, 1, {cwd}) AS cwd, CASE WHEN octet_length(s.bundle) <= {cap} THEN s.bundle END AS bundle,
                s.raw_size, s.saved_at
           FROM job_sessions s JOIN dispatch_queue q ON q.id = s.job_id
          WHERE s.job_id = $1 AND q.{live}",
        cwd = SESSION_CWD_CAP + 1,
        cap = SESSION_BUNDLE_CAP,
        live = d.live
    )
});

impl Queue {
    /// Says which preset runs claim `fence`, and whose conversation it resumes (`None`: it
    /// starts fresh). Fenced.
    /// `account` is the account it runs as ([`Governor`](super::Governor)), whose spend and
    /// holds it counts in.
    pub async fn record_agent_start(
        &self,
        fence: &Fence,
        agent: &str,
        session_from: Option<&str>,
        account: Option<&str>,
    ) -> Result<bool> {
        let values = vec![fence.job.into(), fence.token.into(), agent.into(), session_from.into(), account.into()];
        Ok(self.exec(self.sql(&AGENT_START), values).await? > 0)
    }

    /// Keeps what the CLI reported at the end of the attempt (fenced): its session id, and
    /// its cost and tokens added to the job's.
    pub async fn record_agent_usage(&self, fence: &Fence, usage: &Usage) -> Result<bool> {
        let values: Vec<Value> = vec![
            fence.job.into(),
            fence.token.into(),
            usage.session.as_deref().map(|s| truncate(s, 200)).into(),
            usage.cost_usd.filter(|c| c.is_finite() && *c >= 0.0).into(),
            usage.tokens_in.into(),
            usage.tokens_out.into(),
        ];
        let Some(cost) = usage.cost_usd.filter(|c| c.is_finite() && *c > 0.0) else {
            return Ok(self.exec(self.sql(&AGENT_USAGE), values).await? > 0);
        };
        self.usage_with_spend(fence, cost, values).await
    }

    /// [`Queue::record_agent_usage`] of a run that cost something: the attempt's row in
    /// `spend` (the day's spend, per account) commits with the job's totals. On PostgreSQL one
    /// statement; on SQLite one transaction.
    async fn usage_with_spend(&self, fence: &Fence, cost: f64, mut values: Vec<Value>) -> Result<bool> {
        let d = self.dialect();
        let spend: Vec<Value> = vec![fence.job.into(), fence.token.into(), cost.into()];
        if d.postgres {
            let first = values.len();
            values.extend(spend);
            let sql = format!(
                "WITH spent AS ({spend} RETURNING 1), used AS ({usage} RETURNING 1) SELECT COUNT(*) AS n FROM used",
                spend = super::governor::spend_sql(d, first),
                usage = self.sql(&AGENT_USAGE)
            );
            return Ok(first_i64(&self.query(&sql, values).await?, "n")? > 0);
        }
        self.sending(4);
        self.bounded(async {
            let txn = self.db.begin().await?;
            let spent = txn.execute_raw(self.stmt(&super::governor::spend_sql(d, 0), spend)).await?.rows_affected();
            let used = txn.execute_raw(self.stmt(self.sql(&AGENT_USAGE), values)).await?.rows_affected();
            txn.commit().await?;
            Ok(spent > 0 && used > 0)
        })
        .await
    }

    /// Saves the agent's conversation for the next claimer, fenced by `fence`, and says so
    /// in the job's history (`session_carried`, with the sizes). `false`: the claim is gone.
    pub async fn save_session(&self, fence: &Fence, machine: &str, s: &NewSession<'_>) -> Result<bool> {
        // The table refuses them too; this says why before anything is sent.
        if s.bundle.len() > SESSION_BUNDLE_CAP || s.cwd.len() > SESSION_CWD_CAP {
            let (bundle, cwd) = (s.bundle.len(), s.cwd.len());
            return Err(crate::error::Error::Invalid(format!(
                "the session bundle ({bundle} bytes) or its path ({cwd} bytes) is over the cap \
                 ({SESSION_BUNDLE_CAP} and {SESSION_CWD_CAP} bytes); it is not carried"
            )));
        }
        let values: Vec<Value> = vec![
            fence.job.into(),
            fence.token.into(),
            machine.into(),
            s.agent.into(),
            s.session_id.into(),
            s.cwd.into(),
            s.bundle.into(),
            (s.raw_size as i64).into(),
        ];
        if self.exec(self.sql(&SAVE_SESSION), values).await? == 0 {
            return Ok(false);
        }
        let detail = format!(
            "{} session {} carried: {} raw, {} stored, captured in {} ms",
            s.agent,
            s.session_id,
            kib(s.raw_size),
            kib(s.bundle.len()),
            s.took_ms
        );
        self.note_now(fence.job, event::SESSION_CARRIED, machine, Some(fence.token), &detail).await;
        Ok(true)
    }

    /// The conversation saved for a live job, if any.
    pub async fn load_session(&self, job: i64) -> Result<Option<SavedSession>> {
        decode_first(&self.query(self.sql(&LOAD_SESSION), vec![job.into()]).await?)
    }
}

/// A session to save.
#[derive(Clone, Debug)]
pub struct NewSession<'a> {
    pub agent: &'a str,
    pub session_id: &'a str,
    pub cwd: &'a str,
    pub bundle: &'a str,
    pub raw_size: usize,
    /// How long capturing it took.
    pub took_ms: u64,
}

/// `n` bytes, as "12.3 KiB".
fn kib(n: usize) -> String {
    format!("{:.1} KiB", n as f64 / 1024.0)
}
