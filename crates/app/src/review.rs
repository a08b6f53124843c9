//! A job's review loop as its page and `devpilot show` tell it: its pull request and whether
//! the loop still reads it, each follow-up (what fed it, which machine answered, and the reply
//! to each piece), what waits for the next one, and what was not fed to any agent.

use serde::Serialize;

use devpilot_store::error::Result;
use devpilot_store::job::event;
use devpilot_store::queue::{FeedbackRow, JobEvent, OutboxRow, Queue};

/// The review loop of one job whose pull request DevPilot opened.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ReviewLoopView {
    pub pull_request: String,
    /// `open` (read on every turn), `merged`, `closed`, `unlabelled` or `handed_back`.
    pub state: String,
    /// When the loop last read it (database ms).
    pub read_at: Option<i64>,
    pub follow_ups: Vec<FollowUpView>,
    /// Feedback that waits for the next follow-up.
    pub waiting: Vec<FeedbackRow>,
    /// Comments no agent was fed, each with why.
    pub ignored: Vec<FeedbackRow>,
}

/// One follow-up.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FollowUpView {
    pub n: i32,
    /// When review feedback reopened the job, and the machine whose turn did.
    pub queued_at: i64,
    pub queued_by: Option<String>,
    /// The machine whose agent answered it, and when it completed (None while it runs).
    pub answered_by: Option<String>,
    pub answered_at: Option<i64>,
    /// The feedback that fed it, each with the reply it got.
    pub fed: Vec<FeedbackRow>,
    /// Its answers' delivery: `delivered`, `pending`, or why not.
    pub answers: Option<String>,
}

/// Job `id`'s review loop, if its pull request was ever watched.
pub async fn review_loop(
    q: &Queue,
    id: i64,
    history: &[JobEvent],
    outbox: &[OutboxRow],
) -> Result<Option<ReviewLoopView>> {
    let Some(watch) = q.watch_of(id).await? else { return Ok(None) };
    let feedback = q.feedback_of(id).await?;
    let answers: Vec<&OutboxRow> = outbox.iter().filter(|o| o.event == event::FOLLOW_UP_ANSWERS).collect();
    let mut follow_ups = vec![];
    for (i, e) in history.iter().enumerate().filter(|(_, e)| e.kind == event::FOLLOW_UP) {
        let n = i32::try_from(follow_ups.len() + 1).unwrap_or(i32::MAX);
        let done =
            history[i + 1..].iter().take_while(|x| x.kind != event::FOLLOW_UP).find(|x| x.kind == event::COMPLETED);
        let delivery = answers.get(follow_ups.len()).map(|o| match (&o.outcome, &o.last_error) {
            (Some(outcome), _) => outcome.clone(),
            (None, Some(error)) => format!("pending: {error}"),
            (None, None) => "pending".into(),
        });
        follow_ups.push(FollowUpView {
            n,
            queued_at: e.at,
            queued_by: e.machine.clone(),
            answered_by: done.and_then(|d| d.machine.clone()),
            answered_at: done.map(|d| d.at),
            fed: feedback.iter().filter(|f| f.follow_up == Some(n)).cloned().collect(),
            answers: delivery,
        });
    }
    let waiting = feedback.iter().filter(|f| f.follow_up.is_none() && f.ignored.is_none()).cloned().collect();
    let ignored = feedback.iter().filter(|f| f.ignored.is_some()).cloned().collect();
    Ok(Some(ReviewLoopView {
        pull_request: watch.url,
        state: watch.state,
        read_at: watch.read_at,
        follow_ups,
        waiting,
        ignored,
    }))
}

/// What a piece of feedback was, in a few words (`grace's comment on src/a.rs:12`).
pub fn feedback_title(f: &FeedbackRow) -> String {
    match (f.kind.as_str(), &f.path, f.line) {
        ("review_comment", Some(p), Some(l)) => format!("{}'s comment on {p}:{l}", f.author),
        ("review", ..) => format!("{}'s review (changes requested)", f.author),
        ("check_run", ..) => format!("check {} failed", f.author),
        ("status", ..) => format!("status {} failed", f.author),
        ("linear_comment", ..) => format!("{}'s comment on the Linear issue", f.author),
        _ => format!("{}'s comment", f.author),
    }
}
