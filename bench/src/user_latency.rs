//! (w) What a user feels, on the embedded default and on PostgreSQL: two `devpilot run` OS
//! processes (a laptop and a desktop, each with its own clone and the default intervals) take
//! labelled issues from the harness's GitHub stand-in, run a shell agent that changes a file,
//! push its branch to a real bare repository, open the pull request and comment on the issue.
//!
//! Three phases, one after the other on one fleet:
//! - **asleep**: the laptop is stopped (SIGSTOP, as a closed lid); issues are labelled at
//!   random moments over a few intake intervals, so each waits for the next turn as a user's
//!   would.
//! - **awake**: both machines up, the same again.
//! - **killed**: both up; the finishing machine is killed (SIGKILL) the moment its completion
//!   comment is on the wire. The stand-in drops that request (a gate, see
//!   `devpilot_tests::gate`), so the comment is the other machine's to deliver once the
//!   delivery lease has run out.
//!
//! Times come from where they happen: the label from the benchmark's clock as it labels, the
//! claim from the job's `claimed_at`, the agent's start and exit from its own record, the
//! comment and the pull request from polling the stand-in every 25 ms.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use devpilot_tests::github::IssueSeed;
use devpilot_tests::review::github_clone;
use devpilot_tests::{write_config, GitHubStandIn, GitRemote, RecordingAgent, Runner};
use rand::Rng;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};

use crate::common::{connect, log, pct, Backend, Env, ORCH};

const TOKEN: &str = "ghp_bench_latency_token";
const REPO: &str = "acme/webapp";
/// The source's interval: the default, and the minimum for a quick run.
const INTERVAL: (u64, u64) = (60, 15);
/// The source's call timeout (the default): the delivery lease is the longer of 120 s and
/// eight of these (`devpilot_engine::sources::DELIVERY_LEASE`).
const TIMEOUT_S: u64 = 20;
/// The machine that sleeps in the first phase, and the one that stays up.
const MACHINES: [&str; 2] = ["laptop", "desktop"];

/// One phase: how many issues, labelled over how long, with the laptop stopped or not.
struct Phase {
    name: &'static str,
    issues: usize,
    window: Duration,
    asleep: bool,
}

/// One issue's moments (epoch seconds); `None` where it never came.
#[derive(Default, Clone)]
struct Sample {
    number: u64,
    label: f64,
    /// The intake turn wrote the job.
    created: Option<f64>,
    claimed: Option<f64>,
    started: Option<f64>,
    exited: Option<f64>,
    comment: Option<f64>,
    pr: Option<f64>,
}

/// The two machines, their homes and what they share.
struct Fleet {
    gh: GitHubStandIn,
    agent: RecordingAgent,
    url: String,
    /// The bench's own connection, for its reads (every 25 ms in the killed phase).
    db: sea_orm::DatabaseConnection,
    dir: PathBuf,
    homes: Vec<PathBuf>,
    machines: Vec<Option<Runner>>,
    next_issue: u64,
}

fn epoch() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// (w) on both backends.
pub async fn measure(env: &Env, quick: bool) -> Value {
    let interval = if quick { INTERVAL.1 } else { INTERVAL.0 };
    let (a, b) = if quick { (6, 4) } else { (50, 20) };
    let phases = [
        Phase { name: "asleep", issues: a, window: Duration::from_secs(interval * 3), asleep: true },
        Phase { name: "awake", issues: b, window: Duration::from_secs(interval), asleep: false },
    ];
    let mut backends = vec![];
    // DEVPILOT_BENCH_BACKENDS=postgres (or sqlite): one of them, to work on it.
    let only = std::env::var("DEVPILOT_BENCH_BACKENDS").unwrap_or_default();
    for backend in [Backend::Sqlite, Backend::Pg].into_iter().filter(|b| only.is_empty() || only == b.name()) {
        log(format!("(w) user latencies on {}: {a} + {b} issues, a {interval} s source interval", backend.name()));
        let mut fleet = Fleet::start(env, backend, interval).await;
        let mut out = json!({ "backend": backend.name() });
        for p in &phases {
            let samples = fleet.phase(p).await;
            out[p.name] = summary(&samples);
        }
        out["killed"] = summary(&[fleet.killed().await]);
        out["date"] = json!(crate::common::now_utc());
        backends.push(out);
    }
    let lease = 120.max(8 * TIMEOUT_S);
    json!({ "interval_s": interval, "timeout_s": TIMEOUT_S, "delivery_lease_s": lease, "backends": backends })
}

/// Whether process `pid` is stopped (by a signal, or a tracer).
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's closing parenthesis.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, Some("T" | "t"))
}

/// A run of one backend (`DEVPILOT_BENCH_BACKENDS`) keeps the other backend's figures of
/// the `previous` section, each with the date it was measured.
pub fn keep_unmeasured(previous: &Value, section: &mut Value) {
    let measured: Vec<Value> = section["backends"].as_array().cloned().unwrap_or_default();
    let name = |b: &Value| b["backend"].as_str().map(str::to_string);
    let kept = previous["backends"].as_array().into_iter().flatten().filter(|old| {
        let was = name(old);
        !measured.iter().any(|b| name(b) == was)
    });
    let mut all: Vec<Value> = kept.cloned().collect();
    all.extend(measured.iter().cloned());
    all.sort_by_key(|b| if name(b).as_deref() == Some("sqlite") { 0 } else { 1 });
    section["backends"] = Value::Array(all);
}

/// p50, p95 and the count of each span, in seconds.
fn summary(samples: &[Sample]) -> Value {
    let span = |f: &dyn Fn(&Sample) -> Option<f64>| {
        let mut v: Vec<f64> = samples.iter().filter_map(f).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        json!({ "n": v.len(), "p50": pct(&v, 50.0), "p95": pct(&v, 95.0), "max": v.last() })
    };
    json!({
        "issues": samples.len(),
        "label_to_created": span(&|s| s.created.map(|c| c - s.label)),
        "label_to_claimed": span(&|s| s.claimed.map(|c| c - s.label)),
        "label_to_started": span(&|s| s.started.map(|c| c - s.label)),
        "exit_to_comment": span(&|s| Some(s.comment? - s.exited?)),
        "exit_to_pr": span(&|s| Some(s.pr? - s.exited?)),
    })
}

/// The machine's settings: the GitHub source at its defaults but the interval, and the
/// clone as `webapp`, pushing and opening a pull request.
fn config(api_url: &str, clone: &Path, interval: u64) -> String {
    format!(
        "orchestrator_id = \"{ORCH}\"\n\
         [sources.gh]\nkind = \"github\"\nrepo = \"{REPO}\"\nlabel = \"agent\"\ninterval = \"{interval}s\"\n\
         api_url = \"{api_url}\"\nmaps_to = \"webapp\"\n\
         [repos.webapp]\npath = \"{}\"\npush = true\n",
        clone.display()
    )
}

impl Fleet {
    async fn start(env: &Env, backend: Backend, interval: u64) -> Fleet {
        let dir = env.tmp.join(format!("w{}", env.next()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = env.fresh(backend).await;
        let remote = GitRemote::new(&dir);
        let gh = GitHubStandIn::start(TOKEN);
        gh.add_repo_with_git(REPO, &remote.bare);
        // The agent: changes a file, says so, and (in the killed phase) waits for its go.
        let agent = RecordingAgent::new(
            &dir,
            "echo \"fixed $DEVPILOT_JOB_ID\" > fix.txt\n\
             printf '{\"summary\":\"fixed it\"}' > \"$DEVPILOT_RESULT_FILE\"\n\
             d=$(dirname \"$rec\")\n\
             if [ -e \"$d/hold\" ]; then while [ ! -e \"$d/go-$DEVPILOT_JOB_ID\" ]; do sleep 0.02; done; fi",
        );
        let mut homes = vec![];
        for m in MACHINES {
            let home = dir.join(m);
            let clone = github_clone(&remote, &dir, m);
            write_config(&home, &config(&gh.url(), &clone, interval));
            homes.push(home);
        }
        let db = connect(&url, 1).await;
        let mut fleet = Fleet { gh, agent, url, db, dir, homes, machines: vec![], next_issue: 0 };
        fleet.machines = (0..MACHINES.len()).map(|i| Some(fleet.spawn(i))).collect();
        fleet
    }

    /// `devpilot run` for machine `i`, with the default intervals; the token for it alone.
    fn spawn(&self, i: usize) -> Runner {
        let home = &self.homes[i];
        let log_path = home.join(format!("runner-{}.log", MACHINES[i]));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        let mut cmd = devpilot_tests::devpilot(home, &self.url);
        // A process group of its own. A stopped machine in the benchmark's group would be
        // hung up and continued by the kernel when that group is orphaned (the shell that
        // started the benchmark exits: SIGHUP, then SIGCONT, to a group with a stopped
        // member): the "asleep" laptop then woke early, or died of the SIGHUP.
        cmd.process_group(0);
        let child = cmd
            // DEVPILOT_BENCH_LOG (a `DEVPILOT_LOG` filter) to look closer at a run.
            .env("DEVPILOT_LOG", std::env::var("DEVPILOT_BENCH_LOG").unwrap_or_else(|_| "info".into()))
            .env("GITHUB_TOKEN", TOKEN)
            .env("DEVPILOT_GITHUB_API_URL", self.gh.url())
            .args(["run", "--orchestrator", ORCH, "--machine", MACHINES[i], "--allow-write"])
            .arg(&self.dir)
            .arg("--")
            .arg(&self.agent.script)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        Runner { child, machine: MACHINES[i].into(), log: log_path }
    }

    /// Opens `n` unlabelled issues; their numbers.
    fn open_issues(&mut self, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                self.next_issue += 1;
                self.gh.open_issue(REPO, IssueSeed::new(&format!("Fix bug {}", self.next_issue), &[]))
            })
            .collect()
    }

    /// Labels `p.issues` issues at random moments of `p.window`, then watches each to its
    /// comment and pull request.
    async fn phase(&mut self, p: &Phase) -> Vec<Sample> {
        let laptop = self.machines[0].as_ref().unwrap().pid();
        if p.asleep {
            self.wait_present().await;
            devpilot_tests::signal_tree(laptop, libc::SIGSTOP);
            // kill(2) returns before the process has stopped.
            let asleep = devpilot_tests::wait_for(Duration::from_secs(5), || async { stopped(laptop) }).await;
            assert!(asleep, "(w) {}: the laptop did not stop", p.name);
        }
        let numbers = self.open_issues(p.issues);
        // One label at a random moment of each of `issues` equal slices of the window: as
        // uniform over the source's interval as independent moments, without their median's
        // noise (about ±4 s for 50 labels over a minute, more than the margin measured).
        let slice = p.window.div_f64(p.issues as f64);
        let at: Vec<Duration> =
            (0..p.issues).map(|i| slice.mul_f64(i as f64 + rand::rng().random_range(0.0..1.0))).collect();
        let t0 = Instant::now();
        let mut samples: Vec<Sample> = numbers.iter().map(|&number| Sample { number, ..Sample::default() }).collect();
        let mut labelled = 0;
        let deadline = p.window + Duration::from_secs(600);
        while t0.elapsed() < deadline {
            while labelled < at.len() && t0.elapsed() >= at[labelled] {
                samples[labelled].label = epoch();
                self.gh.set_labels(REPO, samples[labelled].number, &["agent"]);
                labelled += 1;
            }
            self.observe(&mut samples[..labelled]);
            if p.asleep {
                assert!(stopped(laptop), "(w) {}: the laptop woke during its sleep", p.name);
            }
            if labelled == at.len() && samples.iter().all(|s| s.comment.is_some() && s.pr.is_some()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if p.asleep {
            devpilot_tests::signal_tree(laptop, libc::SIGCONT);
            // A signal that ends it (a SIGHUP held while it was stopped) takes effect now.
            let laptop = self.machines[0].as_mut().unwrap();
            let exited = |l: &mut Runner| l.child.try_wait().ok().flatten();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(1) && exited(laptop).is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let exited = exited(laptop);
            assert!(exited.is_none(), "(w) {}: the laptop did not survive its sleep: {exited:?}", p.name);
        }
        self.fill(&mut samples).await;
        let commented = samples.iter().filter(|s| s.comment.is_some()).count();
        log(format!("(w) {}: {} issues, {commented} commented", p.name, samples.len()));
        // A comment still on its way would be caught by the next phase's gate.
        assert_eq!(commented, samples.len(), "(w) {}: every issue is commented before the next phase", p.name);
        samples
    }

    /// Waits until both machines have started (each has written its presence row), so the
    /// laptop is never stopped in the middle of its start (a migration, a write).
    async fn wait_present(&self) {
        let t0 = Instant::now();
        loop {
            let n = crate::common::scalar(&self.db, "SELECT COUNT(*) AS n FROM machines").await;
            if n >= MACHINES.len() as i64 {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "(w) the machines never started");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// When each issue's completion comment and its pull request appeared.
    fn observe(&self, samples: &mut [Sample]) {
        let pulls = self.gh.pulls(REPO);
        let now = epoch();
        for s in samples.iter_mut() {
            if s.comment.is_none() {
                let comments = self.gh.comments(REPO, s.number);
                if comments.iter().any(|c| c.body.starts_with("Completed on ")) {
                    s.comment = Some(now);
                }
            }
            if s.pr.is_none() && pulls.iter().any(|pr| pr.title.starts_with(&format!("#{} ", s.number))) {
                s.pr = Some(now);
            }
        }
    }

    /// Each sample's claim (from its job row) and its agent's start and exit (its record).
    async fn fill(&self, samples: &mut [Sample]) {
        let jobs = self.jobs().await;
        let records = self.agent.records();
        for s in samples.iter_mut() {
            let key = format!("github:{REPO}#{}", s.number);
            let Some(&(id, _, created, claimed)) = jobs.iter().find(|j| j.1 == key) else { continue };
            s.created = Some(created as f64 / 1000.0);
            s.claimed = claimed.map(|ms| ms as f64 / 1000.0);
            let at = |kind: &str| -> Vec<f64> {
                records.iter().filter(|r| r.job == id && r.kind == kind).map(|r| r.at_ns as f64 / 1e9).collect()
            };
            s.started = at("start").into_iter().reduce(f64::min);
            s.exited = at("end").into_iter().reduce(f64::max);
        }
    }

    /// (id, unique key, created and first claimed in epoch ms) of every job: the claim from
    /// its history row (the row's own `claimed_at` is cleared when the job ends).
    async fn jobs(&self) -> Vec<(i64, String, i64, Option<i64>)> {
        let db = &self.db;
        let rows = db
            .query_all_raw(Statement::from_string(
                db.get_database_backend(),
                "SELECT q.id, q.unique_key, q.created_at, (SELECT MIN(e.at) FROM job_events e WHERE e.job_id = q.id \
                 AND e.kind = 'claimed') AS claimed_at FROM dispatch_queue q WHERE q.unique_key IS NOT NULL",
            ))
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                let get = |c: &str| r.try_get::<i64>("", c).unwrap();
                (
                    get("id"),
                    r.try_get("", "unique_key").unwrap(),
                    get("created_at"),
                    r.try_get("", "claimed_at").unwrap(),
                )
            })
            .collect()
    }
}

#[path = "user_latency_kill.rs"]
mod kill;
