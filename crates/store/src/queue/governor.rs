//! The governor's statements: an account held fleet-wide on a usage limit (written with the
//! park of the job that hit it), what each attempt spent, the fleet's switch that leaves jobs
//! parked on a limit for a person, and the claim's part ([`Governor`]: none of a held
//! account's jobs, nothing past the day's cap).
//!
//! Every "take this if nobody has" here is one conditional statement, as the claim is: the
//! hold is an upsert that keeps the later reset; a warning is given by the statement that
//! flips its flag, and zero rows means another machine gave it.

use sea_orm::{FromQueryResult, Value};
use serde::Serialize;

use super::call::Before;
use super::dialect::{kind_of_end, unless_cancelled, Dialect, Sql};
use super::fence::Fence;
use super::history::{Detail, History};
use super::options::truncate;
use super::pool::Queue;
pub use super::route::Governor;
use super::rows::{decode, decode_first};
use crate::error::Result;
use crate::job::{event, JobState};

/// Why a governed park holds a job (`dispatch_queue.parked_for`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ParkedFor {
    /// Its account hit a usage limit: claimable when the hold ends, unless it (or the fleet)
    /// says to wait for a person.
    Limit,
    /// The day's cap (the fleet's or its account's) was reached: claimable again when the
    /// day's spend allows, which the claim checks.
    DayCap,
    /// Its own cap was reached: it waits for a person ([`Queue::let_go`]).
    JobCap,
}

impl ParkedFor {
    pub fn as_str(self) -> &'static str {
        match self {
            ParkedFor::Limit => "limit",
            ParkedFor::DayCap => "day_cap",
            ParkedFor::JobCap => "job_cap",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [ParkedFor::Limit, ParkedFor::DayCap, ParkedFor::JobCap].into_iter().find(|p| p.as_str() == s)
    }
}

/// A governed park ([`Queue::park_governed`]): why, until when, what it says, the hold it
/// writes with it, and where its work went (like a hand-off, so any machine may resume it).
#[derive(Clone, Debug)]
pub struct GovernedPark<'a> {
    pub parked_for: ParkedFor,
    /// When the job is claimable again (ms since the epoch; now, when already past).
    pub until_ms: i64,
    pub reason: &'a str,
    /// The account to hold until `until_ms`, fleet-wide.
    pub hold: Option<&'a str>,
    /// The branch its work in progress was pushed to.
    pub resume_branch: Option<&'a str>,
}

/// The park of claim ($1, $2) for `parked_for` $3 until $4 (ms), saying $5, its work on
/// branch $6 (NULL: none pushed). Like a hand-off, a pushed branch names the machine it
/// moved from, so the next claimer (on any machine) resumes the work and the conversation.
static PARK_GOVERNED: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue
            SET state = {ends},
                finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN {now} ELSE NULL END,
                run_at = CASE WHEN $4 < {now} THEN {now} ELSE $4 END,
                claimed_at = NULL, attempts = attempts - 1, last_error = $5, parked_for = $3,
                resume_branch = COALESCE($6, resume_branch),
                resumed_from = CASE WHEN $6 IS NULL THEN resumed_from ELSE claimed_by END
          WHERE id = $1 AND claim_token = $2 AND {running}
         RETURNING id, orchestrator_id, claim_token, claimed_by, state, run_at, last_error",
        ends = unless_cancelled("'queued'"),
        now = d.now,
        running = d.running,
    )
});

/// The hold written with a park: claim (p1, p2) of machine p3 holds account p4 until p5 (ms),
/// saying p6. A later reset wins over an earlier one; the fence guards it as it guards the park.
fn hold_sql(d: &Dialect, first: usize) -> String {
    let p = |n: usize| d.p(first + n);
    let later = if d.postgres { "GREATEST" } else { "MAX" };
    format!(
        "INSERT INTO account_holds (orchestrator_id, account, until_at, reason, machine, job_id, held_at)
         SELECT orchestrator_id, {a}, {until}, {why}, {m}, id, {now} FROM dispatch_queue
          WHERE id = {id} AND claim_token = {tok} AND {running}
         ON CONFLICT (orchestrator_id, account) DO UPDATE SET
             until_at = {later}(account_holds.until_at, excluded.until_at), reason = excluded.reason,
             machine = excluded.machine, job_id = excluded.job_id, held_at = excluded.held_at",
        id = p(1),
        tok = p(2),
        m = p(3),
        a = p(4),
        until = p(5),
        why = p(6),
        now = d.now,
        running = d.running,
    )
}

/// What a park left: the state, and from when the job is claimable again.
#[derive(FromQueryResult)]
struct ParkedRow {
    state: JobState,
    run_at: i64,
}

/// An account held on a usage limit.
#[derive(Clone, Debug, PartialEq, Serialize, FromQueryResult)]
pub struct HoldRow {
    pub account: String,
    /// Until when (ms since the epoch, before the skew).
    pub until_at: i64,
    pub reason: Option<String>,
    pub machine: String,
    pub job_id: Option<i64>,
    pub held_at: i64,
}

/// What one attempt spent.
#[derive(Clone, Debug, PartialEq, Serialize, FromQueryResult)]
pub struct SpendRow {
    pub job_id: i64,
    pub claim_token: i64,
    pub machine: Option<String>,
    pub account: Option<String>,
    pub cost_usd: f64,
    pub at: i64,
}

/// The fleet's governor as the tray and `status` show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GovernorView {
    /// The holds that have not ended.
    pub holds: Vec<HoldRow>,
    /// The fleet's spend since the start of the day it was asked about.
    pub day_spent_usd: f64,
    /// Each account's share of it.
    pub by_account: Vec<AccountSpend>,
    /// Jobs parked on a limit wait for a person (`devpilot pause --limits`).
    pub limits_paused: bool,
}

/// An account's spend since the start of a day.
#[derive(Clone, Debug, PartialEq, Serialize, FromQueryResult)]
pub struct AccountSpend {
    pub account: Option<String>,
    pub spent_usd: f64,
}

#[derive(FromQueryResult)]
struct Paused {
    limits_paused_at: Option<i64>,
}

#[derive(FromQueryResult)]
struct Total {
    total: Option<f64>,
}

impl Queue {
    /// Parks claim `fence` for the governor, in one fenced statement with its history and,
    /// when `p.hold` names an account, the hold of that account (on PostgreSQL a CTE of the
    /// same statement, on SQLite the same transaction): a hold is never written without the
    /// park, nor the park without it. `Ok(None)`: the lease was lost.
    pub async fn park_governed(
        &self,
        fence: &Fence,
        machine: &str,
        p: &GovernedPark<'_>,
    ) -> Result<Option<(JobState, i64)>> {
        let Fence { job: id, token } = *fence;
        let reason = truncate(p.reason, 2000);
        let values: Vec<Value> = vec![
            id.into(),
            token.into(),
            p.parked_for.as_str().into(),
            p.until_ms.into(),
            reason.clone().into(),
            p.resume_branch.map(str::to_string).into(),
        ];
        let before = p.hold.map(|account| Before {
            sql: hold_sql,
            values: vec![
                id.into(),
                token.into(),
                machine.into(),
                account.into(),
                p.until_ms.into(),
                reason.clone().into(),
            ],
        });
        // A job parked at its own cap waits for a person, not for a time.
        let when = match p.parked_for {
            ParkedFor::JobCap => "'; it waits for a person (devpilot requeue)'".to_string(),
            ParkedFor::Limit | ParkedFor::DayCap => format!("'; claimable again at ' || {}", self.dialect().run_at_iso),
        };
        let detail = Detail::Expr(format!(
            "CASE WHEN state = 'cancelled' THEN 'cancelled: a cancel was asked for' ELSE last_error || {when} END"
        ));
        let history = History { kind: &kind_of_end(event::PARKED), machine: Some(machine), detail };
        let rows = self.change_after(before, self.sql(&PARK_GOVERNED), values, &history).await?;
        let Some(row) = decode_first::<ParkedRow>(&rows)? else {
            self.note_now(id, event::LEASE_LOST, machine, Some(token), "park not recorded: lease lost").await;
            return Ok(None);
        };
        Ok(Some((row.state, row.run_at)))
    }

    /// Ends the hold on `account` (an attempt under it succeeded, or a person said so), and
    /// the wait of the jobs parked on its limit: they are claimable now, not at the reset.
    /// `true` when there was a hold. Two statements: if the second is lost, those jobs wait
    /// for the reset they were parked until, as they would have anyway.
    pub async fn end_hold(&self, orchestrator_id: &str, account: &str) -> Result<bool> {
        static END: Sql =
            Sql::new(|_| "DELETE FROM account_holds WHERE orchestrator_id = $1 AND account = $2".to_string());
        static RESUME: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue SET run_at = {now}
                  WHERE orchestrator_id = $1 AND account = $2 AND parked_for = 'limit' AND {claimable}
                    AND run_at > {now}",
                now = d.now,
                claimable = d.claimable
            )
        });
        let values = || vec![Value::from(orchestrator_id), Value::from(account)];
        let ended = self.exec(self.sql(&END), values()).await? > 0;
        if ended {
            self.exec(self.sql(&RESUME), values()).await?;
        }
        Ok(ended)
    }

    /// The governor as the fleet sees it: the holds not yet ended, the spend since
    /// `day_start_ms` in all and per account, and the fleet's limit switch.
    pub async fn governor_view(&self, orchestrator_id: &str, day_start_ms: i64) -> Result<GovernorView> {
        static HOLDS: Sql = Sql::new(|d| {
            format!(
                "SELECT account, until_at, reason, machine, job_id, held_at FROM account_holds
                  WHERE orchestrator_id = $1 AND until_at > {now} ORDER BY account",
                now = d.now
            )
        });
        // An account whose spend moved out of the day (a total back at zero) spent nothing.
        static BY_ACCOUNT: Sql = Sql::new(|_| {
            "SELECT NULLIF(account, '') AS account, SUM(cost_usd) AS spent_usd FROM spend_quarters
              WHERE orchestrator_id = $1 AND quarter_at >= $2 AND account <> '*'
              GROUP BY account HAVING SUM(cost_usd) > 0.0000005 ORDER BY account"
                .to_string()
        });
        static PAUSED: Sql =
            Sql::new(|_| "SELECT limits_paused_at FROM governor WHERE orchestrator_id = $1".to_string());
        let o: Value = orchestrator_id.into();
        let holds = decode::<HoldRow>(&self.query(self.sql(&HOLDS), vec![o.clone()]).await?)?;
        let by_account =
            decode::<AccountSpend>(&self.query(self.sql(&BY_ACCOUNT), vec![o.clone(), day_start_ms.into()]).await?)?;
        let paused = decode_first::<Paused>(&self.query(self.sql(&PAUSED), vec![o]).await?)?;
        Ok(GovernorView {
            holds,
            // Folded from +0.0: an empty float `sum()` is -0.0, which prints as "$-0.00".
            day_spent_usd: by_account.iter().fold(0.0, |t, a| t + a.spent_usd),
            by_account,
            limits_paused: paused.is_some_and(|p| p.limits_paused_at.is_some()),
        })
    }

    /// The spend since `day_start_ms`: the fleet's, or `account`'s.
    pub async fn spent_since(&self, orchestrator_id: &str, day_start_ms: i64, account: Option<&str>) -> Result<f64> {
        static SPENT: Sql = Sql::new(|_| {
            "SELECT SUM(cost_usd) AS total FROM spend_quarters
              WHERE orchestrator_id = $1 AND quarter_at >= $2 AND account = COALESCE($3, '*')"
                .to_string()
        });
        let values = vec![orchestrator_id.into(), day_start_ms.into(), account.map(str::to_string).into()];
        Ok(decode_first::<Total>(&self.query(self.sql(&SPENT), values).await?)?.and_then(|t| t.total).unwrap_or(0.0))
    }

    /// What each attempt of job `id` spent, oldest first.
    pub async fn job_spend(&self, id: i64) -> Result<Vec<SpendRow>> {
        static JOB: Sql = Sql::new(|_| {
            "SELECT job_id, claim_token, machine, account, cost_usd, at FROM spend WHERE job_id = $1 ORDER BY id"
                .to_string()
        });
        decode(&self.query(self.sql(&JOB), vec![id.into()]).await?)
    }

    /// Sets the fleet's switch: while on, jobs parked on a usage limit wait for a person.
    pub async fn set_limits_paused(&self, orchestrator_id: &str, paused: bool, by: &str) -> Result<()> {
        static SET: Sql = Sql::new(|d| {
            format!(
                "INSERT INTO governor (orchestrator_id, limits_paused_at, limits_paused_by)
                 VALUES ($1, CASE WHEN $2 = 1 THEN {now} END, $3)
                 ON CONFLICT (orchestrator_id) DO UPDATE SET
                     limits_paused_at = excluded.limits_paused_at, limits_paused_by = excluded.limits_paused_by",
                now = d.now
            )
        });
        let values = vec![orchestrator_id.into(), i32::from(paused).into(), by.into()];
        self.exec(self.sql(&SET), values).await?;
        Ok(())
    }

    /// Whether job `id` resumes by itself after a usage limit (`false`: it waits for a
    /// person). `false` when the job is not live.
    pub async fn set_resume_after_limit(&self, orchestrator_id: &str, id: i64, resume: bool) -> Result<bool> {
        static SET: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue SET resume_after_limit = $3 WHERE id = $1 AND orchestrator_id = $2 AND {live}",
                live = d.live
            )
        });
        let values = vec![id.into(), orchestrator_id.into(), i32::from(resume).into()];
        Ok(self.exec(self.sql(&SET), values).await? > 0)
    }

    /// A person lets job `id`, parked for the governor, go on: claimable now, its own cap
    /// counted again from what it has spent. `false`: it is not parked so.
    pub async fn let_go(&self, orchestrator_id: &str, id: i64, by: &str) -> Result<bool> {
        static LET_GO: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue
                    SET parked_for = NULL, run_at = {now}, cap_base_usd = COALESCE(cost_usd, 0), spend_warned = 0
                  WHERE id = $1 AND orchestrator_id = $2 AND {claimable} AND parked_for IS NOT NULL
                 RETURNING id, orchestrator_id, claim_token, claimed_by",
                now = d.now,
                claimable = d.claimable
            )
        });
        let history = History {
            kind: &format!("'{}'", event::REQUEUED),
            machine: Some(by),
            detail: Detail::Text("let go past its hold or cap by a person".into()),
        };
        let rows = self.change(self.sql(&LET_GO), vec![id.into(), orchestrator_id.into()], &history).await?;
        Ok(!rows.is_empty())
    }

    /// The 80 % warning of claim `fence`'s own cap, given once per job: the statement that
    /// flips its flag writes the history (and so the comment). `false`: given already.
    pub async fn warn_spend_once(&self, fence: &Fence, machine: &str, detail: &str) -> Result<bool> {
        static WARN: Sql = Sql::new(|d| {
            format!(
                "UPDATE dispatch_queue SET spend_warned = 1
                  WHERE id = $1 AND claim_token = $2 AND {running} AND spend_warned = 0
                 RETURNING id, orchestrator_id, claim_token, claimed_by",
                running = d.running
            )
        });
        let history = History {
            kind: &format!("'{}'", event::SPEND_WARNING),
            machine: Some(machine),
            detail: Detail::Text(truncate(detail, 500)),
        };
        let rows = self.change(self.sql(&WARN), vec![fence.job.into(), fence.token.into()], &history).await?;
        Ok(!rows.is_empty())
    }

    /// The 80 % warning of the day that starts at `day_start_ms`, given once by the whole
    /// fleet: `true` for the one machine whose statement flipped it.
    pub async fn warn_day_once(&self, orchestrator_id: &str, day_start_ms: i64) -> Result<bool> {
        static WARN: Sql = Sql::new(|_| {
            "INSERT INTO governor (orchestrator_id, warned_day) VALUES ($1, $2)
             ON CONFLICT (orchestrator_id) DO UPDATE SET warned_day = excluded.warned_day
              WHERE governor.warned_day IS NULL OR governor.warned_day <> excluded.warned_day"
                .to_string()
        });
        Ok(self.exec(self.sql(&WARN), vec![orchestrator_id.into(), day_start_ms.into()]).await? > 0)
    }
}

/// The spend a usage record writes with itself: one row per attempt that reported a cost,
/// from claim (p1, p2), cost p3; with the job's account.
pub(super) fn spend_sql(d: &Dialect, first: usize) -> String {
    let p = |n: usize| d.p(first + n);
    format!(
        "INSERT INTO spend (orchestrator_id, job_id, claim_token, machine, account, cost_usd, at)
         SELECT orchestrator_id, id, claim_token, claimed_by, account, {cost}, {now} FROM dispatch_queue
          WHERE id = {id} AND claim_token = {tok} AND {running}",
        id = p(1),
        tok = p(2),
        cost = p(3),
        now = d.now,
        running = d.running,
    )
}
