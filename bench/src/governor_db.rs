//! (l)'s databases: the machine's routes, and a fresh database holding the section's rows
//! (a pre-filled queue, [`HOLDS`] holds on other accounts, [`SPEND_TODAY`] spend rows today
//! and as many yesterday), with the server's figures for the poll read back from
//! pg_stat_statements. Measured by [`crate::governor`].

use std::time::{SystemTime, UNIX_EPOCH};

use devpilot_store::queue::{Governor, Route};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde_json::{json, Value};

use crate::common::{connect, exec, prefill, Backend, Env, ORCH};

/// Unexpired holds, none on the measured machine's account.
pub const HOLDS: i64 = 50;
/// Spend rows today (and as many the day before, which the day's sum skips).
pub const SPEND_TODAY: i64 = 10_000;
/// The accounts the spend is spread over (the machine's own among them).
pub const SPEND_ACCOUNTS: i64 = 20;
/// The measured machine's account.
pub const ACCOUNT: &str = "claude:work";
/// A held account (the `held` variant runs as it).
pub const HELD_ACCOUNT: &str = "claude:held-0";
/// The skew the machine allows a hold (30 s, the default).
const SKEW_MS: i64 = 30_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Variant {
    /// `Route::default()`: today's claim text.
    Off,
    /// The machine's account and skew, no day cap: the claim with holds present.
    HoldsOnly,
    /// The account, the skew and both day caps (far away): holds and the day's spend read.
    On,
    /// The on route for a machine whose account is held: it claims nothing.
    Held,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Off => "off",
            Variant::HoldsOnly => "holds_only",
            Variant::On => "on",
            Variant::Held => "held",
        }
    }

    /// The machine's route; `day_start_ms` is the start of the day its caps count from.
    pub fn route(self, day_start_ms: i64) -> Route {
        let governor = match self {
            Variant::Off => return Route::default(),
            Variant::HoldsOnly => {
                Governor { account: Some(ACCOUNT.to_string()), skew_ms: SKEW_MS, ..Default::default() }
            }
            Variant::On | Variant::Held => Governor {
                account: Some(if self == Variant::Held { HELD_ACCOUNT } else { ACCOUNT }.to_string()),
                skew_ms: SKEW_MS,
                day_start_ms,
                day_usd: Some(1e9),
                account_day_usd: Some(1e9),
            },
        };
        Route { governor, ..Route::default() }
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The start of today (UTC), in ms since the epoch.
pub fn day_start(now: i64) -> i64 {
    now - now.rem_euclid(86_400_000)
}

/// The governor's rows: [`HOLDS`] unexpired holds on other accounts, `today` spend rows
/// since `day` and [`SPEND_TODAY`] the day before, written into `spend` (its triggers keep
/// `spend_quarters`).
async fn governor_rows(db: &DatabaseConnection, now: i64, day: i64, today: i64) {
    let elapsed = (now - day).max(1);
    exec(
        db,
        &format!(
            "INSERT INTO account_holds (orchestrator_id, account, until_at, reason, machine, job_id, held_at)
             SELECT '{ORCH}', 'claude:held-' || g, {now} + 3600000, 'usage limit', 'm-held', NULL, {now}
               FROM generate_series(0, {last}) g",
            last = HOLDS - 1
        ),
    )
    .await;
    for (from, spread, rows) in [(day, elapsed, today), (day - 86_400_000, 86_400_000, SPEND_TODAY)] {
        exec(
            db,
            &format!(
                "INSERT INTO spend (orchestrator_id, job_id, claim_token, machine, account, cost_usd, at)
                 SELECT '{ORCH}', g, 1, 'm' || (g % 32),
                        CASE WHEN g % {SPEND_ACCOUNTS} = 0 THEN '{ACCOUNT}' ELSE 'claude:key-' || (g % {SPEND_ACCOUNTS}) END,
                        0.01 * (g % 97), {from} + (g * 7919) % {spread}
                   FROM generate_series(1, {rows}) g"
            ),
        )
        .await;
    }
    for table in ["account_holds", "spend", "spend_quarters"] {
        exec(db, &format!("ANALYZE {table}")).await;
    }
}

/// A fresh database with `jobs` claimable jobs and the governor's rows (`today` spend rows
/// today); its URL, an admin connection and the start of today.
pub async fn fresh(env: &Env, jobs: i64, today: i64) -> (String, DatabaseConnection, i64) {
    let now = now_ms();
    let day = day_start(now);
    let url = env.fresh(Backend::Pg).await;
    // Planning counted too (its own figures), for the sessions opened from here on.
    exec(&env.admin, &format!("ALTER DATABASE {} SET pg_stat_statements.track_planning = on", Env::dbname(&url))).await;
    let admin = connect(&url, 1).await;
    if jobs > 0 {
        prefill(&admin, jobs).await;
    }
    governor_rows(&admin, now, day, today).await;
    (url, admin, day)
}

pub async fn drop_db(env: &Env, url: &str) {
    exec(&env.admin, &format!("DROP DATABASE {} WITH (FORCE)", Env::dbname(url))).await;
}

/// The server's figures for the poll statement in database `db` (pg_stat_statements):
/// calls, mean execution ms, how many times it was planned, and planning ms per call.
pub async fn server_stats(env: &Env, db: &str) -> (i64, f64, i64, f64) {
    let r = env
        .admin
        .query_one_raw(Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT COALESCE(SUM(calls), 0)::bigint AS calls,
                        COALESCE(SUM(total_exec_time) / NULLIF(SUM(calls), 0), 0)::float8 AS exec_ms,
                        COALESCE(SUM(plans), 0)::bigint AS plans,
                        COALESCE(SUM(total_plan_time) / NULLIF(SUM(calls), 0), 0)::float8 AS plan_ms
                   FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                  WHERE d.datname = '{db}' AND s.query LIKE '%picked AS MATERIALIZED%'"
            ),
        ))
        .await
        .unwrap()
        .unwrap();
    (
        r.try_get::<i64>("", "calls").unwrap(),
        r.try_get::<f64>("", "exec_ms").unwrap(),
        r.try_get::<i64>("", "plans").unwrap(),
        r.try_get::<f64>("", "plan_ms").unwrap(),
    )
}

/// What the triggers on `spend` left in `spend_quarters`, against `spend` itself: the rows
/// of each, the quarters that disagree with `spend`'s own sums per (account, quarter hour)
/// and under `*`, and the day's spend both ways (the fleet's and [`ACCOUNT`]'s).
pub async fn quarters_check(db: &DatabaseConnection, day: i64) -> Value {
    let sql = format!(
        "WITH s AS (
             SELECT COALESCE(account, '') AS account, at - at % 900000 AS quarter_at, SUM(cost_usd) AS cost
               FROM spend WHERE orchestrator_id = '{ORCH}' GROUP BY 1, 2
             UNION ALL
             SELECT '*', at - at % 900000, SUM(cost_usd) FROM spend WHERE orchestrator_id = '{ORCH}' GROUP BY 2),
         q AS (SELECT account, quarter_at, cost_usd FROM spend_quarters WHERE orchestrator_id = '{ORCH}')
         SELECT (SELECT count(*) FROM spend)::bigint AS spend_rows,
                (SELECT count(*) FROM q)::bigint AS quarter_rows,
                (SELECT count(*) FROM q WHERE quarter_at >= {day})::bigint AS quarter_rows_today,
                (SELECT count(*) FROM s FULL JOIN q USING (account, quarter_at)
                  WHERE s.cost IS NULL OR q.cost_usd IS NULL OR abs(s.cost - q.cost_usd) > 1e-6)::bigint AS mismatched,
                (SELECT COALESCE(SUM(cost_usd), 0) FROM spend WHERE at >= {day})::float8 AS spend_today_usd,
                (SELECT COALESCE(SUM(cost_usd), 0) FROM q WHERE account = '*' AND quarter_at >= {day})::float8 AS quarters_today_usd,
                (SELECT COALESCE(SUM(cost_usd), 0) FROM spend WHERE at >= {day} AND account = '{ACCOUNT}')::float8 AS spend_today_account_usd,
                (SELECT COALESCE(SUM(cost_usd), 0) FROM q WHERE account = '{ACCOUNT}' AND quarter_at >= {day})::float8 AS quarters_today_account_usd"
    );
    let r = db.query_one_raw(Statement::from_string(sea_orm::DbBackend::Postgres, sql)).await.unwrap().unwrap();
    let i = |k: &str| r.try_get::<i64>("", k).unwrap();
    let x = |k: &str| r.try_get::<f64>("", k).unwrap();
    let ok = i("mismatched") == 0
        && i("quarter_rows") > 0
        && (x("spend_today_usd") - x("quarters_today_usd")).abs() < 1e-6
        && (x("spend_today_account_usd") - x("quarters_today_account_usd")).abs() < 1e-6;
    json!({
        "spend_rows": i("spend_rows"), "quarter_rows": i("quarter_rows"), "quarter_rows_today": i("quarter_rows_today"),
        "mismatched_quarters": i("mismatched"),
        "spend_today_usd": x("spend_today_usd"), "quarters_today_usd": x("quarters_today_usd"),
        "spend_today_account_usd": x("spend_today_account_usd"),
        "quarters_today_account_usd": x("quarters_today_account_usd"),
        "ok": ok,
    })
}
