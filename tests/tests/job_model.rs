//! The job model on both backends, statement by statement: unique keys, priority and
//! scheduled starts, retry backoff, parking, cancelling (waiting and running jobs) and
//! retention. Time passes by moving rows' timestamps, never by sleeping.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, RunConfig, StopMode};
use devpilot_store::job::JobState;
use devpilot_store::queue::{
    Backoff, CancelOutcome, FailOutcome, Fence, JobOptions, PollExtras, Pruned, Retention, RetryAfter, Start,
    MAX_KEY_LEN,
};
use devpilot_tests::{wait_for, Backend, RecordingAgent, TestDb};
use serde_json::json;

devpilot_tests::on_every_backend!(
    a_key_dedupes_while_its_job_is_live,
    racing_producers_with_one_key_add_one_job,
    the_pick_orders_by_priority_then_due_time_then_id,
    a_scheduled_job_waits_and_the_poll_says_when,
    a_failed_attempt_waits_out_its_backoff,
    a_park_hands_back_without_counting,
    cancel_ends_waiting_jobs_and_asks_running_ones,
    retention_deletes_only_old_finished_work,
    bad_job_options_are_refused_and_write_nothing,
    retention_runs_on_the_poll_path,
    the_migration_upgrades_a_queue_that_holds_jobs,
    a_cancel_missed_while_not_listening_is_learnt_at_the_resync,
    a_finished_job_keeps_when_it_started,
);

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

fn keyed(key: &str) -> JobOptions {
    JobOptions { key: Some(key.into()), ..Default::default() }
}

/// How long until job `id` is due, in ms (negative: due already), on the database clock.
async fn due_in_ms(db: &TestDb, id: i64) -> i64 {
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    row.run_at - row.now
}

/// While a keyed job is live (queued, waiting to retry, running) the key adds nothing and
/// names it; once it is finished the key is free again. The README's producer statement
/// (`INSERT … ON CONFLICT DO NOTHING`) dedupes the same way, by the partial unique index.
async fn a_key_dedupes_while_its_job_is_live(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("key");
    let first = db.queue.enqueue_keyed(&orch, &json!({"title": "ENG-7"}), &keyed("linear:ENG-7")).await.unwrap();
    assert_eq!(first.existing, None);
    let again = db.queue.enqueue_keyed(&orch, &json!({"title": "ENG-7 again"}), &keyed("linear:ENG-7")).await.unwrap();
    assert_eq!((again.id, again.existing), (first.id, Some(JobState::Queued)));

    let c = db.queue.claim_next(&orch, "laptop", 1).await.unwrap().remove(0);
    let running = db.queue.enqueue_keyed(&orch, &json!({}), &keyed("linear:ENG-7")).await.unwrap();
    assert_eq!((running.id, running.existing), (first.id, Some(JobState::Running)));
    assert_eq!(db.queue.fail(&c.fence, "laptop", "exit 1").await.unwrap(), Some(FailOutcome::WillRetry));
    let failed = db.queue.enqueue_keyed(&orch, &json!({}), &keyed("linear:ENG-7")).await.unwrap();
    assert_eq!((failed.id, failed.existing), (first.id, Some(JobState::Failed)), "waiting to retry is live");

    // Another orchestrator's key space is its own.
    let elsewhere = db.queue.enqueue_keyed(&db.orch("other"), &json!({}), &keyed("linear:ENG-7")).await.unwrap();
    assert!(elsewhere.existing.is_none() && elsewhere.id != first.id);

    // A producer's plain SQL, as the README documents it, adds nothing while the key is live.
    let producer = format!(
        "INSERT INTO dispatch_queue (orchestrator_id, payload, title, unique_key)
         VALUES ('{orch}', '{{\"title\": \"from a webhook\"}}', 'from a webhook', 'linear:ENG-7')
         ON CONFLICT DO NOTHING"
    );
    db.exec(&producer).await;
    assert_eq!(db.queue.counts(&orch).await.unwrap().open(), 1, "the webhook's second delivery added nothing");

    db.age_wait(first.id, 2 * HOUR).await;
    let c = db.queue.claim_next(&orch, "laptop", 1).await.unwrap().remove(0);
    assert!(db.queue.complete(&c.fence, "laptop").await.unwrap());
    let next = db.queue.enqueue_keyed(&orch, &json!({}), &keyed("linear:ENG-7")).await.unwrap();
    assert!(next.existing.is_none() && next.id != first.id, "a finished job frees its key");
    db.exec(&producer).await;
    assert_eq!(
        db.queue.counts(&orch).await.unwrap().open(),
        1,
        "and the producer's insert dedupes against the new one"
    );

    // Requeueing a finished job whose key is live again is refused, with a reason.
    assert_eq!(db.queue.cancel(next.id, "me").await.unwrap(), Some(CancelOutcome::Cancelled));
    db.exec(&producer).await; // the key is free: this one lands
    let err = db.queue.requeue(next.id, "me").await.unwrap_err().to_string();
    assert!(err.contains("same key is live"), "{err}");
}

/// Eight producers enqueue the same key at once (separate pools, every one open before any
/// producer starts, then all released by a barrier; ten rounds, a key each): one job per
/// key, and every producer is told its id.
async fn racing_producers_with_one_key_add_one_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("race");
    // Opening a pool connects and pings: done for all eight first, so that the inserts race
    // instead of trailing each other by a connection's setup.
    let mut producers = vec![];
    for _ in 0..8 {
        producers.push(db.another_queue().await);
    }
    for round in 0..10 {
        let key = format!("webhook-{round}");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(producers.len()));
        let mut tasks = vec![];
        for (i, q) in producers.iter().enumerate() {
            let (q, orch, key, barrier) = (q.clone(), orch.clone(), key.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                q.enqueue_keyed(&orch, &json!({"producer": i}), &keyed(&key)).await.unwrap()
            }));
        }
        let mut ids = vec![];
        for t in tasks {
            ids.push(t.await.unwrap().id);
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "round {round}: every producer got the one job's id: {ids:?}");
        assert_eq!(db.queue.counts(&orch).await.unwrap().queued, round as i64 + 1, "round {round}: one job per key");
    }
}

/// Higher priority first; within a priority, by when the job became claimable (a retry's
/// backoff end, a scheduled start), then by id. A job that is not due is never picked.
async fn the_pick_orders_by_priority_then_due_time_then_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("prio");
    let with = |priority, start| JobOptions { priority, start, ..Default::default() };
    let low_a = db.queue.enqueue_with(&orch, &json!({}), with(0, Start::Now)).await.unwrap();
    let low_b = db.queue.enqueue_with(&orch, &json!({}), with(0, Start::Now)).await.unwrap();
    let high = db.queue.enqueue_with(&orch, &json!({}), with(5, Start::Now)).await.unwrap();
    let later = db.queue.enqueue_with(&orch, &json!({}), with(9, Start::After(HOUR))).await.unwrap();
    let negative = db.queue.enqueue_with(&orch, &json!({}), with(-3, Start::Now)).await.unwrap();
    // low_b became claimable earlier than low_a: it goes first within priority 0.
    db.age_wait(low_b, Duration::from_secs(60)).await;

    let mut order = vec![];
    while let Some(c) = db.queue.claim_next(&orch, "m", 1).await.unwrap().pop() {
        order.push(c.fence.job);
    }
    assert_eq!(order, vec![high, low_b, low_a, negative], "the scheduled job is not due yet");
    assert!(db.queue.claim_by_id(later, &orch, "m").await.unwrap().is_none(), "not by id either");
    db.age_wait(later, HOUR).await;
    assert_eq!(
        db.queue.claim_next(&orch, "m", 5).await.unwrap().iter().map(|c| c.fence.job).collect::<Vec<_>>(),
        [later]
    );
}

/// `--delay`/`--run-at` on the database clock: not claimable before, claimable after; an
/// empty poll says how long until the next job is due (so the poll timer can be capped).
async fn a_scheduled_job_waits_and_the_poll_says_when(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("sched");
    let opts = JobOptions { start: Start::After(Duration::from_secs(40)), ..Default::default() };
    let id = db.queue.enqueue_with(&orch, &json!({}), opts).await.unwrap();
    let wait = due_in_ms(&db, id).await;
    assert!((38_000..=40_000).contains(&wait), "due in 40 s on the database clock: {wait} ms");

    let polled = db.queue.claim_next_with(&orch, "m", 2, &PollExtras::default()).await.unwrap();
    assert!(polled.claims.is_empty());
    let next = polled.next_due.expect("the poll says when the next job is due");
    assert!(next > Duration::from_secs(35) && next <= Duration::from_secs(40), "{next:?}");

    // A start in the past is due at once; --run-at names an absolute time.
    let now = db.queue.now_ms().await.unwrap();
    let before = JobOptions { start: Start::At(now - 1000), ..Default::default() };
    let past = db.queue.enqueue_with(&orch, &json!({}), before).await.unwrap();
    let at = JobOptions { start: Start::At(now + 3_600_000), ..Default::default() };
    let future = db.queue.enqueue_with(&orch, &json!({}), at).await.unwrap();
    assert_eq!(db.queue.job(future).await.unwrap().unwrap().0.run_at, now + 3_600_000);
    let got = db.queue.claim_next_with(&orch, "m", 3, &PollExtras::default()).await.unwrap();
    assert_eq!(got.claims.iter().map(|c| c.fence.job).collect::<Vec<_>>(), [past]);
    assert!(got.next_due.is_some_and(|d| d <= Duration::from_secs(40)), "the 40 s job is still the next due");

    db.age_wait(id, Duration::from_secs(40)).await;
    assert_eq!(db.queue.claim_next(&orch, "m", 3).await.unwrap().iter().map(|c| c.fence.job).collect::<Vec<_>>(), [id]);
}

/// Attempt n waits `base * 2^(n-1)`, capped, ±10 %: the job's own backoff, else the
/// runner's. Until then it is not claimable, and its row says "retry in …".
async fn a_failed_attempt_waits_out_its_backoff(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("backoff");
    let own = Backoff { base: Duration::from_secs(10), max: Duration::from_secs(25) };
    let opts = JobOptions { max_attempts: 5, backoff: Some(own), ..Default::default() };
    let id = db.queue.enqueue_with(&orch, &json!({}), opts).await.unwrap();
    let runner = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(2) };
    for (attempt, expect_s) in [(1, 10), (2, 20), (3, 25), (4, 25)] {
        let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
        assert_eq!(c.attempt, attempt);
        assert_eq!(db.queue.fail_with(&c.fence, "m", "exit 1", runner).await.unwrap(), Some(FailOutcome::WillRetry));
        let wait = due_in_ms(&db, id).await;
        let (lo, hi) = (expect_s * 900 - 1000, expect_s * 1100);
        assert!((lo..=hi).contains(&wait), "attempt {attempt}: {wait} ms, expected {expect_s} s ±10 %");
        assert!(db.queue.claim_next(&orch, "m", 1).await.unwrap().is_empty(), "not claimable during its backoff");
        let (row, _) = db.queue.job(id).await.unwrap().unwrap();
        assert!(row.waiting_text().unwrap().starts_with("retry in "), "{:?}", row.waiting_text());
        db.age_wait(id, Duration::from_secs(30)).await;
    }
    // A job with no backoff of its own takes the runner's.
    let plain = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let c = db.queue.claim_next(&orch, "m", 2).await.unwrap();
    let c = c.into_iter().find(|c| c.fence.job == plain).unwrap();
    db.queue.fail_with(&c.fence, "m", "exit 1", runner).await.unwrap();
    let wait = due_in_ms(&db, plain).await;
    assert!((0..=1100).contains(&wait), "the runner's 1 s: {wait} ms");
    // The cap's arithmetic, as the window shows it.
    assert_eq!(own.delay(1), Duration::from_secs(10));
    assert_eq!(own.delay(30), Duration::from_secs(25));
}

/// Exit 75 parks the claim: queued again without counting the attempt, claimable at the
/// agent's `retry_after` (a time, or seconds) or after the backoff; history says `parked`
/// and until when. A cancel asked for in between wins over the park.
async fn a_park_hands_back_without_counting(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("park");
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let d = Backoff::DEFAULT;

    let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
    let (state, until) = db.queue.park(&c.fence, "m", RetryAfter::In(HOUR), d).await.unwrap().unwrap();
    assert_eq!(state, JobState::Queued);
    let (row, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts, row.run_at), ("queued", 0, until));
    assert!((3_598_000..=3_600_000).contains(&(row.run_at - row.now)), "an hour: {}", row.run_at - row.now);
    let parked = db.queue.history(id).await.unwrap().pop().unwrap();
    assert_eq!((parked.kind.as_str(), parked.machine.as_deref()), ("parked", Some("m")));
    assert!(parked.detail.as_deref().unwrap().contains("claimable again at 20"), "{:?}", parked.detail);
    assert!(db.queue.claim_next(&orch, "m", 1).await.unwrap().is_empty());

    let now = db.queue.now_ms().await.unwrap();
    db.age_wait(id, 2 * HOUR).await;
    let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
    assert_eq!(c.attempt, 1, "the park did not count");
    let (_, until) = db.queue.park(&c.fence, "m", RetryAfter::At(now + 7_200_000), d).await.unwrap().unwrap();
    assert_eq!(until, now + 7_200_000, "retry_after as a time is taken as is");

    db.age_wait(id, 3 * HOUR).await;
    let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
    db.queue.park(&c.fence, "m", RetryAfter::Backoff, d).await.unwrap();
    let wait = due_in_ms(&db, id).await;
    assert!((26_000..=33_000).contains(&wait), "no retry_after: the 30 s backoff: {wait}");

    // A retry_after in the past is "now", never a place ahead of the line.
    db.age_wait(id, HOUR).await;
    let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
    db.queue.park(&c.fence, "m", RetryAfter::At(0), d).await.unwrap();
    let wait = due_in_ms(&db, id).await;
    assert!((-1_000..=0).contains(&wait), "claimable from now, not from 1970: {wait}");

    let c = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
    db.queue.cancel(id, "desktop").await.unwrap();
    let (state, _) = db.queue.park(&c.fence, "m", RetryAfter::In(HOUR), d).await.unwrap().unwrap();
    assert_eq!(state, JobState::Cancelled, "a cancel asked for first wins");
    assert!(db.queue.park(&c.fence, "m", RetryAfter::In(HOUR), d).await.unwrap().is_none(), "fenced");
}

/// A waiting job is cancelled at once. A running one is *asked*: its holder learns it from
/// its next renewal, and whatever the holder writes next (completion, failure, hand-off or
/// the cancel itself) ends the job cancelled, never completed. History names who asked and
/// who stopped the agent.
async fn cancel_ends_waiting_jobs_and_asks_running_ones(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("cancel");
    let waiting = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    assert_eq!(db.queue.cancel(waiting, "desktop").await.unwrap(), Some(CancelOutcome::Cancelled));
    assert_eq!(db.queue.cancel(waiting, "desktop").await.unwrap(), None, "finished: nothing to do");
    assert_eq!(db.queue.cancel(999_999, "desktop").await.unwrap(), None);
    let ids = db.queue.enqueue_many(&orch, &[json!({}), json!({}), json!({}), json!({})]).await.unwrap();
    let claims = db.queue.claim_next(&orch, "laptop", 4).await.unwrap();
    let pairs: Vec<Fence> = claims.iter().map(|c| c.fence).collect();
    for id in &ids {
        let asked = db.queue.cancel(*id, "desktop").await.unwrap();
        assert_eq!(asked, Some(CancelOutcome::Requested { holder: Some("laptop".into()) }));
    }
    assert_eq!(db.queue.cancel(ids[0], "desktop").await.unwrap(), None, "asked once is enough");
    let renewed = db.queue.renew_leases(&pairs).await.unwrap();
    assert_eq!((renewed.kept.len(), renewed.cancel.len()), (4, 4), "still held, and the holder is told");

    // The holder stops the agent and says so; or its agent finished, failed or was handed off
    // in the same instant: all four end cancelled.
    assert!(db.queue.finish_cancel(&pairs[0], "laptop").await.unwrap());
    assert!(db.queue.complete(&pairs[1], "laptop").await.unwrap());
    let failed = db.queue.fail(&pairs[2], "laptop", "exit 1").await.unwrap();
    assert_eq!(failed, Some(FailOutcome::Cancelled));
    assert!(db.queue.release(&pairs[3], "laptop", "lid closing").await.unwrap());
    for id in &ids {
        assert_eq!(db.queue.job(*id).await.unwrap().unwrap().0.state, JobState::Cancelled, "job {id}");
        let kinds: Vec<String> = db.queue.history(*id).await.unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["claimed", "cancel_requested", "cancelled"], "job {id}");
    }
    let h = db.queue.history(ids[0]).await.unwrap();
    assert_eq!(h[1].machine.as_deref(), Some("desktop"), "who asked");
    assert_eq!(h[2].machine.as_deref(), Some("laptop"), "who stopped the agent");
    assert_eq!(h[2].detail.as_deref(), Some("agent stopped on laptop; cancel asked by desktop"));
    assert_eq!(db.queue.counts(&orch).await.unwrap().completed, 0, "never completed after the cancel");
    let (raced, _) = db.queue.job(pairs[1].job).await.unwrap().unwrap();
    assert_eq!((raced.completed_at, raced.finished_at.is_some()), (None, true), "and not stamped completed");
    assert!(db.queue.events_of_kind(&orch, "completed").await.unwrap().is_empty());

    // Requeue puts a cancelled job back, with the cancel forgotten.
    assert!(db.queue.requeue(ids[1], "desktop").await.unwrap());
    let c = db.queue.claim_next(&orch, "laptop", 1).await.unwrap().remove(0);
    assert!(db.queue.renew_leases(&[c.fence]).await.unwrap().cancel.is_empty());
    assert!(db.queue.complete(&c.fence, "laptop").await.unwrap());
    assert_eq!(db.queue.job(ids[1]).await.unwrap().unwrap().0.state, JobState::Completed);
    assert!(!db.queue.requeue(999_999, "desktop").await.unwrap());
}

/// Retention deletes completed and cancelled jobs past `finished`, dead ones past `dead`,
/// each with its history, in batches; machines unseen past `machines`. Live jobs, recent
/// jobs, and a running job's history (however old) are untouched.
async fn retention_deletes_only_old_finished_work(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("ret");
    let ids = db.queue.enqueue_many(&orch, &(0..7).map(|i| json!({ "n": i })).collect::<Vec<_>>()).await.unwrap();
    let [old_done, new_done, old_cancelled, dead_20d, dead_31d, running, queued] = ids[..] else { panic!() };
    let claims = db.queue.claim_next(&orch, "m", 7).await.unwrap();
    let fence = |id: i64| claims.iter().find(|c| c.fence.job == id).unwrap().fence;
    for id in [old_done, new_done] {
        db.queue.complete(&fence(id), "m").await.unwrap();
    }
    db.queue.cancel(old_cancelled, "me").await.unwrap();
    db.queue.finish_cancel(&fence(old_cancelled), "m").await.unwrap();
    for id in [dead_20d, dead_31d] {
        db.exec(&format!("UPDATE dispatch_queue SET max_attempts = 1 WHERE id = {id}")).await;
        assert_eq!(db.queue.fail(&fence(id), "m", "boom").await.unwrap(), Some(FailOutcome::Dead));
    }
    db.queue.release(&fence(queued), "m", "back").await.unwrap();
    for id in [old_done, old_cancelled] {
        db.age_finished(id, 15 * DAY).await;
    }
    db.age_finished(dead_20d, 20 * DAY).await;
    db.age_finished(dead_31d, 31 * DAY).await;
    // The running job's and the queued job's history is as old as any: it stays.
    db.exec(&format!(
        "UPDATE job_events SET at = at - {} WHERE job_id IN ({running}, {queued})",
        (60 * DAY).as_millis()
    ))
    .await;
    db.queue.heartbeat_machine(&devpilot_tests::online_presence(&orch, "gone")).await.unwrap();
    db.queue.heartbeat_machine(&devpilot_tests::online_presence(&orch, "here")).await.unwrap();
    db.age_machine(&orch, "gone", 31 * DAY).await;
    let history_before = db.queue.history(running).await.unwrap().len();

    let pruned = db.queue.prune(Some(&orch), &Retention::default(), 1).await.unwrap();
    assert_eq!(pruned, Pruned { jobs: 3, machines: 1 }, "batches of one still delete all three");
    for id in [old_done, old_cancelled, dead_31d] {
        assert!(db.queue.job(id).await.unwrap().is_none(), "job {id} deleted");
        assert!(db.queue.history(id).await.unwrap().is_empty(), "with its history");
    }
    for id in [new_done, dead_20d, running, queued] {
        assert!(db.queue.job(id).await.unwrap().is_some(), "job {id} kept");
    }
    assert_eq!(db.queue.history(running).await.unwrap().len(), history_before);
    let machines: Vec<String> = db.queue.machines(&orch).await.unwrap().into_iter().map(|m| m.machine).collect();
    assert_eq!(machines, ["here"]);
    assert_eq!(db.queue.prune(None, &Retention::default(), 100).await.unwrap(), Pruned::default(), "idempotent");
}

/// A 10,000-character key, a zero backoff, or a keyed batch are refused with a clear error
/// and add no row.
async fn bad_job_options_are_refused_and_write_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("bad");
    let long = "k".repeat(10_000);
    let err = db.queue.enqueue_keyed(&orch, &json!({}), &keyed(&long)).await.unwrap_err().to_string();
    assert!(err.contains(&format!("at most {MAX_KEY_LEN}")), "{err}");
    let err = db.queue.enqueue_keyed(&orch, &json!({}), &keyed("  ")).await.unwrap_err().to_string();
    assert!(err.contains("must not be empty"), "{err}");
    let zero = Backoff { base: Duration::ZERO, max: HOUR };
    let opts = JobOptions { backoff: Some(zero), ..Default::default() };
    assert!(db.queue.enqueue_with(&orch, &json!({}), opts).await.unwrap_err().to_string().contains("backoff"));
    let err = db.queue.enqueue_many_with(&orch, &[json!({}), json!({})], keyed("k")).await.unwrap_err();
    assert!(err.to_string().contains("one job"), "{err}");
    assert_eq!(db.queue.counts(&orch).await.unwrap(), Default::default(), "no row");
}

/// A running machine prunes on its own: throttled on the poll path, not awaited. An aged
/// completed job and an old agent log go; a recent job and the machine's own work stay.
async fn retention_runs_on_the_poll_path(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("autoprune");
    let ids = db.queue.enqueue_many(&orch, &[json!({}), json!({})]).await.unwrap();
    for c in db.queue.claim_next(&orch, "earlier", 2).await.unwrap() {
        db.queue.complete(&c.fence, "earlier").await.unwrap();
    }
    db.age_finished(ids[0], 15 * DAY).await;
    let mut cfg = RunConfig::new(&orch, "m", AgentSpec::NoOp, db.dir.path().to_path_buf());
    cfg.poll_interval = Duration::from_millis(20);
    cfg.max_poll_interval = Duration::from_millis(100);
    cfg.prune_every = Duration::from_millis(200);
    std::fs::create_dir_all(&cfg.log_dir).unwrap();
    let old_log = cfg.log_dir.join("job-1.log");
    std::fs::write(&old_log, "old").unwrap();
    let month_ago = std::time::SystemTime::now() - 30 * DAY;
    std::fs::File::options().write(true).open(&old_log).unwrap().set_modified(month_ago).unwrap();
    let new_log = cfg.log_dir.join("job-2.log");
    std::fs::write(&new_log, "new").unwrap();
    let (h, _join) = orchestrator::spawn(db.queue.clone(), cfg, None);
    let pruned = wait_for(Duration::from_secs(15), || async {
        db.queue.job(ids[0]).await.unwrap().is_none() && !old_log.exists()
    })
    .await;
    assert!(pruned, "the machine pruned the aged job and the old log by itself");
    assert!(db.queue.job(ids[1]).await.unwrap().is_some() && new_log.exists(), "recent work is kept");
    h.stop(StopMode::HandOff).await;
}

/// The job-model migration on a queue that already holds jobs (and back down, and up
/// again): a waiting job is claimable at once and keeps its place in line, finished jobs get
/// a `finished_at` (an old cancel its last history entry), and a key dedupes from then on.
async fn the_migration_upgrades_a_queue_that_holds_jobs(backend: Backend) {
    use devpilot_migrations::{Migrator, MigratorTrait};
    let db = TestDb::new(backend).await;
    let orch = db.orch("upgrade");
    // Down past every migration from the job model on (the agents, channels, … sessions and
    // later ones too): all of them come back up over the rows below. Counted, so a new
    // migration does not move the target.
    Migrator::down(db.admin(), Some(Migrator::migrations().len() as u32 - 3)).await.unwrap();
    for (state, created) in [("queued", 3_000), ("queued", 2_000), ("completed", 9_000), ("cancelled", 9_000)] {
        db.exec(&format!(
            "INSERT INTO dispatch_queue (orchestrator_id, payload, state, created_at, completed_at)
             VALUES ('{orch}', '{{}}', '{state}', {created}, {})",
            if state == "completed" { "9500" } else { "NULL" }
        ))
        .await;
    }
    let cancelled = db.scalar("SELECT MAX(id) FROM dispatch_queue").await.unwrap();
    db.exec(&format!(
        "INSERT INTO job_events (job_id, orchestrator_id, kind, at) VALUES ({cancelled}, '{orch}', 'cancelled', 9900)"
    ))
    .await;
    Migrator::up(db.admin(), None).await.unwrap();

    let col = |c: &str, id: i64| format!("SELECT {c} FROM dispatch_queue WHERE id = {id}");
    let first = db.scalar("SELECT MIN(id) FROM dispatch_queue").await.unwrap();
    assert_eq!(db.scalar(&col("run_at", first)).await, Some(3_000), "run_at is the old created_at");
    assert_eq!(db.scalar(&col("finished_at", first + 2)).await, Some(9_500), "completed: completed_at");
    assert_eq!(db.scalar(&col("finished_at", cancelled)).await, Some(9_900), "cancelled: its last event");
    let mut order = vec![];
    while let Some(c) = db.queue.claim_next(&orch, "m", 1).await.unwrap().pop() {
        order.push(c.fence.job);
    }
    assert_eq!(order, [first + 1, first], "both claimable at once, the older enqueue first");
    let a = db.queue.enqueue_keyed(&orch, &json!({}), &keyed("k")).await.unwrap();
    let b = db.queue.enqueue_keyed(&orch, &json!({}), &keyed("k")).await.unwrap();
    assert_eq!((b.id, b.existing), (a.id, Some(JobState::Queued)));
}

/// A cancel asked while a machine was not listening (LISTEN still connecting, or
/// reconnecting: its NOTIFY is gone) is learnt at the resync that follows LISTEN coming up,
/// not at the next heartbeat (20 s here).
async fn a_cancel_missed_while_not_listening_is_learnt_at_the_resync(backend: Backend) {
    use devpilot_store::listen::Hint;
    let db = TestDb::new(backend).await;
    let orch = db.orch("resync");
    let id = db.queue.enqueue(&orch, &json!({"title": "long"})).await.unwrap();
    let agent = RecordingAgent::new(db.dir.path(), "sleep 60 & wait");
    let argv = vec![agent.script.display().to_string()];
    let mut cfg = RunConfig::new(&orch, "m", AgentSpec::Command(argv), db.dir.path().to_path_buf());
    cfg.confining = agent.confining();
    cfg.heartbeat = Duration::from_secs(20);
    cfg.claim_timeout = Duration::from_secs(120);
    cfg.poll_interval = Duration::from_millis(50);
    cfg.max_poll_interval = Duration::from_millis(200);
    cfg.cancel_grace = Duration::from_secs(2);
    let (hints, rx) = tokio::sync::mpsc::channel(16);
    let (h, _join) = orchestrator::spawn(db.queue.clone(), cfg, Some(rx));
    assert!(wait_for(Duration::from_secs(20), || async { agent.records().iter().any(|r| r.kind == "start") }).await);
    let asked = db.queue.cancel(id, "desk").await.unwrap();
    assert!(matches!(asked, Some(CancelOutcome::Requested { .. })), "{asked:?}");
    // Nothing tells this machine (it has no listener) until LISTEN is up again.
    hints.send(Hint::Resync).await.unwrap();
    let ended = wait_for(Duration::from_secs(5), || async {
        db.queue.job(id).await.unwrap().is_some_and(|(j, _)| j.state == JobState::Cancelled)
    })
    .await;
    assert!(ended, "the resync's renewal carried the cancel, well before the 20 s heartbeat");
    h.stop(StopMode::HandOff).await;
}

/// A finished job's row no longer holds its claim, but listings still say when its last
/// attempt started (the queue's Duration column runs from there to `finished_at`); while it
/// runs, that is its claim's exact time, whenever its history row was written.
async fn a_finished_job_keeps_when_it_started(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("started");
    let id = db.queue.enqueue(&orch, &json!({})).await.unwrap();
    let first = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
    db.queue.fail(&first.fence, "m", "exit 1").await.unwrap();
    db.age_wait(id, HOUR).await;
    let second = db.queue.claim_next(&orch, "m", 1).await.unwrap().remove(0);
    // As SQLite writes it at times: the claim's history row a millisecond after the claim.
    db.exec(&format!("UPDATE job_events SET at = at + 1 WHERE job_id = {id} AND kind = 'claimed'")).await;
    let (running, _) = db.queue.job(id).await.unwrap().unwrap();
    let claimed_at = running.claimed_at.expect("running: claimed");
    assert_eq!(running.started_at, Some(claimed_at), "the last attempt's claim, not the first's");
    assert!(db.queue.complete(&second.fence, "m").await.unwrap());
    let listed = db.queue.jobs(&orch, None, 10).await.unwrap().remove(0);
    assert_eq!(listed.claimed_at, None, "the claim is cleared");
    // From the claim's history row now: the same time on PostgreSQL (one statement), the
    // transaction's next statement on SQLite. Either way the last attempt, not the first
    // (an hour earlier).
    let kept = listed.started_at.expect("kept after it ends") - claimed_at;
    assert!((0..1_000).contains(&kept), "{kept} ms after the last claim");
    assert!(listed.finished_at.unwrap() >= claimed_at);
}
