//! A machine cut off from the database: runner A reaches PostgreSQL through a loopback
//! [`Forwarder`], runner B directly. When A's path goes silent or is refused, A must stop its
//! agent on its own lease clock before B can take the job over; then, once the database
//! answers again, A records the expiry and goes back to work. PostgreSQL only (SQLite is a
//! local file: there is no network to lose).

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use devpilot_store::job::JobState;
use devpilot_tests::{shared_pg, signal_tree, spawn_runner, wait_for, Backend, Forwarder, Record, RecordingAgent};
use devpilot_tests::{Runner, TestDb};
use serde_json::json;

/// Every wait in these tests is bounded by this.
const LIMIT: Duration = Duration::from_secs(30);

/// Both machines: a 6 s lease renewed every second, fast polls and sweeps, and polling only,
/// so the LISTEN connection is not part of the story.
const FLAGS: &[&str] = &[
    "--claim-timeout",
    "6s",
    "--heartbeat",
    "1s",
    "--poll-interval",
    "200ms",
    "--max-poll-interval",
    "1s",
    "--sweep-interval",
    "500ms",
    "--cancel-grace",
    "1s",
    "--poll-only",
];

/// A's agent outlives any lease; B's finishes quickly.
const AGENT_BODY: &str = r#"if [ "$DEVPILOT_MACHINE" = a ]; then sleep 60; else sleep 1; fi"#;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Silence,
    Refuse,
}

/// A silent partition (every query hangs, nothing is reset): A stops its agent before B starts the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_stops_the_agent_before_another_machine_starts() {
    cut_off_machine_stops_before_takeover(Fault::Silence).await;
}

/// A refused connection (reset, then connection refused): A stops its agent before B starts the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_stops_the_agent_before_another_machine_starts() {
    cut_off_machine_stops_before_takeover(Fault::Refuse).await;
}

/// A runner whose whole process tree is SIGKILLed on drop, so that A's 60-second agent does
/// not outlive a failing test. (The inner [`Runner`] then prints its log tail if panicking.)
struct Machine(Runner);

impl Drop for Machine {
    fn drop(&mut self) {
        signal_tree(self.0.pid(), libc::SIGKILL);
    }
}

fn find(records: &[Record], kind: &str, job: i64, machine: &str) -> Option<Record> {
    records.iter().find(|r| r.kind == kind && r.job == job && r.machine == machine).cloned()
}

fn log_of(r: &Runner) -> String {
    std::fs::read_to_string(&r.log).unwrap_or_default()
}

async fn cut_off_machine_stops_before_takeover(fault: Fault) {
    let db = TestDb::new(Backend::Postgres).await;
    let pg = shared_pg();
    let home = db.dir.path();
    let orch = db.orch("partition");
    let agent = RecordingAgent::new(home, AGENT_BODY);

    // A's URL differs from B's only in the port: the forwarder's instead of the server's.
    let db_name = db.raw_url.rsplit('/').next().expect("database name in the URL");
    let target: SocketAddr = ([127, 0, 0, 1], pg.port).into();
    let fwd = Forwarder::start(target);
    let url_a = format!("postgres://postgres:{}@127.0.0.1:{}/{}", pg.password, fwd.port(), db_name);
    assert_ne!(url_a, db.raw_url);

    let (mut a, id, b) = a_runs_the_job_and_b_is_up(&db, &agent, &orch, &url_a).await;

    let cut_at = Instant::now();
    match fault {
        Fault::Silence => fwd.silence(),
        Fault::Refuse => fwd.refuse(),
    }
    a_stops_its_agent_before_b_starts(&agent, &a, id, fault, cut_at).await;
    b_alone_completes_the_job(&db, &agent, &mut a, id, fault).await;

    // The database answers again: A learns what happened to its lease and records it.
    fwd.open();
    a_records_the_expiry_and_claims_again(&db, &agent, a, b, &orch, id).await;
}

/// Starts A (through `url_a`) and waits until it runs a new job; then starts B and waits
/// until it is up and polling: (A, the job, B).
async fn a_runs_the_job_and_b_is_up(
    db: &TestDb,
    agent: &RecordingAgent,
    orch: &str,
    url_a: &str,
) -> (Machine, i64, Machine) {
    let home = db.dir.path();
    let a = Machine(spawn_runner(home, url_a, orch, "a", FLAGS, &agent.script, &[]));
    let id = db.queue.enqueue(orch, &json!({"title": "partition"})).await.expect("enqueue");
    assert!(
        wait_for(LIMIT, || async { find(&agent.records(), "start", id, "a").is_some() }).await,
        "A started the job"
    );
    let b = Machine(spawn_runner(home, &db.raw_url, orch, "b", FLAGS, &agent.script, &[]));
    // B is up and polling before the fault, so what B does next is the sweep, not its startup.
    let q = db.queue.clone();
    let orch_b = orch.to_string();
    assert!(
        wait_for(LIMIT, || {
            let (q, orch) = (q.clone(), orch_b.clone());
            async move { q.machines(&orch).await.expect("machines").iter().any(|m| m.machine == "b") }
        })
        .await,
        "B announced itself"
    );
    (a, id, b)
}

/// Once cut off (at `cut_at`), A notices on its own and stops its agent strictly before B
/// starts the job.
async fn a_stops_its_agent_before_b_starts(
    agent: &RecordingAgent,
    a: &Machine,
    id: i64,
    fault: Fault,
    cut_at: Instant,
) {
    // A notices on its own, without the database telling it anything.
    assert!(
        wait_for(Duration::from_secs(10), || async { log_of(&a.0).contains("database offline") }).await,
        "A's log says 'database offline' within 10 s of the {fault:?}"
    );
    let b_start = {
        let mut found = None;
        let ok = wait_for(LIMIT, || {
            found = find(&agent.records(), "start", id, "b");
            let found = found.is_some();
            async move { found }
        })
        .await;
        assert!(ok, "B took the job over within {LIMIT:?} of the {fault:?}");
        found.expect("B's start record")
    };
    // A's own term record may still be on its way (the trap writes it): wait for it, but
    // only while A is still cut off, since a stop caused by the database answering again
    // proves nothing.
    let a_term = {
        let mut found = None;
        let _ = wait_for(Duration::from_secs(10), || {
            found = find(&agent.records(), "term", id, "a");
            let found = found.is_some();
            async move { found }
        })
        .await;
        found
    };
    let a_term = a_term.unwrap_or_else(|| {
        panic!("A never stopped its agent while cut off ({:?} since the {fault:?})", cut_at.elapsed())
    });
    assert!(
        a_term.at_ns < b_start.at_ns,
        "A's agent was stopped ({}) strictly before B's started ({}): they overlapped by {} ms",
        a_term.at_ns,
        b_start.at_ns,
        (a_term.at_ns - b_start.at_ns) / 1_000_000
    );
}

/// B completes the job, the only execution that finished, while A rides out the fault.
async fn b_alone_completes_the_job(db: &TestDb, agent: &RecordingAgent, a: &mut Machine, id: i64, fault: Fault) {
    let q = db.queue.clone();
    assert!(
        wait_for(LIMIT, || {
            let q = q.clone();
            async move { q.job(id).await.expect("job").expect("the job exists").0.state == JobState::Completed }
        })
        .await,
        "B completed the job"
    );
    let ends: Vec<Record> = agent.records().into_iter().filter(|r| r.kind == "end" && r.job == id).collect();
    assert_eq!(ends.len(), 1, "exactly one execution finished: {ends:?}");
    assert_eq!(ends[0].machine, "b", "and it was B's: {ends:?}");
    assert!(a.0.child.try_wait().expect("try_wait").is_none(), "A rides out the {fault:?} instead of exiting");
}

/// With the database answering again, A records `lease_expired` in the job's history; and
/// with B gone, A claims the next job.
async fn a_records_the_expiry_and_claims_again(
    db: &TestDb,
    agent: &RecordingAgent,
    mut a: Machine,
    b: Machine,
    orch: &str,
    id: i64,
) {
    let q = db.queue.clone();
    assert!(
        wait_for(LIMIT, || {
            let q = q.clone();
            async move {
                q.history(id)
                    .await
                    .expect("history")
                    .iter()
                    .any(|e| e.kind == "lease_expired" && e.machine.as_deref() == Some("a"))
            }
        })
        .await,
        "A recorded lease_expired in the job's history: {:?}",
        db.queue.history(id).await.expect("history").iter().map(|e| (&e.kind, &e.machine)).collect::<Vec<_>>()
    );

    // And A claims again: with B gone, only A can start the next job.
    drop(b);
    let id2 = db.queue.enqueue(orch, &json!({"title": "after the partition"})).await.expect("enqueue");
    assert!(
        wait_for(LIMIT, || async { find(&agent.records(), "start", id2, "a").is_some() }).await,
        "A claimed a new job once the database answered"
    );
    assert!(a.0.child.try_wait().expect("try_wait").is_none(), "A is still running");
    drop(a);
}
