//! Push dispatch on PostgreSQL: LISTEN for the queue's NOTIFY hints on one dedicated
//! connection. A hint only means "poll now"; polling remains the fallback, so a lost
//! notification costs latency, never a job. After a reconnect (a database restart) we hint
//! once, because notifications sent while we were away are gone.

use std::time::Duration;

use sea_orm::sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::mpsc;

use crate::db::DbUrl;

/// The channel the schema's trigger notifies on.
pub const CHANNEL: &str = "devpilot_dispatch";

/// Starts a listener for `orchestrator_id`. Returns `None` on SQLite. The listener has its
/// own one-connection pool, so a machine holds at most its query pool plus this one.
pub fn spawn(url: &DbUrl, orchestrator_id: &str) -> Option<mpsc::Receiver<()>> {
    if url.is_sqlite() {
        return None;
    }
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy(&url.expose())
        .ok()?;
    let (tx, rx) = mpsc::channel(1);
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
            let _ = tx.try_send(());
            loop {
                match listener.try_recv().await {
                    Ok(Some(n)) => {
                        if n.payload() == orch {
                            // Full channel means a wake-up is already pending: fine.
                            let _ = tx.try_send(());
                        }
                    }
                    Ok(None) => {
                        // Connection lost; sqlx reconnects and re-LISTENs on the next call.
                        let _ = tx.try_send(());
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
