//! (l)'s timed runs and its herd check: machines claiming through the public poll,
//! `Queue::claim_next_with` with `PollExtras { route, .. }`, on a fresh database of
//! [`crate::governor_db`]. Measured by [`crate::governor`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use devpilot_store::queue::{PollExtras, Route};
use devpilot_store::Queue;
use sea_orm::DatabaseConnection;
use serde_json::{json, Value};

use crate::common::{connect, log, scalar, Env, CLAIMABLE, ORCH};
use crate::governor_db::{drop_db, fresh, server_stats, Variant, SPEND_TODAY};

/// What the claimers of one run did together.
#[derive(Default)]
struct Tally {
    claims: u64,
    polls: u64,
    /// Polls that found nothing while claimable jobs were left.
    wasted: u64,
    elapsed: Duration,
}

/// The queue a run starts with: empty for an idle machine, 5,000 jobs a held machine may
/// not take, and enough that the claimers do not run out in the run's time.
fn jobs_for(variant: Variant, k: u32, idle: bool) -> i64 {
    match (idle, variant, k) {
        (true, _, _) => 0,
        (_, Variant::Held, _) => 5_000,
        (_, _, 1) => 60_000,
        _ => 200_000,
    }
}

async fn queues(url: &str, n: usize) -> Vec<Queue> {
    let mut out = vec![];
    for _ in 0..n {
        out.push(Queue::new(connect(url, 1).await));
    }
    out
}

async fn close(queues: Vec<Queue>, admin: DatabaseConnection) {
    for q in queues {
        q.connection().clone().close().await.ok();
    }
    admin.close().await.ok();
}

/// Each queue a machine polling for `k` jobs at a time with `route` until `secs` have gone
/// by; one that is not `keep_polling` stops when the queue has no claimable job left.
async fn poll_for(
    queues: &[Queue],
    admin: &DatabaseConnection,
    route: &Route,
    k: u32,
    keep_polling: bool,
    secs: u64,
) -> Tally {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut tasks = vec![];
    for (i, q) in queues.iter().enumerate() {
        let (q, admin, route) = (q.clone(), admin.clone(), route.clone());
        tasks.push(tokio::spawn(async move {
            let machine = format!("c{i}");
            let extras = PollExtras { route: Some(&route), ..PollExtras::default() };
            let mut t = Tally::default();
            while Instant::now() < deadline {
                let got = q.claim_next_with(ORCH, &machine, k, &extras).await.unwrap().claims.len();
                t.polls += 1;
                if got > 0 {
                    t.claims += got as u64;
                } else if !keep_polling {
                    if scalar(&admin, CLAIMABLE).await == 0 {
                        break;
                    }
                    t.wasted += 1;
                }
            }
            t.elapsed = start.elapsed();
            t
        }));
    }
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.unwrap();
        all.claims += t.claims;
        all.polls += t.polls;
        all.wasted += t.wasted;
        all.elapsed = all.elapsed.max(t.elapsed);
    }
    all
}

/// One timed run: `claimers` machines of `variant`, each polling for `k` at a time for
/// `secs`. `idle`: on an empty queue (every poll finds nothing). A held machine polls a
/// queue it may not take.
pub async fn once(env: &Env, variant: Variant, claimers: usize, k: u32, idle: bool, secs: u64) -> Value {
    let keep_polling = idle || variant == Variant::Held;
    let (url, admin, day) = fresh(env, jobs_for(variant, k, idle), SPEND_TODAY).await;
    let queues = queues(&url, claimers).await;
    let t = poll_for(&queues, &admin, &variant.route(day), k, keep_polling, secs).await;
    let secs = t.elapsed.as_secs_f64();
    // No row claimed twice: one `claimed` event per claimed row, and one attempt each.
    let claimed_rows = scalar(&admin, "SELECT count(*) AS n FROM dispatch_queue WHERE claimed_at IS NOT NULL").await;
    let events = scalar(&admin, "SELECT count(*) AS n FROM job_events WHERE kind = 'claimed'").await;
    let twice = scalar(&admin, "SELECT count(*) AS n FROM dispatch_queue WHERE attempts > 1").await;
    let left = scalar(&admin, CLAIMABLE).await;
    close(queues, admin).await;
    let (server_calls, server_mean_ms, server_plans, server_plan_ms) = server_stats(env, &Env::dbname(&url)).await;
    drop_db(env, &url).await;
    json!({
        "variant": variant.name(), "claimers": claimers, "k": k, "idle": idle,
        "claims": t.claims, "polls": t.polls, "secs": secs,
        "claims_per_s": t.claims as f64 / secs,
        "polls_per_s": t.polls as f64 / secs,
        // Each claimer's mean wait for one poll statement, as the client sees it.
        "ms_per_poll": 1000.0 * secs * claimers as f64 / t.polls.max(1) as f64,
        "wasted_per_claim": t.wasted as f64 / t.claims.max(1) as f64,
        "server_calls": server_calls,
        "server_ms_per_poll": server_mean_ms,
        // Planning, apart: how often the prepared poll was planned again, and its ms per poll.
        "server_plans_per_poll": server_plans as f64 / server_calls.max(1) as f64,
        "server_plan_ms_per_poll": server_plan_ms,
        "statements_per_poll": server_calls as f64 / t.polls.max(1) as f64,
        "claimed_rows": claimed_rows, "claimed_events": events, "claimed_twice": twice,
        "exhausted": !keep_polling && left == 0,
    })
}

/// Each machine's job ids in each release: `per_rep[release][machine]`.
async fn released(queues: &[Queue], route: &Route, k: u32, reps: usize) -> Vec<Vec<Vec<i64>>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(queues.len()));
    let mut tasks = vec![];
    for (i, q) in queues.iter().enumerate() {
        let (q, route, barrier) = (q.clone(), route.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let machine = format!("h{i}");
            let extras = PollExtras { route: Some(&route), ..PollExtras::default() };
            let mut got = vec![];
            for _ in 0..reps {
                barrier.wait().await;
                let claimed = q.claim_next_with(ORCH, &machine, k, &extras).await.unwrap();
                got.push(claimed.claims.iter().map(|c| c.fence.job).collect::<Vec<i64>>());
            }
            got
        }));
    }
    let mut per_rep: Vec<Vec<Vec<i64>>> = vec![vec![]; reps];
    for t in tasks {
        for (rep, ids) in t.await.unwrap().into_iter().enumerate() {
            per_rep[rep].push(ids);
        }
    }
    per_rep
}

/// Herd check with the governor on: `claimers` machines released together by a barrier,
/// each claiming `k` once, `reps` times on one database. Herd-free: every machine gets `k`
/// rows and no row is handed out twice.
pub async fn herd(env: &Env, claimers: usize, k: u32, reps: usize) -> Value {
    let jobs = (claimers * k as usize * reps) as i64 + 1_000;
    let (url, admin, day) = fresh(env, jobs, SPEND_TODAY).await;
    let queues = queues(&url, claimers).await;
    let per_rep = released(&queues, &Variant::On.route(day), k, reps).await;
    let (mut short, mut dup, mut min_distinct) = (0usize, 0usize, usize::MAX);
    for rep in &per_rep {
        short += rep.iter().filter(|ids| ids.len() < k as usize).count();
        let all: Vec<i64> = rep.iter().flatten().copied().collect();
        let mut distinct = all.clone();
        distinct.sort_unstable();
        distinct.dedup();
        dup += all.len() - distinct.len();
        min_distinct = min_distinct.min(distinct.len());
    }
    let twice = scalar(&admin, "SELECT count(*) AS n FROM dispatch_queue WHERE attempts > 1").await;
    close(queues, admin).await;
    drop_db(env, &url).await;
    let ok = short == 0 && dup == 0 && twice == 0;
    log(format!(
        "  (l) herd, governor on: {claimers} claimers × k = {k}, {reps} releases: fewest distinct rows {min_distinct} of {}, {short} short, {dup} duplicates",
        claimers * k as usize
    ));
    json!({
        "claimers": claimers, "k": k, "releases": reps,
        "rows_per_release": claimers * k as usize, "fewest_distinct_rows": min_distinct,
        "short_claims": short, "duplicates": dup, "claimed_twice": twice, "herd_free": ok,
    })
}
