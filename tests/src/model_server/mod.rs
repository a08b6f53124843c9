//! A scripted model server on loopback that speaks the providers' wire protocols, so the real
//! agent CLIs (claude, codex, gemini, aider) run end to end with no network:
//! - `anthropic`: the Anthropic Messages API with SSE streaming (claude, `ANTHROPIC_BASE_URL`);
//! - `openai`: the OpenAI Responses API with SSE (codex, `openai_base_url` in its config);
//! - `gemini`: the Gemini API (gemini, `GOOGLE_GEMINI_BASE_URL`);
//! - `chat`: OpenAI chat completions, which aider (litellm) accepts (`OPENAI_API_BASE`).
//!
//! A test scripts the turns: each main request the CLI makes takes the next [`Turn`] (a final
//! text, a tool call, or an HTTP error), or waits at a gate the test opens ([`TurnGate`]).
//! Every request is recorded, so a test can assert what the model was sent (the prompt once,
//! a resumed conversation's earlier messages). A test may fix the `input_tokens` main
//! Anthropic answers report ([`ModelServer::set_input_tokens`]), so the usage claude streams,
//! and what it costs, are exact.

use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::http_server::{Server, WireAnswer, WireRequest};

mod anthropic;
mod chat;
mod gemini;
mod openai;
mod script;

use script::State;
pub use script::{Provider, Recorded, Turn, TurnGate};

/// The server: dropping it stops it.
pub struct ModelServer {
    server: Server,
    state: Arc<Mutex<State>>,
}

impl ModelServer {
    /// Listens on a free loopback port.
    pub fn start() -> std::io::Result<Self> {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let handler = Box::new(move |req: &WireRequest| {
            let (answer, gate) = route(req, &shared);
            // A gated turn waits in its connection's thread, the state unlocked.
            if let Some(g) = gate {
                g.pass();
            }
            answer
        });
        let server = Server::start("model-server", 0, handler, |why| {
            WireAnswer::json(400, &serde_json::json!({"error": {"message": why}}))
        })?;
        Ok(Self { server, state })
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// Adds turns to the end of the script.
    pub fn script(&self, turns: impl IntoIterator<Item = Turn>) {
        self.state.lock().unwrap().script.extend(turns);
    }

    /// Drops the turns no request took (a turn the agent was stopped before asking for),
    /// saying how many there were.
    pub fn clear_script(&self) -> usize {
        std::mem::take(&mut self.state.lock().unwrap().script).len()
    }

    /// The `input_tokens` every main Anthropic answer reports from now on (`None`: the
    /// estimate from the request's size, the default), so a test's streamed usage is exact.
    pub fn set_input_tokens(&self, tokens: Option<u64>) {
        self.state.lock().unwrap().input_tokens = tokens;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The main requests so far (those that took a turn).
    pub fn main_requests(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.main).collect()
    }
}

/// Sends a request to the protocol its path names; with the gate its turn waits at, if any.
fn route(req: &WireRequest, state: &Mutex<State>) -> (WireAnswer, Option<TurnGate>) {
    let mut state = state.lock().unwrap();
    let mut answer = answer(req, &mut state);
    answer.hold = state.hold.take().or(answer.hold);
    answer.delay = state.delay.take();
    (answer, state.gate.take())
}

/// The answer of the protocol the request's path names.
fn answer(req: &WireRequest, state: &mut State) -> WireAnswer {
    let path = req.path.as_str();
    if path.contains("/messages") {
        anthropic::answer(req, state)
    } else if path.contains("/responses") || path.ends_with("/models") {
        openai::answer(req, state)
    } else if path.contains(":generateContent")
        || path.contains(":streamGenerateContent")
        || path.contains(":countTokens")
    {
        gemini::answer(req, state)
    } else if path.contains("/chat/completions") {
        chat::answer(req, state)
    } else {
        let body = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        state.requests.push(Recorded {
            provider: Provider::Anthropic,
            method: req.method.clone(),
            path: req.path.clone(),
            headers: req.headers.clone(),
            body,
            main: false,
        });
        WireAnswer::json(404, &serde_json::json!({"error": {"message": format!("no such endpoint: {path}")}}))
    }
}
