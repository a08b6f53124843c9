//! Push dispatch on PostgreSQL: NOTIFY wakes an idle machine at once, polling stays the
//! fallback, and LISTEN comes back after the database restarts.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use devpilot::agent::AgentSpec;
use devpilot::db::{self, DbUrl, PoolSettings};
use devpilot::orchestrator::{self, Event, RunConfig, StopMode};
use devpilot::Queue;
use devpilot_tests::PgCluster;
use sea_orm::ConnectionTrait;
use serde_json::json;

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

/// An idle machine whose poll has backed off to 30 s picks up a new job within a second
/// through NOTIFY, before and after an immediate PostgreSQL restart; with LISTEN off
/// (poll-only) the same machine waits for its poll.
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
        let hints = if listen { devpilot::listen::spawn(&url, orch, &queue) } else { None };
        orchestrator::spawn(queue.clone(), cfg, hints)
    };

    let (h, _j) = start("push", true);
    let mut events = h.subscribe();
    // Let the first poll (at start) come back empty and the listener connect.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = queue.enqueue("push", &json!({"n": 1})).await.unwrap();
    let took = wait_claimed(&mut events, id, Duration::from_secs(10)).await;
    assert!(took.is_some_and(|t| t < Duration::from_secs(3)), "NOTIFY woke the machine: {took:?}");

    pg.restart_immediate();
    // The pool and the listener reconnect on their own.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut id2 = None;
    for _ in 0..20 {
        match queue.enqueue("push", &json!({"n": 2})).await {
            Ok(i) => {
                id2 = Some(i);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    let id2 = id2.expect("the database came back");
    let took = wait_claimed(&mut events, id2, Duration::from_secs(20)).await;
    assert!(took.is_some_and(|t| t < Duration::from_secs(5)), "LISTEN was re-established: {took:?}");
    h.stop(StopMode::HandOff).await;

    // Poll-only: no hint, so the job waits for the next poll (30 s away).
    let (h, _j) = start("poll-only", false);
    let mut events = h.subscribe();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id3 = queue.enqueue("poll-only", &json!({"n": 3})).await.unwrap();
    assert!(wait_claimed(&mut events, id3, Duration::from_secs(4)).await.is_none(), "poll-only does not hear NOTIFY");
    h.wake();
    assert!(wait_claimed(&mut events, id3, Duration::from_secs(5)).await.is_some(), "a poll still finds it");
    h.stop(StopMode::HandOff).await;
    pg.stop();
}
