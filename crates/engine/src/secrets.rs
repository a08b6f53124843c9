//! The database password (and the trackers' API keys) in the OS keychain (Secret Service on Linux, Keychain on macOS,
//! Credential Manager on Windows), through `keyring`'s platform stores, enabled explicitly
//! by its `v1` feature: there is no in-memory fallback and never a plain-text one.
//!
//! The keychain calls block (D-Bus round trips), so async callers run them with
//! `spawn_blocking`.

use devpilot_store::db::DbUrl;
use devpilot_store::error::{Error, Result};

/// The keychain service name for release builds; dev builds pass their own.
pub const SERVICE: &str = "devpilot";

/// The keychain account for a database: `user@host:port/db`.
pub fn account(url: &DbUrl) -> String {
    format!("{}@{}", url.user(), url.target())
}

/// Stores the password for `url`'s user and database.
pub fn store_password(service: &str, url: &DbUrl, password: &str) -> Result<()> {
    store_secret(service, &account(url), password)
}

/// The stored password, or `None` if there is none.
pub fn load_password(service: &str, url: &DbUrl) -> Result<Option<String>> {
    load_secret(service, &account(url))
}

/// Whether a password is stored for `url`, found by its attributes alone: the secret itself
/// is never read (nor unlocked) for this.
pub fn has_password(service: &str, url: &DbUrl) -> Result<bool> {
    has_secret(service, &account(url))
}

/// Whether a secret is stored under `account` (the secret itself is never read).
pub fn has_secret(service: &str, account: &str) -> Result<bool> {
    match keyring::Entry::new(service, account).map_err(explain)?.inner.get_attributes() {
        Ok(_) => Ok(true),
        Err(keyring::Error::NoEntry) => Ok(false),
        Err(e) => Err(explain(e)),
    }
}

/// Forgets the stored password (no error if there was none).
pub fn delete_password(service: &str, url: &DbUrl) -> Result<()> {
    delete_secret(service, &account(url))
}

/// Stores `secret` under `account` (an API key: see [`crate::sources`]).
pub fn store_secret(service: &str, account: &str, secret: &str) -> Result<()> {
    keyring::Entry::new(service, account).map_err(explain)?.set_password(secret).map_err(explain)
}

/// The secret under `account`, or `None` if there is none.
pub fn load_secret(service: &str, account: &str) -> Result<Option<String>> {
    match keyring::Entry::new(service, account).map_err(explain)?.get_password() {
        Ok(p) => Ok(Some(p)),
        Err(keyring::Error::NoEntry) => Ok(None),
        Err(e) => Err(explain(e)),
    }
}

/// Forgets the secret under `account` (no error if there was none).
pub fn delete_secret(service: &str, account: &str) -> Result<()> {
    match keyring::Entry::new(service, account).map_err(explain)?.delete_credential() {
        Ok(()) | Err(keyring::Error::NoEntry) => Ok(()),
        Err(e) => Err(explain(e)),
    }
}

/// Whether a keychain can be reached at all.
pub fn available() -> Result<()> {
    keyring::Entry::store_status().as_ref().map_err(|e| explain(clone_err(e)))?;
    Ok(())
}

fn clone_err(e: &keyring::Error) -> keyring::Error {
    keyring::Error::PlatformFailure(e.to_string().into())
}

/// Keychain errors in words, with what to do. Never includes the secret.
fn explain(e: keyring::Error) -> Error {
    use keyring::Error as K;
    let hint = "start or unlock your keyring (GNOME Keyring, KWallet or another Secret Service), then try again";
    match e {
        K::NoDefaultStore => {
            Error::Keychain(format!("no OS keychain is available: {hint}; restart DevPilot afterwards"))
        }
        K::NoStorageAccess(inner) => {
            Error::Keychain(format!("the keychain is locked or refused access ({inner}): {hint}"))
        }
        K::PlatformFailure(inner) => Error::Keychain(format!("the keychain is unavailable ({inner}): {hint}")),
        other => Error::Keychain(other.to_string()),
    }
}
