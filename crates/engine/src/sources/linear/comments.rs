//! An issue's comments written after a time, each with who wrote it: what the review loop
//! reads of a Linear job's issue once its pull request opened (`sources::review::linear`
//! decides what counts).

use serde::Deserialize;
use serde_json::json;

use super::client::{LinearClient, TrackerError};
use super::documents;

/// The most pages one read takes (50 comments each): a read that finds more stops there and
/// says so ([`Comments::truncated`]); the next read starts again from the same time.
const MAX_PAGES: usize = 10;

/// A comment on an issue, as the review loop reads it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IssueComment {
    pub id: String,
    pub body: String,
    /// RFC 3339.
    pub created_at: String,
    #[serde(default)]
    pub url: Option<String>,
    /// Who wrote it; `None`: an integration or a bot with no user.
    #[serde(default)]
    pub user: Option<CommentUser>,
    /// The bot that created it, if one did.
    #[serde(default)]
    pub bot_actor: Option<BotActor>,
    /// The person outside Linear it was written by (a comment synced from Slack, say).
    #[serde(default)]
    pub external_user: Option<ExternalUser>,
}

/// The user who wrote a comment.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CommentUser {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub display_name: String,
    /// A guest: limited to some teams, not a member of the workspace.
    pub guest: bool,
    /// Deactivated users are not.
    pub active: bool,
    /// An application's user (an OAuth app acting as itself).
    #[serde(default)]
    pub app: bool,
    /// The key's own user.
    pub is_me: bool,
}

/// The bot that created a comment.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct BotActor {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: String,
}

/// A person outside Linear a comment came from.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ExternalUser {
    #[serde(default)]
    pub name: String,
}

/// What one read found: the issue as Linear has it (its id and team's key) and its comments.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comments {
    pub issue_id: String,
    pub team_key: String,
    pub comments: Vec<IssueComment>,
    /// More pages were left unread.
    pub truncated: bool,
}

#[derive(Deserialize)]
struct Data {
    issue: IssueNode,
}

#[derive(Deserialize)]
struct IssueNode {
    id: String,
    team: TeamKey,
    comments: Page,
}

#[derive(Deserialize)]
struct TeamKey {
    key: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    nodes: Vec<IssueComment>,
    page_info: PageInfo,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageInfo {
    has_next_page: bool,
    end_cursor: Option<String>,
}

/// The comments on issue `issue` (its UUID) created after `since_ms` (ms since the epoch),
/// every page up to [`MAX_PAGES`].
pub async fn comments_since(client: &LinearClient, issue: &str, since_ms: i64) -> Result<Comments, TrackerError> {
    let since = rfc3339(since_ms);
    let mut out = Comments::default();
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let vars = json!({ "id": issue, "since": since, "after": after });
        let (data, _): (Data, _) = client.call(documents::ISSUE_COMMENTS, vars).await?;
        out.issue_id = data.issue.id;
        out.team_key = data.issue.team.key;
        out.comments.extend(data.issue.comments.nodes);
        match (data.issue.comments.page_info.has_next_page, data.issue.comments.page_info.end_cursor) {
            (true, Some(next)) => after = Some(next),
            _ => return Ok(out),
        }
    }
    out.truncated = true;
    Ok(out)
}

/// A time as Linear writes one: RFC 3339, milliseconds, UTC.
fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page as Linear answers it: a member's comment, and an integration's with no user.
    #[test]
    fn a_page_reads_users_and_integrations() {
        let page = json!({"issue": {"id": "i", "team": {"key": "ENG"}, "comments": {
            "nodes": [
                {"id": "a", "body": "/devpilot x", "createdAt": "2026-01-01T00:00:00.000Z", "url": "u",
                 "user": {"id": "1", "name": "Grace", "displayName": "grace", "guest": false, "active": true,
                          "app": false, "isMe": false}, "botActor": null, "externalUser": null},
                {"id": "b", "body": "synced", "createdAt": "2026-01-01T00:00:01.000Z", "url": "v",
                 "user": null, "botActor": {"name": "Slack", "type": "slack"}, "externalUser": {"name": "Eve"}}],
            "pageInfo": {"hasNextPage": false, "endCursor": null}}}});
        let data: Data = serde_json::from_value(page).unwrap();
        let c = &data.issue.comments.nodes;
        assert_eq!(c[0].user.as_ref().map(|u| (u.name.as_str(), u.guest, u.is_me)), Some(("Grace", false, false)));
        assert!(c[1].user.is_none() && c[1].bot_actor.as_ref().is_some_and(|b| b.kind == "slack"));
        assert_eq!(rfc3339(1_767_225_600_000), "2026-01-01T00:00:00.000Z");
    }
}
