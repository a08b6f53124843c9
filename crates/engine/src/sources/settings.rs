//! A tracker source as the settings file holds it:
//!
//! ```toml
//! [sources.eng]
//! kind = "linear"
//! teams = ["ENG"]
//! label = "agent"
//! states = ["unstarted", "started"]
//! assigned_to_me = false
//! interval = "60s"
//! requires_prefix = "needs:"
//! repo_by_label = { frontend = "webapp" }
//! repo_by_project = { Mobile = "ios" }
//! repo_by_team = { ENG = "webapp" }
//!
//! [sources.eng.report]
//! completed_state = "In Review"
//!
//! [sources.webapp-issues]
//! kind = "github"
//! repo = "acme/webapp"
//! label = "agent"
//! maps_to = "webapp"
//! priority_labels = { urgent = 4, "priority: high" = 3 }
//!
//! [sources.webapp-issues.report]
//! working_label = "devpilot: working"
//! ```
//!
//! Every part of what reaches the issue (`[sources.NAME.report]`) is on by default.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::span::Span;
use devpilot_store::error::{Error, Result};

/// Linear's GraphQL endpoint.
pub const LINEAR_API_URL: &str = "https://api.linear.app/graphql";
/// GitHub's REST API.
pub const GITHUB_API_URL: &str = "https://api.github.com";
/// The shortest interval a source may have: Linear's budget is 1,500 requests an hour.
pub const MIN_INTERVAL: Duration = Duration::from_secs(15);
/// The longest prompt a tracker's description becomes, in bytes (the rest is cut, and the
/// prompt says so): 32 KiB, well under the job's own cap of 256 KiB.
pub const DEFAULT_PROMPT_CAP: usize = 32 * 1024;

/// Which tracker.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    #[default]
    Linear,
    Github,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Linear => "linear",
            SourceKind::Github => "github",
        }
    }

    /// What its credential is called.
    pub fn credential(self) -> &'static str {
        match self {
            SourceKind::Linear => "API key",
            SourceKind::Github => "token",
        }
    }

    /// The variable a headless machine gives its credential in.
    pub fn env_var(self) -> &'static str {
        match self {
            SourceKind::Linear => "LINEAR_API_KEY",
            SourceKind::Github => "GITHUB_TOKEN",
        }
    }

    /// The tracker's name, as messages say it.
    pub fn tracker(self) -> &'static str {
        match self {
            SourceKind::Linear => "Linear",
            SourceKind::Github => "GitHub",
        }
    }
}

/// One configured source.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SourceSettings {
    pub kind: SourceKind,
    /// Linear: the team keys whose issues it takes (e.g. `["ENG"]`).
    pub teams: Vec<String>,
    /// GitHub: the repository whose issues it takes (`owner/repo`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub repo: String,
    /// The label an issue must carry; empty: any.
    pub label: String,
    /// Linear: the workflow state types an issue must be in (a GitHub issue must be open).
    pub states: Vec<String>,
    /// Only issues assigned to the key's owner.
    pub assigned_to_me: bool,
    /// How often the whole fleet polls it (at least 15s).
    pub interval: Span,
    /// How long one call to the tracker may take.
    pub timeout: Span,
    /// Empty: `DEVPILOT_LINEAR_API_URL` (`DEVPILOT_GITHUB_API_URL`), else the tracker's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// Labels with this prefix become the job's `requires` (`needs:gpu` → `gpu`).
    pub requires_prefix: String,
    /// The job's repo: by label first, then by project, then by team, then `maps_to`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub repo_by_label: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub repo_by_project: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub repo_by_team: BTreeMap<String, String>,
    /// The DevPilot repo its jobs run in when no mapping above names one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub maps_to: String,
    /// GitHub: its jobs run with no repo, in a scratch directory whose files are not kept
    /// (an agent whose answer is its comment). Otherwise an unmapped GitHub source's jobs
    /// run in the clone of its repository, or wait for a machine that has one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_repo: bool,
    /// Set at bind time when `maps_to` was found from this machine's clones (never in the
    /// file): another machine may name that repo differently, so a live job keeps its own.
    #[serde(skip)]
    pub repo_from_remote: bool,
    /// GitHub: labels that set the job's priority (higher runs first), e.g. `{ urgent = 4 }`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub priority_labels: BTreeMap<String, i32>,
    /// The longest prompt a description becomes, in bytes.
    pub prompt_cap: usize,
    /// What reaches the issue.
    pub report: ReportSettings,
    /// Off: this machine neither polls it nor delivers its outbox.
    pub enabled: bool,
}

impl Default for SourceSettings {
    fn default() -> Self {
        Self {
            kind: SourceKind::Linear,
            teams: vec![],
            repo: String::new(),
            label: "agent".into(),
            states: vec!["unstarted".into(), "started".into()],
            assigned_to_me: false,
            interval: Span::default_of("60s"),
            timeout: Span::default_of("20s"),
            api_url: None,
            requires_prefix: "needs:".into(),
            repo_by_label: BTreeMap::new(),
            repo_by_project: BTreeMap::new(),
            repo_by_team: BTreeMap::new(),
            maps_to: String::new(),
            no_repo: false,
            repo_from_remote: false,
            priority_labels: BTreeMap::new(),
            prompt_cap: DEFAULT_PROMPT_CAP,
            report: ReportSettings::default(),
            enabled: true,
        }
    }
}

/// What each event posts back to the issue; all on by default but the state a completion
/// moves the issue to, which has no default.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ReportSettings {
    /// A comment when a machine first starts the job ("Started on desktop").
    pub claimed: bool,
    /// Move the issue to its team's first `started` state on the first claim.
    pub move_to_started: bool,
    /// A comment when a machine hands the job off.
    pub handed_off: bool,
    /// The summary, the branch and the result link as a comment.
    pub completed: bool,
    /// An attachment linking the branch or pull request.
    pub attachment: bool,
    /// The state a completed job moves its issue to (e.g. "In Review"); empty: none.
    pub completed_state: String,
    /// The last error lines of a failed or dead attempt.
    pub failed: bool,
    /// "Waiting for the usage limit until 14:30".
    pub parked: bool,
    /// A comment when the job is cancelled.
    pub cancelled: bool,
    /// GitHub: a label the issue carries while a machine runs its job; empty: none.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub working_label: String,
}

impl Default for ReportSettings {
    fn default() -> Self {
        Self {
            claimed: true,
            move_to_started: true,
            handed_off: true,
            completed: true,
            attachment: true,
            completed_state: String::new(),
            failed: true,
            parked: true,
            cancelled: true,
            working_label: String::new(),
        }
    }
}

/// The workflow state types Linear has.
pub const STATE_TYPES: [&str; 6] = ["triage", "backlog", "unstarted", "started", "completed", "canceled"];

impl SourceSettings {
    /// The checks a source must pass before it is saved or used, each naming what is wrong.
    pub fn validate(&self, name: &str) -> Result<()> {
        devpilot_store::spec::validate_name("source", name)?;
        let bad = |why: String| Err(Error::Invalid(format!("source '{name}': {why}")));
        match self.kind {
            SourceKind::Linear => self.validate_linear().or_else(bad)?,
            SourceKind::Github => self.validate_github().or_else(bad)?,
        }
        if self.interval.get() < MIN_INTERVAL {
            return bad(format!("the interval {} is shorter than the minimum of 15s", self.interval));
        }
        if self.timeout.get() < Duration::from_secs(1) || self.timeout.get() > Duration::from_secs(120) {
            return bad(format!("the timeout {} must be between 1s and 2m", self.timeout));
        }
        if self.prompt_cap < 1024 || self.prompt_cap > devpilot_store::spec::MAX_PROMPT {
            return bad(format!("prompt_cap must be between 1024 and {} bytes", devpilot_store::spec::MAX_PROMPT));
        }
        if let Some(url) = &self.api_url {
            check_api_url(url).or_else(|e| bad(e.to_string()))?;
        }
        let mapped = self.repo_by_label.values().chain(self.repo_by_project.values()).chain(self.repo_by_team.values());
        for repo in mapped.chain(Some(&self.maps_to).filter(|m| !m.is_empty())) {
            devpilot_store::spec::validate_name("repo", repo)?;
        }
        Ok(())
    }

    fn validate_linear(&self) -> std::result::Result<(), String> {
        if self.teams.is_empty() {
            return Err("name at least one team key (teams = [\"ENG\"])".into());
        }
        if let Some(t) = self.teams.iter().find(|t| !valid_team_key(t)) {
            return Err(format!("'{t}' is not a team key (letters and digits, like ENG)"));
        }
        if let Some(s) = self.states.iter().find(|s| !STATE_TYPES.contains(&s.as_str())) {
            return Err(format!("'{s}' is not a state type; Linear's are {}", STATE_TYPES.join(", ")));
        }
        Ok(())
    }

    fn validate_github(&self) -> std::result::Result<(), String> {
        if !valid_github_repo(&self.repo) {
            return Err(format!(
                "'{}' is not a GitHub repository; name it as OWNER/REPO (repo = \"acme/webapp\")",
                self.repo
            ));
        }
        if !self.teams.is_empty() {
            return Err("teams are Linear's; a GitHub source names its repo".into());
        }
        if self.label.chars().any(char::is_control) || self.label.len() > 100 {
            return Err("the label must be at most 100 characters, with no control characters".into());
        }
        Ok(())
    }

    /// The API address: this source's, else `DEVPILOT_LINEAR_API_URL` (or
    /// `DEVPILOT_GITHUB_API_URL`), else the tracker's own.
    pub fn api_url(&self) -> String {
        let (var, default) = match self.kind {
            SourceKind::Linear => ("DEVPILOT_LINEAR_API_URL", LINEAR_API_URL),
            SourceKind::Github => ("DEVPILOT_GITHUB_API_URL", GITHUB_API_URL),
        };
        self.api_url
            .clone()
            .filter(|u| !u.trim().is_empty())
            .or_else(|| std::env::var(var).ok().filter(|u| !u.trim().is_empty()))
            .unwrap_or_else(|| default.to_string())
            .trim_end_matches('/')
            .to_string()
    }

    /// Whether the settings send any of the source's jobs to repo `repo`.
    pub fn names_repo(&self, repo: &str) -> bool {
        let mut mapped =
            self.repo_by_label.values().chain(self.repo_by_project.values()).chain(self.repo_by_team.values());
        self.maps_to == repo || mapped.any(|r| r == repo)
    }

    /// Why a Linear source takes no issue here: its jobs would name no repo (no `maps_to`, no
    /// mapping), so they would run in a scratch directory whose work is thrown away. Unless
    /// `no_repo = true` says that is what the user wants. (A GitHub source names its repo.)
    pub fn names_no_repo(&self) -> Option<String> {
        let mut mapped =
            self.repo_by_label.values().chain(self.repo_by_project.values()).chain(self.repo_by_team.values());
        let repo_less =
            self.kind == SourceKind::Linear && self.maps_to.trim().is_empty() && !mapped.any(|r| !r.is_empty());
        (repo_less && !self.no_repo).then(|| {
            "its jobs would name no repo, so nothing the agent writes would be kept: it takes no issue until it \
             names one (Runs in repo, `--maps-to`, or repo_by_team), or says no_repo = true"
                .to_string()
        })
    }

    /// The filter as stored with the source's row: a change resets the cursor.
    pub fn filter_text(&self) -> String {
        if self.kind == SourceKind::Github {
            let label = self.label.trim().to_lowercase();
            let repo = self.repo.to_lowercase();
            return serde_json::json!({ "repo": repo, "label": label, "assigned_to_me": self.assigned_to_me })
                .to_string();
        }
        let mut teams = self.teams.clone();
        teams.sort();
        let mut states = self.states.clone();
        states.sort();
        serde_json::json!({
            "teams": teams, "label": self.label, "states": states, "assigned_to_me": self.assigned_to_me,
        })
        .to_string()
    }
}

/// A team key: 1–10 ASCII letters and digits (Linear's own rule is 1–7; a little slack).
fn valid_team_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 10 && k.chars().all(|c| c.is_ascii_alphanumeric())
}

/// `owner/repo` as GitHub allows them: letters, digits, `-`, `_` and `.`, one slash.
pub fn valid_github_repo(r: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 100
            && p != "."
            && p != ".."
            && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    matches!(r.split_once('/'), Some((o, n)) if ok(o) && ok(n))
}

/// An API address must be http(s), and plain http only on loopback (a stand-in or a local
/// proxy): the key travels in a header.
pub fn check_api_url(raw: &str) -> Result<()> {
    let url = url::Url::parse(raw.trim()).map_err(|e| Error::Invalid(format!("the API address '{raw}': {e}")))?;
    let loopback = matches!(url.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
    match url.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(Error::Invalid(format!(
            "the API address '{raw}' must be https (plain http only to 127.0.0.1 or localhost)"
        ))),
    }
}
