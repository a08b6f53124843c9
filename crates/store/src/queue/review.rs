//! The review loop's statements: a completed job's pull request is watched, the feedback read
//! from it is kept once per piece, and a burst of it reopens the same job as a follow-up.
//!
//! Every "take this if nobody has" here is the claim's pattern again:
//! - a piece of feedback is kept by an INSERT that the unique key `(orchestrator_id, key)`
//!   turns into a no-op for the second reader ([`Queue::add_feedback`]), so two machines
//!   polling one pull request keep each review, comment and check once;
//! - a follow-up is one conditional UPDATE from `completed` to `queued`
//!   ([`Queue::follow_up`]) whose WHERE holds every rule: the watch is open, the cap and the
//!   spend allow one more, feedback waits, and none of it is younger than the quiet period;
//! - the attempt that runs the follow-up takes the waiting feedback fenced by its claim
//!   ([`Queue::take_feedback`]): what arrives while it is queued joins it, what arrives while
//!   it runs waits for the next.
//!
//! The watch's reads (its `ETag`s, the head, the end of the loop) are fenced by the source's
//! intake turn: a machine that stalled past its turn cannot write a stale read over a newer one.

use sea_orm::{FromQueryResult, Value};
use serde::Serialize;

use super::dialect::Sql;
use super::fence::Fence;
use super::history::{Detail, History};
use super::options::truncate;
use super::pool::Queue;
use super::rows::{decode, decode_first};
use crate::error::Result;

/// Where a watched pull request's loop stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchState {
    /// Its feedback is read on every turn of its source.
    Open,
    Merged,
    Closed,
    /// The issue lost its label (or left the source's filter).
    Unlabelled,
    /// A cap was reached: a person takes it from here.
    HandedBack,
}

impl WatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Merged => "merged",
            Self::Closed => "closed",
            Self::Unlabelled => "unlabelled",
            Self::HandedBack => "handed_back",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Open, Self::Merged, Self::Closed, Self::Unlabelled, Self::HandedBack]
            .into_iter()
            .find(|w| w.as_str() == s)
    }
}

/// A watched pull request, with what its job says now.
#[derive(Clone, Debug, PartialEq, Serialize, FromQueryResult)]
pub struct WatchRow {
    pub job_id: i64,
    pub source_id: Option<i64>,
    /// The GitHub API that serves it (`https://api.github.com`).
    pub api: String,
    /// `owner/name`, as GitHub spells it.
    pub repo: String,
    pub number: i64,
    pub url: String,
    pub state: String,
    pub head_sha: Option<String>,
    /// The head when the newest follow-up was queued: its answer compares the head with it.
    pub follow_sha: Option<String>,
    pub etag_pull: Option<String>,
    pub etag_reviews: Option<String>,
    pub etag_review_comments: Option<String>,
    pub etag_comments: Option<String>,
    pub etag_checks: Option<String>,
    pub etag_status: Option<String>,
    pub opened_at: i64,
    pub read_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// The job's state, follow-ups so far, and repo (whose settings rule its loop).
    pub job_state: String,
    pub follow_ups: i32,
    pub job_repo: Option<String>,
    /// Pieces of feedback that wait for a follow-up.
    pub waiting: i64,
    /// What the follow-ups spent so far (the job's spend beyond what it had when the PR opened).
    pub loop_cost: f64,
}

/// What one read of a watched pull request learnt, written fenced by the turn.
#[derive(Clone, Debug, Default)]
pub struct WatchRead {
    pub head_sha: Option<String>,
    pub etag_pull: Option<String>,
    pub etag_reviews: Option<String>,
    pub etag_review_comments: Option<String>,
    pub etag_comments: Option<String>,
    pub etag_checks: Option<String>,
    pub etag_status: Option<String>,
}

/// One piece of feedback as read.
#[derive(Clone, Debug, Default)]
pub struct NewFeedback {
    /// Unique per orchestrator: `github:review_comment:ID` and the like.
    pub key: String,
    /// `review`, `review_comment`, `comment`, `check_run`, `status`, `linear_comment`.
    pub kind: String,
    pub author: String,
    pub path: Option<String>,
    pub line: Option<i64>,
    /// The id of the comment a reply goes under (an inline comment's own id).
    pub thread: Option<i64>,
    /// What the agent is fed (kept only for feedback that feeds one).
    pub body: Option<String>,
    pub url: Option<String>,
    /// Why it feeds nothing (`None`: it does).
    pub ignored: Option<String>,
}

/// A piece of feedback as kept.
#[derive(Clone, Debug, PartialEq, Serialize, FromQueryResult)]
pub struct FeedbackRow {
    pub id: i64,
    pub job_id: i64,
    pub key: String,
    pub kind: String,
    pub author: String,
    pub path: Option<String>,
    pub line: Option<i64>,
    pub thread: Option<i64>,
    pub body: Option<String>,
    pub url: Option<String>,
    pub ignored: Option<String>,
    pub follow_up: Option<i32>,
    pub received_at: i64,
    /// What the follow-up's answer said of it, once posted.
    pub reply: Option<String>,
}

/// The rules of one job's loop, from its repo's settings.
#[derive(Clone, Copy, Debug)]
pub struct LoopRules {
    /// Feedback younger than this waits for the rest of its burst.
    pub quiet_ms: i64,
    /// The most follow-ups per pull request.
    pub max_follow_ups: i32,
    /// The most the follow-ups may spend, in US dollars (`None`: no cap).
    pub max_spend_usd: Option<f64>,
}

/// What [`Queue::follow_up`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FollowUp {
    /// The job is queued again as follow-up `n`.
    Queued(i32),
    /// Feedback waits, but its burst may not be over, or the job is not completed (a
    /// follow-up is queued or running: the feedback joins it or the next).
    Waiting,
    /// A cap is reached: the pull request was handed back to its reviewer, once.
    HandedBack,
    /// Nothing waits.
    Nothing,
}

/// The watch of job $1's pull request: source $2, API $3, repo $4, number $5, URL $6.
static WATCH: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO pr_watch (job_id, orchestrator_id, source_id, api, repo, number, url, cost_base, opened_at)
         SELECT id, orchestrator_id, $2, $3, $4, $5, $6, COALESCE(cost_usd, 0), {now} FROM dispatch_queue WHERE id = $1
         ON CONFLICT (job_id) DO NOTHING",
        now = d.now
    )
});

/// The columns of a [`WatchRow`], over `pr_watch w JOIN dispatch_queue q`.
const WATCH_COLUMNS: &str = "w.job_id, w.source_id, w.api, w.repo, w.number, w.url, w.state, w.head_sha, w.follow_sha,
        w.etag_pull,
        w.etag_reviews, w.etag_review_comments, w.etag_comments, w.etag_checks, w.etag_status, w.opened_at,
        w.read_at, w.ended_at, q.state AS job_state, q.follow_ups, q.repo AS job_repo,
        (SELECT COUNT(*) FROM pr_feedback f WHERE f.job_id = w.job_id AND f.follow_up IS NULL AND f.ignored IS NULL)
            AS waiting,
        CAST(COALESCE(q.cost_usd, 0) - w.cost_base AS DOUBLE PRECISION) AS loop_cost";

/// The open watches of source $1.
static OPEN_WATCHES: Sql = Sql::new(|_| {
    format!(
        "SELECT {WATCH_COLUMNS} FROM pr_watch w JOIN dispatch_queue q ON q.id = w.job_id
          WHERE w.source_id = $1 AND w.state = 'open' ORDER BY w.job_id"
    )
});

/// Job $1's watch, in any state.
static WATCH_OF: Sql = Sql::new(|_| {
    format!("SELECT {WATCH_COLUMNS} FROM pr_watch w JOIN dispatch_queue q ON q.id = w.job_id WHERE w.job_id = $1")
});

/// Whether turn $2 of the watch's source is still the newest: the fence of a watch's writes.
const TURN_HOLDS: &str = "EXISTS (SELECT 1 FROM sources s WHERE s.id = pr_watch.source_id AND s.turn = $2)";

/// What a read of job $1's watch learnt, fenced by turn $2.
static RECORD_READ: Sql = Sql::new(|d| {
    format!(
        "UPDATE pr_watch SET head_sha = COALESCE($3, head_sha), etag_pull = $4, etag_reviews = $5,
                etag_review_comments = $6, etag_comments = $7, etag_checks = $8, etag_status = $9, read_at = {now}
          WHERE job_id = $1 AND state = 'open' AND {TURN_HOLDS}",
        now = d.now
    )
});

/// The end of job $1's loop (state $3), fenced by turn $2 (or by no turn: $2 NULL).
static END_WATCH: Sql = Sql::new(|d| {
    format!(
        "UPDATE pr_watch SET state = $3, ended_at = {now}
          WHERE job_id = $1 AND state = 'open' AND ($2 IS NULL OR {TURN_HOLDS})",
        now = d.now
    )
});

/// One piece of feedback on job $1: kept once per key.
static ADD_FEEDBACK: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO pr_feedback (orchestrator_id, job_id, key, kind, author, path, line, thread, body, url, ignored,
                                  received_at)
         SELECT orchestrator_id, id, $2, $3, $4, $5, $6, $7, $8, $9, $10, {now} FROM dispatch_queue WHERE id = $1
         ON CONFLICT (orchestrator_id, key) DO NOTHING",
        now = d.now
    )
});

/// Feedback of job `q` that waits for a follow-up.
const WAITING: &str = "SELECT 1 FROM pr_feedback f WHERE f.job_id = q.id AND f.follow_up IS NULL AND f.ignored IS NULL";

/// Completed job $1 queued again as its next follow-up, resuming its branch $2, if its watch
/// is open, the cap ($3 follow-ups) and the spend ($4 dollars, NULL: none) allow one more, and
/// feedback waits whose burst ended ($5 ms of quiet). A person's cancel or a requeue is not a
/// completion, so only a job that completed reopens; and only once the answers of its last
/// follow-up went out (its outbox is empty), so that they never name the wrong follow-up.
static REOPEN: Sql = Sql::new(|d| {
    format!(
        "UPDATE dispatch_queue AS q
            SET state = 'queued', follow_ups = follow_ups + 1, attempts = 0, claimed_at = NULL, finished_at = NULL,
                completed_at = NULL, run_at = {now}, commits = NULL, resume_branch = $2, resumed_from = claimed_by
          WHERE q.id = $1 AND q.state = 'completed' AND q.follow_ups < $3
            AND EXISTS (SELECT 1 FROM pr_watch w WHERE w.job_id = q.id AND w.state = 'open'
                           AND ($4 IS NULL OR COALESCE(q.cost_usd, 0) - w.cost_base < $4))
            AND EXISTS ({WAITING})
            AND NOT EXISTS ({WAITING} AND f.received_at > {now} - $5)
            AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = q.id AND o.done_at IS NULL)
         RETURNING id, orchestrator_id, claim_token, claimed_by, state, follow_ups",
        now = d.now
    )
});

/// The head job $1's newest follow-up starts from: what its answer compares the head with.
static FOLLOW_SHA: Sql = Sql::new(|_| "UPDATE pr_watch SET follow_sha = head_sha WHERE job_id = $1".to_string());

/// Job $1's open watch handed back, when feedback waits past its quiet period ($2 ms) and the
/// job, completed, has had its $3 follow-ups or spent its $4 dollars (NULL: no cap).
static HAND_BACK: Sql = Sql::new(|d| {
    format!(
        "UPDATE pr_watch SET state = 'handed_back', ended_at = {now}
          WHERE job_id = $1 AND state = 'open'
            AND EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.id = $1 AND q.state = 'completed'
                           AND (q.follow_ups >= $3 OR ($4 IS NOT NULL AND COALESCE(q.cost_usd, 0) - pr_watch.cost_base >= $4))
                           AND EXISTS ({WAITING}) AND NOT EXISTS ({WAITING} AND f.received_at > {now} - $2))",
        now = d.now
    )
});

/// The `handed_back` history of job $1 (no state change), with its outbox row.
static HANDED_BACK: Sql = Sql::new(|_| {
    "UPDATE dispatch_queue SET follow_ups = follow_ups WHERE id = $1
     RETURNING id, orchestrator_id, claim_token, claimed_by, state"
        .to_string()
});

/// Whether feedback of job $1 waits (not yet taken, feeding an agent).
static ANY_WAITING: Sql =
    Sql::new(|_| format!("SELECT COUNT(*) AS n FROM dispatch_queue q WHERE q.id = $1 AND EXISTS ({WAITING})"));

/// The waiting feedback of job $1 taken by follow-up $3, fenced by claim ($1, $2).
static TAKE_FEEDBACK: Sql = Sql::new(|d| {
    format!(
        "UPDATE pr_feedback SET follow_up = $3
          WHERE job_id = $1 AND ignored IS NULL AND (follow_up IS NULL OR follow_up = $3)
            AND EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.id = $1 AND q.claim_token = $2 AND q.{running})",
        running = d.running
    )
});

/// Job $1's feedback, oldest first.
static FEEDBACK_OF: Sql = Sql::new(|_| {
    "SELECT id, job_id, key, kind, author, path, line, thread, body, url, ignored, follow_up, received_at, reply
       FROM pr_feedback WHERE job_id = $1 ORDER BY id"
        .to_string()
});

/// What the answer of feedback $1 said of it ($2).
static REPLY: Sql = Sql::new(|_| "UPDATE pr_feedback SET reply = $2 WHERE id = $1".to_string());

/// The most text of one piece of feedback that is kept (a check's output is cut to its start).
pub const FEEDBACK_BODY_CAP: usize = 8000;

impl Queue {
    /// Watches job `job`'s pull request from now on (once: a second call changes nothing).
    pub async fn watch_pull(
        &self,
        job: i64,
        source: i64,
        api: &str,
        repo: &str,
        number: i64,
        url: &str,
    ) -> Result<bool> {
        let values = vec![job.into(), source.into(), api.into(), repo.into(), number.into(), url.into()];
        Ok(self.exec(self.sql(&WATCH), values).await? > 0)
    }

    /// The open watches of `source`, for its turn.
    pub async fn open_watches(&self, source: i64) -> Result<Vec<WatchRow>> {
        decode(&self.query(self.sql(&OPEN_WATCHES), vec![source.into()]).await?)
    }

    /// Job `job`'s watch, if its pull request was ever watched.
    pub async fn watch_of(&self, job: i64) -> Result<Option<WatchRow>> {
        decode_first(&self.query(self.sql(&WATCH_OF), vec![job.into()]).await?)
    }

    /// Keeps what a read of job `job`'s pull request learnt; `Ok(false)`: a newer turn than
    /// `turn` began, or the loop ended.
    pub async fn record_read(&self, job: i64, turn: i64, read: &WatchRead) -> Result<bool> {
        let etags = [
            &read.etag_pull,
            &read.etag_reviews,
            &read.etag_review_comments,
            &read.etag_comments,
            &read.etag_checks,
            &read.etag_status,
        ];
        let mut values: Vec<Value> = vec![job.into(), turn.into(), read.head_sha.clone().into()];
        values.extend(etags.into_iter().map(|e| Value::from(e.clone())));
        Ok(self.exec(self.sql(&RECORD_READ), values).await? > 0)
    }

    /// Ends job `job`'s loop (merged, closed, unlabelled), fenced by `turn` when given.
    pub async fn end_watch(&self, job: i64, turn: Option<i64>, state: WatchState) -> Result<bool> {
        let values = vec![job.into(), turn.into(), state.as_str().into()];
        Ok(self.exec(self.sql(&END_WATCH), values).await? > 0)
    }

    /// Keeps the pieces of feedback not kept yet; how many were new.
    pub async fn add_feedback(&self, job: i64, pieces: &[NewFeedback]) -> Result<usize> {
        let mut added = 0;
        for f in pieces {
            let body = f.body.as_deref().filter(|_| f.ignored.is_none()).map(|b| truncate(b, FEEDBACK_BODY_CAP));
            let values: Vec<Value> = vec![
                job.into(),
                truncate(&f.key, 300).into(),
                f.kind.clone().into(),
                truncate(&f.author, 200).into(),
                f.path.as_deref().map(|p| truncate(p, 1000)).into(),
                f.line.into(),
                f.thread.into(),
                body.into(),
                f.url.as_deref().map(|u| truncate(u, 2000)).into(),
                f.ignored.clone().into(),
            ];
            added += self.exec(self.sql(&ADD_FEEDBACK), values).await? as usize;
        }
        Ok(added)
    }

    /// Reopens completed job `job` as its next follow-up on `branch`, or hands its pull request
    /// back when a cap says no more; see [`FollowUp`]. `machine` names who decided.
    pub async fn follow_up(&self, job: i64, branch: &str, rules: &LoopRules, machine: &str) -> Result<FollowUp> {
        let values = vec![
            job.into(),
            branch.into(),
            rules.max_follow_ups.into(),
            rules.max_spend_usd.into(),
            rules.quiet_ms.into(),
        ];
        let detail = Detail::Expr("'follow-up ' || follow_ups".into());
        let history = History { kind: "'follow_up'", machine: Some(machine), detail };
        let rows = self.change(self.sql(&REOPEN), values, &history).await?;
        if let Some(row) = rows.first() {
            // Not in the reopen's statement: a follow-up whose start is unknown still runs,
            // and its answer then goes by the commits the job counted.
            if let Err(e) = self.exec(self.sql(&FOLLOW_SHA), vec![job.into()]).await {
                tracing::warn!(job, error = %e, "could not keep the head the follow-up starts from");
            }
            return Ok(FollowUp::Queued(row.try_get::<i32>("", "follow_ups")?));
        }
        let values = vec![job.into(), rules.quiet_ms.into(), rules.max_follow_ups.into(), rules.max_spend_usd.into()];
        if self.exec(self.sql(&HAND_BACK), values).await? > 0 {
            let detail = Detail::Text(format!(
                "the review loop's cap was reached (at most {} follow-ups{}): the pull request is handed back",
                rules.max_follow_ups,
                rules.max_spend_usd.map(|s| format!(", ${s:.2} of spend")).unwrap_or_default()
            ));
            let h = History { kind: "'handed_back'", machine: Some(machine), detail };
            self.change(self.sql(&HANDED_BACK), vec![job.into()], &h).await?;
            return Ok(FollowUp::HandedBack);
        }
        let waiting = self.query(self.sql(&ANY_WAITING), vec![job.into()]).await?;
        let n = super::rows::first_i64(&waiting, "n")?;
        Ok(if n > 0 { FollowUp::Waiting } else { FollowUp::Nothing })
    }

    /// Takes the waiting feedback of job `fence.job` for its follow-up `n`, fenced by the
    /// claim; returns all of that follow-up's feedback (a second attempt of it gets the
    /// same, and whatever arrived since).
    pub async fn take_feedback(&self, fence: &Fence, n: i32) -> Result<Vec<FeedbackRow>> {
        self.exec(self.sql(&TAKE_FEEDBACK), vec![fence.job.into(), fence.token.into(), n.into()]).await?;
        let all = self.feedback_of(fence.job).await?;
        Ok(all.into_iter().filter(|f| f.follow_up == Some(n)).collect())
    }

    /// Keeps what the answer to feedback `id` said, for the job's page.
    pub async fn record_reply(&self, id: i64, reply: &str) -> Result<()> {
        self.exec(self.sql(&REPLY), vec![id.into(), truncate(reply, 2000).into()]).await.map(drop)
    }

    /// Job `job`'s feedback, oldest first: what fed each follow-up, what waits, what was ignored.
    pub async fn feedback_of(&self, job: i64) -> Result<Vec<FeedbackRow>> {
        decode(&self.query(self.sql(&FEEDBACK_OF), vec![job.into()]).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::event;

    /// Every state's name round-trips, so a watch row always reads back as what was written.
    #[test]
    fn watch_states_round_trip() {
        for s in
            [WatchState::Open, WatchState::Merged, WatchState::Closed, WatchState::Unlabelled, WatchState::HandedBack]
        {
            assert_eq!(WatchState::parse(s.as_str()), Some(s));
        }
        assert_eq!(event::FOLLOW_UP, "follow_up");
    }
}
