//! Every request DevPilot sends to GitHub, built here and nowhere else, so that one test can
//! check each of them against GitHub's published description (`contracts/github`): method,
//! path, query and body. The client only sends what these functions build.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::Method;
use serde_json::{json, Value};

/// What a path segment keeps as it is (RFC 3986's unreserved characters); everything else,
/// `/` and `%` included, is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Issues and pulls per page: GitHub's most.
pub const PER_PAGE: u32 = 100;

/// One request, before it is sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// GitHub's `operationId` (`issues/list-for-repo`), for logs and the contract test.
    pub op: &'static str,
    pub method: Method,
    /// The path's segments, not yet encoded (a label name may hold spaces or emoji).
    pub segments: Vec<String>,
    pub query: Vec<(String, String)>,
    pub body: Option<Value>,
    /// The repository it is about, for errors that name it.
    pub repo: Option<String>,
}

impl Call {
    fn new(op: &'static str, method: Method, segments: &[&str]) -> Self {
        let segments = segments.iter().map(|s| s.to_string()).collect();
        Self { op, method, segments, query: vec![], body: None, repo: None }
    }

    fn on(op: &'static str, method: Method, repo: &str, rest: &[&str]) -> Self {
        let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
        let mut segments = vec!["repos", owner, name];
        segments.extend_from_slice(rest);
        Self { repo: Some(repo.to_string()), ..Self::new(op, method, &segments) }
    }

    fn with(mut self, name: &str, value: impl ToString) -> Self {
        self.query.push((name.to_string(), value.to_string()));
        self
    }

    /// The path as sent: each segment percent-encoded.
    pub fn path(&self) -> String {
        let encoded: Vec<String> = self.segments.iter().map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect();
        format!("/{}", encoded.join("/"))
    }
}

/// What a turn asks of the issue list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IssueQuery {
    /// Only open issues with the label (a first turn); else every issue changed since.
    pub open_with_label: Option<String>,
    /// Only issues assigned to this login (a first turn with "assigned to me").
    pub assignee: Option<String>,
    /// RFC 3339, seconds: changed at or after.
    pub since: Option<String>,
    pub page: u32,
}

/// `GET /repos/{owner}/{repo}/issues`, oldest change first.
pub fn list_issues(repo: &str, q: &IssueQuery) -> Call {
    let state = if q.open_with_label.is_some() { "open" } else { "all" };
    let mut c = Call::on("issues/list-for-repo", Method::GET, repo, &["issues"]).with("state", state);
    if let Some(label) = q.open_with_label.as_deref().filter(|l| !l.is_empty()) {
        c = c.with("labels", label);
    }
    if let Some(who) = &q.assignee {
        c = c.with("assignee", who);
    }
    if let Some(since) = &q.since {
        c = c.with("since", since);
    }
    c = c.with("sort", "updated").with("direction", "asc").with("per_page", PER_PAGE);
    if q.page > 1 {
        c = c.with("page", q.page);
    }
    c
}

/// `GET /repos/{owner}/{repo}`: it exists, and what the token may do there.
pub fn get_repo(repo: &str) -> Call {
    Call::on("repos/get", Method::GET, repo, &[])
}

/// `GET /user`: whose token it is.
pub fn get_user() -> Call {
    Call::new("users/get-authenticated", Method::GET, &["user"])
}

/// `GET /repos/{owner}/{repo}/labels/{name}`: the label exists.
pub fn get_label(repo: &str, name: &str) -> Call {
    Call::on("issues/get-label", Method::GET, repo, &["labels", name])
}

/// `GET /repos/{owner}/{repo}/issues/{n}/comments`, a page of them.
pub fn list_comments(repo: &str, number: u64, page: u32, since: Option<&str>) -> Call {
    let mut c = Call::on("issues/list-comments", Method::GET, repo, &["issues", &number.to_string(), "comments"])
        .with("per_page", PER_PAGE);
    if let Some(since) = since {
        c = c.with("since", since);
    }
    if page > 1 {
        c.with("page", page)
    } else {
        c
    }
}

/// `POST /repos/{owner}/{repo}/issues/{n}/comments`.
pub fn create_comment(repo: &str, number: u64, body: &str) -> Call {
    let c = Call::on("issues/create-comment", Method::POST, repo, &["issues", &number.to_string(), "comments"]);
    Call { body: Some(json!({ "body": body })), ..c }
}

/// `POST /repos/{owner}/{repo}/issues/{n}/labels`.
pub fn add_label(repo: &str, number: u64, label: &str) -> Call {
    let c = Call::on("issues/add-labels", Method::POST, repo, &["issues", &number.to_string(), "labels"]);
    Call { body: Some(json!({ "labels": [label] })), ..c }
}

/// `DELETE /repos/{owner}/{repo}/issues/{n}/labels/{name}`.
pub fn remove_label(repo: &str, number: u64, label: &str) -> Call {
    Call::on("issues/remove-label", Method::DELETE, repo, &["issues", &number.to_string(), "labels", label])
}

/// `GET /repos/{owner}/{repo}/issues/{n}`: the issue as it is now.
pub fn get_issue(repo: &str, number: u64) -> Call {
    Call::on("issues/get", Method::GET, repo, &["issues", &number.to_string()])
}

/// `GET /repos/{owner}/{repo}/issues/{n}/events`, a page of them (oldest first): who applied
/// which label, and when.
pub fn list_issue_events(repo: &str, number: u64, page: u32) -> Call {
    let c = Call::on("issues/list-events", Method::GET, repo, &["issues", &number.to_string(), "events"])
        .with("per_page", PER_PAGE);
    if page > 1 {
        c.with("page", page)
    } else {
        c
    }
}

/// `GET /repos/{owner}/{repo}/collaborators/{username}/permission`: what `login` may do there.
pub fn get_permission(repo: &str, login: &str) -> Call {
    Call::on("repos/get-collaborator-permission-level", Method::GET, repo, &["collaborators", login, "permission"])
}

/// `GET /repos/{owner}/{repo}/pulls`: the open pull requests from `owner:branch`.
pub fn find_pulls(repo: &str, head: &str) -> Call {
    Call::on("pulls/list", Method::GET, repo, &["pulls"])
        .with("state", "open")
        .with("head", head)
        .with("per_page", PER_PAGE)
}

/// A pull request to open.
#[derive(Clone, Debug, PartialEq)]
pub struct NewPull {
    pub title: String,
    /// The branch, in the same repository.
    pub head: String,
    pub base: String,
    pub body: String,
    pub draft: bool,
}

/// `POST /repos/{owner}/{repo}/pulls`.
pub fn create_pull(repo: &str, p: &NewPull) -> Call {
    let c = Call::on("pulls/create", Method::POST, repo, &["pulls"]);
    let body = json!({ "title": p.title, "head": p.head, "base": p.base, "body": p.body, "draft": p.draft });
    Call { body: Some(body), ..c }
}

/// One of every request the code builds, with awkward inputs (a label with a space and an
/// emoji, a second page, a since), for the contract test.
pub fn examples() -> Vec<Call> {
    let repo = "acme/web-app.js";
    let label = "agent 🤖 ready";
    let first = IssueQuery { open_with_label: Some(label.into()), assignee: Some("ada".into()), ..Default::default() };
    let later = IssueQuery { since: Some("2026-12-02T10:00:00Z".into()), page: 3, ..Default::default() };
    let pull = NewPull {
        title: "Fix the login".into(),
        head: "devpilot/12-gh-7-fix-the-login".into(),
        base: "main".into(),
        body: "Closes #7".into(),
        draft: true,
    };
    vec![
        list_issues(repo, &first),
        list_issues(repo, &later),
        get_repo(repo),
        get_user(),
        get_label(repo, label),
        list_comments(repo, 7, 1, None),
        list_comments(repo, 7, 2, Some("2026-12-02T10:00:00Z")),
        get_issue(repo, 7),
        list_issue_events(repo, 7, 1),
        list_issue_events(repo, 7, 2),
        get_permission(repo, "grace-hopper"),
        create_comment(repo, 7, "Started on desktop.\n\n<!-- devpilot:job/12/claimed/1 -->"),
        add_label(repo, 7, label),
        remove_label(repo, 7, label),
        find_pulls(repo, "acme:devpilot/12-gh-7-fix-the-login"),
        create_pull(repo, &pull),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A label with a space and an emoji is one percent-encoded path segment, never two.
    #[test]
    fn path_segments_are_encoded() {
        let c = remove_label("acme/webapp", 7, "agent 🤖/x");
        assert_eq!(c.path(), "/repos/acme/webapp/issues/7/labels/agent%20%F0%9F%A4%96%2Fx");
    }
}
