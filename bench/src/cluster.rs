//! The benchmark's throwaway PostgreSQL: the test harness's `PgCluster` (`initdb` + `pg_ctl`
//! in a temp dir on a free port), started with its own settings.
//!
//! Unlike the tests (which turn `fsync` off), this cluster keeps `fsync` and full page
//! writes on. It uses `synchronous_commit=off`, which keeps the database crash-consistent but
//! may lose the last few milliseconds of commits in a crash: the setting a queue like this
//! would typically run with on a laptop, and the same for every measurement, pgbench included.

/// The server settings every measurement runs with (reported verbatim).
pub const SETTINGS: &[(&str, &str)] = &[
    ("fsync", "on"),
    ("full_page_writes", "on"),
    ("synchronous_commit", "off"),
    ("shared_buffers", "256MB"),
    ("max_connections", "1000"),
    ("max_wal_size", "4GB"),
    ("checkpoint_timeout", "30min"),
    ("shared_preload_libraries", "pg_stat_statements"),
    ("pg_stat_statements.track", "top"),
    ("listen_addresses", "127.0.0.1"),
];

/// The test harness's throwaway cluster, started with [`SETTINGS`].
pub use devpilot_tests::PgCluster as Cluster;

pub fn start() -> Cluster {
    Cluster::start_with("devpilot-bench-pg-", SETTINGS)
}

/// CPU time (user + system, ms) of every process named `postgres`.
pub fn postgres_cpu_ms() -> f64 {
    processes().filter(|(comm, _)| comm == "postgres").map(|(_, ms)| ms).sum()
}

/// (comm, user+system CPU in ms) of every process on the machine.
pub fn processes() -> impl Iterator<Item = (String, f64)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter_map(proc_cpu)
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
