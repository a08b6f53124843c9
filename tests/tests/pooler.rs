//! The managed databases people use sit behind a transaction-mode pooler. These tests run a
//! real PgBouncer (Debian's 1.18, `pool_mode = transaction`, `ignore_startup_parameters =
//! extra_float_digits`) in front of the throwaway PostgreSQL, and drive real `devpilot`
//! processes through it.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::listen::Hint;
use devpilot_store::Queue;
use devpilot_tests::{run_cli, shared_pg, shared_pgbouncer, spawn_runner, RecordingAgent};
use sea_orm::ConnectionTrait;
use serde_json::json;

const FAST: &[&str] = &["--poll-interval", "50ms", "--max-poll-interval", "200ms", "--sweep-interval", "200ms"];

/// A new, empty database (no schema) on the shared cluster.
async fn empty_database(tag: &str) -> String {
    let pg = shared_pg();
    let name = format!("pool_{tag}_{}", std::process::id());
    let admin = db::connect(&DbUrl::parse(&pg.url("postgres")).unwrap(), &PoolSettings::default()).await.unwrap();
    admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await.unwrap();
    name
}

/// Everything through PgBouncer in transaction mode, with `pooled=true`: `devpilot migrate`
/// (twice: the second run must not trip over statements the first left behind), 1,000 jobs
/// drained by four `devpilot run` processes with each job executed exactly once, then
/// `enqueue`, `status`, `sweep` and `release`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_runners_drain_1000_jobs_through_pgbouncer_exactly_once() {
    let bouncer = shared_pgbouncer();
    let name = empty_database("drain").await;
    let url = bouncer.url(&name);
    let home = tempfile::tempdir().unwrap();
    for round in 1..=2 {
        let (code, out, err) = run_cli(home.path(), &url, &["migrate"], None);
        assert_eq!(code, 0, "migrate #{round} through PgBouncer: {out}{err}\n{}", bouncer.log());
    }
    let orch = "pooled-drain";
    let parsed = DbUrl::parse(&url).unwrap();
    let conn = db::open(&parsed, &PoolSettings::default()).await.unwrap();
    let queue = Queue::new(conn).pooled(parsed.pooled());
    let payloads: Vec<_> = (0..995).map(|i| json!({"n": i})).collect();
    let mut ids = queue.enqueue_many(orch, &payloads).await.unwrap();
    for i in 0..5 {
        let title = format!("from the CLI {i}");
        let (code, out, err) =
            run_cli(home.path(), &url, &["enqueue", "--orchestrator", orch, "--title", &title], None);
        assert_eq!(code, 0, "enqueue through PgBouncer: {err}");
        ids.push(out.trim().parse().unwrap());
    }
    let agent = RecordingAgent::new(home.path(), "true");
    let mut flags = FAST.to_vec();
    flags.extend(["--concurrency", "2", "--until-empty"]);
    let mut runners: Vec<_> =
        (0..4).map(|i| spawn_runner(home.path(), &url, orch, &format!("m{i}"), &flags, &agent.script, &[])).collect();
    for r in &mut runners {
        assert_eq!(
            r.wait_timeout(Duration::from_secs(600)),
            Some(0),
            "runner {} exits 0 once the queue is empty",
            r.machine
        );
    }
    let mut starts: HashMap<i64, usize> = HashMap::new();
    for r in agent.records().iter().filter(|r| r.kind == "start") {
        *starts.entry(r.job).or_default() += 1;
    }
    assert_eq!(starts.len(), 1000, "every job executed");
    assert!(starts.values().all(|&n| n == 1), "no job executed twice");
    assert!(ids.iter().all(|id| starts.contains_key(id)));
    let c = queue.counts(orch).await.unwrap();
    assert_eq!((c.completed, c.open()), (1000, 0));
    assert_eq!(queue.events_of_kind(orch, "completed").await.unwrap().len(), 1000);

    let (code, out, err) = run_cli(home.path(), &url, &["status", "--orchestrator", orch, "--json"], None);
    assert_eq!(code, 0, "status through PgBouncer: {err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["counts"]["completed"], 1000, "{out}");
    let (code, _, err) = run_cli(home.path(), &url, &["sweep", "--orchestrator", orch], None);
    assert_eq!(code, 0, "sweep through PgBouncer: {err}");
    let (code, out, err) =
        run_cli(home.path(), &url, &["release", "--orchestrator", orch, "--machine", "m0", "--wait", "1s"], None);
    assert_eq!(code, 4, "release through PgBouncer, of a machine that holds nothing: {out}{err}");
    assert!(out.contains("m0 holds no job"), "{out}");
    for r in &runners {
        let log = std::fs::read_to_string(&r.log).unwrap();
        assert!(!log.contains("prepared statement"), "runner {} met no prepared statement: {log}", r.machine);
    }
}

/// A URL without `pooled=true` through the same pooler: the CLI never prepares, and a runner
/// stays unprepared because its LISTEN probe never comes back; both work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_url_through_pgbouncer_works_unprepared() {
    let bouncer = shared_pgbouncer();
    let name = empty_database("plain").await;
    let home = tempfile::tempdir().unwrap();
    let (code, _, err) = run_cli(home.path(), &bouncer.url(&name), &["migrate"], None);
    assert_eq!(code, 0, "{err}");
    let plain = bouncer.plain_url(&name);
    let orch = "pooled-plain";
    for i in 0..20 {
        let (code, _, err) =
            run_cli(home.path(), &plain, &["enqueue", "--orchestrator", orch, "--title", &format!("j{i}")], None);
        assert_eq!(code, 0, "enqueue #{i} with a plain URL through PgBouncer: {err}");
    }
    let agent = RecordingAgent::new(home.path(), "true");
    let mut flags = FAST.to_vec();
    flags.extend(["--concurrency", "2", "--until-empty"]);
    let mut runner = spawn_runner(home.path(), &plain, orch, "plain", &flags, &agent.script, &[]);
    assert_eq!(runner.wait_timeout(Duration::from_secs(120)), Some(0));
    // (It may drain the queue before its probe's verdict: a_listen_that_never_delivers_is_detected
    // covers that part.)
    let log = std::fs::read_to_string(&runner.log).unwrap();
    assert!(!log.contains("prepared statement"), "it never met a prepared statement: {log}");
    assert_eq!(agent.records().iter().filter(|r| r.kind == "end").count(), 20, "every job ran once");
    let (code, out, err) = run_cli(home.path(), &plain, &["status", "--orchestrator", orch, "--json"], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["counts"]["completed"], 20);
}

/// LISTEN through a transaction-mode pooler never delivers: the listener's probe NOTIFY does
/// not come back, and it says so ([`Hint::Deaf`]) and stops. Directly, the probe comes back
/// and the listener goes on ([`Hint::Resync`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_that_never_delivers_is_detected() {
    let bouncer = shared_pgbouncer();
    let name = empty_database("deaf").await;
    let through = DbUrl::parse(&bouncer.plain_url(&name)).unwrap();
    let queue = Queue::new(db::connect(&through, &PoolSettings::default()).await.unwrap()).pooled(true);
    let mut rx = devpilot_store::listen::spawn(&through, "deaf", &queue).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("an answer within 30 s");
    assert_eq!(first, Some(Hint::Deaf), "through PgBouncer, LISTEN is found deaf");
    assert_eq!(tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap(), None, "and the listener stops");

    let direct = DbUrl::parse(&shared_pg().url(&name)).unwrap();
    let queue = Queue::new(db::connect(&direct, &PoolSettings::default()).await.unwrap());
    let mut rx = devpilot_store::listen::spawn(&direct, "deaf", &queue).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("an answer within 30 s");
    assert_eq!(first, Some(Hint::Direct), "directly, the probe comes back");
    assert_eq!(rx.recv().await, Some(Hint::Resync), "and LISTEN is in place");
}

/// In pooled mode values travel as literals: quotes, backslashes, a `$1`, a newline, a NUL-free
/// control character and non-ASCII text all come back exactly as they went in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_mode_round_trips_awkward_values() {
    let db = devpilot_tests::TestDb::new(devpilot_tests::Backend::Pooled).await;
    assert!(db.queue.is_pooled());
    let orch = db.orch("awkward");
    let title = "it's a \\ back'slash $1 '; DROP TABLE dispatch_queue; -- \u{7}\nzweite Zeile: grün, 日本語";
    let payload = json!({"title": title, "nested": {"q": "\"quoted\"", "n": 1.5e300}});
    let id = db.queue.enqueue(&orch, &payload).await.unwrap();
    let (job, stored) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!(stored, payload);
    assert_eq!(job.title.as_deref(), Some(title));
    assert_eq!(db.scalar("SELECT COUNT(*) FROM dispatch_queue").await, Some(1), "the table is still there");
}

/// A server connection of the pooler that still LISTENs for a client long gone (an older
/// machine, another app): our trigger's NOTIFY must not reach us at the commit of a write
/// there, or the driver fails a statement that did commit. A hundred writes, all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_listen_on_the_pooler_breaks_no_write() {
    use sea_orm::sqlx::Connection;
    let db = devpilot_tests::TestDb::new(devpilot_tests::Backend::Pooled).await;
    let name = db.url.target().rsplit('/').next().unwrap().to_string();
    for _ in 0..3 {
        let mut c = sea_orm::sqlx::postgres::PgConnection::connect(&shared_pgbouncer().plain_url(&name)).await.unwrap();
        sea_orm::sqlx::raw_sql("LISTEN devpilot_dispatch").execute(&mut c).await.unwrap();
        c.close().await.unwrap();
    }
    let orch = db.orch("leftover");
    for i in 0..100 {
        db.queue.enqueue(&orch, &json!({"n": i})).await.unwrap_or_else(|e| panic!("write #{i}: {e}"));
    }
    assert_eq!(db.queue.counts(&orch).await.unwrap().queued, 100);
}
