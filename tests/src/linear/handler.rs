//! One request through the stand-in, in the order Linear's edge would take it: the body must be
//! a GraphQL request; an injected fault may play instead; the `Authorization` header must be
//! exactly the key (no `Bearer`); the budget must not be exhausted; the document and variables
//! must be what the schema allows (else HTTP 400 `GRAPHQL_VALIDATION_FAILED`, recorded as
//! rejected); then it runs. Every answer carries the rate-limit headers and is recorded.

use std::time::Duration;

use apollo_compiler::response::{JsonMap, JsonValue};
use serde::Deserialize;
use serde_json::json;

use super::admin;
use super::clock::system_time;
use super::graphql::{check, error_body, execute, operation_name};
use super::model::{Fault, Recorded};
use super::shared::Shared;
use super::wire::{WireAnswer, WireRequest};

/// The JSON body of a GraphQL request.
#[derive(Deserialize)]
struct Body {
    query: String,
    #[serde(default)]
    variables: Option<JsonValue>,
    #[serde(default, rename = "operationName")]
    operation_name: Option<String>,
}

/// Answers one HTTP request.
pub(crate) fn handle(shared: &Shared, request: &WireRequest) -> WireAnswer {
    if shared.admin && request.path.starts_with("/_admin/") {
        return admin::handle(shared, request);
    }
    if request.path != "/graphql" {
        return WireAnswer::json(404, &json!({ "errors": [{ "message": format!("no route {}", request.path) }] }));
    }
    if request.method != "POST" {
        return WireAnswer::json(405, &json!({ "errors": [{ "message": "POST a GraphQL request to /graphql" }] }));
    }
    let mut exchange = Exchange::new(shared);
    let body = match serde_json::from_slice::<Body>(&request.body) {
        Ok(body) => body,
        Err(e) => return exchange.reject(vec![format!("the body is not a GraphQL request: {e}")], "BAD_REQUEST"),
    };
    exchange.record.operation = operation_name(&body.query, body.operation_name.as_deref());
    exchange.record.variables =
        body.variables.as_ref().map_or(serde_json::Value::Null, |v| serde_json::to_value(v).unwrap_or_default());
    let variables = match &body.variables {
        None | Some(JsonValue::Null) => JsonMap::new(),
        Some(JsonValue::Object(map)) => map.clone(),
        Some(_) => return exchange.reject(vec!["`variables` must be an object".into()], "BAD_REQUEST"),
    };
    exchange.graphql(request, &body, &variables)
}

/// One GraphQL request being answered, and its record.
struct Exchange<'a> {
    shared: &'a Shared,
    record: Recorded,
    complexity: u64,
    fault: Option<Fault>,
}

impl<'a> Exchange<'a> {
    /// A request that has just arrived.
    fn new(shared: &'a Shared) -> Self {
        let record = Recorded {
            at: system_time(shared.clock.now_ms()),
            operation: None,
            variables: serde_json::Value::Null,
            key_matched: false,
            rejected: false,
            diagnostics: Vec::new(),
            errors: Vec::new(),
            status: None,
            fault: None,
        };
        Self { shared, record, complexity: 0, fault: None }
    }

    /// Faults, authentication, budget, validation, execution.
    fn graphql(mut self, request: &WireRequest, body: &Body, variables: &JsonMap) -> WireAnswer {
        self.fault = self.shared.take_fault(self.record.operation.as_deref());
        self.record.fault = self.fault.as_ref().map(|f| format!("{f:?}"));
        let key = self.shared.control().key.clone();
        self.record.key_matched = request.header("authorization") == Some(key.as_str());
        match self.fault {
            Some(Fault::ServerError(status)) => {
                return self.answer(status, &error_body("Internal server error", "INTERNAL_SERVER_ERROR"))
            }
            Some(Fault::RateLimited) => return self.rate_limited(),
            Some(Fault::WrongKey) => return self.unauthenticated(),
            _ if !self.record.key_matched => return self.unauthenticated(),
            _ => {}
        }
        if !self.shared.control().limits.admit(self.shared.clock.now_ms()) {
            return self.rate_limited();
        }
        let checked = match check(&body.query, body.operation_name.as_deref(), variables) {
            Ok(checked) => checked,
            Err(errors) => {
                return self.reject(errors.into_iter().map(|e| e.message).collect(), "GRAPHQL_VALIDATION_FAILED")
            }
        };
        self.complexity = checked.complexity;
        self.shared.control().limits.charge(checked.complexity);
        if let Some(gate) = self.shared.take_gate(self.record.operation.as_deref()) {
            gate.pass();
        }
        let executed = execute(&checked, &mut self.shared.state());
        self.send(200, executed.body, executed.errors)
    }

    /// Linear's answer to a missing or wrong key (HTTP 400).
    fn unauthenticated(self) -> WireAnswer {
        let body = json!({ "errors": [{
            "message": "Authentication required, not authenticated",
            "extensions": {
                "code": "AUTHENTICATION_ERROR",
                "type": "authentication error",
                "userPresentableMessage": "You need to authenticate to access this operation.",
            },
        }] });
        self.answer(400, &body)
    }

    /// Linear's answer to an exhausted budget (HTTP 400).
    fn rate_limited(self) -> WireAnswer {
        let body = json!({ "errors": [{ "message": "Rate limit exceeded", "extensions": { "code": "RATELIMITED" } }] });
        self.answer(400, &body)
    }

    /// Refuses a request the schema does not allow (HTTP 400), recording it as rejected.
    fn reject(mut self, diagnostics: Vec<String>, code: &str) -> WireAnswer {
        let errors: Vec<_> =
            diagnostics.iter().map(|message| json!({ "message": message, "extensions": { "code": code } })).collect();
        self.record.rejected = true;
        self.record.diagnostics = diagnostics;
        self.answer(400, &json!({ "errors": errors }))
    }

    /// Answers with a JSON body.
    fn answer(self, status: u16, body: &serde_json::Value) -> WireAnswer {
        let errors = body.get("errors").and_then(serde_json::Value::as_array).into_iter().flatten();
        let errors =
            errors.filter_map(|e| e.get("message").and_then(serde_json::Value::as_str).map(str::to_string)).collect();
        self.send(status, body.to_string(), errors)
    }

    /// Records the request (with its errors' messages) and builds the answer with the
    /// rate-limit headers; a `Timeout` fault turns it into no answer after the hold.
    fn send(mut self, status: u16, body: String, errors: Vec<String>) -> WireAnswer {
        let hold: Option<Duration> = match self.fault {
            Some(Fault::Timeout(hold)) => Some(hold),
            _ => None,
        };
        self.record.errors = errors;
        self.record.status = if hold.is_some() { None } else { Some(status) };
        let mut control = self.shared.control();
        let mut headers = control.limits.headers(self.complexity);
        if self.fault == Some(Fault::RateLimited) {
            headers.retain(|(name, _)| name != "X-RateLimit-Requests-Remaining");
            headers.push(("X-RateLimit-Requests-Remaining".into(), "0".into()));
        }
        control.log.push(self.record);
        WireAnswer { status, headers, body: body.into_bytes(), hold, delay: None }
    }
}
