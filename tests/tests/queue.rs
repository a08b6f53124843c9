//! Queue statements against real databases: every test runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, RunConfig, StopMode};
use devpilot_store::job::JobState;
use devpilot_store::queue::{FailOutcome, Fence, JobOptions, MachineStatus, PollExtras};
use devpilot_tests::{wait_for, Backend, TestDb};
use sea_orm::ConnectionTrait;
use serde_json::json;
use tokio::sync::Barrier;

devpilot_tests::on_every_backend!(
    workers = 4;
    five_concurrent_claims_one_winner,
    herd_free_pick_never_double_claims,
    fenced_writes_reject_a_stale_token,
    sweep_releases_stale_and_spares_fresh_and_finished,
    sweep_kills_a_job_over_max_attempts,
    failure_retries_then_dies,
    release_hands_back_without_burning_an_attempt,
    orchestrator_sweep_is_throttled,
    failing_sweep_never_fails_the_poll,
    orchestrator_runs_and_hands_off,
    enqueue_rejects_non_object_payload,
    poll_carries_presence_and_the_stale_test,
    claims_landing_after_claiming_stops_are_handed_back,
    a_stopped_machine_stays_stopped,
    a_poll_carries_completions,
    a_machine_completes_in_the_poll_that_fills_the_slot,
    an_idle_poll_sends_no_claim,
);

/// The article's proof: five claims race for one row on five connections; exactly one gets the
/// payload and four get nothing. Repeated, because one lucky run proves little.
async fn five_concurrent_claims_one_winner(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("race");
    let mut machines = vec![];
    for _ in 0..5 {
        machines.push(db.another_queue().await);
    }
    for round in 0..20 {
        let id = db.queue.enqueue(&orch, &json!({"round": round})).await.unwrap();
        let barrier = Arc::new(Barrier::new(5));
        let mut tasks = vec![];
        for (i, q) in machines.iter().enumerate() {
            let (q, b, orch) = (q.clone(), barrier.clone(), orch.clone());
            tasks.push(tokio::spawn(async move {
                b.wait().await;
                q.claim_by_id(id, &orch, &format!("m{i}")).await.unwrap()
            }));
        }
        let mut winners = vec![];
        for t in tasks {
            if let Some(c) = t.await.unwrap() {
                winners.push(c);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner");
        assert_eq!(winners[0].payload, json!({"round": round}));
        assert_eq!(winners[0].attempt, 1);
        assert_eq!(winners[0].fence.token, 1);
    }
}

/// Eight claimers pick-and-claim concurrently; every job is claimed exactly once.
async fn herd_free_pick_never_double_claims(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("pick");
    let payloads: Vec<_> = (0..200).map(|i| json!({"n": i})).collect();
    db.queue.enqueue_many(&orch, &payloads).await.unwrap();
    let mut tasks = vec![];
    for m in 0..8 {
        let q = db.another_queue().await;
        let orch = orch.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = vec![];
            loop {
                let got = q.claim_next(&orch, &format!("m{m}"), 3).await.unwrap();
                if got.is_empty() {
                    break;
                }
                mine.extend(got.into_iter().map(|c| c.fence.job));
            }
            mine
        }));
    }
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let before = all.len();
    all.dedup();
    assert_eq!(before, 200, "every job claimed");
    assert_eq!(all.len(), 200, "no job claimed twice");
    assert_eq!(db.queue.counts(&orch).await.unwrap().running, 200);
}

/// After a job is swept and re-claimed, the old holder's renew, complete, fail and release
/// all match zero rows, and the new holder's complete succeeds exactly once.
async fn fenced_writes_reject_a_stale_token(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("fence");
    let id = db.queue.enqueue(&orch, &json!({"title": "fenced"})).await.unwrap();
    let old = db.queue.claim_next(&orch, "laptop", 1).await.unwrap().remove(0);
    db.age_job(id, Duration::from_secs(60)).await;
    let swept = db.queue.sweep(Some(&orch), Duration::from_secs(30)).await.unwrap();
    assert_eq!(swept.len(), 1);
    let new = db.queue.claim_next(&orch, "desktop", 1).await.unwrap().remove(0);
    assert_eq!(new.fence.job, id);
    assert!(new.fence.token > old.fence.token, "every claim changes the token");
    let (stale, held) = (Fence { job: id, token: old.fence.token }, Fence { job: id, token: new.fence.token });

    assert!(db.queue.renew(&[stale]).await.unwrap().is_empty());
    assert!(!db.queue.complete(&stale, "laptop").await.unwrap());
    assert_eq!(db.queue.fail(&stale, "laptop", "x").await.unwrap(), None);
    assert!(!db.queue.release(&stale, "laptop", "x").await.unwrap());
    assert_eq!(db.queue.renew(&[held]).await.unwrap(), vec![held]);
    assert!(db.queue.complete(&held, "desktop").await.unwrap());
    // Completing again with the same claim (a retry after a lost reply) is idempotent: it
    // reports success and writes nothing twice.
    assert!(db.queue.complete(&held, "desktop").await.unwrap());
    assert!(!db.queue.complete(&stale, "laptop").await.unwrap(), "still fenced");

    let kinds: Vec<String> = db.queue.history(id).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            "claimed",
            "swept",
            "claimed",
            "completion_rejected",
            "lease_lost",
            "lease_lost",
            "completed",
            "completion_rejected"
        ]
    );
}

/// A stale claim is released; a fresh claim and a completed job are untouched.
async fn sweep_releases_stale_and_spares_fresh_and_finished(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("sweep");
    let ids = db.queue.enqueue_many(&orch, &[json!({}), json!({}), json!({})]).await.unwrap();
    let stale = db.queue.claim_by_id(ids[0], &orch, "asleep").await.unwrap().unwrap();
    let done = db.queue.claim_by_id(ids[1], &orch, "fast").await.unwrap().unwrap();
    assert!(db.queue.complete(&done.fence, "fast").await.unwrap());
    let fresh = db.queue.claim_by_id(ids[2], &orch, "awake").await.unwrap().unwrap();
    for id in &ids[..2] {
        db.age_job(*id, Duration::from_secs(120)).await;
    }

    let swept = db.queue.sweep(Some(&orch), Duration::from_secs(60)).await.unwrap();
    assert_eq!(swept.iter().map(|s| s.id).collect::<Vec<_>>(), vec![stale.fence.job]);
    assert_eq!(swept[0].previous_holder.as_deref(), Some("asleep"));
    assert!(!swept[0].dead);

    let state = |id| {
        let q = db.queue.clone();
        async move { q.job(id).await.unwrap().unwrap().0.state }
    };
    assert_eq!(state(stale.fence.job).await, JobState::Queued);
    assert_eq!(state(done.fence.job).await, JobState::Completed);
    assert_eq!(state(fresh.fence.job).await, JobState::Running);
    // A second sweep finds nothing: the fresh claim is still fresh.
    assert!(db.queue.sweep(Some(&orch), Duration::from_secs(60)).await.unwrap().is_empty());
    // The released job is claimable again, as attempt 2.
    let again = db.queue.claim_next(&orch, "awake", 5).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].fence.job, again[0].attempt), (stale.fence.job, 2));
}

/// A job whose claims keep expiring becomes dead after its own max_attempts, not released
/// forever; and the budget is the job's, not the sweeper's: a job enqueued with 5 attempts
/// survives the sweeps that kill a job enqueued with 2.
async fn sweep_kills_a_job_over_max_attempts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("dead");
    let id =
        db.queue.enqueue_with(&orch, &json!({}), JobOptions { max_attempts: 2, ..Default::default() }).await.unwrap();
    let other =
        db.queue.enqueue_with(&orch, &json!({}), JobOptions { max_attempts: 5, ..Default::default() }).await.unwrap();
    for attempt in 1..=2 {
        let c = db.queue.claim_next(&orch, "flaky", 2).await.unwrap();
        assert_eq!(c.len(), 2, "attempt {attempt} claims both");
        db.age_job(id, Duration::from_secs(60)).await;
        db.age_job(other, Duration::from_secs(60)).await;
        let s = db.queue.sweep(None, Duration::from_secs(30)).await.unwrap();
        let dead: Vec<(i64, bool)> = s.iter().filter(|s| s.id == id || s.id == other).map(|s| (s.id, s.dead)).collect();
        assert_eq!(dead, vec![(id, attempt == 2), (other, false)]);
    }
    assert_eq!(db.queue.job(other).await.unwrap().unwrap().0.state, JobState::Queued);
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Dead);
    let left: Vec<i64> = db.queue.claim_next(&orch, "flaky", 2).await.unwrap().iter().map(|c| c.fence.job).collect();
    assert_eq!(left, vec![other], "the dead job is not claimable");
    let kinds: Vec<String> = db.queue.history(id).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["claimed", "swept", "claimed", "dead"]);
    assert!(db.queue.requeue(id, "me").await.unwrap());
    assert_eq!(db.queue.claim_next(&orch, "ok", 1).await.unwrap()[0].attempt, 1);
}

/// A failed attempt goes back for a retry (after its backoff) until max_attempts, then the
/// job is dead.
async fn failure_retries_then_dies(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("fail");
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let mut outcomes = vec![];
    for _ in 0..3 {
        db.age_wait(id, Duration::from_secs(7200)).await;
        let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
        outcomes.push(db.queue.fail(&c.fence, "m", "exit 1").await.unwrap().unwrap());
    }
    assert_eq!(outcomes, [FailOutcome::WillRetry, FailOutcome::WillRetry, FailOutcome::Dead]);
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts, row.last_error.as_deref()), ("dead", 3, Some("exit 1")));
}

/// A hand-off puts the job straight back and does not count the attempt.
async fn release_hands_back_without_burning_an_attempt(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("rel");
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let c = db.queue.claim_next(&orch, "laptop", 1).await.unwrap().remove(0);
    assert!(db.queue.release(&c.fence, "laptop", "lid closing").await.unwrap());
    let c2 = db.queue.claim_next(&orch, "desktop", 1).await.unwrap().remove(0);
    assert_eq!((c2.fence.job, c2.attempt), (id, 1));
    // The administrative release (devpilot release) does the same for a whole machine.
    assert_eq!(db.queue.release_machine(&orch, "desktop").await.unwrap(), vec![id]);
    assert_eq!(db.queue.counts(&orch).await.unwrap().queued, 1);
}

fn cfg(db: &TestDb, orch: &str, agent: AgentSpec) -> RunConfig {
    let mut c = RunConfig::new(orch, "test-machine", agent, db.dir.path().to_path_buf());
    c.poll_interval = Duration::from_millis(20);
    c.max_poll_interval = Duration::from_millis(100);
    c.heartbeat = Duration::from_millis(200);
    c.claim_timeout = Duration::from_secs(5);
    c.concurrency = 4;
    c
}

/// The opportunistic sweep runs at most once per sweep interval, however often we poll.
async fn orchestrator_sweep_is_throttled(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("throttle");
    let mut c = cfg(&db, &orch, AgentSpec::NoOp);
    c.sweep_every = Duration::from_secs(3600);
    let (h, _join) = orchestrator::spawn(db.queue.clone(), c, None);
    assert!(wait_for(Duration::from_secs(10), || async { h.stats().polls.load(Ordering::Relaxed) >= 20 }).await);
    // Due once: on PostgreSQL that is one stale test folded into a poll (nothing is stale, so
    // no sweep statement follows); on SQLite it is one sweep statement.
    assert_eq!(h.stats().sweep_checks.load(Ordering::Relaxed), 1);
    let expected_sweeps = if backend.is_postgres() { 0 } else { 1 };
    assert_eq!(h.stats().sweeps.load(Ordering::Relaxed), expected_sweeps);
    h.stop(StopMode::HandOff).await;
}

/// A sweep whose statement fails (a trigger makes it fail in the database) is logged and
/// counted, and polling, claiming and completing carry on regardless.
async fn failing_sweep_never_fails_the_poll(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("sweepfail");
    let sabotage = match backend {
        Backend::Postgres | Backend::Pooled => vec![
            "CREATE FUNCTION fail_sweep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected sweep failure'; END $$",
            "CREATE TRIGGER sabotage BEFORE UPDATE ON dispatch_queue FOR EACH ROW WHEN (NEW.last_error LIKE 'lease expired%') EXECUTE FUNCTION fail_sweep()",
        ],
        Backend::Sqlite => vec![
            "CREATE TRIGGER sabotage BEFORE UPDATE ON dispatch_queue WHEN NEW.last_error LIKE 'lease expired%' BEGIN SELECT RAISE(ABORT, 'injected sweep failure'); END",
        ],
    };
    for s in sabotage {
        db.exec(s).await;
    }
    // A stale claim, so every sweep has a row to trip on.
    db.queue.enqueue(&orch, &json!({"stale": true})).await.unwrap();
    let gone = db.queue.claim_next(&orch, "gone", 1).await.unwrap().remove(0);
    db.age_job(gone.fence.job, Duration::from_secs(60)).await;
    let mut c = cfg(&db, &orch, AgentSpec::NoOp);
    c.sweep_every = Duration::from_millis(50);
    let (h, _join) = orchestrator::spawn(db.queue.clone(), c, None);
    let ids = db.queue.enqueue_many(&orch, &vec![json!({}); 20]).await.unwrap();
    let q = db.queue.clone();
    let o = orch.clone();
    assert!(
        wait_for(Duration::from_secs(20), || {
            let (q, o) = (q.clone(), o.clone());
            async move { q.counts(&o).await.unwrap().completed == 20 }
        })
        .await,
        "jobs complete while every sweep fails"
    );
    assert!(
        wait_for(Duration::from_secs(10), || async { h.stats().sweep_failures.load(Ordering::Relaxed) >= 2 }).await,
        "sweeps kept failing and were counted"
    );
    assert!(h.status().db_online);
    assert_eq!(ids.len(), 20);
    h.stop(StopMode::HandOff).await;
}

/// The in-process loop runs real agent processes to completion, and a hand-off stops a long
/// agent, releases its claim at once (no attempt used) and answers with the ids it handed off.
async fn orchestrator_runs_and_hands_off(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("loop");
    // The payload says how long to work: {"sleep": N}.
    let body = r#"s=$(printf '%s' "$payload" | sed -n 's/.*"sleep":\([0-9]*\).*/\1/p'); sleep "${s:-0}""#;
    let agent = devpilot_tests::RecordingAgent::new(db.dir.path(), body);
    let mut c = cfg(&db, &orch, AgentSpec::Command(vec![agent.script.display().to_string()]));
    c.confining = agent.confining();
    c.cancel_grace = Duration::from_secs(2);
    let (h, _join) = orchestrator::spawn(db.queue.clone(), c, None);
    let mut events = h.subscribe();
    db.queue.enqueue_many(&orch, &vec![json!({"quick": true}); 6]).await.unwrap();
    let q = db.queue.clone();
    let o = orch.clone();
    assert!(
        wait_for(Duration::from_secs(30), || {
            let (q, o) = (q.clone(), o.clone());
            async move { q.counts(&o).await.unwrap().completed == 6 }
        })
        .await
    );
    // Pause: nothing new is claimed.
    h.pause(None);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let long = db.queue.enqueue(&orch, &json!({"title": "long"})).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(db.queue.job(long).await.unwrap().unwrap().0.state, JobState::Queued, "paused claims nothing");
    h.resume();
    // (The agent inherits our environment; a long sleep comes from the payload file instead.)
    let _ = long;
    assert!(
        wait_for(Duration::from_secs(10), || {
            let q = db.queue.clone();
            async move { q.job(long).await.unwrap().unwrap().0.state == JobState::Completed }
        })
        .await
    );
    let mut saw_completed = 0;
    while let Ok(ev) = events.try_recv() {
        if matches!(ev, orchestrator::Event::Completed { .. }) {
            saw_completed += 1;
        }
    }
    assert_eq!(saw_completed, 7);
    let recs = agent.records();
    assert_eq!(recs.iter().filter(|r| r.kind == "end").count(), 7);

    let busy = db.queue.enqueue(&orch, &json!({"title": "busy", "sleep": 60})).await.unwrap();
    assert!(wait_for(Duration::from_secs(10), || async { agent.records().iter().any(|r| r.job == busy) }).await);
    assert_eq!(h.hand_off(true).await, vec![busy], "the hand-off answers with what it handed off");
    assert!(agent.records().iter().any(|r| r.job == busy && r.kind == "term"), "its agent was stopped");
    let (row, _) = db.queue.job(busy).await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts), ("queued", 0), "released, no attempt used");
    h.stop(StopMode::HandOff).await;
}

/// A payload that is not a JSON object or array is refused and nothing is written.
async fn enqueue_rejects_non_object_payload(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("bad");
    let e = db.queue.enqueue(&orch, &json!("just a string")).await.unwrap_err();
    assert!(e.to_string().contains("malformed payload"), "{e}");
    assert!(db.queue.enqueue("", &json!({})).await.is_err());
    assert_eq!(db.queue.counts(&orch).await.unwrap(), Default::default());
}

/// The poll statement carries the idle machine's housekeeping: it writes the presence row and
/// says whether any lease is stale, while claiming as usual. On PostgreSQL it is one
/// statement, so the stale answer is exact; SQLite writes presence separately and always
/// answers "maybe stale" so the caller sweeps as before.
async fn poll_carries_presence_and_the_stale_test(backend: Backend) {
    use devpilot_store::queue::Presence;
    let db = TestDb::new(backend).await;
    let orch = db.orch("fold");
    let presence = |status| Presence { status, concurrency: 2, ..devpilot_tests::online_presence(&orch, "idle-box") };
    // Nothing queued, nothing stale: no claims, not stale (on PostgreSQL), presence written.
    let extras = PollExtras {
        presence: Some(presence(MachineStatus::Online)),
        stale_after: Some(Duration::from_secs(30)),
        route: None,
        done: &[],
    };
    let p = db.queue.claim_next_with(&orch, "idle-box", 2, &extras).await.unwrap();
    assert!(p.claims.is_empty());
    assert_eq!(p.stale, backend == Backend::Sqlite);
    let machines = db.queue.machines(&orch).await.unwrap();
    assert_eq!(machines.len(), 1);
    assert_eq!((machines[0].machine.as_str(), machines[0].concurrency), ("idle-box", 2));

    // A claim goes stale; two jobs are queued. The poll claims up to its limit and sees it.
    let ids = db.queue.enqueue_many(&orch, &[json!({"n": 1}), json!({"n": 2}), json!({"n": 3})]).await.unwrap();
    db.queue.claim_by_id(ids[0], &orch, "asleep").await.unwrap().unwrap();
    db.age_job(ids[0], Duration::from_secs(60)).await;
    let extras = PollExtras {
        presence: Some(presence(MachineStatus::Paused)),
        stale_after: Some(Duration::from_secs(30)),
        route: None,
        done: &[],
    };
    let p = db.queue.claim_next_with(&orch, "idle-box", 1, &extras).await.unwrap();
    assert_eq!(p.claims.iter().map(|c| c.fence.job).collect::<Vec<_>>(), vec![ids[1]]);
    assert_eq!(p.claims[0].payload, json!({"n": 2}));
    assert!(p.stale, "the sleeping claim is stale");
    assert_eq!(db.queue.machines(&orch).await.unwrap()[0].status, MachineStatus::Paused);
    // The test is read only: the stale claim is still held until a sweep releases it.
    assert_eq!(db.queue.job(ids[0]).await.unwrap().unwrap().0.state, JobState::Running);

    // Without extras it is the plain herd-free claim, and asks nothing about staleness.
    let p = db.queue.claim_next_with(&orch, "idle-box", 5, &PollExtras::default()).await.unwrap();
    assert_eq!(p.claims.iter().map(|c| c.fence.job).collect::<Vec<_>>(), vec![ids[2]]);
    assert!(!p.stale);
    let kinds: Vec<String> = db.queue.history(ids[2]).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["claimed"]);
}

/// Holds the queue's write lock from another connection, so that a poll blocks in the
/// database and stays in flight for as long as the test wants.
async fn hold_queue_lock(db: &TestDb, q: &devpilot_store::queue::Queue) -> sea_orm::DatabaseTransaction {
    use sea_orm::TransactionTrait;
    let txn = q.connection().begin().await.unwrap();
    let sql = match db.backend {
        // EXCLUSIVE conflicts with the ROW SHARE lock that FOR UPDATE takes, so the pick waits
        // instead of skipping.
        Backend::Postgres | Backend::Pooled => "LOCK TABLE dispatch_queue IN EXCLUSIVE MODE",
        // Any write takes SQLite's single writer lock; the poll's UPDATE waits on busy_timeout.
        Backend::Sqlite => "UPDATE dispatch_queue SET attempts = attempts WHERE id < 0",
    };
    txn.execute_unprepared(sql).await.unwrap();
    txn
}

/// A claim that lands after this machine stopped claiming (dispatch switched off, or a stop
/// begun, while the poll was in flight) is handed straight back, unrun and without burning an
/// attempt; and a stop waits for that hand-back, so Quit never strands a claim, but no longer
/// than the machine's call bound when the database does not answer at all.
async fn claims_landing_after_claiming_stops_are_handed_back(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("late");
    let blocker = db.another_queue().await;
    let handed_back = |id: i64| {
        let q = db.queue.clone();
        async move { q.history(id).await.unwrap().iter().filter(|e| e.kind == "handed_off").count() }
    };

    // Dispatch off while the poll is blocked in the database.
    let first = db.queue.enqueue(&orch, &json!({"n": 1})).await.unwrap();
    let lock = hold_queue_lock(&db, &blocker).await;
    let (h, _join) = orchestrator::spawn(db.queue.clone(), cfg(&db, &orch, AgentSpec::NoOp), None);
    let mut events = h.subscribe();
    assert!(wait_for(Duration::from_secs(10), || async { h.stats().claim_queries.load(Ordering::Relaxed) >= 1 }).await);
    h.set_enabled(false);
    let mut st = h.watch_status();
    tokio::time::timeout(Duration::from_secs(10), st.wait_for(|s| s.state == orchestrator::MachineState::Off))
        .await
        .unwrap()
        .unwrap();
    lock.commit().await.unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || async { handed_back(first).await == 1 }).await,
        "the late claim was handed back"
    );
    let (job, _) = db.queue.job(first).await.unwrap().unwrap();
    assert_eq!((job.state.as_str(), job.attempts), ("queued", 0), "unrun, no attempt burned");
    while let Ok(ev) = events.try_recv() {
        assert!(!matches!(ev, orchestrator::Event::Claimed { .. }), "nothing ran: {ev:?}");
    }

    // A stop while the poll is blocked returns only after the late claim is handed back.
    let lock = hold_queue_lock(&db, &blocker).await;
    let before = h.stats().claim_queries.load(Ordering::Relaxed);
    h.set_enabled(true);
    assert!(
        wait_for(Duration::from_secs(10), || async { h.stats().claim_queries.load(Ordering::Relaxed) > before }).await
    );
    let mut st = h.watch_status();
    st.mark_unchanged();
    let stopper = tokio::spawn({
        let h = h.clone();
        async move { h.stop(StopMode::HandOff).await }
    });
    // The loop publishes its status when it takes the stop command.
    tokio::time::timeout(Duration::from_secs(10), st.changed()).await.unwrap().unwrap();
    lock.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), stopper).await.unwrap().unwrap();
    assert_eq!(handed_back(first).await, 2, "handed back before the stop returned");
    let (job, _) = db.queue.job(first).await.unwrap().unwrap();
    assert_eq!((job.state.as_str(), job.attempts), ("queued", 0));

    // A database that never answers does not hold up a stop (Quit, a settings change): the
    // poll is bounded by the call bound (below the heartbeat), and the stop waits that long.
    let lock = hold_queue_lock(&db, &blocker).await;
    let c = cfg(&db, &orch, AgentSpec::NoOp);
    let bound = orchestrator::call_bound(c.heartbeat);
    let (h, _join) = orchestrator::spawn(db.queue.clone(), c, None);
    assert!(wait_for(Duration::from_secs(10), || async { h.stats().claim_queries.load(Ordering::Relaxed) >= 1 }).await);
    let asked = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(20), h.stop(StopMode::HandOff))
        .await
        .expect("a stop does not wait for a poll the database never answers");
    assert!(asked.elapsed() < Duration::from_secs(5), "bounded by the call bound: {:?}", asked.elapsed());
    assert!(h.stats().claim_queries.load(Ordering::Relaxed) >= 1 && bound < Duration::from_secs(1));
    lock.rollback().await.unwrap();
}

/// After a stop returns, the machine's presence row says 'stopped' and stays so: no presence
/// upsert sent before the stop (the stop command itself sends one) lands after the last one.
/// Repeated, because the lost write was a race.
async fn a_stopped_machine_stays_stopped(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("stopped");
    for round in 0..15 {
        let mut c = cfg(&db, &orch, AgentSpec::NoOp);
        c.machine = format!("box-{round}");
        let (h, _join) = orchestrator::spawn(db.queue.clone(), c, None);
        assert!(wait_for(Duration::from_secs(10), || async { h.stats().polls.load(Ordering::Relaxed) >= 2 }).await);
        h.stop(StopMode::HandOff).await;
        // A late upsert would land within milliseconds; give it ample time to show.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let machines = db.queue.machines(&orch).await.unwrap();
        let me = machines.iter().find(|m| m.machine == format!("box-{round}")).expect("a presence row");
        assert_eq!(me.status, MachineStatus::Stopped, "round {round}: {me:?}");
    }
}

/// No index of the queue mentions `heartbeat_at` (as a key, an expression or a predicate),
/// so a renewal, which writes only that column, can be a HOT update on PostgreSQL; and the
/// renewals of a held job really are HOT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_touch_no_index() {
    let db = TestDb::new(Backend::Postgres).await;
    let indexed = "SELECT count(*) FROM pg_index i
                    WHERE i.indrelid = 'dispatch_queue'::regclass
                      AND (EXISTS (SELECT 1 FROM pg_attribute a
                                    WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                                      AND a.attname = 'heartbeat_at')
                           OR pg_get_expr(i.indexprs, i.indrelid) LIKE '%heartbeat_at%'
                           OR pg_get_expr(i.indpred, i.indrelid) LIKE '%heartbeat_at%')";
    assert_eq!(db.scalar(indexed).await, Some(0), "an index holds heartbeat_at: renewals cannot be HOT");
    let orch = db.orch("hot");
    db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().pop().unwrap();
    // The same session renews and then reads its own, not yet flushed, counters.
    let hot = format!(
        "WITH r AS (UPDATE dispatch_queue SET heartbeat_at = heartbeat_at + 1 WHERE id = {} RETURNING 1)
         SELECT pg_stat_get_xact_tuples_hot_updated('dispatch_queue'::regclass) FROM r",
        c.fence.job
    );
    assert_eq!(db.scalar(&hot).await, Some(1), "the renewal was a HOT update");
}

/// A machine's poll is planned once per connection: with its LIMIT written into the text,
/// the generic plan claims what it picked through the primary key, so after PostgreSQL's five
/// custom plans it keeps the generic one. (With `LIMIT $n` it planned every call, 0.9 ms of
/// a 3.1 ms poll in the benchmark's drain.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poll_is_planned_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let orch = db.orch("plan");
    // A queue of some size, as the planner sees it: on a few rows any plan is cheap.
    let payloads: Vec<_> = (0..10_000).map(|i| json!({ "n": i })).collect();
    db.queue.enqueue_many(&orch, &payloads).await.unwrap();
    db.exec("ANALYZE dispatch_queue").await;
    // One connection, so the statements below see the poll's own session.
    let url = devpilot_store::db::DbUrl::parse(&db.raw_url).unwrap();
    let conn = devpilot_store::db::connect(&url, &devpilot_store::db::PoolSettings::default()).await.unwrap();
    let q = devpilot_store::Queue::new(conn);
    for _ in 0..POLLS {
        assert_eq!(q.claim_next(&orch, "m", 1).await.unwrap().len(), 1);
    }
    let rows = q
        .connection()
        .query_all_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE 'WITH picked%'",
        ))
        .await
        .unwrap();
    let plans: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| (r.try_get("", "generic_plans").unwrap(), r.try_get("", "custom_plans").unwrap()))
        .collect();
    // One statement, prepared once: PostgreSQL's five custom plans, then the generic one at
    // every later call. (Replanned at every call, it would show no generic plan, or more
    // custom ones.)
    assert_eq!(plans, [(POLLS - 5, 5)], "(generic, custom) plans of the poll over {POLLS} calls");
}

/// How many polls [`the_poll_is_planned_once`] makes: more than PostgreSQL's five custom plans.
const POLLS: i64 = 8;

/// A poll that carries completions writes them as `complete_many` would: each ends completed
/// (or cancelled, when a cancel was asked), with its history. On PostgreSQL it is one
/// statement: the completion and the next claim share a transaction's clock. A fence the
/// poll did not end is only left out of its answer, with nothing more sent after the commit
/// (a failure there would have failed a poll whose claims were already made); its task's
/// `complete_many` then notes a lost claim, or finds its own earlier completion.
async fn a_poll_carries_completions(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("carry");
    let ids = db.queue.enqueue_many(&orch, &vec![json!({}); 5]).await.unwrap();
    let held = db.queue.claim_next(&orch, "m", 3).await.unwrap();
    let f: Vec<Fence> = held.iter().map(|c| c.fence).collect();
    assert_eq!(f.iter().map(|f| f.job).collect::<Vec<_>>(), ids[..3]);
    db.queue.cancel(ids[1], "alice").await.unwrap();
    // Job 3's claim is swept and taken by another machine: this machine's fence is stale.
    db.age_job(ids[2], Duration::from_secs(60)).await;
    db.queue.sweep(Some(&orch), Duration::from_secs(30)).await.unwrap();
    let other = db.queue.claim_by_id(ids[2], &orch, "other").await.unwrap().unwrap();

    let extras = PollExtras { done: &f, ..Default::default() };
    let p = db.queue.claim_next_with(&orch, "m", 1, &extras).await.unwrap();
    let mut ended = p.completed.clone();
    ended.sort_by_key(|(f, _)| *f);
    assert_eq!(ended, vec![(f[0], JobState::Completed), (f[1], JobState::Cancelled)]);
    assert_eq!(p.claims.iter().map(|c| c.fence.job).collect::<Vec<_>>(), vec![ids[3]], "and it claimed");
    assert_eq!(db.queue.job(ids[2]).await.unwrap().unwrap().0.claimed_by.as_deref(), Some("other"));

    let kinds = |id: i64| {
        let q = db.queue.clone();
        async move { q.history(id).await.unwrap().into_iter().map(|e| (e.kind, e.machine)).collect::<Vec<_>>() }
    };
    let m = || Some("m".to_string());
    assert_eq!(kinds(ids[0]).await, vec![("claimed".into(), m()), ("completed".into(), m())]);
    let alice = Some("alice".to_string());
    assert_eq!(
        kinds(ids[1]).await,
        vec![("claimed".into(), m()), ("cancel_requested".into(), alice), ("cancelled".into(), m())]
    );
    let rejected = |id: i64| {
        let q = db.queue.clone();
        async move { q.history(id).await.unwrap().iter().filter(|e| e.kind == "completion_rejected").count() }
    };
    assert_eq!(rejected(ids[2]).await, 0, "the poll sends nothing after its commit");
    assert!(db.queue.complete_many(&f[2..], "m").await.unwrap().is_empty());
    assert_eq!(rejected(ids[2]).await, 1, "its task's complete_many notes the lost claim");
    assert_eq!(db.queue.job(other.fence.job).await.unwrap().unwrap().0.state, JobState::Running);
    if backend == Backend::Postgres {
        let at = |id: i64, kind: &'static str| {
            let q = db.queue.clone();
            async move { q.history(id).await.unwrap().into_iter().find(|e| e.kind == kind).unwrap().at }
        };
        assert_eq!(at(ids[0], "completed").await, at(ids[3], "claimed").await, "one statement, one clock");
    }

    // The same completion again (its first answer was lost): ours already, nothing new.
    let again = [f[0]];
    let extras = PollExtras { done: &again, ..Default::default() };
    let p = db.queue.claim_next_with(&orch, "m", 1, &extras).await.unwrap();
    assert!(p.completed.is_empty(), "this poll did not end it");
    assert_eq!(db.queue.complete_many(&again, "m").await.unwrap(), vec![(f[0], JobState::Completed)]);
    assert_eq!(kinds(ids[0]).await.len(), 2, "no second completion, no rejection note");
}

/// A machine whose agent succeeded frees the slot at once, and the poll that fills it writes
/// the completion: with one slot, every completion rides a poll, none takes a statement of
/// its own.
async fn a_machine_completes_in_the_poll_that_fills_the_slot(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("ride");
    let mut c = cfg(&db, &orch, AgentSpec::NoOp);
    c.concurrency = 1;
    let ids = db.queue.enqueue_many(&orch, &vec![json!({}); 10]).await.unwrap();
    let (h, _join) = orchestrator::spawn(db.queue.clone(), c, None);
    let q = db.queue.clone();
    let o = orch.clone();
    assert!(
        wait_for(Duration::from_secs(30), || {
            let (q, o) = (q.clone(), o.clone());
            async move { q.counts(&o).await.unwrap().completed == 10 }
        })
        .await
    );
    // The poll's commit is visible before its task counts the riders: wait for the count too,
    // so a completion that took a statement of its own still fails here, as 9.
    let carried = || h.stats().completions_carried.load(Ordering::Relaxed);
    wait_for(Duration::from_secs(5), || async { carried() >= 10 }).await;
    assert_eq!(carried(), 10, "every completion rode a poll");
    for id in ids {
        let kinds: Vec<String> = db.queue.history(id).await.unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["claimed", "completed"]);
    }
    h.stop(StopMode::HandOff).await;
}

/// An idle machine's poll (presence, nothing due) is one statement on PostgreSQL and two on
/// SQLite (the presence row, then the read of the next due time): the claim's transaction
/// (BEGIN, an UPDATE of no row, COMMIT) is sent only when that read says a job is due. On
/// SQLite each round trip wakes the connection's thread and the runtime, on an idle tray.
async fn an_idle_poll_sends_no_claim(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("idle");
    let extras = PollExtras {
        presence: Some(devpilot_tests::online_presence(&orch, "idle-box")),
        stale_after: None,
        route: None,
        done: &[],
    };
    let idle = if backend == Backend::Sqlite { 2 } else { 1 };
    let poll = || async {
        let before = db.queue.round_trips();
        let p = db.queue.claim_next_with(&orch, "idle-box", 1, &extras).await.unwrap();
        (p, db.queue.round_trips() - before)
    };

    let (p, sent) = poll().await;
    assert!(p.claims.is_empty() && p.next_due.is_none());
    assert_eq!(sent, idle, "an empty queue");
    assert_eq!(db.queue.machines(&orch).await.unwrap()[0].machine, "idle-box", "the presence row is written");

    // A job due in an hour: not claimed, and the poll says when it is due.
    let id = db.queue.enqueue_many(&orch, &[json!({"n": 1})]).await.unwrap()[0];
    db.exec(&format!("UPDATE dispatch_queue SET run_at = run_at + 3600000 WHERE id = {id}")).await;
    let (p, sent) = poll().await;
    assert!(p.claims.is_empty());
    let due = p.next_due.expect("the poll says when the job is due");
    assert!(due > Duration::from_secs(3500) && due <= Duration::from_secs(3600), "{due:?}");
    assert_eq!(sent, idle, "a job not yet due");

    // Due now: claimed by the same poll.
    db.age_wait(id, Duration::from_secs(3601)).await;
    let (p, _) = poll().await;
    assert_eq!(p.claims.iter().map(|c| c.fence.job).collect::<Vec<_>>(), vec![id]);
}
