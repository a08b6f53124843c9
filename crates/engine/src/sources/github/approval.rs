//! Who applied the source's label to an issue, and whether the issue changed after. GitHub's
//! REST API keeps no time for an edit of an issue's text: the issue's `updated_at` (whole
//! seconds) moves on any change, and no issue event records a body edit. So the text read is
//! the approved one only when the issue's `updated_at` is not later than the newest `labeled`
//! event of the label by a user with write access; anything later (an edit, a comment, a
//! reopen) asks for a new label. The text is read before the events, so the issue is read
//! again after them: if its `updated_at` moved since the text was read (a new label, an edit
//! the new label approved), the text in hand waits for the next turn's read.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use super::calls::{self, PER_PAGE};
use super::client::{is_not_found, GithubClient};
use crate::sources::approval::{at_version, Approval, Verdict};
use crate::sources::error::TrackerError;
use crate::sources::settings::SourceKind;

/// The most pages of events read for one issue (100 each).
const MAX_PAGES: u32 = 10;
/// The most labellers whose access is asked for one issue, newest first.
const MAX_ASKED: usize = 5;

/// An issue event, as far as the approval needs it.
#[derive(Debug, Deserialize)]
struct Event {
    id: u64,
    event: String,
    #[serde(default)]
    actor: Option<Actor>,
    created_at: String,
    #[serde(default)]
    label: Option<LabelName>,
}

#[derive(Debug, Deserialize)]
struct Actor {
    login: String,
}

#[derive(Debug, Deserialize)]
struct LabelName {
    name: String,
}

/// Each login's write access, asked once per turn.
pub type Writers = HashMap<String, bool>;

/// The approval of issue `number` of `repo`, read at `updated_at`: the newest `labeled`
/// event of `label` whose actor may write to `repo`. `writers` remembers the answers.
pub async fn approval(
    client: &GithubClient,
    repo: &str,
    label: &str,
    number: u64,
    updated_at: &str,
    writers: &mut Writers,
) -> Result<Verdict, TrackerError> {
    let Some(events) = labelled(client, repo, number, label).await? else {
        return Ok(Verdict::Unreadable(format!(
            "it has more than {} events, so who applied the label cannot be read",
            MAX_PAGES * PER_PAGE
        )));
    };
    for e in events.iter().rev().take(MAX_ASKED) {
        let Some(login) = e.actor.as_ref().map(|a| a.login.clone()) else { continue };
        if !may_write(client, repo, &login, writers).await? {
            continue;
        }
        let approval = Approval { id: e.id.to_string(), by: login, at: e.created_at.clone() };
        let now = updated_now(client, repo, number).await?;
        return Ok(at_version(updated_at, &now, approval));
    }
    Ok(Verdict::Unapproved)
}

/// The issue's `updated_at` now (read after its events). An issue gone since reads as "",
/// which is never the version read.
async fn updated_now(client: &GithubClient, repo: &str, number: u64) -> Result<String, TrackerError> {
    match client.send(&calls::get_issue(repo, number), None).await {
        Ok(answer) => Ok(answer.body.get("updated_at").and_then(Value::as_str).unwrap_or_default().to_string()),
        Err(e) if is_not_found(&e) => Ok(String::new()),
        Err(e) => Err(e),
    }
}

/// The issue's `labeled` events of `label` (case-insensitive), oldest first; `None` past
/// [`MAX_PAGES`].
async fn labelled(
    client: &GithubClient,
    repo: &str,
    number: u64,
    label: &str,
) -> Result<Option<Vec<Event>>, TrackerError> {
    let mut out = Vec::new();
    for page in 1..=MAX_PAGES {
        let answer = client.send(&calls::list_issue_events(repo, number, page), None).await?;
        let items = answer.body.as_array().cloned().unwrap_or_default();
        let full = items.len() as u32 >= PER_PAGE;
        for item in items {
            if item.get("event").and_then(Value::as_str) != Some("labeled") {
                continue;
            }
            let e: Event = serde_json::from_value(item).map_err(|e| {
                TrackerError::Server(SourceKind::Github, 200).with_detail(&format!("an issue event: {e}"))
            })?;
            if e.event == "labeled" && e.label.as_ref().is_some_and(|l| l.name.eq_ignore_ascii_case(label.trim())) {
                out.push(e);
            }
        }
        if !answer.has_next || !full {
            return Ok(Some(out));
        }
    }
    Ok(None)
}

/// Whether `login` may write to `repo` (`admin`, or `write`, which `maintain` maps to). A user
/// GitHub does not know may not.
async fn may_write(
    client: &GithubClient,
    repo: &str,
    login: &str,
    writers: &mut Writers,
) -> Result<bool, TrackerError> {
    if let Some(known) = writers.get(login) {
        return Ok(*known);
    }
    let write = match client.send(&calls::get_permission(repo, login), None).await {
        Ok(answer) => matches!(answer.body.get("permission").and_then(Value::as_str), Some("admin" | "write")),
        Err(e) if is_not_found(&e) => false,
        Err(e) => return Err(e),
    };
    writers.insert(login.to_string(), write);
    Ok(write)
}
