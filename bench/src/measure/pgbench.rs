//! (a) the claim statement alone under pgbench, the physical limit; (a') the previous pick,
//! for an A/B in the same run; and the plans of both picks.

use sea_orm::{ConnectionTrait, Statement, TransactionTrait};
use serde_json::{json, Value};

use crate::common::{connect, exec, log, median, prefill, scalar, Backend, Env, Plan, CLAIMABLE, ORCH};

/// `Queue::claim_next`'s own statement with k = 1, in pgbench's variable syntax.
pub fn pgbench_script() -> String {
    let sql = devpilot_store::queue::claim_next_sql_postgres()
        .replace("$1", ":orch")
        .replace("$2", "'pgbench'")
        .replace("$3", "1");
    format!("{sql};\n")
}

/// The pick as it was before the job model (FIFO by `(created_at, id)`, no priority, no
/// `run_at`), so this run can say what the new order costs.
pub fn previous_pick_script() -> String {
    let sql = pgbench_script()
        .replace(" AND run_at <= ((extract(epoch from now()) * 1000)::bigint)", "")
        .replace("ORDER BY priority DESC, run_at, id", "ORDER BY created_at, id");
    assert!(sql.contains("ORDER BY created_at, id") && !sql.contains("run_at"), "the previous pick: {sql}");
    sql
}

/// The previous pick's own index, in place of the current one.
pub const PREVIOUS_PICK_INDEX: &[&str] = &[
    "CREATE INDEX dispatch_queue_pick_previous ON dispatch_queue (orchestrator_id, created_at, id)
         WHERE claimed_at IS NULL AND state IN ('queued','failed')",
    "DROP INDEX dispatch_queue_pick",
];

/// `EXPLAIN (ANALYZE, BUFFERS)` of the current and the previous pick (k = 16) on a prefilled
/// queue after 5,000 claims, each inside a transaction that is rolled back.
pub async fn pick_plans(env: &Env, plan: &Plan) -> Value {
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
pub async fn pgbench_all(env: &Env, plan: &Plan, sql: &str, setup: &[&str]) -> Value {
    let script = env.tmp.join(format!("claim-{}.sql", env.next()));
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
