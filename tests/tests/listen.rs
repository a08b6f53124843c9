//! Push dispatch on PostgreSQL: NOTIFY wakes an idle machine at once, polling stays the
//! fallback, and LISTEN comes back after the database restarts.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, Event, RunConfig, StopMode};
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::listen::Hint;
use devpilot_store::Queue;
use devpilot_tests::PgCluster;
use sea_orm::ConnectionTrait;
use serde_json::json;
use tokio::sync::mpsc;

async fn wait_claimed(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    id: i64,
    limit: Duration,
) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        let left = limit.checked_sub(t0.elapsed())?;
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(Event::Claimed { job })) if job.id == id => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

/// The listener's hints between it and the machine: each is passed on as it comes, then
/// copied to the test with the moment it was passed on.
struct Tap {
    seen: mpsc::UnboundedReceiver<(Hint, Instant)>,
    to_machine: mpsc::Sender<Hint>,
}

impl Tap {
    fn new(mut from: mpsc::Receiver<Hint>) -> (Tap, mpsc::Receiver<Hint>) {
        let (to_machine, machine_rx) = mpsc::channel(16);
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let tx = to_machine.clone();
        tokio::spawn(async move {
            while let Some(h) = from.recv().await {
                if tx.send(h).await.is_err() {
                    break;
                }
                let _ = seen_tx.send((h, Instant::now()));
            }
        });
        (Tap { seen, to_machine }, machine_rx)
    }

    /// Waits for a hint that `want` accepts to be passed on; returns it and when.
    async fn wait(&mut self, want: impl Fn(Hint) -> bool, limit: Duration) -> Option<(Hint, Instant)> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.seen.recv()).await {
                Ok(Some((h, at))) if want(h) => return Some((h, at)),
                Ok(Some(_)) => continue,
                _ => return None,
            }
        }
    }

    /// Whether the machine has taken every hint passed on so far (it acts on one as it takes
    /// it, before it reads its next command).
    fn drained(&self) -> bool {
        self.to_machine.capacity() == self.to_machine.max_capacity()
    }
}

/// Waits until the machine has taken every hint passed on and its next poll is its timer's,
/// `at_least` away: nothing is in flight or about to start, so only a hint can make it poll
/// sooner.
async fn idle_for(h: &orchestrator::Handle, tap: Option<&Tap>, at_least: Duration) {
    let idle = devpilot_tests::wait_for(Duration::from_secs(30), || async {
        tap.is_none_or(Tap::drained) && h.next_poll().await.is_some_and(|d| d >= at_least)
    })
    .await;
    assert!(idle, "the machine went idle with its next poll {at_least:?} or more away");
}

/// An idle machine whose poll has backed off to 30 s picks up a new job within a second
/// through NOTIFY, before and after an immediate PostgreSQL restart; with LISTEN off
/// (poll-only) the same machine waits for its poll. Each job is enqueued only once LISTEN is
/// in place and the machine's next poll is its timer's, 20 s or more away: a claim within
/// seconds came from the notification, which the test sees reach the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_idle_machines_and_survives_a_restart() {
    let pg = PgCluster::start();
    let admin = DbUrl::parse(&pg.url("postgres")).unwrap();
    let conn = db::connect(&admin, &PoolSettings::default()).await.unwrap();
    conn.execute_unprepared("CREATE DATABASE push").await.unwrap();
    conn.close().await.unwrap();
    let url = DbUrl::parse(&pg.url("push")).unwrap();
    let conn = db::connect(&url, &PoolSettings::default()).await.unwrap();
    db::migrate(&url, &conn).await.unwrap();
    let queue = Queue::new(conn);
    let dir = tempfile::tempdir().unwrap();

    let start = |orch: &str, listen: bool| {
        let mut cfg = RunConfig::new(orch, "idle-box", AgentSpec::NoOp, dir.path().to_path_buf());
        cfg.poll_interval = Duration::from_secs(30);
        cfg.max_poll_interval = Duration::from_secs(30);
        let (tap, hints) = match listen {
            true => {
                let (tap, hints) = Tap::new(devpilot_store::listen::spawn(&url, orch, &queue).unwrap());
                (Some(tap), Some(hints))
            }
            false => (None, None),
        };
        let (h, j) = orchestrator::spawn(queue.clone(), cfg, hints);
        (h, j, tap)
    };
    let quiet = Duration::from_secs(20);
    let is_work = |h: Hint| h == Hint::Work;

    let (h, _j, tap) = start("push", true);
    let mut tap = tap.unwrap();
    let mut events = h.subscribe();
    // The listener says Resync once LISTEN is in place; the machine polls for it, and for its
    // start, and goes idle.
    assert!(tap.wait(|h| h == Hint::Resync, Duration::from_secs(20)).await.is_some(), "LISTEN is in place");
    idle_for(&h, Some(&tap), quiet).await;
    let enqueued = Instant::now();
    let id = queue.enqueue("push", &json!({"n": 1})).await.unwrap();
    let took = wait_claimed(&mut events, id, Duration::from_secs(10)).await;
    assert!(took.is_some_and(|t| t < Duration::from_secs(3)), "NOTIFY woke the machine: {took:?}");
    let work = tap.wait(is_work, Duration::ZERO).await;
    assert!(work.is_some_and(|(_, at)| at >= enqueued), "the job's notification reached the machine");

    tokio::task::block_in_place(|| pg.restart_immediate());
    // The listener notices the lost connection and LISTENs again on a new one, and only then
    // says Resync: a hint sent right after it (a job due in an hour, which moves no timer)
    // reaches the machine.
    assert!(tap.wait(|h| h == Hint::Resync, Duration::from_secs(20)).await.is_some(), "LISTEN is back");
    let notify = format!("SELECT pg_notify('{}', 'push due 3600000')", devpilot_store::listen::channel_of("push"));
    let sent = devpilot_tests::wait_for(Duration::from_secs(20), || async {
        queue.connection().execute_unprepared(&notify).await.is_ok()
    })
    .await;
    assert!(sent, "the database answers again");
    let heard = tap.wait(|h| matches!(h, Hint::DueIn(_)), Duration::from_secs(5)).await;
    assert!(heard.is_some(), "a hint sent after the resync is heard");
    // A poll that failed during the restart backed the timer off to seconds: one poll now
    // that comes back sets it to 30 s again.
    h.wake();
    idle_for(&h, Some(&tap), quiet).await;
    let enqueued = Instant::now();
    let id2 = queue.enqueue("push", &json!({"n": 2})).await.unwrap();
    let took = wait_claimed(&mut events, id2, Duration::from_secs(10)).await;
    assert!(took.is_some_and(|t| t < Duration::from_secs(5)), "LISTEN was re-established: {took:?}");
    let work = tap.wait(is_work, Duration::ZERO).await;
    assert!(work.is_some_and(|(_, at)| at >= enqueued), "the job's notification reached the machine");
    h.stop(StopMode::HandOff).await;

    // Poll-only: no hint, so the job waits for the next poll (30 s away).
    let (h, _j, _) = start("poll-only", false);
    let mut events = h.subscribe();
    idle_for(&h, None, quiet).await;
    let id3 = queue.enqueue("poll-only", &json!({"n": 3})).await.unwrap();
    assert!(wait_claimed(&mut events, id3, Duration::from_secs(4)).await.is_none(), "poll-only does not hear NOTIFY");
    h.wake();
    assert!(wait_claimed(&mut events, id3, Duration::from_secs(5)).await.is_some(), "a poll still finds it");
    h.stop(StopMode::HandOff).await;
    pg.stop();
}

/// A hint goes to its orchestrator's own channel, named alike by the schema and the engine,
/// so another orchestrator's listener never hears it; a database still on the schema before
/// per-orchestrator channels wakes a machine through the shared channel, and so does the
/// same database once migrated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_orchestrator_hears_only_its_own_hints_migrated_or_not() {
    use devpilot_migrations::{Migrator, MigratorTrait};
    use sea_orm::sqlx::postgres::PgListener;
    let db = devpilot_tests::TestDb::new(devpilot_tests::Backend::Postgres).await;
    let (a, b) = (db.orch("chan-a"), db.orch("chan-b"));
    let url = db.raw_url.clone();
    let listener = |orch: String| {
        let url = url.clone();
        async move {
            let mut l = PgListener::connect(&url).await.unwrap();
            l.listen_all([devpilot_store::listen::CHANNEL, &devpilot_store::listen::channel_of(&orch)]).await.unwrap();
            l
        }
    };
    let (mut la, mut lb) = (listener(a.clone()).await, listener(b.clone()).await);
    let same = format!("SELECT (devpilot_channel('{a}') = '{}')::int::bigint", devpilot_store::listen::channel_of(&a));
    assert_eq!(db.scalar(&same).await, Some(1), "the schema and the engine name the channel alike");

    db.queue.enqueue(&a, &json!({"n": 1})).await.unwrap();
    db.queue.enqueue(&b, &json!({"n": 2})).await.unwrap();
    let got = la.recv().await.unwrap();
    assert_eq!((got.channel(), got.payload()), (devpilot_store::listen::channel_of(&a).as_str(), a.as_str()));
    // Notifications arrive in commit order: b's listener's first one is b's, so it never got a's.
    let got = lb.recv().await.unwrap();
    assert_eq!((got.channel(), got.payload()), (devpilot_store::listen::channel_of(&b).as_str(), b.as_str()));

    // Back to the schema before per-orchestrator channels (the first five migrations, past
    // every later one, counted so a new one does not move the target): the shared channel
    // still wakes. On that schema jobs come from a producer's plain INSERT (this engine's
    // insert names columns added since; a machine migrates before it enqueues).
    Migrator::down(db.admin(), Some(Migrator::migrations().len() as u32 - 5)).await.unwrap();
    let plain_insert =
        |n: i32| format!("INSERT INTO dispatch_queue (orchestrator_id, payload) VALUES ('{a}', '{{\"n\": {n}}}')");
    db.exec(&plain_insert(3)).await;
    let got = la.recv().await.unwrap();
    assert_eq!((got.channel(), got.payload()), (devpilot_store::listen::CHANNEL, a.as_str()));

    // And the engine's listener, on the old schema and then on the migrated one, passes on
    // a hint both times.
    let mut hints = devpilot_store::listen::spawn(&db.url, &a, &db.queue).unwrap();
    assert_eq!(next(&mut hints).await, Hint::Direct, "the probe came back");
    assert_eq!(next(&mut hints).await, Hint::Resync, "LISTEN is in place");
    db.exec(&plain_insert(4)).await;
    assert_eq!(next(&mut hints).await, Hint::Work, "woken on the old schema");
    Migrator::up(db.admin(), None).await.unwrap();
    db.queue.enqueue(&a, &json!({"n": 5})).await.unwrap();
    assert_eq!(next(&mut hints).await, Hint::Work, "woken on the migrated schema");
}

async fn next(hints: &mut tokio::sync::mpsc::Receiver<Hint>) -> Hint {
    tokio::time::timeout(Duration::from_secs(20), hints.recv()).await.expect("a hint in time").expect("listening")
}
