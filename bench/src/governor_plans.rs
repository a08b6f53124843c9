//! (l)'s plans: what PostgreSQL ran for the poll as the store sends it (auto_explain with
//! `log_analyze`, from the server log), the evidence read from them (the governor's
//! subqueries are InitPlans run at most once, the day's spend read from `spend_quarters`
//! and never from `spend`), what the triggers left in `spend_quarters`, and how often the
//! prepared poll is planned when nothing was spent today. Measured by [`crate::governor`].

use devpilot_store::queue::PollExtras;
use devpilot_store::Queue;
use serde_json::{json, Value};

use crate::common::{connect, exec, scalar, Env, ORCH};
use crate::governor_db::{drop_db, fresh, quarters_check, server_stats, Variant, SPEND_TODAY};

/// A plan to take: its name, the machine's route and the jobs per claim.
type PlanCase = (&'static str, Variant, u32);

/// The plans taken on a pre-filled queue.
const FILLED: &[PlanCase] = &[
    ("off", Variant::Off, 1),
    ("holds_only", Variant::HoldsOnly, 1),
    ("on", Variant::On, 1),
    ("on_k16", Variant::On, 16),
    ("held", Variant::Held, 1),
];
/// The plans taken on an empty queue: an idle machine's poll.
const EMPTY: &[PlanCase] =
    &[("idle_off", Variant::Off, 1), ("idle_holds_only", Variant::HoldsOnly, 1), ("idle_on", Variant::On, 1)];
/// The plans of a governed route, which the evidence is read from.
pub const GOVERNED: &[&str] = &["holds_only", "on", "on_k16", "held", "idle_holds_only", "idle_on"];

/// The plans PostgreSQL ran for the poll as the store sends it: auto_explain (`log_analyze`)
/// on two databases, one pre-filled and one with an empty queue (an idle machine's poll); a
/// few polls of each variant on a connection of their own (past the five custom plans of a
/// prepared statement), the last plan of each taken from the server log. Also the check of
/// `spend_quarters` against `spend` on the pre-filled one.
pub async fn plans(env: &Env) -> Value {
    let mut out = json!({});
    for (jobs, cases) in [(60_000, FILLED), (0, EMPTY)] {
        let (url, admin, day) = fresh(env, jobs, SPEND_TODAY).await;
        if jobs > 0 {
            out["quarters"] = quarters_check(&admin, day).await;
        }
        let db = Env::dbname(&url);
        for s in [
            "session_preload_libraries = 'auto_explain'",
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_timing = on",
            "auto_explain.log_format = 'text'",
        ] {
            exec(&env.admin, &format!("ALTER DATABASE {db} SET {s}")).await;
        }
        for &(name, variant, k) in cases {
            out[name] = take(env, &url, day, name, variant, k).await;
            out[name]["jobs"] = json!(jobs);
        }
        admin.close().await.ok();
        drop_db(env, &url).await;
    }
    evidence(&mut out);
    out
}

/// Eight polls of `variant` on a connection of its own, and the last one's plan.
async fn take(env: &Env, url: &str, day: i64, name: &str, variant: Variant, k: u32) -> Value {
    let q = Queue::new(connect(url, 1).await);
    let pid = scalar(q.connection(), "SELECT pg_backend_pid()::bigint AS n").await;
    let route = variant.route(day);
    let extras = PollExtras { route: Some(&route), ..PollExtras::default() };
    for _ in 0..8 {
        q.claim_next_with(ORCH, &format!("x-{name}"), k, &extras).await.unwrap();
    }
    q.connection().clone().close().await.ok();
    let text = std::fs::read_to_string(env.pg.dir.join("server.log")).unwrap_or_default();
    let (plan, statement) = last_plan(&text, pid);
    let initplans = initplans(&plan);
    json!({
        "variant": variant.name(), "k": k, "plan": plan, "initplans": initplans,
        // The text as the store sent it ($1 orchestrator, $2 machine, then the route's values).
        "statement": statement,
    })
}

/// Scans of `table` in a plan that ran (not "never executed").
fn scans_run(plan: &[String], table: &str) -> usize {
    let on = format!(" on {table} ");
    plan.iter().filter(|l| l.contains(&on) && l.contains("Scan") && !l.contains("never executed")).count()
}

/// The evidence, per governed plan and overall: every InitPlan ran at most once and no
/// per-row SubPlan reads the governor's tables (`initplans_once`); the day's spend came from
/// InitPlans over `spend_quarters`, each run once (`quarters_once`), and no scan of `spend`
/// ran (`spend_scans_run`).
fn evidence(out: &mut Value) {
    let (mut once_only, mut quarters_once, mut no_spend) = (true, true, true);
    for &name in GOVERNED {
        let plan: Vec<String> = serde_json::from_value(out[name]["plan"].clone()).unwrap_or_default();
        let ips = out[name]["initplans"].as_array().cloned().unwrap_or_default();
        for ip in &ips {
            once_only &= ip["loops"].as_array().map(|l| l.iter().all(|n| n.as_u64() <= Some(1))).unwrap_or(true);
        }
        once_only &= !plan.iter().any(|l| l.contains("SubPlan")) && !plan.is_empty();
        // The innermost InitPlans over `spend_quarters`: the day's sums.
        let quarters: Vec<&Value> = ips.iter().filter(|ip| ip["reads_quarters"] == true).collect();
        let ran: Vec<u64> = quarters.iter().filter_map(|ip| ip["top_loops"].as_u64()).filter(|&n| n > 0).collect();
        out[name]["quarter_initplans"] = json!(quarters.len());
        out[name]["quarter_initplans_run"] = json!(ran.len());
        out[name]["quarter_scans_run"] = json!(scans_run(&plan, "spend_quarters"));
        out[name]["spend_scans_run"] = json!(scans_run(&plan, "spend"));
        quarters_once &= ran.iter().all(|&n| n == 1);
        no_spend &= scans_run(&plan, "spend") == 0;
    }
    // The on route, claiming, must have run its two sums (the fleet's and the account's).
    quarters_once &= out["on"]["quarter_initplans_run"].as_u64() >= Some(2);
    out["initplans_once"] = json!(once_only);
    out["quarters_once"] = json!(quarters_once);
    out["no_spend_scan"] = json!(no_spend);
}

/// The plan of the last auto_explain entry of backend `pid` for the poll, from the server
/// log (stderr format: an entry's continuation lines start with a tab): the plan's lines,
/// and the statement's text as the store sent it.
fn last_plan(log_text: &str, pid: i64) -> (Vec<String>, String) {
    let tag = format!("[{pid}]");
    let mut entries: Vec<Vec<&str>> = vec![];
    for line in log_text.lines() {
        if line.starts_with('\t') {
            if let Some(e) = entries.last_mut() {
                e.push(line);
            }
        } else {
            entries.push(vec![line]);
        }
    }
    let Some(entry) = entries.iter().rev().find(|e| {
        e[0].contains(&tag) && e[0].contains("plan:") && e.iter().any(|l| l.contains("picked AS MATERIALIZED"))
    }) else {
        return (vec![], String::new());
    };
    // After "Query Text: …" come the statement's lines, then the plan, whose first line
    // (the top node) is the first one written at the left margin.
    let body: Vec<&str> = entry[1..].iter().map(|l| &l[1..]).collect();
    let start = body
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, l)| !l.starts_with(' ') && !l.is_empty() && !l.starts_with("Query Text"))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let mut plan: Vec<String> = vec![entry[0].split("LOG:").nth(1).unwrap_or("").trim().to_string()];
    plan.extend(body[start..].iter().map(|l| l.to_string()));
    let statement = body[..start].join("\n").trim_start_matches("Query Text: ").to_string();
    (plan, statement)
}

/// A plan line's `loops=` (0 for a node never executed, `None` for a line with neither).
fn loops_of(line: &str) -> Option<u64> {
    if line.contains("never executed") {
        return Some(0);
    }
    let n = line.split("loops=").nth(1)?;
    Some(n.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("0").parse::<u64>().unwrap_or(0))
}

/// Each InitPlan of a text plan, nested ones too: its header line, the lines under it, the
/// `loops=` of every node under it, its top node's (`top_loops`), and whether it is an
/// innermost one that reads `spend_quarters` (`reads_quarters`).
fn initplans(plan: &[String]) -> Value {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = vec![];
    for (i, header) in plan.iter().enumerate() {
        if !header.trim_start().starts_with("InitPlan") {
            continue;
        }
        let under: Vec<&String> = plan[i + 1..].iter().take_while(|l| indent(l) > indent(header)).collect();
        let loops: Vec<u64> = under.iter().filter_map(|l| loops_of(l)).collect();
        let top_loops = under.iter().find_map(|l| loops_of(l)).unwrap_or(0);
        let reads_quarters = under.iter().any(|l| l.contains(" on spend_quarters "))
            && !under.iter().any(|l| l.trim_start().starts_with("InitPlan"));
        let mut lines = vec![header.clone()];
        lines.extend(under.iter().map(|l| l.to_string()));
        out.push(json!({ "lines": lines, "loops": loops, "top_loops": top_loops, "reads_quarters": reads_quarters }));
    }
    json!(out)
}

/// The prepared poll's planning when nothing was spent today (yesterday's rows only), the
/// case where the first run found it planned again at every call: 40 polls of the on route
/// on one connection, then pg_stat_statements' figures.
pub async fn nothing_today(env: &Env) -> Value {
    let (url, admin, day) = fresh(env, 60_000, 0).await;
    let q = Queue::new(connect(&url, 1).await);
    let route = Variant::On.route(day);
    let extras = PollExtras { route: Some(&route), ..PollExtras::default() };
    for _ in 0..40 {
        q.claim_next_with(ORCH, "quiet", 1, &extras).await.unwrap();
    }
    q.connection().clone().close().await.ok();
    admin.close().await.ok();
    let (calls, exec_ms, plans, plan_ms) = server_stats(env, &Env::dbname(&url)).await;
    drop_db(env, &url).await;
    json!({
        "calls": calls, "plans_per_call": plans as f64 / calls.max(1) as f64,
        "server_ms_per_poll": exec_ms, "server_plan_ms_per_poll": plan_ms,
    })
}
