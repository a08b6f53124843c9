//! Answers where the feedback was given, through the outbox (exactly once, as every delivery):
//! a follow-up's completion replies in each inline comment's thread ("Addressed in `abc1234`:
//! …" or "Not changed: …", from the agent's `REPLY` lines) and leaves one summary comment on
//! the pull request; a cap's hand-back leaves one comment saying the pull request is the
//! reviewer's again. Each comment carries the row's signed marker, and a retry looks for it
//! before it posts again, so an answer whose reply was lost is not posted twice.

use serde_json::Value;

use super::prompt::{self, Reply};
use crate::sources::ending::{backoff, ending};
use crate::sources::error::TrackerError;
use crate::sources::github::calls;
use crate::sources::github::{post_once, GithubClient, IssueRef, Try};
use crate::sources::keys::{self, GithubTokens};
use crate::sources::mac::CommentMarker;
use crate::sources::render::inert;
use devpilot_store::job::event;
use devpilot_store::queue::{Delivery, DeliveryEnd, FeedbackRow, JobRow, MacKey, Queue, WatchRow};

/// The most pages of review comments a retry looks through for its own reply.
const MAX_PAGES: u32 = 10;

/// What one delivery needs.
pub(in crate::sources) struct Answering<'a> {
    pub queue: &'a Queue,
    pub orchestrator_id: &'a str,
    pub machine: &'a str,
    pub tokens: &'a GithubTokens,
    pub timeout: std::time::Duration,
}

/// Delivers row `d` of `job` (`follow_up_answers` or `handed_back`) on its pull request.
pub(in crate::sources) async fn deliver(
    a: &Answering<'_>,
    d: &Delivery,
    job: &JobRow,
) -> (DeliveryEnd, Option<TrackerError>) {
    let retry = |e: String| (DeliveryEnd::Retry { after: backoff(d.tries), error: e }, None);
    let watch = match a.queue.watch_of(job.id).await {
        Ok(Some(w)) => w,
        Ok(None) => return (DeliveryEnd::Delivered, None),
        Err(e) => return retry(e.to_string()),
    };
    let host = keys::host_of(&watch.api).unwrap_or_default();
    let Some(token) = a.tokens.get(&host) else {
        return retry(format!("no GitHub token for {host} on {} to answer on the pull request", a.machine));
    };
    let gh = match GithubClient::new(&watch.api, token.secret(), a.timeout) {
        Ok(c) => c,
        Err(e) => return (DeliveryEnd::GiveUp { error: e.to_string() }, None),
    };
    let key = match a.queue.mac_key(a.orchestrator_id).await {
        Ok(k) => k,
        Err(e) => return retry(e.to_string()),
    };
    let ctx = Ctx { gh: &gh, watch: &watch, d, key: &key, orch: a.orchestrator_id, queue: a.queue };
    if d.event == event::HANDED_BACK {
        return ending(ctx.comment(&handed_back(job)).await, d);
    }
    let feedback = match a.queue.feedback_of(job.id).await {
        Ok(all) => all.into_iter().filter(|f| f.follow_up == Some(job.follow_ups)).collect::<Vec<_>>(),
        Err(e) => return retry(e.to_string()),
    };
    ending(ctx.answer(job, &feedback).await, d)
}

/// One delivery's pull request, client and marker key.
struct Ctx<'a> {
    gh: &'a GithubClient,
    watch: &'a WatchRow,
    d: &'a Delivery,
    key: &'a MacKey,
    orch: &'a str,
    queue: &'a Queue,
}

impl Ctx<'_> {
    fn number(&self) -> u64 {
        u64::try_from(self.watch.number).unwrap_or_default()
    }

    /// A comment on the pull request's conversation, once.
    async fn comment(&self, body: &str) -> Result<(), TrackerError> {
        let pr = IssueRef { repo: self.watch.repo.clone(), number: self.number() };
        let marker = CommentMarker::new(self.key, self.orch, &pr.repo, pr.number, self.d);
        post_once(self.gh, &pr, body, &marker, Try::of(self.d)).await
    }

    /// The replies in each inline comment's thread, then the summary.
    async fn answer(&self, job: &JobRow, feedback: &[FeedbackRow]) -> Result<(), TrackerError> {
        let said = prompt::replies(job.summary.as_deref().unwrap_or_default());
        // The follow-up changed something if the PR's head moved since it was queued.
        let now = self.head().await?;
        let changed = match (&self.watch.follow_sha, &now) {
            (Some(before), Some(now)) => before != now,
            _ => job.commits.unwrap_or(0) > 0,
        };
        let head: Option<String> = now.filter(|_| changed).map(|s| s.chars().take(7).collect());
        let mut lines = vec![];
        for (i, f) in feedback.iter().enumerate() {
            let reply = reply_text(said.get(&(i + 1)), head.as_deref());
            if let (Some(thread), "review_comment") = (f.thread, f.kind.as_str()) {
                self.reply_once(u64::try_from(thread).unwrap_or_default(), &reply).await?;
            }
            // For the job's page: a lost write only leaves the page without the words.
            if let Err(e) = self.queue.record_reply(f.id, &reply).await {
                tracing::warn!(job = job.id, error = %e, "could not keep the reply on the job");
            }
            lines.push(format!("{}. {} — {}", i + 1, what(f), reply));
        }
        self.comment(&summary(job, &lines, head.as_deref(), changed)).await
    }

    /// The pull request's head now (the follow-up's pushed commit, if it pushed one).
    async fn head(&self) -> Result<Option<String>, TrackerError> {
        let pr = self.gh.send(&calls::get_pull(&self.watch.repo, self.number()), None).await?;
        Ok(pr.body.pointer("/head/sha").and_then(Value::as_str).map(str::to_string))
    }

    /// A reply under inline comment `thread`, unless a retry finds it there already.
    async fn reply_once(&self, thread: u64, body: &str) -> Result<(), TrackerError> {
        let marker = CommentMarker::new(self.key, self.orch, &format!("{}/thread", self.watch.repo), thread, self.d);
        if matches!(Try::of(self.d), Try::Retry { .. }) && self.replied(thread, &marker).await? {
            return Ok(());
        }
        let me = self.gh.login().await?;
        let text = format!("{body}\n\n{}", marker.by(&me));
        let call = calls::reply_to_review_comment(&self.watch.repo, self.number(), thread, &text);
        self.gh.send(&call, None).await.map(drop)
    }

    /// Whether thread `thread` holds a reply with this row's marker signed for its author.
    async fn replied(&self, thread: u64, marker: &CommentMarker<'_>) -> Result<bool, TrackerError> {
        for page in 1..=MAX_PAGES {
            let answer =
                self.gh.send(&calls::list_review_comments(&self.watch.repo, self.number(), page), None).await?;
            let list = answer.body.as_array().cloned().unwrap_or_default();
            let found = list.iter().any(|c| {
                let author = c.pointer("/user/login").and_then(Value::as_str).unwrap_or_default();
                let body = c.get("body").and_then(Value::as_str).unwrap_or_default();
                c.get("in_reply_to_id").and_then(Value::as_u64) == Some(thread) && body.contains(&marker.by(author))
            });
            if found {
                return Ok(true);
            }
            if !answer.has_next {
                return Ok(false);
            }
        }
        Ok(false)
    }
}

/// The reply to one item: what the agent said, and whether the follow-up pushed a change.
fn reply_text(said: Option<&Reply>, head: Option<&str>) -> String {
    match (said, head) {
        (Some(r), Some(sha)) if r.addressed => format!("Addressed in `{sha}`: {}", one_line(&r.text)),
        (Some(r), None) if r.addressed => {
            format!("Not changed: this follow-up pushed no commits ({})", one_line(&r.text))
        }
        (Some(r), _) => format!("Not changed: {}", one_line(&r.text)),
        (None, Some(sha)) => format!("Addressed in `{sha}`."),
        (None, None) => "Not changed: this follow-up pushed no commits.".into(),
    }
}

/// An agent's words as one plain line: no mention pings anyone, no marker can be forged.
fn one_line(text: &str) -> String {
    let t: String = text.replace(['\r', '\n'], " ").replace('@', "@\u{200b}").replace("<!--", "<! --");
    let t = t.trim();
    if t.chars().count() > 500 {
        format!("{}…", t.chars().take(500).collect::<String>())
    } else {
        t.to_string()
    }
}

/// What an item was, in the summary.
fn what(f: &FeedbackRow) -> String {
    match (f.kind.as_str(), &f.path, f.line) {
        ("review_comment", Some(p), Some(l)) => format!("{}'s comment on `{p}:{l}`", f.author),
        ("review", ..) => format!("{}'s review", f.author),
        // A Linear name is free text: on GitHub it pings nobody.
        ("linear_comment", ..) => format!("{}'s comment on the Linear issue", one_line(&f.author)),
        ("check_run", ..) => format!("check `{}`", f.author),
        ("status", ..) => format!("status `{}`", f.author),
        _ => format!("{}'s comment", f.author),
    }
}

/// The pull request's summary comment of one follow-up.
fn summary(job: &JobRow, lines: &[String], head: Option<&str>, changed: bool) -> String {
    let by = job.claimed_by.as_deref().unwrap_or("a machine");
    let pushed = match (changed, head) {
        (true, Some(sha)) => format!("Pushed `{sha}` to this branch."),
        _ => "No changes: nothing was pushed.".to_string(),
    };
    let mut out = format!("**Follow-up {}** on {by}. {pushed}\n\n{}", job.follow_ups, lines.join("\n"));
    if let Some(s) = job.summary.as_deref().filter(|s| !s.trim().is_empty()) {
        out.push_str(&format!("\n\nThe agent's summary:\n{}", inert(s)));
    }
    out
}

/// The hand-back comment.
fn handed_back(job: &JobRow) -> String {
    format!(
        "DevPilot answered {} follow-up{} on this pull request and has reached its review loop's cap: it is handed \
         back to you, the reviewer. Later comments here are not sent to an agent.",
        job.follow_ups,
        if job.follow_ups == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply says where it was addressed only when the follow-up pushed; the agent's text
    /// pings nobody and spans one line.
    #[test]
    fn replies_say_what_was_pushed() {
        let r = Reply { addressed: true, text: "renamed it\nthanks @grace".into() };
        assert_eq!(reply_text(Some(&r), Some("abc1234")), "Addressed in `abc1234`: renamed it thanks @\u{200b}grace");
        assert!(reply_text(Some(&r), None).starts_with("Not changed: this follow-up pushed no commits"));
        let no = Reply { addressed: false, text: "the check is flaky".into() };
        assert_eq!(reply_text(Some(&no), Some("abc1234")), "Not changed: the check is flaky");
    }
}
