//! The `/_admin/` endpoints the `linear-standin` binary serves beside `/graphql`, so the Python
//! desktop end-to-end test can do over HTTP what Rust tests do through [`LinearStandIn`]: file
//! and edit issues (as a given user), add users, comment (as a given user), read comments and
//! attachments, count calls, list rejected requests, arm faults and set the budget. JSON in
//! and out; no key (loopback, test only).
//!
//! [`LinearStandIn`]: super::LinearStandIn

use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use super::model::{Fault, IssueSeed};
use super::shared::Shared;
use super::state::VIEWER;
use super::wire::{WireAnswer, WireRequest};

/// `POST /_admin/issues/<identifier>`: the fields to change (absent: unchanged), and who
/// changes labels, title and description (`by`: a user's name; absent: the viewer).
#[derive(Deserialize, Default)]
#[serde(default)]
struct IssueEdit {
    by: Option<String>,
    title: Option<String>,
    /// Absent: unchanged; `null`: cleared.
    #[serde(deserialize_with = "present")]
    description: Option<Option<String>>,
    labels: Option<Vec<String>>,
    state: Option<String>,
    #[serde(alias = "assigneeMe")]
    assignee_me: Option<bool>,
}

/// A field that is present, even as `null`.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(deserializer).map(Some)
}

/// `POST /_admin/users`: `{"name": "Mallory", "guest": true}`.
#[derive(Deserialize)]
struct UserSpec {
    name: String,
    #[serde(default)]
    guest: bool,
}

/// `POST /_admin/comments?issue=ENG-1`: `{"by": "Grace", "body": "/devpilot rename it"}`
/// (`by` absent: the viewer).
#[derive(Deserialize)]
struct CommentSpec {
    #[serde(default)]
    by: Option<String>,
    body: String,
}

/// `POST /_admin/faults`: `{"fault": "timeout"|"server_error"|"rate_limited"|"wrong_key",
/// "seconds": 5, "status": 503, "times": 1, "operation": "DevpilotPostComment"}`.
#[derive(Deserialize)]
struct FaultSpec {
    fault: String,
    #[serde(default)]
    seconds: f64,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default = "one")]
    times: usize,
    #[serde(default)]
    operation: Option<String>,
}

/// The default of `times`.
fn one() -> usize {
    1
}

/// `POST /_admin/rate_limit`: `{"remaining": 0, "reset_in_seconds": 60}`, and optionally
/// `"complexity_remaining"`.
#[derive(Deserialize)]
struct LimitSpec {
    remaining: u64,
    #[serde(default)]
    reset_in_seconds: f64,
    #[serde(default)]
    complexity_remaining: Option<u64>,
}

/// Answers one admin request.
pub(crate) fn handle(shared: &Shared, request: &WireRequest) -> WireAnswer {
    let path = request.path.trim_start_matches("/_admin/");
    let issue_param = || request.param("issue").ok_or_else(|| "missing ?issue=ENG-1".to_string());
    let result = match (request.method.as_str(), path) {
        ("POST", "issues") => {
            parse::<IssueSeed>(&request.body).and_then(|seed| shared.add_issue(&seed)).map(|i| json!(i))
        }
        ("GET", p) if p.starts_with("issues/") => shared.issue(&p["issues/".len()..]).map(|i| json!(i)),
        ("POST", p) if p.starts_with("issues/") => {
            parse(&request.body).and_then(|edit| edit_issue(shared, &p["issues/".len()..], edit))
        }
        ("POST", "users") => parse::<UserSpec>(&request.body).and_then(|u| {
            shared.state().add_user(&u.name, u.guest).map(|_| json!({ "name": u.name, "guest": u.guest }))
        }),
        ("GET", "comments") => issue_param().and_then(|i| shared.comments(&i)).map(|c| json!(c)),
        ("POST", "comments") => issue_param().and_then(|i| {
            let spec = parse::<CommentSpec>(&request.body)?;
            let by = spec.by.unwrap_or_else(|| shared.state().users[VIEWER].name.clone());
            shared.comment_as(&i, &by, &spec.body).map(|id| json!({ "id": id }))
        }),
        ("GET", "attachments") => issue_param().and_then(|i| shared.attachments(&i)).map(|a| json!(a)),
        ("GET", "calls") => Ok(json!(shared.call_counts())),
        ("GET", "requests") => Ok(json!(shared.requests())),
        ("GET", "rejected") => Ok(json!(shared.requests().into_iter().filter(|r| r.rejected).collect::<Vec<_>>())),
        ("POST", "faults") => parse(&request.body).and_then(|spec| inject(shared, spec)),
        ("POST", "rate_limit") => parse(&request.body).map(|spec| set_limits(shared, &spec)),
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

/// Applies an [`IssueEdit`], each change as a person would make it in Linear.
fn edit_issue(shared: &Shared, issue: &str, edit: IssueEdit) -> Result<Value, String> {
    if let Some(state) = &edit.state {
        shared.set_state(issue, state)?;
    }
    let updated = shared.edit(issue, |s, i| {
        let by = edit.by.as_deref().map(|name| s.user_named(name)).transpose()?.unwrap_or(VIEWER);
        if let Some(title) = &edit.title {
            s.set_title_by(i, title, by);
        }
        if let Some(description) = &edit.description {
            s.set_description_by(i, description.as_deref(), by);
        }
        if let Some(labels) = &edit.labels {
            s.set_labels_by(i, &labels.iter().map(String::as_str).collect::<Vec<_>>(), by);
        }
        if let Some(me) = edit.assignee_me {
            s.set_assignee_me(i, me);
        }
        Ok(())
    })?;
    Ok(json!(updated))
}

/// Arms a fault from a [`FaultSpec`].
fn inject(shared: &Shared, spec: FaultSpec) -> Result<Value, String> {
    let fault = match spec.fault.as_str() {
        "timeout" => Fault::Timeout(Duration::from_secs_f64(spec.seconds.max(0.0))),
        "server_error" => Fault::ServerError(spec.status.unwrap_or(503)),
        "rate_limited" => Fault::RateLimited,
        "wrong_key" => Fault::WrongKey,
        other => return Err(format!("unknown fault {other:?} (timeout, server_error, rate_limited, wrong_key)")),
    };
    shared.inject(fault, spec.times, spec.operation.as_deref())?;
    Ok(json!({ "armed": spec.times }))
}

/// Sets the budgets from a [`LimitSpec`].
fn set_limits(shared: &Shared, spec: &LimitSpec) -> Value {
    let reset_in = Duration::from_secs_f64(spec.reset_in_seconds.max(0.0));
    shared.set_rate_limit(spec.remaining, reset_in);
    if let Some(points) = spec.complexity_remaining {
        shared.set_complexity_limit(points, reset_in);
    }
    json!({ "remaining": spec.remaining })
}
