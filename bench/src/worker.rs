//! One benchmark process: M orchestrators ("machines"), each with its own one-connection pool,
//! over the real orchestrator loop. Protocol on stdio: prints `ready` once every pool is
//! connected, starts the loops on `go`, and on `stop` (or EOF) hands off, prints its summed
//! [`devpilot::orchestrator::Stats`] as one JSON line and exits.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devpilot::agent::AgentSpec;
use devpilot::db::{self, DbUrl, PoolSettings};
use devpilot::orchestrator::{self, RunConfig, StopMode};
use devpilot::Queue;
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    orch: String,
    #[arg(long)]
    machines: u32,
    #[arg(long)]
    concurrency: u32,
    /// `noop` (in-process) or a program to spawn per job, e.g. `/bin/true`.
    #[arg(long, default_value = "noop")]
    agent: String,
    #[arg(long)]
    data_dir: PathBuf,
    #[arg(long, default_value = "w")]
    name: String,
}

pub fn main(a: WorkerArgs) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let url = DbUrl::parse(&a.url).expect("url");
        let mut queues = vec![];
        for _ in 0..a.machines {
            let conn = db::connect(
                &url,
                &PoolSettings {
                    max_connections: 1,
                    connect_timeout: Duration::from_secs(30),
                    ..PoolSettings::default()
                },
            )
            .await
            .expect("connect");
            queues.push(Queue::new(conn));
        }
        let agent = if a.agent == "noop" { AgentSpec::NoOp } else { AgentSpec::Command(vec![a.agent.clone()]) };
        println!("ready");
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let _ = lines.next_line().await; // "go"
        let mut handles = vec![];
        for (i, q) in queues.iter().enumerate() {
            let machine = format!("{}-m{i}", a.name);
            let mut cfg = RunConfig::new(&a.orch, &machine, agent.clone(), a.data_dir.join(&machine));
            cfg.concurrency = a.concurrency;
            let (h, j) = orchestrator::spawn(q.clone(), cfg, None);
            handles.push((h, j));
        }
        let _ = lines.next_line().await; // "stop" or EOF
        let mut sum = [0u64; 6];
        for (h, _) in &handles {
            let s = h.stats();
            sum[0] += s.polls.load(Ordering::Relaxed);
            sum[1] += s.claim_queries.load(Ordering::Relaxed);
            sum[2] += s.heartbeats.load(Ordering::Relaxed);
            sum[3] += s.lost_races.load(Ordering::Relaxed);
            sum[4] += s.presence_writes.load(Ordering::Relaxed);
            sum[5] += s.sweeps.load(Ordering::Relaxed);
        }
        for (h, _) in &handles {
            let _ = tokio::time::timeout(Duration::from_secs(10), h.stop(StopMode::HandOff)).await;
        }
        println!(
            "{}",
            serde_json::json!({
                "polls": sum[0], "claim_queries": sum[1], "heartbeats": sum[2],
                "lost_races": sum[3], "presence_writes": sum[4], "sweeps": sum[5],
            })
        );
        for q in queues {
            let _ = q.connection().clone().close().await;
        }
    });
}
