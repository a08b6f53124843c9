//! Push dispatch on PostgreSQL: LISTEN for the queue's NOTIFY hints on one dedicated
//! connection. A hint only means "poll now"; polling remains the fallback, so a lost
//! notification costs latency, never a job. Once LISTEN is in place (at start, and after a
//! reconnect) we hint [`Hint::Resync`]: notifications sent while we were not listening are
//! gone, and one of them may have been a cancel or a release asked of a job this machine
//! holds, which it would otherwise learn only at its next heartbeat.
//!
//! The schema's trigger says *when* a job is claimable (see [`HintPayload`]): a job that is
//! due now wakes the machine; a scheduled one (or one waiting out a retry backoff) sets its
//! timer, so it wakes when the job is due and not before; a cancel asked for a running job
//! makes its holder renew at once, which is where it learns of the cancel (a release asked
//! of a machine works the same way).
//!
//! Through a transaction-mode pooler a LISTEN hears nothing: the session that ran it goes
//! back to the pool. So each new connection first LISTENs on a channel of its own and sends
//! itself a NOTIFY from the machine's query connection. Heard: [`Hint::Direct`], and the queue
//! may prepare its statements. Not heard, twice: [`Hint::Deaf`], and the listener ends.

use std::time::Duration;

use sea_orm::sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::mpsc;

use crate::db::DbUrl;
use crate::error::{Error, Result};
use crate::Queue;

/// The channel every orchestrator's hints went to before the schema gave each orchestrator
/// its own (migration `m20261204_000001_channels`). A listener still LISTENs on it, so a
/// database not yet migrated keeps waking its machines.
pub const CHANNEL: &str = "devpilot_dispatch";

/// The orchestrator's own channel, as the schema's `devpilot_channel()` names it: only its
/// machines hear its hints, instead of every listener of the database.
pub fn channel_of(orchestrator_id: &str) -> String {
    use md5::{Digest, Md5};
    let digest = Md5::digest(orchestrator_id.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{CHANNEL}_{hex}")
}

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
    /// LISTEN hears nothing, not even its own probe: the connection goes through a
    /// transaction-mode pooler. The listener has stopped; the machine polls, and its queue
    /// prepares no statement (see [`crate::Queue::pooled`]).
    Deaf,
    /// LISTEN heard its own probe: nothing between here and the database moves a session to
    /// another server, so the queue may prepare its statements.
    Direct,
}

/// How long a probe NOTIFY may take to come back before LISTEN is judged deaf. A direct
/// connection hears it in milliseconds; a loaded machine, in well under a second.
const PROBE_WAIT: Duration = Duration::from_secs(5);

impl Hint {
    /// Reads a payload of the trigger (see [`HintPayload`]). `None` for another orchestrator's
    /// hint (or one this version does not know).
    pub fn parse(payload: &str, orchestrator_id: &str) -> Option<Hint> {
        HintPayload::parse(payload, orchestrator_id).map(Hint::from)
    }
}

/// A NOTIFY payload, the one grammar of the queue's hints: `ORCH` is [`HintPayload::Work`], then
/// `ORCH due MS`, `ORCH cancel` and `ORCH release`, where `ORCH` is the orchestrator id (which
/// may hold spaces, so a payload is read for a given orchestrator). [`HintPayload::parse`] and
/// [`HintPayload::to_payload`] are each other's inverse.
///
/// Producers, which must write exactly these: the PL/pgSQL trigger functions of migration
/// `m20261204_000001_channels` (`devpilot_notify_claimable`: `ORCH` or `ORCH due wait_ms`,
/// the latter only when `wait_ms > 0`; `devpilot_notify_cancel`: `ORCH cancel`;
/// `devpilot_notify_release`: `ORCH release`), and before it `m20261129_000001_dispatch`,
/// `m20261202_000001_job_model` and `m20261203_000001_agents` on the shared channel. The
/// LISTEN probe's empty payload ([`Queue::notify`]) is not a hint: it is told by its channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintPayload {
    /// `ORCH`: a job is claimable now.
    Work,
    /// `ORCH due MS`: a job becomes claimable in MS milliseconds.
    DueInMs(u64),
    /// `ORCH cancel`: a cancel was asked for a running job.
    Cancel,
    /// `ORCH release`: a hand-off was asked of a machine.
    Release,
}

impl HintPayload {
    /// The word after the orchestrator id in a [`HintPayload::DueInMs`], before the milliseconds.
    pub const DUE: &'static str = "due";
    /// The word after the orchestrator id in a [`HintPayload::Cancel`].
    pub const CANCEL: &'static str = "cancel";
    /// The word after the orchestrator id in a [`HintPayload::Release`].
    pub const RELEASE: &'static str = "release";

    /// Reads `payload` as one for `orchestrator_id`. `None` for another orchestrator's (even
    /// one whose id starts with this one), or one this version does not know.
    pub fn parse(payload: &str, orchestrator_id: &str) -> Option<HintPayload> {
        if payload == orchestrator_id {
            return Some(HintPayload::Work);
        }
        let rest = payload.strip_prefix(orchestrator_id)?.strip_prefix(' ')?;
        match rest {
            Self::CANCEL => return Some(HintPayload::Cancel),
            Self::RELEASE => return Some(HintPayload::Release),
            _ => {}
        }
        let ms = rest.strip_prefix(Self::DUE)?.strip_prefix(' ')?.parse().ok()?;
        Some(HintPayload::DueInMs(ms))
    }

    /// The payload the triggers send for this, to `orchestrator_id`'s machines.
    pub fn to_payload(self, orchestrator_id: &str) -> String {
        match self {
            HintPayload::Work => orchestrator_id.to_string(),
            HintPayload::DueInMs(ms) => format!("{orchestrator_id} {} {ms}", Self::DUE),
            HintPayload::Cancel => format!("{orchestrator_id} {}", Self::CANCEL),
            HintPayload::Release => format!("{orchestrator_id} {}", Self::RELEASE),
        }
    }
}

impl From<HintPayload> for Hint {
    fn from(p: HintPayload) -> Hint {
        match p {
            HintPayload::Work => Hint::Work,
            HintPayload::DueInMs(ms) => Hint::DueIn(Duration::from_millis(ms)),
            HintPayload::Cancel => Hint::Cancel,
            HintPayload::Release => Hint::Release,
        }
    }
}

/// Starts a listener for `orchestrator_id`. Returns `None` on SQLite. The listener has its
/// own one-connection pool, so a machine holds at most its query pool plus this one.
pub fn spawn(url: &DbUrl, orchestrator_id: &str, queue: &Queue) -> Option<mpsc::Receiver<Hint>> {
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
    tokio::spawn(listen_loop(pool, queue.clone(), orch, tx));
    Some(rx)
}

/// Listens until the machine stops (its receiver is gone), reconnecting with a backoff. Each
/// new connection is first probed: one that hears its own probe is direct (or session-pooled),
/// and only then does it LISTEN for the queue's hints and say [`Hint::Direct`]. One that fails
/// the probe twice in a row, on two connections, is a transaction-mode pooler's: it says
/// [`Hint::Deaf`] and ends, having never LISTENed on the queue's channel there.
async fn listen_loop(pool: sea_orm::sqlx::PgPool, queue: Queue, orch: String, tx: mpsc::Sender<Hint>) {
    const FIRST: Duration = Duration::from_millis(200);
    let mut wait = FIRST;
    let mut deaf = 0;
    while !tx.is_closed() {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await.map_err(driver)?;
            let heard = probe(&mut listener, &queue, &orch, &tx).await?;
            if heard {
                listener.listen_all([CHANNEL, &channel_of(&orch)]).await.map_err(driver)?;
            }
            Ok::<_, Error>((listener, heard))
        };
        let mut listener = match connected.await {
            Ok((l, true)) => l,
            Ok((_, false)) if deaf == 0 => {
                deaf += 1;
                continue;
            }
            Ok((_, false)) => {
                tracing::warn!(
                    "LISTEN hears nothing on this connection (a transaction-mode pooler such as \
                     PgBouncer?): polling only, with no prepared statements; add pooled=true to the \
                     database URL (or set poll_only) to start that way"
                );
                let _ = tx.send(Hint::Deaf).await;
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN connection failed; polling only for now");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        (wait, deaf) = (FIRST, 0);
        let _ = tx.send(Hint::Direct).await;
        // We may have missed hints while (re)connecting.
        let _ = tx.try_send(Hint::Resync);
        relay(&mut listener, &orch, &tx).await;
    }
}

/// Passes the orchestrator's hints on until the connection breaks for good or the machine
/// stops listening.
async fn relay(listener: &mut PgListener, orch: &str, tx: &mpsc::Sender<Hint>) {
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => {
                if let Some(hint) = Hint::parse(n.payload(), orch) {
                    // A full channel means plenty of wake-ups are pending: fine.
                    let _ = tx.try_send(hint);
                }
            }
            Ok(None) => {
                // Connection lost. sqlx reconnects and re-LISTENs on the listener's next use:
                // make that now, and only then resync. A resync said before LISTEN is back
                // would let a hint sent in between go unheard until the next poll. If the
                // database is not back yet, the loop above reconnects (and resyncs) with its
                // backoff.
                if let Err(e) = sea_orm::sqlx::Executor::execute(&mut *listener, "SELECT 1").await {
                    tracing::debug!(error = %e, "LISTEN connection lost; reconnecting");
                    return;
                }
                let _ = tx.try_send(Hint::Resync);
            }
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN connection broke");
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// A LISTEN connection's driver error as the store's error (classified, source kept).
fn driver(e: sea_orm::sqlx::Error) -> Error {
    Error::from(sea_orm::DbErr::Conn(sea_orm::RuntimeErr::SqlxError(std::sync::Arc::new(e))))
}

/// Whether this listener hears a NOTIFY sent from another connection: on a channel of its
/// own, so no other machine wakes for it. Through a transaction-mode pooler the LISTEN stays
/// on a server connection this client no longer holds, and the probe never arrives. Hints
/// for the orchestrator that arrive meanwhile are passed on.
async fn probe(listener: &mut PgListener, queue: &Queue, orch: &str, tx: &mpsc::Sender<Hint>) -> Result<bool> {
    let channel = format!("devpilot_probe_{:016x}", rand::random::<u64>());
    listener.listen(&channel).await.map_err(driver)?;
    // Sent on the machine's query connection: a session hears its own NOTIFY, which proves
    // nothing about a pooler, and a connection of the probe's own would break the machine's
    // budget of two.
    queue.notify(&channel).await?;
    let deadline = tokio::time::Instant::now() + PROBE_WAIT;
    let heard = loop {
        match tokio::time::timeout_at(deadline, listener.recv()).await {
            Err(_) => break false,
            Ok(n) => {
                let n = n.map_err(driver)?;
                if n.channel() == channel {
                    break true;
                }
                if let Some(hint) = Hint::parse(n.payload(), orch) {
                    let _ = tx.try_send(hint);
                }
            }
        }
    };
    listener.unlisten(&channel).await.map_err(driver)?;
    Ok(heard)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The orchestrator's channel is the one the schema's md5() names, and fits PostgreSQL's
    /// 63-byte limit whatever the id's length.
    #[test]
    fn channel_names_match_the_schema() {
        // SELECT 'devpilot_dispatch_' || md5('eng') in PostgreSQL:
        assert_eq!(channel_of("eng"), "devpilot_dispatch_74e6a8b111ea7da1a7d0a596f4c35208");
        assert_eq!(channel_of(&"x".repeat(500)).len(), 50);
    }

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

    /// Every payload reads back as what wrote it, for ids with spaces or another's as prefix,
    /// and a trigger's text reads and writes back unchanged.
    #[test]
    fn payloads_round_trip() {
        let every = [
            HintPayload::Work,
            HintPayload::DueInMs(0),
            HintPayload::DueInMs(40_000),
            HintPayload::Cancel,
            HintPayload::Release,
        ];
        for p in every {
            // A new variant fails to compile here until it is in `every`.
            match p {
                HintPayload::Work | HintPayload::DueInMs(_) | HintPayload::Cancel | HintPayload::Release => {}
            }
            for orch in ["team", "team cancel", "a b", "é"] {
                let text = p.to_payload(orch);
                assert_eq!(HintPayload::parse(&text, orch), Some(p), "{text:?}");
                assert_eq!(HintPayload::parse(&text, "other"), None, "{text:?}");
            }
        }
        for text in ["team", "team due 40000", "team cancel", "team release"] {
            assert_eq!(HintPayload::parse(text, "team").map(|p| p.to_payload("team")).as_deref(), Some(text));
        }
    }
}
