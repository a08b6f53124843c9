//! One benchmark process: M orchestrators ("machines"), each with its own one-connection pool,
//! over the real orchestrator loop. Protocol on stdio: prints `ready` once every pool is
//! connected, starts the loops on `go`, and on `stop` (or EOF) hands off, prints its summed
//! [`devpilot_engine::orchestrator::Stats`] as one JSON line and exits.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, RunConfig, StopMode};
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::Queue;
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// From the environment, so the password is in no argument list.
    #[arg(long, env = "BENCH_DATABASE_URL", hide_env_values = true)]
    url: String,
    #[arg(long)]
    orch: String,
    #[arg(long)]
    machines: u32,
    #[arg(long)]
    concurrency: u32,
    /// Connections in each machine's pool (`devpilot run --connections`).
    #[arg(long, default_value_t = 1)]
    connections: u32,
    /// `noop` (in-process) or a program to spawn per job, e.g. `/bin/true`.
    #[arg(long, default_value = "noop")]
    agent: String,
    #[arg(long)]
    data_dir: PathBuf,
    #[arg(long, default_value = "w")]
    name: String,
    /// Spread the machines over this many orchestrators, `ORCH-0` to `ORCH-(K-1)` (0: all in
    /// `--orch`). Machine i of this process belongs to `ORCH-((first + i) % K)`.
    #[arg(long, default_value_t = 0)]
    orchs: u32,
    #[arg(long, default_value_t = 0)]
    first: u32,
    /// Each machine LISTENs on a connection of its own, as `devpilot run` does.
    #[arg(long)]
    listen: bool,
    /// The loop's intervals, in ms (default: the engine's).
    #[arg(long)]
    poll_ms: Option<u64>,
    #[arg(long)]
    max_poll_ms: Option<u64>,
    #[arg(long)]
    presence_ms: Option<u64>,
    #[arg(long)]
    sweep_ms: Option<u64>,
    /// Start the loops this far apart, so a fleet's polls are not in step at first.
    #[arg(long, default_value_t = 0)]
    stagger_us: u64,
}

impl WorkerArgs {
    fn orch_of(&self, i: u32) -> String {
        if self.orchs == 0 {
            self.orch.clone()
        } else {
            format!("{}-{}", self.orch, (self.first + i) % self.orchs)
        }
    }

    fn configure(&self, cfg: &mut RunConfig) {
        let ms = Duration::from_millis;
        cfg.concurrency = self.concurrency;
        if let Some(v) = self.poll_ms {
            cfg.poll_interval = ms(v);
        }
        if let Some(v) = self.max_poll_ms {
            cfg.max_poll_interval = ms(v);
        }
        if let Some(v) = self.presence_ms {
            cfg.presence_every = ms(v);
        }
        if let Some(v) = self.sweep_ms {
            cfg.sweep_every = ms(v);
        }
    }
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
                    max_connections: a.connections,
                    connect_timeout: Duration::from_secs(30),
                    ..PoolSettings::default()
                },
            )
            .await
            .expect("connect");
            queues.push(Queue::new(conn).pooled(url.pooled()));
        }
        let agent = if a.agent == "noop" { AgentSpec::NoOp } else { AgentSpec::Command(vec![a.agent.clone()]) };
        println!("ready");
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let _ = lines.next_line().await; // "go"
        let mut handles = vec![];
        for (i, q) in queues.iter().enumerate() {
            let machine = format!("{}-m{i}", a.name);
            let orch = a.orch_of(i as u32);
            let mut cfg = RunConfig::new(&orch, &machine, agent.clone(), a.data_dir.join(&machine));
            a.configure(&mut cfg);
            let hints = if a.listen { devpilot_store::listen::spawn(&url, &orch, q) } else { None };
            let (h, j) = orchestrator::spawn(q.clone(), cfg, hints);
            handles.push((h, j));
            if a.stagger_us > 0 {
                tokio::time::sleep(Duration::from_micros(a.stagger_us)).await;
            }
        }
        println!("started");
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

/// The parent's side of one worker process.
pub struct Proc {
    pub child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Proc {
    /// Starts `devpilot-bench worker ARGS` on the database at `url` and waits until every
    /// pool is connected.
    pub async fn spawn(url: &str, args: &[String]) -> Proc {
        use std::process::Stdio;
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .arg("worker")
            .args(args)
            .env("BENCH_DATABASE_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next_line().await.unwrap();
        assert_eq!(ready.as_deref(), Some("ready"));
        Proc { child, stdin, lines }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    pub async fn go(&mut self) {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(b"go\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Waits until every loop of the process has started.
    pub async fn started(&mut self) {
        let l = self.lines.next_line().await.unwrap();
        assert_eq!(l.as_deref(), Some("started"));
    }

    /// Stops the loops (a hand-off) and returns the process's summed stats.
    pub async fn stop(mut self) -> serde_json::Value {
        use tokio::io::AsyncWriteExt;
        let _ = self.stdin.write_all(b"stop\n").await;
        drop(self.stdin);
        let mut stats = serde_json::Value::Null;
        while let Ok(Ok(Some(l))) = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line()).await {
            if let Ok(v @ serde_json::Value::Object(_)) = serde_json::from_str(&l) {
                stats = v;
                break;
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let _ = self.child.kill().await;
        stats
    }
}
