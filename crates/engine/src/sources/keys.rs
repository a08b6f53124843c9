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
/// The keychain account of the github.com token (one per machine, for every source and pull
/// request on github.com). A token for another host (GitHub Enterprise) has an account of its
/// own ([`github_account`]): github.com's token is never sent anywhere else.
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

/// The host (and port, when it names one) of an API address, lowercase.
pub fn host_of(api_url: &str) -> Option<String> {
    let url = url::Url::parse(api_url.trim()).ok()?;
    let host = url.host_str()?.to_lowercase();
    Some(match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    })
}

/// Whether `api_url` is github.com's API: `api.github.com`, or the address
/// `DEVPILOT_GITHUB_API_URL` puts in its place (a proxy of github.com, or the tests' stand-in).
pub fn is_github_com(api_url: &str) -> bool {
    let Some(host) = host_of(api_url) else { return false };
    let own = host_of(super::settings::GITHUB_API_URL);
    let stand_in = std::env::var("DEVPILOT_GITHUB_API_URL").ok().and_then(|u| host_of(&u));
    Some(&host) == own.as_ref() || Some(&host) == stand_in.as_ref()
}

/// What a source with no credential here says: where to put one (for a GitHub source on
/// another host than github.com, a token of that host's own: github.com's is never sent there).
pub fn no_key_here(s: &super::settings::SourceSettings) -> String {
    let kind = s.kind;
    if kind == SourceKind::Github && !is_github_com(&s.api_url()) {
        let host = host_of(&s.api_url()).unwrap_or_default();
        return format!(
            "no GitHub token for {host} on this machine (github.com's is never sent to another host): \
             `devpilot login --github --api-url {}`, Settings → Sources, or {}",
            s.api_url(),
            crate::seal::github_token_var(&host)
        );
    }
    format!(
        "no {} {} on this machine: `devpilot login --{}`, Settings → Sources, or {}",
        kind.tracker(),
        kind.credential(),
        kind.as_str(),
        kind.env_var()
    )
}

/// The keychain account of the GitHub token for the API at `api_url`: [`GITHUB_ACCOUNT`] for
/// github.com's, `github-token@HOST` for any other host.
pub fn github_account(api_url: &str) -> String {
    if is_github_com(api_url) {
        return GITHUB_ACCOUNT.to_string();
    }
    format!("{GITHUB_ACCOUNT}@{}", host_of(api_url).unwrap_or_default())
}

/// This machine's GitHub tokens, by the API host (and port, as [`host_of`] writes them) each
/// belongs to: a token is sent only to its own host.
pub type GithubTokens = std::collections::BTreeMap<String, ApiKey>;

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

    /// `LINEAR_API_KEY`, `GITHUB_TOKEN`, `GITHUB_TOKEN_<HOST>`, `keychain` or
    /// `keychain (imported from gh)`.
    pub fn from(&self) -> &'static str {
        self.from
    }
}

impl KeyStore {
    /// `kind`'s credential, if this machine has one (GitHub: github.com's token). A keychain
    /// that cannot be reached is logged and counts as no key: the source says so, and the rest
    /// of the machine works on.
    pub async fn key(&self, kind: SourceKind) -> Option<ApiKey> {
        let account = account_of(kind).to_string();
        self.learned(self.find(kind, account, true).await)
    }

    /// The credential of source `s`: the Linear key, or the GitHub token for the host of the
    /// source's API (github.com's only for github.com: [`github_account`]).
    pub async fn for_source(&self, s: &super::settings::SourceSettings) -> Option<ApiKey> {
        match s.kind {
            SourceKind::Linear => self.key(SourceKind::Linear).await,
            SourceKind::Github => self.github_at(&s.api_url()).await,
        }
    }

    /// The GitHub token for the API at `api_url`: `GITHUB_TOKEN` or the keychain's
    /// [`GITHUB_ACCOUNT`] for github.com; for another host, its own variable
    /// (`GITHUB_TOKEN_<HOST>`, see [`crate::seal::github_token_var`]) or the keychain's
    /// `github-token@HOST`.
    pub async fn github_at(&self, api_url: &str) -> Option<ApiKey> {
        let github_com = is_github_com(api_url);
        if !github_com && matches!(self, KeyStore::Keychain { .. }) {
            let from_env = host_of(api_url).and_then(|h| crate::seal::env_github_token_at(&h));
            if let Some(k) = from_env {
                return self.learned(Some(ApiKey { secret: k, from: "GITHUB_TOKEN_<HOST>" }));
            }
        }
        self.learned(self.find(SourceKind::Github, github_account(api_url), github_com).await)
    }

    /// Whatever this machine holds, no agent text it sends out may carry.
    fn learned(&self, key: Option<ApiKey>) -> Option<ApiKey> {
        if let Some(k) = &key {
            crate::redact::known().learn(k.secret());
        }
        key
    }

    /// Where a credential is looked for: the given key, the tracker's variable (`env`: for
    /// github.com's token and Linear's key only), the keychain's `account`.
    async fn find(&self, kind: SourceKind, account: String, env: bool) -> Option<ApiKey> {
        if let KeyStore::Given(k) = self {
            return Some(k.clone());
        }
        let from_env = match kind {
            _ if !env => None,
            SourceKind::Linear => crate::seal::env_linear_api_key(),
            SourceKind::Github => crate::seal::env_github_token(),
        };
        if let Some(k) = from_env {
            return Some(ApiKey { secret: k, from: kind.env_var() });
        }
        let KeyStore::Keychain { service } = self else { return None };
        let service = service.clone();
        let imported = account == GITHUB_ACCOUNT;
        let found = tokio::task::spawn_blocking(move || {
            let key = crate::secrets::load_secret(&service, &account)?;
            let origin = match kind {
                SourceKind::Github if imported && key.is_some() => {
                    crate::secrets::load_secret(&service, GITHUB_ORIGIN_ACCOUNT)?
                }
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

/// Keeps the GitHub token for the API at `api_url` in the keychain of `service`: under
/// [`GITHUB_ACCOUNT`] for github.com, `github-token@HOST` for another host.
pub fn store_github_token_at(service: &str, api_url: &str, token: &str, from_gh: bool) -> Result<()> {
    if is_github_com(api_url) {
        return store_key(service, SourceKind::Github, token, from_gh);
    }
    crate::secrets::store_secret(service, &github_account(api_url), token.trim())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// github.com's token has its own account; any other host's token lives under an account
    /// naming the host (and port), so one is never read for the other.
    #[test]
    fn each_github_host_has_its_own_account() {
        assert!(is_github_com("https://api.github.com") && is_github_com("https://API.github.com/"));
        assert_eq!(github_account("https://api.github.com"), GITHUB_ACCOUNT);
        assert!(!is_github_com("https://ghe.corp/api/v3"));
        assert_eq!(github_account("https://ghe.corp/api/v3"), "github-token@ghe.corp");
        assert_eq!(github_account("https://ghe.corp:8443/api/v3"), "github-token@ghe.corp:8443");
        assert_eq!(host_of("https://api.github.com.evil.example"), Some("api.github.com.evil.example".into()));
        assert!(!is_github_com("https://api.github.com.evil.example"));
        assert_eq!(crate::seal::github_token_var("ghe.corp:8443"), "GITHUB_TOKEN_GHE_CORP_8443");
    }
}
