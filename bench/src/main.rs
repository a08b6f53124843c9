//! `devpilot-bench`: measures the dispatch engine against the claim statement's physical limit
//! (pgbench running the single-statement SKIP LOCKED claim), on one throwaway PostgreSQL, and
//! the embedded SQLite backend. Run it with `scripts/bench.sh`; it writes `bench/REPORT.md`,
//! `bench/report.json` and `bench/throughput.png`.
//!
//! # Layout
//! - [`cluster`]: the throwaway PostgreSQL and CPU accounting from /proc.
//! - [`common`]: what the measurements share: the run's environment and plan, database helpers,
//!   pre-filling a queue, statistics.
//! - [`measure`]: measurements a to h, one module each (pgbench, claims, drain, latency, idle).
//! - [`agent_path`]: (e) as a user runs it, `devpilot run` processes spawning a shell agent per job.
//! - [`fleet`]: one PostgreSQL and thousands of machines: an idle pooled fleet, a listening one.
//! - [`peers`]: Graphile Worker and pg-boss (`bench/peers/peer.js`) on the same cluster.
//! - [`report`]: the Markdown report, the JSON file and the chart.
//! - [`report_fmt`]: the number helpers both parts of the report use.
//! - [`report_peers`]: the report's side-by-side with the peers, the ratios and their chart.
//! - [`versus`]: (v) issue 25's comparisons, in alternated rounds: the agent path against the
//!   machine's spawn limit and Graphile Worker, the no-op drains and pickup against Graphile.
//! - [`report_versus`]: the report's section (v), its targets and every run.
//! - [`governor`]: (l) the claim with the governor (issue 42) against without, alternated
//!   rounds, its plans and a herd check; the `governor` subcommand measures it alone into an
//!   existing report.
//! - [`governor_db`], [`governor_run`], [`governor_plans`]: (l)'s databases and routes, its
//!   timed runs and herd check, and the plans PostgreSQL ran.
//! - [`report_governor`]: the report's section (l).
//! - [`user_latency`]: (w) what a user feels, from a label to the agent and from the agent's
//!   exit to the comment and the pull request, through two `devpilot run` processes and the
//!   GitHub stand-in; the `latency` subcommand measures it alone into an existing report.
//! - [`report_latency`]: the report's section (w).
//! - [`handoff_load`]: (x) the hand-off under a real load, the real claude CLI on a generated
//!   product ([`bigrepo`]) over a shaped 10 Mbit/s link; the `handoff` subcommand measures it
//!   alone into an existing report. [`report_handoff`]: its section.
//! - [`sandbox`]: (s) the agent sandbox's cost, confined against `--sandbox off`; the
//!   `sandbox` subcommand measures it alone into an existing report.
//! - `worker` (hidden subcommand): one OS process running orchestrators with a no-op (or
//!   `/bin/true`) agent, driven by the parent over stdin/stdout, for the multi-process drains.

// A benchmark binary: a failed setup step should stop the run loudly, so unwrap/expect are
// the right tool here (the workspace warns on them for library and CLI code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_path;
mod bigrepo;
mod cluster;
mod common;
mod fleet;
mod governor;
mod governor_db;
mod governor_plans;
mod governor_run;
mod handoff_load;
mod measure;
mod peers;
mod report;
mod report_fmt;
mod report_governor;
mod report_handoff;
mod report_latency;
mod report_peers;
mod report_versus;
mod sandbox;
mod user_latency;
mod versus;
mod worker;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "devpilot-bench", about = "DevPilot dispatch benchmark (see scripts/bench.sh)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every measurement and write the report.
    Run {
        /// Where REPORT.md, report.json and throughput.png go.
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// A much shorter run, to check the machinery (figures not meaningful).
        #[arg(long)]
        quick: bool,
    },
    /// Measure (s), the agent sandbox's cost, alone, into the existing report.json, and
    /// re-render REPORT.md.
    Sandbox {
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// A much shorter run, to check the machinery (figures not meaningful).
        #[arg(long)]
        quick: bool,
    },
    /// Measure (l), the claim with the governor against without, alone, into the existing
    /// report.json, and re-render REPORT.md.
    Governor {
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// A much shorter run, to check the machinery (figures not meaningful).
        #[arg(long)]
        quick: bool,
    },
    /// Measure (w), the user's latencies (label to agent, agent to comment and PR), alone,
    /// into the existing report.json, and re-render REPORT.md.
    Latency {
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// A much shorter run, to check the machinery (figures not meaningful).
        #[arg(long)]
        quick: bool,
    },
    /// Measure (x), the hand-off under a real load (a generated 200 MB repository over a
    /// shaped 10 Mbit/s link), alone, into the existing report.json, and re-render REPORT.md.
    Handoff {
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// One round rather than five, to check the machinery.
        #[arg(long)]
        quick: bool,
    },
    /// Re-render REPORT.md and throughput.png from an existing report.json.
    Render {
        #[arg(long, default_value = "bench")]
        out: PathBuf,
    },
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Worker(args) => worker::main(args),
        Cmd::Run { out, quick } => {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            let (json, cleanup) = rt.block_on(measure::run_all(quick));
            std::fs::create_dir_all(&out).expect("out dir");
            std::fs::write(out.join("report.json"), serde_json::to_string_pretty(&json).unwrap()).unwrap();
            report::render(&json, &out);
            eprintln!("wrote {}/REPORT.md, report.json, throughput.png", out.display());
            for dir in cleanup {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        Cmd::Sandbox { out, quick } => one_section(&out, "sandbox", "(s)", measure::sandbox_only(quick)),
        Cmd::Governor { out, quick } => one_section(&out, "governor", "(l)", measure::governor_only(quick)),
        Cmd::Latency { out, quick } => one_section(&out, "user_latency", "(w)", measure::latency_only(quick)),
        Cmd::Handoff { out, quick } => one_section(&out, "handoff_load", "(x)", measure::handoff_only(quick)),
        Cmd::Render { out } => {
            let json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
            report::render(&json, &out);
        }
    }
}

/// Measures one section alone and writes it into the existing report.json under `key`
/// (the other sections kept), then renders REPORT.md again.
fn one_section(
    out: &std::path::Path,
    key: &str,
    name: &str,
    measure: impl std::future::Future<Output = (serde_json::Value, Vec<PathBuf>)>,
) {
    let path = out.join("report.json");
    let mut json: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (mut section, cleanup) = rt.block_on(measure);
    if key == "user_latency" {
        user_latency::keep_unmeasured(&json[key], &mut section);
    }
    // The figure before the hand-off's levers, kept beside each new measurement.
    if key == "handoff_load" && json[key]["before"].is_object() {
        section["before"] = json[key]["before"].clone();
    }
    json[key] = section;
    std::fs::create_dir_all(out).expect("out dir");
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    report::render(&json, out);
    eprintln!("wrote {name} into {}/report.json and REPORT.md", out.display());
    if std::env::var_os("DEVPILOT_BENCH_KEEP").is_some() {
        eprintln!("kept {cleanup:?} (DEVPILOT_BENCH_KEEP)");
        return;
    }
    for dir in cleanup {
        let _ = std::fs::remove_dir_all(dir);
    }
}
