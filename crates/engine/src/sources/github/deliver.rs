//! One outbox row to a GitHub issue: its comment, which ends with a hidden marker naming the
//! job, the event and the claim (`<!-- devpilot:job/12/completed/2 -->`), so a retry looks
//! for the marker and never posts twice; and the "working" label while a machine runs it.
//! Each call is idempotent, so a retried delivery does the same thing again.

use serde::Deserialize;
use serde_json::Value;

use super::calls;
use super::client::GithubClient;
use crate::sources::error::TrackerError;
use crate::sources::render::Report;

/// The most comment pages a retry reads looking for its marker (100 each).
const MAX_COMMENT_PAGES: u32 = 30;

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

/// The hidden marker of a row's comment.
pub fn marker(job: i64, event: &str, claim_token: Option<i64>) -> String {
    format!("<!-- devpilot:job/{job}/{event}/{} -->", claim_token.unwrap_or(0))
}

/// Does what `report` says on `issue`: the comment (once), then the working label.
/// `first_try`: no earlier try can have posted the comment.
pub async fn deliver(
    client: &GithubClient,
    issue: &IssueRef,
    report: &Report,
    marker: &str,
    first_try: bool,
    working_label: &str,
) -> Result<(), TrackerError> {
    if let Some(body) = &report.comment {
        post_once(client, issue, body, marker, first_try).await?;
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

/// Posts `body` with `marker` at its end, unless a comment with the marker is there already
/// (looked for on a retry only: a first try cannot have posted it).
pub async fn post_once(
    client: &GithubClient,
    issue: &IssueRef,
    body: &str,
    marker: &str,
    first_try: bool,
) -> Result<(), TrackerError> {
    if !first_try && has_marker(client, issue, marker).await? {
        return Ok(());
    }
    let text = format!("{body}\n\n{marker}");
    client.send(&calls::create_comment(&issue.repo, issue.number, &text), None).await.map(drop)
}

/// Whether a comment on `issue` carries `marker`.
async fn has_marker(client: &GithubClient, issue: &IssueRef, marker: &str) -> Result<bool, TrackerError> {
    for page in 1..=MAX_COMMENT_PAGES {
        let answer = client.send(&calls::list_comments(&issue.repo, issue.number, page), None).await?;
        let list = answer.body.as_array().cloned().unwrap_or_default();
        let found = list.iter().any(|c| c.get("body").and_then(Value::as_str).is_some_and(|b| b.contains(marker)));
        if found {
            return Ok(true);
        }
        if !answer.has_next {
            return Ok(false);
        }
    }
    Ok(false)
}
