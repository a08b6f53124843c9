//! The OpenAI Responses API as codex speaks it: `POST /v1/responses`, streamed as server-sent
//! events (`response.created`, `response.output_item.added`/`done`,
//! `response.output_text.delta`, `response.completed` with usage), and `GET /v1/models`.
//!
//! A [`Turn::Tool`] becomes a `function_call` item (`arguments` the input as a JSON string),
//! or a `custom_tool_call` item (`input` a plain string) when the request declares that tool
//! with `"type": "custom"` (codex 0.171: `exec`, JavaScript calling nested tools). Every `POST /responses` is a main
//! request; a model list is answered on the side.

use serde_json::{json, Value};

use super::script::{fresh_id, named_events, Provider, State, Turn};
use crate::http_server::{WireAnswer, WireRequest};

/// Answers one OpenAI request.
pub(super) fn answer(req: &WireRequest, state: &mut State) -> WireAnswer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let path = req.path.as_str();
    if path.ends_with("/models") {
        state.record(Provider::OpenAiResponses, req, &body, false);
        return models();
    }
    if req.method != "POST" || !path.ends_with("/responses") {
        state.record(Provider::OpenAiResponses, req, &body, false);
        return error_answer(404, &[], &Value::Null);
    }
    state.record(Provider::OpenAiResponses, req, &body, true);
    let model = body.get("model").and_then(Value::as_str).unwrap_or("gpt-5").to_string();
    let input_tokens = (req.body.len() as u64 / 4).max(1);
    match state.next_turn() {
        Turn::Error { status, headers, body } => error_answer(status, &headers, &body),
        Turn::Text(text) => sse_answer(&model, input_tokens, message_item(&text)),
        Turn::Hold(_) | Turn::Wait(_) | Turn::Gated(_) => sse_answer(&model, input_tokens, message_item("")),
        Turn::Tool { name, input } => sse_answer(&model, input_tokens, call_item(&body, &name, &input)),
    }
}

/// The model list.
fn models() -> WireAnswer {
    let model = |id: &str| json!({"id": id, "object": "model", "created": 1_700_000_000, "owned_by": "openai"});
    WireAnswer::json(200, &json!({"object": "list", "data": [model("gpt-5"), model("gpt-5-codex")]}))
}

/// A completed assistant message item.
fn message_item(text: &str) -> Value {
    json!({
        "id": fresh_id("msg_"), "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

/// A completed tool call item: custom when the request declares `name` as a custom tool.
fn call_item(request: &Value, name: &str, input: &Value) -> Value {
    let mut declared = vec![request];
    declared.extend(request.get("input").and_then(Value::as_array).into_iter().flatten());
    if declared.iter().any(|holder| declares_custom(holder, name)) {
        let text = input.as_str().map(str::to_string).unwrap_or_else(|| input["input"].as_str().unwrap_or("").into());
        json!({"id": fresh_id("ctc_"), "type": "custom_tool_call", "status": "completed",
               "call_id": fresh_id("call_"), "name": name, "input": text})
    } else {
        json!({"id": fresh_id("fc_"), "type": "function_call", "status": "completed",
               "call_id": fresh_id("call_"), "name": name, "arguments": input.to_string()})
    }
}

/// Whether `holder`'s `tools` declare `name` as a custom tool, at any depth (codex 0.171
/// declares its tools in a developer input item, custom `exec` inside namespace `functions`).
fn declares_custom(holder: &Value, name: &str) -> bool {
    let tools = holder.get("tools").and_then(Value::as_array).into_iter().flatten();
    tools.into_iter().any(|t| (t["type"] == "custom" && t["name"] == name) || declares_custom(t, name))
}

/// The response object, `output` and `usage` as given.
fn response(id: &str, model: &str, status: &str, output: Value, usage: Value) -> Value {
    json!({
        "id": id, "object": "response", "created_at": 1_700_000_000, "status": status, "model": model,
        "output": output, "usage": usage, "error": null, "incomplete_details": null,
    })
}

/// The events of a streamed response with one output item, in order.
pub(super) fn events(model: &str, input_tokens: u64, item: &Value) -> Vec<Value> {
    let id = fresh_id("resp_");
    let output_tokens = (item.to_string().len() as u64 / 4).max(1);
    let usage = json!({
        "input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    });
    let mut events = vec![
        json!({"type": "response.created", "response": response(&id, model, "in_progress", json!([]), Value::Null)}),
        json!({"type": "response.in_progress", "response": response(&id, model, "in_progress", json!([]), Value::Null)}),
    ];
    let mut added = item.clone();
    added["status"] = json!("in_progress");
    if item["type"] == "message" {
        added["content"] = json!([]);
        let text = item["content"][0]["text"].clone();
        let (item_id, part) = (item["id"].clone(), json!({"type": "output_text", "text": "", "annotations": []}));
        let at = json!({"item_id": item_id, "output_index": 0, "content_index": 0});
        events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
        events.push(merge(&at, json!({"type": "response.content_part.added", "part": part})));
        events.push(merge(&at, json!({"type": "response.output_text.delta", "delta": text})));
        events.push(merge(&at, json!({"type": "response.output_text.done", "text": text})));
        events.push(merge(&at, json!({"type": "response.content_part.done", "part": item["content"][0]})));
    } else {
        events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    let done = response(&id, model, "completed", json!([item]), usage);
    events.push(json!({"type": "response.completed", "response": done}));
    for (n, event) in events.iter_mut().enumerate() {
        event["sequence_number"] = json!(n);
    }
    events
}

/// `extra`'s fields added to `base`'s.
fn merge(base: &Value, extra: Value) -> Value {
    let mut out = base.clone();
    if let (Some(out), Value::Object(extra)) = (out.as_object_mut(), extra) {
        out.extend(extra);
    }
    out
}

/// The streamed answer: every event at once.
fn sse_answer(model: &str, input_tokens: u64, item: Value) -> WireAnswer {
    named_events(events(model, input_tokens, &item), "x-request-id")
}

/// The error type and code OpenAI names for a status.
fn error_kind(status: u16) -> (&'static str, &'static str) {
    match status {
        401 => ("invalid_request_error", "invalid_api_key"),
        404 => ("invalid_request_error", "not_found"),
        429 => ("requests", "rate_limit_exceeded"),
        _ => ("server_error", "server_error"),
    }
}

/// An error answer. A `Null` body becomes OpenAI's shape for the status; a string becomes its
/// message; an object is sent as given.
pub(super) fn error_answer(status: u16, headers: &[(String, String)], body: &Value) -> WireAnswer {
    let (kind, code) = error_kind(status);
    let shaped = |message: &str| json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    let body = match body {
        Value::Null => shaped(&format!("scripted {status}")),
        Value::String(message) => shaped(message),
        other => other.clone(),
    };
    let mut answer = WireAnswer::json(status, &body);
    answer.headers = headers.to_vec();
    answer.headers.push(("x-request-id".into(), fresh_id("req_")));
    answer
}
