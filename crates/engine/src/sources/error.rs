//! What went wrong with a call to a tracker, sorted by what the caller does next, and naming
//! the tracker: a message a person reads says which tracker and which credential.

use super::settings::SourceKind;

/// What went wrong with a call, as the caller acts on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrackerError {
    /// The key was refused: this machine stops using the source until its key changes.
    #[error("{} refused the {} ({}); set a new one with `devpilot login --{}` or {}",
            .0.tracker(), .0.credential(), .1, .0.as_str(), .0.env_var())]
    Auth(SourceKind, String),
    /// Over the budget: nothing more until the reset.
    #[error("{}'s rate limit was reached; waiting until it resets", .tracker.tracker())]
    RateLimited { tracker: SourceKind, reset_at_ms: Option<i64> },
    /// No answer: the tracker (or the network) is down; the source is offline and its
    /// outbox waits.
    #[error("{} could not be reached: {}", .0.tracker(), .1)]
    Unreachable(SourceKind, String),
    /// The tracker answered with a server error: try again later.
    #[error("{} answered {}; trying again later", .0.tracker(), .1)]
    Server(SourceKind, u16),
    /// The tracker refused the request itself (an unknown issue, a bad state, a deleted
    /// base branch): retrying the same request would fail the same way.
    #[error("{} refused the request: {}", .0.tracker(), .1)]
    Refused(SourceKind, String),
}

impl TrackerError {
    /// Logs what could not be read (a server's garbled answer), keeping the error itself short.
    pub(crate) fn with_detail(self, detail: &str) -> Self {
        tracing::warn!(%detail, "the tracker's answer could not be read");
        self
    }

    /// When a rate limit ends, if this is one that says.
    pub fn reset_at_ms(&self) -> Option<i64> {
        match self {
            TrackerError::RateLimited { reset_at_ms, .. } => *reset_at_ms,
            _ => None,
        }
    }

    /// A call that never reached an answer, as reqwest says it.
    pub(crate) fn unreachable(kind: SourceKind, e: &reqwest::Error) -> Self {
        let what = if e.is_timeout() {
            "no answer in time"
        } else if e.is_connect() {
            "could not connect"
        } else {
            "the connection failed"
        };
        TrackerError::Unreachable(kind, what.to_string())
    }
}
