//! Keychain calls, run off the async workers and bounded in time.

use std::time::Duration;

use devpilot_store::error::{Error, Result};

/// How long a keychain call may take.
pub(crate) const KEYCHAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a blocking keychain call off the async workers, with a time limit: a keychain that
/// waits for an unlock prompt nobody answers must not hang the app.
pub(crate) async fn keychain<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    match tokio::time::timeout(KEYCHAIN_TIMEOUT, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(Error::Keychain(format!("the keychain call failed: {e}"))),
        Err(_) => Err(Error::Keychain(format!(
            "the keychain did not answer within {}s; it may be locked and waiting for a password prompt: unlock it, then try again",
            KEYCHAIN_TIMEOUT.as_secs()
        ))),
    }
}
