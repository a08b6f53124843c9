//! (l) The claim with the governor (issue 42): what its predicate costs the claim, in
//! alternated rounds.
//!
//! Every run claims through the public poll, `Queue::claim_next_with` with
//! `PollExtras { route, .. }` (the statement a machine sends), on a fresh database holding
//! the same rows ([`crate::governor_db`]): a pre-filled queue, 50 unexpired holds on other
//! accounts and 10,000 spend rows today (and as many yesterday) across 20 accounts, written
//! into `spend`, whose triggers keep `spend_quarters`, the running totals per account and
//! quarter hour the claim reads the day's spend from. Only the machine's route differs:
//!
//! - **off**: `Route::default()`, today's claim text (the governor's part of it is only the
//!   parked-job test, which reads no table unless a job is parked on a limit);
//! - **holds only**: a machine running as `claude:work` with 30 s of skew and no day cap:
//!   the holds are present but none is its own, so it claims the same jobs as off;
//! - **on**: the same with both day caps on (at 1e9 USD, so nothing is capped): the day's
//!   spend read too, the fleet's and the account's;
//! - **held**: the on route for a machine whose account is held: it claims nothing, the
//!   cost of saying no.
//!
//! Each round runs every shape's variants one after the other (off, holds only, on), then an
//! idle machine's poll (an empty queue; off, holds only, on), then the held machine; each
//! figure is the median of its rounds and a ratio is the variant's claim cost (1 ÷ the
//! medians' claims/s) ÷ off's, with the per-round ratios as its spread. Also: the server's
//! own execution time per poll (pg_stat_statements), the plans PostgreSQL ran (auto_explain
//! with `log_analyze`, [`crate::governor_plans`]), a herd check with the governor on
//! ([`crate::governor_run`]), and the prepared poll's planning when nothing was spent today.

use serde_json::{json, Value};

use crate::common::{log, median, Plan};
use crate::governor_db::{Variant, ACCOUNT, HELD_ACCOUNT, HOLDS, SPEND_ACCOUNTS, SPEND_TODAY};
use crate::governor_plans::{nothing_today, plans};
use crate::governor_run::{herd, once};

/// The rounds of each variant.
pub const ROUNDS: usize = 3;
/// The target: the claim's cost with holds present (and, reported against the same figure,
/// with the day caps on too), at most this many times its cost without the governor.
pub const TARGET: f64 = 1.10;
/// (claimers, jobs per claim statement) of each timed claim run.
const SHAPES: &[(usize, u32)] = &[(1, 1), (32, 1), (32, 16)];
/// The held machine's claimers: one, and 32 saying no together.
const HELD_SHAPES: &[usize] = &[1, 32];
/// The variants of each shape and of the idle poll, in each round's order.
const VARIANTS: &[Variant] = &[Variant::Off, Variant::HoldsOnly, Variant::On];
/// The governed variants, compared with off.
const GOVERNED: &[&str] = &["holds_only", "on"];

/// Logs a run and keeps it, with its round.
fn record(runs: &mut Vec<Value>, mut r: Value, round: usize) {
    log(format!(
        "  (l) round {} {} {} × k = {}{}: {:.0} claims/s, {:.0} polls/s, {:.3} ms per poll (server: execution {:.3} ms, planning {:.3} ms, planned {:.2} × per poll), {:.3} wasted/claim",
        round + 1,
        r["variant"].as_str().unwrap_or("?"),
        r["claimers"],
        r["k"],
        if r["idle"].as_bool() == Some(true) { " idle" } else { "" },
        r["claims_per_s"].as_f64().unwrap_or(0.0),
        r["polls_per_s"].as_f64().unwrap_or(0.0),
        r["ms_per_poll"].as_f64().unwrap_or(0.0),
        r["server_ms_per_poll"].as_f64().unwrap_or(0.0),
        r["server_plan_ms_per_poll"].as_f64().unwrap_or(0.0),
        r["server_plans_per_poll"].as_f64().unwrap_or(0.0),
        r["wasted_per_claim"].as_f64().unwrap_or(0.0),
    ));
    r["round"] = json!(round + 1);
    runs.push(r);
}

/// One round: every shape's variants, the idle poll's, then the held machine.
async fn round(env: &crate::common::Env, secs: u64, round: usize, runs: &mut Vec<Value>) {
    for &(claimers, k) in SHAPES {
        for &variant in VARIANTS {
            record(runs, once(env, variant, claimers, k, false, secs).await, round);
        }
    }
    for &variant in VARIANTS {
        record(runs, once(env, variant, 1, 1, true, secs).await, round);
    }
    for &claimers in HELD_SHAPES {
        record(runs, once(env, Variant::Held, claimers, 1, false, secs).await, round);
    }
}

/// (l): the plans, the rounds and the herd check.
pub async fn measure(env: &crate::common::Env, plan: &Plan) -> Value {
    let rounds = if plan.repeats == 1 { 1 } else { ROUNDS };
    log("  (l) the plans: auto_explain of the poll, off, holds only, on, held and idle");
    let plans = plans(env).await;
    log(format!(
        "  (l) spend_quarters against spend: {}; InitPlans once: {}, the day's sums once each from spend_quarters: {}, no scan of spend: {}",
        plans["quarters"], plans["initplans_once"], plans["quarters_once"], plans["no_spend_scan"]
    ));
    let quiet = nothing_today(env).await;
    log(format!("  (l) nothing spent today: {quiet}"));
    let mut runs: Vec<Value> = vec![];
    for r in 0..rounds {
        round(env, plan.secs, r, &mut runs).await;
    }
    let shapes: Vec<Value> = SHAPES.iter().map(|&(claimers, k)| summary(&runs, claimers, k)).collect();
    let herd = json!([herd(env, 32, 1, 20).await, herd(env, 32, 16, 10).await]);
    let worst = |key: &str| shapes.iter().filter_map(|s| s[key]["cost_ratio"].as_f64()).fold(f64::NAN, f64::max);
    json!({
        "setup": {
            "holds_other_accounts": HOLDS, "spend_rows_today": SPEND_TODAY, "spend_rows_yesterday": SPEND_TODAY,
            "spend_accounts": SPEND_ACCOUNTS, "account": ACCOUNT, "held_account": HELD_ACCOUNT,
            "holds_only": "Governor { account: Some(\"claude:work\"), skew_ms: 30000, ..Default::default() }",
            "governor": "Governor { account: Some(\"claude:work\"), skew_ms: 30000, day_start_ms: <today 00:00 UTC>, day_usd: Some(1e9), account_day_usd: Some(1e9) }",
            "secs": plan.secs, "rounds": rounds,
            "order": "per round: for each shape off, holds only, on; the idle poll off, holds only, on; the held machine",
        },
        "shapes": shapes,
        "idle": idle_summary(&runs),
        "held": held_summary(&runs),
        "plans": plans,
        "nothing_today": quiet,
        "herd": herd,
        "runs": runs,
        "worst_holds_only_ratio": worst("holds_only_ratio"),
        "worst_on_ratio": worst("on_ratio"),
        "target": TARGET,
    })
}

fn pick(runs: &[Value], variant: &str, claimers: usize, k: u32, idle: bool) -> Vec<Value> {
    runs.iter()
        .filter(|r| {
            r["variant"] == variant
                && r["claimers"].as_u64() == Some(claimers as u64)
                && r["k"].as_u64() == Some(k as u64)
                && r["idle"].as_bool() == Some(idle)
        })
        .cloned()
        .collect()
}

fn col(rs: &[Value], key: &str) -> Vec<f64> {
    rs.iter().filter_map(|r| r[key].as_f64()).collect()
}

fn med(rs: &[Value], key: &str) -> f64 {
    median(col(rs, key))
}

fn spread(v: &[f64]) -> Value {
    json!([v.iter().copied().fold(f64::NAN, f64::min), v.iter().copied().fold(f64::NAN, f64::max)])
}

/// One side of a shape: its medians, its checks and its rounds.
fn side(rs: &[Value]) -> Value {
    json!({
        "claims_per_s": med(rs, "claims_per_s"),
        "polls_per_s": med(rs, "polls_per_s"),
        "ms_per_poll": med(rs, "ms_per_poll"),
        "server_ms_per_poll": med(rs, "server_ms_per_poll"),
        "server_plan_ms_per_poll": med(rs, "server_plan_ms_per_poll"),
        "server_plans_per_poll": med(rs, "server_plans_per_poll"),
        "wasted_per_claim": med(rs, "wasted_per_claim"),
        "statements_per_poll": med(rs, "statements_per_poll"),
        "claimed_twice": rs.iter().filter_map(|r| r["claimed_twice"].as_i64()).sum::<i64>(),
        "events_match_rows": rs.iter().all(|r| r["claimed_rows"] == r["claimed_events"]),
        "exhausted": rs.iter().any(|r| r["exhausted"].as_bool() == Some(true)),
        "runs": col(rs, "claims_per_s"),
        "server_runs": col(rs, "server_ms_per_poll"),
    })
}

/// `mine` ÷ `off` of `key`'s medians and of each round's pair (its spread); `inverse`: of
/// its reciprocal (a rate, whose cost is 1 ÷ it).
fn ratio(off: &[Value], mine: &[Value], key: &str, inverse: bool) -> (f64, Vec<f64>) {
    let of = |x: f64, y: f64| if inverse { x / y } else { y / x };
    let rounds = col(off, key).iter().zip(col(mine, key)).map(|(&x, y)| of(x, y)).collect();
    (of(med(off, key), med(mine, key)), rounds)
}

/// `mine` against `off`: the claim's cost (1 ÷ claims/s), the client's time per poll and the
/// server's execution time per poll, each as the ratio of the medians with each round's
/// own ratio (its spread).
fn ratios(off: &[Value], mine: &[Value]) -> Value {
    let (cost, cost_rounds) = ratio(off, mine, "claims_per_s", true);
    let (poll, poll_rounds) = ratio(off, mine, "ms_per_poll", false);
    let (server, server_rounds) = ratio(off, mine, "server_ms_per_poll", false);
    json!({
        "cost_ratio": cost, "cost_ratio_rounds": cost_rounds, "cost_ratio_spread": spread(&cost_rounds),
        "poll_ratio": poll, "poll_ratio_rounds": poll_rounds, "poll_ratio_spread": spread(&poll_rounds),
        "server_ratio": server, "server_ratio_rounds": server_rounds, "server_ratio_spread": spread(&server_rounds),
    })
}

/// One claim shape: off, holds only and on, and the governed ones' ratios to off.
fn summary(runs: &[Value], claimers: usize, k: u32) -> Value {
    let off = pick(runs, "off", claimers, k, false);
    let mut out = json!({ "claimers": claimers, "k": k, "off": side(&off) });
    let mut line = format!("  (l) {claimers} × k = {k}: claims/s off {:.0}", med(&off, "claims_per_s"));
    for &name in GOVERNED {
        let mine = pick(runs, name, claimers, k, false);
        let r = ratios(&off, &mine);
        line += &format!(
            "; {name} {:.0}, cost ÷ off {:.3} (rounds {}), server {:.3}",
            med(&mine, "claims_per_s"),
            r["cost_ratio"].as_f64().unwrap_or(f64::NAN),
            r["cost_ratio_rounds"],
            r["server_ratio"].as_f64().unwrap_or(f64::NAN),
        );
        out[name] = side(&mine);
        out[format!("{name}_ratio")] = r;
    }
    log(line);
    out
}

/// An idle machine's poll (an empty queue), off, holds only and on: the cost is the time
/// per poll.
fn idle_summary(runs: &[Value]) -> Value {
    let off = pick(runs, "off", 1, 1, true);
    let mut out = json!({ "off": side(&off) });
    for &name in GOVERNED {
        let mine = pick(runs, name, 1, 1, true);
        out[name] = side(&mine);
        out[format!("{name}_ratio")] = ratios(&off, &mine);
    }
    log(format!(
        "  (l) idle poll: ms per poll off {:.3}, holds only {:.3}, on {:.3}; on ÷ off {:.3} (server {:.3})",
        f(&out["off"]["ms_per_poll"]),
        f(&out["holds_only"]["ms_per_poll"]),
        f(&out["on"]["ms_per_poll"]),
        f(&out["on_ratio"]["poll_ratio"]),
        f(&out["on_ratio"]["server_ratio"]),
    ));
    out
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The held machine (it claims nothing) against off's claim in the same rounds.
fn held_summary(runs: &[Value]) -> Value {
    let held: Vec<Value> = HELD_SHAPES
        .iter()
        .map(|&claimers| {
            let mine = pick(runs, "held", claimers, 1, false);
            let off = pick(runs, "off", claimers, 1, false);
            json!({
                "claimers": claimers,
                "polls_per_s": med(&mine, "polls_per_s"), "ms_per_poll": med(&mine, "ms_per_poll"),
                "server_ms_per_poll": med(&mine, "server_ms_per_poll"),
                "server_plan_ms_per_poll": med(&mine, "server_plan_ms_per_poll"),
                "server_plans_per_poll": med(&mine, "server_plans_per_poll"),
                "claims": mine.iter().filter_map(|r| r["claims"].as_u64()).sum::<u64>(),
                "off_ms_per_poll": med(&off, "ms_per_poll"), "off_server_ms_per_poll": med(&off, "server_ms_per_poll"),
            })
        })
        .collect();
    json!(held)
}
