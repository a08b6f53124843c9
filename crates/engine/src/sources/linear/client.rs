//! The HTTP side of Linear: one POST per document, the key in the `Authorization` header
//! (a personal key as it is, with no `Bearer`), every call bounded, and every answer read
//! for its rate-limit headers and sorted into what the caller does next ([`TrackerError`]).

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

pub use crate::sources::error::TrackerError;
pub use crate::sources::http::install_crypto_provider;
use crate::sources::settings::{check_api_url, SourceKind, SourceSettings};

const L: SourceKind = SourceKind::Linear;

/// What an answer's headers said of the budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests left in the window, and when it resets (ms since the epoch).
    pub remaining: Option<i64>,
    pub reset_at_ms: Option<i64>,
    /// Complexity points left, and when they reset.
    pub complexity_remaining: Option<i64>,
    pub complexity_reset_at_ms: Option<i64>,
}

impl RateLimit {
    fn of(headers: &HeaderMap) -> Self {
        let num = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
        Self {
            remaining: num("x-ratelimit-requests-remaining"),
            reset_at_ms: num("x-ratelimit-requests-reset"),
            complexity_remaining: num("x-ratelimit-complexity-remaining"),
            complexity_reset_at_ms: num("x-ratelimit-complexity-reset"),
        }
    }

    /// When the source should rest until, if its budget runs low: fewer than `floor`
    /// requests (or 10 × floor × 100 complexity points) left means no turn before the reset.
    /// Slowing down before the limit, not after.
    pub fn hold_until(&self, floor: i64) -> Option<i64> {
        let low_requests = self.remaining.is_some_and(|r| r < floor);
        let low_points = self.complexity_remaining.is_some_and(|r| r < floor * 1000);
        match (low_requests, low_points) {
            (true, _) => self.reset_at_ms,
            (_, true) => self.complexity_reset_at_ms,
            _ => None,
        }
    }
}

/// A GraphQL error as Linear writes it.
#[derive(Debug, Deserialize)]
struct GqlError {
    message: String,
    #[serde(default)]
    extensions: Option<Value>,
}

impl GqlError {
    fn code(&self) -> &str {
        self.extensions.as_ref().and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("")
    }
}

#[derive(Debug, Deserialize)]
struct Envelope<T> {
    data: Option<T>,
    #[serde(default)]
    errors: Vec<GqlError>,
}

/// A Linear client for one key and one address. The key is never printed: not by `Debug`,
/// not in an error (reqwest's errors name the URL, which holds no secret).
#[derive(Clone)]
pub struct LinearClient {
    http: reqwest::Client,
    url: String,
}

impl std::fmt::Debug for LinearClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinearClient").field("url", &self.url).finish_non_exhaustive()
    }
}

impl LinearClient {
    /// A client for `url` with `key`, each call bounded by `timeout` (connect included). A
    /// key that cannot be a header value is refused here.
    pub fn new(url: &str, key: &str, timeout: Duration) -> Result<Self, TrackerError> {
        // Wherever the address came from (the settings, DEVPILOT_LINEAR_API_URL), the key
        // never travels in clear text off this machine.
        check_api_url(url).map_err(|e| TrackerError::Refused(L, e.to_string()))?;
        let json = [(CONTENT_TYPE, HeaderValue::from_static("application/json"))];
        let http = crate::sources::http::client(L, key.trim(), &json, timeout)?;
        Ok(Self { http, url: url.to_string() })
    }

    /// A client for source `s`'s API address and timeout, with `key`.
    pub fn for_source(s: &SourceSettings, key: &str) -> Result<Self, TrackerError> {
        Self::new(&s.api_url(), key, s.timeout.get())
    }

    /// Sends `document` (one of [`super::documents`]) with `variables`; the answer's `data`
    /// as `T`, and the budget its headers said.
    pub async fn call<T: DeserializeOwned>(
        &self,
        document: &'static str,
        variables: Value,
    ) -> Result<(T, RateLimit), TrackerError> {
        let body = serde_json::json!({ "query": document, "variables": variables });
        let answer =
            self.http.post(&self.url).json(&body).send().await.map_err(|e| TrackerError::unreachable(L, &e))?;
        let status = answer.status();
        let rate = RateLimit::of(answer.headers());
        if status.is_server_error() {
            return Err(TrackerError::Server(L, status.as_u16()));
        }
        let text = answer.text().await.map_err(|e| TrackerError::unreachable(L, &e))?;
        let envelope: Envelope<T> = match serde_json::from_str(&text) {
            Ok(e) => e,
            // Not GraphQL: something in between (a proxy, a load balancer) answered. Sorted by
            // its status; anything unexpected is worth another try later, never a give-up.
            Err(e) => {
                return Err(match status.as_u16() {
                    200..=299 => TrackerError::Server(L, status.as_u16()).with_detail(&e.to_string()),
                    401 | 403 => TrackerError::Auth(L, format!("HTTP {status}")),
                    429 => TrackerError::RateLimited { tracker: L, reset_at_ms: rate.reset_at_ms },
                    code => TrackerError::Server(L, code),
                })
            }
        };
        if let Some(e) = envelope.errors.first() {
            return Err(match e.code() {
                "AUTHENTICATION_ERROR" => TrackerError::Auth(L, e.message.clone()),
                "RATELIMITED" => TrackerError::RateLimited { tracker: L, reset_at_ms: rate.reset_at_ms },
                _ if status == reqwest::StatusCode::UNAUTHORIZED => TrackerError::Auth(L, e.message.clone()),
                _ => TrackerError::Refused(L, e.message.clone()),
            });
        }
        match envelope.data {
            Some(data) => Ok((data, rate)),
            None => Err(TrackerError::Refused(L, format!("HTTP {status} with no data"))),
        }
    }
}
