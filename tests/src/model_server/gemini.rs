//! The Gemini API as gemini-cli 0.61.0 speaks it through `GOOGLE_GEMINI_BASE_URL`:
//! `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` (server-sent events, each a
//! `GenerateContentResponse`), `POST …:generateContent` (one JSON response), and
//! `POST …:countTokens`.
//!
//! Which requests are the conversation: gemini's side requests ask for JSON — its model router
//! (`gemini-3.5-flash-lite:generateContent` with `responseMimeType: application/json` and a
//! `responseJsonSchema` of `complexity_reasoning`/`complexity_score`), a next-speaker check —
//! and token counts. Those get an answer that fits and are recorded with `main: false`; every
//! other generate request takes a scripted turn. A [`Turn::Tool`] becomes a `functionCall`
//! part (gemini 0.61 declares `write_file` with `file_path` and `content`, `replace`,
//! `read_file`, …); a [`Turn::Error`] a Google-shaped error body.

use serde_json::{json, Value};

use super::script::{estimate_tokens, Provider, State, Turn};
use crate::http_server::{WireAnswer, WireRequest};

/// Answers one Gemini request.
pub(super) fn answer(req: &WireRequest, state: &mut State) -> WireAnswer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let path = req.path.as_str();
    if path.ends_with(":countTokens") {
        state.record(Provider::Gemini, req, &body, false);
        return WireAnswer::json(200, &json!({"totalTokens": estimate_tokens(&req.body)}));
    }
    let stream = path.ends_with(":streamGenerateContent");
    if req.method != "POST" || !(stream || path.ends_with(":generateContent")) {
        state.record(Provider::Gemini, req, &body, false);
        return error_answer(404, &[], &json!(format!("no such method: {path}")));
    }
    let main = !wants_json(&body);
    state.record(Provider::Gemini, req, &body, main);
    let turn = if main { state.next_turn() } else { Turn::Text(side_text(&body)) };
    let usage = usage(estimate_tokens(&req.body));
    let model = model_of(path);
    let part = match turn {
        Turn::Error { status, headers, body } => return error_answer(status, &headers, &body),
        // `next_turn` turns a hold into an empty text (which `route` holds back).
        Turn::Text(text) => json!({"text": text}),
        Turn::Hold(_) | Turn::Wait(_) | Turn::Gated(_) => json!({"text": ""}),

        Turn::Tool { name, input } => json!({"functionCall": {"name": name, "args": input}}),
    };
    let response = json!({
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage,
        "modelVersion": model,
    });
    if stream {
        let body = format!("data: {response}\r\n\r\n").into_bytes();
        let headers = vec![("content-type".into(), "text/event-stream".into())];
        WireAnswer { status: 200, headers, body, hold: None, delay: None }
    } else {
        WireAnswer::json(200, &response)
    }
}

/// Whether a request asks for a JSON answer (gemini's router, its next-speaker check): a side
/// request, not the conversation.
pub(super) fn wants_json(body: &Value) -> bool {
    let config = body.get("generationConfig").or_else(|| body.get("config"));
    let Some(config) = config else { return false };
    let mime = config.get("responseMimeType").and_then(Value::as_str);
    mime == Some("application/json")
        || config.get("responseJsonSchema").is_some()
        || config.get("responseSchema").is_some()
}

/// A JSON text that answers any of gemini's side requests: the router's complexity (simple:
/// it keeps the default model), the classifier's choice, the next speaker (the user: stop).
fn side_text(body: &Value) -> String {
    let config = body.get("generationConfig").or_else(|| body.get("config")).unwrap_or(&Value::Null);
    let schema = config.get("responseJsonSchema").or_else(|| config.get("responseSchema")).unwrap_or(&Value::Null);
    let mut answer = json!({
        "complexity_reasoning": "A scripted answer.",
        "complexity_score": 1,
        "reasoning": "A scripted answer.",
        "model_choice": "flash",
        "next_speaker": "user",
    });
    // Any other required field gets a value of its declared type.
    let required = schema.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
    for name in required.iter().filter_map(Value::as_str) {
        if answer.get(name).is_none() {
            let kind = schema.pointer(&format!("/properties/{name}/type")).and_then(Value::as_str).unwrap_or("");
            answer[name] = match kind.to_ascii_lowercase().as_str() {
                "integer" | "number" => json!(1),
                "boolean" => json!(false),
                "array" => json!([]),
                "object" => json!({}),
                _ => json!("scripted"),
            };
        }
    }
    answer.to_string()
}

/// The model a path names: `/v1beta/models/<model>:method`.
fn model_of(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or("");
    name.split(':').next().unwrap_or("").to_string()
}

/// A `usageMetadata` for `prompt` tokens in and a few out.
fn usage(prompt: u64) -> Value {
    json!({"promptTokenCount": prompt, "candidatesTokenCount": 5, "totalTokenCount": prompt + 5})
}

/// Google's canonical status for an HTTP status.
fn canonical_status(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        500 => "INTERNAL",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    }
}

/// An error as Google sends one: `{"error":{"code","message","status"}}`. A scripted body that
/// already has an `error` object goes out as it is; a string body is the message.
fn error_answer(status: u16, headers: &[(String, String)], body: &Value) -> WireAnswer {
    let body = if body.get("error").is_some_and(Value::is_object) {
        body.clone()
    } else {
        let message = body.as_str().map_or_else(|| format!("Scripted error {status}."), str::to_string);
        json!({"error": {"code": status, "message": message, "status": canonical_status(status)}})
    };
    WireAnswer { headers: headers.to_vec(), ..WireAnswer::json(status, &body) }
}
