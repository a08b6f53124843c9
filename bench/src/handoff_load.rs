//! (x) The hand-off under a real load: a laptop on café Wi-Fi closes its lid while the real
//! claude CLI works on a mid-sized product.
//!
//! - The repository: [`crate::bigrepo`] (over 200 MB of packed history, 20,000 files).
//! - The link: one [`Link`] of 10 Mbit/s with 50 ms each way (100 ms a round trip), shared
//!   by the git remote (`git daemon` with pushes on, behind a [`Shaper`]) and the PostgreSQL
//!   the machine uses (behind another), as one Wi-Fi uplink is.
//! - The machine: `devpilot run --agent claude`, an OS process of its own with the default
//!   settings (a 4 s push bound, a 10 s cancel grace); its clone's `origin` is the remote
//!   through the link.
//! - The work: claude reads 40 of the large generated files through its Read tool (its
//!   session file, the conversation carried, grows past 5 MB), and then waits on its model at
//!   a gate. Meanwhile the harness edits 300 source files in the job's worktree, a few lines
//!   each, as an agent's refactor does: claude's `acceptEdits` mode runs no shell, and 600
//!   more tool turns (a read before each edit) would only make the round slow.
//! - The hand-off: `devpilot handoff --json`, the request the tray's sleep hook makes of its
//!   engine, timed from the request to the verdict it prints. The round then checks that the
//!   branch on the remote holds the 300 files and that the session row holds the
//!   conversation.
//!
//! The runner's log gives the steps inside: when the agent stopped, when the conversation
//! was saved (each from its line's timestamp), and when the work was pushed (its line's
//! `took_ms` after the agent stopped, as the push starts then).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use devpilot_tests::clis::{clis, codex_config, gemini_settings};
use devpilot_tests::model_server::TurnGate;
use devpilot_tests::shaper::{Link, Shaper};
use devpilot_tests::{free_port, run_cli, worktree_of, write_config, ModelServer, Runner, Turn};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};

use crate::bigrepo::{self, git, large_path, source_path};
use crate::common::{connect, log, pct, Backend, Env, ORCH};

/// The link: 10 Mbit/s, 50 ms each way.
const RATE_BPS: u64 = 10_000_000;
const DELAY: Duration = Duration::from_millis(50);
/// Files claude reads whole, files the work changes.
const READS: usize = 40;
const CHANGED: usize = 300;
/// The target: inside logind's default sleep delay.
const TARGET_S: f64 = 5.0;

/// `git daemon` serving every repository under a directory, pushes allowed; killed on drop.
struct GitDaemon {
    child: Child,
    addr: SocketAddr,
}

impl GitDaemon {
    fn start(base: &Path) -> GitDaemon {
        let port = free_port();
        let child = Command::new("git")
            .args(["daemon", "--reuseaddr", "--export-all", "--enable=receive-pack", "--listen=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(base)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < until, "git daemon did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        GitDaemon { child, addr }
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What every round shares.
struct Bench<'a> {
    env: &'a Env,
    product: &'a Path,
    dir: PathBuf,
    remotes: PathBuf,
    git_port: u16,
    pg_port: u16,
    model: ModelServer,
}

/// (x): five rounds (one when quick), each on a fresh database, remote and clone.
pub async fn measure(env: &Env, quick: bool) -> Value {
    let product = bigrepo::product();
    let dir = env.tmp.join(format!("x{}", env.next()));
    let remotes = dir.join("remotes");
    std::fs::create_dir_all(&remotes).unwrap();
    let link = Link::new(RATE_BPS, DELAY);
    let daemon = GitDaemon::start(&remotes);
    let git = Shaper::start(daemon.addr, link.clone()).await.unwrap();
    let pg = Shaper::start(([127, 0, 0, 1], env.pg.port).into(), link).await.unwrap();
    let bench = Bench {
        env,
        product: &product.bare,
        dir,
        remotes,
        git_port: git.port,
        pg_port: pg.port,
        model: ModelServer::start().unwrap(),
    };
    // Usage as a short conversation's: claude compacts a conversation its model says is
    // near the context window, and this one is 5 MB of text.
    bench.model.set_input_tokens(Some(2_000));
    let rounds = if quick { 1 } else { 5 };
    let mut samples = vec![];
    for r in 0..rounds {
        log(format!("(x) the hand-off under load: round {} of {rounds}", r + 1));
        let s = bench.round(r).await;
        log(format!("(x) round {}: {s}", r + 1));
        samples.push(s);
    }
    let mut secs: Vec<f64> = samples.iter().filter_map(|s| s["total_s"].as_f64()).collect();
    secs.sort_by(f64::total_cmp);
    json!({
        "repository": product.figures,
        "link": {"rate_mbit": RATE_BPS as f64 / 1e6, "delay_ms_each_way": DELAY.as_millis() as u64},
        "reads": READS, "changed_files": CHANGED, "target_s": TARGET_S,
        "p50_s": pct(&secs, 50.0), "worst_s": secs.last().copied(),
        "all_safe": samples.iter().all(|s| s["safe"] == json!(true)),
        "rounds": samples,
    })
}

impl Bench<'_> {
    async fn round(&self, r: usize) -> Value {
        let rdir = self.dir.join(format!("r{r}"));
        let remote = self.remotes.join(format!("r{r}.git"));
        git(&self.dir, &["clone", "--bare", "--local", "--quiet", &s(self.product), &s(&remote)]);
        let clone = rdir.join("src").join("webapp");
        std::fs::create_dir_all(clone.parent().unwrap()).unwrap();
        git(&self.dir, &["clone", "--local", "--quiet", &s(self.product), &s(&clone)]);
        let origin = format!("git://127.0.0.1:{}/r{r}.git", self.git_port);
        git(&clone, &["remote", "set-url", "origin", &origin]);
        // Through the link, which runs on this runtime: off its workers.
        let fetch_in = clone.clone();
        tokio::task::spawn_blocking(move || git(&fetch_in, &["fetch", "--quiet", "origin"])).await.unwrap();
        let direct = self.env.fresh(Backend::Pg).await;
        let shaped = direct.replace(&format!(":{}/", self.env.pg.port), &format!(":{}/", self.pg_port));
        assert_ne!(shaped, direct, "the machine's database is reached through the link");
        let home = rdir.join("laptop");
        write_config(&home, &format!("[repos.webapp]\npath = \"{}\"\npush = true\n", clone.display()));
        let runner = self.spawn(&home, &rdir.join("cli"), &shaped);
        let args = ["enqueue", "--orchestrator", ORCH, "--title", "Split the storage layer", "--repo", "webapp"];
        let prompt = "Read the generated schemas, then split the storage layer into modules.";
        let (code, out, err) = run_cli(&home, &direct, &[&args[..], &["--prompt", prompt]].concat(), None);
        assert_eq!(code, 0, "{err}");
        let id: i64 = out.trim().parse().unwrap();
        let wt = worktree_of(&home, ORCH, id);
        let gate = TurnGate::default();
        let reads = (0..READS).map(|i| Turn::Tool {
            name: "Read".into(),
            input: json!({"file_path": wt.join(large_path(i % bigrepo::LARGE_FILES))}),
        });
        self.model.script(reads.chain([Turn::Gated(gate.clone())]));
        let until = Instant::now() + Duration::from_secs(600);
        while !gate.arrived() {
            assert!(Instant::now() < until, "claude did not reach the gate; see {}", runner.log.display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        change_files(&wt);
        let projects = rdir.join("cli").join(".claude").join("projects");
        let session_bytes = size_under(&projects, "jsonl");
        // The conversation outlives the round too, to look at what is carried.
        if let Some(file) = first_under(&projects, "jsonl") {
            let _ = std::fs::copy(file, self.dir.join(format!("session-r{r}.jsonl")));
        }
        let asked = epoch();
        let started = Instant::now();
        // Off the runtime's workers: the link's proxies run on them.
        let (code, out, err) = {
            let (home, direct) = (home.clone(), direct.clone());
            let ask = move || run_cli(&home, &direct, &["handoff", "--orchestrator", ORCH, "--json"], None);
            tokio::task::spawn_blocking(ask).await.unwrap()
        };
        let total = started.elapsed().as_secs_f64();
        gate.open();
        self.model.clear_script();
        assert_eq!(code, 0, "devpilot handoff: {out}{err}");
        let verdict: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        let branch = verdict["jobs"][0]["branch"].as_str().map(str::to_string);
        let changed = branch
            .as_ref()
            .map_or(0, |b| git(&remote, &["diff", "--name-only", "main", &format!("refs/heads/{b}")]).lines().count());
        let (raw, stored) = session_sizes(&direct, id).await;
        let steps = steps(&runner.log, asked);
        drop(runner);
        // The runner's log outlives the round (with DEVPILOT_BENCH_KEEP, the run).
        let _ = std::fs::copy(home.join("runner-laptop.log"), self.dir.join(format!("runner-r{r}.log")));
        let _ = std::fs::remove_dir_all(&rdir);
        let _ = std::fs::remove_dir_all(&remote);
        json!({
            "total_s": total, "safe": verdict["safe"], "text": verdict["text"], "branch": branch,
            "changed_on_remote": changed, "session_file_bytes": session_bytes,
            "session_raw_bytes": raw, "session_stored_bytes": stored, "steps": steps,
        })
    }

    /// `devpilot run --agent claude` as the laptop, on `url`, with the defaults but for the
    /// CLIs' home and the model server.
    fn spawn(&self, home: &Path, cli_home: &Path, url: &str) -> Runner {
        std::fs::create_dir_all(cli_home).unwrap();
        codex_config(cli_home, &self.model.url());
        gemini_settings(cli_home);
        let log_path = home.join("runner-laptop.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let path = format!("{}:{}", clis().display(), std::env::var("PATH").unwrap());
        let child = devpilot_tests::devpilot(home, url)
            .args(["run", "--orchestrator", ORCH, "--machine", "laptop", "--agent", "claude"])
            .env("DEVPILOT_LOG", "info")
            .env("PATH", path)
            .env("HOME", cli_home)
            .env("ANTHROPIC_BASE_URL", self.model.url())
            .env("ANTHROPIC_API_KEY", "sk-ant-bench-key")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("devpilot run");
        Runner { child, machine: "laptop".into(), log: log_path }
    }
}

/// The conversation job `id`'s row holds: its raw bytes and its stored bytes (0, 0 when
/// there is none).
async fn session_sizes(url: &str, id: i64) -> (i64, i64) {
    let db = connect(url, 1).await;
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            "SELECT raw_size, octet_length(bundle)::bigint AS stored FROM job_sessions WHERE job_id = $1",
            [id.into()],
        ))
        .await
        .unwrap();
    db.close().await.ok();
    row.map_or((0, 0), |r| (r.try_get::<i64>("", "raw_size").unwrap(), r.try_get::<i64>("", "stored").unwrap()))
}

/// The work the agent did: 300 source files with a few lines changed each.
fn change_files(wt: &Path) {
    for k in 0..CHANGED {
        let path = wt.join(source_path(k * (bigrepo::SOURCE_FILES / CHANGED)));
        let text = std::fs::read_to_string(&path).unwrap();
        let mut out = String::with_capacity(text.len() + 64);
        for (n, line) in text.lines().enumerate() {
            if n % 16 == 5 {
                out.push_str(&line.replacen("let ", "let mut ", 1));
            } else {
                out.push_str(line);
            }
            out.push('\n');
        }
        out.push_str("// Moved into the storage module.\n");
        std::fs::write(&path, out).unwrap();
    }
}

/// The hand-off's steps from the runner's log: seconds from `asked` (epoch seconds) to the
/// first line that says the conversation was saved, and to the one that says the work was
/// pushed (or stayed).
fn steps(log: &Path, asked: f64) -> Value {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let at = |needle: &str| {
        text.lines().filter(|l| l.contains(needle)).find_map(|l| {
            let stamp = l.split_whitespace().next()?;
            let t = humantime::parse_rfc3339(stamp).ok()?.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
            (t >= asked).then_some(t - asked)
        })
    };
    // The push's line is written once the conversation's save has ended too (they run side
    // by side since the levers): its own end is its start (the agent's stop) plus its took_ms.
    let took = |needle: &str| {
        let line = text.lines().find(|l| l.contains(needle))?;
        let ms = line.split("took_ms=").nth(1)?.split_whitespace().next()?.parse::<f64>().ok()?;
        Some(ms / 1000.0)
    };
    let stopped = at("the agent stopped (HandOff)");
    let push = took("work in progress pushed").or_else(|| took("work in progress stayed"));
    json!({
        "agent_stopped_s": stopped,
        "session_saved_s": at("carried the claude session"),
        "pushed_s": stopped.zip(push).map(|(a, b)| a + b),
        "push_took_s": push,
        "pushed_logged_s": at("work in progress pushed").or_else(|| at("work in progress stayed")),
    })
}

/// Bytes of the files ending in `.ext` under `dir`.
fn size_under(dir: &Path, ext: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                size_under(&p, ext)
            } else if p.extension().is_some_and(|x| x == ext) {
                e.metadata().map_or(0, |m| m.len())
            } else {
                0
            }
        })
        .sum()
}

/// The first file ending in `.ext` under `dir`.
fn first_under(dir: &Path, ext: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let p = e.path();
        if p.is_dir() {
            first_under(&p, ext)
        } else {
            p.extension().is_some_and(|x| x == ext).then_some(p)
        }
    })
}

fn epoch() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn s(p: &Path) -> String {
    p.display().to_string()
}
