//! The report's issue-11 parts: DevPilot against Graphile Worker and pg-boss side by side,
//! the ratio of each figure to the best peer (and `peers.png`), the agent path as a user
//! runs it, and one PostgreSQL under a fleet. Every number comes from `report.json`.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use crate::report_fmt::{f, find, limit_at, n0, rows};

const PEERS: [(&str, &str); 2] = [("graphile", "Graphile Worker"), ("pgboss", "pg-boss")];

/// A peer's drain rate at `workers`, one job per fetch or batched.
fn peer_drain(j: &Value, peer: &str, workers: u64, batched: bool) -> f64 {
    rows(&j["peers"][peer]["drain"])
        .iter()
        .find(|r| r["workers"].as_u64() == Some(workers) && r["batched"].as_bool() == Some(batched))
        .map(|r| f(&r["jobs_per_s"]))
        .unwrap_or(f64::NAN)
}

fn ours_drain(j: &Value, claimers: u64, procs: u64, batched: bool) -> f64 {
    find(&rows(&j["d"]), claimers, procs, batched).map(|r| f(&r["jobs_per_s"])).unwrap_or(f64::NAN)
}

/// One compared figure: ours, each peer's, and which way is better.
struct Figure {
    label: String,
    unit: &'static str,
    ours: f64,
    peers: [f64; 2],
    higher_is_better: bool,
}

impl Figure {
    /// The best peer's value and name.
    fn best(&self) -> (f64, &'static str) {
        let pick = |a: f64, b: f64| if self.higher_is_better { a >= b } else { a <= b };
        let (g, b) = (self.peers[0], self.peers[1]);
        if b.is_nan() || (!g.is_nan() && pick(g, b)) {
            (g, PEERS[0].1)
        } else {
            (b, PEERS[1].1)
        }
    }

    /// Ours divided by the best peer.
    fn ratio(&self) -> f64 {
        self.ours / self.best().0
    }

    /// How many times better ours is (> 1: ours is better), whichever way the figure points.
    fn advantage(&self) -> f64 {
        if self.higher_is_better {
            self.ratio()
        } else {
            1.0 / self.ratio()
        }
    }
}

fn figures(j: &Value) -> Vec<Figure> {
    let mut out = vec![];
    for batched in [false, true] {
        for workers in [8u64, 32] {
            for procs in [1u64, 4] {
                if procs == 4 && workers == 8 {
                    continue;
                }
                out.push(Figure {
                    label: format!(
                        "drain, {}, {workers} workers{}",
                        if batched { "batched" } else { "one job per fetch" },
                        if procs == 4 { " (ours in 4 processes)" } else { "" }
                    ),
                    unit: "jobs/s",
                    ours: ours_drain(j, workers, procs, batched),
                    peers: PEERS.map(|(p, _)| peer_drain(j, p, workers, batched)),
                    higher_is_better: true,
                });
            }
        }
    }
    for (k, label) in [("p50_ms", "pickup p50, idle queue"), ("p99_ms", "pickup p99, idle queue")] {
        out.push(Figure {
            label: label.into(),
            unit: "ms",
            ours: f(&j["f"]["notify"][k]),
            peers: PEERS.map(|(p, _)| f(&j["peers"][p]["pickup"][k])),
            higher_is_better: false,
        });
    }
    out.push(Figure {
        label: "statements per minute, idle worker".into(),
        unit: "/min",
        ours: f(&j["g"]["unscaled_statements_per_min"]),
        peers: PEERS.map(|(p, _)| f(&j["peers"][p]["idle"]["statements_per_min"])),
        higher_is_better: false,
    });
    out
}

fn num(x: f64, unit: &str) -> String {
    match unit {
        "jobs/s" => n0(x),
        _ if x.is_nan() => "n/a".into(),
        _ if x < 10.0 => format!("{x:.2}"),
        _ => n0(x),
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "**met**"
    } else {
        "**missed**"
    }
}

/// Rows of the targets table for issue 11's figures.
pub fn targets(m: &mut String, j: &Value) {
    let a32 = limit_at(j, 32);
    let best_batched = PEERS.map(|(p, _)| peer_drain(j, p, 32, true)).into_iter().fold(f64::NAN, f64::max);
    let (b1, b4) = (ours_drain(j, 32, 1, true), ours_drain(j, 32, 4, true));
    let _ = writeln!(
        m,
        "| full-cycle drain at 32 claimers, batched, against the peers | ≥ 1.0 × best peer batched ({} jobs/s) and ≥ 1.5 × (a) = {} | {} in 1 process ({:.2} × peer, {:.2} × a), {} in 4 ({:.2} × peer, {:.2} × a) | {} |",
        n0(best_batched),
        n0(1.5 * a32),
        n0(b1),
        b1 / best_batched,
        b1 / a32,
        n0(b4),
        b4 / best_batched,
        b4 / a32,
        verdict(b1.min(b4) >= best_batched && b1.min(b4) >= 1.5 * a32)
    );
    let gw = peer_drain(j, "graphile", 32, false);
    let s1 = ours_drain(j, 32, 1, false);
    let _ = writeln!(
        m,
        "| full-cycle drain at 32 claimers, one claim per statement | ≥ 1.0 × Graphile Worker one at a time ({} jobs/s) and ≥ 0.5 × (a) = {} | {} ({:.2} × Graphile, {:.2} × a) | {} |",
        n0(gw),
        n0(0.5 * a32),
        n0(s1),
        s1 / gw,
        s1 / a32,
        verdict(s1 >= gw && s1 >= 0.5 * a32)
    );
    let (ours, theirs) = (f(&j["f"]["notify"]["p50_ms"]), f(&j["peers"]["graphile"]["pickup"]["p50_ms"]));
    let _ = writeln!(
        m,
        "| pickup p50 with NOTIFY | ≤ Graphile Worker's ({theirs:.2} ms) | {ours:.2} ms | {} |",
        verdict(ours <= theirs)
    );
    let (ours, boss) =
        (f(&j["g"]["unscaled_statements_per_min"]), f(&j["peers"]["pgboss"]["idle"]["statements_per_min"]));
    let _ = writeln!(
        m,
        "| idle statements per minute per machine | ≤ 1/10 of pg-boss's default ({:.1}) | {ours:.2} | {} |",
        boss / 10.0,
        verdict(ours <= boss / 10.0)
    );
    let e = &j["e_cli"];
    let (es, en) = (f(&e["session"]["jobs_per_s"]), f(&e["no_runtime_dir"]["jobs_per_s"]));
    let _ = writeln!(
        m,
        "| the agent-process path: 4 × `devpilot run -c 8`, a `/bin/sh` agent per job | ≥ 0.15 × (a) = {} jobs/s | {} jobs/s in a login session ({:.2} × a); {} without a runtime dir ({:.2} × a) | {} |",
        n0(0.15 * a32),
        n0(es),
        es / a32,
        n0(en),
        en / a32,
        verdict(es >= 0.15 * a32)
    );
    let fi = &j["fleet_idle"];
    let upper = 100.0 * f(&fi["postgres_core_fraction_real_upper"]);
    let est = 100.0 * f(&fi["postgres_cpu_s_per_hour_real"]) / 3600.0;
    let _ = writeln!(
        m,
        "| an idle fleet of {} machines through PgBouncer, at the 5 min ceiling | PostgreSQL < 2 % of one core | ≈ {est:.2} % (its background alone plus the fleet's share at {}× the rate, divided by {}); {upper:.2} % as measured at {}× the rate | {} |",
        fi["machines"],
        fi["scale"],
        fi["scale"],
        fi["scale"],
        verdict(est < 2.0)
    );
    let fl = &j["fleet_listening"];
    let p50 = f(&fl["pickup_ms"]["p50"]);
    let _ = writeln!(
        m,
        "| pickup with NOTIFY, {} listeners on {} orchestrators | p50 < 10 ms | {p50:.1} ms (p95 {:.1}) | {} |",
        fl["machines"],
        fl["orchestrators"],
        f(&fl["pickup_ms"]["p95"]),
        verdict(p50 < 10.0)
    );
}

/// The side-by-side table, the ratio table and the peers' configurations.
pub fn section(m: &mut String, j: &Value) {
    let figs = figures(j);
    let _ = writeln!(m, "\n## Against the peers: Graphile Worker and pg-boss, same cluster, same run\n");
    let _ = writeln!(
        m,
        "Each peer runs in an empty database of this run's cluster (same settings), with a no-op task, the same number of workers as our claimers and a pool of as many connections; jobs are pre-filled with the peer's bulk API and timed until every one is completed in the database. \
         Node {}; `bench/peers/package-lock.json` pins the versions. Ours: the (d) drains (history and fencing included), (f) and (g).\n",
        j["peers"]["versions"]["node"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        m,
        "| figure | DevPilot | Graphile Worker | pg-boss | best peer | ours ÷ best peer | better when |\n|---|---|---|---|---|---|---|"
    );
    for x in &figs {
        let (best, who) = x.best();
        let _ = writeln!(
            m,
            "| {} ({}) | {} | {} | {} | {} ({who}) | **{:.2}** | {} |",
            x.label,
            x.unit,
            num(x.ours, x.unit),
            num(x.peers[0], x.unit),
            num(x.peers[1], x.unit),
            num(best, x.unit),
            x.ratio(),
            if x.higher_is_better { "higher" } else { "lower" }
        );
    }
    let _ = writeln!(m, "\n![ours against the best peer, figure by figure](peers.png)\n");
    let _ = writeln!(m, "How each peer was set up (from its own `config` line):\n");
    for (p, name) in PEERS {
        let v = &j["peers"][p];
        let version = rows(&v["drain"]).first().map(|r| r["runs"][0]["version"].clone()).unwrap_or(Value::Null);
        let _ = writeln!(m, "- **{name}** {}:", version.as_str().unwrap_or("?"));
        for r in rows(&v["drain"]) {
            let _ = writeln!(
                m,
                "  - drain, {} workers, {}: `{}`",
                r["workers"],
                if r["batched"].as_bool() == Some(true) { "batched" } else { "one job per fetch" },
                r["config"].as_str().unwrap_or("?")
            );
        }
        for k in ["pickup", "idle"] {
            let _ = writeln!(m, "  - {k}: `{}`", v[k]["config"].as_str().unwrap_or("?"));
        }
        let top: Vec<String> = rows(&v["idle"]["top"])
            .iter()
            .map(|t| format!("{} × `{}`", t["calls"], t["query"].as_str().unwrap_or("").replace('|', "\\|")))
            .collect();
        let _ = writeln!(m, "  - idle statements in {:.0} s: {}", f(&v["idle"]["window_secs"]), top.join("; "));
    }
    e_section(m, j);
    fleet_section(m, j);
}

fn e_section(m: &mut String, j: &Value) {
    let e = &j["e_cli"];
    let _ = writeln!(m, "\n## The agent-process path as a user runs it (e)\n");
    let _ = writeln!(
        m,
        "4 `devpilot run --until-empty --concurrency 8 -- /bin/sh -c 'exit 0'` OS processes drain {} pre-filled jobs: a real agent process per job, with its payload file, log file, stdin pipe, wait and fenced completion. \
         Timed from spawning the processes until all have exited; CPU from `getrusage(RUSAGE_CHILDREN)` (the processes and the agents they waited for).\n",
        e["session"]["runs"][0]["jobs"]
    );
    let _ = writeln!(m, "| payload files | runs (jobs/s) | median jobs/s | × (a) | CPU ms per job: devpilot + agents | postgres |\n|---|---|---|---|---|---|");
    for (k, label) in [
        ("session", "in `XDG_RUNTIME_DIR` (tmpfs; a login session)"),
        ("no_runtime_dir", "in the data dir (no runtime dir)"),
    ] {
        let runs = rows(&e[k]["runs"]);
        let each: Vec<String> = runs.iter().map(|r| n0(f(&r["jobs_per_s"]))).collect();
        let first = runs.first().cloned().unwrap_or(Value::Null);
        let _ = writeln!(
            m,
            "| {label} | {} | {} | {:.2} | {:.2} | {:.2} |",
            each.join(", "),
            n0(f(&e[k]["jobs_per_s"])),
            f(&e[k]["jobs_per_s"]) / limit_at(j, 32),
            f(&first["cpu_ms_per_job"]["devpilot_and_agents"]),
            f(&first["cpu_ms_per_job"]["postgres"])
        );
    }
}

fn fleet_section(m: &mut String, j: &Value) {
    fleet_idle_section(m, j);
    fleet_listening_section(m, j);
}

/// The idle fleet behind PgBouncer: what it costs PostgreSQL, measured and at the real intervals.
fn fleet_idle_section(m: &mut String, j: &Value) {
    let fi = &j["fleet_idle"];
    let s = fi["scale"].as_u64().unwrap_or(10);
    let _ = writeln!(m, "\n## One PostgreSQL, thousands of machines\n");
    let _ = writeln!(
        m,
        "**An idle fleet.** {} machines (real orchestrator loops, {} to an orchestrator, in {} processes), each with its own pool and presence row, in pooled mode through PgBouncer 1.18 in transaction mode. \
         Every interval is divided by {s} (poll {} ms doubling to a {} s ceiling, presence {} s, sweep {} s), so the fleet reaches its ceiling within a minute; at the real 5 min ceiling the statement rate is {s}× lower. \
         Measured over {:.0} s at the ceiling.\n",
        fi["machines"],
        fi["machines"].as_u64().unwrap_or(0) / fi["orchestrators"].as_u64().unwrap_or(1).max(1),
        fi["processes"],
        2000 / s,
        300 / s,
        30 / s,
        60 / s,
        f(&fi["window_secs"])
    );
    let _ = writeln!(m, "| figure | measured (intervals ÷ {s}) | at the real intervals |\n|---|---|---|");
    let pct = |x: &Value| format!("{:.2} %", 100.0 * f(x));
    let _ = writeln!(
        m,
        "| statements per second (in pooled mode each poll is `UNLISTEN *` and the claim, two to pg_stat_statements) | {:.1} | {:.2} |",
        f(&fi["statements_per_s"]),
        f(&fi["statements_per_s_real"])
    );
    let _ = writeln!(
        m,
        "| PostgreSQL CPU, share of one core | {} | ≈ {:.3} % (the background, plus the rest ÷ the scale); at most {} |",
        pct(&fi["postgres_core_fraction"]),
        100.0 * f(&fi["postgres_cpu_s_per_hour_real"]) / 3600.0,
        pct(&fi["postgres_core_fraction_real_upper"])
    );
    let _ = writeln!(
        m,
        "| PostgreSQL CPU with no fleet (its background work, measured first) | {} | the same |",
        pct(&fi["postgres_core_fraction_without_fleet"])
    );
    let _ = writeln!(
        m,
        "| PostgreSQL CPU per hour | {:.0} s | ≈ {:.0} s |",
        f(&fi["postgres_core_fraction"]) * 3600.0,
        f(&fi["postgres_cpu_s_per_hour_real"])
    );
    let _ =
        writeln!(m, "| PostgreSQL CPU per statement | {:.3} ms | the same |", f(&fi["postgres_cpu_ms_per_statement"]));
    let _ = writeln!(m, "| PgBouncer CPU, share of one core | {} | lower |", pct(&fi["pgbouncer_core_fraction"]));
    let _ = writeln!(
        m,
        "| server connections held (median / max) | {:.0} / {:.0} | the same or fewer |",
        f(&fi["server_connections_median"]),
        f(&fi["server_connections_max"])
    );
    let _ = writeln!(
        m,
        "| client connections to PgBouncer (median) | {:.0} | the same |",
        f(&fi["client_connections_median"])
    );
    let _ = writeln!(m, "| presence rows | {} | the same |", fi["presence_rows"]);
    let _ = writeln!(
        m,
        "| a new job's pickup, p50 / p95 ({} jobs to random orchestrators) | {:.0} ms / {:.0} ms | ≈ {:.0} s (× {s}) |",
        fi["pickup_ms"]["samples"],
        f(&fi["pickup_ms"]["p50"]),
        f(&fi["pickup_ms"]["p95"]),
        f(&fi["pickup_p50_ms_real"]) / 1000.0
    );
}

/// The listening fleet: pickup by NOTIFY, and what one hint costs on each kind of channel.
fn fleet_listening_section(m: &mut String, j: &Value) {
    let fl = &j["fleet_listening"];
    let _ = writeln!(
        m,
        "\n**A listening fleet.** {} machines on {} orchestrators, each LISTENing directly on a connection of its own ({} LISTEN sessions seen). Pickup is timed by the database's clock (enqueue's `created_at` to the claim's `claimed_at`, whole ms), one job at a time: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples).\n",
        fl["machines"],
        fl["orchestrators"],
        fl["listen_connections"],
        f(&fl["pickup_ms"]["p50"]),
        f(&fl["pickup_ms"]["p95"]),
        f(&fl["pickup_ms"]["p99"]),
        f(&fl["pickup_ms"]["max"]),
        fl["pickup_ms"]["samples"]
    );
    let _ = writeln!(
        m,
        "What one hint costs (a NOTIFY as the trigger sends it, for a job already gone, so each machine that hears it polls once and finds nothing; {} hints at 250/s, CPU beyond an idle stretch of the same length):\n",
        fl["hint_cost"]["shared"]["hints"]
    );
    let _ = writeln!(
        m,
        "| channel | who hears a hint | PostgreSQL ms per hint | machines' ms per hint |\n|---|---|---|---|"
    );
    for (k, who) in [
        ("shared", format!("all {} listeners", fl["machines"])),
        (
            "per_orchestrator",
            format!(
                "the orchestrator's {}",
                fl["machines"].as_u64().unwrap_or(0) / fl["orchestrators"].as_u64().unwrap_or(1).max(1)
            ),
        ),
    ] {
        let c = &fl["hint_cost"][k];
        let _ = writeln!(
            m,
            "| {} | {who} | {:.3} | {:.3} |",
            if k == "shared" { "`devpilot_dispatch` (before)" } else { "one per orchestrator (now)" },
            f(&c["postgres_ms_per_hint"]),
            f(&c["fleet_ms_per_hint"])
        );
    }
}

/// `peers.png`: how many times better than the best peer each figure is (log scale).
pub fn chart(j: &Value, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let figs: Vec<Figure> = figures(j).into_iter().filter(|x| x.advantage().is_finite()).collect();
    let n = figs.len().max(1);
    let (lo, hi) = figs.iter().fold((0.5f64, 2.0f64), |(lo, hi), x| (lo.min(x.advantage()), hi.max(x.advantage())));
    let root = BitMapBackend::new(path, (1200, 120 + 48 * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut ch = ChartBuilder::on(&root)
        .caption("DevPilot against the best peer, same cluster, same run (> 1: DevPilot better)", ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(430)
        .build_cartesian_2d((lo / 1.5..hi * 1.5).log_scale(), (0..n).into_segmented())?;
    let labels: Vec<String> = figs.iter().map(|x| format!("{} vs {}", x.label, x.best().1)).collect();
    ch.configure_mesh()
        .disable_y_mesh()
        .x_desc("× better than the best peer (throughput: ours ÷ peer; latency and statements: peer ÷ ours)")
        .x_label_formatter(&|x| format!("{x:.2}"))
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_labels(n)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    let bar = |i: usize, v: f64| {
        let c = if v >= 1.0 { RGBColor(0, 150, 60) } else { RGBColor(220, 30, 30) };
        Rectangle::new([(lo / 1.5, SegmentValue::Exact(i)), (v, SegmentValue::Exact(i + 1))], c.mix(0.75).filled())
    };
    ch.draw_series(figs.iter().enumerate().map(|(i, x)| bar(i, x.advantage())))?;
    ch.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Exact(n))],
        BLACK.stroke_width(2),
    )))?;
    root.present()?;
    Ok(())
}
