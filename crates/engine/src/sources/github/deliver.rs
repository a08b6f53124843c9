//! One outbox row to a GitHub issue: its comment, which ends with a hidden marker naming the
//! job, the event and the claim and signed with the orchestrator's key for the user who posts
//! it (`<!-- devpilot:job/12/completed/2/MAC -->`, see `sources::mac`), so a retry looks for
//! the marker and never posts twice; and the "working" label while a machine runs it. A
//! comment counts only if its marker was signed for its own author: a retry on a machine
//! whose token is another user's still finds the first machine's comment, and a stranger's
//! copy of a marker stops nothing. Each call is idempotent, so a retried delivery does the
//! same thing again.

use std::time::{Duration, UNIX_EPOCH};

use devpilot_store::queue::Delivery;
use serde::Deserialize;
use serde_json::Value;

use super::calls;
use super::client::GithubClient;
use crate::sources::error::TrackerError;
use crate::sources::mac::CommentMarker;
use crate::sources::render::Report;
use crate::sources::settings::SourceKind;

const G: SourceKind = SourceKind::Github;

/// The most comment pages a retry reads looking for its marker (100 each).
const MAX_COMMENT_PAGES: u32 = 30;

/// How long before its outbox row was made a retry looks for the row's comment: the
/// database's clock and GitHub's may disagree, and a lookup that starts after the comment
/// would post it twice.
const CLOCK_SLACK: Duration = Duration::from_secs(3600);

/// Which try of an outbox row this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Try {
    /// No earlier try can have posted the comment.
    First,
    /// An earlier try may have: look among the comments written since the row was made
    /// (`made_ms`, the database's clock), so an issue's long past never hides it.
    Retry { made_ms: i64 },
}

impl Try {
    /// The try that delivery `d` is.
    pub fn of(d: &Delivery) -> Self {
        if d.tries <= 1 {
            Self::First
        } else {
            Self::Retry { made_ms: d.created_at }
        }
    }

    /// GitHub's `since` for a retry's lookup: [`CLOCK_SLACK`] before the row was made.
    fn since(made_ms: i64) -> Option<String> {
        let slack = i64::try_from(CLOCK_SLACK.as_millis()).unwrap_or(0);
        let ms = u64::try_from(made_ms.saturating_sub(slack)).ok()?;
        UNIX_EPOCH.checked_add(Duration::from_millis(ms)).map(|t| humantime::format_rfc3339_seconds(t).to_string())
    }
}

/// Where on GitHub a job's issue is (the payload's `source`).
#[derive(Clone, Debug, Deserialize)]
pub struct IssueRef {
    /// `owner/repo`.
    pub repo: String,
    pub number: u64,
}

impl IssueRef {
    /// The issue a payload names, if it came from GitHub.
    pub fn of(payload: &Value) -> Option<Self> {
        let s = payload.get("source")?;
        (s.get("kind")?.as_str()? == "github").then(|| serde_json::from_value(s.clone()).ok())?
    }
}

/// Does what `report` says on `issue`: the comment (once), then the working label.
/// `attempt`: whether an earlier try can have posted the comment.
pub async fn deliver(
    client: &GithubClient,
    issue: &IssueRef,
    report: &Report,
    marker: &CommentMarker<'_>,
    attempt: Try,
    working_label: &str,
) -> Result<(), TrackerError> {
    if let Some(body) = &report.comment {
        post_once(client, issue, body, marker, attempt).await?;
    }
    match report.working {
        Some(true) if !working_label.is_empty() => {
            client.send(&calls::add_label(&issue.repo, issue.number, working_label), None).await?;
        }
        Some(false) if !working_label.is_empty() => {
            match client.send(&calls::remove_label(&issue.repo, issue.number, working_label), None).await {
                // Not on the issue (a person took it off, or an earlier try did): done.
                Err(TrackerError::Refused(_, why)) if why.contains("was not found") => {}
                other => drop(other?),
            }
        }
        _ => {}
    }
    Ok(())
}

/// Posts `body` with the marker signed for the token's user at its end, unless a comment
/// with its author's marker is there already (looked for on a retry only: a first try
/// cannot have posted it).
pub async fn post_once(
    client: &GithubClient,
    issue: &IssueRef,
    body: &str,
    marker: &CommentMarker<'_>,
    attempt: Try,
) -> Result<(), TrackerError> {
    if let Try::Retry { made_ms } = attempt {
        if has_marker(client, issue, marker, Try::since(made_ms).as_deref()).await? {
            return Ok(());
        }
    }
    let me = client.login().await?;
    if me.is_empty() {
        return Err(TrackerError::Refused(G, "GitHub did not say whose token this is (GET /user)".into()));
    }
    let text = format!("{body}\n\n{}", marker.by(&me));
    client.send(&calls::create_comment(&issue.repo, issue.number, &text), None).await.map(drop)
}

/// Whether a comment on `issue` written `since` (all, if `None`) carries the row's marker
/// signed for the comment's own author, whoever that is: the first try may have run on a
/// machine whose token is another user's. A lookup that cannot read every such comment
/// (more than [`MAX_COMMENT_PAGES`] pages) says so: the row gives up rather than post a
/// second time.
async fn has_marker(
    client: &GithubClient,
    issue: &IssueRef,
    marker: &CommentMarker<'_>,
    since: Option<&str>,
) -> Result<bool, TrackerError> {
    for page in 1..=MAX_COMMENT_PAGES {
        let answer = client.send(&calls::list_comments(&issue.repo, issue.number, page, since), None).await?;
        if answer.body.as_array().is_some_and(|list| list.iter().any(|c| signed_by_author(c, marker))) {
            return Ok(true);
        }
        if !answer.has_next {
            return Ok(false);
        }
    }
    Err(TrackerError::Refused(
        G,
        format!(
            "{}#{} has more than {} comments since the row was made: whether an earlier try posted this one cannot be told, \
             so it is not posted again",
            issue.repo,
            issue.number,
            MAX_COMMENT_PAGES * calls::PER_PAGE
        ),
    ))
}

/// Whether comment `c` carries the marker signed for its own author.
fn signed_by_author(c: &Value, marker: &CommentMarker<'_>) -> bool {
    let Some(author) = c.pointer("/user/login").and_then(Value::as_str) else { return false };
    c.get("body").and_then(Value::as_str).is_some_and(|b| b.contains(&marker.by(author)))
}
