//! A job's history is as true as its row: whatever crashes (runners killed with kill -9, and
//! on PostgreSQL an immediate restart of the server), every completed job has its
//! `completed` event under the claim that completed it, and every claim has its `claimed`
//! event. Runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use devpilot_store::Queue;
use devpilot_tests::{signal_tree, spawn_runner, wait_for, Backend, RecordingAgent, Runner, TestDb};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;

devpilot_tests::on_both_backends!(history_matches_rows_after_kill_9);

const JOBS: usize = 300;
const RUNNERS: usize = 3;
const MAX_KILLS: usize = 15;
/// The whole drain, kills included, must finish within this.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

const FLAGS: &[&str] = &[
    "--concurrency",
    "2",
    "--poll-interval",
    "50ms",
    "--max-poll-interval",
    "200ms",
    "--claim-timeout",
    "3s",
    "--heartbeat",
    "500ms",
    "--sweep-interval",
    "500ms",
];

/// Completed jobs with no `completed` event under their current claim, in ONE statement: a
/// single SELECT reads one snapshot on both backends, so a nonzero answer is a moment at
/// which the row and its history really disagreed, not an artefact of reading them apart.
const COMPLETED_WITHOUT_EVENT: &str = "SELECT COUNT(*) AS n FROM dispatch_queue q
  WHERE q.state = 'completed'
    AND NOT EXISTS (SELECT 1 FROM job_events e
                     WHERE e.job_id = q.id AND e.kind = 'completed' AND e.claim_token = q.claim_token)";

/// What the reader saw while the runners drained.
#[derive(Default)]
struct Snapshots {
    taken: usize,
    /// (time since the reader started, count) of every snapshot that was not 0.
    violations: Vec<(Duration, i64)>,
    errors: Vec<String>,
    /// Failed reads while the server restarted (from the restart until the reader's next
    /// answer): expected, and counted apart.
    during_restart: usize,
    /// Snapshots taken after a restart.
    after_restart: usize,
}

/// Takes a snapshot every 20 ms until `stop` is set. While `restarting` is set, and after it
/// until a read succeeds again, a failed read is the restart's, not an error.
async fn read_snapshots(queue: Queue, stop: Arc<AtomicBool>, restarting: Arc<AtomicBool>) -> Snapshots {
    let mut out = Snapshots::default();
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let (mut in_restart, mut restarted) = (false, false);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        if restarting.load(Ordering::SeqCst) {
            (in_restart, restarted) = (true, true);
        }
        let stmt = Statement::from_string(queue.backend(), COMPLETED_WITHOUT_EVENT);
        let answer = queue.connection().query_one_raw(stmt).await;
        if answer.is_err() && (in_restart || restarting.load(Ordering::SeqCst)) {
            out.during_restart += 1;
            continue;
        }
        in_restart = false;
        match answer {
            Ok(Some(row)) => match row.try_get::<i64>("", "n") {
                Ok(n) => {
                    out.taken += 1;
                    out.after_restart += usize::from(restarted);
                    if n != 0 {
                        out.violations.push((start.elapsed(), n));
                    }
                }
                Err(e) => out.errors.push(e.to_string()),
            },
            Ok(None) => out.errors.push("COUNT(*) returned no row".into()),
            Err(e) => out.errors.push(e.to_string()),
        }
    }
    out
}

/// `pg_ctl restart -m immediate` of the shared cluster (every connection cut, as in a
/// crash), then waits until the queue answers again, from a server that started anew.
async fn restart_postgres(db: &TestDb, orch: &str) {
    const STARTED: &str = "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000)::bigint";
    let before = db.scalar(STARTED).await;
    tokio::task::spawn_blocking(|| devpilot_tests::shared_pg().restart_immediate()).await.expect("restart");
    let back = wait_for(Duration::from_secs(30), || async { db.queue.counts(orch).await.is_ok() }).await;
    assert!(back, "the database answers again after its restart");
    let after = db.scalar(STARTED).await;
    assert!(after > before, "the server started anew: {before:?} then {after:?}");
}

fn spawn(db: &TestDb, orch: &str, machine: &str, agent: &RecordingAgent) -> Runner {
    spawn_runner(db.dir.path(), &db.raw_url, orch, machine, FLAGS, &agent.script, &[])
}

/// A runner (started without `--until-empty`) is still running: if it exited, how, and its log.
fn assert_alive(r: &mut Runner) {
    if let Ok(Some(status)) = r.child.try_wait() {
        let log = std::fs::read_to_string(&r.log).unwrap_or_default();
        panic!("runner {} exited on its own with {status}:\n{log}", r.machine);
    }
}

/// Runners kill -9ed mid-drain (and on PostgreSQL the server restarted with `-m immediate`
/// mid-drain) never leave a row and its history disagreeing: at every snapshot, and per job
/// at the end (one `completed` event under the row's token, and a `claimed` event for every
/// claim).
async fn history_matches_rows_after_kill_9(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("history");
    let payloads: Vec<_> = (0..JOBS).map(|i| json!({"n": i})).collect();
    let ids = db.queue.enqueue_many(&orch, &payloads).await.expect("enqueue");
    assert_eq!(ids.len(), JOBS);
    let agent = RecordingAgent::new(db.dir.path(), "sleep 0.0$((RANDOM % 5))");

    let stop = Arc::new(AtomicBool::new(false));
    let restarting = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn(read_snapshots(db.queue.clone(), stop.clone(), restarting.clone()));

    let started = Instant::now();
    let (runners, kills, pg_restarts) = drain_with_faults(&db, &orch, &agent, backend, &restarting, started).await;

    let q = db.queue.clone();
    let o = orch.clone();
    let drained = wait_for(DRAIN_LIMIT.saturating_sub(started.elapsed()), || {
        let (q, o) = (q.clone(), o.clone());
        async move { q.counts(&o).await.expect("counts").open() == 0 }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let snaps = reader.await.expect("reader task");
    let counts = db.queue.counts(&orch).await.expect("counts");
    assert!(drained, "the survivors drained the queue within {DRAIN_LIMIT:?} ({kills} kills): {counts:?}");
    // Only our kills end a runner: one that died on its own is a failure, not a survivor.
    let mut runners = runners;
    runners.iter_mut().for_each(assert_alive);
    drop(runners);
    eprintln!(
        "{backend:?}: {} completed, {} dead, {kills} kills, {pg_restarts} PostgreSQL restarts, {} snapshots \
         ({} after the restart, {} reads failed during it), {:?}",
        counts.completed,
        counts.dead,
        snaps.taken,
        snaps.after_restart,
        snaps.during_restart,
        started.elapsed()
    );

    faults_happened_and_every_snapshot_agreed(backend, kills, pg_restarts, &snaps);
    every_job_agrees_with_its_history(&db, &orch).await;
}

/// Starts the runners and, until the queue is drained (or `MAX_KILLS`, or `DRAIN_LIMIT`
/// from `started`), kills one at random moments and starts it again; on PostgreSQL, restarts
/// the server once. Returns (the runners, kills, PostgreSQL restarts).
async fn drain_with_faults(
    db: &TestDb,
    orch: &str,
    agent: &RecordingAgent,
    backend: Backend,
    restarting: &AtomicBool,
    started: Instant,
) -> (Vec<Runner>, usize, usize) {
    let mut runners: Vec<Runner> = (0..RUNNERS).map(|i| spawn(db, orch, &format!("m{i}"), agent)).collect();
    let mut kills = 0;
    // On PostgreSQL the server restarts once, after the first or second kill (while jobs are
    // open: the loop ends before any fault once the queue is drained).
    let mut pg_restarts = 0;
    let restart_after = if backend.is_postgres() { rand::random_range(1..=2) } else { usize::MAX };
    while kills < MAX_KILLS && started.elapsed() < DRAIN_LIMIT {
        // The fault schedule, not a wait for a condition: kill at random moments of the drain.
        tokio::time::sleep(Duration::from_millis(rand::random_range(300..=800))).await;
        if db.queue.counts(orch).await.expect("counts").open() == 0 {
            break;
        }
        if kills == restart_after && pg_restarts == 0 {
            restarting.store(true, Ordering::SeqCst);
            restart_postgres(db, orch).await;
            restarting.store(false, Ordering::SeqCst);
            pg_restarts += 1;
            continue;
        }
        let i = rand::random_range(0..RUNNERS);
        let machine = runners[i].machine.clone();
        assert_alive(&mut runners[i]);
        // The runner and its agents die together, mid-whatever-they-were-doing.
        signal_tree(runners[i].pid(), libc::SIGKILL);
        assert!(runners[i].wait_timeout(Duration::from_secs(10)).is_some(), "{machine} died of SIGKILL");
        // Same machine name: the restarted process is the same machine coming back.
        runners[i] = spawn(db, orch, &machine, agent);
        kills += 1;
    }
    (runners, kills, pg_restarts)
}

/// The faults happened (a kill; on PostgreSQL one restart, with reads after it), and every
/// snapshot the reader took saw the rows and their history agree.
fn faults_happened_and_every_snapshot_agreed(backend: Backend, kills: usize, pg_restarts: usize, snaps: &Snapshots) {
    assert!(kills >= 1, "at least one runner was killed mid-drain");
    if backend.is_postgres() {
        assert_eq!(pg_restarts, 1, "PostgreSQL was restarted mid-drain");
        assert!(snaps.after_restart >= 10, "the reader kept reading after the restart ({})", snaps.after_restart);
    }
    assert!(snaps.errors.is_empty(), "the reader's statement failed: {:?}", &snaps.errors[..snaps.errors.len().min(5)]);
    assert!(snaps.taken >= 50, "only {} snapshots were taken", snaps.taken);
    assert!(
        snaps.violations.is_empty(),
        "{} of {} snapshots saw completed jobs with no completed event under their token; first: {:?}",
        snaps.violations.len(),
        snaps.taken,
        &snaps.violations[..snaps.violations.len().min(10)]
    );
}

/// Per job at the end: a completed job has one `completed` event, under the row's token, and
/// every claim has its `claimed` event.
async fn every_job_agrees_with_its_history(db: &TestDb, orch: &str) {
    let jobs = db.queue.jobs(orch, None, 1000).await.expect("jobs");
    assert_eq!(jobs.len(), JOBS, "every job is still there");
    let mut problems = vec![];
    for job in &jobs {
        let history = db.queue.history(job.id).await.expect("history");
        match job.state.as_str() {
            "completed" => {
                let completed: Vec<_> = history.iter().filter(|e| e.kind == "completed").collect();
                if completed.len() != 1 {
                    problems.push(format!("job {}: {} completed events", job.id, completed.len()));
                } else if completed[0].claim_token != Some(job.claim_token) {
                    problems.push(format!(
                        "job {}: completed under token {:?}, but the row's token is {}",
                        job.id, completed[0].claim_token, job.claim_token
                    ));
                }
            }
            "dead" => {}
            other => problems.push(format!("job {}: ended {other}", job.id)),
        }
        // Every claim increments the token and writes a claimed event: tokens 1..=n, no gap.
        let claimed: BTreeSet<i64> =
            history.iter().filter(|e| e.kind == "claimed").map(|e| e.claim_token.unwrap_or(-1)).collect();
        let expected: BTreeSet<i64> = (1..=job.claim_token).collect();
        if claimed != expected {
            problems.push(format!(
                "job {}: claimed events under tokens {claimed:?}, but it was claimed {} times",
                job.id, job.claim_token
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {JOBS} jobs disagree with their history; first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(20)]
    );
}
