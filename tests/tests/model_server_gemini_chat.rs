//! The scripted model server's Gemini and OpenAI chat-completions protocols over HTTP: the wire
//! shapes gemini-cli 0.61 and aider 0.86 (litellm) parse, turns taken in order, side requests
//! that leave the script alone, and errors shaped as each provider sends them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use devpilot_tests::model_server::Provider;
use devpilot_tests::{ModelServer, Turn};
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};

/// A plain HTTP client (reqwest's rustls needs a crypto provider even for plain HTTP).
fn client() -> Client {
    devpilot_engine::sources::linear::install_crypto_provider();
    Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

/// POSTs `body` to `path`.
fn post(server: &ModelServer, path: &str, body: &Value) -> Response {
    client().post(format!("{}{path}", server.url())).json(body).send().unwrap()
}

/// The `data:` payloads of a server-sent event stream, in order.
fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n").filter_map(|event| event.trim().strip_prefix("data:")).map(|d| d.trim().to_string()).collect()
}

/// The content-type of a response.
fn content_type(response: &Response) -> String {
    response.headers().get("content-type").unwrap().to_str().unwrap().to_string()
}

const STREAM: &str = "/v1beta/models/gemini-3.8-flash:streamGenerateContent?alt=sse";

/// A gemini conversation request: user text and a declared tool.
fn gemini_request(text: &str) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": text}]}],
           "tools": [{"functionDeclarations": [{"name": "write_file"}]}]})
}

/// Gemini's streamed turns come in script order: a tool call as a `functionCall` part, then a
/// text, each one SSE event with finishReason STOP and usageMetadata.
#[test]
fn gemini_streams_scripted_turns_in_order() {
    let server = ModelServer::start().unwrap();
    let input = json!({"file_path": "hello.txt", "content": "hi\n"});
    server.script([Turn::Tool { name: "write_file".into(), input: input.clone() }, Turn::Text("Done.".into())]);
    let first = post(&server, STREAM, &gemini_request("write it"));
    assert_eq!(first.status(), 200);
    assert_eq!(content_type(&first), "text/event-stream");
    let events = sse_data(&first.text().unwrap());
    assert_eq!(events.len(), 1);
    let chunk: Value = serde_json::from_str(&events[0]).unwrap();
    let candidate = &chunk["candidates"][0];
    assert_eq!(candidate["content"]["parts"][0]["functionCall"], json!({"name": "write_file", "args": input}));
    assert_eq!(candidate["finishReason"], "STOP");
    assert_eq!(chunk["modelVersion"], "gemini-3.8-flash");
    assert!(chunk["usageMetadata"]["totalTokenCount"].as_u64().unwrap() > 0);
    let second = post(&server, "/v1beta/models/gemini-3.8-flash:generateContent", &gemini_request("go on"));
    let whole: Value = second.json().unwrap();
    assert_eq!(whole["candidates"][0]["content"]["parts"][0]["text"], "Done.");
    let main = server.main_requests();
    assert_eq!(main.len(), 2);
    assert!(main.iter().all(|r| r.provider == Provider::Gemini));
    assert_eq!(main[0].body["contents"][0]["parts"][0]["text"], "write it");
}

/// Gemini's router (a JSON-schema request) and token counts are answered on the side: they
/// get a JSON answer that fits, are recorded as not main, and leave the script's turn in place.
#[test]
fn gemini_side_requests_leave_the_script_alone() {
    let server = ModelServer::start().unwrap();
    server.script([Turn::Text("The real answer.".into())]);
    let schema = json!({"type": "OBJECT", "properties": {"complexity_reasoning": {"type": "STRING"},
        "complexity_score": {"type": "INTEGER"}, "extra": {"type": "BOOLEAN"}},
        "required": ["complexity_reasoning", "complexity_score", "extra"]});
    let router = json!({"contents": [{"role": "user", "parts": [{"text": "route"}]}],
        "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": schema}});
    let answer: Value = post(&server, "/v1beta/models/gemini-3.5-flash-lite:generateContent", &router).json().unwrap();
    let text = answer["candidates"][0]["content"]["parts"][0]["text"].as_str().unwrap();
    let routed: Value = serde_json::from_str(text).unwrap();
    assert_eq!(routed["complexity_score"], 1);
    assert_eq!(routed["extra"], false);
    let count: Value = post(&server, "/v1beta/models/gemini-3.8-flash:countTokens", &router).json().unwrap();
    assert!(count["totalTokens"].as_u64().unwrap() > 0);
    let main = post(&server, STREAM, &gemini_request("hello")).text().unwrap();
    assert!(main.contains("The real answer."));
    let flags: Vec<bool> = server.requests().iter().map(|r| r.main).collect();
    assert_eq!(flags, [false, false, true]);
}

/// A scripted Gemini error goes out with its status, its headers, and Google's error shape.
#[test]
fn gemini_errors_are_google_shaped() {
    let server = ModelServer::start().unwrap();
    let headers = vec![("retry-after".to_string(), "7".to_string())];
    server.script([Turn::Error { status: 429, headers, body: Value::Null }]);
    let response = post(&server, STREAM, &gemini_request("hello"));
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers().get("retry-after").unwrap(), "7");
    let body: Value = response.json().unwrap();
    assert_eq!(body["error"]["code"], 429);
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");
    assert!(body["error"]["message"].is_string());
}

/// A chat request as aider sends it (stream true).
fn chat_request(text: &str, stream: bool) -> Value {
    json!({"model": "test-model", "stream": stream, "temperature": 0,
           "messages": [{"role": "system", "content": "Act as an expert."}, {"role": "user", "content": text}]})
}

/// Streamed chat completions carry the scripted text (an aider whole-format edit) in chunks
/// ending with a finish reason, the usage, and `[DONE]`.
#[test]
fn chat_streams_the_scripted_text() {
    let server = ModelServer::start().unwrap();
    let edit = "hello.txt\n```\nhello from aider\n```\n";
    server.script([Turn::Text(edit.into())]);
    let response = post(&server, "/v1/chat/completions", &chat_request("change hello", true));
    assert_eq!(response.status(), 200);
    assert_eq!(content_type(&response), "text/event-stream");
    let data = sse_data(&response.text().unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, edit);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(last["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "test-model"));
    let main = server.main_requests();
    assert_eq!(main.len(), 1);
    assert_eq!(main[0].provider, Provider::OpenAiChat);
    assert_eq!(main[0].body["messages"][1]["content"], "change hello");
}

/// A non-streamed chat completion is one JSON object; a tool turn is a `tool_calls` entry with
/// its input as a JSON string of arguments.
#[test]
fn chat_answers_whole_completions_and_tool_calls() {
    let server = ModelServer::start().unwrap();
    server.script([Turn::Text("Plain.".into()), Turn::Tool { name: "edit".into(), input: json!({"path": "a"}) }]);
    let whole: Value = post(&server, "/v1/chat/completions", &chat_request("one", false)).json().unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"], json!({"role": "assistant", "content": "Plain."}));
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let tool: Value = post(&server, "/v1/chat/completions", &chat_request("two", false)).json().unwrap();
    let call = &tool["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "edit");
    assert_eq!(
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"path": "a"})
    );
    assert_eq!(tool["choices"][0]["finish_reason"], "tool_calls");
}

/// A scripted chat error goes out with its status, its headers, and OpenAI's error shape.
#[test]
fn chat_errors_are_openai_shaped() {
    let server = ModelServer::start().unwrap();
    server.script([Turn::Error { status: 401, headers: vec![], body: json!("Incorrect API key provided.") }]);
    let response = post(&server, "/v1/chat/completions", &chat_request("hello", true));
    assert_eq!(response.status(), 401);
    let body: Value = response.json().unwrap();
    assert_eq!(body["error"]["message"], "Incorrect API key provided.");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "invalid_api_key");
}
