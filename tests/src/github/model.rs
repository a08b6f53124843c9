//! What the GitHub stand-in's Rust API hands out and takes: snapshots of its data (owned copies,
//! so a test reads them without holding a lock), the seed of a new issue, token kinds, the
//! faults a test can inject and the record of each request (never the token itself).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A new issue, as a person would open it on GitHub. `Default`: "An issue", no body, no
/// labels, unassigned.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct IssueSeed {
    pub title: String,
    /// `None` is GitHub's `null` body.
    pub body: Option<String>,
    /// Label names; one the repository does not have yet is created.
    pub labels: Vec<String>,
    /// The assignee's login.
    pub assignee: Option<String>,
    /// The author's login; `None`: the main token's user (`ada`, an admin).
    pub user: Option<String>,
}

impl Default for IssueSeed {
    fn default() -> Self {
        Self { title: "An issue".into(), body: None, labels: Vec::new(), assignee: None, user: None }
    }
}

impl IssueSeed {
    /// An unassigned issue with this title and these labels, without a body.
    pub fn new(title: &str, labels: &[&str]) -> Self {
        Self { title: title.into(), labels: labels.iter().map(|l| (*l).to_string()).collect(), ..Self::default() }
    }
}

/// An issue (or a pull request's issue side) as the stand-in holds it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Issue {
    pub number: u64,
    pub title: String,
    pub body: Option<String>,
    /// `open` or `closed`.
    pub state: String,
    pub labels: Vec<String>,
    pub assignee: Option<String>,
    /// `https://github.com/acme/webapp/issues/N` (`/pull/N` for a pull request).
    pub html_url: String,
    /// RFC 3339, whole seconds, as GitHub writes it.
    pub created_at: String,
    pub updated_at: String,
    /// How many comments it has.
    pub comments: usize,
    /// Whether it is a pull request.
    pub is_pull: bool,
}

/// A comment on an issue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Comment {
    pub id: u64,
    pub body: String,
    /// The author's login.
    pub user: String,
    /// `https://github.com/acme/webapp/issues/N#issuecomment-ID`.
    pub html_url: String,
    pub created_at: String,
}

/// A pull request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pull {
    pub id: u64,
    pub number: u64,
    pub title: String,
    pub body: Option<String>,
    /// The head branch's name (without `owner:`).
    pub head: String,
    pub base: String,
    pub draft: bool,
    /// `open` or `closed`.
    pub state: String,
    /// `https://github.com/acme/webapp/pull/N`.
    pub html_url: String,
    /// Closed by a merge (a pull request closed without one is `closed` and not merged).
    pub merged: bool,
    /// The head branch's commit now, as `head.sha` renders it.
    pub head_sha: String,
}

/// An inline (review) comment on a pull request's diff, or a reply in its thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReviewComment {
    pub id: u64,
    /// The author's login.
    pub user: String,
    pub body: String,
    /// The file it is on.
    pub path: String,
    /// The line of the file it is on.
    pub line: u64,
    /// The thread's first comment, for a reply (`in_reply_to_id`).
    pub in_reply_to: Option<u64>,
    /// The review it belongs to (`pull_request_review_id`).
    pub review_id: Option<u64>,
}

/// What a token other than the main one may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Everything (the main token's access).
    Full,
    /// Sees no repository: every `/repos/…` path is 404, as a private repository one cannot
    /// see is on GitHub.
    NoRepo,
    /// Reads; every write is 403 "Resource not accessible by personal access token".
    ReadOnly,
}

/// A fault played for the next `times` requests of operation `op` (an operationId such as
/// `pulls/create`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub op: &'static str,
    pub kind: FaultKind,
    pub times: usize,
}

/// What an injected [`Fault`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Apply the request (state changes happen), then hold the answer this long and close the
    /// connection without one: the client times out not knowing it was applied.
    Timeout { hold: Duration },
    /// Answer this status (`{"message":"Server Error"}`) without applying anything.
    Server(u16),
    /// GitHub's secondary rate limit: 403 with `retry-after`, not applied.
    SecondaryLimit { retry_after_s: u64 },
    /// 401 Bad credentials, as for a revoked token; not applied.
    Unauthorized,
}

/// One request as the stand-in saw it. The token is never kept: only whether it was accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recorded {
    pub method: String,
    /// The path as sent (percent-encoded), without the query.
    pub path: String,
    /// The operationId, or `""` when the request matched no operation.
    pub op: String,
    /// The query parameters, decoded.
    pub query: Vec<(String, String)>,
    /// The status answered; 0 when a [`FaultKind::Timeout`] withheld the answer.
    pub status: u16,
    /// Whether it sent `If-None-Match`.
    pub conditional: bool,
    /// Whether it counted against the rate limit (a 304 to a valid `If-None-Match` does not).
    pub counted: bool,
    /// Whether `Authorization: Bearer <token>` named a token the stand-in knows.
    pub auth_ok: bool,
    /// Refused because GitHub's description (or the required headers) does not allow it: what
    /// the engine must never send.
    pub rejected: bool,
    /// Why it was rejected (or the error message of another non-2xx answer).
    pub message: Option<String>,
    /// The injected fault it met, if any.
    pub fault: Option<String>,
}
