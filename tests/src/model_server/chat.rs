//! OpenAI chat completions as aider 0.86.2 (through litellm) speaks them with
//! `--model openai/<name>` and `OPENAI_API_BASE=http://127.0.0.1:PORT/v1`:
//! `POST /v1/chat/completions`, streamed as server-sent events (`data: {chunk}` … `data:
//! [DONE]`) when the body says `"stream": true`, one JSON completion otherwise.
//!
//! Every chat request is a main request: aider makes no side requests here (with
//! `--no-auto-commits` it asks for no commit message). A [`Turn::Text`] is the assistant's
//! content — for aider, a text holding an edit in its `whole` format (a file name line, then the
//! file's entire new content in a fence) edits that file; a [`Turn::Tool`] is a `tool_calls`
//! entry; a [`Turn::Error`] an OpenAI-shaped error body.

use serde_json::{json, Value};

use super::script::{estimate_tokens, fresh_id, Provider, State, Turn};
use crate::http_server::{WireAnswer, WireRequest};

/// Answers one chat-completions request.
pub(super) fn answer(req: &WireRequest, state: &mut State) -> WireAnswer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let main = req.method == "POST" && req.path.ends_with("/chat/completions");
    state.record(Provider::OpenAiChat, req, &body, main);
    if !main {
        return error_answer(404, &[], &json!(format!("no such endpoint: {}", req.path)));
    }
    let model = body.get("model").and_then(Value::as_str).unwrap_or("gpt-4o").to_string();
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let prompt = estimate_tokens(&req.body);
    let usage = json!({"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5});
    let (message, finish) = match state.next_turn() {
        Turn::Error { status, headers, body } => return error_answer(status, &headers, &body),
        Turn::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        // `next_turn` turns a hold into an empty text (which `route` holds back).
        Turn::Hold(_) | Turn::Wait(_) | Turn::Gated(_) => (json!({"role": "assistant", "content": ""}), "stop"),

        Turn::Tool { name, input } => {
            let call = json!({"id": fresh_id("call_"), "type": "function",
                "function": {"name": name, "arguments": input.to_string()}});
            (json!({"role": "assistant", "content": null, "tool_calls": [call]}), "tool_calls")
        }
    };
    let id = fresh_id("chatcmpl-");
    if stream {
        sse_answer(&id, &model, message, finish, &usage)
    } else {
        let choice = json!({"index": 0, "message": message, "finish_reason": finish});
        let whole = json!({"id": id, "object": "chat.completion", "created": created(), "model": model,
            "choices": [choice], "usage": usage});
        WireAnswer::json(200, &whole)
    }
}

/// The completion as a stream: a chunk with the whole delta (tool calls indexed), a chunk with
/// the finish reason and the usage, then `[DONE]`.
fn sse_answer(id: &str, model: &str, mut delta: Value, finish: &str, usage: &Value) -> WireAnswer {
    if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for (index, call) in calls.iter_mut().enumerate() {
            call["index"] = json!(index);
        }
    }
    let chunk = |choice: Value, usage: Option<&Value>| {
        let mut chunk = json!({"id": id, "object": "chat.completion.chunk", "created": created(), "model": model, "choices": [choice]});
        if let Some(usage) = usage {
            chunk["usage"] = usage.clone();
        }
        chunk
    };
    let first = chunk(json!({"index": 0, "delta": delta, "finish_reason": null}), None);
    let last = chunk(json!({"index": 0, "delta": {}, "finish_reason": finish}), Some(usage));
    let body = format!("data: {first}\n\ndata: {last}\n\ndata: [DONE]\n\n").into_bytes();
    let headers = vec![("content-type".into(), "text/event-stream".into())];
    WireAnswer { status: 200, headers, body, hold: None, delay: None }
}

/// Seconds since the epoch, for `created`.
fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// OpenAI's error type and code for an HTTP status.
fn error_kind(status: u16) -> (&'static str, Value) {
    match status {
        401 => ("invalid_request_error", json!("invalid_api_key")),
        403 => ("invalid_request_error", json!("unsupported_country_region_territory")),
        404 => ("invalid_request_error", json!("model_not_found")),
        429 => ("requests", json!("rate_limit_exceeded")),
        400 => ("invalid_request_error", Value::Null),
        _ => ("server_error", Value::Null),
    }
}

/// An error as OpenAI sends one: `{"error":{"message","type","code"}}`. A scripted body that
/// already has an `error` object goes out as it is; a string body is the message.
fn error_answer(status: u16, headers: &[(String, String)], body: &Value) -> WireAnswer {
    let body = if body.get("error").is_some_and(Value::is_object) {
        body.clone()
    } else {
        let message = body.as_str().map_or_else(|| format!("Scripted error {status}."), str::to_string);
        let (kind, code) = error_kind(status);
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
    };
    WireAnswer { headers: headers.to_vec(), ..WireAnswer::json(status, &body) }
}
