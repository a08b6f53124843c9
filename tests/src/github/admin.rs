//! The `/_admin/` endpoints the `github-standin` binary serves beside the API, so the Python
//! desktop end-to-end test can do over HTTP what Rust tests do through [`GitHubStandIn`]: add
//! repositories, open and close issues, read comments and pull requests, review a pull request
//! and fail a check on it, read the request log, arm faults and set the rate limit. JSON in and out; no token (loopback, test only).
//!
//! [`GitHubStandIn`]: super::GitHubStandIn

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::contract;
use super::model::{Fault, FaultKind, IssueSeed};
use super::shared::Shared;
use crate::http_server::{WireAnswer, WireRequest};

/// `POST /_admin/repos`: `{"repo": "acme/webapp", "git": "/path/to/bare.git"}`.
#[derive(Deserialize)]
struct RepoSpec {
    repo: String,
    #[serde(default)]
    git: Option<String>,
}

/// `POST /_admin/issues`: `{"repo", "title", "body", "labels", "assignee"}`.
#[derive(Deserialize)]
struct IssueSpec {
    repo: String,
    #[serde(flatten)]
    seed: IssueSeed,
}

/// `POST /_admin/close` and `/_admin/reopen`: `{"repo", "number", "user"}` (`user`: who does
/// it; default the main token's user).
#[derive(Deserialize)]
struct Target {
    repo: String,
    number: u64,
    #[serde(default)]
    user: Option<String>,
}

/// `POST /_admin/roles`: `{"repo", "user", "role"}`.
#[derive(Deserialize)]
struct RoleSpec {
    repo: String,
    user: String,
    role: String,
}

/// `POST /_admin/label` and `/_admin/unlabel`: `{"repo", "number", "label", "user"}`.
#[derive(Deserialize)]
struct LabelSpec {
    repo: String,
    number: u64,
    label: String,
    user: String,
}

/// `POST /_admin/edit`: `{"repo", "number", "user", "title", "body"}` (each of title and body
/// optional).
#[derive(Deserialize)]
struct EditSpec {
    repo: String,
    number: u64,
    user: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    body: Option<String>,
}

/// `POST /_admin/faults`: `{"op": "pulls/create", "fault": "timeout"|"server"|"secondary_limit"|
/// "unauthorized", "seconds": 5, "status": 502, "times": 1}`.
#[derive(Deserialize)]
struct FaultSpec {
    op: String,
    fault: String,
    #[serde(default)]
    seconds: f64,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default = "one")]
    times: usize,
}

/// The default of `times`.
fn one() -> usize {
    1
}

/// `POST /_admin/rate`: `{"remaining": 0, "reset": 1796000000}` (epoch seconds).
#[derive(Deserialize)]
struct RateSpec {
    remaining: u64,
    reset: i64,
}

/// `POST /_admin/review`: `{"repo", "number", "user", "state", "body", "comments": [{"path",
/// "line", "body"}]}`, a review of a pull request as `user`.
#[derive(Deserialize)]
struct ReviewSpec {
    repo: String,
    number: u64,
    user: String,
    state: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    comments: Vec<InlineSpec>,
}

#[derive(Deserialize)]
struct InlineSpec {
    path: String,
    line: u64,
    body: String,
}

/// `POST /_admin/check_run`: `{"repo", "number", "name", "conclusion", "title", "summary",
/// "text"}`, a completed check run on the pull request's head.
#[derive(Deserialize)]
struct CheckSpec {
    repo: String,
    number: u64,
    name: String,
    conclusion: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    summary: String,
    #[serde(default)]
    text: String,
}

/// The review endpoints (`review`, `check_run`, `review_comments`), if `path` is one.
fn reviews(shared: &Shared, request: &WireRequest, path: &str) -> Option<Result<Value, String>> {
    Some(match (request.method.as_str(), path) {
        ("POST", "review") => parse::<ReviewSpec>(&request.body).and_then(|r| {
            let comments: Vec<(&str, u64, &str)> =
                r.comments.iter().map(|c| (c.path.as_str(), c.line, c.body.as_str())).collect();
            let (id, ids) = shared.state().review(&r.repo, r.number, &r.user, (&r.state, &r.body), &comments)?;
            Ok(json!({ "id": id, "comments": ids }))
        }),
        ("POST", "check_run") => parse::<CheckSpec>(&request.body).and_then(|c| {
            let output = (c.title.as_str(), c.summary.as_str(), c.text.as_str());
            let id = shared.state().check_run(&c.repo, c.number, (&c.name, &c.conclusion), output)?;
            Ok(json!({ "id": id }))
        }),
        ("GET", "review_comments") => {
            let repo = request.param("repo").unwrap_or_default();
            let number = request.param("number").and_then(|n| n.parse().ok()).unwrap_or_default();
            let state = shared.state();
            state.repo(&repo).and_then(|r| {
                let (item, _) = r.pull_of(number).ok_or_else(|| format!("no pull request #{number}"))?;
                Ok(json!(r.review_comments(item)))
            })
        }
        _ => return None,
    })
}

/// Answers one admin request.
pub(crate) fn handle(shared: &Shared, request: &WireRequest) -> WireAnswer {
    let path = request.path.trim_start_matches("/_admin/");
    if let Some(result) = reviews(shared, request, path) {
        return match result {
            Ok(value) => WireAnswer::json(200, &value),
            Err(error) => WireAnswer::json(400, &json!({ "error": error })),
        };
    }
    let target = || -> Result<(String, u64), String> {
        let repo = request.param("repo").ok_or("missing ?repo=owner/name")?;
        let number = request.param("number").and_then(|n| n.parse().ok()).ok_or("missing ?number=N")?;
        Ok((repo, number))
    };
    let result = match (request.method.as_str(), path) {
        ("POST", "repos") => parse::<RepoSpec>(&request.body).and_then(|spec| {
            shared.state().add_repo(&spec.repo, spec.git.map(Into::into)).map(|()| json!({ "repo": spec.repo }))
        }),
        ("POST", "issues") => parse::<IssueSpec>(&request.body).and_then(|spec| {
            let mut state = shared.state();
            let number = state.open_item(&spec.repo, &spec.seed, None)?;
            let repo = state.repo(&spec.repo)?;
            Ok(json!(repo.issue(repo.item(number).ok_or("vanished")?)))
        }),
        ("POST", "close" | "reopen") => parse::<Target>(&request.body).and_then(|t| {
            let mut state = shared.state();
            let user = t.user.unwrap_or_else(|| super::state::VIEWER.to_string());
            state.set_open_as(&t.repo, t.number, &user, path == "reopen")?;
            Ok(json!(state.repo(&t.repo)?.issue(state.repo(&t.repo)?.item(t.number).ok_or("vanished")?)))
        }),
        ("POST", "roles") => parse::<RoleSpec>(&request.body)
            .and_then(|r| shared.state().set_role(&r.repo, &r.user, &r.role).map(|()| json!({ "role": r.role }))),
        ("POST", "label" | "unlabel") => parse::<LabelSpec>(&request.body).and_then(|l| {
            let on = path == "label";
            shared.state().label_as(&l.repo, l.number, &l.label, &l.user, on).map(|()| json!({ "label": l.label }))
        }),
        ("POST", "edit") => parse::<EditSpec>(&request.body).and_then(|e| {
            shared.state().edit_as(&e.repo, e.number, &e.user, e.title, e.body).map(|()| json!({ "edited": e.number }))
        }),
        ("GET", "comments") => target().and_then(|(repo, number)| {
            let state = shared.state();
            let repo = state.repo(&repo)?;
            let item = repo.item(number).ok_or_else(|| format!("no issue #{number}"))?;
            Ok(json!(item.comments.iter().map(|c| repo.comment(item, c)).collect::<Vec<_>>()))
        }),
        ("GET", "pulls") => request.param("repo").ok_or_else(|| "missing ?repo=owner/name".to_string()).and_then(|r| {
            let state = shared.state();
            let repo = state.repo(&r)?;
            Ok(json!(repo.items.iter().filter_map(|i| repo.pull(i)).collect::<Vec<_>>()))
        }),
        ("GET", "recorded") => Ok(json!(shared.control().log)),
        ("GET", "rejected") => Ok(json!(shared.control().log.iter().filter(|r| r.rejected).collect::<Vec<_>>())),
        ("POST", "faults") => parse(&request.body).and_then(|spec| inject(shared, spec)),
        ("POST", "rate") => parse::<RateSpec>(&request.body).map(|spec| {
            let mut control = shared.control();
            control.rate.remaining = spec.remaining;
            control.rate.reset = spec.reset;
            json!({ "remaining": spec.remaining })
        }),
        _ => {
            return WireAnswer::json(
                404,
                &json!({ "error": format!("no admin endpoint {} /_admin/{path}", request.method) }),
            )
        }
    };
    match result {
        Ok(value) => WireAnswer::json(200, &value),
        Err(error) => WireAnswer::json(400, &json!({ "error": error })),
    }
}

/// A JSON body.
fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("bad JSON body: {e}"))
}

/// Arms a fault from a [`FaultSpec`].
fn inject(shared: &Shared, spec: FaultSpec) -> Result<Value, String> {
    let op = contract::operation_ids()
        .into_iter()
        .find(|id| *id == spec.op)
        .ok_or_else(|| format!("unknown operation {:?} (one of {:?})", spec.op, contract::operation_ids()))?;
    let kind = match spec.fault.as_str() {
        "timeout" => FaultKind::Timeout { hold: Duration::from_secs_f64(spec.seconds.max(0.0)) },
        "server" => FaultKind::Server(spec.status.unwrap_or(502)),
        "secondary_limit" => FaultKind::SecondaryLimit { retry_after_s: spec.seconds.max(0.0) as u64 },
        "unauthorized" => FaultKind::Unauthorized,
        other => return Err(format!("unknown fault {other:?} (timeout, server, secondary_limit, unauthorized)")),
    };
    shared.control().faults.push(Fault { op, kind, times: spec.times });
    Ok(json!({ "armed": spec.times }))
}
