//! One PostgreSQL, thousands of machines: every machine is a real orchestrator loop with
//! its own connection pool and presence row, many to a `devpilot-bench worker` process.
//!
//! - [`idle`]: 2,000 idle machines in pooled mode through PgBouncer (transaction mode),
//!   backing off to their ceiling. Their intervals are scaled down (the same factor for
//!   poll, ceiling, presence and sweep), so the ceiling is reached within a minute; the
//!   statement rate at the real ceiling is the measured one divided by the factor.
//! - [`listening`]: 300 machines on 30 orchestrators, each LISTENing directly, and what one
//!   NOTIFY costs when every listener hears every orchestrator's hints (the shared channel)
//!   against one channel per orchestrator.

use std::time::{Duration, Instant};

use devpilot_store::listen;
use devpilot_tests::pooler::PgBouncer;
use rand::Rng;
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde_json::{json, Value};

use crate::cluster;
use crate::common::{connect, exec, log, median, pct, scalar, Backend, Env, ORCH};
use crate::worker::Proc;

/// How big and how long: `quick` only checks the machinery.
pub struct FleetPlan {
    pub machines: u32,
    pub orchs: u32,
    pub procs: u32,
    /// Every interval divided by this.
    pub scale: u32,
    pub warmup: Duration,
    pub window: Duration,
    pub pickups: usize,
    pub listeners: u32,
    pub listen_orchs: u32,
    pub hints: usize,
}

pub const FULL: FleetPlan = FleetPlan {
    machines: 2000,
    orchs: 1000,
    procs: 4,
    scale: 10,
    warmup: Duration::from_secs(75),
    window: Duration::from_secs(60),
    pickups: 30,
    listeners: 300,
    listen_orchs: 30,
    hints: 1000,
};

pub const QUICK: FleetPlan = FleetPlan {
    machines: 200,
    orchs: 100,
    procs: 2,
    scale: 100,
    warmup: Duration::from_secs(8),
    window: Duration::from_secs(6),
    pickups: 5,
    listeners: 30,
    listen_orchs: 3,
    hints: 100,
};

/// CPU ms of every process named `comm`.
fn cpu_of(comm: &str) -> f64 {
    cluster::processes().filter(|(c, _)| c == comm).map(|(_, ms)| ms).sum()
}

fn pids_cpu(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|p| cluster::proc_cpu(*p)).map(|(_, ms)| ms).sum()
}

/// Starts `plan.procs` worker processes of `per` machines each, spread over `orchs`
/// orchestrators, with `extra` arguments; returns once every loop has started.
async fn start_fleet(env: &Env, url: &str, machines: u32, orchs: u32, procs: u32, extra: &[String]) -> Vec<Proc> {
    let per = machines / procs;
    let mut fleet = vec![];
    for p in 0..procs {
        let dir = env.tmp.join(format!("fleet{}-p{p}", env.next()));
        let mut args: Vec<String> = [
            "--orch",
            ORCH,
            "--orchs",
            &orchs.to_string(),
            "--first",
            &(p * per).to_string(),
            "--name",
            &format!("f{p}"),
            "--machines",
            &per.to_string(),
            "--concurrency",
            "1",
            "--data-dir",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend_from_slice(extra);
        fleet.push(Proc::spawn(url, &args).await);
    }
    for w in fleet.iter_mut() {
        w.go().await;
    }
    for w in fleet.iter_mut() {
        w.started().await;
    }
    fleet
}

/// Pickup latency by the database's clock (enqueue's `created_at` to the claim's
/// `claimed_at`, both ms), one job per orchestrator picked at random. `together`: all jobs
/// at once and then wait (a fleet at its ceiling takes seconds per pickup); else one at a
/// time, each waiting for its claim.
async fn pickups(db: &DatabaseConnection, orchs: u32, n: usize, together: bool, limit: Duration) -> Vec<f64> {
    let mut out = vec![];
    let mut ids = vec![];
    for _ in 0..n {
        let k = rand::rng().random_range(0..orchs);
        ids.push(
            scalar(
                db,
                &format!(
                    "INSERT INTO dispatch_queue (orchestrator_id, payload, title)
                     VALUES ('{ORCH}-{k}', '{{\"title\":\"pickup\"}}', 'pickup') RETURNING id AS n"
                ),
            )
            .await,
        );
        if !together {
            out.extend(claimed_after(db, &ids, limit).await);
            ids.clear();
            tokio::time::sleep(Duration::from_millis(rand::rng().random_range(20..60))).await;
        }
    }
    out.extend(claimed_after(db, &ids, limit).await);
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out
}

/// Waits (up to `limit`) until every job of `ids` has been claimed; their pickup times in
/// ms, from each job's `created_at` to its first `claimed` history entry (the row's own
/// `claimed_at` is cleared again when a no-op job completes a moment later).
async fn claimed_after(db: &DatabaseConnection, ids: &[i64], limit: Duration) -> Vec<f64> {
    if ids.is_empty() {
        return vec![];
    }
    let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let firsts = format!(
        "SELECT MIN(e.at) - MIN(q.created_at) AS ms FROM dispatch_queue q JOIN job_events e ON e.job_id = q.id
          WHERE q.id IN ({list}) AND e.kind = 'claimed' GROUP BY q.id"
    );
    let start = Instant::now();
    loop {
        let rows = db
            .query_all_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, firsts.clone()))
            .await
            .unwrap();
        if rows.len() == ids.len() || start.elapsed() > limit {
            return rows.iter().filter_map(|r| r.try_get::<i64>("", "ms").ok()).map(|ms| ms as f64).collect();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// ESTABLISHED TCP connections whose local port is `port` (clients of a local server).
fn tcp_clients(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[3] == "01"
                && f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
        })
        .count()
}

/// The idle fleet's flags: every interval (poll, ceiling, presence, sweep) divided by `s`.
fn scaled_intervals(s: u64) -> Vec<String> {
    let ms = |real_ms: u64| (real_ms / s).to_string();
    [
        "--poll-ms",
        &ms(2_000),
        "--max-poll-ms",
        &ms(300_000),
        "--presence-ms",
        &ms(30_000),
        "--sweep-ms",
        &ms(60_000),
        "--stagger-us",
        "2000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// PostgreSQL's CPU over the next `window`, as a share of one core.
async fn postgres_core_fraction(window: Duration) -> f64 {
    let (pg0, t0) = (cluster::postgres_cpu_ms(), Instant::now());
    tokio::time::sleep(window).await;
    (cluster::postgres_cpu_ms() - pg0) / 1000.0 / t0.elapsed().as_secs_f64()
}

/// What the idle fleet cost over one window at its ceiling: CPU in ms, statements, and the
/// connections sampled once a second.
struct IdleWindow {
    secs: f64,
    calls: i64,
    pg: f64,
    bouncer_cpu: f64,
    fleet_cpu: f64,
    servers: Vec<f64>,
    clients: Vec<f64>,
}

/// Measures the fleet of `pids` on database `dbname` (behind PgBouncer on `bouncer_port`)
/// over `window`.
async fn idle_window(env: &Env, dbname: &str, bouncer_port: u16, pids: &[u32], window: Duration) -> IdleWindow {
    let calls_sql = format!(
        "SELECT coalesce(sum(calls), 0)::bigint AS n FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{dbname}'"
    );
    let servers_sql = format!("SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE datname = '{dbname}'");
    let calls0 = scalar(&env.admin, &calls_sql).await;
    let (pg0, bouncer0, fleet0) = (cluster::postgres_cpu_ms(), cpu_of("pgbouncer"), pids_cpu(pids));
    let t0 = Instant::now();
    let mut servers = vec![];
    let mut clients = vec![];
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        servers.push(scalar(&env.admin, &servers_sql).await as f64);
        clients.push(tcp_clients(bouncer_port) as f64);
    }
    let secs = t0.elapsed().as_secs_f64();
    let (pg, bouncer_cpu, fleet_cpu) =
        (cluster::postgres_cpu_ms() - pg0, cpu_of("pgbouncer") - bouncer0, pids_cpu(pids) - fleet0);
    // Our own sampling (one count per second) runs on the admin connection, in another
    // database: pg_stat_statements counts it there, not here.
    let calls = scalar(&env.admin, &calls_sql).await - calls0;
    IdleWindow { secs, calls, pg, bouncer_cpu, fleet_cpu, servers, clients }
}

/// 2,000 idle machines, pooled, through PgBouncer in transaction mode.
pub async fn idle(env: &Env, plan: &FleetPlan) -> Value {
    let bouncer = PgBouncer::start(&env.pg, "transaction");
    let direct = env.fresh(Backend::Pg).await;
    let dbname = Env::dbname(&direct);
    let url = bouncer.url(&dbname);
    let s = plan.scale as u64;
    let extra = scaled_intervals(s);
    // PostgreSQL's own background work (checkpointer, WAL writer, autovacuum) does not scale
    // with the fleet's poll rate: measure it alone first.
    let idle_pg = postgres_core_fraction(plan.window / 2).await;
    log(format!("  starting {} pooled machines through PgBouncer (intervals / {})", plan.machines, plan.scale));
    let t_start = Instant::now();
    let fleet = start_fleet(env, &url, plan.machines, plan.orchs, plan.procs, &extra).await;
    let pids: Vec<u32> = fleet.iter().map(|w| w.pid()).collect();
    let started_secs = t_start.elapsed().as_secs_f64();
    tokio::time::sleep(plan.warmup).await;
    let IdleWindow { secs, calls, pg, bouncer_cpu, fleet_cpu, servers, clients } =
        idle_window(env, &dbname, bouncer.port, &pids, plan.window).await;
    let db = connect(&direct, 1).await;
    let machines_rows = scalar(&db, "SELECT count(*) AS n FROM machines").await;
    let lat = pickups(&db, plan.orchs, plan.pickups, true, Duration::from_secs(700 / s)).await;
    db.close().await.ok();
    let mut stats = vec![];
    for w in fleet {
        stats.push(w.stop().await);
    }
    let polls: u64 = stats.iter().filter_map(|s| s["polls"].as_u64()).sum();
    let stmts_per_s = calls as f64 / secs;
    let pg_core = pg / 1000.0 / secs;
    let v = json!({
        "machines": plan.machines, "orchestrators": plan.orchs, "processes": plan.procs, "scale": plan.scale,
        "ceiling_ms_measured": 300_000 / s, "ceiling_ms_real": 300_000, "startup_secs": started_secs,
        "window_secs": secs, "statements": calls, "statements_per_s": stmts_per_s,
        "statements_per_s_real": stmts_per_s / s as f64,
        "postgres_core_fraction": pg_core, "postgres_core_fraction_real_upper": pg_core,
        "postgres_core_fraction_without_fleet": idle_pg,
        // The fleet's share scales with its statement rate; the background does not.
        "postgres_cpu_s_per_hour_real": (idle_pg + (pg_core - idle_pg).max(0.0) / s as f64) * 3600.0,
        "postgres_cpu_ms_per_statement": pg / calls.max(1) as f64,
        "pgbouncer_core_fraction": bouncer_cpu / 1000.0 / secs, "fleet_core_fraction": fleet_cpu / 1000.0 / secs,
        "server_connections_median": median(servers.clone()),
        "server_connections_max": servers.iter().copied().fold(0.0, f64::max),
        "client_connections_median": median(clients),
        "presence_rows": machines_rows, "polls_total": polls,
        "pickup_ms": { "samples": lat.len(), "p50": pct(&lat, 50.0), "p95": pct(&lat, 95.0), "max": lat.last().copied().unwrap_or(f64::NAN) },
        "pickup_p50_ms_real": pct(&lat, 50.0) * s as f64,
    });
    log(format!("  idle fleet: {v}"));
    v
}

/// Sends `n` hints for orchestrators that have listeners, as the trigger does, at a steady
/// pace, and returns (PostgreSQL ms, fleet ms) of CPU spent in the burst beyond an idle
/// stretch of the same length measured just before.
async fn hint_cost(
    env: &Env,
    db: &DatabaseConnection,
    pids: &[u32],
    orchs: u32,
    n: usize,
    per_orch: bool,
) -> (f64, f64) {
    let pace = Duration::from_millis(4);
    let idle = pace * n as u32;
    let (pg0, f0) = (cluster::postgres_cpu_ms(), pids_cpu(pids));
    tokio::time::sleep(idle).await;
    let (pg_idle, f_idle) = (cluster::postgres_cpu_ms() - pg0, pids_cpu(pids) - f0);
    let (pg1, f1) = (cluster::postgres_cpu_ms(), pids_cpu(pids));
    let mut next = tokio::time::Instant::now();
    for i in 0..n {
        let orch = format!("{ORCH}-{}", i as u32 % orchs);
        let channel = if per_orch { listen::channel_of(&orch) } else { listen::CHANNEL.to_string() };
        // A hint for a job that is already gone: each machine that hears it polls once
        // and finds nothing, as after a lost race.
        exec(db, &format!("SELECT pg_notify('{channel}', '{orch}')")).await;
        next += pace;
        tokio::time::sleep_until(next).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = env;
    let (pg, f) = (cluster::postgres_cpu_ms() - pg1 - pg_idle, pids_cpu(pids) - f1 - f_idle);
    (pg.max(0.0), f.max(0.0))
}

/// 300 machines on 30 orchestrators, LISTENing directly: pickup with NOTIFY, and the cost of
/// one hint on the shared channel against one channel per orchestrator.
pub async fn listening(env: &Env, plan: &FleetPlan) -> Value {
    let url = env.fresh(Backend::Pg).await;
    log(format!("  starting {} listening machines on {} orchestrators", plan.listeners, plan.listen_orchs));
    let fleet = start_fleet(env, &url, plan.listeners, plan.listen_orchs, 3, &["--listen".to_string()]).await;
    let pids: Vec<u32> = fleet.iter().map(|w| w.pid()).collect();
    // Let every listener hear its probe and the loops settle into their backoff.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let db = connect(&url, 1).await;
    let listeners =
        scalar(&env.admin, "SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE query LIKE 'LISTEN%'").await;
    let lat = pickups(&db, plan.listen_orchs, plan.pickups * 4, false, Duration::from_secs(10)).await;
    let mut cost = json!({});
    for per_orch in [false, true] {
        let (pg, fl) = hint_cost(env, &db, &pids, plan.listen_orchs, plan.hints, per_orch).await;
        let key = if per_orch { "per_orchestrator" } else { "shared" };
        cost[key] = json!({
            "hints": plan.hints,
            "postgres_ms_per_hint": pg / plan.hints as f64,
            "fleet_ms_per_hint": fl / plan.hints as f64,
        });
    }
    db.close().await.ok();
    let mut stats = vec![];
    for w in fleet {
        stats.push(w.stop().await);
    }
    let v = json!({
        "machines": plan.listeners, "orchestrators": plan.listen_orchs, "listen_connections": listeners,
        "pickup_ms": { "samples": lat.len(), "p50": pct(&lat, 50.0), "p95": pct(&lat, 95.0), "p99": pct(&lat, 99.0), "max": lat.last().copied().unwrap_or(f64::NAN) },
        "hint_cost": cost,
    });
    log(format!("  listening fleet: {v}"));
    v
}
