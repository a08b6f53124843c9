//! (b) the article's naive claim path and (c) `claim_next`, single and batched: claims per
//! second, wasted attempts and statements per claim.

use std::sync::Arc;
use std::time::{Duration, Instant};

use devpilot_store::Queue;
use sea_orm::DatabaseConnection;
use serde_json::{json, Value};

use crate::common::{connect, log, median, prefill, scalar, Backend, Env, Plan, CLAIMABLE, ORCH};

#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// candidates(orch, 1) then claim_by_id: the article's path.
    Naive,
    /// claim_next with k.
    Pick(u32),
}

pub async fn claim_matrix(env: &Env, backend: Backend, mode: Mode, plan: &Plan) -> Value {
    let mut rows = vec![];
    for claimers in [1usize, 8, 32] {
        let mut runs = vec![];
        for _ in 0..plan.repeats {
            runs.push(claim_run(env, backend, mode, claimers, plan).await);
        }
        let rate = median(runs.iter().map(|r| r["claims_per_s"].as_f64().unwrap()).collect());
        let wasted = median(runs.iter().map(|r| r["wasted_per_claim"].as_f64().unwrap()).collect());
        let stmts = median(runs.iter().map(|r| r["statements_per_claim"].as_f64().unwrap()).collect());
        log(format!("  {} {mode:?} {claimers}: {rate:.0} claims/s, {wasted:.3} wasted/claim", backend.name()));
        rows.push(json!({
            "claimers": claimers, "claims_per_s": rate, "wasted_per_claim": wasted,
            "statements_per_claim": stmts, "runs": runs,
        }));
    }
    json!(rows)
}

async fn claim_run(env: &Env, backend: Backend, mode: Mode, claimers: usize, plan: &Plan) -> Value {
    let url = env.fresh(backend).await;
    let admin = connect(&url, 1).await;
    let n = match (mode, backend) {
        (Mode::Naive, _) => 30_000,
        (Mode::Pick(1), _) => 60_000,
        _ => 200_000,
    };
    prefill(&admin, n).await;
    let mut queues = vec![];
    for _ in 0..claimers {
        queues.push(Queue::new(connect(&url, 1).await));
    }
    let admin = Arc::new(admin);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(plan.secs);
    let mut tasks = vec![];
    for (i, q) in queues.iter().enumerate() {
        let q = q.clone();
        let admin = admin.clone();
        tasks.push(tokio::spawn(async move {
            let machine = format!("c{i}");
            let (claims, wasted, stmts) = claim_until(&q, &admin, &machine, mode, deadline).await;
            (claims, wasted, stmts, start.elapsed())
        }));
    }
    let (mut claims, mut wasted, mut stmts, mut elapsed) = (0u64, 0u64, 0u64, Duration::ZERO);
    for t in tasks {
        let (c, w, s, e) = t.await.unwrap();
        claims += c;
        wasted += w;
        stmts += s;
        elapsed = elapsed.max(e);
    }
    let left = scalar(&admin, CLAIMABLE).await;
    for q in queues {
        q.connection().clone().close().await.ok();
    }
    if let Ok(a) = Arc::try_unwrap(admin) {
        a.close().await.ok();
    }
    json!({
        "claims": claims, "secs": elapsed.as_secs_f64(),
        "claims_per_s": claims as f64 / elapsed.as_secs_f64(),
        "wasted_per_claim": wasted as f64 / claims.max(1) as f64,
        "statements_per_claim": stmts as f64 / claims.max(1) as f64,
        "exhausted": left == 0,
    })
}

/// One claimer of [`claim_run`]: claims as `machine` until `deadline` or until no job is
/// left; returns (claims, wasted attempts, statements).
async fn claim_until(
    q: &Queue,
    admin: &DatabaseConnection,
    machine: &str,
    mode: Mode,
    deadline: Instant,
) -> (u64, u64, u64) {
    let (mut claims, mut wasted, mut stmts) = (0u64, 0u64, 0u64);
    while Instant::now() < deadline {
        match mode {
            Mode::Naive => {
                let ids = q.candidates(ORCH, 1).await.unwrap();
                stmts += 1;
                let Some(id) = ids.first() else { break };
                match q.claim_by_id(*id, ORCH, machine).await.unwrap() {
                    Some(_) => {
                        claims += 1;
                        stmts += 2; // the UPDATE and its history INSERT
                    }
                    None => {
                        wasted += 1;
                        stmts += 1;
                    }
                }
            }
            Mode::Pick(k) => {
                let got = q.claim_next(ORCH, machine, k).await.unwrap();
                stmts += 1;
                if got.is_empty() {
                    if scalar(admin, CLAIMABLE).await == 0 {
                        break;
                    }
                    wasted += 1;
                } else {
                    if q.backend() != sea_orm::DbBackend::Postgres {
                        stmts += 1; // SQLite: the history INSERT (PostgreSQL writes it in the claim)
                    }
                    claims += got.len() as u64;
                }
            }
        }
    }
    (claims, wasted, stmts)
}
