//! Tracker sources and the outbox, statement by statement, on every backend: the intake
//! turn is taken by one machine per interval, its end is fenced by the turn, the outbox row
//! commits with the state change it reports (and only for a tracker's job), and a delivery
//! is taken by one machine at a time, in order per job, and finished fenced by its token.
//! Time passes by moving rows' timestamps, never by sleeping.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::{
    Backoff, DeliveryEnd, Holds, JobOptions, Queue, Retention, RetryAfter, SourceSpec, Turn, TurnEnd,
};
use devpilot_tests::{Backend, TestDb};
use serde_json::json;

devpilot_tests::on_every_backend!(
    one_machine_takes_each_intake_turn,
    a_stale_turn_cannot_move_the_cursor,
    a_rate_limit_hold_keeps_the_turn_until_its_reset,
    a_changed_filter_resets_the_cursor,
    the_outbox_row_commits_with_the_state_change,
    one_machine_delivers_each_row_in_order_fenced,
    a_waiting_job_takes_its_issues_new_text_and_a_claimed_one_does_not,
    every_reportable_change_writes_its_outbox_row,
    retention_keeps_a_trackers_finished_job,
    a_try_at_the_turn_says_what_the_source_holds,
);

const MINUTE: Duration = Duration::from_secs(60);

async fn source(db: &TestDb, orch: &str, filter: &str) -> i64 {
    let spec = SourceSpec { name: "eng", kind: "linear", filter, interval: MINUTE };
    db.queue.register_source(orch, &spec).await.unwrap()
}

/// Moves source `id`'s last poll `by` into the past, as if that much time had passed.
async fn age_source(db: &TestDb, id: i64, by: Duration) {
    db.exec(&format!("UPDATE sources SET polled_at = polled_at - {} WHERE id = {id}", by.as_millis())).await;
}

/// Eight machines (each its own pool) race for the turn: exactly one gets it. Until the
/// interval has passed nobody gets another; then exactly one does again.
async fn one_machine_takes_each_intake_turn(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("turn");
    let id = source(&db, &orch, "{}").await;
    let mut queues: Vec<Queue> = vec![];
    for _ in 0..8 {
        queues.push(db.another_queue().await);
    }
    for round in 1..=2 {
        let tries = queues.iter().enumerate().map(|(i, q)| {
            let q = q.clone();
            async move { q.take_turn(id, &format!("m{i}"), false).await.unwrap() }
        });
        let won: Vec<Turn> = futures_join(tries).await.into_iter().flatten().collect();
        assert_eq!(won.len(), 1, "round {round}: one machine takes the turn, the others see zero rows");
        assert_eq!(won[0].turn, round);
        for (i, q) in queues.iter().enumerate() {
            assert!(q.take_turn(id, &format!("m{i}"), false).await.unwrap().is_none(), "not due again yet");
        }
        age_source(&db, id, MINUTE).await;
    }
    assert!(db.queue.take_turn(id, "cli", true).await.unwrap().is_some(), "a user's poll forces a turn");
}

/// All of `futures` at once.
async fn futures_join<T: Send + 'static>(
    futures: impl Iterator<Item = impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = vec![];
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// A machine that stalled past the interval ends its turn after a newer turn ended: its
/// write names its turn, so it is refused and the newer cursor stands.
async fn a_stale_turn_cannot_move_the_cursor(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("fence");
    let id = source(&db, &orch, "{}").await;
    let slow = db.queue.take_turn(id, "laptop", false).await.unwrap().unwrap();
    age_source(&db, id, MINUTE).await;
    let fast = db.queue.take_turn(id, "desktop", false).await.unwrap().unwrap();
    let end = |c: &str| TurnEnd { cursor: Some(c.into()), ..Default::default() };
    assert!(db.queue.end_turn(&fast, &end("2026-12-02T10:00:00.000Z")).await.unwrap());
    assert!(!db.queue.end_turn(&slow, &end("2026-12-01T00:00:00.000Z")).await.unwrap(), "fenced");
    assert!(!db.queue.turn_failed(&slow, "late", None).await.unwrap(), "fenced too");
    let row = &db.queue.sources(&orch).await.unwrap()[0];
    assert_eq!(row.cursor.as_deref(), Some("2026-12-02T10:00:00.000Z"));
    assert_eq!((row.polled_by.as_deref(), row.last_error.as_deref()), (Some("desktop"), None));
}

/// A turn that saw the budget run low holds the source until the reset: the interval
/// passing is not enough, and only the reset (or a user's forced poll) opens it again.
async fn a_rate_limit_hold_keeps_the_turn_until_its_reset(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("hold");
    let id = source(&db, &orch, "{}").await;
    let t = db.queue.take_turn(id, "m", false).await.unwrap().unwrap();
    let now = db.queue.now_ms().await.unwrap();
    let end = TurnEnd { hold_until: Some(now + 3_600_000), rate_remaining: Some(40), ..Default::default() };
    assert!(db.queue.end_turn(&t, &end).await.unwrap());
    age_source(&db, id, 10 * MINUTE).await;
    assert!(db.queue.take_turn(id, "m", false).await.unwrap().is_none(), "held until the reset");
    let row = &db.queue.sources(&orch).await.unwrap()[0];
    assert_eq!(row.rate_remaining, Some(40));
    assert!(row.next_turn_at() >= now + 3_600_000, "the next turn is the reset");
    db.exec(&format!("UPDATE sources SET hold_until = hold_until - 3600000 WHERE id = {id}")).await;
    assert!(db.queue.take_turn(id, "m", false).await.unwrap().is_some(), "open after the reset");
}

/// Registering the same filter keeps the cursor; a different filter resets it, so the
/// first turn after it reads every issue the new filter matches.
async fn a_changed_filter_resets_the_cursor(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("filter");
    let id = source(&db, &orch, r#"{"label":"agent"}"#).await;
    let t = db.queue.take_turn(id, "m", false).await.unwrap().unwrap();
    let end = TurnEnd { cursor: Some("2026-12-02T10:00:00.000Z".into()), ..Default::default() };
    db.queue.end_turn(&t, &end).await.unwrap();
    assert_eq!(source(&db, &orch, r#"{"label":"agent"}"#).await, id, "the same row");
    assert!(db.queue.sources(&orch).await.unwrap()[0].cursor.is_some(), "same filter: cursor kept");
    source(&db, &orch, r#"{"label":"bot"}"#).await;
    assert_eq!(db.queue.sources(&orch).await.unwrap()[0].cursor, None, "new filter: cursor reset");
}

/// A tracker's job writes one outbox row per reportable change, with the change (a claim, a
/// completion), and a completion a second one after its own, for its pull request; a plain
/// job writes none. Each row names the claim it belongs to.
async fn the_outbox_row_commits_with_the_state_change(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("outbox");
    let sid = source(&db, &orch, "{}").await;
    let opts = JobOptions { key: Some("linear:ENG-1".into()), source: Some(sid), ..Default::default() };
    let tracked = db.queue.enqueue_keyed(&orch, &json!({"title": "ENG-1 x"}), &opts).await.unwrap().id;
    let plain = db.queue.enqueue(&orch, &json!({"title": "plain"})).await.unwrap();
    let claims = db.queue.claim_next(&orch, "desktop", 2).await.unwrap();
    assert_eq!(claims.len(), 2);
    for c in &claims {
        assert!(db.queue.complete(&c.fence, "desktop").await.unwrap());
    }
    assert!(db.queue.outbox_of(plain).await.unwrap().is_empty(), "a plain job owes no tracker");
    let rows = db.queue.outbox_of(tracked).await.unwrap();
    let events: Vec<&str> = rows.iter().map(|r| r.event.as_str()).collect();
    assert_eq!(events, ["claimed", "completed", "pull_request"]);
    assert!(rows.iter().all(|r| r.claim_token == Some(1) && r.source_id == sid && r.done_at.is_none()));
    // A completion the fence refuses changes nothing, so it owes nothing.
    let held = claims.iter().find(|c| c.fence.job == tracked).unwrap();
    assert!(!db.queue.complete(&held.fence, "laptop").await.unwrap());
    assert_eq!(db.queue.outbox_of(tracked).await.unwrap().len(), 3);
}

/// Two machines take deliveries: each row goes to one of them, a job's rows go in order
/// (its second waits while its first is undelivered), a held row is free again only after
/// its lease, and the stalled holder's finish is refused once another took the row. A
/// machine that found nothing to take learns when it may look again: the holder's lease end,
/// or the retry's due time.
async fn one_machine_delivers_each_row_in_order_fenced(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("deliver");
    let sid = source(&db, &orch, "{}").await;
    let opts = JobOptions { key: Some("linear:ENG-2".into()), source: Some(sid), ..Default::default() };
    let job = db.queue.enqueue_keyed(&orch, &json!({"title": "ENG-2"}), &opts).await.unwrap().id;
    let c = db.queue.claim_next(&orch, "desktop", 1).await.unwrap().remove(0);
    db.queue.complete(&c.fence, "desktop").await.unwrap();
    let other = db.another_queue().await;
    let lease = Duration::from_secs(120);

    assert!(db.queue.take_delivery(&orch, &[sid + 1000], "laptop", lease).await.unwrap().is_none(), "not its source");
    let first = db.queue.take_delivery(&orch, &[sid], "laptop", lease).await.unwrap().unwrap();
    assert_eq!((first.job_id, first.event.as_str(), first.tries), (job, "claimed", 1));
    assert!(other.take_delivery(&orch, &[sid], "desktop", lease).await.unwrap().is_none(), "held, and the next waits");
    let due = other.next_delivery_in(&orch, &[sid], lease).await.unwrap().expect("a row waits");
    assert!(due > lease - Duration::from_secs(10) && due <= lease, "free when the holder's lease ends: {due:?}");
    assert_eq!(other.next_delivery_in(&orch, &[sid + 1000], lease).await.unwrap(), None, "not its source");

    db.exec(&format!("UPDATE outbox SET claimed_at = claimed_at - 121000 WHERE id = {}", first.id)).await;
    let again = other.take_delivery(&orch, &[sid], "desktop", lease).await.unwrap().unwrap();
    assert_eq!((again.id, again.tries), (first.id, 2), "the lease ran out: another machine takes it");
    assert!(!db.queue.finish_delivery(&first, &DeliveryEnd::Delivered).await.unwrap(), "the stalled finish is fenced");
    let retry = DeliveryEnd::Retry { after: Duration::from_secs(30), error: "Linear could not be reached".into() };
    assert!(other.finish_delivery(&again, &retry).await.unwrap());
    assert!(db.queue.take_delivery(&orch, &[sid], "laptop", lease).await.unwrap().is_none(), "backing off");
    let due = db.queue.next_delivery_in(&orch, &[sid], lease).await.unwrap().expect("the retry waits");
    assert!(due > Duration::from_secs(20) && due <= Duration::from_secs(30), "due at its retry: {due:?}");
    db.exec(&format!("UPDATE outbox SET next_at = next_at - 31000 WHERE id = {}", first.id)).await;
    let third = db.queue.take_delivery(&orch, &[sid], "laptop", lease).await.unwrap().unwrap();
    assert!(db.queue.finish_delivery(&third, &DeliveryEnd::Delivered).await.unwrap());
    let second = db.queue.take_delivery(&orch, &[sid], "laptop", lease).await.unwrap().unwrap();
    assert_eq!(second.event, "completed", "in order: the completion after the claim");
    let gone = DeliveryEnd::GiveUp { error: "Linear refused the request: Entity not found".into() };
    assert!(db.queue.finish_delivery(&second, &gone).await.unwrap());
    let pr = db.queue.take_delivery(&orch, &[sid], "laptop", lease).await.unwrap().unwrap();
    assert_eq!(pr.event, "pull_request", "the pull request's row, after the completion's");
    assert!(db.queue.finish_delivery(&pr, &DeliveryEnd::Delivered).await.unwrap());
    let rows = db.queue.outbox_of(job).await.unwrap();
    let outcomes: Vec<Option<&str>> = rows.iter().map(|r| r.outcome.as_deref()).collect();
    assert_eq!(outcomes, [Some("delivered"), Some("gave_up"), Some("delivered")]);
    assert!(rows[1].last_error.as_deref().unwrap().contains("Entity not found"), "its error is kept");
    assert!(db.queue.take_delivery(&orch, &[sid], "laptop", lease).await.unwrap().is_none());
    assert_eq!(db.queue.next_delivery_in(&orch, &[sid], lease).await.unwrap(), None, "nothing waits");
}

/// An issue edited while its job waits updates the job (title, prompt, route columns, a
/// history entry); once a machine holds the job, the edit changes nothing.
async fn a_waiting_job_takes_its_issues_new_text_and_a_claimed_one_does_not(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("edit");
    let sid = source(&db, &orch, "{}").await;
    let opts = JobOptions { key: Some("linear:ENG-3".into()), source: Some(sid), ..Default::default() };
    let id = db.queue.enqueue_keyed(&orch, &json!({"title": "ENG-3 old", "prompt": "old"}), &opts).await.unwrap().id;
    let new = json!({"title": "ENG-3 new", "prompt": "new", "requires": ["gpu"]});
    assert!(db.queue.update_waiting(id, &new, "intake:eng").await.unwrap());
    let (row, payload) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((row.title.as_deref(), payload["prompt"].as_str()), (Some("ENG-3 new"), Some("new")));
    assert_eq!(row.requires.0, ["gpu"]);
    assert!(db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "updated"));
    assert!(db.queue.outbox_of(id).await.unwrap().is_empty(), "an edit is not reported back");
    db.exec(&format!("UPDATE dispatch_queue SET requires = NULL WHERE id = {id}")).await;
    let c = db.queue.claim_next(&orch, "desktop", 1).await.unwrap().remove(0);
    assert_eq!(c.fence.job, id);
    assert!(!db.queue.update_waiting(id, &json!({"title": "ENG-3 newer"}), "intake:eng").await.unwrap());
    assert_eq!(db.queue.job(id).await.unwrap().unwrap().0.state, JobState::Running);
}

/// Each kind of state change a tracker's job can go through writes its outbox row with
/// itself, under the claim it belongs to: a failure and the death after it, a park, a
/// hand-off, a sweep of a silent machine, and a cancel (of a waiting job, and of a running
/// one once its holder stopped the agent; the ask itself reports nothing).
async fn every_reportable_change_writes_its_outbox_row(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("kinds");
    let sid = source(&db, &orch, "{}").await;
    let add = |n: i32| {
        let opts = JobOptions {
            key: Some(format!("linear:ENG-{n}")),
            source: Some(sid),
            max_attempts: 2,
            ..Default::default()
        };
        let q = db.queue.clone();
        let orch = orch.clone();
        async move { q.enqueue_keyed(&orch, &json!({"title": format!("ENG-{n}")}), &opts).await.unwrap().id }
    };
    let events = |id: i64| {
        let q = db.queue.clone();
        async move { q.outbox_of(id).await.unwrap().into_iter().map(|r| (r.event, r.claim_token)).collect::<Vec<_>>() }
    };
    let claim = || async { db.queue.claim_next(&orch, "laptop", 1).await.unwrap().remove(0) };
    let now = Backoff { base: Duration::ZERO, max: Duration::ZERO };

    let dying = add(1).await;
    let c = claim().await;
    db.queue.fail_with(&c.fence, "laptop", "boom", now).await.unwrap();
    let c = claim().await;
    db.queue.fail_with(&c.fence, "laptop", "boom again", now).await.unwrap();
    let expect = |v: &[(&str, i64)]| v.iter().map(|(e, t)| (e.to_string(), Some(*t))).collect::<Vec<_>>();
    assert_eq!(events(dying).await, expect(&[("claimed", 1), ("failed", 1), ("claimed", 2), ("dead", 2)]));

    let parked = add(2).await;
    let c = claim().await;
    db.queue.park(&c.fence, "laptop", RetryAfter::In(Duration::from_secs(3600)), Backoff::DEFAULT).await.unwrap();
    assert_eq!(events(parked).await, expect(&[("claimed", 1), ("parked", 1)]));

    let handed = add(3).await;
    let c = claim().await;
    db.queue.release_with(&c.fence, "laptop", "lid closed", Some("devpilot/3-eng-3")).await.unwrap();
    let c = claim().await;
    assert_eq!(c.fence.job, handed);
    db.age_job(handed, Duration::from_secs(3600)).await;
    db.queue.sweep(Some(&orch), Duration::from_secs(60)).await.unwrap();
    assert_eq!(events(handed).await, expect(&[("claimed", 1), ("handed_off", 1), ("claimed", 2), ("swept", 2)]));

    let waiting = add(4).await;
    db.queue.cancel(waiting, "intake:eng").await.unwrap();
    assert_eq!(events(waiting).await, [("cancelled".to_string(), Some(0))]);
    let running = add(5).await;
    let c = loop {
        let c = claim().await;
        if c.fence.job == running {
            break c;
        }
    };
    db.queue.cancel(running, "intake:eng").await.unwrap();
    assert_eq!(events(running).await, expect(&[("claimed", 1)]), "an ask is not an outcome");
    assert!(db.queue.finish_cancel(&c.fence, "laptop").await.unwrap());
    assert_eq!(events(running).await, expect(&[("claimed", 1), ("cancelled", 1)]));
}

/// Retention deletes an old completed plain job but keeps a tracker's: its row is the
/// intake's memory that the issue was taken, and without it the next turn would add the
/// issue again.
async fn retention_keeps_a_trackers_finished_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("keep");
    let sid = source(&db, &orch, "{}").await;
    let opts = JobOptions { key: Some("linear:ENG-1".into()), source: Some(sid), ..Default::default() };
    let tracked = db.queue.enqueue_keyed(&orch, &json!({"title": "ENG-1 x"}), &opts).await.unwrap().id;
    let plain = db.queue.enqueue(&orch, &json!({"title": "plain"})).await.unwrap();
    for c in db.queue.claim_next(&orch, "desktop", 2).await.unwrap() {
        assert!(db.queue.complete(&c.fence, "desktop").await.unwrap());
    }
    let month = Duration::from_secs(31 * 86_400);
    for id in [tracked, plain] {
        db.age_finished(id, month).await;
    }
    db.queue.prune(Some(&orch), &Retention::default(), 100).await.unwrap();
    assert!(db.queue.job(plain).await.unwrap().is_none(), "the plain job is pruned");
    let (kept, _) = db.queue.job(tracked).await.unwrap().expect("the tracker's job is kept");
    assert_eq!(kept.state, JobState::Completed);
    let by_key = db.queue.jobs_by_key(&orch, &["linear:ENG-1".to_string()]).await.unwrap();
    assert_eq!(by_key.len(), 1, "the intake still finds the issue's job by its key");
    assert_eq!(by_key[0].state, JobState::Completed);
}

/// A try at the turn, won or lost (two statements on SQLite, one on PostgreSQL), says whether
/// the source has an open watched pull request and an undelivered outbox row: an idle
/// machine skips the review read and the delivery pass on that answer, so it must follow the
/// rows both ways, and only this source's.
async fn a_try_at_the_turn_says_what_the_source_holds(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("holds");
    let sid = source(&db, &orch, "{}").await;
    let other =
        db.queue.register_source(&orch, &SourceSpec { name: "gh", kind: "github", filter: "{}", interval: MINUTE });
    let other = other.await.unwrap();
    both(&db, sid, Holds::default()).await;

    let opts = JobOptions { key: Some("linear:ENG-1".into()), source: Some(sid), ..Default::default() };
    let job = db.queue.enqueue_keyed(&orch, &json!({"title": "ENG-1"}), &opts).await.unwrap().id;
    let claimed = db.queue.claim_next(&orch, "laptop", 1).await.unwrap().remove(0);
    both(&db, sid, Holds { watched: false, backlog: true }).await;
    let other_try = db.queue.try_turn(other, "laptop", false).await.unwrap();
    assert_eq!(other_try.holds, Holds::default(), "another source's rows are not this one's");

    let d = db.queue.take_delivery(&orch, &[sid], "laptop", MINUTE).await.unwrap().unwrap();
    both(&db, sid, Holds { watched: false, backlog: true }).await;
    assert!(db.queue.finish_delivery(&d, &DeliveryEnd::Delivered).await.unwrap());
    both(&db, sid, Holds::default()).await;

    db.queue.complete(&claimed.fence, "laptop").await.unwrap();
    let url = "https://github.com/acme/webapp/pull/7";
    assert!(db.queue.watch_pull(job, sid, "https://api.github.com", "acme/webapp", 7, url).await.unwrap());
    both(&db, sid, Holds { watched: true, backlog: true }).await;
    while let Some(d) = db.queue.take_delivery(&orch, &[sid], "laptop", MINUTE).await.unwrap() {
        assert!(db.queue.finish_delivery(&d, &DeliveryEnd::Delivered).await.unwrap());
    }
    both(&db, sid, Holds { watched: true, backlog: false }).await;
}

/// Source `sid`'s next turn tried twice, by the machine that takes it and by one that finds
/// it taken: each try says `want`.
async fn both(db: &TestDb, sid: i64, want: Holds) {
    age_source(db, sid, MINUTE).await;
    let won = db.queue.try_turn(sid, "laptop", false).await.unwrap();
    let lost = db.queue.try_turn(sid, "desktop", false).await.unwrap();
    assert!(won.turn.is_some() && lost.turn.is_none(), "one try wins, the other loses");
    assert_eq!((won.holds, lost.holds), (want, want));
}
