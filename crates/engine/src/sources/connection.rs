//! The connection test of Settings → Sources and `devpilot sources add`: the key works, and
//! the teams (Linear) or the repository (GitHub) and the label the source names exist. Each
//! failure names what it could not find.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::TrackerError;
use super::github::{calls, GithubClient};
use super::linear::{documents, LinearClient};
use super::settings::{SourceKind, SourceSettings};

/// What the test found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Found {
    /// Whose key it is.
    pub viewer: String,
    /// "team ENG (Engineering)", one per team; or "repo acme/webapp (can push)".
    pub teams: Vec<String>,
    /// The label as Linear spells it, if the source names one.
    pub label: Option<String>,
}

impl Found {
    /// "Connected as Ada: team ENG (Engineering), label agent".
    pub fn line(&self) -> String {
        let label = self.label.as_deref().map(|l| format!(", label {l}")).unwrap_or_default();
        format!("Connected as {}: {}{label}", self.viewer, self.teams.join(", "))
    }
}

/// Why the test failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Tracker(#[from] TrackerError),
    #[error("Linear has no team with the key {0} that this key can see")]
    UnknownTeam(String),
    #[error("{0} has no label named '{1}'")]
    UnknownLabel(&'static str, String),
}

#[derive(Deserialize)]
struct Viewer {
    viewer: Named,
}

#[derive(Deserialize)]
struct Named {
    name: String,
}

#[derive(Deserialize)]
struct Teams {
    teams: Nodes<Team>,
}

#[derive(Deserialize)]
struct Team {
    key: String,
    name: String,
}

#[derive(Deserialize)]
struct Labels {
    #[serde(rename = "issueLabels")]
    labels: Nodes<Named>,
}

#[derive(Deserialize)]
struct Nodes<T> {
    nodes: Vec<T>,
}

/// Tests `s` with `key`.
pub async fn test(s: &SourceSettings, key: &str) -> Result<Found, ConnectionError> {
    match s.kind {
        SourceKind::Linear => test_linear(s, key).await,
        SourceKind::Github => test_github(s, key).await,
    }
}

/// The token works, the repository is there for it (and what it may do there), and so is
/// the label.
async fn test_github(s: &SourceSettings, key: &str) -> Result<Found, ConnectionError> {
    let client = GithubClient::for_source(s, key)?;
    let login = client.login().await?;
    let repo = client.send(&calls::get_repo(&s.repo), None).await?.body;
    let name = repo.get("full_name").and_then(|v| v.as_str()).unwrap_or(&s.repo).to_string();
    let can = |p: &str| repo.pointer(&format!("/permissions/{p}")).and_then(|v| v.as_bool()) == Some(true);
    let access = if can("push") { "can push" } else { "read only: comments and pull requests need write access" };
    let mut found = Found { viewer: login, teams: vec![format!("repo {name} ({access})")], label: None };
    if !s.label.trim().is_empty() {
        match client.send(&calls::get_label(&s.repo, s.label.trim()), None).await {
            Ok(a) => found.label = a.body.get("name").and_then(|v| v.as_str()).map(str::to_string),
            Err(TrackerError::Refused(_, why)) if why.contains("was not found") => {
                return Err(ConnectionError::UnknownLabel("GitHub", s.label.trim().to_string()))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(found)
}

async fn test_linear(s: &SourceSettings, key: &str) -> Result<Found, ConnectionError> {
    let client = LinearClient::for_source(s, key)?;
    let (viewer, _) = client.call::<Viewer>(documents::VIEWER, json!({})).await?;
    let (teams, _) = client.call::<Teams>(documents::TEAMS, json!({ "keys": s.teams })).await?;
    let mut found = Found { viewer: viewer.viewer.name, teams: vec![], label: None };
    for want in &s.teams {
        let team = teams.teams.nodes.iter().find(|t| t.key.eq_ignore_ascii_case(want));
        let Some(t) = team else { return Err(ConnectionError::UnknownTeam(want.clone())) };
        found.teams.push(format!("team {} ({})", t.key, t.name));
    }
    if !s.label.is_empty() {
        let (labels, _) = client.call::<Labels>(documents::LABELS, json!({ "name": s.label })).await?;
        let Some(l) = labels.labels.nodes.into_iter().next() else {
            return Err(ConnectionError::UnknownLabel("Linear", s.label.clone()));
        };
        found.label = Some(l.name);
    }
    Ok(found)
}
