//! The engine's tests: the demo on the SQLite default, dispatch, overrides, settings applied
//! live or refused, a corrupt config file, the database form, and Settings → Sources (the
//! source form, its checks, the health line, saving and removing a source).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use devpilot_engine::config::Paths;
use devpilot_engine::orchestrator::{Event, StopMode};
use devpilot_engine::settings::{Settings, SleepAction};
use devpilot_store::job::JobState;

use super::*;
use crate::sources::{gh_gave_nothing, health_line, imported, key_note, on_path};
use devpilot_engine::sources::SourceKind;

fn paths(dir: &std::path::Path) -> Paths {
    Paths { config_dir: dir.join("config"), data_dir: dir.join("data"), log_dir: dir.join("data").join("logs") }
}

async fn wait_for<F: Fn(&Status) -> bool>(e: &Engine, what: &str, f: F) -> Status {
    let mut rx = e.watch_status();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = rx.borrow_and_update().clone();
        if f(&s) {
            return s;
        }
        if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
            panic!("timed out waiting for {what}; last status {s:?}");
        }
    }
}

async fn wait_event<F: Fn(&Event) -> bool>(rx: &mut broadcast::Receiver<Event>, f: F) -> Event {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(ev)) if f(&ev) => return ev,
            Ok(Ok(_)) => {}
            other => panic!("no matching event: {other:?}"),
        }
    }
}

fn fast(p: &Paths) {
    let s = Settings {
        poll_interval: devpilot_engine::span::Span::parse("200ms").unwrap(),
        max_poll_interval: devpilot_engine::span::Span::parse("1s").unwrap(),
        orchestrator_id: "unit".into(),
        ..Settings::default()
    };
    p.save(&s).unwrap();
}

/// With no agent on the embedded SQLite default, the demo agent runs a demo job to the end,
/// and its log, history and agent run (preset, session, cost, tokens) are readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_job_runs_on_the_sqlite_default() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let e = Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_millis(300));
    let mut ev = e.subscribe();
    e.start().await;
    let st = wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
    assert_eq!(st.agent, AgentKind::Demo);
    assert!(st.backend.is_some_and(|b| b.is_sqlite()), "{:?}", st.backend);
    assert_eq!(serde_json::to_value(&st).unwrap()["backend"], "sqlite", "the JSON name the window shows");
    assert!(p.default_db().exists(), "the embedded database is created on first use");
    let id = e.enqueue_demo().await.unwrap();
    wait_event(&mut ev, |x| matches!(x, Event::Claimed { job } if job.id == id)).await;
    wait_event(&mut ev, |x| matches!(x, Event::Completed { job, .. } if job.id == id)).await;
    let d = e.job_detail(id).await.unwrap();
    assert_eq!(d.job.state, JobState::Completed);
    assert!(d.log_tail.contains("demo agent: done"), "{}", d.log_tail);
    assert!(d.history.iter().any(|h| h.kind == "claimed"));
    assert_eq!(d.payload["source"], "devpilot-tray");
    // Its page: no repo, so no branch and no worktree; no tracker, so no reports; its log here.
    assert_eq!((d.branch.as_deref(), d.worktree_here, d.deliveries.len()), (None, false, 0));
    assert!(d.log_path.as_deref().is_some_and(|p| p.ends_with(&format!("job-{id}.log"))), "{:?}", d.log_path);
    // What a preset's CLI reported reaches the window with the job, under `agent`.
    assert_eq!(
        serde_json::to_value(&d).unwrap()["job"]["agent"]["agent"],
        serde_json::Value::Null,
        "the demo is no preset"
    );
    let sql = format!(
        "UPDATE dispatch_queue SET agent = 'claude', agent_session = 'b5f7c2d1', cost_usd = 0.0997, \
         tokens_in = 24693, tokens_out = 45, session_from = 'laptop' WHERE id = {id}"
    );
    sea_orm::ConnectionTrait::execute_unprepared(e.queue().unwrap().connection(), &sql).await.unwrap();
    let v = serde_json::to_value(e.job_detail(id).await.unwrap()).unwrap();
    assert_eq!(
        v["job"]["agent"],
        serde_json::json!({"agent": "claude", "agent_session": "b5f7c2d1", "cost_usd": 0.0997,
                           "tokens_in": 24693, "tokens_out": 45, "session_from": "laptop"})
    );
    // A notification's Open asks for the result link when clicked: a pull request opened
    // after the completion is what it finds; a link that is not http(s) is never offered.
    let before = d.job.url.clone().filter(|u| u.starts_with("http"));
    assert_eq!(e.result_link(id).await, before);
    let pr = "https://github.com/acme/webapp/pull/3";
    assert!(e.queue().unwrap().set_result_url(id, pr).await.unwrap());
    assert_eq!(e.result_link(id).await.as_deref(), Some(pr));
    assert!(e.queue().unwrap().set_result_url(id, "file:///etc/passwd").await.unwrap());
    assert_eq!(e.result_link(id).await, None);
    assert_eq!(e.result_link(id + 1000).await, None, "no such job");
    e.stop(StopMode::HandOff).await;
}

/// Dispatch off claims nothing (the loop polled after the job was enqueued, and rested
/// without claiming) and is remembered in the config file: a fresh engine on the same
/// files starts off, claims once switched on, and a third one starts on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_toggle_persists_and_gates_claims() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let engine =
        || Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_millis(100));
    let e = engine();
    e.start().await;
    wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
    e.set_dispatch(false).await.unwrap();
    wait_for(&e, "off", |s| s.state == MachineState::Off).await;
    assert!(!p.load().unwrap().dispatch_enabled);
    let h = e.orchestrator().unwrap();
    let polls = h.stats().polls.load(Ordering::SeqCst);
    // The enqueue wakes the loop, which polls while off. A poll that claimed would leave it
    // polling again within a second (the idle ceiling); an off machine rests until its
    // next presence write, 30 s away.
    let id = e.enqueue_demo().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.stats().polls.load(Ordering::SeqCst) == polls
        || h.next_poll().await.is_none_or(|d| d <= Duration::from_secs(10))
    {
        assert!(Instant::now() < deadline, "the loop polled after the enqueue and rested, claiming nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(e.job_detail(id).await.unwrap().job.state, JobState::Queued);
    e.stop(StopMode::HandOff).await;
    drop(e);

    // A new engine (as after a restart of the app) reads it from the file: off.
    let e = engine();
    e.start().await;
    let st = wait_for(&e, "off after restart", |s| s.state == MachineState::Off).await;
    assert!(!st.dispatch_enabled);
    e.set_dispatch(true).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while e.job_detail(id).await.unwrap().job.state != JobState::Completed {
        assert!(Instant::now() < deadline, "job was not run after dispatch was switched on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(p.load().unwrap().dispatch_enabled);
    e.stop(StopMode::HandOff).await;
    drop(e);

    // And on is remembered too.
    let e = engine();
    e.start().await;
    let st = wait_for(&e, "idle after the second restart", |s| s.state == MachineState::Idle).await;
    assert!(st.dispatch_enabled);
    e.stop(StopMode::HandOff).await;
}

/// On PostgreSQL with no agent, nothing is claimed and the state says what to do. (The
/// host is unreachable here; the agent decision comes first and does not need it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_agent_needs_agent() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    let o = Overrides { database_url: Some("postgres://u@127.0.0.1:1/db".into()), ..Overrides::default() };
    let e = Engine::new(p, "devpilot-test", o);
    e.start().await;
    let st = wait_for(&e, "needs_agent", |s| s.state == MachineState::NeedsAgent).await;
    assert_eq!(st.agent, AgentKind::None);
    assert!(st.message.unwrap().contains("agent command"));
    assert!(e.hand_off(true).await.is_err(), "no orchestrator runs, so there is nothing to hand off");
    e.stop(StopMode::HandOff).await;
}

/// Environment overrides win over the file, and an agent that does not exist is an error
/// state, not a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_and_missing_agent() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let db = dir.path().join("other.sqlite");
    let o = Overrides {
        database_url: Some(format!("sqlite://{}", db.display())),
        orchestrator: Some("from-env".into()),
        agent: Some("/nonexistent/agent --flag 'two words'".into()),
    };
    let e = Engine::new(p, "devpilot-test", o);
    e.start().await;
    let st = wait_for(&e, "error", |s| s.state == MachineState::Error).await;
    assert_eq!(st.orchestrator_id, "from-env");
    assert!(st.message.unwrap().contains("/nonexistent/agent"));
    assert_eq!(st.overrides.len(), 3);
    // The window can still read the queue: the engine connects anyway.
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.jobs(None, 10).await.is_err() {
        assert!(Instant::now() < deadline, "the queue never became readable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(db.exists());
    e.stop(StopMode::HandOff).await;
}

/// Bad settings are refused with a clear message and nothing is saved; an unreachable
/// database is reported as such before anything is saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let before = std::fs::read_to_string(p.config_file()).unwrap();
    let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
    let mut s = p.load().unwrap();
    s.orchestrator_id = "  ".into();
    let err = e.apply_settings(s, &DbForm::of(None), None).await.unwrap_err();
    assert!(err.to_string().contains("orchestrator id"), "{err}");
    let s = p.load().unwrap();
    let form = DbForm {
        mode: DbMode::Postgres,
        host: "127.0.0.1".into(),
        port: Some(1),
        database: "d".into(),
        user: "u".into(),
        ..DbForm::default()
    };
    let err = e.apply_settings(s.clone(), &form, Some("pw-not-stored".into())).await.unwrap_err();
    assert_eq!(err.kind(), "unreachable", "{err}");
    assert!(err.to_string().contains("127.0.0.1:1/d"), "{err}");
    assert!(!err.to_string().contains("pw-not-stored"));
    let form = DbForm { host: "".into(), ..form };
    assert!(e.apply_settings(s, &form, None).await.unwrap_err().to_string().contains("host"));
    assert_eq!(std::fs::read_to_string(p.config_file()).unwrap(), before);
}

/// An agent script that records its pid and whether it was stopped.
fn long_agent(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join(name);
    let text = format!(
        "#!/bin/sh\necho \"start $DEVPILOT_JOB_ID {name}\" >> {rec}\ntrap 'echo \"term $DEVPILOT_JOB_ID\" >> {rec}; exit 143' TERM\nsleep 60 & wait\n",
        rec = dir.join("agent.log").display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Every live setting, changed while an agent runs, applies without stopping it:
/// concurrency (proven by more jobs running at once), the lease timings, the poll
/// intervals, notifications, attempts and the agent command. A change of orchestrator,
/// by contrast, restarts the engine and hands the agent off (so the check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_settings_leave_running_agents_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let mut s = p.load().unwrap();
    s.agent = Some(long_agent(dir.path(), "agent-a.sh").display().to_string());
    // The agents record what they do beside their scripts, outside their sandbox.
    s.sandbox.read_write.push(dir.path().display().to_string());
    p.save(&s).unwrap();
    let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
    e.start().await;
    wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
    let id = e.enqueue_demo().await.unwrap();
    let st = wait_for(&e, "working", |s| s.running.iter().any(|r| r.job.id == id)).await;
    let token = st.running[0].job.token;
    let log = dir.path().join("agent.log");
    type Change = (&'static str, fn(&mut Settings));
    let changes: Vec<Change> = vec![
        ("concurrency", |s| s.concurrency = 3),
        ("claim timeout", |s| s.claim_timeout = devpilot_engine::span::Span::parse("20m").unwrap()),
        ("heartbeat", |s| s.heartbeat = devpilot_engine::span::Span::parse("5s").unwrap()),
        ("poll interval", |s| s.poll_interval = devpilot_engine::span::Span::parse("300ms").unwrap()),
        ("idle ceiling", |s| s.max_poll_interval = devpilot_engine::span::Span::parse("2s").unwrap()),
        ("notifications", |s| s.notify.completed = false),
        ("attempts", |s| s.max_attempts = 5),
        ("sleep action", |s| s.sleep_action = SleepAction::Pause),
        ("agent", |s| s.agent = Some(s.agent.clone().unwrap().replace("agent-a.sh", "agent-b.sh"))),
    ];
    long_agent(dir.path(), "agent-b.sh");
    for (what, change) in changes {
        let mut s = p.load().unwrap();
        change(&mut s);
        e.apply_settings(s, &DbForm::of(None), None).await.unwrap_or_else(|err| panic!("{what}: {err}"));
        let st = e.status();
        assert!(st.running.iter().any(|r| r.job.id == id && r.job.token == token), "{what}: {st:?}");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(!text.contains("term"), "{what} stopped the agent: {text}");
    }
    assert_eq!(e.settings().concurrency, 3);
    let more = [e.enqueue_demo().await.unwrap(), e.enqueue_demo().await.unwrap()];
    wait_for(&e, "three at once", |s| s.running.len() == 3).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let started = |m: i64| std::fs::read_to_string(&log).unwrap_or_default().contains(&format!("start {m} agent-b.sh"));
    while !more.iter().all(|m| started(*m)) {
        assert!(Instant::now() < deadline, "the new agent (b) ran both new jobs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut s = p.load().unwrap();
    s.orchestrator_id = "elsewhere".into();
    e.apply_settings(s, &DbForm::of(None), None).await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&format!("term {id}")), "a new orchestrator hands the running job off: {text}");
    e.stop(StopMode::HandOff).await;
}

/// A config file that cannot be parsed is kept aside, the engine runs on the defaults and
/// remembers it for the window; a later save writes a new file and leaves the kept one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_config_is_kept_aside_and_the_engine_starts() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    std::fs::create_dir_all(&p.config_dir).unwrap();
    std::fs::write(p.config_file(), "orchestrator_id = [unterminated").unwrap();
    let e = Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_millis(100));
    let mut notice = e.watch_set_aside();
    e.start().await;
    let st = wait_for(&e, "idle on defaults", |s| s.state == MachineState::Idle).await;
    assert_eq!(st.orchestrator_id, Settings::default().orchestrator_id);
    let kept = e.set_aside_config().expect("the engine remembers what it set aside");
    assert!(notice.has_changed().unwrap(), "watchers learn of it");
    assert!(notice.borrow_and_update().is_some());
    assert!(kept.kept_as.contains("config.toml.bad-"), "{kept:?}");
    assert_eq!(std::fs::read_to_string(&kept.kept_as).unwrap(), "orchestrator_id = [unterminated");
    e.set_dispatch(false).await.unwrap();
    assert!(!p.load().unwrap().dispatch_enabled, "a new file is written");
    assert_eq!(std::fs::read_to_string(&kept.kept_as).unwrap(), "orchestrator_id = [unterminated");
    // A restart finds the good file: nothing new is set aside, and the notice stays until dismissed.
    e.start().await;
    wait_for(&e, "off after restart", |s| s.state == MachineState::Off).await;
    assert_eq!(e.set_aside_config(), Some(kept));
    e.dismiss_set_aside();
    assert_eq!(e.set_aside_config(), None);
    let kept_files = std::fs::read_dir(&p.config_dir)
        .unwrap()
        .filter(|f| f.as_ref().unwrap().file_name().to_string_lossy().contains(".bad-"));
    assert_eq!(kept_files.count(), 1);
    e.stop(StopMode::HandOff).await;
}

/// The database form builds a URL without a password and reads one back.
#[test]
fn db_form_round_trip() {
    let f = DbForm {
        mode: DbMode::Postgres,
        host: "db.example".into(),
        port: Some(6543),
        database: "dev pilot".into(),
        user: "alice".into(),
        sslmode: "require".into(),
        sslrootcert: String::new(),
        url: String::new(),
    };
    let u = f.to_url().unwrap().unwrap();
    assert_eq!(u.target(), "db.example:6543/dev%20pilot");
    assert_eq!(DbForm::of(Some(&u.to_string())), f.clone());
    let bad = DbForm { sslmode: "maybe".into(), ..f };
    assert!(bad.to_url().unwrap_err().to_string().contains("sslmode"));
    assert_eq!(DbForm::of(None).mode, DbMode::Embedded);
}

/// The form's modes keep the window's JSON names; "" (or no mode) is the embedded default,
/// and a mode this version does not know is refused by name, as an invalid setting.
#[test]
fn db_modes_keep_their_json_names() {
    for (mode, name) in [(DbMode::Embedded, "embedded"), (DbMode::Postgres, "postgres"), (DbMode::Url, "url")] {
        assert_eq!(serde_json::to_value(&mode).unwrap(), name);
        assert_eq!(serde_json::from_value::<DbMode>(name.into()).unwrap(), mode);
    }
    let form = |v: serde_json::Value| serde_json::from_value::<DbForm>(v).unwrap();
    assert_eq!(form(serde_json::json!({"mode": ""})).mode, DbMode::Embedded);
    assert_eq!(form(serde_json::json!({})).mode, DbMode::Embedded);
    let odd = form(serde_json::json!({"mode": "mysql"}));
    assert_eq!(serde_json::to_value(&odd).unwrap()["mode"], "mysql");
    let err = odd.to_url().unwrap_err();
    assert_eq!((err.kind(), err.to_string().contains("unknown database mode 'mysql'")), ("invalid", true), "{err}");
    // The status's backend is "" until the database URL is known.
    assert_eq!(serde_json::to_value(Status::default()).unwrap()["backend"], "");
}

/// A root certificate goes into the URL as `sslrootcert` (with a verifying sslmode), and
/// comes back in the form; a missing file, a relative path or a mode that would not use
/// it are refused, each with its reason.
#[test]
fn db_form_root_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("root ca.crt");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let f = DbForm {
        mode: DbMode::Postgres,
        host: "db.example".into(),
        database: "devpilot".into(),
        user: "alice".into(),
        sslmode: "verify-full".into(),
        sslrootcert: ca.display().to_string(),
        ..DbForm::default()
    };
    let u = f.to_url().unwrap().unwrap();
    assert!(u.to_string().contains("sslmode=verify-full&sslrootcert="), "{u}");
    assert_eq!(u.password(), None);
    assert_eq!(DbForm::of(Some(&u.to_string())), DbForm { port: Some(5432), ..f.clone() });
    let no_mode = DbForm { sslmode: String::new(), ..f.clone() };
    assert_eq!(DbForm::of(Some(&no_mode.to_url().unwrap().unwrap().to_string())).sslmode, "verify-full");
    let err = |g: DbForm| g.to_url().unwrap_err().to_string();
    let missing = dir.path().join("nope.crt").display().to_string();
    assert_eq!(
        err(DbForm { sslrootcert: missing.clone(), ..f.clone() }),
        format!("the root certificate {missing} does not exist")
    );
    assert!(err(DbForm { sslrootcert: "ca.crt".into(), ..f.clone() }).contains("full path"));
    assert!(err(DbForm { sslrootcert: dir.path().display().to_string(), ..f.clone() }).contains("not a file"));
    assert!(err(DbForm { sslmode: "require".into(), ..f }).contains("verify-ca or verify-full"));
}

/// A source form as the window fills it (the key is set by the tests that need one).
fn source_form() -> SourceForm {
    SourceForm {
        kind: SourceKind::Linear,
        name: String::new(),
        teams: "eng, ops ENG".into(),
        repo: String::new(),
        label: " agent ".into(),
        states: vec!["unstarted".into(), "Started".into()],
        assigned_to_me: true,
        interval: "90s".into(),
        api_url: " http://127.0.0.1:8080/graphql ".into(),
        maps_to: "webapp".into(),
        key: None,
    }
}

/// The form becomes the source the settings file holds: teams split and upper-cased once
/// each, the name from the first team, the repo for every team, and back again; what the
/// form does not show is kept from the source it replaces.
#[test]
fn source_form_maps_to_settings() {
    use devpilot_engine::sources::SourceSettings;
    let (name, s) = source_form().to_settings(&Default::default()).unwrap();
    assert_eq!(name, "eng");
    assert_eq!(s.teams, ["ENG", "OPS"]);
    assert_eq!((s.label.as_str(), s.assigned_to_me), ("agent", true));
    assert_eq!(s.states, ["unstarted", "started"]);
    assert_eq!(s.interval.get(), Duration::from_secs(90));
    assert_eq!(s.api_url.as_deref(), Some("http://127.0.0.1:8080/graphql"));
    let webapp = |t: &str| (t.to_string(), "webapp".to_string());
    assert_eq!(s.repo_by_team, [webapp("ENG"), webapp("OPS")].into());
    let back = SourceForm::of(&name, &s);
    let want = SourceForm {
        kind: SourceKind::Linear,
        name: "eng".into(),
        teams: "ENG, OPS".into(),
        repo: String::new(),
        label: "agent".into(),
        states: vec!["unstarted".into(), "started".into()],
        interval: "90s".into(),
        assigned_to_me: true,
        api_url: "http://127.0.0.1:8080/graphql".into(),
        maps_to: "webapp".into(),
        key: None,
    };
    assert_eq!(back, want);
    // Empty fields: the defaults (Linear's address, no repo).
    let mut plain = source_form();
    (plain.name, plain.interval, plain.api_url, plain.maps_to) = ("mine".into(), "".into(), "".into(), "".into());
    let (name, s) = plain.to_settings(&Default::default()).unwrap();
    assert_eq!((name.as_str(), s.interval.get(), s.api_url.clone()), ("mine", Duration::from_secs(60), None));
    assert!(s.repo_by_team.is_empty());
    // Replacing a source keeps what only the file says, and an empty interval keeps its own.
    let mut kept = SourceSettings { requires_prefix: "gpu:".into(), interval: "5m".parse().unwrap(), ..s };
    kept.report.completed_state = "In Review".into();
    let (_, s) = plain.to_settings(&[("mine".to_string(), kept)].into()).unwrap();
    assert_eq!((s.requires_prefix.as_str(), s.report.completed_state.as_str()), ("gpu:", "In Review"));
    assert_eq!(s.interval.to_string(), "5m");
}

/// Each mistake in the form is refused with what is wrong and what to do.
#[test]
fn source_form_says_what_is_wrong() {
    let err = |f: SourceForm| f.to_settings(&Default::default()).unwrap_err().to_string();
    let mut f = source_form();
    f.states = vec!["unstarted".into(), "doing".into()];
    let e = err(f);
    assert!(e.contains("'doing' is not a state type") && e.contains("unstarted, started"), "{e}");
    let mut f = source_form();
    (f.name, f.teams) = ("eng".into(), " , ".into());
    assert_eq!(err(f), "source 'eng': name at least one team key (teams = [\"ENG\"])");
    let mut f = source_form();
    f.teams = String::new();
    assert!(err(f).contains("give the source a name"));
    let mut f = source_form();
    f.interval = "10s".into();
    assert_eq!(err(f), "source 'eng': the interval 10s is shorter than the minimum of 15s");
    let mut f = source_form();
    f.interval = "soon".into();
    assert!(err(f).contains("'soon' is not a duration"));
    let mut f = source_form();
    f.states = vec![];
    assert!(err(f).contains("choose at least one state type"));
    let mut f = source_form();
    f.api_url = "http://linear.example/graphql".into();
    assert!(err(f).contains("must be https"));
    let mut f = source_form();
    f.teams = "ENG-1".into();
    assert!(err(f).contains("'ENG-1' is not a team key"));
}

/// The key never shows when the form is printed, and never travels back to the window.
#[test]
fn source_form_hides_its_key() {
    let mut f = source_form();
    f.key = Some("lin_api_secret_for_test".into());
    assert!(!format!("{f:?}").contains("lin_api_secret"), "{f:?}");
    assert!(format!("{f:?}").contains("key: Some(\"***\")"));
    assert!(serde_json::to_value(&f).unwrap().get("key").is_none());
    let sent: SourceForm = serde_json::from_value(serde_json::json!({"teams": "ENG", "key": "k1"})).unwrap();
    assert_eq!((sent.key.as_deref(), sent.label.as_str()), (Some("k1"), ""));
}

/// A GitHub source from the form: its repo, its name from the repo's, the DevPilot repo it
/// maps to, and back; the Linear-only fields play no part. A Linear source of that name is
/// replaced whole, and each mistake is said.
#[test]
fn github_source_form_maps_to_settings() {
    use devpilot_engine::sources::SourceSettings;
    let form: SourceForm = serde_json::from_value(serde_json::json!({
        "kind": "github", "repo": " acme/Web.App ", "label": "agent", "teams": "ENG", "states": ["triage"],
        "assigned_to_me": true, "interval": "30s", "maps_to": "webapp", "api_url": "http://127.0.0.1:9/", "key": "ghp_x"
    }))
    .unwrap();
    let linear = SourceSettings { requires_prefix: "gpu:".into(), ..Default::default() };
    let (name, s) = form.to_settings(&[("web-app".to_string(), linear)].into()).unwrap();
    assert_eq!(
        (name.as_str(), s.kind, s.repo.as_str(), s.label.as_str()),
        ("web-app", SourceKind::Github, "acme/Web.App", "agent")
    );
    // The Linear source of that name is not what it keeps from ("gpu:" is its).
    assert!(s.teams.is_empty() && s.repo_by_team.is_empty() && s.requires_prefix == "needs:", "{s:?}");
    assert_eq!((s.maps_to.as_str(), s.assigned_to_me, s.interval.to_string()), ("webapp", true, "30s".into()));
    assert_eq!(s.api_url(), "http://127.0.0.1:9");
    let back = SourceForm::of(&name, &s);
    assert_eq!(
        (back.kind, back.repo.as_str(), back.maps_to.as_str(), back.teams.as_str()),
        (SourceKind::Github, "acme/Web.App", "webapp", "")
    );
    assert_eq!(serde_json::to_value(&back).unwrap()["kind"], "github");
    assert!(back.key.is_none());
    let err = |repo: &str, name: &str| {
        let mut f = SourceForm::default();
        (f.kind, f.repo, f.name) = (SourceKind::Github, repo.into(), name.into());
        f.to_settings(&Default::default()).unwrap_err().to_string()
    };
    assert!(
        err("acme", "webapp").contains("'acme' is not a GitHub repository; name it as OWNER/REPO"),
        "{}",
        err("acme", "webapp")
    );
    assert!(err("", "").contains("its repository as OWNER/REPO"), "{}", err("", ""));
}

/// Where a source's key comes from, on its line; what Import from gh says.
#[test]
fn key_notes_and_gh_import_messages() {
    use devpilot_engine::sources::{HealthState, SourceHealth, SourceSettings};
    let gh = SourceSettings { kind: SourceKind::Github, repo: "acme/webapp".into(), ..Default::default() };
    assert_eq!(key_note(&gh, None, Some("keychain (imported from gh)")), " · token from keychain (imported from gh)");
    assert_eq!(key_note(&gh, None, None), " · no GitHub token on this machine");
    let ghe = SourceSettings { api_url: Some("https://ghe.corp:8443/api/v3".into()), ..gh.clone() };
    assert_eq!(key_note(&ghe, None, None), " · no GitHub token for ghe.corp:8443 on this machine");
    let no_key = SourceHealth { state: HealthState::NoKey, ..Default::default() };
    assert_eq!(key_note(&gh, Some(&no_key), None), "", "the line says it already");
    assert_eq!(key_note(&SourceSettings::default(), None, Some("LINEAR_API_KEY")), " · API key from LINEAR_API_KEY");
    assert!(imported(Some("GITHUB_TOKEN")).contains("uses GITHUB_TOKEN while that is set"));
    assert!(imported(Some("keychain (imported from gh)")).ends_with("(token from keychain (imported from gh))."));
    assert!(gh_gave_nothing(false).contains("not installed") && gh_gave_nothing(true).contains("gh auth login"));
    let dir = tempfile::tempdir().unwrap();
    assert!(!on_path("gh", Some(dir.path().as_os_str())) && !on_path("gh", None));
    std::fs::write(dir.path().join("gh"), "#!/bin/sh\n").unwrap();
    let path = std::env::join_paths(["/nonexistent".into(), dir.path().to_path_buf()]).unwrap();
    assert!(on_path("gh", Some(&path)));
}

/// The health line: how the source is doing here, and the fleet's last poll.
#[test]
fn source_health_line() {
    use devpilot_engine::sources::{HealthState, PollReport, SourceHealth, SourceSettings};
    use devpilot_store::queue::SourceRow;
    let s = SourceSettings { teams: vec!["ENG".into()], ..Default::default() };
    let added = (1..=3).map(|i| (format!("linear:ENG-{i}"), i)).collect();
    let ok = SourceHealth {
        name: "eng".into(),
        state: HealthState::Ok,
        last_poll: Some(PollReport { added, ..Default::default() }),
        ..Default::default()
    };
    let row = SourceRow {
        id: 1,
        name: "eng".into(),
        kind: "linear".into(),
        filter: String::new(),
        interval_ms: 60_000,
        cursor: None,
        etag: None,
        turn: 4,
        polled_at: Some(1_000_000),
        polled_by: Some("desktop".into()),
        hold_until: None,
        last_ok_at: None,
        last_error: None,
        last_error_at: None,
        rate_remaining: None,
        rate_reset_at: None,
        backlog: 0,
        notice: None,
        refused: 0,
        refusal: None,
        now: 1_020_000,
    };
    let line =
        |h: Option<&SourceHealth>, r: Option<&SourceRow>, s: &SourceSettings| health_line("eng", s, h, r, "desktop");
    assert_eq!(
        line(Some(&ok), Some(&row), &s),
        ("eng (linear): OK — last poll 20s ago by desktop, 3 jobs added".into(), true)
    );
    let elsewhere = SourceRow { polled_by: Some("laptop".into()), backlog: 2, ..row.clone() };
    assert_eq!(
        line(Some(&ok), Some(&elsewhere), &s).0,
        "eng (linear): OK — last poll 20s ago by laptop · 2 updates waiting to reach the issues"
    );
    // An edit after approval and a refused outbox row are told on the line, with their reason.
    let told = SourceRow {
        notice: Some("linear:ENG-7: edited after approval; label it again to run the new text".into()),
        refused: 2,
        refusal: Some("the job names team OPS, not one of this source's teams".into()),
        ..row.clone()
    };
    assert_eq!(
        line(Some(&ok), Some(&told), &s).0,
        "eng (linear): OK — last poll 20s ago by desktop, 3 jobs added \
         · linear:ENG-7: edited after approval; label it again to run the new text \
         · 2 updates refused, acting on nothing: the job names team OPS, not one of this source's teams"
    );
    let wrong = SourceHealth { state: HealthState::WrongKey, message: Some("Linear refused the API key".into()), ..ok };
    let failed = SourceRow { last_error: Some("desktop: Linear refused the API key".into()), ..row.clone() };
    assert_eq!(
        line(Some(&wrong), Some(&failed), &s),
        (
            "eng (linear): wrong key: Linear refused the API key — last poll 20s ago by desktop, 3 jobs added".into(),
            false
        )
    );
    assert_eq!(line(None, Some(&failed), &s).0, "eng (linear): not running here — last poll 20s ago by desktop · last error: desktop: Linear refused the API key");
    let fresh = SourceRow { polled_at: None, polled_by: None, ..row };
    assert_eq!(line(None, Some(&fresh), &s).0, "eng (linear): not running here — not polled yet");
    let off = SourceSettings { enabled: false, ..s.clone() };
    assert_eq!(line(None, None, &off), ("eng (linear): off on this machine".into(), false));
    assert_eq!(line(None, None, &s).0, "eng (linear): not running here — not registered yet");
}

/// A source saved from the window lands in the settings file (never a key), is listed with
/// its form and the machine's health, reaches the running machine, and goes when removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_are_saved_listed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let e = Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_millis(100));
    e.start().await;
    wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
    let mut f = source_form();
    // A short interval: the machine's sources service takes new settings at its next tick,
    // a quarter of the shortest interval (at least 5s).
    (f.maps_to, f.interval) = (String::new(), "20s".into());
    let before = std::fs::read_to_string(p.config_file()).unwrap();
    let mut bad = source_form();
    bad.interval = "1s".into();
    assert!(e.save_source(bad).await.unwrap_err().to_string().contains("minimum of 15s"));
    assert_eq!(std::fs::read_to_string(p.config_file()).unwrap(), before, "nothing saved");
    let view = e.save_source(f).await.unwrap();
    assert_eq!(p.load().unwrap().sources["eng"].teams, ["ENG", "OPS"]);
    assert_eq!(view.sources.len(), 1, "{view:?}");
    assert_eq!((view.sources[0].name.as_str(), view.sources[0].form.teams.as_str()), ("eng", "ENG, OPS"));
    assert!(view.db_error.is_none(), "{view:?}");
    // The machine took the source live: its status shows it.
    wait_for(&e, "the source in the status", |s| s.sources.iter().any(|h| h.name == "eng")).await;
    let err = e.remove_source("nope").await.unwrap_err().to_string();
    assert_eq!(err, "there is no source named 'nope' in the settings");
    let view = e.remove_source("eng").await.unwrap();
    assert!(view.sources.is_empty());
    assert!(!std::fs::read_to_string(p.config_file()).unwrap().contains("[sources.eng]"));
    e.stop(StopMode::HandOff).await;
}

/// A repo added as the window adds it pushes and opens a draft PR with no edit of the file,
/// and its row says so; its switches turn push off (the row then says what that costs); it
/// cannot be removed while a source sends its jobs there, and can once none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repo_added_in_the_window_pushes_and_opens_a_draft_pr() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let clone = dir.path().join("webapp");
    let git = |args: &[&str]| {
        assert!(std::process::Command::new("git").args(args).current_dir(&clone).status().unwrap().success())
    };
    std::fs::create_dir_all(&clone).unwrap();
    git(&["init", "-q"]);
    git(&["remote", "add", "origin", "https://github.com/acme/webapp.git"]);
    let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
    e.start().await;
    e.add_repo("webapp", &clone.to_string_lossy()).await.unwrap();
    let saved = p.load().unwrap().repos["webapp"].clone();
    assert!(saved.push && saved.pull_request == devpilot_engine::worktree::PrMode::Draft, "{saved:?}");
    let views = e.repo_views().await;
    assert_eq!(views[0].github.as_deref(), Some("acme/webapp"));
    assert_eq!(views[0].line, "a finished job pushes its branch and opens a draft pull request on acme/webapp");
    let off = RepoSwitches { push: false, pull_request: devpilot_engine::worktree::PrMode::Draft };
    e.set_repo("webapp", off).await.unwrap();
    assert!(!p.load().unwrap().repos["webapp"].push);
    assert!(e.repo_views().await[0].line.starts_with("does not push on completion"));
    let mut file = p.load().unwrap();
    let source = devpilot_engine::sources::SourceSettings {
        kind: SourceKind::Github,
        repo: "acme/webapp".into(),
        maps_to: "webapp".into(),
        ..Default::default()
    };
    file.sources.insert("gh".into(), source);
    p.save(&file).unwrap();
    let refused = e.remove_repo("webapp").await.unwrap_err().to_string();
    assert!(refused.contains("source 'gh' runs its jobs in repo 'webapp'"), "{refused}");
    file.sources.clear();
    p.save(&file).unwrap();
    e.remove_repo("webapp").await.unwrap();
    assert!(p.load().unwrap().repos.is_empty() && clone.exists(), "out of the settings; the clone stays");
    assert!(e.remove_repo("webapp").await.is_err(), "a repo that is not there is said");
    e.stop(StopMode::HandOff).await;
}

/// A hand-off answers with its verdict once its jobs are released: a demo job (no worktree,
/// nothing to carry) makes "Safe to close the lid", kept until claiming resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_says_safe_to_close_the_lid() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let e = Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_secs(60));
    let mut ev = e.subscribe();
    e.start().await;
    wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
    let id = e.enqueue_demo().await.unwrap();
    wait_event(&mut ev, |x| matches!(x, Event::Claimed { job } if job.id == id)).await;
    let v = e.hand_off(true).await.unwrap();
    assert_eq!(v.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [id]);
    assert!(v.safe && v.paused, "{v:?}");
    assert_eq!(v.text, format!("Handed off #{id}. Claiming is paused. Safe to close the lid."));
    assert_eq!(e.last_hand_off(), Some(v));
    e.resume().unwrap();
    assert_eq!(e.last_hand_off(), None, "claiming resumed: the verdict is over");
    e.stop(StopMode::HandOff).await;
}

/// A hand-off before sleep that does not finish within the sleep delay publishes at once a red
/// verdict naming the job still here; the hand-off carries on, and its own verdict follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_hand_off_before_sleep_says_what_stayed() {
    let dir = tempfile::tempdir().unwrap();
    let p = paths(dir.path());
    fast(&p);
    let e = Engine::with_demo_duration(p.clone(), "devpilot-test", Overrides::default(), Duration::from_secs(60));
    let mut ev = e.subscribe();
    e.start().await;
    wait_for(&e, "idle", |s| s.state == MachineState::Idle).await;
    let id = e.enqueue_demo().await.unwrap();
    wait_event(&mut ev, |x| matches!(x, Event::Claimed { job } if job.id == id)).await;
    wait_for(&e, "running", |s| !s.running.is_empty()).await;
    let mut verdicts = e.watch_hand_off();
    assert_eq!(e.prepare_for_sleep_within(Duration::ZERO).await, None, "not within no time at all");
    let red = verdicts.borrow_and_update().clone().expect("a verdict at once");
    assert!(!red.safe && red.before_sleep && red.text.contains(&format!("#{id} ")), "{red:?}");
    assert!(red.text.contains("took longer than 0s before sleep"), "{}", red.text);
    tokio::time::timeout(Duration::from_secs(20), verdicts.wait_for(|v| v.as_ref().is_some_and(|v| v.safe)))
        .await
        .expect("the hand-off's own verdict follows")
        .unwrap();
    e.stop(StopMode::HandOff).await;
}
