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

    /// `page`, from the second on (the first is GitHub's default).
    fn page(self, page: u32) -> Self {
        if page > 1 {
            self.with("page", page)
        } else {
            self
        }
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
    c.page(page)
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
    Call::on("issues/list-events", Method::GET, repo, &["issues", &number.to_string(), "events"])
        .with("per_page", PER_PAGE)
        .page(page)
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

/// `GET /repos/{owner}/{repo}/pulls/{n}`: the pull request as it is now (open, closed or
/// merged, and its head's sha).
pub fn get_pull(repo: &str, number: u64) -> Call {
    Call::on("pulls/get", Method::GET, repo, &["pulls", &number.to_string()])
}

/// `GET /repos/{owner}/{repo}/pulls/{n}/reviews`, a page of them (oldest first).
pub fn list_reviews(repo: &str, number: u64, page: u32) -> Call {
    Call::on("pulls/list-reviews", Method::GET, repo, &["pulls", &number.to_string(), "reviews"])
        .with("per_page", PER_PAGE)
        .page(page)
}

/// `GET /repos/{owner}/{repo}/pulls/{n}/comments`: the inline (review) comments, a page of
/// them (by id, oldest first).
pub fn list_review_comments(repo: &str, number: u64, page: u32) -> Call {
    Call::on("pulls/list-review-comments", Method::GET, repo, &["pulls", &number.to_string(), "comments"])
        .with("per_page", PER_PAGE)
        .page(page)
}

/// `POST /repos/{owner}/{repo}/pulls/{n}/comments/{id}/replies`: an answer in the thread of
/// inline comment `comment_id`, which must be the thread's first comment (GitHub does not
/// take a reply to a reply).
pub fn reply_to_review_comment(repo: &str, number: u64, comment_id: u64, body: &str) -> Call {
    let (number, id) = (number.to_string(), comment_id.to_string());
    let c = Call::on(
        "pulls/create-reply-for-review-comment",
        Method::POST,
        repo,
        &["pulls", &number, "comments", &id, "replies"],
    );
    Call { body: Some(json!({ "body": body })), ..c }
}

/// `GET /repos/{owner}/{repo}/commits/{sha}/check-runs`, a page of them: the latest run of
/// each check on that commit.
pub fn list_check_runs(repo: &str, sha: &str, page: u32) -> Call {
    Call::on("checks/list-for-ref", Method::GET, repo, &["commits", sha, "check-runs"])
        .with("filter", "latest")
        .with("per_page", PER_PAGE)
        .page(page)
}

/// `GET /repos/{owner}/{repo}/commits/{sha}/status`: the commit's statuses (the latest of each
/// context, a page of them) and their combined state.
pub fn combined_status(repo: &str, sha: &str, page: u32) -> Call {
    Call::on("repos/get-combined-status-for-ref", Method::GET, repo, &["commits", sha, "status"])
        .with("per_page", PER_PAGE)
        .page(page)
}

/// One of every request the code builds, with awkward inputs (a label with a space and an
/// emoji, a second page, a since, a comment id past 32 bits), for the contract test.
pub fn examples() -> Vec<Call> {
    let repo = "acme/web-app.js";
    let label = "agent 🤖 ready";
    let sha = "6dcb09b5b57875f334f61aebed695e2e4193db5e";
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
        get_pull(repo, 8),
        list_reviews(repo, 8, 2),
        list_review_comments(repo, 8, 2),
        reply_to_review_comment(repo, 8, 4_294_967_297, "Fixed.\n\n<!-- devpilot:job/12/review/1 -->"),
        list_check_runs(repo, sha, 1),
        combined_status(repo, sha, 2),
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
