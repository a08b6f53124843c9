//! The benchmark's own throwaway PostgreSQL: `initdb` + `pg_ctl` in a temp dir on a free port.
//!
//! Unlike the test harness (which turns `fsync` off), this cluster keeps `fsync` and full page
//! writes on. It uses `synchronous_commit=off`, which keeps the database crash-consistent but
//! may lose the last few milliseconds of commits in a crash: the setting a queue like this
//! would typically run with on a laptop, and the same for every measurement, pgbench included.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The server settings every measurement runs with (reported verbatim).
pub const SETTINGS: &[(&str, &str)] = &[
    ("fsync", "on"),
    ("full_page_writes", "on"),
    ("synchronous_commit", "off"),
    ("shared_buffers", "256MB"),
    ("max_connections", "400"),
    ("max_wal_size", "4GB"),
    ("checkpoint_timeout", "30min"),
    ("shared_preload_libraries", "pg_stat_statements"),
    ("pg_stat_statements.track", "top"),
    ("listen_addresses", "127.0.0.1"),
];

pub struct Cluster {
    pub dir: PathBuf,
    pub port: u16,
    pub password: String,
    pub bin: PathBuf,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn pg_bin_dir() -> PathBuf {
    if let Ok(p) = std::env::var("DEVPILOT_PG_BIN") {
        return PathBuf::from(p);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().expect("PostgreSQL server binaries not found under /usr/lib/postgresql")
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

impl Cluster {
    pub fn start() -> Cluster {
        let bin = pg_bin_dir();
        let dir = tempfile::Builder::new().prefix("devpilot-bench-pg-").tempdir().expect("tempdir").keep();
        let password = format!("pw{:016x}", rand::random::<u64>());
        let pwfile = dir.join("pwfile");
        std::fs::write(&pwfile, &password).expect("pwfile");
        if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().expect("chown");
            assert!(st.success(), "chown failed");
        }
        let out = as_pg_user(&bin, "initdb")
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .expect("initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let mut opts = format!("-p {port} -k {}", dir.display());
        for (k, v) in SETTINGS {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        let out = as_pg_user(&bin, "pg_ctl")
            .arg("-D")
            .arg(dir.join("data"))
            .arg("-l")
            .arg(dir.join("server.log"))
            .args(["-o", &opts, "-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .output()
            .expect("pg_ctl");
        assert!(out.status.success(), "pg_ctl start failed: {}", String::from_utf8_lossy(&out.stderr));
        let c = Cluster { dir, port, password, bin };
        c.watchdog();
        c
    }

    /// Stops and removes the cluster if this process dies without calling [`Cluster::stop`].
    fn watchdog(&self) {
        use std::os::unix::process::CommandExt;
        let script = format!(
            "while kill -0 {ppid} 2>/dev/null; do sleep 0.5; done; \
             pid=$(head -1 {dir}/data/postmaster.pid 2>/dev/null); \
             [ -n \"$pid\" ] && kill -QUIT $pid 2>/dev/null; sleep 1; rm -rf {dir}",
            ppid = std::process::id(),
            dir = self.dir.display()
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres:{}@127.0.0.1:{}/{}", self.password, self.port, db)
    }

    /// Stops the server. The caller removes `dir` once the report is written (deleting a
    /// few GB of WAL can take a while on a busy disk).
    pub fn stop(&self) {
        let _ = as_pg_user(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            // Throwaway data: no shutdown checkpoint needed.
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// CPU time (user + system, ms) of every process named `postgres`.
pub fn postgres_cpu_ms() -> f64 {
    let mut total = 0.0;
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some((comm, ms)) = proc_cpu(pid) {
                if comm == "postgres" {
                    total += ms;
                }
            }
        }
    }
    total
}

/// (comm, user+system CPU in ms) of one process.
pub fn proc_cpu(pid: u32) -> Option<(String, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_string();
    let rest: Vec<&str> = s[close + 2..].split_whitespace().collect();
    // Fields after "(comm) ": state is index 0, utime is field 14 overall -> index 11.
    let utime: f64 = rest.get(11)?.parse().ok()?;
    let stime: f64 = rest.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((comm, (utime + stime) * 1000.0 / tck))
}
