//! What every measurement shares: the run's environment ([`Env`]) and plan ([`Plan`]), the
//! database helpers, pre-filling a queue, and the statistics.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use devpilot_store::db::{self, DbUrl, PoolSettings};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde_json::{json, Value};

use crate::cluster::Cluster;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backend {
    Pg,
    Sqlite,
}

impl Backend {
    pub fn name(self) -> &'static str {
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
    /// The run's environment: the cluster, a connection to its `postgres` database, and a
    /// temp dir; names are numbered from 0.
    pub fn new(pg: Cluster, admin: DatabaseConnection, tmp: PathBuf) -> Env {
        Env { pg, admin, tmp, seq: AtomicU32::new(0) }
    }

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
pub async fn prefill(db: &DatabaseConnection, n: i64) {
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

/// Claimable jobs left.
pub const CLAIMABLE: &str =
    "SELECT count(*) AS n FROM dispatch_queue WHERE claimed_at IS NULL AND state IN ('queued','failed')";

/// The statements of one database by total execution time (pg_stat_statements).
pub async fn top_statements(env: &Env, db: &str) -> Value {
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

/// The time now, as the report writes it.
pub fn now_utc() -> String {
    let out = std::process::Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
