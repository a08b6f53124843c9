//! Push dispatch on PostgreSQL: LISTEN for the queue's NOTIFY hints on one dedicated
//! connection. A hint only means "poll now"; polling remains the fallback, so a lost
//! notification costs latency, never a job. Once LISTEN is in place (at start, and after a
//! reconnect) we hint [`Hint::Resync`]: notifications sent while we were not listening are
//! gone, and one of them may have been a cancel or a release asked of a job this machine
//! holds, which it would otherwise learn only at its next heartbeat.
//!
//! The schema's trigger says *when* a job is claimable (see [`Hint::parse`]): a job that is
//! due now wakes the machine; a scheduled one (or one waiting out a retry backoff) sets its
//! timer, so it wakes when the job is due and not before; a cancel asked for a running job
//! makes its holder renew at once, which is where it learns of the cancel (a release asked
//! of a machine works the same way).

use std::time::Duration;

use sea_orm::sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::mpsc;

use crate::db::DbUrl;

/// The channel the schema's trigger notifies on.
pub const CHANNEL: &str = "devpilot_dispatch";

/// What a notification means for a machine of the orchestrator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// Something is claimable now (or may be: after a reconnect): poll.
    Work,
    /// A job becomes claimable in this long: poll then.
    DueIn(Duration),
    /// A cancel was asked for a running job: holders renew now.
    Cancel,
    /// A hand-off was asked of a machine: holders renew now, and the one asked learns it.
    Release,
    /// LISTEN is (again) in place, and anything may have been missed: poll, and renew.
    Resync,
}

impl Hint {
    /// Reads a payload of the trigger: `ORCH`, `ORCH due MS`, `ORCH cancel` or `ORCH release`. `None` for
    /// another orchestrator's hint (or one this version does not know).
    pub fn parse(payload: &str, orchestrator_id: &str) -> Option<Hint> {
        if payload == orchestrator_id {
            return Some(Hint::Work);
        }
        let rest = payload.strip_prefix(orchestrator_id)?.strip_prefix(' ')?;
        match rest {
            "cancel" => return Some(Hint::Cancel),
            "release" => return Some(Hint::Release),
            _ => {}
        }
        let ms: u64 = rest.strip_prefix("due ")?.parse().ok()?;
        Some(Hint::DueIn(Duration::from_millis(ms)))
    }
}

/// Starts a listener for `orchestrator_id`. Returns `None` on SQLite. The listener has its
/// own one-connection pool, so a machine holds at most its query pool plus this one.
pub fn spawn(url: &DbUrl, orchestrator_id: &str) -> Option<mpsc::Receiver<Hint>> {
    if url.is_sqlite() {
        return None;
    }
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy(&url.expose())
        .ok()?;
    // Room for a few hints: a due time must not be lost behind a pending "poll now".
    let (tx, rx) = mpsc::channel(16);
    let orch = orchestrator_id.to_string();
    tokio::spawn(async move {
        let mut wait = Duration::from_millis(200);
        loop {
            if tx.is_closed() {
                return;
            }
            let mut listener = match PgListener::connect_with(&pool).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!(error = %e, "LISTEN connection failed; polling only for now");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            if let Err(e) = listener.listen(CHANNEL).await {
                tracing::debug!(error = %e, "LISTEN failed; polling only for now");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
                continue;
            }
            wait = Duration::from_millis(200);
            // We may have missed hints while (re)connecting.
            let _ = tx.try_send(Hint::Resync);
            loop {
                match listener.try_recv().await {
                    Ok(Some(n)) => {
                        if let Some(hint) = Hint::parse(n.payload(), &orch) {
                            // A full channel means plenty of wake-ups are pending: fine.
                            let _ = tx.try_send(hint);
                        }
                    }
                    Ok(None) => {
                        // Connection lost; sqlx reconnects and re-LISTENs on the next call.
                        let _ = tx.try_send(Hint::Resync);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "LISTEN connection broke");
                        break;
                    }
                }
                if tx.is_closed() {
                    return;
                }
            }
        }
    });
    Some(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The triggers' four payloads parse; another orchestrator's (even a prefix) does not.
    #[test]
    fn payloads_parse() {
        assert_eq!(Hint::parse("team", "team"), Some(Hint::Work));
        assert_eq!(Hint::parse("team due 40000", "team"), Some(Hint::DueIn(Duration::from_secs(40))));
        assert_eq!(Hint::parse("team cancel", "team"), Some(Hint::Cancel));
        assert_eq!(Hint::parse("team release", "team"), Some(Hint::Release));
        assert_eq!(Hint::parse("teammate", "team"), None);
        assert_eq!(Hint::parse("teammate due 5", "team"), None);
        assert_eq!(Hint::parse("other", "team"), None);
        assert_eq!(Hint::parse("team due soon", "team"), None);
    }
}
