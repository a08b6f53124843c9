//! What the GitHub stand-in's server threads and handles share: the data, and the controls
//! (tokens, armed faults, the rate limit, the request log). Tokens are kept only to compare
//! against; nothing here prints or records one.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use crate::gate::Gate;

use super::model::{Access, Fault, FaultKind, Recorded};
use super::state::{State, VIEWER};

/// GitHub's primary rate limit for a token: 5,000 requests an hour.
pub(crate) const RATE_LIMIT: u64 = 5_000;
/// The primary rate limit's window.
const WINDOW_S: i64 = 3_600;

/// The primary rate limit (`x-ratelimit-*`, resource `core`).
pub(crate) struct Rate {
    pub remaining: u64,
    /// Epoch seconds when it is full again.
    pub reset: i64,
}

impl Rate {
    /// Refills the budget if its window has passed.
    fn refresh(&mut self, now: i64) {
        if now >= self.reset {
            self.remaining = RATE_LIMIT;
            self.reset = now + WINDOW_S;
        }
    }

    /// The headers GitHub sends on every answer.
    pub(crate) fn headers(&self) -> Vec<(String, String)> {
        [
            ("x-ratelimit-limit", RATE_LIMIT.to_string()),
            ("x-ratelimit-remaining", self.remaining.to_string()),
            ("x-ratelimit-reset", self.reset.to_string()),
            ("x-ratelimit-used", (RATE_LIMIT - self.remaining.min(RATE_LIMIT)).to_string()),
            ("x-ratelimit-resource", "core".to_string()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
    }
}

/// One accepted token: what it may do, and the login of the user it belongs to.
pub(crate) struct Holder {
    pub token: String,
    pub access: Access,
    pub login: String,
}

/// The knobs and the log.
pub(crate) struct Control {
    /// Accepted tokens, what each may do and whose each is.
    pub tokens: Vec<Holder>,
    /// Armed faults, in the order injected.
    pub faults: Vec<Fault>,
    /// Armed gates: the next request of each operation waits at its gate.
    pub gates: Vec<(&'static str, Arc<Gate>)>,
    pub rate: Rate,
    pub log: Vec<Recorded>,
}

/// Everything one stand-in holds.
pub(crate) struct Shared {
    pub state: Mutex<State>,
    pub control: Mutex<Control>,
    /// Whether the `/_admin/` endpoints are served (the binary's, for the Python e2e).
    pub admin: bool,
    /// Where the server listens (for `Link` headers); set once it does.
    pub addr: OnceLock<SocketAddr>,
}

/// A lock that survives a panicking holder.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// A fresh stand-in accepting `token` with full access.
    pub(crate) fn new(token: &str, admin: bool) -> Self {
        let state = State::default();
        let rate = Rate { remaining: RATE_LIMIT, reset: state.now() + WINDOW_S };
        Self {
            state: Mutex::new(state),
            control: Mutex::new(Control {
                tokens: vec![Holder { token: token.into(), access: Access::Full, login: VIEWER.into() }],
                faults: Vec::new(),
                gates: Vec::new(),
                rate,
                log: Vec::new(),
            }),
            admin,
            addr: OnceLock::new(),
        }
    }

    /// The state, locked.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The controls, locked.
    pub(crate) fn control(&self) -> MutexGuard<'_, Control> {
        lock(&self.control)
    }

    /// What `token` may do and whose it is, if it is known.
    pub(crate) fn holder(&self, token: &str) -> Option<(Access, String)> {
        self.control().tokens.iter().find(|h| h.token == token).map(|h| (h.access, h.login.clone()))
    }

    /// Takes the gate armed for `op`, if any (each holds one request).
    pub(crate) fn take_gate(&self, op: &str) -> Option<Arc<Gate>> {
        let mut control = self.control();
        let found = control.gates.iter().position(|(o, _)| *o == op)?;
        Some(control.gates.remove(found).1)
    }

    /// Takes one use of the first armed fault for `op`.
    pub(crate) fn take_fault(&self, op: &str) -> Option<FaultKind> {
        let mut control = self.control();
        let found = control.faults.iter().position(|f| f.op == op && f.times > 0)?;
        let fault = &mut control.faults[found];
        fault.times -= 1;
        let kind = fault.kind.clone();
        if fault.times == 0 {
            control.faults.remove(found);
        }
        Some(kind)
    }

    /// Whether the primary rate limit has requests left (refilling it if its window passed).
    pub(crate) fn rate_left(&self) -> bool {
        let now = self.state().now();
        let mut control = self.control();
        control.rate.refresh(now);
        control.rate.remaining > 0
    }

    /// Records a request; answers with the rate-limit headers as they are after it.
    pub(crate) fn record(&self, recorded: Recorded) -> Vec<(String, String)> {
        let mut control = self.control();
        if recorded.counted {
            control.rate.remaining = control.rate.remaining.saturating_sub(1);
        }
        control.log.push(recorded);
        control.rate.headers()
    }
}
