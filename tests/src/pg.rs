//! The tests' PostgreSQL: a throwaway cluster ([`PgCluster`]) and the test binary's shared
//! one ([`shared_pg`]), whose migrated template every test database is cloned from.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use devpilot_store::db::{self, DbUrl, PoolSettings};
use sea_orm::ConnectionTrait;

use crate::net::free_port;
use crate::watchdog::when_gone;

/// A PostgreSQL server in a temp dir.
pub struct PgCluster {
    pub dir: PathBuf,
    pub port: u16,
    pub password: String,
    /// Where initdb, pg_ctl and pgbench are.
    pub bin: PathBuf,
    settings: Vec<(String, String)>,
}

/// The tests' server settings. fsync=off survives a server crash (the OS keeps the pages);
/// synchronous_commit stays on, because an immediate restart must never lose a commit that
/// was acknowledged.
pub const TEST_SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", "127.0.0.1"),
    ("fsync", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "400"),
    ("shared_buffers", "128MB"),
    // A test that says how many statements a machine sends counts them here.
    ("shared_preload_libraries", "pg_stat_statements"),
];

/// Whether the tests run as root (as CI does): a test that needs an unprivileged user then
/// drops to `nobody`.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The directory holding initdb and pg_ctl.
pub fn pg_bin_dir() -> PathBuf {
    if let Ok(p) = std::env::var("DEVPILOT_PG_BIN") {
        return PathBuf::from(p);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).filter(|p| p.join("initdb").exists()).collect()
        })
        .unwrap_or_default();
    found.sort();
    found
        .pop()
        .expect("PostgreSQL server binaries not found under /usr/lib/postgresql: install the `postgresql` package")
}

fn as_pg_user(bin: &Path, prog: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(prog));
        c
    } else {
        Command::new(bin.join(prog))
    }
}

impl PgCluster {
    /// Starts a fresh cluster with the tests' settings. It is stopped and deleted when this
    /// process exits.
    pub fn start() -> PgCluster {
        Self::start_with("devpilot-pg-", TEST_SETTINGS)
    }

    /// Starts a fresh cluster in a temp dir named `prefix…`, with `settings` (`-c k=v`).
    pub fn start_with(prefix: &str, settings: &[(&str, &str)]) -> PgCluster {
        let bin = pg_bin_dir();
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().expect("tempdir").keep();
        let password: String = format!("pw{:016x}", rand::random::<u64>());
        let pwfile = dir.join("pwfile");
        std::fs::write(&pwfile, &password).expect("write pwfile");
        let data = dir.join("data");
        if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().expect("chown");
            assert!(st.success(), "chown of the cluster dir failed");
        }
        let out = as_pg_user(&bin, "initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let port = free_port();
        let settings = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let c = PgCluster { dir, port, password, bin, settings };
        c.pg_ctl_start();
        c.spawn_watchdog();
        c
    }

    fn pg_ctl(&self, action: &[&str]) {
        let mut opts = format!("-p {} -k {}", self.port, self.dir.display());
        for (k, v) in &self.settings {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        let out = as_pg_user(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-o", &opts, "-w", "-t", "60"])
            .args(action)
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl");
        assert!(out.status.success(), "pg_ctl {action:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn pg_ctl_start(&self) {
        self.pg_ctl(&["start"]);
    }

    /// `pg_ctl restart -m immediate`: the crash-like restart of the fault tests.
    pub fn restart_immediate(&self) {
        self.pg_ctl(&["-m", "immediate", "restart"]);
    }

    /// Stops the server (immediate mode).
    pub fn stop(&self) {
        let _ = as_pg_user(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Starts it again after [`stop`](Self::stop).
    pub fn start_again(&self) {
        self.pg_ctl_start();
    }

    /// Kills the postmaster and removes the cluster once the test process is gone.
    fn spawn_watchdog(&self) {
        when_gone(&format!(
            "pid=$(head -1 {dir}/data/postmaster.pid 2>/dev/null); \
             [ -n \"$pid\" ] && kill -QUIT $pid 2>/dev/null; sleep 1; rm -rf {dir}",
            dir = self.dir.display()
        ));
    }

    /// A URL for database `db` as the superuser, with its password.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres:{}@127.0.0.1:{}/{}", self.password, self.port, db)
    }

    /// The same URL with a wrong password.
    pub fn url_with_wrong_password(&self, db: &str) -> String {
        format!("postgres://postgres:wrong-{}@127.0.0.1:{}/{}", self.password, self.port, db)
    }
}

static SHARED_PG: OnceLock<PgCluster> = OnceLock::new();
static TEMPLATE: OnceLock<()> = OnceLock::new();
pub(crate) static DB_SEQ: AtomicU32 = AtomicU32::new(0);

/// The test binary's shared cluster, with a migrated template database.
pub fn shared_pg() -> &'static PgCluster {
    let pg = SHARED_PG.get_or_init(PgCluster::start);
    TEMPLATE.get_or_init(|| {
        // A throwaway runtime: the template is made once, before any test uses the cluster.
        // (On its own thread, since callers may already be inside a runtime.)
        let pg_url = pg.url("devpilot_template");
        let admin = pg.url("postgres");
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                let a = DbUrl::parse(&admin).expect("url");
                let conn = db::connect(&a, &PoolSettings::default()).await.expect("connect admin");
                conn.execute_unprepared("CREATE DATABASE devpilot_template").await.expect("create template");
                conn.close().await.expect("close");
                let url = DbUrl::parse(&pg_url).expect("url");
                let conn = db::connect(&url, &PoolSettings::default()).await.expect("connect template");
                db::migrate(&url, &conn).await.expect("migrate template");
                conn.close().await.expect("close");
            });
        })
        .join()
        .expect("template setup");
    });
    pg
}

async fn admin_exec(pg: &PgCluster, sql: &str) {
    let url = DbUrl::parse(&pg.url("postgres")).expect("url");
    let conn = db::connect(&url, &PoolSettings::default()).await.expect("connect admin");
    conn.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    conn.close().await.expect("close");
}

/// A fresh migrated database on `pg`, cloned from its template.
pub async fn fresh_pg_database(pg: &PgCluster) -> String {
    let name = format!("t{}_{}", std::process::id(), DB_SEQ.fetch_add(1, Ordering::SeqCst));
    admin_exec(pg, &format!("CREATE DATABASE {name} TEMPLATE devpilot_template")).await;
    name
}
