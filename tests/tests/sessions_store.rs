//! The carried conversation and the agent's report, statement by statement, on every
//! backend: a session is saved fenced by the claim token (a machine that lost the claim
//! saves nothing), the newest save wins, only a live job's session is read, and the
//! agent's cost and tokens add up over attempts.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use devpilot_store::queue::{NewSession, Usage};
use devpilot_tests::{Backend, TestDb};
use serde_json::json;

devpilot_tests::on_every_backend!(a_session_is_saved_fenced_and_read_by_the_next_claim, usage_adds_up_over_attempts);

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
    assert_eq!((saved.machine.as_str(), saved.cwd.as_str(), saved.bundle.as_str()), ("laptop", "/a/wt", "QUJD"));
    assert_eq!((saved.claim_token, saved.raw_size), (laptop.fence.token, 4096));
    assert!(db.queue.save_session(&desktop.fence, "desktop", &session("/b/wt", "REVG")).await.unwrap());
    assert_eq!(db.queue.load_session(id).await.unwrap().unwrap().bundle, "REVG", "the newest save wins");
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
    assert!(db.queue.record_agent_start(&first.fence, "claude", None).await.unwrap());
    let usage = Usage { session: Some("s-1".into()), cost_usd: Some(0.25), tokens_in: Some(100), tokens_out: Some(7) };
    assert!(db.queue.record_agent_usage(&first.fence, &usage).await.unwrap());
    assert!(db.queue.release_with(&first.fence, "laptop", "handed off", None).await.unwrap());
    assert!(!db.queue.record_agent_usage(&first.fence, &usage).await.unwrap(), "fenced");
    let second = db.queue.claim_by_id(id, &orch, "desktop").await.unwrap().unwrap();
    assert!(db.queue.record_agent_start(&second.fence, "claude", Some("laptop")).await.unwrap());
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
