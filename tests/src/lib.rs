//! Test harness for DevPilot's cross-crate tests: a throwaway PostgreSQL that the tests start
//! themselves, real SQLite files, the `devpilot` binary, and recording agents.
//!
//! # Layout
//! - [`PgCluster`]: `initdb` + `pg_ctl` in a temp dir on a free port, password auth over TCP,
//!   stopped by a watchdog when the test process exits. One cluster per test binary; every
//!   test gets its own database, cloned from a migrated template.
//! - [`TestDb`]: an isolated, migrated database on either backend.
//! - [`devpilot_bin`], [`Runner`]: real `devpilot` OS processes with isolated XDG dirs.
//! - [`RecordingAgent`]: an agent script that appends every execution to a file.
//! - [`LinearStandIn`]: Linear's GraphQL API on loopback, enforcing its published schema.
//! - [`GitHubStandIn`]: GitHub's REST API on loopback, enforcing its OpenAPI description
//!   (`contracts/github`); both serve HTTP with `http_server`.
//! - [`SecretService`]: a private D-Bus session with an unlocked gnome-keyring, so keychain
//!   tests never touch the keychain of the user running them.
//! - [`review`]: what the review loop's end-to-end tests share (a github.com clone, waiting on
//!   the loop's rows); [`sources`]: what every tracker-source test shares.
//! - [`shaper`]: a slow link (a rate and a delay, shared by every connection through it) in
//!   front of a loopback server, for the benchmark's hand-off over café Wi-Fi.
//! - `pg` ([`PgCluster`], [`shared_pg`]), `net` ([`free_port`]) and `watchdog` (stopping what
//!   the tests started once the test process is gone) hold what [`pooler`] and [`tls`] share.

// The test harness: a failed setup step must stop the test that asked for it, so it panics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::Queue;
use sea_orm::ConnectionTrait;

pub mod clis;
pub mod forwarder;
pub mod gate;
pub mod github;
mod http_server;
pub mod keychain;
pub mod linear;
pub mod model_server;
mod net;
mod pg;
pub mod pooler;
pub mod review;
pub mod shaper;
pub mod sources;
pub mod tls;
mod watchdog;
pub use forwarder::Forwarder;
pub use github::GitHubStandIn;
pub use keychain::SecretService;
pub use linear::LinearStandIn;
pub use model_server::{ModelServer, Turn};
pub use net::free_port;
use pg::DB_SEQ;
pub use pg::{fresh_pg_database, is_root, pg_bin_dir, shared_pg, PgCluster, TEST_SETTINGS};
pub use pooler::{shared_pgbouncer, PgBouncer};

/// Instantiates each named `async fn name(backend: Backend)` as two tests, one per backend,
/// in modules `postgres` and `sqlite`. `workers = N;` first sets the runtime's threads (2).
#[macro_export]
macro_rules! on_both_backends {
    (workers = $n:literal; $($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $n)]
                async fn $name() { super::$name($crate::Backend::Postgres).await }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $n)]
                async fn $name() { super::$name($crate::Backend::Sqlite).await }
            )*
        }
    };
    ($($name:ident),* $(,)?) => { $crate::on_both_backends!(workers = 2; $($name),*); };
}

/// [`on_both_backends`], plus a third module `pooled`: PostgreSQL through a real PgBouncer in
/// transaction mode, with the queue in pooled mode (every statement unprepared).
#[macro_export]
macro_rules! on_every_backend {
    (workers = $n:literal; $($name:ident),* $(,)?) => {
        $crate::on_both_backends!(workers = $n; $($name),*);
        mod pooled {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $n)]
                async fn $name() { super::$name($crate::Backend::Pooled).await }
            )*
        }
    };
    ($($name:ident),* $(,)?) => { $crate::on_every_backend!(workers = 2; $($name),*); };
}

/// Which database a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
    /// PostgreSQL through PgBouncer in transaction mode ([`shared_pgbouncer`]).
    Pooled,
}

impl Backend {
    /// PostgreSQL, directly or through the pooler.
    pub fn is_postgres(self) -> bool {
        self != Backend::Sqlite
    }
}

/// An isolated, migrated database.
pub struct TestDb {
    pub backend: Backend,
    pub url: DbUrl,
    pub raw_url: String,
    pub queue: Queue,
    pub dir: tempfile::TempDir,
    /// A direct connection for the test's own statements (the queue's, except through a
    /// pooler, where the test's prepared reads would meet the pooler's problem).
    admin: sea_orm::DatabaseConnection,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        let dir = tempfile::Builder::new().prefix("devpilot-test-").tempdir().expect("tempdir");
        let (raw_url, direct) = match backend {
            Backend::Postgres => {
                let pg = shared_pg();
                let name = fresh_pg_database(pg).await;
                (pg.url(&name), None)
            }
            Backend::Pooled => {
                let pg = shared_pg();
                let name = fresh_pg_database(pg).await;
                (shared_pgbouncer().url(&name), Some(pg.url(&name)))
            }
            Backend::Sqlite => (format!("sqlite://{}", dir.path().join("queue.sqlite").display()), None),
        };
        let url = DbUrl::parse(&raw_url).expect("url");
        let conn =
            db::connect(&url, &PoolSettings { max_connections: 4, ..Default::default() }).await.expect("connect");
        db::migrate(&url, &conn).await.expect("migrate");
        let admin = match direct {
            Some(d) => {
                let d = DbUrl::parse(&d).expect("url");
                db::connect(&d, &PoolSettings::default()).await.expect("connect directly")
            }
            None => conn.clone(),
        };
        let queue = Queue::new(conn).pooled(url.pooled());
        TestDb { backend, url, raw_url, queue, dir, admin }
    }

    /// A second, independent pool on the same database (another "machine").
    pub async fn another_queue(&self) -> Queue {
        let conn = db::connect(&self.url, &PoolSettings::default()).await.expect("connect");
        Queue::new(conn).pooled(self.url.pooled())
    }

    /// Moves job `id`'s claim and heartbeat `by` into the past, as if its holder had gone
    /// silent that long ago. Tests age rows instead of sleeping, so no timing can flake.
    pub async fn age_job(&self, id: i64, by: Duration) {
        let ms = by.as_millis() as i64;
        let sql = format!(
            "UPDATE dispatch_queue SET claimed_at = claimed_at - {ms}, heartbeat_at = heartbeat_at - {ms} WHERE id = {id}"
        );
        self.admin.execute_unprepared(&sql).await.expect("age the job");
    }

    /// Moves a waiting job's `run_at` `by` into the past, as if that much time had passed.
    pub async fn age_wait(&self, id: i64, by: Duration) {
        self.exec(&format!("UPDATE dispatch_queue SET run_at = run_at - {} WHERE id = {id}", by.as_millis())).await;
    }

    /// Moves a finished job's `finished_at`, and every history entry of it, `by` into the past.
    pub async fn age_finished(&self, id: i64, by: Duration) {
        let ms = by.as_millis();
        self.exec(&format!("UPDATE dispatch_queue SET finished_at = finished_at - {ms} WHERE id = {id}")).await;
        self.exec(&format!("UPDATE job_events SET at = at - {ms} WHERE job_id = {id}")).await;
    }

    /// Moves a machine's `last_seen_at` `by` into the past.
    pub async fn age_machine(&self, orch: &str, machine: &str, by: Duration) {
        let sql = format!(
            "UPDATE machines SET last_seen_at = last_seen_at - {} WHERE orchestrator_id = '{orch}' AND machine = '{machine}'",
            by.as_millis()
        );
        self.exec(&sql).await;
    }

    /// A direct connection to the test's database, for statements of the test's own.
    pub fn admin(&self) -> &sea_orm::DatabaseConnection {
        &self.admin
    }

    /// Runs a statement of the test's own (aging rows, reading columns no API returns).
    pub async fn exec(&self, sql: &str) {
        self.admin.execute_unprepared(sql).await.expect("test statement");
    }

    /// One integer (or NULL) that `sql` selects.
    pub async fn scalar(&self, sql: &str) -> Option<i64> {
        let stmt = sea_orm::Statement::from_string(self.queue.backend(), sql);
        let row = self.admin.query_one_raw(stmt).await.expect("test query")?;
        row.try_get_by_index::<Option<i64>>(0).expect("an integer")
    }

    /// One text (or NULL) that `sql` selects.
    pub async fn text(&self, sql: &str) -> Option<String> {
        let stmt = sea_orm::Statement::from_string(self.queue.backend(), sql);
        let row = self.admin.query_one_raw(stmt).await.expect("test query")?;
        row.try_get_by_index::<Option<String>>(0).expect("a text")
    }

    /// A unique orchestrator id.
    pub fn orch(&self, name: &str) -> String {
        format!("{name}-{}", DB_SEQ.fetch_add(1, Ordering::SeqCst))
    }
}

/// The `devpilot` binary built from this workspace.
pub fn devpilot_bin() -> PathBuf {
    if let Ok(p) = std::env::var("DEVPILOT_BIN") {
        return PathBuf::from(p);
    }
    // A test binary is in `<profile>/deps/`; a binary of the workspace (the benchmark) is
    // beside `devpilot` in `<profile>/`.
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("the binary's dir");
    let dir = if dir.ends_with("deps") { dir.parent().expect("target dir") } else { dir };
    let bin = dir.join("devpilot");
    assert!(bin.exists(), "{} is missing: run `cargo build --workspace --bins` first", bin.display());
    bin
}

/// A `devpilot` command with isolated config/data dirs and the database URL set.
pub fn devpilot(home: &Path, db_url: &str) -> Command {
    let mut c = Command::new(devpilot_bin());
    c.env("DEVPILOT_DATABASE_URL", db_url)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("DEVPILOT_LOG", "warn,devpilot=debug")
        .env_remove("DEVPILOT_ORCHESTRATOR")
        .stdin(Stdio::null());
    c
}

/// Runs the `devpilot` CLI to its end: (exit code, stdout, stderr). A panic is a failure.
pub fn run_cli(home: &Path, url: &str, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut c = devpilot(home, url);
    c.args(args);
    run_to_end(c, stdin)
}

/// Runs a `devpilot` command to its end with `stdin`: (exit code, stdout, stderr). A panic
/// is a failure.
pub fn run_to_end(mut c: Command, stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().expect("spawn devpilot");
    if let Some(s) = stdin {
        child.stdin.take().expect("stdin").write_all(s.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("devpilot output");
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!e.contains("panicked") && !e.contains("RUST_BACKTRACE"), "no panic: {e}");
    (out.status.code().unwrap_or(-1), o, e)
}

/// An agent script that records every execution: a `start` line when it begins and an
/// `end` line when it finishes, or `term` if it was stopped. Lines are single appends, so
/// processes can share the file.
pub struct RecordingAgent {
    pub script: PathBuf,
    pub record: PathBuf,
}

impl RecordingAgent {
    /// `body` runs between the start and end records (e.g. `sleep "${AGENT_SLEEP:-0}"`).
    pub fn new(dir: &Path, body: &str) -> RecordingAgent {
        let script = dir.join(format!("agent-{}.sh", DB_SEQ.fetch_add(1, Ordering::SeqCst)));
        let record = dir.join("executions.log");
        let text = format!(
            "#!/bin/bash\n\
             rec={record}\n\
             now() {{ date +%s%N; }}\n\
             echo \"start $DEVPILOT_JOB_ID $DEVPILOT_CLAIM_TOKEN $DEVPILOT_MACHINE $(now) $$\" >> \"$rec\"\n\
             trap 'echo \"term $DEVPILOT_JOB_ID $DEVPILOT_CLAIM_TOKEN $DEVPILOT_MACHINE $(now) $$\" >> \"$rec\"; exit 143' TERM\n\
             payload=$(cat)\n\
             {body}\n\
             echo \"end $DEVPILOT_JOB_ID $DEVPILOT_CLAIM_TOKEN $DEVPILOT_MACHINE $(now) $$\" >> \"$rec\"\n",
            record = record.display()
        );
        std::fs::write(&script, text).expect("write agent");
        let _ = Command::new("chmod").arg("+x").arg(&script).status();
        RecordingAgent { script, record }
    }

    /// A machine's confinement where its agents may also write `dir` (where a test's agents
    /// record what they did): for a [`RunConfig`](devpilot_engine::orchestrator::RunConfig)
    /// built in the test process.
    pub fn confining(&self) -> std::sync::Arc<devpilot_engine::orchestrator::confine::Confining> {
        let dir = self.record.parent().expect("the record's directory").display().to_string();
        let s = devpilot_engine::sandbox::SandboxSettings { read_write: vec![dir], ..Default::default() };
        std::sync::Arc::new(devpilot_engine::orchestrator::confine::Confining::new(&s))
    }

    /// Parsed records.
    pub fn records(&self) -> Vec<Record> {
        let text = std::fs::read_to_string(&self.record).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 6).then(|| Record {
                    kind: f[0].to_string(),
                    job: f[1].parse().unwrap_or(-1),
                    token: f[2].parse().unwrap_or(-1),
                    machine: f[3].to_string(),
                    at_ns: f[4].parse().unwrap_or(0),
                    pid: f[5].parse().unwrap_or(0),
                })
            })
            .collect()
    }
}

/// One line of an agent's record.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub kind: String,
    pub job: i64,
    pub token: i64,
    pub machine: String,
    pub at_ns: u128,
    pub pid: u32,
}

/// Waits for `cond` up to `limit`, checking every 50 ms. Returns whether it became true.
pub async fn wait_for<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond().await
}

/// Sends `sig` to `pid` and all its descendants (a closing lid freezes the whole machine).
pub fn signal_tree(pid: u32, sig: libc::c_int) {
    for p in descendants(pid).into_iter().chain(std::iter::once(pid)) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(p as libc::pid_t, sig) };
    }
}

/// Every descendant of `pid`, from /proc.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = vec![];
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .map(|rd| rd.filter_map(|e| e.ok()).collect::<Vec<_>>())
            .unwrap_or_default();
        for t in tasks {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out
}

/// `devpilot run` flags that make a machine quick to react in a test: it polls every 50 ms
/// (backing off to 200 ms), sweeps every 200 ms, renews every 300 ms and gives an agent 2 s
/// between SIGTERM and SIGKILL.
pub fn fast_flags() -> Vec<&'static str> {
    vec![
        "--poll-interval",
        "50ms",
        "--max-poll-interval",
        "200ms",
        "--sweep-interval",
        "200ms",
        "--cancel-grace",
        "2s",
        "--heartbeat",
        "300ms",
    ]
}

/// `devpilot enqueue --orchestrator ORCH ARGS…` run to its end in `home`: the job's id.
pub fn enqueue(home: &Path, db: &TestDb, orch: &str, args: &[&str]) -> i64 {
    let mut all = vec!["enqueue", "--orchestrator", orch];
    all.extend_from_slice(args);
    let (code, out, err) = run_cli(home, &db.raw_url, &all, None);
    assert_eq!(code, 0, "{err}");
    out.trim().parse().expect("enqueue prints the job's id")
}

/// A running `devpilot run` process that is killed if the test forgets it.
pub struct Runner {
    pub child: Child,
    pub machine: String,
    pub log: PathBuf,
}

impl Runner {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for exit up to `limit`; returns the exit code, or None on timeout.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.code().unwrap_or(-1));
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failing test shows the end of what each machine said (only the end, so that
            // many runners do not bury the panic message that precedes this).
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            eprintln!("--- last lines of runner {} ({}) ---\n{tail}", self.machine, self.log.display());
        }
        signal_tree(self.child.id(), libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `devpilot run` for `orch` as `machine` with extra flags, running `agent`. `env` is
/// set for the runner, and passed on to its agents by name (`--pass-env`): an agent sees
/// only the allowlisted environment otherwise.
pub fn spawn_runner(
    home: &Path,
    db_url: &str,
    orch: &str,
    machine: &str,
    flags: &[&str],
    agent: &Path,
    env: &[(&str, &str)],
) -> Runner {
    let log_path = home.join(format!("runner-{machine}.log"));
    // Appended, not truncated: a runner restarted under the same name (after a kill) keeps
    // what its predecessor said, which is what a failure's diagnosis needs.
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).expect("runner log");
    let mut c = devpilot(home, db_url);
    c.args(["run", "--orchestrator", orch, "--machine", machine]).args(flags);
    if !env.is_empty() {
        c.arg("--pass-env").arg(env.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(","));
    }
    // The agents of the tests record what they did next to their script, outside their
    // sandbox: that directory is theirs to write.
    if let Some(dir) = agent.parent().filter(|_| !flags.contains(&"--sandbox")) {
        c.arg("--allow-write").arg(dir);
    }
    c.arg("--").arg(agent).stdout(Stdio::null()).stderr(Stdio::from(log));
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c.spawn().expect("spawn devpilot run");
    Runner { child, machine: machine.to_string(), log: log_path }
}

/// Runs git in `dir` with a fixed identity; panics with git's stderr if it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=Test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?} in {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare repository at `<dir>/remote.git` whose `main` holds a README and a .gitignore
/// (ignoring `.env` and `setup.txt`), and clones of it for each machine.
pub struct GitRemote {
    pub bare: PathBuf,
}

impl GitRemote {
    pub fn new(dir: &Path) -> GitRemote {
        let bare = dir.join("remote.git");
        std::fs::create_dir_all(&bare).expect("remote dir");
        git(&bare, &["init", "--quiet", "--bare", "--initial-branch=main"]);
        let seed = dir.join("seed");
        std::fs::create_dir_all(&seed).expect("seed dir");
        git(&seed, &["init", "--quiet", "--initial-branch=main"]);
        std::fs::write(seed.join("README.md"), "webapp\n").expect("readme");
        std::fs::write(seed.join(".gitignore"), ".env\nsetup.txt\n").expect("gitignore");
        git(&seed, &["add", "-A"]);
        git(&seed, &["commit", "--quiet", "-m", "seed"]);
        git(&seed, &["remote", "add", "origin", &bare.to_string_lossy()]);
        git(&seed, &["push", "--quiet", "origin", "main"]);
        GitRemote { bare }
    }

    /// A clone at `dest` (its `origin` is this remote).
    pub fn clone_to(&self, dest: &Path) -> PathBuf {
        let parent = dest.parent().expect("parent");
        std::fs::create_dir_all(parent).expect("clone parent");
        git(parent, &["clone", "--quiet", &self.bare.to_string_lossy(), &dest.to_string_lossy()]);
        dest.to_path_buf()
    }

    /// The content of `file` on `branch` of the remote, if it is there.
    pub fn show(&self, branch: &str, file: &str) -> Option<String> {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&self.bare)
            .args(["show", &format!("{branch}:{file}")])
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Writes the config file of the `devpilot` home `home` (see [`devpilot`]).
pub fn write_config(home: &Path, toml: &str) {
    let dir = home.join("config").join("devpilot");
    std::fs::create_dir_all(&dir).expect("config dir");
    std::fs::write(dir.join("config.toml"), toml).expect("config");
}

/// Where the `devpilot` home `home` keeps the worktree of job `id` of `orch`.
pub fn worktree_of(home: &Path, orch: &str, id: i64) -> PathBuf {
    home.join("data").join("devpilot").join("worktrees").join(orch).join(id.to_string())
}

/// The presence row of `machine` of `orch`: online, claiming, one slot, nothing running.
pub fn online_presence<'a>(orch: &'a str, machine: &'a str) -> devpilot_store::queue::Presence<'a> {
    devpilot_store::queue::Presence {
        orchestrator_id: orch,
        machine,
        status: devpilot_store::queue::MachineStatus::Online,
        dispatch_enabled: true,
        paused_until: None,
        running: 0,
        concurrency: 1,
        problem: None,
        route: None,
        order: None,
    }
}
