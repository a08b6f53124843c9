//! The report's section (l): the claim with the governor against without, its plans and the
//! herd check (measured by [`crate::governor`]).

use std::fmt::Write as _;

use serde_json::Value;

use crate::report_fmt::{f, n0, rows};

/// The variants a shape's rows are shown for: key, label, and the key of its ratios to off.
const SIDES: &[(&str, &str, Option<&str>)] =
    &[("off", "off", None), ("holds_only", "holds only", Some("holds_only_ratio")), ("on", "on", Some("on_ratio"))];

/// A ratio and its rounds: `1.02 (0.98, 1.02, 1.05)`.
fn with_rounds(r: &Value, key: &str) -> String {
    let rounds: Vec<String> = rows(&r[format!("{key}_rounds")]).iter().map(|x| format!("{:.2}", f(x))).collect();
    format!("{:.2} ({})", f(&r[key]), rounds.join(", "))
}

fn verdict(ratio: f64, target: f64) -> &'static str {
    if ratio <= target {
        "met"
    } else {
        "missed"
    }
}

pub fn section(m: &mut String, j: &Value) {
    let l = &j["governor"];
    if !l.is_object() {
        return;
    }
    let _ = writeln!(m, "## The claim with the governor (l), alternated rounds\n");
    intro(m, l, j);
    shapes_table(m, l);
    server_table(m, l);
    checks(m, l);
    idle_table(m, l);
    held_table(m, l);
    herd_table(m, l);
    plans_section(m, l);
    runs_table(m, l);
}

fn intro(m: &mut String, l: &Value, j: &Value) {
    let setup = &l["setup"];
    let _ = writeln!(
        m,
        "Measured {}{}. Every run claims through the poll a machine sends (`Queue::claim_next_with` with \
         `PollExtras {{ route, .. }}`), each claimer its own machine with a one-connection pool, for {} s, on a fresh \
         database holding the same rows: a pre-filled queue, {} unexpired holds on other accounts in `account_holds`, \
         and {} spend rows today (and {} yesterday) across {} accounts, inserted into `spend`, whose triggers keep \
         `spend_quarters` (the running totals per account and quarter hour, the fleet's under `*`, that the claim \
         reads the day's spend from). Only the route differs. **off**: `Route::default()`, today's claim text. \
         **holds only**: `{}`, no day cap: the hold test reads `account_holds`, but no hold is its own, so it claims \
         the same jobs. **on**: `{}`, both day caps on but far away, so the day's spend is read too (the fleet's and \
         the account's) and it still claims the same jobs. **held**: the on route for a machine running as `{}`, \
         which is held: it claims nothing. {} rounds: in each, every shape's variants one after the other (off, holds \
         only, on), then an idle machine's poll (off, holds only, on), then the held machine; each figure is the \
         median of its rounds. The cost of a claim is the time per claimed job (1 ÷ claims/s), so a variant's cost ÷ \
         off's is off's claims/s ÷ its own; the spread is each round's own ratio.\n",
        l["date"].as_str().or(j["date"].as_str()).unwrap_or("?"),
        l["loadavg"].as_str().map(|s| format!(" (load average at its end: `{s}`)")).unwrap_or_default(),
        setup["secs"],
        setup["holds_other_accounts"],
        n0(f(&setup["spend_rows_today"])),
        n0(f(&setup["spend_rows_yesterday"])),
        setup["spend_accounts"],
        setup["holds_only"].as_str().unwrap_or("?"),
        setup["governor"].as_str().unwrap_or("?"),
        setup["held_account"].as_str().unwrap_or("?"),
        setup["rounds"],
    );
}

fn shapes_table(m: &mut String, l: &Value) {
    let target = f(&l["target"]);
    let _ = writeln!(
        m,
        "| claimers × jobs per claim | off: claims/s | holds only: claims/s | on: claims/s | cost holds only ÷ off (rounds) | verdict | cost on ÷ off (rounds) | verdict | wasted per claim off / holds only / on |\n|---|---:|---:|---:|---|---|---|---|---|"
    );
    for s in rows(&l["shapes"]) {
        let (h, o) = (&s["holds_only_ratio"], &s["on_ratio"]);
        let _ = writeln!(
            m,
            "| {} × {} | {} | {} | {} | **{}** | **{}** (≤ {target:.2}) | **{}** | **{}** (≤ {target:.2}) | {:.3} / {:.3} / {:.3} |",
            s["claimers"],
            s["k"],
            n0(f(&s["off"]["claims_per_s"])),
            n0(f(&s["holds_only"]["claims_per_s"])),
            n0(f(&s["on"]["claims_per_s"])),
            with_rounds(h, "cost_ratio"),
            verdict(f(&h["cost_ratio"]), target),
            with_rounds(o, "cost_ratio"),
            verdict(f(&o["cost_ratio"]), target),
            f(&s["off"]["wasted_per_claim"]),
            f(&s["holds_only"]["wasted_per_claim"]),
            f(&s["on"]["wasted_per_claim"]),
        );
    }
}

fn server_table(m: &mut String, l: &Value) {
    let _ = writeln!(
        m,
        "\nWhere the time goes: PostgreSQL's own time per poll (pg_stat_statements with `track_planning`, medians of the rounds), \
         execution and planning apart; \"planned\" is how often the prepared poll was planned again (1: at every call, 0: its \
         cached generic plan). The last two columns are ÷ off's in the same rounds.\n"
    );
    let _ = writeln!(
        m,
        "| claimers × jobs per claim | route | claims/s | ms per poll (client) | execution ms per poll | planning ms per poll | planned per poll | execution ÷ off (rounds) | cost ÷ off (rounds) |\n|---|---|---:|---:|---:|---:|---:|---|---|"
    );
    for s in rows(&l["shapes"]) {
        for &(key, label, ratios) in SIDES {
            let side = &s[key];
            let (exec_ratio, cost_ratio) = match ratios {
                Some(r) => (with_rounds(&s[r], "server_ratio"), with_rounds(&s[r], "cost_ratio")),
                None => ("1".into(), "1".into()),
            };
            let _ = writeln!(
                m,
                "| {} × {} | {label} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {exec_ratio} | {cost_ratio} |",
                s["claimers"],
                s["k"],
                n0(f(&side["claims_per_s"])),
                f(&side["ms_per_poll"]),
                f(&side["server_ms_per_poll"]),
                f(&side["server_plan_ms_per_poll"]),
                f(&side["server_plans_per_poll"]),
            );
        }
    }
}

fn checks(m: &mut String, l: &Value) {
    let mut failed = vec![];
    for s in rows(&l["shapes"]) {
        for &(key, ..) in SIDES {
            let side = &s[key];
            if side["claimed_twice"].as_i64() != Some(0)
                || side["events_match_rows"].as_bool() != Some(true)
                || (f(&side["statements_per_poll"]) - 1.0).abs() > 1e-9
            {
                failed.push(format!("{} × {} {key}", s["claimers"], s["k"]));
            }
        }
    }
    let _ = writeln!(
        m,
        "\nChecked after every run: no row claimed twice (one attempt each), one `claimed` event per claimed row, and one \
         statement per poll (pg_stat_statements' calls ÷ the polls sent): {}.\n",
        if failed.is_empty() { "**held in every run**".to_string() } else { format!("**failed in {}**", failed.join(", ")) }
    );
    let q = &l["nothing_today"];
    if q.is_object() {
        let _ = writeln!(
            m,
            "When nothing was spent today (yesterday's rows only), 40 polls of the on route on one connection: planned \
             {:.2} times per poll, {:.3} ms of planning and {:.3} ms of execution per poll.\n",
            f(&q["plans_per_call"]),
            f(&q["server_plan_ms_per_poll"]),
            f(&q["server_ms_per_poll"]),
        );
    }
}

fn idle_table(m: &mut String, l: &Value) {
    let idle = &l["idle"];
    if !idle.is_object() {
        return;
    }
    let _ = writeln!(
        m,
        "An idle machine's poll (an empty queue: one machine polling as fast as it can), against off in the same rounds:\n\n\
         | route | polls/s | ms per poll (client) | execution ms per poll | planning ms per poll | planned per poll | ms per poll ÷ off (rounds) | execution ÷ off (rounds) |\n|---|---:|---:|---:|---:|---:|---|---|"
    );
    for &(key, label, ratios) in SIDES {
        let v = &idle[key];
        let (r, sr) = match ratios {
            Some(r) => (with_rounds(&idle[r], "poll_ratio"), with_rounds(&idle[r], "server_ratio")),
            None => ("1".into(), "1".into()),
        };
        let _ = writeln!(
            m,
            "| {label} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {r} | {sr} |",
            n0(f(&v["polls_per_s"])),
            f(&v["ms_per_poll"]),
            f(&v["server_ms_per_poll"]),
            f(&v["server_plan_ms_per_poll"]),
            f(&v["server_plans_per_poll"]),
        );
    }
    let _ = writeln!(m);
}

fn held_table(m: &mut String, l: &Value) {
    let _ =
        writeln!(m, "The held machine (it claims nothing: the cost of saying no), against off in the same rounds:\n");
    let _ = writeln!(
        m,
        "| claimers | held: polls/s | held: ms per poll (client) | held: execution ms per poll | held: planning ms per poll | off: ms per poll (client) | off: execution ms per poll | jobs claimed |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for h in rows(&l["held"]) {
        let _ = writeln!(
            m,
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
            h["claimers"],
            n0(f(&h["polls_per_s"])),
            f(&h["ms_per_poll"]),
            f(&h["server_ms_per_poll"]),
            f(&h["server_plan_ms_per_poll"]),
            f(&h["off_ms_per_poll"]),
            f(&h["off_server_ms_per_poll"]),
            h["claims"]
        );
    }
}

fn herd_table(m: &mut String, l: &Value) {
    let _ = writeln!(
        m,
        "\nHerd-free with the governor on: N machines released together by a barrier, each claiming once, again and again on one database.\n"
    );
    let _ = writeln!(
        m,
        "| machines × jobs per claim | releases | rows per release | fewest distinct rows in a release | short claims | rows handed out twice | herd-free |\n|---|---:|---:|---:|---:|---:|---|"
    );
    for h in rows(&l["herd"]) {
        let _ = writeln!(
            m,
            "| {} × {} | {} | {} | {} | {} | {} | **{}** |",
            h["claimers"],
            h["k"],
            h["releases"],
            h["rows_per_release"],
            h["fewest_distinct_rows"],
            h["short_claims"],
            f(&h["duplicates"]) + f(&h["claimed_twice"]),
            if h["herd_free"].as_bool() == Some(true) { "yes" } else { "no" }
        );
    }
}

fn yes(v: &Value) -> &'static str {
    if v.as_bool() == Some(true) {
        "yes"
    } else {
        "no"
    }
}

/// The plan's skeleton: its nodes (with their actual rows and loops), InitPlans and gates,
/// in the pick (`CTE picked`) and the poll's own InitPlans (the next due job); the claim's
/// UPDATE, its history and outbox are left out (they are in the whole plans).
fn skeleton(plan: &Value) -> Vec<String> {
    let mut section = String::new();
    let mut out = vec![];
    for l in rows(&plan["plan"]).iter().filter_map(|l| l.as_str()).skip(1) {
        let t = l.trim_start();
        let indent = l.len() - t.len();
        if indent <= 2 {
            section = t.to_string();
        }
        let kept_section = indent == 0 || section.starts_with("CTE picked") || section.starts_with("InitPlan");
        let node = t.starts_with("->")
            || t.starts_with("InitPlan")
            || t.starts_with("CTE ")
            || t.starts_with("One-Time Filter")
            || indent == 0;
        if kept_section && node {
            out.push(l.replace('\t', " "));
        }
    }
    out
}

fn plans_section(m: &mut String, l: &Value) {
    let plans = &l["plans"];
    let q = &plans["quarters"];
    let _ = writeln!(
        m,
        "\nThe setup, checked: `spend` holds {} rows and its triggers left {} rows in `spend_quarters` ({} of them today); \
         quarters that disagree with `spend`'s own sums per account and quarter hour (and under `*`): {}; today's spend \
         {:.2} USD from `spend`, {:.2} from the quarters (`{}`: {:.2} and {:.2}): **{}**.\n",
        n0(f(&q["spend_rows"])),
        n0(f(&q["quarter_rows"])),
        n0(f(&q["quarter_rows_today"])),
        q["mismatched_quarters"],
        f(&q["spend_today_usd"]),
        f(&q["quarters_today_usd"]),
        l["setup"]["account"].as_str().unwrap_or("?"),
        f(&q["spend_today_account_usd"]),
        f(&q["quarters_today_account_usd"]),
        if q["ok"].as_bool() == Some(true) { "they agree" } else { "they disagree" },
    );
    let _ = writeln!(
        m,
        "The plans PostgreSQL ran (auto_explain with `log_analyze`, the last of 8 polls on one connection, so past a prepared statement's five custom plans). \
         Every subquery on the governor's tables an InitPlan that ran at most once, and no per-row SubPlan: **{}**. The day's sums \
         are InitPlans over `spend_quarters` (its primary key), each run at most once and the on route's two run: **{}**. \
         No scan of `spend` ran in any plan: **{}**.\n",
        yes(&plans["initplans_once"]),
        yes(&plans["quarters_once"]),
        yes(&plans["no_spend_scan"]),
    );
    for (key, label) in [
        ("holds_only", "Holds only, k = 1"),
        ("on", "Governor on, k = 1"),
        ("held", "The held machine, k = 1"),
        ("idle_on", "An idle machine's poll (empty queue), governor on"),
    ] {
        let lines = skeleton(&plans[key]);
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(
            m,
            "{label}: the pick's nodes, InitPlans and gate, and the poll's own InitPlans (InitPlans over `spend_quarters`: {}, {} of them run; scans of `spend` that ran: {}):\n\n```\n{}\n```\n",
            plans[key]["quarter_initplans"],
            plans[key]["quarter_initplans_run"],
            plans[key]["spend_scans_run"],
            lines.join("\n")
        );
    }
    for (key, label) in [("on", "The whole plan, governor on, k = 1"), ("held", "The whole plan, the held machine")] {
        let lines: Vec<String> =
            rows(&plans[key]["plan"]).iter().filter_map(|l| l.as_str().map(str::to_string)).collect();
        if !lines.is_empty() {
            let _ =
                writeln!(m, "<details><summary>{label}</summary>\n\n```\n{}\n```\n\n</details>\n", lines.join("\n"));
        }
    }
}

fn runs_table(m: &mut String, l: &Value) {
    let _ = writeln!(m, "Every run, in round order:\n\n| round | route | claimers × jobs per claim | claims/s | polls/s | ms per poll (client) | execution ms per poll | planning ms per poll |\n|---|---|---|---:|---:|---:|---:|---:|");
    for r in rows(&l["runs"]) {
        let v = r["variant"].as_str().unwrap_or("?").replace('_', " ");
        let route = if r["idle"].as_bool() == Some(true) { format!("{v}, idle (empty queue)") } else { v };
        let _ = writeln!(
            m,
            "| {} | {route} | {} × {} | {} | {} | {:.3} | {:.3} | {:.3} |",
            r["round"],
            r["claimers"],
            r["k"],
            n0(f(&r["claims_per_s"])),
            n0(f(&r["polls_per_s"])),
            f(&r["ms_per_poll"]),
            f(&r["server_ms_per_poll"]),
            f(&r["server_plan_ms_per_poll"])
        );
    }
    let _ = writeln!(m);
}

/// (l)'s rows in the report's targets table: holds only ÷ off, the target's own figure, and
/// on ÷ off reported against the same target.
pub fn target_row(m: &mut String, j: &Value) {
    let l = &j["governor"];
    if !l.is_object() {
        return;
    }
    let target = f(&l["target"]);
    for (key, worst, what) in [
        ("holds_only_ratio", "worst_holds_only_ratio", "holds present (50 other accounts held), no day cap"),
        ("on_ratio", "worst_on_ratio", "holds and both day caps on (10,000 spend rows today)"),
    ] {
        let shapes: Vec<String> = rows(&l["shapes"])
            .iter()
            .map(|s| format!("{:.2} at {} × {}", f(&s[key]["cost_ratio"]), s["claimers"], s["k"]))
            .collect();
        let _ = writeln!(
            m,
            "| the claim's cost with the governor ÷ without (l): {what}; medians of {} alternated rounds | ≤ {target:.2} × | {} | **{}** |",
            l["setup"]["rounds"],
            shapes.join(", "),
            verdict(f(&l[worst]), target)
        );
    }
}
