//! One request through the GitHub stand-in, in this order: the contract (method, path, query,
//! body: else 400 and recorded as rejected); the headers GitHub requires (`User-Agent`, else
//! 403; `X-GitHub-Api-Version: 2022-11-28`, else 400; both also recorded as rejected, being the
//! client's mistakes); the token (`Authorization: Bearer …`, else 401); an injected fault; the
//! primary rate limit (403 when exhausted); the token's access (404 for a repository it cannot
//! see, 403 for a write it may not make); then the operation. A 200 to a GET carries a weak
//! `ETag`, and a matching `If-None-Match` gets a 304 that does not count against the rate
//! limit. Every answer carries the `x-ratelimit-*` headers, is recorded, and is logged to stderr
//! (one line, no token).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use serde_json::{json, Value};

use super::admin;
use super::contract::{self, Call};
use super::model::{Access, FaultKind, Recorded};
use super::routes::{route, Ctx, Reply};
use super::shared::Shared;
use crate::http_server::{decode_bytes, WireAnswer, WireRequest};

/// The only API version the stand-in serves.
pub const API_VERSION: &str = "2022-11-28";

/// Answers one HTTP request.
pub(crate) fn handle(shared: &Shared, request: &WireRequest) -> WireAnswer {
    if shared.admin && request.path.starts_with("/_admin/") {
        return admin::handle(shared, request);
    }
    let query = request.params();
    let mut exchange = Exchange::new(shared, request, query.clone());
    let body: Option<Value> = if request.body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&request.body) {
            Ok(body) => Some(body),
            Err(e) => return exchange.reject(400, &format!("Problems parsing JSON: {e}")),
        }
    };
    let call = Call { method: &request.method, path: &request.path, query: &query, body: body.as_ref() };
    let op = match contract::check(&call) {
        Ok(op) => op,
        Err(why) => return exchange.reject(400, &why),
    };
    exchange.record.op = op.into();
    exchange.run(request, op, body.as_ref())
}

/// One request being answered, and its record.
struct Exchange<'a> {
    shared: &'a Shared,
    record: Recorded,
    /// Hold the answer this long and close without one (the `Timeout` fault).
    hold: Option<Duration>,
}

impl<'a> Exchange<'a> {
    /// A request that has just arrived.
    fn new(shared: &'a Shared, request: &WireRequest, query: Vec<(String, String)>) -> Self {
        let record = Recorded {
            method: request.method.clone(),
            path: request.path.clone(),
            op: String::new(),
            query,
            status: 0,
            conditional: request.header("if-none-match").is_some(),
            counted: false,
            auth_ok: false,
            rejected: false,
            message: None,
            fault: None,
        };
        Self { shared, record, hold: None }
    }

    /// Headers, token, fault, rate limit, access, the operation, the ETag.
    fn run(mut self, request: &WireRequest, op: &'static str, body: Option<&Value>) -> WireAnswer {
        if request.header("user-agent").is_none_or(str::is_empty) {
            let why = "Request forbidden by administrative rules. Please make sure your request has a User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required).";
            return self.reject(403, why);
        }
        match request.header("x-github-api-version") {
            Some(API_VERSION) => {}
            Some(other) => return self.reject(400, &format!("API version {other:?} is not supported.")),
            None => return self.reject(
                400,
                "X-GitHub-Api-Version is missing: the stand-in requires 2022-11-28 (GitHub would silently default it)",
            ),
        }
        let token = request.header("authorization").and_then(|a| a.strip_prefix("Bearer ")).unwrap_or_default();
        let Some((access, login)) = self.shared.holder(token) else {
            return self.answer(Reply::error(401, "Bad credentials"));
        };
        self.record.auth_ok = true;
        self.record.counted = true;
        let fault = self.shared.take_fault(op);
        self.record.fault = fault.as_ref().map(|f| format!("{f:?}"));
        match fault {
            Some(FaultKind::Unauthorized) => {
                self.record.counted = false;
                return self.answer(Reply::error(401, "Bad credentials"));
            }
            Some(FaultKind::Server(status)) => return self.answer(Reply::error(status, "Server Error")),
            Some(FaultKind::SecondaryLimit { retry_after_s }) => {
                let why = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.";
                let mut reply = Reply::error(403, why);
                reply.headers.push(("retry-after".into(), retry_after_s.to_string()));
                return self.answer(reply);
            }
            Some(FaultKind::Timeout { hold }) => self.hold = Some(hold),
            None => {}
        }
        if !self.shared.rate_left() {
            self.record.counted = false;
            return self.answer(Reply::error(403, "API rate limit exceeded for user ID 1."));
        }
        if let Some(refused) = refuse_by_access(access, &request.method, &request.path, op) {
            return self.answer(refused);
        }
        if let Some(gate) = self.shared.take_gate(op) {
            if !gate.pass() {
                return self.answer(Reply::error(502, "Server Error"));
            }
        }
        let reply = {
            let ctx = self.context(request, op, body, (access, login));
            route(&mut self.shared.state(), &ctx)
        };
        self.conditional(request, reply)
    }

    /// The operation's inputs.
    fn context<'b>(
        &'b self,
        request: &WireRequest,
        op: &'static str,
        body: Option<&'b Value>,
        (access, login): (Access, String),
    ) -> Ctx<'b> {
        let segments = request.path.trim_start_matches('/').split('/');
        let segments = segments.map(|s| String::from_utf8_lossy(&decode_bytes(s, false)).into_owned()).collect();
        let host = self.shared.addr.get().map_or_else(|| "127.0.0.1".to_string(), ToString::to_string);
        Ctx {
            op,
            segments,
            query: &self.record.query,
            body,
            link_base: format!("http://{host}{}", request.path),
            access,
            login,
        }
    }

    /// A 200 to a GET gets a weak ETag; one the client already has becomes a 304 that does
    /// not count.
    fn conditional(mut self, request: &WireRequest, mut reply: Reply) -> WireAnswer {
        if request.method == "GET" && reply.status == 200 {
            let etag = etag(&reply.body);
            let sent = request.header("if-none-match").unwrap_or_default();
            if sent.split(',').any(|tag| tag.trim() == etag || tag.trim() == "*") {
                self.record.counted = false;
                reply = Reply { status: 304, body: Value::Null, headers: Vec::new() };
            }
            reply.headers.push(("etag".into(), etag));
        }
        self.answer(reply)
    }

    /// Refuses what GitHub's description (or its required headers) does not allow; recorded
    /// as rejected.
    fn reject(mut self, status: u16, why: &str) -> WireAnswer {
        self.record.rejected = true;
        self.answer(Reply::new(status, json!({ "message": why, "documentation_url": "https://docs.github.com/rest" })))
    }

    /// Records the request and builds the answer with the rate-limit headers.
    fn answer(mut self, reply: Reply) -> WireAnswer {
        self.record.status = if self.hold.is_some() { 0 } else { reply.status };
        if reply.status >= 300 {
            self.record.message = reply.body.get("message").and_then(Value::as_str).map(str::to_string);
        }
        let exhausted =
            reply.status == 403 && reply.body["message"].as_str().is_some_and(|m| m.starts_with("API rate"));
        eprintln!(
            "github-standin: {} {} [{}] -> {}{}{}",
            self.record.method,
            self.record.path,
            if self.record.op.is_empty() { "-" } else { &self.record.op },
            if self.hold.is_some() { "held, no answer".to_string() } else { reply.status.to_string() },
            if self.record.rejected { " REJECTED: " } else { "" },
            if self.record.rejected { self.record.message.as_deref().unwrap_or_default() } else { "" },
        );
        let mut headers = self.shared.record(self.record);
        if exhausted {
            headers.retain(|(name, _)| name != "x-ratelimit-remaining");
            headers.push(("x-ratelimit-remaining".into(), "0".into()));
        }
        headers.extend(reply.headers);
        headers.push(("x-github-api-version-selected".into(), API_VERSION.into()));
        let body = if reply.status == 304 { Vec::new() } else { reply.body.to_string().into_bytes() };
        WireAnswer { status: reply.status, headers, body, hold: self.hold, delay: None }
    }
}

/// What a token that is not `Full` may not do: see a repository (`NoRepo`: 404, as for a private
/// repository) or write (`ReadOnly`: 403 naming the permission it lacks).
fn refuse_by_access(access: Access, method: &str, path: &str, op: &str) -> Option<Reply> {
    match access {
        Access::Full => None,
        Access::NoRepo if path.starts_with("/repos/") => Some(Reply::error(404, "Not Found")),
        Access::ReadOnly if method != "GET" => {
            let mut reply = Reply::error(403, "Resource not accessible by personal access token");
            let permission = if op.starts_with("pulls/") { "pull_requests=write" } else { "issues=write" };
            reply.headers.push(("x-accepted-github-permissions".into(), permission.into()));
            Some(reply)
        }
        _ => None,
    }
}

/// `W/"<hex>"`: a weak ETag of the answer's body.
fn etag(body: &Value) -> String {
    let text = body.to_string();
    let mut first = DefaultHasher::new();
    text.hash(&mut first);
    let mut second = DefaultHasher::new();
    (text.len(), first.finish(), &text).hash(&mut second);
    format!("W/\"{:016x}{:016x}\"", first.finish(), second.finish())
}
