//! Renders `report.json` into `REPORT.md` and `throughput.png`. `bench/NOTES.md`, if present,
//! (the human analysis of the figures) is included verbatim; it never changes a figure.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use crate::report_fmt::{f, find, limit_at, n0, rows};

pub fn render(j: &Value, out: &Path) {
    let md = markdown(j, out);
    std::fs::write(out.join("REPORT.md"), md).unwrap();
    if let Err(e) = chart(j, &out.join("throughput.png")) {
        eprintln!("chart failed: {e}");
    }
    if j["peers"].is_object() {
        if let Err(e) = crate::report_peers::chart(j, &out.join("peers.png")) {
            eprintln!("peers chart failed: {e}");
        }
    }
}

fn markdown(j: &Value, out: &Path) -> String {
    let mut m = String::new();
    intro(&mut m, j);
    crate::report_latency::section(&mut m, j);
    crate::report_handoff::section(&mut m, j);
    crate::report_versus::section(&mut m, j);
    sandbox_section(&mut m, j);
    crate::report_governor::section(&mut m, j);
    targets(&mut m, j);
    claims_section(&mut m, j);
    pick_section(&mut m, j);
    drains_section(&mut m, j);
    latency_section(&mut m, j);
    idle_section(&mut m, j);
    sources_section(&mut m, j);
    sqlite_section(&mut m, j);

    let _ = writeln!(m, "## Chart\n\n![throughput against claimers](throughput.png)\n");
    if let Ok(notes) = std::fs::read_to_string(out.join("NOTES.md")) {
        let _ = writeln!(m, "{notes}");
    }
    m
}

/// (s) The agent sandbox's cost: the rate confined against `--sandbox off`.
fn sandbox_section(m: &mut String, j: &Value) {
    let s = &j["sandbox"];
    if !s.is_object() {
        return;
    }
    let _ = writeln!(
        m,
        "## The agent sandbox's cost (s), alternated rounds
"
    );
    let shape = &s["shape"];
    let _ = writeln!(
        m,
        "`devpilot run --concurrency {} -- /bin/true` draining {} jobs on PostgreSQL, {} rounds of each mode, alternated \
         (measured {}). Confined is the default: each agent in its own bubblewrap sandbox (namespaces, mounts, the egress \
         proxy, DevPilot's init inside); `--sandbox off` runs it as before.\n",
        shape["concurrency"],
        shape["jobs"],
        shape["rounds"],
        s["date"].as_str().or(j["date"].as_str()).unwrap_or("?"),
    );
    let _ =
        writeln!(m, "| mode | jobs/s (median) | CPU ms per job, runner and agents (median) | every round, jobs/s |");
    let _ = writeln!(m, "|---|---:|---:|---|");
    for (name, key) in [("confined (default)", "confined"), ("`--sandbox off`", "unconfined")] {
        let runs: Vec<String> = s[key]["runs"]
            .as_array()
            .map(|a| a.iter().map(|r| format!("{:.0}", r["jobs_per_s"].as_f64().unwrap_or(0.0))).collect())
            .unwrap_or_default();
        let _ = writeln!(
            m,
            "| {name} | {:.0} | {:.2} | {} |",
            s[key]["jobs_per_s"].as_f64().unwrap_or(0.0),
            s[key]["cpu_ms_per_job"].as_f64().unwrap_or(0.0),
            runs.join(", ")
        );
    }
    let ratio = s["ratio"].as_f64().unwrap_or(0.0);
    let target = s["target"].as_f64().unwrap_or(0.8);
    let verdict = if ratio >= target { "met" } else { "missed" };
    let _ = writeln!(m, "\nConfined ÷ unconfined: **{ratio:.2} ×** (target ≥ {target} ×: {verdict}).\n");
}

/// The run: when, where, the server's settings and the plan.
fn intro(m: &mut String, j: &Value) {
    let _ = writeln!(m, "# DevPilot dispatch benchmark\n");
    let _ = writeln!(
        m,
        "Measured {} on {} cores ({}), one throwaway cluster: {}. Whole run: {:.0} s. Produced by `scripts/bench.sh` (do not edit by hand; the analysis at the end comes from `bench/NOTES.md`).\n",
        j["date"].as_str().unwrap_or("?"),
        j["cores"],
        j["cpu"].as_str().unwrap_or("?"),
        j["postgres"].as_str().unwrap_or("?").split(" on ").next().unwrap_or("?"),
        f(&j["total_secs"])
    );
    let _ = writeln!(
        m,
        "Load average (1/5/15 min, runnable/total) at start: `{}`, at end: `{}` (anything else running on the machine competes with the benchmark for its cores).\n",
        j["loadavg_at_start"].as_str().unwrap_or("?"),
        j["loadavg_at_end"].as_str().unwrap_or("?")
    );
    let settings: Vec<String> =
        rows(&j["pg_settings"]).iter().filter_map(|s| s.as_str().map(|s| format!("`{s}`"))).collect();
    let _ = writeln!(m, "PostgreSQL settings: {}.\n", settings.join(", "));
    let _ = writeln!(
        m,
        "Claim runs (a–c) last {} s each; figures are medians of {} runs (drains at 32 claimers too; other drains are single runs). \
         Every claimer in b–d is its own \"machine\" with its own one-connection pool. The pgbench client, the benchmark and PostgreSQL share the same {} cores.\n",
        j["plan"]["claim_secs"], j["plan"]["repeats"], j["cores"]
    );
}

/// The targets table (with the peers' rows and section when they were measured).
fn targets(m: &mut String, j: &Value) {
    let _ = writeln!(m, "## Targets\n");
    let _ = writeln!(m, "| target | value | measured | verdict |\n|---|---|---|---|");
    let w = |k: &str| {
        rows(&j[k])
            .iter()
            .find(|r| r["claimers"].as_u64() == Some(32))
            .map(|r| f(&r["wasted_per_claim"]))
            .unwrap_or(f64::NAN)
    };
    let wasted = w("c_single").max(w("c_batched"));
    let verdict = |ok: bool| if ok { "**met**" } else { "**missed**" };
    let _ = writeln!(
        m,
        "| wasted attempts per claim at 32 claimers (c) | ≤ 0.05 | {:.3} single, {:.3} batched (naive path b: {:.2}) | {} |",
        w("c_single"),
        w("c_batched"),
        w("b"),
        verdict(wasted <= 0.05)
    );
    let p50 = f(&j["f"]["notify"]["p50_ms"]);
    let _ = writeln!(m, "| pickup latency p50 with NOTIFY (f) | < 5 ms | {p50:.2} ms | {} |", verdict(p50 < 5.0));
    let g = &j["g"];
    let spp = f(&g["statements_per_poll"]);
    let _ = writeln!(
        m,
        "| an idle machine (g) | ≤ 1 query per poll interval, backing off | {spp:.2} statements per poll at the ceiling ({:.2} claim queries per poll); ≈ {:.2} statements/min at the 5 min ceiling | {} |",
        f(&g["claim_queries_per_poll"]),
        f(&g["unscaled_statements_per_min"]),
        verdict(spp <= 1.0 + 1e-9)
    );
    crate::report_governor::target_row(m, j);
    if j["peers"].is_object() {
        crate::report_peers::targets(m, j);
        crate::report_peers::section(m, j);
    }
}

/// (a), (b) and (c): claims per second against the physical limit.
fn claims_section(m: &mut String, j: &Value) {
    let _ = writeln!(m, "\n## Claims (a, b, c) on PostgreSQL\n");
    let _ = writeln!(m, "Ratios are to (a) at the same number of clients, measured in this run.\n");
    let _ = writeln!(m, "| # | path | claimers | claims/s | × (a) | wasted attempts per claim | statements per claim |\n|---|---|---|---|---|---|---|");
    for (key, label) in [
        ("a", "pgbench: the SKIP LOCKED claim statement alone (physical limit)"),
        ("b", "article's naive path: `candidates(1)` then `claim_by_id`"),
        ("c_single", "`claim_next`, k = 1"),
        ("c_batched", "`claim_next`, k = 16 (batched)"),
    ] {
        for r in rows(&j[key]) {
            let c = r["claimers"].as_u64().unwrap_or(0);
            let rate = f(&r["claims_per_s"]);
            let wasted = if key == "a" { "–".into() } else { format!("{:.3}", f(&r["wasted_per_claim"])) };
            let stmts = if key == "a" { "1".into() } else { format!("{:.2}", f(&r["statements_per_claim"])) };
            let _ = writeln!(
                m,
                "| {} | {label} | {c} | {} | {:.2} | {wasted} | {stmts} |",
                &key[..1],
                n0(rate),
                rate / limit_at(j, c)
            );
        }
    }
    let _ = writeln!(
        m,
        "\n(a) runs the bare claim statement of `Queue::claim_next` (`queue::claim_next_sql_postgres`, k = 1) via `pgbench -M prepared` on a pre-filled queue; claims/s counts rows actually claimed. \
         (b) and (c) go through `devpilot_store::queue::Queue`, which also writes a `job_events` history row per claim: on PostgreSQL `claim_next` does it inside the claim statement (a data-modifying CTE, so (c) does more work per statement than (a)), and the naive path's by-id claim in a second statement (the \"statements per claim\" column counts statements). \
         A wasted attempt is a claim statement that claimed nothing while claimable jobs remained (for b: a conditional UPDATE that lost the race)."
    );
}

/// (d) and (e): the full job cycle, with the profile of the 1-process drains.
fn drains_section(m: &mut String, j: &Value) {
    let _ = writeln!(m, "\n## Full job cycle through the orchestrator loop (d, e) on PostgreSQL\n");
    let _ = writeln!(
        m,
        "Pre-filled jobs drained by real `devpilot_engine::orchestrator` loops (claim, run, fenced batched completion, heartbeats), timed until every job is `completed`. \
         *Single*: one machine per claimer (concurrency 1, so every claim statement takes one job). *Batched*: machines of up to 16 slots (one statement claims every free slot). \
         4 processes = 4 OS processes (`devpilot-bench worker`), claimers split evenly. CPU is user+system time per 1,000 jobs, from /proc.\n"
    );
    let _ = writeln!(m, "| # | agent | claimers | processes | claims | jobs/s | × (a) | jobs per claim statement | CPU ms/1k jobs: postgres | clients | cores busy |\n|---|---|---|---|---|---|---|---|---|---|---|");
    let mut drains: Vec<(&str, Value)> = rows(&j["d"]).into_iter().map(|r| ("d", r)).collect();
    drains.extend(rows(&j["e"]).into_iter().map(|r| ("e", r)));
    for (k, r) in drains {
        let first = if k == "d" { r["runs"][0].clone() } else { r.clone() };
        let c = r["claimers"].as_u64().unwrap_or(0);
        let rate = f(&r["jobs_per_s"]);
        let _ = writeln!(
            m,
            "| {k} | {} | {c} | {} | {} | {} | {:.2} | {:.1} | {} | {} | {:.0} % |",
            if k == "d" { "in-process no-op" } else { "`/bin/true` process" },
            r["processes"],
            if r["batched"].as_bool() == Some(true) { "batched" } else { "single" },
            n0(rate),
            rate / limit_at(j, c),
            f(&first["jobs_per_claim_query"]),
            n0(f(&first["cpu_ms_per_1k_jobs"]["postgres"])),
            n0(f(&first["cpu_ms_per_1k_jobs"]["clients"])),
            100.0 * f(&first["cpu_busy_fraction"]),
        );
    }
    for r in rows(&j["d"]) {
        let st = &r["runs"][0]["top_statements"];
        if st.is_array() {
            let _ = writeln!(
                m,
                "\nProfile of the 1-process drain at 32 claimers, {} (pg_stat_statements, by total execution time):\n",
                if r["batched"].as_bool() == Some(true) { "batched" } else { "single" }
            );
            let _ = writeln!(m, "| calls | total ms | rows | statement |\n|---|---|---|---|");
            for s in rows(st) {
                let _ = writeln!(
                    m,
                    "| {} | {:.0} | {} | `{}` |",
                    s["calls"],
                    f(&s["total_ms"]),
                    s["rows"],
                    s["query"].as_str().unwrap_or("").replace('|', "\\|")
                );
            }
        }
    }
}

/// (f): pickup latency on both backends.
fn latency_section(m: &mut String, j: &Value) {
    let _ = writeln!(m, "\n## Pickup latency (f): enqueue to agent start, idle machine\n");
    let _ = writeln!(m, "| backend | mode | poll interval / ceiling | samples | p50 ms | p95 ms | p99 ms | max ms |\n|---|---|---|---|---|---|---|---|");
    for (backend, key, v) in [
        ("postgres", "NOTIFY", &j["f"]["notify"]),
        ("postgres", "poll-only", &j["f"]["poll_only"]),
        ("sqlite", "poll-only", &j["h"]["f"]["poll_only"]),
    ] {
        let _ = writeln!(
            m,
            "| {backend} | {key} | {} ms / {} ms | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            v["poll_interval_ms"],
            v["max_poll_interval_ms"],
            v["samples"],
            f(&v["p50_ms"]),
            f(&v["p95_ms"]),
            f(&v["p99_ms"]),
            f(&v["max_ms"])
        );
    }
    let _ = writeln!(
        m,
        "\nTimed from just before `Queue::enqueue` to the loop's `Claimed` event, which it emits as it starts the agent; the machine is idle between samples (5–30 ms gaps with NOTIFY, 5–200 ms poll-only). \
         The NOTIFY machine runs the CLI defaults (poll 2 s, idle backoff to 5 min), so every pickup there is the hint's doing."
    );
}

/// (g): what an idle machine costs.
fn idle_section(m: &mut String, j: &Value) {
    let g = &j["g"];
    let _ = writeln!(m, "\n## Idle cost per machine (g), PostgreSQL with LISTEN\n");
    let _ = writeln!(
        m,
        "Every interval scaled down {}×: poll {} ms doubling to a {} s ceiling, presence every 300 ms, sweep every 600 ms (the defaults are 2 s, 5 min, 30 s, 60 s; presence and sweep are shorter than the ceiling in both, so each poll at the ceiling carries the same statements). \
         Window at the ceiling: {:.0} s, {} polls.\n",
        g["scale"], 2000 / g["scale"].as_u64().unwrap_or(100), 300 / g["scale"].as_u64().unwrap_or(100), f(&g["window_secs"]), g["polls"]
    );
    let _ = writeln!(m, "| figure | value |\n|---|---|");
    for (k, label) in [
        ("statements", "statements in the window (pg_stat_statements)"),
        ("transactions", "transactions in the window (pg_stat_database)"),
        ("polls", "polls"),
        ("claim_queries", "claim statements"),
        ("presence_writes", "presence upserts (folded into the poll on PostgreSQL)"),
        ("sweep_checks", "times the sweep was due (a stale-lease test folded into the poll)"),
        ("sweeps", "sweep statements (sent only when the test found a stale lease)"),
        ("statements_per_poll", "statements per poll"),
        ("unscaled_statements_per_min", "⇒ statements per minute at the real 5 min ceiling"),
        ("connections_max", "connections held (max)"),
        ("connections_median", "connections held (median)"),
    ] {
        let v = &g[k];
        let s = if v.is_f64() { format!("{:.2}", f(v)) } else { v.to_string() };
        let _ = writeln!(m, "| {label} | {s} |");
    }
    let _ = writeln!(
        m,
        "\nStatements the idle machine sent (whole run, incl. warm-up):\n\n| calls | statement |\n|---|---|"
    );
    for s in rows(&g["statements_breakdown"]) {
        let _ = writeln!(m, "| {} | `{}` |", s["calls"], s["query"].as_str().unwrap_or("").replace('|', "\\|"));
    }
}

/// (k): what an idle fleet with one tracker source costs PostgreSQL and the tracker.
fn sources_section(m: &mut String, j: &Value) {
    let k = &j["k"];
    if k.is_null() {
        return;
    }
    let _ = writeln!(m, "\n## A tracker source on an idle fleet (k)\n");
    let _ = writeln!(
        m,
        "One source (the harness's loopback stand-in for Linear, then for GitHub), every machine configured with it, \
         interval {} s; every interval scaled down {}× and the counts scaled back to real minutes and hours. Each \
         tracker has one labelled issue, taken in the warm-up; its job is for a repo no machine has, so it waits, and \
         every turn measured asks what changed since the cursor. The fleet takes one intake turn per interval (a \
         conditional UPDATE on the source's row), so the tracker's load does not grow with the fleet. A GitHub turn \
         sends the `ETag` kept with the source's cursor as `If-None-Match`, whichever machine takes it: with nothing \
         new GitHub answers 304, which does not count against its 5,000 requests an hour.\n",
        k["interval_secs"], k["scale"]
    );
    if let Some(note) = k["note"].as_str() {
        let _ = writeln!(m, "{note}\n");
    }
    let _ = writeln!(
        m,
        "| tracker | machines | statements/min to PostgreSQL (all) | of them on `sources` and `outbox` | requests/hour to the tracker | of them 304 | counted against the rate limit/hour | requests the stand-in refused |\n|---|---|---|---|---|---|---|---|"
    );
    for r in rows(&k["fleets"]) {
        // Reports from before GitHub have Linear rows only, per minute.
        let tracker = r["tracker"].as_str().unwrap_or("linear");
        let per_hour = if r["tracker_requests_per_hour"].is_null() {
            f(&r["tracker_requests_per_min"]) * 60.0
        } else {
            f(&r["tracker_requests_per_hour"])
        };
        let not_modified = if r["not_modified_per_hour"].is_null() {
            "—".to_string()
        } else {
            format!("{:.0}", f(&r["not_modified_per_hour"]))
        };
        let counted = if r["counted_per_hour"].is_null() { per_hour } else { f(&r["counted_per_hour"]) };
        let tracker = if tracker == "github" { "GitHub" } else { "Linear" };
        let _ = writeln!(
            m,
            "| {tracker} | {} | {:.1} | {:.1} | {:.0} | {not_modified} | {:.0} | {} |",
            r["machines"],
            f(&r["statements_per_min"]),
            f(&r["source_statements_per_min"]),
            per_hour,
            counted,
            r["rejected_requests"]
        );
    }
}

/// (h): the embedded SQLite backend.
fn sqlite_section(m: &mut String, j: &Value) {
    let h = &j["h"];
    let _ = writeln!(m, "\n## The embedded SQLite backend (h)\n");
    let _ = writeln!(m, "WAL, `synchronous=NORMAL`, one file; the same statements (SQLite's single writer lock replaces SKIP LOCKED). Ratios are to PostgreSQL's (a).\n");
    let _ =
        writeln!(m, "| # | path | claimers | claims or jobs/s | × (a) | wasted per claim |\n|---|---|---|---|---|---|");
    for (key, label) in [("c_single", "`claim_next`, k = 1"), ("c_batched", "`claim_next`, k = 16")] {
        for r in rows(&h[key]) {
            let c = r["claimers"].as_u64().unwrap_or(0);
            let _ = writeln!(
                m,
                "| c | {label} | {c} | {} | {:.2} | {:.3} |",
                n0(f(&r["claims_per_s"])),
                f(&r["claims_per_s"]) / limit_at(j, c),
                f(&r["wasted_per_claim"])
            );
        }
    }
    for r in rows(&h["d"]) {
        let c = r["claimers"].as_u64().unwrap_or(0);
        let _ = writeln!(
            m,
            "| d | drain, {} process(es), {} | {c} | {} | {:.2} | – |",
            r["processes"],
            if r["batched"].as_bool() == Some(true) { "batched" } else { "single" },
            n0(f(&r["jobs_per_s"])),
            f(&r["jobs_per_s"]) / limit_at(j, c)
        );
    }
    let _ = writeln!(m, "\n(f) for SQLite is in the latency table above.\n");
}

/// The job model's pick against the previous one (FIFO by `created_at`), both under pgbench
/// in this run, with the index and both plans.
fn pick_section(m: &mut String, j: &Value) {
    let previous = rows(&j["a_previous"]);
    if previous.is_empty() {
        return;
    }
    let _ = writeln!(m, "\n## The pick: priority, then due time, then id (a against a')\n");
    let _ = writeln!(
        m,
        "(a') is the previous pick (FIFO by `(created_at, id)`, no priority, no `run_at`) on its own index, measured under pgbench in this run like (a), so the ratio is free of the machine's drift between runs.\n"
    );
    let _ = writeln!(
        m,
        "| clients | (a) current pick, claims/s | (a') previous pick, claims/s | (a) / (a') |\n|---|---|---|---|"
    );
    for r in rows(&j["a"]) {
        let c = r["claimers"].as_u64().unwrap_or(0);
        let prev = previous.iter().find(|p| p["claimers"].as_u64() == Some(c)).map(|p| f(&p["claims_per_s"]));
        let (now, prev) = (f(&r["claims_per_s"]), prev.unwrap_or(f64::NAN));
        let _ = writeln!(m, "| {c} | {} | {} | {:.2} |", n0(now), n0(prev), now / prev);
    }
    let plans = &j["pick_plan"];
    let _ = writeln!(m, "\nThe index that serves it (the order is exactly its key, so nothing is sorted):\n");
    let _ = writeln!(m, "```sql\n{}\n```\n", plans["index"].as_str().unwrap_or("?"));
    for (name, label) in [("current", "The current pick"), ("previous", "The previous pick")] {
        let lines: Vec<String> =
            rows(&plans[name]["plan"]).iter().filter_map(|l| l.as_str().map(str::to_string)).collect();
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(
            m,
            "{label}, k = 16, `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)` on a pre-filled queue after 5,000 claims:\n\n```\n{}\n```\n",
            lines.join("\n")
        );
    }
}

fn chart(j: &Value, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")?;
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()));
    let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![];
    for (key, label) in [
        ("a", "(a) pgbench SKIP LOCKED claim (limit)"),
        ("b", "(b) naive SELECT + conditional UPDATE"),
        ("c_single", "(c) claim_next k=1"),
        ("c_batched", "(c) claim_next k=16"),
    ] {
        let pts =
            rows(&j[key]).iter().map(|r| (r["claimers"].as_f64().unwrap_or(0.0), f(&r["claims_per_s"]))).collect();
        series.push((label.into(), pts));
    }
    let d = rows(&j["d"]);
    for procs in [1u64, 4] {
        for batched in [false, true] {
            let pts = [8u64, 32, 128]
                .iter()
                .filter_map(|c| find(&d, *c, procs, batched).map(|r| (*c as f64, f(&r["jobs_per_s"]))))
                .collect();
            series.push((
                format!(
                    "(d) full cycle, {procs} process{}, {}",
                    if procs > 1 { "es" } else { "" },
                    if batched { "batched" } else { "single" }
                ),
                pts,
            ));
        }
    }
    let ymax = series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y)).filter(|y| y.is_finite()).fold(1.0, f64::max);
    let root = BitMapBackend::new(path, (1200, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(
            format!("DevPilot on PostgreSQL, {} cores: throughput against claimers", j["cores"]),
            ("sans-serif", 26),
        )
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(90)
        .build_cartesian_2d((0.8f64..170f64).log_scale(), 0f64..ymax * 1.15)?;
    ch.configure_mesh()
        .x_desc("claimers (log scale)")
        .y_desc("claims/s (a–c) or jobs/s (d)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()?;
    let colors = [
        RGBColor(0, 0, 0),
        RGBColor(220, 30, 30),
        RGBColor(30, 90, 220),
        RGBColor(0, 160, 200),
        RGBColor(0, 150, 60),
        RGBColor(150, 200, 0),
        RGBColor(200, 110, 0),
        RGBColor(160, 40, 180),
    ];
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let width = if i == 0 { 4 } else { 2 };
        ch.draw_series(LineSeries::new(pts.clone(), c.stroke_width(width)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3)));
        ch.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 5, c.filled())))?;
    }
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
