//! The HTTP client every tracker's calls go through: ring as the TLS provider, the
//! credential as a sensitive header (never printed), DevPilot's user agent, every call
//! bounded (connect included), and no redirect (a redirect could carry the credential to
//! another host).

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, USER_AGENT};

use super::error::TrackerError;
use super::settings::SourceKind;

/// Makes ring the process's TLS crypto provider (reqwest is built without one), once.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Another part of the process may have installed one already: that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A client for `kind` that sends `authorization` (refused if no header can carry it) and
/// `headers` with every call, each bounded by `timeout`.
pub fn client(
    kind: SourceKind,
    authorization: &str,
    headers: &[(HeaderName, HeaderValue)],
    timeout: Duration,
) -> Result<reqwest::Client, TrackerError> {
    install_crypto_provider();
    let mut auth = HeaderValue::from_str(authorization).map_err(|_| {
        TrackerError::Auth(kind, format!("the {} has characters no HTTP header can carry", kind.credential()))
    })?;
    auth.set_sensitive(true);
    let mut all = HeaderMap::new();
    all.insert(AUTHORIZATION, auth);
    all.insert(USER_AGENT, HeaderValue::from_static(concat!("devpilot/", env!("CARGO_PKG_VERSION"))));
    for (name, value) in headers {
        all.insert(name.clone(), value.clone());
    }
    reqwest::Client::builder()
        .default_headers(all)
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| TrackerError::Unreachable(kind, e.to_string()))
}
