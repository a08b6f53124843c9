//! A real PgBouncer (Debian's package) in transaction mode in front of a [`PgCluster`],
//! configured the way its guides say for a driver that sends `extra_float_digits`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::net::free_port;
use crate::pg::{is_root, shared_pg, PgCluster};
use crate::watchdog::when_gone;

/// A PgBouncer process, stopped when this value is dropped (or the test process exits).
pub struct PgBouncer {
    pub port: u16,
    pub dir: PathBuf,
    password: String,
    child: Child,
}

/// Where Debian puts the binary.
fn pgbouncer_bin() -> PathBuf {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("pgbouncer not found: install the `pgbouncer` package (scripts/setup.sh does)")
}

impl PgBouncer {
    /// Starts PgBouncer in `pool_mode` (e.g. "transaction") in front of `pg`.
    pub fn start(pg: &PgCluster, pool_mode: &str) -> PgBouncer {
        let dir = tempfile::Builder::new().prefix("devpilot-pgbouncer-").tempdir().expect("tempdir").keep();
        let port = free_port();
        // Each test database gets a pool of its own: max_user_connections caps them all, below
        // the cluster's max_connections, and idle servers close within 30 s.
        // A plain-text password in the auth file lets PgBouncer do SCRAM with the client and
        // log in to the server with the same password.
        std::fs::write(dir.join("userlist.txt"), format!("\"postgres\" \"{}\"\n", pg.password)).expect("userlist");
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={pg_port}\n\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = scram-sha-256\nauth_file = {dir}/userlist.txt\n\
             pool_mode = {pool_mode}\n\
             ignore_startup_parameters = extra_float_digits\n\
             max_client_conn = 2500\ndefault_pool_size = 20\nmax_db_connections = 60\n\
             max_user_connections = 150\nserver_idle_timeout = 30\n\
             logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
            pg_port = pg.port,
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        // PgBouncer refuses to run as root. Its soft limit on open files (1,024 under
        // runuser's pam_limits) would cap it below max_client_conn: raise it to the hard one.
        let raise = ["sh", "-c", "ulimit -n \"$(ulimit -Hn)\" 2>/dev/null; exec \"$0\" \"$@\""];
        let mut cmd = if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().expect("chown");
            assert!(st.success());
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).args(raise).arg(pgbouncer_bin());
            c
        } else {
            let mut c = Command::new(raise[0]);
            c.args(&raise[1..]).arg(pgbouncer_bin());
            c
        };
        let child = cmd
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let b = PgBouncer { port, dir, password: pg.password.clone(), child };
        b.spawn_watchdog();
        b.wait_ready();
        b
    }

    fn wait_ready(&self) {
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "pgbouncer did not listen on {}: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// PgBouncer's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// A URL for database `db` through the pooler, without our `pooled` parameter.
    pub fn plain_url(&self, db: &str) -> String {
        format!("postgres://postgres:{}@127.0.0.1:{}/{}", self.password, self.port, db)
    }

    /// A URL for database `db` through the pooler, in pooled mode.
    pub fn url(&self, db: &str) -> String {
        format!("{}?pooled=true", self.plain_url(db))
    }

    /// Kills PgBouncer once the test process is gone (runuser does not pass our death on).
    fn spawn_watchdog(&self) {
        when_gone(&format!(
            "pid=$(cat {dir}/pgbouncer.pid 2>/dev/null); [ -n \"$pid\" ] && kill -INT $pid 2>/dev/null; \
             sleep 1; rm -rf {dir}",
            dir = self.dir.display()
        ));
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid, libc::SIGINT) };
            }
        }
        let _ = self.child.wait();
    }
}

static SHARED_BOUNCER: OnceLock<PgBouncer> = OnceLock::new();

/// The test binary's PgBouncer, in transaction mode in front of [`shared_pg`].
pub fn shared_pgbouncer() -> &'static PgBouncer {
    SHARED_BOUNCER.get_or_init(|| PgBouncer::start(shared_pg(), "transaction"))
}
