//! The governor's statements, on every backend: a usage limit parks the job that hit it and
//! holds its account fleet-wide in the same fenced write (a stale claim writes neither), the
//! later reset wins and a success ends the hold early, a job (or the fleet) can leave a
//! limit's park for a person, the day's cap (the fleet's and an account's) stops every
//! machine's claims until the day's spend allows them, a job's own cap waits for a person,
//! each warning is given once, and each attempt's cost is one fenced `spend` row. Time passes
//! by moving rows' timestamps, never by sleeping.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::{
    AccountSpend, Fence, GovernedPark, Governor, JobOptions, ParkedFor, PollExtras, Queue, Route, SourceSpec, SpendRow,
    Usage,
};
use devpilot_tests::{Backend, TestDb};
use sea_orm::ConnectionTrait;
use serde_json::json;

devpilot_tests::on_every_backend!(
    a_limit_park_holds_the_account_fleet_wide,
    the_hold_and_the_park_commit_together,
    a_later_reset_wins_and_a_success_ends_the_hold_early,
    a_job_that_must_not_resume_stays_parked,
    the_days_cap_stops_claims_and_the_next_day_claims_again,
    a_job_cap_park_waits_for_a_person,
    a_requeued_parked_job_is_claimed_again,
    the_spend_warning_is_given_once,
    spend_rows_per_attempt,
);

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const WORK: &str = "claude:work";
const HOME: &str = "claude:home";

/// The route of a machine whose agent runs as `account` (`None`: a plain command).
fn runs_as(account: Option<&str>) -> Route {
    governed(Governor { account: account.map(str::to_string), ..Default::default() })
}

fn governed(governor: Governor) -> Route {
    Route { governor, ..Default::default() }
}

/// What machine `machine` with `route` claims (up to `limit`), by job id, sorted.
async fn claim(q: &Queue, orch: &str, machine: &str, limit: u32, route: &Route) -> Vec<i64> {
    let extras = PollExtras { route: Some(route), ..Default::default() };
    let mut ids: Vec<i64> = q
        .claim_next_with(orch, machine, limit, &extras)
        .await
        .unwrap()
        .claims
        .into_iter()
        .map(|c| c.fence.job)
        .collect();
    ids.sort_unstable();
    ids
}

/// Claims one job on `machine` running as `account`, and records that its agent started so.
async fn start(q: &Queue, orch: &str, machine: &str, account: Option<&str>) -> devpilot_store::queue::Claim {
    let extras = PollExtras { route: Some(&runs_as(account)), ..Default::default() };
    let c = q.claim_next_with(orch, machine, 1, &extras).await.unwrap().claims.remove(0);
    assert!(q.record_agent_start(&c.fence, "claude", None, account).await.unwrap());
    c
}

fn limit_park<'a>(until_ms: i64, hold: Option<&'a str>, branch: Option<&'a str>) -> GovernedPark<'a> {
    GovernedPark {
        parked_for: ParkedFor::Limit,
        until_ms,
        reason: "claude hit a usage limit",
        hold,
        resume_branch: branch,
    }
}

fn cost(usd: Option<f64>) -> Usage {
    Usage { cost_usd: usd, ..Default::default() }
}

/// One text value (or NULL) that `sql` selects, on the test's direct connection.
async fn text(db: &TestDb, sql: &str) -> Option<String> {
    let stmt = sea_orm::Statement::from_string(db.queue.backend(), sql);
    let row = db.admin().query_one_raw(stmt).await.unwrap()?;
    row.try_get_by_index::<Option<String>>(0).unwrap()
}

/// One floating-point value (or NULL) that `sql` selects, on the test's direct connection.
async fn real(db: &TestDb, sql: &str) -> Option<f64> {
    let stmt = sea_orm::Statement::from_string(db.queue.backend(), sql);
    let row = db.admin().query_one_raw(stmt).await.unwrap()?;
    row.try_get_by_index::<Option<f64>>(0).unwrap()
}

async fn parked_for(db: &TestDb, id: i64) -> Option<String> {
    text(db, &format!("SELECT parked_for FROM dispatch_queue WHERE id = {id}")).await
}

/// Moves every hold of the database `by` into the past.
async fn age_holds(db: &TestDb, by: i64) {
    db.exec(&format!("UPDATE account_holds SET until_at = until_at - {by}")).await;
}

/// A usage limit parks the job until the reset and holds its account for every machine:
/// another machine of that account claims nothing (not even jobs that are due), a machine of
/// another account claims as before, and once the hold has passed (and the machine's skew)
/// the parked job resumes anywhere from the branch its work was pushed to.
async fn a_limit_park_holds_the_account_fleet_wide(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-hold");
    let ids =
        db.queue.enqueue_many(&orch, &[json!({"title": "a"}), json!({"title": "b"}), json!({"title": "c"})]).await;
    let [j1, j2, j3] = ids.unwrap()[..] else { panic!("three jobs") };
    let desktop = db.another_queue().await;
    let work = runs_as(Some(WORK));
    let c = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    assert_eq!(c.fence.job, j1);
    let now = db.queue.now_ms().await.unwrap();
    let until = now + HOUR;
    let parked =
        db.queue.park_governed(&c.fence, "laptop", &limit_park(until, Some(WORK), Some("devpilot/job-1"))).await;
    assert_eq!(parked.unwrap(), Some((JobState::Queued, until)));
    let (row, _) = db.queue.job(j1).await.unwrap().unwrap();
    assert_eq!((row.state, row.run_at, row.attempts), (JobState::Queued, until, 0));
    assert_eq!(row.last_error.as_deref(), Some("claude hit a usage limit"));
    assert_eq!(parked_for(&db, j1).await.as_deref(), Some("limit"));
    assert_eq!(text(&db, &format!("SELECT account FROM dispatch_queue WHERE id = {j1}")).await.as_deref(), Some(WORK));
    let kinds: Vec<String> = db.queue.history(j1).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["claimed", "parked"]);

    assert_eq!(claim(&desktop, &orch, "desktop", 3, &work).await, Vec::<i64>::new(), "its account is held");
    assert_eq!(claim(&db.queue, &orch, "tablet", 1, &runs_as(Some(HOME))).await, [j2], "another account claims");
    let view = db.queue.governor_view(&orch, now - HOUR).await.unwrap();
    assert_eq!(view.holds.len(), 1, "{view:?}");
    let hold = &view.holds[0];
    assert_eq!(
        (hold.account.as_str(), hold.until_at, hold.machine.as_str(), hold.job_id),
        (WORK, until, "laptop", Some(j1))
    );
    assert_eq!(hold.reason.as_deref(), Some("claude hit a usage limit"));

    age_holds(&db, 2 * HOUR).await;
    db.age_wait(j1, Duration::from_millis(2 * HOUR as u64)).await;
    let skewed = governed(Governor { account: Some(WORK.into()), skew_ms: 2 * HOUR, ..Default::default() });
    assert_eq!(claim(&desktop, &orch, "desktop", 3, &skewed).await, Vec::<i64>::new(), "held for the skew past it");
    assert!(db.queue.governor_view(&orch, now - HOUR).await.unwrap().holds.is_empty(), "an ended hold is not listed");
    assert_eq!(claim(&desktop, &orch, "desktop", 3, &work).await, [j1, j3], "the hold is over");
    let (row, _) = db.queue.job(j1).await.unwrap().unwrap();
    assert_eq!((row.state, row.claimed_by.as_deref(), row.attempts), (JobState::Running, Some("desktop"), 1));
    assert_eq!((row.resume_branch.as_deref(), row.resumed_from.as_deref()), (Some("devpilot/job-1"), Some("laptop")));
    assert_eq!(parked_for(&db, j1).await, None, "the claim clears why it was parked");
}

/// The hold is written only with the park: a stale claim's park writes neither (and leaves
/// a hold already there as it was), and says the lease was lost.
async fn the_hold_and_the_park_commit_together(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-fence");
    db.queue.enqueue_many(&orch, &[json!({"title": "a"}), json!({"title": "b"})]).await.unwrap();
    let a = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    let b = start(&db.queue, &orch, "desktop", Some(WORK)).await;
    let now = db.queue.now_ms().await.unwrap();
    let stale = Fence { job: a.fence.job, token: a.fence.token + 1 };
    let lost = db.queue.park_governed(&stale, "laptop", &limit_park(now + HOUR, Some(WORK), Some("devpilot/a"))).await;
    assert_eq!(lost.unwrap(), None);
    assert!(db.queue.governor_view(&orch, 0).await.unwrap().holds.is_empty(), "no hold without its park");
    let (row, _) = db.queue.job(a.fence.job).await.unwrap().unwrap();
    assert_eq!((row.state, row.claimed_by.as_deref(), row.resume_branch), (JobState::Running, Some("laptop"), None));
    assert_eq!(parked_for(&db, a.fence.job).await, None);
    assert!(db.queue.history(a.fence.job).await.unwrap().iter().any(|e| e.kind == "lease_lost"));

    let parked = db.queue.park_governed(&a.fence, "laptop", &limit_park(now + HOUR, Some(WORK), None)).await;
    assert_eq!(parked.unwrap(), Some((JobState::Queued, now + HOUR)));
    let stale = Fence { job: b.fence.job, token: b.fence.token - 1 };
    let lost = db.queue.park_governed(&stale, "desktop", &limit_park(now + 5 * HOUR, Some(WORK), None)).await;
    assert_eq!(lost.unwrap(), None);
    let holds = db.queue.governor_view(&orch, 0).await.unwrap().holds;
    assert_eq!(holds.len(), 1);
    assert_eq!(
        (holds[0].until_at, holds[0].job_id, holds[0].machine.as_str()),
        (now + HOUR, Some(a.fence.job), "laptop")
    );
    assert_eq!(db.queue.job(b.fence.job).await.unwrap().unwrap().0.state, JobState::Running);
}

/// Two parks under one account keep the later reset, whichever comes last; a success ends
/// the hold at once (once), the held machines claim again, and the jobs parked on the
/// account's limit are claimable at once, not at their reset.
async fn a_later_reset_wins_and_a_success_ends_the_hold_early(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-later");
    let ids =
        db.queue.enqueue_many(&orch, &[json!({"title": "a"}), json!({"title": "b"}), json!({"title": "c"})]).await;
    let [j1, j2, j3] = ids.unwrap()[..] else { panic!("three jobs") };
    let desktop = db.another_queue().await;
    let a = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    let b = start(&desktop, &orch, "desktop", Some(WORK)).await;
    let now = db.queue.now_ms().await.unwrap();
    let later = db.queue.park_governed(&a.fence, "laptop", &limit_park(now + 2 * HOUR, Some(WORK), None)).await;
    assert_eq!(later.unwrap(), Some((JobState::Queued, now + 2 * HOUR)));
    let earlier = desktop.park_governed(&b.fence, "desktop", &limit_park(now + HOUR, Some(WORK), None)).await;
    assert_eq!(earlier.unwrap(), Some((JobState::Queued, now + HOUR)), "its own job waits for its own reset");
    let holds = db.queue.governor_view(&orch, 0).await.unwrap().holds;
    assert_eq!(holds.len(), 1, "one hold per account");
    assert_eq!((holds[0].until_at, holds[0].machine.as_str()), (now + 2 * HOUR, "desktop"), "the later reset wins");

    assert_eq!(claim(&desktop, &orch, "desktop", 1, &runs_as(Some(WORK))).await, Vec::<i64>::new());
    assert!(db.queue.end_hold(&orch, WORK).await.unwrap());
    assert!(!desktop.end_hold(&orch, WORK).await.unwrap(), "it ends once");
    assert!(db.queue.governor_view(&orch, 0).await.unwrap().holds.is_empty());
    assert_eq!(
        claim(&desktop, &orch, "desktop", 3, &runs_as(Some(WORK))).await,
        [j1, j2, j3],
        "the jobs parked on its limit wait no more"
    );
}

/// A job that must not resume after a limit stays parked when its hold is over, for every
/// machine, until a person lets it go; the fleet's switch does the same to every job parked
/// on a limit while it is on.
async fn a_job_that_must_not_resume_stays_parked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-stay");
    let j = db.queue.enqueue(&orch, &json!({"title": "a"})).await.unwrap();
    let other = db.another_queue().await;
    assert!(db.queue.set_resume_after_limit(&orch, j, false).await.unwrap());
    let c = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    let now = db.queue.now_ms().await.unwrap();
    db.queue.park_governed(&c.fence, "laptop", &limit_park(now + HOUR, Some(WORK), None)).await.unwrap().unwrap();
    age_holds(&db, 2 * HOUR).await;
    db.age_wait(j, Duration::from_millis(2 * HOUR as u64)).await;
    assert!(db.queue.governor_view(&orch, 0).await.unwrap().holds.is_empty());
    for (q, machine, route) in [
        (&db.queue, "laptop", runs_as(Some(WORK))),
        (&other, "desktop", runs_as(Some(HOME))),
        (&other, "tablet", runs_as(None)),
    ] {
        assert_eq!(claim(q, &orch, machine, 1, &route).await, Vec::<i64>::new(), "{machine}: it waits for a person");
    }
    assert_eq!(db.queue.candidates(&orch, 5).await.unwrap(), Vec::<i64>::new());
    assert!(db.queue.let_go(&orch, j, "me").await.unwrap());
    assert!(!other.let_go(&orch, j, "me").await.unwrap(), "it is let go once");
    let events = db.queue.history(j).await.unwrap();
    let last = events.last().unwrap();
    assert_eq!((last.kind.as_str(), last.machine.as_deref()), ("requeued", Some("me")));
    assert_eq!(claim(&other, &orch, "desktop", 1, &runs_as(Some(WORK))).await, [j]);

    let k = db.queue.enqueue(&orch, &json!({"title": "b"})).await.unwrap();
    let c = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    assert_eq!(c.fence.job, k);
    db.queue.set_limits_paused(&orch, true, "me").await.unwrap();
    let now = db.queue.now_ms().await.unwrap();
    let parked = db.queue.park_governed(&c.fence, "laptop", &limit_park(now - 1000, None, None)).await.unwrap();
    let (state, run_at) = parked.unwrap();
    assert!(state == JobState::Queued && run_at >= now, "due at once: {state:?} {run_at} < {now}");
    assert!(db.queue.governor_view(&orch, 0).await.unwrap().limits_paused);
    assert_eq!(claim(&other, &orch, "desktop", 1, &runs_as(Some(WORK))).await, Vec::<i64>::new(), "the fleet's switch");
    assert_eq!(claim(&db.queue, &orch, "tablet", 1, &runs_as(None)).await, Vec::<i64>::new(), "the fleet's switch");
    other.set_limits_paused(&orch, false, "me").await.unwrap();
    assert!(!db.queue.governor_view(&orch, 0).await.unwrap().limits_paused);
    assert_eq!(claim(&other, &orch, "desktop", 1, &runs_as(Some(WORK))).await, [k]);
}

/// Past the fleet's cap on the day's spend no machine claims; past an account's cap only
/// that account's machines stop; spend from before the start of the day does not count.
async fn the_days_cap_stops_claims_and_the_next_day_claims_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-day");
    let desktop = db.another_queue().await;
    for title in ["a", "b"] {
        db.queue.enqueue(&orch, &json!({ "title": title })).await.unwrap();
        let c = start(&db.queue, &orch, "laptop", Some(WORK)).await;
        assert!(db.queue.record_agent_usage(&c.fence, &cost(Some(6.0))).await.unwrap());
        assert!(db.queue.complete(&c.fence, "laptop").await.unwrap());
    }
    let c3 = db.queue.enqueue(&orch, &json!({"title": "c"})).await.unwrap();
    let c4 = db.queue.enqueue(&orch, &json!({"title": "d"})).await.unwrap();
    let day = db.queue.now_ms().await.unwrap() - HOUR;
    assert_eq!(db.queue.spent_since(&orch, day, None).await.unwrap(), 12.0);
    assert_eq!(db.queue.spent_since(&orch, day, Some(WORK)).await.unwrap(), 12.0);
    assert_eq!(db.queue.spent_since(&orch, day, Some(HOME)).await.unwrap(), 0.0);
    let view = db.queue.governor_view(&orch, day).await.unwrap();
    assert_eq!(view.day_spent_usd, 12.0);
    assert_eq!(view.by_account, [AccountSpend { account: Some(WORK.into()), spent_usd: 12.0 }]);

    let fleet_cap = |account: &str, cap: f64| {
        governed(Governor {
            account: Some(account.into()),
            day_start_ms: day,
            day_usd: Some(cap),
            ..Default::default()
        })
    };
    assert_eq!(claim(&db.queue, &orch, "laptop", 2, &fleet_cap(WORK, 10.0)).await, Vec::<i64>::new(), "past the cap");
    assert_eq!(claim(&desktop, &orch, "desktop", 2, &fleet_cap(HOME, 10.0)).await, Vec::<i64>::new(), "fleet-wide");
    assert_eq!(claim(&desktop, &orch, "desktop", 2, &fleet_cap(HOME, 12.0)).await, Vec::<i64>::new(), "at the cap");
    let account_cap = |account: &str| {
        governed(Governor {
            account: Some(account.into()),
            day_start_ms: day,
            account_day_usd: Some(10.0),
            ..Default::default()
        })
    };
    assert_eq!(claim(&db.queue, &orch, "laptop", 1, &account_cap(WORK)).await, Vec::<i64>::new(), "its account's cap");
    assert_eq!(claim(&desktop, &orch, "desktop", 1, &account_cap(HOME)).await, [c3], "another account spent nothing");

    db.exec(&format!("UPDATE spend SET at = at - {DAY}")).await;
    assert_eq!(db.queue.spent_since(&orch, day, None).await.unwrap(), 0.0);
    assert_eq!(db.queue.governor_view(&orch, day).await.unwrap().by_account, []);
    assert_eq!(claim(&db.queue, &orch, "laptop", 2, &fleet_cap(WORK, 10.0)).await, [c4], "a new day");
    // The quarter hours' totals follow every write to `spend`: moved, then deleted.
    assert_eq!(db.queue.spent_since(&orch, day - DAY - HOUR, Some(WORK)).await.unwrap(), 12.0, "counted yesterday");
    db.exec(&format!("DELETE FROM spend WHERE orchestrator_id = '{orch}'")).await;
    assert_eq!(db.queue.spent_since(&orch, 0, None).await.unwrap(), 0.0, "a deleted row leaves the totals");
}

/// A park on the job's own cap is not claimable even when due, until a person lets it go,
/// which counts its cap again from what it has spent (and may warn again); a park on the
/// day's cap is claimable when due.
async fn a_job_cap_park_waits_for_a_person(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-jobcap");
    let j = db.queue.enqueue(&orch, &json!({"title": "a"})).await.unwrap();
    let c = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    assert_eq!(c.spent_usd, 0.0);
    assert!(db.queue.record_agent_usage(&c.fence, &cost(Some(6.0))).await.unwrap());
    assert!(db.queue.warn_spend_once(&c.fence, "laptop", "80 % of its $7 cap").await.unwrap());
    let now = db.queue.now_ms().await.unwrap();
    let park = GovernedPark {
        parked_for: ParkedFor::JobCap,
        until_ms: now - 1000,
        reason: "its $7 cap",
        hold: None,
        resume_branch: None,
    };
    let (state, run_at) = db.queue.park_governed(&c.fence, "laptop", &park).await.unwrap().unwrap();
    assert!(state == JobState::Queued && run_at >= now, "due: {state:?} {run_at} < {now}");
    db.age_wait(j, Duration::from_secs(3600)).await;
    assert_eq!(
        claim(&db.queue, &orch, "laptop", 1, &runs_as(Some(WORK))).await,
        Vec::<i64>::new(),
        "waits for a person"
    );
    assert_eq!(db.queue.claim_next(&orch, "desktop", 1).await.unwrap(), [], "on a machine with no route too");
    assert_eq!(parked_for(&db, j).await.as_deref(), Some("job_cap"));
    assert_eq!(real(&db, &format!("SELECT cap_base_usd FROM dispatch_queue WHERE id = {j}")).await, Some(0.0));

    assert!(db.queue.let_go(&orch, j, "me").await.unwrap());
    assert_eq!(parked_for(&db, j).await, None);
    assert_eq!(real(&db, &format!("SELECT cap_base_usd FROM dispatch_queue WHERE id = {j}")).await, Some(6.0));
    let c = db.queue.claim_next(&orch, "desktop", 1).await.unwrap().remove(0);
    assert_eq!((c.fence.job, c.spent_usd), (j, 0.0), "its cap counts from what it had spent");
    assert!(db.queue.warn_spend_once(&c.fence, "desktop", "80 % again").await.unwrap(), "let go, it may warn again");

    let k = db.queue.enqueue(&orch, &json!({"title": "b"})).await.unwrap();
    let d = start(&db.queue, &orch, "laptop", None).await;
    assert_eq!(d.fence.job, k);
    let park = GovernedPark {
        parked_for: ParkedFor::DayCap,
        until_ms: now - 1000,
        reason: "the day's cap",
        hold: None,
        resume_branch: None,
    };
    db.queue.park_governed(&d.fence, "laptop", &park).await.unwrap().unwrap();
    assert_eq!(parked_for(&db, k).await.as_deref(), Some("day_cap"));
    assert_eq!(
        claim(&db.queue, &orch, "laptop", 1, &runs_as(None)).await,
        [k],
        "a day's cap park is claimable when due"
    );
}

/// A job cancelled while parked at its own cap, then requeued by a person, is claimed again
/// (its park is over) and its cap counts from what it had spent, as a let-go's does.
async fn a_requeued_parked_job_is_claimed_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-requeue");
    let j = db.queue.enqueue(&orch, &json!({"title": "a"})).await.unwrap();
    let c = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    assert!(db.queue.record_agent_usage(&c.fence, &cost(Some(6.0))).await.unwrap());
    assert!(db.queue.warn_spend_once(&c.fence, "laptop", "80 % of its $7 cap").await.unwrap());
    let now = db.queue.now_ms().await.unwrap();
    let park = GovernedPark {
        parked_for: ParkedFor::JobCap,
        until_ms: now,
        reason: "its $7 cap",
        hold: None,
        resume_branch: None,
    };
    db.queue.park_governed(&c.fence, "laptop", &park).await.unwrap().unwrap();
    assert!(db.queue.cancel(j, "me").await.unwrap().is_some(), "the parked job is cancelled");
    assert_eq!(parked_for(&db, j).await.as_deref(), Some("job_cap"), "cancelling leaves the park's reason");

    assert!(db.queue.requeue(j, "me").await.unwrap());
    assert_eq!(parked_for(&db, j).await, None);
    let c = db.queue.claim_next(&orch, "desktop", 1).await.unwrap();
    assert_eq!(c.iter().map(|c| (c.fence.job, c.spent_usd)).collect::<Vec<_>>(), [(j, 0.0)], "claimed, its cap afresh");
    assert!(db.queue.warn_spend_once(&c[0].fence, "desktop", "80 % again").await.unwrap(), "and it may warn again");
}

/// The warning of a job's cap is given once however many machines give it, with one
/// `spend_warning` history entry and (a tracker's job) one outbox row; the day's warning is
/// given once a day by the whole fleet, without touching the fleet's limit switch.
async fn the_spend_warning_is_given_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-warn");
    let other = db.another_queue().await;
    let spec = SourceSpec { name: "gh", kind: "github", filter: "{}", interval: Duration::from_secs(60) };
    let sid = db.queue.register_source(&orch, &spec).await.unwrap();
    let opts = JobOptions { key: Some("github:acme/webapp#7".into()), source: Some(sid), ..Default::default() };
    let j = db.queue.enqueue_keyed(&orch, &json!({"title": "Fix it"}), &opts).await.unwrap().id;
    let c = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    assert_eq!(c.fence.job, j);
    let stale = Fence { job: j, token: c.fence.token + 1 };
    assert!(!db.queue.warn_spend_once(&stale, "laptop", "stale").await.unwrap(), "a stale claim warns nothing");
    let (a, b) = tokio::join!(
        db.queue.warn_spend_once(&c.fence, "laptop", "$4.00 of its $5.00 cap"),
        other.warn_spend_once(&c.fence, "laptop", "$4.00 of its $5.00 cap")
    );
    assert_eq!([a.unwrap(), b.unwrap()].iter().filter(|w| **w).count(), 1, "one of the two gives it");
    assert!(!other.warn_spend_once(&c.fence, "laptop", "again").await.unwrap());
    let warned: Vec<_> = db.queue.history(j).await.unwrap().into_iter().filter(|e| e.kind == "spend_warning").collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(
        (warned[0].machine.as_deref(), warned[0].detail.as_deref()),
        (Some("laptop"), Some("$4.00 of its $5.00 cap"))
    );
    assert_eq!(warned[0].claim_token, Some(c.fence.token));
    let events: Vec<String> = db.queue.outbox_of(j).await.unwrap().into_iter().map(|r| r.event).collect();
    assert_eq!(events, ["claimed", "spend_warning"]);

    let day = db.queue.now_ms().await.unwrap() - HOUR;
    db.queue.set_limits_paused(&orch, true, "me").await.unwrap();
    let (a, b) = tokio::join!(db.queue.warn_day_once(&orch, day), other.warn_day_once(&orch, day));
    assert_eq!([a.unwrap(), b.unwrap()].iter().filter(|w| **w).count(), 1, "one machine gives the day's warning");
    assert!(!db.queue.warn_day_once(&orch, day).await.unwrap(), "once a day");
    assert!(other.warn_day_once(&orch, day + DAY).await.unwrap(), "the next day's");
    assert!(!db.queue.warn_day_once(&orch, day + DAY).await.unwrap());
    assert!(db.queue.governor_view(&orch, day).await.unwrap().limits_paused, "the switch is left as it was");
    let fresh = db.orch("gov-warn-fresh");
    assert!(db.queue.warn_day_once(&fresh, day).await.unwrap(), "a fleet with no governor row yet");
    assert!(!db.queue.governor_view(&fresh, day).await.unwrap().limits_paused);
}

/// Each attempt that reported a cost is one `spend` row with its claim, machine and account,
/// committed with the job's totals; no cost (or none worth a row) writes none, and a stale
/// claim writes neither the row nor the totals.
async fn spend_rows_per_attempt(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("gov-spend");
    let desktop = db.another_queue().await;
    let j = db.queue.enqueue(&orch, &json!({"title": "a"})).await.unwrap();
    let first = start(&db.queue, &orch, "laptop", Some(WORK)).await;
    assert!(db.queue.record_agent_usage(&first.fence, &cost(Some(1.5))).await.unwrap());
    assert!(db.queue.record_agent_usage(&first.fence, &cost(None)).await.unwrap());
    assert!(db.queue.record_agent_usage(&first.fence, &cost(Some(0.0))).await.unwrap());
    assert_eq!(db.queue.job_spend(j).await.unwrap().len(), 1, "no row without a cost");
    assert!(db.queue.release(&first.fence, "laptop", "handing off").await.unwrap());

    let second = start(&desktop, &orch, "desktop", Some(HOME)).await;
    assert_eq!((second.fence.job, second.spent_usd), (j, 1.5), "the claim says what the job spent before it");
    assert!(!db.queue.record_agent_usage(&first.fence, &cost(Some(3.0))).await.unwrap(), "a stale claim");
    assert!(!db.queue.record_agent_start(&first.fence, "claude", None, Some(WORK)).await.unwrap());
    assert!(desktop.record_agent_usage(&second.fence, &cost(Some(2.5))).await.unwrap());

    let spend = db.queue.job_spend(j).await.unwrap();
    let now = db.queue.now_ms().await.unwrap();
    assert!(spend.iter().all(|r| r.at > now - HOUR && r.at <= now), "written at the database's now: {spend:?}");
    let expected = |claim_token: i64, machine: &str, account: &str, cost_usd: f64| SpendRow {
        job_id: j,
        claim_token,
        machine: Some(machine.into()),
        account: Some(account.into()),
        cost_usd,
        at: 0,
    };
    assert_eq!(
        spend.into_iter().map(|r| SpendRow { at: 0, ..r }).collect::<Vec<_>>(),
        [expected(first.fence.token, "laptop", WORK, 1.5), expected(second.fence.token, "desktop", HOME, 2.5)]
    );
    let (row, _) = db.queue.job(j).await.unwrap().unwrap();
    assert_eq!(row.agent.cost_usd, Some(4.0), "the job's total has no stale cost in it");
    assert_eq!(db.queue.spent_since(&orch, 0, None).await.unwrap(), 4.0);
    assert_eq!(db.queue.spent_since(&orch, 0, Some(HOME)).await.unwrap(), 2.5);
    assert_eq!(text(&db, &format!("SELECT account FROM dispatch_queue WHERE id = {j}")).await.as_deref(), Some(HOME));
}
