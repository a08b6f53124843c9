//! Where a tracker's API key comes from: `LINEAR_API_KEY` (taken out of the environment at
//! start by [`crate::seal`], for headless machines), else the OS keychain (`devpilot login
//! --linear`, or Settings → Sources). The key lives only in memory and in the keychain:
//! never in the settings file, an argv, a log line, a row or the outbox. Its `Debug` says
//! where it came from, never what it is.

use devpilot_store::error::Result;

/// The keychain account of the Linear API key (one per machine, for every Linear source).
pub const LINEAR_ACCOUNT: &str = "linear-api-key";

/// Where this machine looks for keys.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyStore {
    /// `LINEAR_API_KEY`, else the keychain under this service name.
    Keychain { service: String },
    /// This key, handed in by whoever embeds the engine (the benchmark).
    Given(LinearKey),
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyStore::Keychain { service } => write!(f, "Keychain({service})"),
            KeyStore::Given(_) => f.write_str("Given(redacted)"),
        }
    }
}

/// A key, and where it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct LinearKey {
    secret: String,
    from: &'static str,
}

impl std::fmt::Debug for LinearKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LinearKey(from {})", self.from)
    }
}

impl LinearKey {
    /// A key handed in ([`KeyStore::Given`]).
    pub fn given(secret: &str) -> Self {
        Self { secret: secret.trim().to_string(), from: "given" }
    }

    /// The key itself, for the `Authorization` header and nothing else.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// `LINEAR_API_KEY` or `keychain`.
    pub fn from(&self) -> &'static str {
        self.from
    }
}

impl KeyStore {
    /// The Linear key, if this machine has one. A keychain that cannot be reached is logged
    /// and counts as no key: the source says so, and the rest of the machine works on.
    pub async fn linear(&self) -> Option<LinearKey> {
        if let KeyStore::Given(k) = self {
            return Some(k.clone());
        }
        if let Some(k) = crate::seal::env_linear_api_key() {
            return Some(LinearKey { secret: k, from: "LINEAR_API_KEY" });
        }
        let KeyStore::Keychain { service } = self else { return None };
        let service = service.clone();
        let found = tokio::task::spawn_blocking(move || crate::secrets::load_secret(&service, LINEAR_ACCOUNT)).await;
        match found {
            Ok(Ok(Some(k))) if !k.trim().is_empty() => {
                Some(LinearKey { secret: k.trim().to_string(), from: "keychain" })
            }
            Ok(Ok(_)) => None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the keychain could not be read for the Linear key");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "the keychain lookup did not finish");
                None
            }
        }
    }
}

/// Keeps the Linear key in the keychain of `service`.
pub fn store_linear_key(service: &str, key: &str) -> Result<()> {
    crate::secrets::store_secret(service, LINEAR_ACCOUNT, key.trim())
}

/// Forgets the Linear key (no error if there was none).
pub fn delete_linear_key(service: &str) -> Result<()> {
    crate::secrets::delete_secret(service, LINEAR_ACCOUNT)
}
