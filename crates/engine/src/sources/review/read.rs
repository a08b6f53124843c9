//! One read of a watched pull request, conditional everywhere: `pulls/get` with its `ETag`
//! (unchanged: a 304, which GitHub does not count); only when it changed, its reviews, inline
//! comments and conversation comments (a new one bumps the pull request's `updated_at`); and
//! on every read the checks and statuses of its head, which change without the pull request
//! changing. Each list keeps the `ETag` of its first page when it has only one.

use serde_json::Value;

use super::classify;
use super::settings::ReviewLoop;
use crate::sources::error::TrackerError;
use crate::sources::github::calls::{self, Call};
use crate::sources::github::GithubClient;
use devpilot_store::queue::{NewFeedback, WatchRead, WatchRow, WatchState};

/// The most pages of one list a read takes (100 items each).
const MAX_PAGES: u32 = 5;

/// What one read found.
#[derive(Debug, Default)]
pub(super) struct Found {
    pub feedback: Vec<NewFeedback>,
    pub read: WatchRead,
    /// The pull request was merged or closed: the loop ends.
    pub ended: Option<WatchState>,
    /// How many requests it sent, and how many of them were answered 304.
    pub requests: u32,
    pub not_modified: u32,
}

/// A list's pages: the items, and the first page's `ETag` when it was the only page; `None`
/// when the first page was a 304 (nothing changed).
async fn list(
    gh: &GithubClient,
    found: &mut Found,
    call: impl Fn(u32) -> Call,
    etag: Option<&str>,
) -> Result<Option<(Vec<Value>, Option<String>)>, TrackerError> {
    let mut items = vec![];
    for page in 1..=MAX_PAGES {
        let answer = gh.send(&call(page), etag.filter(|_| page == 1)).await?;
        found.requests += 1;
        if answer.not_modified() {
            found.not_modified += 1;
            return Ok(None);
        }
        items.extend(answer.body.as_array().cloned().unwrap_or_default());
        if !answer.has_next {
            return Ok(Some((items, answer.etag.filter(|_| page == 1))));
        }
    }
    Ok(Some((items, None)))
}

/// One conditional GET: its body and `ETag`, or `None` on a 304.
async fn get(
    gh: &GithubClient,
    found: &mut Found,
    call: &Call,
    etag: Option<&str>,
) -> Result<Option<(Value, Option<String>)>, TrackerError> {
    let answer = gh.send(call, etag).await?;
    found.requests += 1;
    if answer.not_modified() {
        found.not_modified += 1;
        return Ok(None);
    }
    Ok(Some((answer.body, answer.etag)))
}

/// Reads watch `w` once.
pub(super) async fn pull(gh: &GithubClient, w: &WatchRow, rules: &ReviewLoop) -> Result<Found, TrackerError> {
    let (repo, n) = (w.repo.as_str(), u64::try_from(w.number).unwrap_or_default());
    let mut found = Found { read: kept(w), ..Found::default() };
    let Some((pr, etag)) = get(gh, &mut found, &calls::get_pull(repo, n), w.etag_pull.as_deref()).await? else {
        checks(gh, w, &mut found).await?;
        return Ok(found);
    };
    found.read.etag_pull = etag;
    if pr.get("merged").and_then(Value::as_bool) == Some(true) || pr.get("merged_at").is_some_and(|m| !m.is_null()) {
        found.ended = Some(WatchState::Merged);
        return Ok(found);
    }
    if pr.get("state").and_then(Value::as_str) == Some("closed") {
        found.ended = Some(WatchState::Closed);
        return Ok(found);
    }
    let head = pr.pointer("/head/sha").and_then(Value::as_str).map(str::to_string);
    if head != w.head_sha {
        // A new head has new checks: their old ETags answer for the old one.
        found.read.etag_checks = None;
        found.read.etag_status = None;
    }
    found.read.head_sha = head;
    conversation(gh, w, rules, &mut found).await?;
    checks(gh, w, &mut found).await?;
    Ok(found)
}

/// The reviews, the inline comments and the conversation comments.
async fn conversation(
    gh: &GithubClient,
    w: &WatchRow,
    rules: &ReviewLoop,
    found: &mut Found,
) -> Result<(), TrackerError> {
    let (repo, n) = (w.repo.as_str(), u64::try_from(w.number).unwrap_or_default());
    // The reviews are read even when unchanged: the inline comments need to know which of
    // them belong to a "changes requested" review.
    let reviews = list(gh, found, |p| calls::list_reviews(repo, n, p), None).await?.unwrap_or_default();
    let (fed, asked) = classify::reviews(&reviews.0, rules);
    found.read.etag_reviews = reviews.1;
    found.feedback.extend(fed);
    let etag = w.etag_review_comments.as_deref();
    if let Some((items, etag)) = list(gh, found, |p| calls::list_review_comments(repo, n, p), etag).await? {
        found.feedback.extend(classify::review_comments(&items, &asked, rules));
        found.read.etag_review_comments = etag;
    }
    let etag = w.etag_comments.as_deref();
    if let Some((items, etag)) = list(gh, found, |p| calls::list_comments(repo, n, p, None), etag).await? {
        found.feedback.extend(classify::comments(&items, rules));
        found.read.etag_comments = etag;
    }
    Ok(())
}

/// The check runs and the combined status of the head, conditional on their `ETag`s.
async fn checks(gh: &GithubClient, w: &WatchRow, found: &mut Found) -> Result<(), TrackerError> {
    let Some(sha) = found.read.head_sha.clone() else { return Ok(()) };
    let repo = w.repo.as_str();
    let etag = found.read.etag_checks.clone();
    if let Some((body, etag)) = get(gh, found, &calls::list_check_runs(repo, &sha, 1), etag.as_deref()).await? {
        found.feedback.extend(classify::check_runs(&body));
        found.read.etag_checks = etag;
    }
    let etag = found.read.etag_status.clone();
    if let Some((body, etag)) = get(gh, found, &calls::combined_status(repo, &sha, 1), etag.as_deref()).await? {
        found.feedback.extend(classify::statuses(&body, &sha));
        found.read.etag_status = etag;
    }
    Ok(())
}

/// What the watch knew, kept where a read learns nothing new.
fn kept(w: &WatchRow) -> WatchRead {
    WatchRead {
        head_sha: w.head_sha.clone(),
        etag_pull: w.etag_pull.clone(),
        etag_reviews: w.etag_reviews.clone(),
        etag_review_comments: w.etag_review_comments.clone(),
        etag_comments: w.etag_comments.clone(),
        etag_checks: w.etag_checks.clone(),
        etag_status: w.etag_status.clone(),
    }
}
