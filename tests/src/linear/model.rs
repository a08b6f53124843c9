//! What the stand-in's Rust API hands out and takes: snapshots of its data (owned copies, so a
//! test reads them without holding any lock), the seed of a new issue, the faults a test can
//! inject and the record of each request.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// A new issue, as a person would file it in Linear. `Default` is a `Todo` issue in `ENG` with
/// no labels, priority 0 (none), no project and no assignee.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct IssueSeed {
    /// The team's key, e.g. `ENG`.
    pub team: String,
    /// The title (the URL's and the branch name's slug come from it).
    pub title: String,
    /// The description; `None` is Linear's null.
    pub description: Option<String>,
    /// Label names; a name the stand-in does not have yet is created.
    pub labels: Vec<String>,
    /// 0 (none), 1 (urgent) .. 4 (low), as Linear numbers them.
    pub priority: u8,
    /// A project name; created on first use.
    pub project: Option<String>,
    /// Assigned to the viewer (the key's owner) rather than to nobody.
    #[serde(alias = "assigneeMe")]
    pub assignee_me: bool,
    /// The workflow state's name in the team, e.g. `Todo` or `In Progress`.
    #[serde(alias = "state")]
    pub state_name: String,
    /// Who files it: a user's name (see [`LinearStandIn::add_user`]); `None`: the viewer.
    /// Labels it is filed with are its creator's, and no history entry records them.
    ///
    /// [`LinearStandIn::add_user`]: super::LinearStandIn::add_user
    pub creator: Option<String>,
}

impl Default for IssueSeed {
    fn default() -> Self {
        Self {
            team: "ENG".into(),
            title: "An issue".into(),
            description: None,
            labels: Vec::new(),
            priority: 0,
            project: None,
            assignee_me: false,
            state_name: "Todo".into(),
            creator: None,
        }
    }
}

impl IssueSeed {
    /// A `Todo` issue in `ENG` with this title and these labels.
    pub fn new(title: &str, labels: &[&str]) -> Self {
        Self { title: title.into(), labels: labels.iter().map(|l| (*l).to_string()).collect(), ..Self::default() }
    }
}

/// An issue as the stand-in holds it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Issue {
    /// Linear's UUID.
    pub id: String,
    /// `ENG-7`.
    pub identifier: String,
    /// The title.
    pub title: String,
    /// The description, or null.
    pub description: Option<String>,
    /// `https://linear.app/standin/issue/ENG-7/<slug>`.
    pub url: String,
    /// `<viewer>/eng-7-<slug>`: the branch Linear suggests.
    pub branch_name: String,
    /// 0 (none) .. 4 (low).
    pub priority: u8,
    /// The team's key.
    pub team: String,
    /// The project's name, if any.
    pub project: Option<String>,
    /// The workflow state's name, e.g. `In Progress`.
    pub state_name: String,
    /// Its type: backlog, unstarted, started, completed or canceled.
    pub state_type: String,
    /// The assignee's name, if any.
    pub assignee: Option<String>,
    /// Whether the assignee is the viewer.
    pub assignee_me: bool,
    /// Label names, in the order they were set.
    pub labels: Vec<String>,
    /// `updatedAt`, RFC 3339 with milliseconds.
    pub updated_at: String,
}

/// A team (`ENG` exists from the start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Team {
    /// Linear's UUID.
    pub id: String,
    /// `ENG`.
    pub key: String,
    /// `Engineering`.
    pub name: String,
}

/// A team's workflow state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowState {
    /// Linear's UUID (what `issueUpdate`'s `stateId` takes).
    pub id: String,
    /// `In Progress`.
    pub name: String,
    /// backlog, unstarted, started, completed or canceled.
    pub kind: String,
    /// The order Linear shows the states in.
    pub position: f64,
}

/// A comment on an issue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Comment {
    /// Its id (the client's, when `commentCreate` chose one).
    pub id: String,
    /// Its markdown body.
    pub body: String,
    /// Its author's name (`Ada`, the viewer, for what the engine posts).
    pub user: String,
}

/// A fault the stand-in plays instead of (or after) answering, for the next N requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Apply the request (a mutation takes effect), then hold the answer this long and close
    /// the connection without one: the delivery whose outcome the client cannot know.
    Timeout(Duration),
    /// Answer this 5xx status without applying anything.
    ServerError(u16),
    /// Answer as an exhausted budget does (HTTP 400, `RATELIMITED`), without applying.
    RateLimited,
    /// Refuse the key as a revoked one is refused (`AUTHENTICATION_ERROR`).
    WrongKey,
}

/// One request as the stand-in saw it. The `Authorization` header is never kept: only whether
/// it matched.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recorded {
    /// When it arrived (the stand-in's clock).
    pub at: SystemTime,
    /// `operationName`, or the name of the document's operation; `None` for an anonymous one.
    pub operation: Option<String>,
    /// The variables as sent (null when there were none).
    pub variables: serde_json::Value,
    /// Whether the `Authorization` header was exactly the key.
    pub key_matched: bool,
    /// Refused because the schema does not allow the document or the variables (or the body
    /// was not a GraphQL request at all): what the engine must never send.
    pub rejected: bool,
    /// Why it was rejected: the schema validation's diagnostics.
    pub diagnostics: Vec<String>,
    /// The GraphQL errors of an answered request (a field error, an unimplemented filter key,
    /// authentication, rate limit).
    pub errors: Vec<String>,
    /// The HTTP status answered; `None` when a [`Fault::Timeout`] withheld the answer.
    pub status: Option<u16>,
    /// The injected fault this request met, if any.
    pub fault: Option<String>,
}
