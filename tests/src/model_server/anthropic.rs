//! The Anthropic Messages API as claude (Claude Code) speaks it: `POST /v1/messages`, streamed
//! as server-sent events when the body says `"stream": true`, plain JSON otherwise, and
//! `POST /v1/messages/count_tokens`.
//!
//! Which requests are the conversation: claude's main requests declare its tools (`Write`,
//! `Bash`, …) in `tools`; its side requests (a token count, a quota probe, a title or topic
//! from the small model) declare none. Only a main request takes a scripted turn; a side
//! request gets a short text and is recorded with `main: false`.

use serde_json::{json, Value};

use super::script::{estimate_tokens, fresh_id, named_events, Provider, State, Turn};
use crate::http_server::{WireAnswer, WireRequest};

/// Answers one Anthropic request.
pub(super) fn answer(req: &WireRequest, state: &mut State) -> WireAnswer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let path = req.path.as_str();
    if path.ends_with("/count_tokens") {
        state.record(Provider::Anthropic, req, &body, false);
        return WireAnswer::json(200, &json!({"input_tokens": estimate_tokens(&req.body)}));
    }
    if req.method != "POST" || !path.ends_with("/messages") {
        state.record(Provider::Anthropic, req, &body, false);
        return error_answer(404, &[], &Value::Null);
    }
    let main = is_main(&body);
    state.record(Provider::Anthropic, req, &body, main);
    let turn = if main { state.next_turn() } else { Turn::Text("Side answer".into()) };
    let model = body.get("model").and_then(Value::as_str).unwrap_or("claude-sonnet-4-5").to_string();
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let input_tokens = match state.input_tokens {
        Some(n) if main => n,
        _ => estimate_tokens(&req.body),
    };
    match turn {
        Turn::Error { status, headers, body } => error_answer(status, &headers, &body),
        turn => {
            let message = Message { model, input_tokens, block: Block::of(turn) };
            if stream {
                sse_answer(&message)
            } else {
                WireAnswer::json(200, &message.whole())
            }
        }
    }
}

/// Whether a request is the conversation (it declares tools) rather than a side request.
pub(super) fn is_main(body: &Value) -> bool {
    body.get("tools").and_then(Value::as_array).is_some_and(|tools| !tools.is_empty())
}

/// The one content block an answer carries.
enum Block {
    Text(String),
    ToolUse { id: String, name: String, input: Value },
}

impl Block {
    /// The block of a text or tool turn.
    fn of(turn: Turn) -> Block {
        match turn {
            Turn::Tool { name, input } => Block::ToolUse { id: fresh_id("toolu_"), name, input },
            Turn::Text(text) => Block::Text(text),
            Turn::Error { .. } | Turn::Hold(_) | Turn::Wait(_) | Turn::Gated(_) => Block::Text(String::new()),
        }
    }

    /// The block whole, as a non-streamed answer carries it.
    fn whole(&self) -> Value {
        match self {
            Block::Text(text) => json!({"type": "text", "text": text}),
            Block::ToolUse { id, name, input } => json!({"type": "tool_use", "id": id, "name": name, "input": input}),
        }
    }

    /// Why the model stopped after this block.
    fn stop_reason(&self) -> &'static str {
        match self {
            Block::Text(_) => "end_turn",
            Block::ToolUse { .. } => "tool_use",
        }
    }

    /// A rough count of the tokens the block holds.
    fn output_tokens(&self) -> u64 {
        estimate_tokens(self.whole().to_string().as_bytes())
    }
}

/// One assistant message.
struct Message {
    model: String,
    input_tokens: u64,
    block: Block,
}

impl Message {
    /// The usage object, with `output_tokens` as given.
    fn usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        })
    }

    /// The message as a non-streamed answer.
    fn whole(&self) -> Value {
        json!({
            "id": fresh_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [self.block.whole()],
            "stop_reason": self.block.stop_reason(),
            "stop_sequence": null,
            "usage": self.usage(self.block.output_tokens()),
        })
    }

    /// The events of the streamed message, in order.
    fn events(&self) -> Vec<Value> {
        let start = json!({
            "type": "message_start",
            "message": {
                "id": fresh_id("msg_"), "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": self.usage(1),
            },
        });
        let (block_start, delta) = match &self.block {
            Block::Text(text) => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": text})),
            Block::ToolUse { id, name, input } => (
                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                json!({"type": "input_json_delta", "partial_json": input.to_string()}),
            ),
        };
        vec![
            start,
            json!({"type": "content_block_start", "index": 0, "content_block": block_start}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.block.stop_reason(), "stop_sequence": null},
                "usage": {"output_tokens": self.block.output_tokens()},
            }),
            json!({"type": "message_stop"}),
        ]
    }
}

/// The streamed answer: every event at once.
fn sse_answer(message: &Message) -> WireAnswer {
    named_events(message.events(), "request-id")
}

/// The error type Anthropic names for a status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error answer. A `Null` body becomes Anthropic's shape for the status; a string becomes
/// its message; an object is sent as given.
pub(super) fn error_answer(status: u16, headers: &[(String, String)], body: &Value) -> WireAnswer {
    let body = match body {
        Value::Null => {
            json!({"type": "error", "error": {"type": error_type(status), "message": format!("scripted {status}")}})
        }
        Value::String(message) => json!({"type": "error", "error": {"type": error_type(status), "message": message}}),
        other => other.clone(),
    };
    let mut answer = WireAnswer::json(status, &body);
    answer.headers = headers.to_vec();
    answer.headers.push(("request-id".into(), fresh_id("req_")));
    answer
}
