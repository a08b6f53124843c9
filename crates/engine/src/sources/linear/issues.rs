//! Reading issues: the filter a source sends, every page of the answer, and each issue as
//! DevPilot reads it.

use serde::Deserialize;
use serde_json::{json, Value};

use super::client::{LinearClient, RateLimit, TrackerError};
use super::documents;
use crate::sources::settings::SourceSettings;

/// The most pages one turn reads (25 issues each): a turn that finds more ends early and
/// the next turn goes on from its cursor.
const MAX_PAGES: usize = 80;

/// An issue, with what the intake needs of it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Issue {
    pub id: String,
    pub identifier: String,
    pub title: String,
    pub description: Option<String>,
    pub url: String,
    pub branch_name: String,
    /// 0 none, 1 urgent … 4 low.
    pub priority: f64,
    /// RFC 3339.
    pub updated_at: String,
    pub team: Team,
    pub project: Option<Named>,
    pub state: StateType,
    pub assignee: Option<Assignee>,
    pub labels: Labels,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Team {
    pub id: String,
    pub key: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Named {
    pub name: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct StateType {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Assignee {
    pub is_me: bool,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Labels {
    pub nodes: Vec<Named>,
}

impl Issue {
    /// The label names.
    pub fn label_names(&self) -> impl Iterator<Item = &str> {
        self.labels.nodes.iter().map(|l| l.name.as_str())
    }

    /// Whether the issue is one the source takes: its team, label, state type and (if asked)
    /// assignee. An issue that stops matching is one whose job is cancelled.
    pub fn matches(&self, s: &SourceSettings) -> bool {
        let state = s.states.is_empty() || s.states.contains(&self.state.kind);
        self.in_team(s) && self.has_label(s) && state && self.is_mine(s)
    }

    /// Whether the issue has left the source in a way that cancels its job: its label was
    /// removed, it was moved to a completed or canceled state, it was unassigned (with
    /// "assigned to me"), or it moved to another team. A state type merely outside the
    /// filter does not: the first claim itself moves the issue to a `started` state.
    pub fn left(&self, s: &SourceSettings) -> bool {
        let done = matches!(self.state.kind.as_str(), "completed" | "canceled");
        done || !self.in_team(s) || !self.has_label(s) || !self.is_mine(s)
    }

    fn in_team(&self, s: &SourceSettings) -> bool {
        s.teams.iter().any(|t| t.eq_ignore_ascii_case(&self.team.key))
    }

    fn has_label(&self, s: &SourceSettings) -> bool {
        s.label.is_empty() || self.label_names().any(|l| l.eq_ignore_ascii_case(&s.label))
    }

    /// Assigned to the key's user, when the source asks for that.
    fn is_mine(&self, s: &SourceSettings) -> bool {
        !s.assigned_to_me || self.assignee.as_ref().is_some_and(|a| a.is_me)
    }
}

#[derive(Deserialize)]
struct IssuesData {
    issues: Page,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    nodes: Vec<Issue>,
    page_info: PageInfo,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageInfo {
    has_next_page: bool,
    end_cursor: Option<String>,
}

/// The filter of a turn. With no cursor (the first turn), only the issues the source takes.
/// With one, every issue of its teams changed since: those that match are added or updated,
/// and those that no longer do cancel their jobs.
pub fn filter(s: &SourceSettings, cursor: Option<&str>) -> Value {
    let teams = json!({ "key": { "in": s.teams } });
    let Some(since) = cursor else {
        let mut and = vec![json!({ "team": teams })];
        if !s.label.is_empty() {
            and.push(json!({ "labels": { "some": { "name": { "eqIgnoreCase": s.label } } } }));
        }
        if !s.states.is_empty() {
            and.push(json!({ "state": { "type": { "in": s.states } } }));
        }
        if s.assigned_to_me {
            and.push(json!({ "assignee": { "isMe": { "eq": true } } }));
        }
        return json!({ "and": and });
    };
    json!({ "and": [ { "team": teams }, { "updatedAt": { "gte": overlap(since) } } ] })
}

/// How far before the cursor a turn reads again: an issue whose `updatedAt` became visible
/// late is still seen; reading an issue twice changes nothing.
const OVERLAP_MS: i64 = 10_000;

/// The cursor moved back by [`OVERLAP_MS`] (as Linear writes times: RFC 3339, ms, UTC).
fn overlap(cursor: &str) -> String {
    match crate::span::parse_time_ms(cursor) {
        Ok(ms) => {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis((ms - OVERLAP_MS).max(0) as u64);
            humantime::format_rfc3339_millis(t).to_string()
        }
        Err(_) => cursor.to_string(),
    }
}

/// What a turn read: the issues, the newest `updatedAt` among them, and the last budget.
#[derive(Debug, Default)]
pub struct Read {
    pub issues: Vec<Issue>,
    pub newest: Option<String>,
    pub rate: RateLimit,
    /// More pages were left for the next turn.
    pub truncated: bool,
}

/// Every page of the turn's filter.
pub async fn read_changed(
    client: &LinearClient,
    s: &SourceSettings,
    cursor: Option<&str>,
) -> Result<Read, TrackerError> {
    let mut read = Read::default();
    let mut after: Option<String> = None;
    let filter = filter(s, cursor);
    for _ in 0..MAX_PAGES {
        let vars = json!({ "filter": filter, "after": after });
        let (data, rate): (IssuesData, RateLimit) = client.call(documents::ISSUES, vars).await?;
        read.rate = rate;
        read.issues.extend(data.issues.nodes);
        match (data.issues.page_info.has_next_page, data.issues.page_info.end_cursor) {
            (true, Some(next)) => after = Some(next),
            _ => {
                read.newest = newest(&read.issues);
                return Ok(read);
            }
        }
    }
    // Oldest change first: what is left is newer than everything read, and the next turn
    // reads it from this turn's cursor. If the pages did not come oldest first, what is
    // left may be older: the cursor stays, and the next turn reads it all again.
    read.truncated = true;
    let ascending = read.issues.windows(2).all(|w| time_of(&w[0]) <= time_of(&w[1]));
    read.newest = if ascending { newest(&read.issues) } else { None };
    Ok(read)
}

/// The newest `updatedAt`.
fn newest(issues: &[Issue]) -> Option<String> {
    issues.iter().max_by_key(|i| time_of(i)).map(|i| i.updated_at.clone())
}

fn time_of(i: &Issue) -> i64 {
    crate::span::parse_time_ms(&i.updated_at).unwrap_or(0)
}
