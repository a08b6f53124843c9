//! What the model server shares with its protocols: the script of turns, and the record of
//! every request.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::gate::Gate;
use crate::http_server::{WireAnswer, WireRequest};

/// Which wire protocol a request spoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    Anthropic,
    OpenAiResponses,
    Gemini,
    OpenAiChat,
}

/// What the model answers to one main request.
#[derive(Clone, Debug)]
pub enum Turn {
    /// A final answer: the CLI prints it and exits.
    Text(String),
    /// A tool call (`name`, `input` as the provider's tool schema wants it): the CLI runs the
    /// tool and sends its result in its next request.
    Tool { name: String, input: Value },
    /// An HTTP error, as the provider sends one (a 401, a 429 with its reset headers).
    Error { status: u16, headers: Vec<(String, String)>, body: Value },
    /// No answer: the connection is held this long, then closed (the CLI waits on its
    /// model, as on a slow one, until the test hands the job off).
    Hold(std::time::Duration),
    /// The next turn is answered after this long: a model that takes its time, so what the
    /// agent did so far can be watched while it runs.
    Wait(std::time::Duration),
    /// The next turn is answered only once the test opens this gate (at most
    /// [`crate::gate::MAX_HOLD`] later): the agent waits on its model at an exact point while
    /// the test watches what it did so far.
    Gated(TurnGate),
}

/// The gate of a [`Turn::Gated`]: the test sees the request arrive and opens it.
#[derive(Clone, Default)]
pub struct TurnGate(Arc<Gate>);

impl TurnGate {
    /// Whether the gated request has come and is held.
    pub fn arrived(&self) -> bool {
        self.0.arrived()
    }

    /// Lets the gated request (or the one still to come) be answered.
    pub fn open(&self) {
        self.0.open();
    }

    /// Called by the request's connection thread, outside the state's lock.
    pub(crate) fn pass(&self) {
        self.0.pass();
    }
}

impl std::fmt::Debug for TurnGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnGate").field("arrived", &self.arrived()).finish()
    }
}

/// One request the server got.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub provider: Provider,
    pub method: String,
    pub path: String,
    /// Header names in lowercase.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Null` when there was none or it was not JSON).
    pub body: Value,
    /// Whether it took a scripted turn (a main request), or was answered on the side (a
    /// model list, a token count, a title).
    pub main: bool,
}

/// The script and the record, shared by the connection threads.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) script: VecDeque<Turn>,
    pub(crate) requests: Vec<Recorded>,
    /// A [`Turn::Hold`] the last request took.
    pub(crate) hold: Option<std::time::Duration>,
    /// A [`Turn::Wait`] before the last request's turn.
    pub(crate) delay: Option<std::time::Duration>,
    /// A [`Turn::Gated`] before the last request's turn.
    pub(crate) gate: Option<TurnGate>,
    /// The `input_tokens` every main answer reports (Anthropic's), in place of the estimate
    /// from the request's size: a test's streamed usage, and so its cost, made exact.
    pub(crate) input_tokens: Option<u64>,
}

impl State {
    /// The next scripted turn; an exhausted script answers with a short final text.
    pub(crate) fn next_turn(&mut self) -> Turn {
        match self.script.pop_front() {
            Some(Turn::Wait(d)) => {
                self.delay = Some(d);
                self.next_turn()
            }
            Some(Turn::Gated(g)) => {
                self.gate = Some(g);
                self.next_turn()
            }
            // The provider answers an empty text, which `route` then holds back.
            Some(Turn::Hold(d)) => {
                self.hold = Some(d);
                Turn::Text(String::new())
            }
            Some(turn) => turn,
            None => Turn::Text("(the model server's script is exhausted)".into()),
        }
    }
}

impl State {
    /// Records a request `provider`'s protocol answered; `main` when it took a turn.
    pub(crate) fn record(&mut self, provider: Provider, req: &WireRequest, body: &Value, main: bool) {
        self.requests.push(Recorded {
            provider,
            method: req.method.clone(),
            path: req.path.clone(),
            headers: req.headers.clone(),
            body: body.clone(),
            main,
        });
    }
}

/// Numbers the ids every protocol hands out.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh id with `prefix` (`msg_…`, `toolu_…`, `resp_…`, `call_…`).
pub(crate) fn fresh_id(prefix: &str) -> String {
    format!("{prefix}{:024}", NEXT_ID.fetch_add(1, Ordering::SeqCst))
}

/// A rough count of the tokens in a request body (four bytes a token).
pub(crate) fn estimate_tokens(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4).max(1)
}

/// A whole SSE stream in one answer, each event's `event:` named by its `type` (Anthropic's
/// and OpenAI's style), with a fresh request id under `id_header`.
pub(crate) fn named_events(events: impl IntoIterator<Item = Value>, id_header: &str) -> WireAnswer {
    let mut text = String::new();
    for event in events {
        let kind = event["type"].as_str().unwrap_or("message");
        text.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    WireAnswer {
        status: 200,
        headers: vec![
            ("content-type".into(), "text/event-stream".into()),
            ("cache-control".into(), "no-cache".into()),
            (id_header.into(), fresh_id("req_")),
        ],
        body: text.into_bytes(),
        hold: None,
        delay: None,
    }
}
