//! The scripted model server itself: the Anthropic and OpenAI Responses wire shapes the real
//! CLIs parse, scripted turns in order, errors, and side requests that leave the script alone.

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

/// The events of a server-sent event stream: (event name, data as JSON).
fn sse_events(text: &str) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    for chunk in text.split("\n\n").filter(|c| !c.trim().is_empty()) {
        let field = |name: &str| chunk.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or("");
        let data: Value = serde_json::from_str(field("data:")).expect("each event's data is JSON");
        events.push((field("event:").to_string(), data));
    }
    events
}

/// A claude-like main request: streamed, declaring a tool.
fn claude_request(prompt: &str) -> Value {
    json!({
        "model": "claude-test", "stream": true, "max_tokens": 100,
        "messages": [{"role": "user", "content": prompt}],
        "tools": [{"name": "Write", "input_schema": {"type": "object"}}],
    })
}

/// A streamed tool turn is a well-formed event stream with a `tool_use` block, and the next
/// main request takes the next (text) turn.
#[test]
fn anthropic_streams_a_tool_turn_then_a_text_turn() {
    let server = ModelServer::start().unwrap();
    let input = json!({"file_path": "/w/hello.txt", "content": "hi\n"});
    server.script([Turn::Tool { name: "Write".into(), input: input.clone() }, Turn::Text("done".into())]);
    let answer = post(&server, "/v1/messages", &claude_request("write it"));
    assert_eq!(answer.status(), 200);
    assert!(answer.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let events = sse_events(&answer.text().unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let expected = ["message_start", "content_block_start", "ping", "content_block_delta"];
    assert_eq!(&names[..4], expected);
    assert_eq!(&names[4..], ["content_block_stop", "message_delta", "message_stop"]);
    assert!(events.iter().all(|(name, data)| data["type"] == name.as_str()));
    assert_eq!(events[1].1["content_block"]["type"], "tool_use");
    assert_eq!(events[1].1["content_block"]["name"], "Write");
    let partial = events[3].1["delta"]["partial_json"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(partial).unwrap(), input);
    assert_eq!(events[5].1["delta"]["stop_reason"], "tool_use");
    assert!(events[5].1["usage"]["output_tokens"].as_u64().unwrap() > 0);

    let mut second = claude_request("write it");
    second["stream"] = json!(false);
    let message: Value = post(&server, "/v1/messages", &second).json().unwrap();
    assert_eq!(message["content"][0], json!({"type": "text", "text": "done"}));
    assert_eq!(message["stop_reason"], "end_turn");
    let main = server.main_requests();
    assert_eq!(main.len(), 2);
    assert!(main.iter().all(|r| r.provider == Provider::Anthropic));
    assert_eq!(main[0].body["messages"][0]["content"], "write it");
}

/// A scripted error is sent with its status and headers, in Anthropic's error shape.
#[test]
fn anthropic_error_turn_has_status_headers_and_shape() {
    let server = ModelServer::start().unwrap();
    let headers = vec![("retry-after".to_string(), "30".to_string())];
    server.script([Turn::Error { status: 429, headers, body: Value::Null }, Turn::Text("after".into())]);
    let answer = post(&server, "/v1/messages", &claude_request("hi"));
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "30");
    let body: Value = answer.json().unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let events = sse_events(&post(&server, "/v1/messages", &claude_request("hi")).text().unwrap());
    assert_eq!(events[3].1["delta"]["text"], "after");
}

/// A token count and a tool-less request (a title) are answered without taking a turn.
#[test]
fn anthropic_side_requests_do_not_consume_the_script() {
    let server = ModelServer::start().unwrap();
    server.script([Turn::Text("the real answer".into())]);
    let count: Value = post(&server, "/v1/messages/count_tokens", &claude_request("hi")).json().unwrap();
    assert!(count["input_tokens"].as_u64().unwrap() > 0);
    let title = json!({"model": "claude-haiku", "max_tokens": 10, "messages": [{"role": "user", "content": "title?"}]});
    let side: Value = post(&server, "/v1/messages", &title).json().unwrap();
    assert_eq!(side["stop_reason"], "end_turn");
    let events = sse_events(&post(&server, "/v1/messages", &claude_request("hi")).text().unwrap());
    assert_eq!(events[3].1["delta"]["text"], "the real answer");
    let mains: Vec<bool> = server.requests().iter().map(|r| r.main).collect();
    assert_eq!(mains, [false, false, true]);
}

/// A codex-like request: tools declared in a developer input item, `exec` custom in a namespace.
fn codex_request(prompt: &str) -> Value {
    let exec = json!({"type": "custom", "name": "exec", "format": {"type": "grammar"}});
    let wait = json!({"type": "function", "name": "wait", "parameters": {"type": "object"}});
    let tools = json!({"type": "additional_tools", "role": "developer",
                       "tools": [{"type": "namespace", "name": "functions", "tools": [exec, wait]}]});
    json!({"model": "gpt-test", "stream": true,
           "input": [tools, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}]})
}

/// A tool turn for a declared custom tool is a `custom_tool_call`, for any other a
/// `function_call`; a text turn is a message; every stream ends in `response.completed`.
#[test]
fn responses_stream_custom_and_function_calls_then_text() {
    let server = ModelServer::start().unwrap();
    server.script([
        Turn::Tool { name: "exec".into(), input: json!("text('hi')") },
        Turn::Tool { name: "wait".into(), input: json!({"cell_id": "1"}) },
        Turn::Text("all done".into()),
    ]);
    let mut items = Vec::new();
    for _ in 0..3 {
        let answer = post(&server, "/v1/responses", &codex_request("go"));
        assert_eq!(answer.status(), 200);
        let events = sse_events(&answer.text().unwrap());
        assert_eq!(events[0].0, "response.created");
        let (last, done) = events.last().unwrap();
        assert_eq!(last, "response.completed");
        assert!(done["response"]["usage"]["total_tokens"].as_u64().unwrap() > 0);
        let item = events.iter().find(|(n, _)| n == "response.output_item.done").unwrap().1["item"].clone();
        items.push((item, events));
    }
    assert_eq!(items[0].0["type"], "custom_tool_call");
    assert_eq!(items[0].0["input"], "text('hi')");
    assert_eq!(items[1].0["type"], "function_call");
    assert_eq!(
        serde_json::from_str::<Value>(items[1].0["arguments"].as_str().unwrap()).unwrap(),
        json!({"cell_id": "1"})
    );
    assert_eq!(items[2].0["content"][0]["text"], "all done");
    assert!(items[2].1.iter().any(|(n, e)| n == "response.output_text.delta" && e["delta"] == "all done"));
    assert_eq!(server.main_requests().len(), 3);
}

/// A scripted error keeps its status and headers in OpenAI's shape; a model list is a side
/// request.
#[test]
fn responses_errors_and_model_list() {
    let server = ModelServer::start().unwrap();
    let headers = vec![("x-ratelimit-reset-requests".to_string(), "30s".to_string())];
    server.script([Turn::Error { status: 429, headers, body: json!("slow down") }]);
    let models: Value = client().get(format!("{}/v1/models", server.url())).send().unwrap().json().unwrap();
    assert_eq!(models["object"], "list");
    let answer = post(&server, "/v1/responses", &codex_request("go"));
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["x-ratelimit-reset-requests"], "30s");
    let body: Value = answer.json().unwrap();
    assert_eq!(body["error"]["message"], "slow down");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    let mains: Vec<bool> = server.requests().iter().map(|r| r.main).collect();
    assert_eq!(mains, [false, true]);
}
