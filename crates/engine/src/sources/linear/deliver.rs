//! One outbox row to Linear: its comment (with an id derived from the row with the
//! orchestrator's key, `sources::mac`, so a retry after a lost answer never posts twice and
//! nobody else can take the id first), the state moves, and the
//! link. Every call is idempotent, so a retried delivery does the same thing again.

use serde::Deserialize;
use serde_json::{json, Value};

use super::client::{LinearClient, TrackerError};
use super::documents;
use crate::sources::render::Report;

/// Where on Linear a job's issue is (the payload's `source`).
#[derive(Clone, Debug, Deserialize)]
pub struct IssueRef {
    /// The issue's UUID.
    pub id: String,
    /// Its team's UUID (for its workflow states).
    pub team: String,
}

impl IssueRef {
    /// The issue a payload names, if it came from Linear.
    pub fn of(payload: &Value) -> Option<Self> {
        let s = payload.get("source")?;
        (s.get("kind")?.as_str()? == "linear").then(|| serde_json::from_value(s.clone()).ok())?
    }
}

#[derive(Deserialize)]
struct IssueTeam {
    issue: IssueNode,
}

#[derive(Deserialize)]
struct IssueNode {
    id: String,
    team: TeamNode,
}

#[derive(Deserialize)]
struct TeamNode {
    id: String,
    key: String,
}

/// The job's issue as Linear has it, if its team is one of `teams` (the source's keys): the
/// id and team the delivery acts on are Linear's answer, never the row's. `Ok(Err(why))`:
/// the issue is another team's, and nothing is done.
pub async fn own_issue(
    client: &LinearClient,
    named: &IssueRef,
    teams: &[String],
) -> Result<Result<IssueRef, String>, TrackerError> {
    let (found, _) = client.call::<IssueTeam>(documents::ISSUE_TEAM, json!({ "id": named.id })).await?;
    let team = found.issue.team;
    if !teams.iter().any(|t| t.eq_ignore_ascii_case(&team.key)) {
        let why = format!("the job's Linear issue is in team {}, and the source reads {}", team.key, teams.join(", "));
        return Ok(Err(why));
    }
    Ok(Ok(IssueRef { id: found.issue.id, team: team.id }))
}

#[derive(Deserialize)]
struct Found {
    comment: Option<Value>,
}

#[derive(Deserialize)]
struct States {
    #[serde(rename = "workflowStates")]
    states: StateNodes,
}

#[derive(Deserialize)]
struct StateNodes {
    nodes: Vec<State>,
}

#[derive(Clone, Debug, Deserialize)]
struct State {
    id: String,
    name: String,
    #[serde(rename = "type")]
    kind: String,
    position: f64,
}

/// Does what `report` says on `issue`: the comment first (what a person reads), then the
/// link, then the state moves. `first_try`: no earlier try can have applied it. A state
/// move Linear refuses (the team has no such state) is logged and skipped: it must not
/// cost the comment.
pub async fn deliver(
    client: &LinearClient,
    issue: &IssueRef,
    report: &Report,
    comment_id: &str,
    first_try: bool,
) -> Result<(), TrackerError> {
    if let Some(body) = &report.comment {
        post_once(client, issue, comment_id, body, first_try).await?;
    }
    if let Some(url) = &report.link {
        attach(client, issue, url, "DevPilot result").await?;
    }
    if report.move_to_started {
        skip_refused(move_to(client, issue, |s| s.kind == "started").await, "the first started state")?;
    }
    if let Some(name) = &report.move_to {
        let wanted = name.trim().to_lowercase();
        let moved = move_to(client, issue, |s| s.name.trim().to_lowercase() == wanted).await;
        skip_refused(moved, name)?;
    }
    Ok(())
}

/// Links `url` on the issue as an attachment titled `title` (Linear keeps one per URL, so a
/// second call changes nothing).
pub async fn attach(client: &LinearClient, issue: &IssueRef, url: &str, title: &str) -> Result<(), TrackerError> {
    let vars = json!({ "issueId": issue.id, "url": url, "title": title });
    client.call::<Value>(documents::LINK_URL, vars).await.map(drop)
}

/// A refused state move is logged, not failed: the row's other parts are delivered.
fn skip_refused(moved: Result<(), TrackerError>, what: &str) -> Result<(), TrackerError> {
    match moved {
        Err(TrackerError::Refused(_, why)) => {
            tracing::warn!(state = what, "the issue could not be moved: {why}");
            Ok(())
        }
        other => other,
    }
}

/// Posts the comment unless an earlier try already did: a retry looks for the comment by
/// its id first, and an "already exists" answer counts as posted.
async fn post_once(
    client: &LinearClient,
    issue: &IssueRef,
    id: &str,
    body: &str,
    first_try: bool,
) -> Result<(), TrackerError> {
    if !first_try {
        match client.call::<Found>(documents::FIND_COMMENT, json!({ "id": id })).await {
            Ok((found, _)) if found.comment.is_some() => return Ok(()),
            Ok(_) | Err(TrackerError::Refused(..)) => {}
            Err(e) => return Err(e),
        }
    }
    let input = json!({ "input": { "id": id, "issueId": issue.id, "body": body } });
    match client.call::<Value>(documents::POST_COMMENT, input).await {
        Err(TrackerError::Refused(_, m)) if m.to_lowercase().contains("already exists") => Ok(()),
        other => other.map(drop),
    }
}

/// Moves the issue to the first state of its team (by position) that `pick` takes.
async fn move_to(client: &LinearClient, issue: &IssueRef, pick: impl Fn(&State) -> bool) -> Result<(), TrackerError> {
    let (states, _) = client.call::<States>(documents::STATES, json!({ "team": issue.team })).await?;
    let mut fit: Vec<State> = states.states.nodes.into_iter().filter(|s| pick(s)).collect();
    fit.sort_by(|a, b| a.position.total_cmp(&b.position));
    let Some(state) = fit.first() else {
        return Err(TrackerError::Refused(
            crate::sources::settings::SourceKind::Linear,
            "the team has no such workflow state".into(),
        ));
    };
    client.call::<Value>(documents::MOVE_ISSUE, json!({ "id": issue.id, "stateId": state.id })).await.map(drop)
}
