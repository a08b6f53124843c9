//! Measurements a to h. Every figure is collected into one JSON value that the report renders.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::orchestrator::{self, Event, RunConfig, StopMode};
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::Queue;
use rand::Rng;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};
use serde_json::{json, Value};

use crate::cluster::{self, Cluster};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backend {
    Pg,
    Sqlite,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Pg => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// Run lengths. `quick` only checks the machinery.
#[derive(Clone, Copy)]
pub struct Plan {
    pub secs: u64,
    pub repeats: usize,
    pub pgbench_prefill: i64,
    pub drain_jobs_pg: i64,
    pub drain_jobs_sqlite: i64,
    pub agent_jobs: i64,
    pub latency_samples: usize,
    pub poll_samples: usize,
    pub idle_window: u64,
    /// The peers' idle window: real time, as their timers are not scaled.
    pub peer_idle_window: u64,
}

const QUICK: Plan = Plan {
    secs: 1,
    repeats: 1,
    pgbench_prefill: 30_000,
    drain_jobs_pg: 2_000,
    drain_jobs_sqlite: 1_000,
    agent_jobs: 300,
    latency_samples: 20,
    poll_samples: 5,
    idle_window: 8,
    peer_idle_window: 20,
};

const FULL: Plan = Plan {
    secs: 3,
    repeats: 3,
    pgbench_prefill: 120_000,
    drain_jobs_pg: 12_000,
    drain_jobs_sqlite: 6_000,
    agent_jobs: 4_000,
    latency_samples: 200,
    poll_samples: 30,
    idle_window: 30,
    peer_idle_window: 130,
};

pub struct Env {
    pub pg: Cluster,
    pub admin: DatabaseConnection,
    pub tmp: PathBuf,
    seq: AtomicU32,
}

pub static ORCH: &str = "bench";

pub async fn connect(url: &str, n: u32) -> DatabaseConnection {
    db::connect(
        &DbUrl::parse(url).unwrap(),
        &PoolSettings { max_connections: n, connect_timeout: Duration::from_secs(30), ..PoolSettings::default() },
    )
    .await
    .unwrap()
}

pub async fn scalar(db: &DatabaseConnection, sql: &str) -> i64 {
    let r = db.query_one_raw(Statement::from_string(db.get_database_backend(), sql)).await.unwrap().unwrap();
    r.try_get::<i64>("", "n").unwrap()
}

pub async fn exec(db: &DatabaseConnection, sql: &str) {
    db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn log(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

impl Env {
    /// A fresh, migrated database: a new PostgreSQL database cloned from the migrated
    /// template, or a new SQLite file. Returns its URL.
    pub async fn fresh(&self, backend: Backend) -> String {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        match backend {
            Backend::Pg => {
                exec(&self.admin, &format!("CREATE DATABASE r{n} TEMPLATE bench_tmpl")).await;
                self.pg.url(&format!("r{n}"))
            }
            Backend::Sqlite => {
                let url = format!("sqlite://{}", self.tmp.join(format!("r{n}.sqlite")).display());
                let u = DbUrl::parse(&url).unwrap();
                let c = db::connect(&u, &PoolSettings::default()).await.unwrap();
                db::migrate(&u, &c).await.unwrap();
                c.close().await.unwrap();
                url
            }
        }
    }

    /// A new, empty PostgreSQL database (for the peers, which install their own schema).
    pub async fn empty_db(&self, prefix: &str) -> String {
        let name = format!("{prefix}_{}", self.next());
        exec(&self.admin, &format!("CREATE DATABASE {name}")).await;
        self.pg.url(&name)
    }

    /// A number unique in this run, for names.
    pub fn next(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    pub fn dbname(url: &str) -> String {
        url.rsplit('/').next().unwrap().to_string()
    }
}

/// Pre-fills `n` claimable jobs in one statement.
async fn prefill(db: &DatabaseConnection, n: i64) {
    match db.get_database_backend() {
        sea_orm::DbBackend::Postgres => {
            exec(
                db,
                &format!(
                    "INSERT INTO dispatch_queue (orchestrator_id, payload, title)
                     SELECT '{ORCH}', jsonb_build_object('title', 'job ' || g), 'job ' || g
                       FROM generate_series(1, {n}) g"
                ),
            )
            .await;
            exec(db, "VACUUM ANALYZE dispatch_queue").await;
        }
        _ => {
            exec(
                db,
                &format!(
                    "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {n})
                     INSERT INTO dispatch_queue (orchestrator_id, payload, title)
                     SELECT '{ORCH}', json_object('title', 'job ' || g), 'job ' || g FROM s"
                ),
            )
            .await;
            exec(db, "ANALYZE").await;
        }
    }
}

/// Pre-fills `n` jobs in the database at `url`, over a connection of its own.
pub async fn prefill_url(url: &str, n: i64) {
    let c = connect(url, 1).await;
    prefill(&c, n).await;
    c.close().await.ok();
}

/// How many jobs of the database at `url` are completed.
pub async fn completed(url: &str) -> i64 {
    let c = connect(url, 1).await;
    let n = scalar(&c, "SELECT count(*) AS n FROM dispatch_queue WHERE state = 'completed'").await;
    c.close().await.ok();
    n
}

/// 1 while any job is queued or running, else 0; served by the pick and running indexes.
/// (Written for both backends: bigint so it decodes as i64 on PostgreSQL.)
const OPEN_JOBS: &str = "SELECT CASE WHEN EXISTS (SELECT 1 FROM dispatch_queue WHERE claimed_at IS NULL AND state IN ('queued','failed'))
    OR EXISTS (SELECT 1 FROM dispatch_queue WHERE state = 'running') THEN CAST(1 AS BIGINT) ELSE CAST(0 AS BIGINT) END AS n";
const CLAIMABLE: &str =
    "SELECT count(*) AS n FROM dispatch_queue WHERE claimed_at IS NULL AND state IN ('queued','failed')";

/// Runs everything; returns the figures and the directories to delete once they are saved.
pub async fn run_all(quick: bool) -> (Value, Vec<PathBuf>) {
    let plan = if quick { QUICK } else { FULL };
    let started = Instant::now();
    let pg = cluster::start();
    log(format!("PostgreSQL on port {} in {}", pg.port, pg.dir.display()));
    let admin = connect(&pg.url("postgres"), 1).await;
    exec(&admin, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await;
    exec(&admin, "CREATE DATABASE bench_tmpl").await;
    {
        let url = pg.url("bench_tmpl");
        let c = connect(&url, 1).await;
        db::migrate(&DbUrl::parse(&url).unwrap(), &c).await.unwrap();
        c.close().await.unwrap();
    }
    let version = {
        let r = admin
            .query_one_raw(Statement::from_string(sea_orm::DbBackend::Postgres, "SELECT version() AS v"))
            .await
            .unwrap()
            .unwrap();
        r.try_get::<String>("", "v").unwrap()
    };
    let tmp = tempfile::Builder::new().prefix("devpilot-bench-").tempdir().unwrap().keep();
    let env = Env { pg, admin, tmp, seq: AtomicU32::new(0) };

    let mut out = json!({
        "date": String::from_utf8_lossy(&std::process::Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC").output().unwrap().stdout).trim(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu_model(),
        "loadavg_at_start": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "postgres": version,
        "pg_settings": cluster::SETTINGS.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "plan": { "claim_secs": plan.secs, "repeats": plan.repeats, "quick": quick },
    });

    if std::env::var("DEVPILOT_BENCH_ONLY").as_deref() == Ok("fleet") {
        // For working on the fleet measurements alone (a partial report).
        let fleet_plan = if quick { &crate::fleet::QUICK } else { &crate::fleet::FULL };
        out["fleet_idle"] = crate::fleet::idle(&env, fleet_plan).await;
        out["fleet_listening"] = crate::fleet::listening(&env, fleet_plan).await;
        env.pg.stop();
        return (out, vec![env.pg.dir.clone(), env.tmp.clone()]);
    }
    log("(a) pgbench: the SKIP LOCKED claim statement alone");
    out["a"] = pgbench_all(&env, &plan, &pgbench_script(), &[]).await;
    log("(a') pgbench: the previous pick (FIFO by created_at, on its own index), for an A/B in this run");
    out["a_previous"] = pgbench_all(&env, &plan, &previous_pick_script(), PREVIOUS_PICK_INDEX).await;
    log("the pick's plan: EXPLAIN (ANALYZE, BUFFERS) after some claims");
    out["pick_plan"] = pick_plans(&env, &plan).await;
    log("(b) the article's naive path");
    out["b"] = claim_matrix(&env, Backend::Pg, Mode::Naive, &plan).await;
    log("(c) claim_next single and batched");
    out["c_single"] = claim_matrix(&env, Backend::Pg, Mode::Pick(1), &plan).await;
    out["c_batched"] = claim_matrix(&env, Backend::Pg, Mode::Pick(16), &plan).await;
    log("(d) full job cycle through the orchestrator loop");
    out["d"] = drain_matrix(&env, Backend::Pg, plan.drain_jobs_pg, &plan).await;
    log("(e) the same drain with /bin/true as the agent");
    let mut e = vec![];
    for procs in [1, 4] {
        for batched in [false, true] {
            e.push(drain(&env, Backend::Pg, 32, procs, batched, "/bin/true", plan.agent_jobs, false).await);
        }
    }
    out["e"] = json!(e);
    log("(e) as a user runs it: 4 `devpilot run` processes x concurrency 8, a /bin/sh agent per job");
    out["e_cli"] = crate::agent_path::measure(&env, &plan).await;
    log("(f) pickup latency");
    out["f"] = json!({
        "notify": latency(&env, Backend::Pg, true, plan.latency_samples).await,
        "poll_only": latency(&env, Backend::Pg, false, plan.poll_samples).await,
    });
    log("(g) idle cost");
    out["g"] = idle(&env, &plan).await;
    log("(p) the peers: Graphile Worker and pg-boss on the same cluster");
    out["peers"] = crate::peers::all(&env, &plan).await;
    let fleet_plan = if quick { &crate::fleet::QUICK } else { &crate::fleet::FULL };
    log("(i) one PostgreSQL, thousands of machines: an idle pooled fleet");
    out["fleet_idle"] = crate::fleet::idle(&env, fleet_plan).await;
    log("(j) a listening fleet: pickup and the cost of one NOTIFY");
    out["fleet_listening"] = crate::fleet::listening(&env, fleet_plan).await;
    log("(h) SQLite");
    out["h"] = json!({
        "c_single": claim_matrix(&env, Backend::Sqlite, Mode::Pick(1), &plan).await,
        "c_batched": claim_matrix(&env, Backend::Sqlite, Mode::Pick(16), &plan).await,
        "d": drain_matrix(&env, Backend::Sqlite, plan.drain_jobs_sqlite, &plan).await,
        "f": { "poll_only": latency(&env, Backend::Sqlite, false, plan.poll_samples).await },
    });
    out["total_secs"] = json!(started.elapsed().as_secs_f64());
    out["loadavg_at_end"] = json!(std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    env.admin.clone().close().await.ok();
    env.pg.stop();
    (out, vec![env.pg.dir.clone(), env.tmp.clone()])
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}

// ------------------------------------------------------------------ (a)

/// `Queue::claim_next`'s own statement with k = 1, in pgbench's variable syntax.
fn pgbench_script() -> String {
    let sql = devpilot_store::queue::claim_next_sql_postgres()
        .replace("$1", ":orch")
        .replace("$2", "'pgbench'")
        .replace("$3", "1");
    format!("{sql};\n")
}

/// The pick as it was before the job model (FIFO by `(created_at, id)`, no priority, no
/// `run_at`), so this run can say what the new order costs.
fn previous_pick_script() -> String {
    let sql = pgbench_script()
        .replace(" AND run_at <= ((extract(epoch from now()) * 1000)::bigint)", "")
        .replace("ORDER BY priority DESC, run_at, id", "ORDER BY created_at, id");
    assert!(sql.contains("ORDER BY created_at, id") && !sql.contains("run_at"), "the previous pick: {sql}");
    sql
}

/// The previous pick's own index, in place of the current one.
const PREVIOUS_PICK_INDEX: &[&str] = &[
    "CREATE INDEX dispatch_queue_pick_previous ON dispatch_queue (orchestrator_id, created_at, id)
         WHERE claimed_at IS NULL AND state IN ('queued','failed')",
    "DROP INDEX dispatch_queue_pick",
];

/// `EXPLAIN (ANALYZE, BUFFERS)` of the current and the previous pick (k = 16) on a prefilled
/// queue after 5,000 claims, each inside a transaction that is rolled back.
async fn pick_plans(env: &Env, plan: &Plan) -> Value {
    let mut out = json!({});
    for (name, sql, setup) in
        [("current", pgbench_script(), &[][..]), ("previous", previous_pick_script(), PREVIOUS_PICK_INDEX)]
    {
        let url = env.fresh(Backend::Pg).await;
        let c = connect(&url, 1).await;
        for s in setup {
            exec(&c, s).await;
        }
        prefill(&c, plan.pgbench_prefill).await;
        let claim = |k: u32| {
            sql.trim()
                .trim_end_matches(';')
                .replace(":orch", &format!("'{ORCH}'"))
                .replace("LIMIT 1", &format!("LIMIT {k}"))
        };
        exec(&c, &claim(5_000)).await;
        let txn = c.begin().await.unwrap();
        let rows = txn
            .query_all_raw(Statement::from_string(
                sea_orm::DbBackend::Postgres,
                format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {}", claim(16)),
            ))
            .await
            .unwrap();
        txn.rollback().await.unwrap();
        let lines: Vec<String> = rows.iter().map(|r| r.try_get::<String>("", "QUERY PLAN").unwrap()).collect();
        out[name] = json!({ "statement": claim(16), "plan": lines });
        c.close().await.ok();
    }
    out["index"] = json!(
        "CREATE INDEX dispatch_queue_pick ON dispatch_queue (orchestrator_id, priority DESC, run_at, id) \
         WHERE claimed_at IS NULL AND state IN ('queued','failed')"
    );
    out
}

/// Runs `sql` under pgbench at 1, 8 and 32 clients on fresh prefilled databases, after the
/// `setup` statements.
async fn pgbench_all(env: &Env, plan: &Plan, sql: &str, setup: &[&str]) -> Value {
    let script = env.tmp.join(format!("claim-{}.sql", env.seq.fetch_add(1, Ordering::SeqCst)));
    std::fs::write(&script, sql).unwrap();
    let mut rows = vec![];
    for clients in [1usize, 8, 32] {
        let mut rates = vec![];
        let mut tps = vec![];
        let mut exhausted = false;
        for _ in 0..plan.repeats {
            let url = env.fresh(Backend::Pg).await;
            let c = connect(&url, 1).await;
            for s in setup {
                exec(&c, s).await;
            }
            prefill(&c, plan.pgbench_prefill).await;
            let out = tokio::process::Command::new(env.pg.bin.join("pgbench"))
                .env("PGPASSWORD", &env.pg.password)
                .args(["-h", "127.0.0.1", "-p", &env.pg.port.to_string(), "-U", "postgres", "-n", "-M", "prepared"])
                .args(["-c", &clients.to_string(), "-j", &clients.min(2).to_string(), "-T", &plan.secs.to_string()])
                .args(["-D", &format!("orch={ORCH}"), "-f"])
                .arg(&script)
                .arg(Env::dbname(&url))
                .output()
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(out.status.success(), "pgbench failed: {text}{}", String::from_utf8_lossy(&out.stderr));
            let claimed = scalar(&c, "SELECT count(*) AS n FROM dispatch_queue WHERE state = 'running'").await;
            let left = scalar(&c, CLAIMABLE).await;
            exhausted |= left == 0;
            let t: f64 = text
                .lines()
                .find(|l| l.starts_with("tps = "))
                .and_then(|l| l.split_whitespace().nth(2))
                .and_then(|s| s.parse().ok())
                .unwrap_or(f64::NAN);
            rates.push(claimed as f64 / plan.secs as f64);
            tps.push(t);
            c.close().await.ok();
        }
        log(format!("  a: {clients} clients: {:.0} claims/s {rates:?}", median(rates.clone())));
        rows.push(json!({ "claimers": clients, "claims_per_s": median(rates.clone()), "runs": rates, "pgbench_tps": median(tps), "exhausted": exhausted }));
    }
    json!(rows)
}

// ------------------------------------------------------------------ (b), (c)

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// candidates(orch, 1) then claim_by_id: the article's path.
    Naive,
    /// claim_next with k.
    Pick(u32),
}

async fn claim_matrix(env: &Env, backend: Backend, mode: Mode, plan: &Plan) -> Value {
    let mut rows = vec![];
    for claimers in [1usize, 8, 32] {
        let mut runs = vec![];
        for _ in 0..plan.repeats {
            runs.push(claim_run(env, backend, mode, claimers, plan).await);
        }
        let rate = median(runs.iter().map(|r| r["claims_per_s"].as_f64().unwrap()).collect());
        let wasted = median(runs.iter().map(|r| r["wasted_per_claim"].as_f64().unwrap()).collect());
        let stmts = median(runs.iter().map(|r| r["statements_per_claim"].as_f64().unwrap()).collect());
        log(format!("  {} {mode:?} {claimers}: {rate:.0} claims/s, {wasted:.3} wasted/claim", backend.name()));
        rows.push(json!({
            "claimers": claimers, "claims_per_s": rate, "wasted_per_claim": wasted,
            "statements_per_claim": stmts, "runs": runs,
        }));
    }
    json!(rows)
}

async fn claim_run(env: &Env, backend: Backend, mode: Mode, claimers: usize, plan: &Plan) -> Value {
    let url = env.fresh(backend).await;
    let admin = connect(&url, 1).await;
    let n = match (mode, backend) {
        (Mode::Naive, _) => 30_000,
        (Mode::Pick(1), _) => 60_000,
        _ => 200_000,
    };
    prefill(&admin, n).await;
    let mut queues = vec![];
    for _ in 0..claimers {
        queues.push(Queue::new(connect(&url, 1).await));
    }
    let admin = Arc::new(admin);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(plan.secs);
    let mut tasks = vec![];
    for (i, q) in queues.iter().enumerate() {
        let q = q.clone();
        let admin = admin.clone();
        tasks.push(tokio::spawn(async move {
            let machine = format!("c{i}");
            let (mut claims, mut wasted, mut stmts) = (0u64, 0u64, 0u64);
            while Instant::now() < deadline {
                match mode {
                    Mode::Naive => {
                        let ids = q.candidates(ORCH, 1).await.unwrap();
                        stmts += 1;
                        let Some(id) = ids.first() else { break };
                        match q.claim_by_id(*id, ORCH, &machine).await.unwrap() {
                            Some(_) => {
                                claims += 1;
                                stmts += 2; // the UPDATE and its history INSERT
                            }
                            None => {
                                wasted += 1;
                                stmts += 1;
                            }
                        }
                    }
                    Mode::Pick(k) => {
                        let got = q.claim_next(ORCH, &machine, k).await.unwrap();
                        stmts += 1;
                        if got.is_empty() {
                            if scalar(&admin, CLAIMABLE).await == 0 {
                                break;
                            }
                            wasted += 1;
                        } else {
                            if q.backend() != sea_orm::DbBackend::Postgres {
                                stmts += 1; // SQLite: the history INSERT (PostgreSQL writes it in the claim)
                            }
                            claims += got.len() as u64;
                        }
                    }
                }
            }
            (claims, wasted, stmts, start.elapsed())
        }));
    }
    let (mut claims, mut wasted, mut stmts, mut elapsed) = (0u64, 0u64, 0u64, Duration::ZERO);
    for t in tasks {
        let (c, w, s, e) = t.await.unwrap();
        claims += c;
        wasted += w;
        stmts += s;
        elapsed = elapsed.max(e);
    }
    let left = scalar(&admin, CLAIMABLE).await;
    for q in queues {
        q.connection().clone().close().await.ok();
    }
    if let Ok(a) = Arc::try_unwrap(admin) {
        a.close().await.ok();
    }
    json!({
        "claims": claims, "secs": elapsed.as_secs_f64(),
        "claims_per_s": claims as f64 / elapsed.as_secs_f64(),
        "wasted_per_claim": wasted as f64 / claims.max(1) as f64,
        "statements_per_claim": stmts as f64 / claims.max(1) as f64,
        "exhausted": left == 0,
    })
}

// ------------------------------------------------------------------ (d), (e)

async fn drain_matrix(env: &Env, backend: Backend, jobs: i64, plan: &Plan) -> Value {
    let mut rows = vec![];
    for claimers in [8usize, 32, 128] {
        for procs in [1usize, 4] {
            for batched in [false, true] {
                // The targets are read at 32 claimers: repeat those.
                let reps = if claimers == 32 { plan.repeats } else { 1 };
                let mut runs = vec![];
                for r in 0..reps {
                    let profile = backend == Backend::Pg && claimers == 32 && procs == 1 && r == 0;
                    runs.push(drain(env, backend, claimers, procs, batched, "noop", jobs, profile).await);
                }
                let rate = median(runs.iter().map(|r| r["jobs_per_s"].as_f64().unwrap()).collect());
                log(format!(
                    "  {} drain {claimers} claimers, {procs} proc, {}: {rate:.0} jobs/s",
                    backend.name(),
                    if batched { "batched" } else { "single" }
                ));
                rows.push(json!({
                    "claimers": claimers, "processes": procs, "batched": batched,
                    "jobs_per_s": rate, "runs": runs,
                }));
            }
        }
    }
    json!(rows)
}

/// Drains `jobs` pre-filled jobs with `claimers` slots spread over `procs` OS processes.
/// Single: one machine per slot (concurrency 1, so every claim statement claims one job).
/// Batched: machines of up to 16 slots, so a claim statement takes every free slot's job.
#[allow(clippy::too_many_arguments)]
async fn drain(
    env: &Env,
    backend: Backend,
    claimers: usize,
    procs: usize,
    batched: bool,
    agent: &str,
    jobs: i64,
    profile: bool,
) -> Value {
    let url = env.fresh(backend).await;
    let mon = connect(&url, 1).await;
    prefill(&mon, jobs).await;
    let per_proc = claimers / procs;
    let conc = if batched { per_proc.min(16) } else { 1 };
    let machines = per_proc / conc;
    let n = env.next();
    let mut children = vec![];
    for p in 0..procs {
        let dir = env.tmp.join(format!("drain{n}-p{p}"));
        let args: Vec<String> = [
            "--orch",
            ORCH,
            "--name",
            &format!("p{p}"),
            "--machines",
            &machines.to_string(),
            "--concurrency",
            &conc.to_string(),
            "--agent",
            agent,
            "--data-dir",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        children.push((crate::worker::Proc::spawn(&url, &args).await, dir));
    }
    let pids: Vec<u32> = children.iter().map(|(c, _)| c.pid()).collect();
    if profile {
        exec(&env.admin, "SELECT pg_stat_statements_reset()").await;
    }
    let pg_cpu0 = if backend == Backend::Pg { cluster::postgres_cpu_ms() } else { 0.0 };
    let cli_cpu0: f64 = pids.iter().filter_map(|p| cluster::proc_cpu(*p)).map(|(_, ms)| ms).sum();
    let start = Instant::now();
    for (c, _) in children.iter_mut() {
        c.go().await;
    }
    let limit = Duration::from_secs(180);
    let mut done = 0;
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The monitor shares the server with what it measures, so it asks the cheap question
        // every 10 ms (is any job still open? two partial-index probes) and counts the
        // completed jobs only when the answer is no. Counting every 10 ms was a full scan each
        // time: 22-30 % of the statement time in the drain profiles, charged to the drain.
        if scalar(&mon, OPEN_JOBS).await > 0 {
            continue;
        }
        done = scalar(&mon, "SELECT count(*) AS n FROM dispatch_queue WHERE state = 'completed'").await;
        if done >= jobs {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let pg_cpu = if backend == Backend::Pg { cluster::postgres_cpu_ms() - pg_cpu0 } else { 0.0 };
    let cli_cpu: f64 = pids.iter().filter_map(|p| cluster::proc_cpu(*p)).map(|(_, ms)| ms).sum::<f64>() - cli_cpu0;
    let statements = if profile { top_statements(env, &Env::dbname(&url)).await } else { json!(null) };
    let mut stats = vec![];
    for (c, dir) in children {
        stats.push(c.stop().await);
        let _ = std::fs::remove_dir_all(dir);
    }
    let sum = |k: &str| stats.iter().filter_map(|s| s[k].as_u64()).sum::<u64>();
    mon.close().await.ok();
    json!({
        "jobs": jobs, "completed": done, "secs": elapsed, "jobs_per_s": done as f64 / elapsed,
        "claimers": claimers, "processes": procs, "machines_per_process": machines, "concurrency": conc,
        "agent": agent, "batched": batched,
        "claim_queries": sum("claim_queries"), "polls": sum("polls"), "heartbeats": sum("heartbeats"),
        "jobs_per_claim_query": done as f64 / sum("claim_queries").max(1) as f64,
        "cpu_ms_per_1k_jobs": { "postgres": pg_cpu / done.max(1) as f64 * 1000.0, "clients": cli_cpu / done.max(1) as f64 * 1000.0 },
        "cpu_busy_fraction": (pg_cpu + cli_cpu) / 1000.0 / elapsed / std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0),
        "top_statements": statements,
    })
}

/// The statements of one database by total execution time (pg_stat_statements).
async fn top_statements(env: &Env, db: &str) -> Value {
    let rows = env
        .admin
        .query_all_raw(Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT calls::bigint AS calls, total_exec_time::float8 AS total_ms, rows::bigint AS rows,
                        regexp_replace(left(query, 90), '\\s+', ' ', 'g') AS query
                   FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                  WHERE d.datname = '{db}' ORDER BY total_exec_time DESC LIMIT 8"
            ),
        ))
        .await
        .unwrap();
    json!(rows
        .iter()
        .map(|r| json!({
            "calls": r.try_get::<i64>("", "calls").unwrap(),
            "total_ms": r.try_get::<f64>("", "total_ms").unwrap(),
            "rows": r.try_get::<i64>("", "rows").unwrap(),
            "query": r.try_get::<String>("", "query").unwrap(),
        }))
        .collect::<Vec<_>>())
}

// ------------------------------------------------------------------ (f)

/// Enqueue one job at a time into an idle machine; time enqueue -> the loop starting its agent
/// (the `Claimed` event, emitted right before the agent starts).
async fn latency(env: &Env, backend: Backend, notify: bool, samples: usize) -> Value {
    let url = env.fresh(backend).await;
    let producer = Queue::new(connect(&url, 1).await);
    let machine_q = Queue::new(connect(&url, 1).await);
    let dir = env.tmp.join(format!("lat{}", env.seq.fetch_add(1, Ordering::SeqCst)));
    let mut cfg = RunConfig::new(ORCH, "lat", AgentSpec::NoOp, dir.clone());
    let hints = if notify {
        // The CLI defaults: poll every 2 s, idle backoff up to 5 min. NOTIFY does the work.
        devpilot_store::listen::spawn(&DbUrl::parse(&url).unwrap(), ORCH, &machine_q)
    } else {
        cfg.poll_interval = Duration::from_millis(200);
        cfg.max_poll_interval = Duration::from_millis(200);
        None
    };
    let (cfg_poll, cfg_max) = (cfg.poll_interval, cfg.max_poll_interval);
    let (h, _j) = orchestrator::spawn(machine_q.clone(), cfg, hints);
    let mut events = h.subscribe();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut lat = vec![];
    for i in 0..samples {
        let gap = rand::rng().random_range(5..if notify { 30 } else { 200 });
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let t0 = Instant::now();
        let id = producer.enqueue(ORCH, &json!({ "title": format!("lat {i}") })).await.unwrap();
        let mut claimed = None;
        let mut completed = false;
        let wait_until = Instant::now() + Duration::from_secs(10);
        while !(claimed.is_some() && completed) {
            let Ok(ev) = tokio::time::timeout_at(wait_until.into(), events.recv()).await else { break };
            match ev {
                Ok(Event::Claimed { job }) if job.id == id => claimed = Some(t0.elapsed()),
                Ok(Event::Completed { job, .. }) if job.id == id => completed = true,
                _ => {}
            }
        }
        if let Some(d) = claimed {
            lat.push(d.as_secs_f64() * 1000.0);
        }
    }
    h.stop(StopMode::HandOff).await;
    producer.connection().clone().close().await.ok();
    machine_q.connection().clone().close().await.ok();
    let _ = std::fs::remove_dir_all(dir);
    let mut sorted = lat.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let v = json!({
        "samples": sorted.len(), "asked": samples,
        "p50_ms": pct(&sorted, 50.0), "p95_ms": pct(&sorted, 95.0), "p99_ms": pct(&sorted, 99.0),
        "max_ms": sorted.last().copied().unwrap_or(f64::NAN),
        "poll_interval_ms": cfg_poll.as_millis() as u64, "max_poll_interval_ms": cfg_max.as_millis() as u64,
    });
    log(format!("  {} {}: {v}", backend.name(), if notify { "notify" } else { "poll-only" }));
    v
}

// ------------------------------------------------------------------ (g)

/// An idle machine (LISTEN on, nothing to do) with every interval scaled down 100x so its
/// backoff reaches the ceiling in seconds: poll 20 ms (2 s), ceiling 3 s (5 min), presence
/// 300 ms (30 s), sweep 600 ms (60 s). Every statement the machine sends in the window at the
/// ceiling is counted by pg_stat_statements; per poll, that is what the unscaled machine sends
/// every 5 minutes (presence and sweep intervals are shorter than the ceiling in both).
async fn idle(env: &Env, plan: &Plan) -> Value {
    let url = env.fresh(Backend::Pg).await;
    let dbname = Env::dbname(&url);
    let q = Queue::new(connect(&url, 1).await);
    let dir = env.tmp.join("idle");
    let mut cfg = RunConfig::new(ORCH, "idle", AgentSpec::NoOp, dir.clone());
    let scale = 100u32;
    cfg.poll_interval = Duration::from_secs(2) / scale;
    cfg.max_poll_interval = Duration::from_secs(300) / scale;
    cfg.presence_every = Duration::from_secs(30) / scale;
    cfg.sweep_every = Duration::from_secs(60) / scale;
    let hints = devpilot_store::listen::spawn(&DbUrl::parse(&url).unwrap(), ORCH, &q);
    let (h, _j) = orchestrator::spawn(q.clone(), cfg.clone(), hints);
    // Backoff 20 ms doubling to 3 s: at the ceiling after ~5.1 s; warm up past it.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let calls_sql = format!(
        "SELECT coalesce(sum(calls), 0)::bigint AS n FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{dbname}'"
    );
    let xact_sql =
        format!("SELECT (xact_commit + xact_rollback)::bigint AS n FROM pg_stat_database WHERE datname = '{dbname}'");
    let conns_sql = format!("SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE datname = '{dbname}'");
    exec(&env.admin, "SELECT pg_stat_clear_snapshot()").await;
    let calls0 = scalar(&env.admin, &calls_sql).await;
    let xact0 = scalar(&env.admin, &xact_sql).await;
    let polls0 = h.stats().polls.load(Ordering::Relaxed);
    let claims0 = h.stats().claim_queries.load(Ordering::Relaxed);
    let pres0 = h.stats().presence_writes.load(Ordering::Relaxed);
    let sweeps0 = h.stats().sweeps.load(Ordering::Relaxed);
    let checks0 = h.stats().sweep_checks.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut conns = vec![];
    while t0.elapsed() < Duration::from_secs(plan.idle_window) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        conns.push(scalar(&env.admin, &conns_sql).await);
    }
    let window = t0.elapsed().as_secs_f64();
    // pg_stat_database is flushed lazily by idle backends; give it a moment.
    let calls = scalar(&env.admin, &calls_sql).await - calls0;
    let polls = h.stats().polls.load(Ordering::Relaxed) - polls0;
    let claims = h.stats().claim_queries.load(Ordering::Relaxed) - claims0;
    let presence = h.stats().presence_writes.load(Ordering::Relaxed) - pres0;
    let sweeps = h.stats().sweeps.load(Ordering::Relaxed) - sweeps0;
    let sweep_checks = h.stats().sweep_checks.load(Ordering::Relaxed) - checks0;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    exec(&env.admin, "SELECT pg_stat_clear_snapshot()").await;
    let xacts = scalar(&env.admin, &xact_sql).await - xact0;
    let breakdown = top_statements(env, &dbname).await;
    h.stop(StopMode::HandOff).await;
    q.connection().clone().close().await.ok();
    let _ = std::fs::remove_dir_all(dir);
    let per_poll = calls as f64 / polls.max(1) as f64;
    let v = json!({
        "scale": scale, "window_secs": window, "polls": polls, "claim_queries": claims,
        "presence_writes": presence, "sweeps": sweeps, "sweep_checks": sweep_checks,
        "statements": calls, "transactions": xacts,
        "statements_per_poll": per_poll,
        "claim_queries_per_poll": claims as f64 / polls.max(1) as f64,
        "unscaled_ceiling_secs": 300,
        "unscaled_statements_per_min": per_poll * 60.0 / 300.0,
        "connections_max": conns.iter().copied().max().unwrap_or(0),
        "connections_median": median(conns.iter().map(|c| *c as f64).collect()),
        "statements_breakdown": breakdown,
    });
    log(format!("  idle: {v}"));
    v
}
