//! The connection test of Settings → Sources and `devpilot sources add`: the key works, and
//! the teams and the label the source names exist. Each failure names what it could not find.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::linear::{documents, LinearClient, TrackerError};
use super::settings::SourceSettings;

/// What the test found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Found {
    /// Whose key it is.
    pub viewer: String,
    /// "ENG (Engineering)", one per team.
    pub teams: Vec<String>,
    /// The label as Linear spells it, if the source names one.
    pub label: Option<String>,
}

impl Found {
    /// "Connected as Ada: team ENG (Engineering), label agent".
    pub fn line(&self) -> String {
        let label = self.label.as_deref().map(|l| format!(", label {l}")).unwrap_or_default();
        format!("Connected as {}: team {}{label}", self.viewer, self.teams.join(", "))
    }
}

/// Why the test failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Tracker(#[from] TrackerError),
    #[error("Linear has no team with the key {0} that this key can see")]
    UnknownTeam(String),
    #[error("Linear has no label named '{0}'")]
    UnknownLabel(String),
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
    let client = LinearClient::for_source(s, key)?;
    let (viewer, _) = client.call::<Viewer>(documents::VIEWER, json!({})).await?;
    let (teams, _) = client.call::<Teams>(documents::TEAMS, json!({ "keys": s.teams })).await?;
    let mut found = Found { viewer: viewer.viewer.name, teams: vec![], label: None };
    for want in &s.teams {
        let team = teams.teams.nodes.iter().find(|t| t.key.eq_ignore_ascii_case(want));
        let Some(t) = team else { return Err(ConnectionError::UnknownTeam(want.clone())) };
        found.teams.push(format!("{} ({})", t.key, t.name));
    }
    if !s.label.is_empty() {
        let (labels, _) = client.call::<Labels>(documents::LABELS, json!({ "name": s.label })).await?;
        let Some(l) = labels.labels.nodes.into_iter().next() else {
            return Err(ConnectionError::UnknownLabel(s.label.clone()));
        };
        found.label = Some(l.name);
    }
    Ok(found)
}
