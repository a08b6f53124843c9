//! Keychain calls, run off the async workers and bounded in time.

use std::time::Duration;

use devpilot_store::error::{Error, Result};

/// How long a keychain call may take.
const KEYCHAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a blocking keychain call off the async workers, with a time limit: a keychain that
/// waits for an unlock prompt nobody answers must not hang the app.
pub(crate) async fn keychain<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    match bounded(tokio::task::spawn_blocking(f)).await? {
        Ok(r) => r,
        Err(e) => Err(Error::Keychain(format!("the keychain call failed: {e}"))),
    }
}

/// A keychain call, given [`KEYCHAIN_TIMEOUT`] to answer.
pub(crate) async fn bounded<T>(call: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(KEYCHAIN_TIMEOUT, call).await.map_err(|_| {
        Error::Keychain(format!(
            "the keychain did not answer within {}s; it may be locked and waiting for a password prompt: unlock it, then try again",
            KEYCHAIN_TIMEOUT.as_secs()
        ))
    })
}
