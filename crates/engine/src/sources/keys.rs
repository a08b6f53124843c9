//! Where a tracker's credential comes from: its variable (`LINEAR_API_KEY`, `GITHUB_TOKEN`,
//! taken out of the environment at start by [`crate::seal`], for headless machines), else the
//! OS keychain (`devpilot login --linear` / `--github`, or Settings → Sources). A GitHub token
//! may also be imported from the GitHub CLI (`gh auth token`), into the keychain, when the
//! user says so. A credential lives only in memory and in the keychain: never in the
//! settings file, an argv, a log line, a row or the outbox. Its `Debug` says where it came
//! from, never what it is.

use std::time::Duration;

use super::settings::SourceKind;
use devpilot_store::error::{Error, Result};

/// The keychain account of the Linear API key (one per machine, for every Linear source).
pub const LINEAR_ACCOUNT: &str = "linear-api-key";
/// The keychain account of the GitHub token (one per machine, for every GitHub source and
/// every pull request).
pub const GITHUB_ACCOUNT: &str = "github-token";
/// Where the stored GitHub token came from (`gh auth token`), when it was imported.
const GITHUB_ORIGIN_ACCOUNT: &str = "github-token-origin";

/// The keychain account of `kind`'s credential.
pub fn account_of(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::Linear => LINEAR_ACCOUNT,
        SourceKind::Github => GITHUB_ACCOUNT,
    }
}

/// Where this machine looks for keys.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyStore {
    /// The tracker's variable, else the keychain under this service name.
    Keychain { service: String },
    /// This key, for every tracker, handed in by whoever embeds the engine (the benchmark).
    Given(ApiKey),
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyStore::Keychain { service } => write!(f, "Keychain({service})"),
            KeyStore::Given(_) => f.write_str("Given(redacted)"),
        }
    }
}

/// A key or token, and where it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    secret: String,
    from: &'static str,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey(from {})", self.from)
    }
}

impl ApiKey {
    /// A key handed in ([`KeyStore::Given`]).
    pub fn given(secret: &str) -> Self {
        Self { secret: secret.trim().to_string(), from: "given" }
    }

    /// The key itself, for the `Authorization` header and nothing else.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// `LINEAR_API_KEY`, `GITHUB_TOKEN`, `keychain` or `keychain (imported from gh)`.
    pub fn from(&self) -> &'static str {
        self.from
    }
}

impl KeyStore {
    /// `kind`'s credential, if this machine has one. A keychain that cannot be reached is
    /// logged and counts as no key: the source says so, and the rest of the machine works on.
    pub async fn key(&self, kind: SourceKind) -> Option<ApiKey> {
        let key = self.find(kind).await;
        // Whatever this machine holds, no agent text it sends out may carry.
        if let Some(k) = &key {
            crate::redact::known().learn(k.secret());
        }
        key
    }

    /// Where [`KeyStore::key`] looks: the given key, the variable, the keychain.
    async fn find(&self, kind: SourceKind) -> Option<ApiKey> {
        if let KeyStore::Given(k) = self {
            return Some(k.clone());
        }
        let from_env = match kind {
            SourceKind::Linear => crate::seal::env_linear_api_key(),
            SourceKind::Github => crate::seal::env_github_token(),
        };
        if let Some(k) = from_env {
            return Some(ApiKey { secret: k, from: kind.env_var() });
        }
        let KeyStore::Keychain { service } = self else { return None };
        let service = service.clone();
        let found = tokio::task::spawn_blocking(move || {
            let key = crate::secrets::load_secret(&service, account_of(kind))?;
            let origin = match kind {
                SourceKind::Github if key.is_some() => crate::secrets::load_secret(&service, GITHUB_ORIGIN_ACCOUNT)?,
                _ => None,
            };
            Ok::<_, Error>((key, origin))
        })
        .await;
        match found {
            Ok(Ok((Some(k), origin))) if !k.trim().is_empty() => {
                let from = if origin.is_some() { "keychain (imported from gh)" } else { "keychain" };
                Some(ApiKey { secret: k.trim().to_string(), from })
            }
            Ok(Ok(_)) => None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, tracker = kind.tracker(), "the keychain could not be read");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "the keychain lookup did not finish");
                None
            }
        }
    }

    /// The Linear key ([`KeyStore::key`]).
    pub async fn linear(&self) -> Option<ApiKey> {
        self.key(SourceKind::Linear).await
    }

    /// The GitHub token ([`KeyStore::key`]).
    pub async fn github(&self) -> Option<ApiKey> {
        self.key(SourceKind::Github).await
    }
}

/// Keeps `kind`'s credential in the keychain of `service`. `from_gh`: it was imported from
/// `gh auth token` (status says so).
pub fn store_key(service: &str, kind: SourceKind, key: &str, from_gh: bool) -> Result<()> {
    crate::secrets::store_secret(service, account_of(kind), key.trim())?;
    if kind == SourceKind::Github {
        if from_gh {
            crate::secrets::store_secret(service, GITHUB_ORIGIN_ACCOUNT, "gh auth token")?;
        } else {
            crate::secrets::delete_secret(service, GITHUB_ORIGIN_ACCOUNT)?;
        }
    }
    Ok(())
}

/// Keeps the Linear key in the keychain of `service`.
pub fn store_linear_key(service: &str, key: &str) -> Result<()> {
    store_key(service, SourceKind::Linear, key, false)
}

/// Forgets `kind`'s credential (no error if there was none).
pub fn delete_key(service: &str, kind: SourceKind) -> Result<()> {
    if kind == SourceKind::Github {
        crate::secrets::delete_secret(service, GITHUB_ORIGIN_ACCOUNT)?;
    }
    crate::secrets::delete_secret(service, account_of(kind))
}

/// Forgets the Linear key (no error if there was none).
pub fn delete_linear_key(service: &str) -> Result<()> {
    delete_key(service, SourceKind::Linear)
}

/// The token the GitHub CLI is logged in with (`gh auth token`), if `gh` is installed and
/// logged in: offered as an import, never taken on its own. Bounded; `gh`'s output is read
/// from a pipe, never printed.
pub async fn gh_token() -> Option<String> {
    let run = tokio::process::Command::new("gh")
        .args(["auth", "token"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Ok(out)) if out.status.success() => {
            let token = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (!token.is_empty() && !token.contains(char::is_whitespace)).then_some(token)
        }
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "gh is not available");
            None
        }
        Err(_) => {
            tracing::warn!("`gh auth token` did not answer within 10s");
            None
        }
    }
}
