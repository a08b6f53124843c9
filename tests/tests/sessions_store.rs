//! The carried conversation and the agent's report, statement by statement, on every
//! backend: a session is saved fenced by the claim token (a machine that lost the claim
//! saves nothing), the newest save wins, only a live job's session is read, and the
//! agent's cost and tokens add up over attempts.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use devpilot_store::queue::{NewSession, Usage, SESSION_BUNDLE_CAP};
use devpilot_tests::{Backend, TestDb};
use serde_json::json;

devpilot_tests::on_every_backend!(
    a_session_is_saved_fenced_and_read_by_the_next_claim,
    usage_adds_up_over_attempts,
    an_oversized_session_is_refused_and_never_read
);

fn session<'a>(cwd: &'a str, bundle: &'a str) -> NewSession<'a> {
    NewSession { agent: "claude", session_id: "s-1", cwd, bundle, raw_size: 4096, took_ms: 3 }
}

/// The laptop saves its session under its claim; once the job is released and the desktop
/// claims it, a late save by the laptop is refused, the desktop reads the laptop's session,
/// and its own save replaces it. A finished job's session is not read.
async fn a_session_is_saved_fenced_and_read_by_the_next_claim(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("sessions");
    let id = db.queue.enqueue(&orch, &json!({"title": "t"})).await.unwrap();
    let laptop = db.queue.claim_by_id(id, &orch, "laptop").await.unwrap().unwrap();
    assert!(db.queue.save_session(&laptop.fence, "laptop", &session("/a/wt", "QUJD")).await.unwrap());
    assert!(db.queue.release_with(&laptop.fence, "laptop", "handed off", None).await.unwrap());
    let desktop = db.queue.claim_by_id(id, &orch, "desktop").await.unwrap().unwrap();
    assert!(!db.queue.save_session(&laptop.fence, "laptop", &session("/a/wt", "late")).await.unwrap(), "fenced");
    let saved = db.queue.load_session(id).await.unwrap().unwrap();
    assert_eq!(
        (saved.machine.as_str(), saved.cwd.as_str(), saved.bundle.as_deref()),
        ("laptop", "/a/wt", Some("QUJD"))
    );
    assert_eq!((saved.claim_token, saved.raw_size), (laptop.fence.token, 4096));
    assert!(db.queue.save_session(&desktop.fence, "desktop", &session("/b/wt", "REVG")).await.unwrap());
    assert_eq!(
        db.queue.load_session(id).await.unwrap().unwrap().bundle.as_deref(),
        Some("REVG"),
        "the newest save wins"
    );
    let history = db.queue.history(id).await.unwrap();
    let carried: Vec<_> = history.iter().filter(|e| e.kind == "session_carried").collect();
    assert_eq!(carried.len(), 2, "{history:?}");
    assert!(carried[0].detail.as_deref().unwrap().contains("4.0 KiB raw"), "{carried:?}");
    assert!(db.queue.complete(&desktop.fence, "desktop").await.unwrap());
    assert!(db.queue.load_session(id).await.unwrap().is_none(), "a finished job's session is not read");
}

/// Each attempt's cost and tokens add to the job's; a report without them keeps the sum; the
/// start names the preset and the machine it resumed from. All fenced.
async fn usage_adds_up_over_attempts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("usage");
    let id = db.queue.enqueue(&orch, &json!({"title": "t"})).await.unwrap();
    let first = db.queue.claim_by_id(id, &orch, "laptop").await.unwrap().unwrap();
    assert!(db.queue.record_agent_start(&first.fence, "claude", None, None).await.unwrap());
    let usage = Usage { session: Some("s-1".into()), cost_usd: Some(0.25), tokens_in: Some(100), tokens_out: Some(7) };
    assert!(db.queue.record_agent_usage(&first.fence, &usage).await.unwrap());
    assert!(db.queue.release_with(&first.fence, "laptop", "handed off", None).await.unwrap());
    assert!(!db.queue.record_agent_usage(&first.fence, &usage).await.unwrap(), "fenced");
    let second = db.queue.claim_by_id(id, &orch, "desktop").await.unwrap().unwrap();
    assert!(db.queue.record_agent_start(&second.fence, "claude", Some("laptop"), None).await.unwrap());
    let more = Usage { session: None, cost_usd: Some(0.5), tokens_in: Some(50), tokens_out: None };
    assert!(db.queue.record_agent_usage(&second.fence, &more).await.unwrap());
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    let a = job.agent;
    assert_eq!(
        (a.agent.as_deref(), a.agent_session.as_deref(), a.session_from.as_deref()),
        (Some("claude"), Some("s-1"), Some("laptop"))
    );
    assert_eq!((a.cost_usd, a.tokens_in, a.tokens_out), (Some(0.75), Some(150), Some(7)));
}

/// A bundle over the cap never enters the table, by the API or by plain SQL (an insert, an
/// upsert, an update), and one that is there already (written with the trigger off, as a row
/// from before the cap) is loaded without its text: the claim never fetches or decodes it.
async fn an_oversized_session_is_refused_and_never_read(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("session-caps");
    let id = db.queue.enqueue(&orch, &json!({"title": "t"})).await.unwrap();
    let laptop = db.queue.claim_by_id(id, &orch, "laptop").await.unwrap().unwrap();
    let big = "A".repeat(SESSION_BUNDLE_CAP + 1);
    let e = db.queue.save_session(&laptop.fence, "laptop", &session("/a/wt", &big)).await.unwrap_err();
    assert!(e.to_string().contains("over the cap"), "{e}");
    // The same text, in SQL: PostgreSQL's repeat(); SQLite has none, so zeros from a blob.
    let sql_big = match backend {
        Backend::Sqlite => {
            format!("substr(hex(zeroblob({})), 1, {})", SESSION_BUNDLE_CAP / 2 + 1, SESSION_BUNDLE_CAP + 1)
        }
        _ => format!("repeat('A', {})", SESSION_BUNDLE_CAP + 1),
    };
    let insert = |bundle: &str, tail: &str| {
        format!(
            "INSERT INTO job_sessions (job_id, orchestrator_id, claim_token, machine, agent, session_id, cwd, bundle,
                                       raw_size, saved_at)
             VALUES ({id}, '{orch}', {token}, 'laptop', 'claude', 's-1', '/a/wt', {bundle}, 1, 0) {tail}",
            token = laptop.fence.token
        )
    };
    let refused = |r: Result<sea_orm::ExecResult, sea_orm::DbErr>| match r {
        Ok(_) => panic!("an oversized bundle was stored"),
        Err(e) => assert!(e.to_string().contains("session bundle is"), "{e}"),
    };
    use sea_orm::ConnectionTrait;
    refused(db.admin().execute_unprepared(&insert(&sql_big, "")).await);
    db.exec(&insert("'QUJD'", "")).await;
    let upsert = insert(&sql_big, "ON CONFLICT (job_id) DO UPDATE SET bundle = excluded.bundle");
    refused(db.admin().execute_unprepared(&upsert).await);
    refused(db.admin().execute_unprepared(&format!("UPDATE job_sessions SET bundle = {sql_big}")).await);
    assert_eq!(db.queue.load_session(id).await.unwrap().unwrap().bundle.as_deref(), Some("QUJD"));
    // A row from before the cap.
    db.exec(match backend {
        Backend::Sqlite => "DROP TRIGGER job_sessions_caps_update",
        _ => "ALTER TABLE job_sessions DISABLE TRIGGER job_sessions_caps",
    })
    .await;
    db.exec(&format!("UPDATE job_sessions SET bundle = {sql_big}")).await;
    let n = db.scalar("SELECT CAST(octet_length(bundle) AS BIGINT) FROM job_sessions").await;
    assert_eq!(n, Some(SESSION_BUNDLE_CAP as i64 + 1), "the oversized row is there");
    let saved = db.queue.load_session(id).await.unwrap().unwrap();
    assert_eq!((saved.session_id.as_str(), saved.bundle), ("s-1", None), "loaded without its bundle");
}
