//! The report's section (v): issue 25's targets, each a ratio of two medians of the same
//! alternated rounds ([`crate::versus`]), with every run beside it.

use std::fmt::Write;

use serde_json::Value;

use crate::report_fmt::{f, n0};

/// One target: ours against the other side, and the bound on their ratio.
struct Target {
    what: &'static str,
    ours: &'static str,
    other: (&'static str, String),
    /// (bound, true when the ratio must be at least the bound; false: at most); none for a
    /// figure shown for reference.
    bound: Option<(f64, bool)>,
}

fn ms(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.2}")
    }
}

/// A figure's value in one run: `key` names a medians entry (`…_pg_cpu` is PostgreSQL's CPU
/// per 1,000 jobs of the drain before it).
fn in_run(key: &str, run: &Value) -> f64 {
    let pointer = match key.strip_suffix("_pg_cpu") {
        Some(k) if k.starts_with("ours") => "/cpu_ms_per_1k_jobs/postgres",
        Some(_) => "/postgres_cpu_ms_per_1k_jobs",
        None if key.ends_with("pickup") => "/p50_ms",
        None => "/jobs_per_s",
    };
    run.pointer(pointer).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// Each round's own ratio of `ours` to `theirs` (the runs of a round share an index).
fn round_ratios(runs: &Value, ours: &str, theirs: &str) -> Vec<f64> {
    let list = |k: &str| runs[k.trim_end_matches("_pg_cpu")].as_array().cloned().unwrap_or_default();
    list(ours).iter().zip(list(theirs).iter()).map(|(o, t)| in_run(ours, o) / in_run(theirs, t)).collect()
}

fn targets(md: &Value) -> Vec<(Target, f64, f64)> {
    let g = |k: &str| f(&md[k]);
    let best_exec = if g("graphile_exec_default") >= g("graphile_exec_local") {
        ("graphile_exec_default", "Graphile Worker's default mode".to_string())
    } else {
        ("graphile_exec_local", "Graphile Worker's localQueue mode".to_string())
    };
    let t = |what, ours, other: (&'static str, &str), bound| Target {
        what,
        ours,
        other: (other.0, other.1.into()),
        bound: Some(bound),
    };
    let confined = ("spawn_limit_confined", "the confined spawn limit");
    let list = vec![
        t("`devpilot run -c 32 -- /bin/true`, confined (the default), one process (jobs/s)", "ours_cli_1x32", confined, (0.8, true)),
        t("4 × `devpilot run -c 8 -- /bin/true`, confined (jobs/s)", "ours_cli_4x8", confined, (0.7, true)),
        Target {
            what: "for reference: `devpilot run -c 32 --sandbox off -- /bin/true` (jobs/s)",
            ours: "ours_cli_1x32_off",
            other: ("spawn_limit", "the spawn limit, unconfined".into()),
            bound: None,
        },
        Target {
            what: "the agent path, `devpilot run -c 32 --sandbox off`, against `execFile('/bin/true')` per job, which confines nothing (jobs/s)",
            ours: "ours_cli_1x32_off",
            other: (best_exec.0, format!("{}, the better of its two", best_exec.1)),
            bound: Some((2.0, true)),
        },
        t("no-op drain, batched, 32 workers (jobs/s)", "ours_batched", ("graphile_batched", "Graphile Worker, localQueue"), (1.0, true)),
        t("no-op drain, one job per fetch, 32 workers (jobs/s)", "ours_single", ("graphile_single", "Graphile Worker, default"), (1.0, true)),
        t("PostgreSQL CPU per 1,000 jobs, batched drain (ms)", "ours_batched_pg_cpu", ("graphile_batched_pg_cpu", "Graphile Worker, localQueue"), (2.0, false)),
        t("PostgreSQL CPU per 1,000 jobs, one job per fetch (ms)", "ours_single_pg_cpu", ("graphile_single_pg_cpu", "Graphile Worker, default"), (2.0, false)),
        t("pickup p50 with NOTIFY (ms)", "ours_pickup", ("graphile_pickup", "Graphile Worker, LISTEN"), (1.0, false)),
    ];
    list.into_iter()
        .map(|t| {
            let (o, p) = (g(t.ours), g(t.other.0));
            (t, o, p)
        })
        .collect()
}

/// A target's verdict on its ratio.
fn verdict(ratio: f64, bound: Option<(f64, bool)>) -> &'static str {
    match bound {
        _ if ratio.is_nan() => "not measured",
        None => "reference",
        Some((b, true)) if ratio >= b => "met",
        Some((b, false)) if ratio <= b => "met",
        Some(_) => "missed",
    }
}

/// The section: the targets table, then every run.
pub fn section(m: &mut String, j: &Value) {
    let v = &j["versus"];
    if !v.is_object() {
        return;
    }
    let md = &v["medians"];
    let graphile = v["runs"]["graphile_batched"][0]["version"].as_str().unwrap_or("?");
    let _ = writeln!(m, "## (v) Against Graphile Worker and the machine's own limit, alternated rounds\n");
    let _ = writeln!(
        m,
        "{}{} rounds; in each, every figure below ran once, ours within a few runs of the other side it is compared with (most pairs one right after the other), so a noisy stretch of the machine hits both. Each figure is the median of its rounds. Graphile Worker {graphile} on node {}, {} workers on every side. The spawn limit: {} threads, each starting `/bin/true` and waiting for it as fast as it can (std's spawn: posix_spawn, a `CLONE_VM` child). The confined spawn limit: as many tasks, each making the sandbox the runner makes for a plain command (the engine's own `sandbox::Plan`: its mounts, an egress proxy, bubblewrap and DevPilot's init) around `/bin/true`, then starting it and waiting for it; what `devpilot run` adds to it is the queue, the job's files and its history. Each round's ratio is that round's ours ÷ theirs; the spread is their range.\n",
        v["date"].as_str().map(|d| format!("Measured {d}. ")).unwrap_or_default(),
        v["rounds"],
        v["node"].as_str().unwrap_or("?"),
        v["workers"],
        v["workers"],
    );
    let _ = writeln!(
        m,
        "| target | ours | other side | theirs | ours ÷ theirs | each round's ratio | spread (min–max) | bound | verdict |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|---|---|---|---|");
    for (t, ours, theirs) in targets(md) {
        let ratio = ours / theirs;
        let rounds = round_ratios(&v["runs"], t.ours, t.other.0);
        let finite: Vec<f64> = rounds.iter().copied().filter(|r| r.is_finite()).collect();
        let spread = match finite.iter().copied().reduce(f64::min).zip(finite.iter().copied().reduce(f64::max)) {
            Some((lo, hi)) => format!("{lo:.2}–{hi:.2}"),
            None => "—".into(),
        };
        let each: Vec<String> = rounds.iter().map(|r| format!("{r:.2}")).collect();
        let fmt = |x: f64| if t.what.contains("(ms)") { ms(x) } else { n0(x) };
        let bound =
            t.bound.map_or("none".into(), |(b, at_least)| format!("{} {b:.1}", if at_least { "≥" } else { "≤" }));
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {:.2} | {} | {spread} | {bound} | **{}** |",
            t.what,
            fmt(ours),
            t.other.1,
            fmt(theirs),
            ratio,
            each.join(", "),
            verdict(ratio, t.bound),
        );
    }
    let _ = writeln!(m, "\nEvery run, in round order:\n");
    let _ = writeln!(m, "| figure | runs | median |");
    let _ = writeln!(m, "|---|---|---|");
    let names = [
        ("spawn_limit", "spawn limit: 32 threads × spawn + wait of `/bin/true` (jobs/s)"),
        ("spawn_limit_confined", "confined spawn limit: 32 tasks × the runner's sandbox around `/bin/true` (jobs/s)"),
        ("xargs", "for reference: `seq N | xargs -P 32 -n 1 /bin/true` (jobs/s)"),
        ("ours_cli_1x32_off", "ours: `devpilot run -c 32 --sandbox off -- /bin/true` (jobs/s)"),
        ("ours_cli_1x32", "ours: `devpilot run -c 32 -- /bin/true`, confined (jobs/s)"),
        ("ours_cli_4x8", "ours: 4 × `devpilot run -c 8 -- /bin/true`, confined (jobs/s)"),
        ("graphile_exec_default", "Graphile Worker, default, `execFile('/bin/true')` (jobs/s)"),
        ("graphile_exec_local", "Graphile Worker, localQueue, `execFile('/bin/true')` (jobs/s)"),
        ("ours_batched", "ours: no-op drain, batched (jobs/s)"),
        ("graphile_batched", "Graphile Worker: no-op drain, localQueue (jobs/s)"),
        ("ours_single", "ours: no-op drain, one job per fetch (jobs/s)"),
        ("graphile_single", "Graphile Worker: no-op drain, default (jobs/s)"),
        ("ours_pickup", "ours: pickup p50 with NOTIFY (ms)"),
        ("graphile_pickup", "Graphile Worker: pickup p50 (ms)"),
    ];
    for (k, label) in names {
        let field = if k.ends_with("pickup") { "p50_ms" } else { "jobs_per_s" };
        let fmt = |x: f64| if field == "p50_ms" { ms(x) } else { n0(x) };
        let runs: Vec<String> = v["runs"][k].as_array().into_iter().flatten().map(|r| fmt(f(&r[field]))).collect();
        let _ = writeln!(m, "| {label} | {} | {} |", runs.join(", "), fmt(f(&md[k])));
    }
    let _ = writeln!(m);
}
