//! The real agent CLIs (claude 2.1.332, codex 0.171.0, gemini 0.61.0, aider 0.86.2, installed
//! pinned by `scripts/agent_clis.sh`), end to end and offline: real `devpilot run` processes
//! run the presets in real git worktrees against the scripted model server on loopback
//! ([`ModelServer`]), which speaks each provider's wire protocol and records every request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_tests::clis::{cli_root, codex_config, job, wait_state, Machine};
use devpilot_tests::model_server::Recorded;
use devpilot_tests::*;
use serde_json::json;

/// Every text the model was sent in one request, flattened.
fn texts(r: &Recorded) -> String {
    r.body.to_string()
}

/// A repo on a bare remote, and a job for it with a prompt.
fn job_on_a_repo(db: &TestDb, orch: &str, prompt: &str) -> (GitRemote, PathBuf, PathBuf, i64) {
    let remote = GitRemote::new(db.dir.path());
    let clone_a = remote.clone_to(&db.dir.path().join("laptop-src/webapp"));
    let clone_b = remote.clone_to(&db.dir.path().join("desktop-src/webapp"));
    let home = db.dir.path().join("producer");
    write_config(&home, "");
    let id = enqueue(
        &home,
        db,
        orch,
        &["--title", "ENG-9 Write the notes", "--prompt", prompt, "--repo", "webapp", "--max-attempts", "1"],
    );
    (remote, clone_a, clone_b, id)
}

/// The real claude edits a file in the job's worktree with its Write tool; the job completes
/// with the model's final text as its summary, the cost and tokens claude reported, and its
/// session id; the branch is pushed with the file. The model saw the prompt once, and no
/// payload JSON (stdin is empty for a preset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_makes_a_real_edit() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("claude-edit"), cli_root(), ModelServer::start().unwrap());
    let (remote, clone, _, id) = job_on_a_repo(&db, &orch, "Write hello.txt saying hi.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone, &model, "");
    let wt = worktree_of(&laptop.home, &orch, id);
    let file = wt.join("hello.txt").display().to_string();
    model.script([
        Turn::Tool { name: "Write".into(), input: json!({"file_path": file, "content": "hi from the model\n"}) },
        Turn::Text("I wrote hello.txt.".into()),
    ]);
    let _a = laptop.run(&db, &orch, "claude", &[]);
    let row = wait_state(&db, id, &[JobState::Completed], Duration::from_secs(60)).await;
    ran_confined(&db, id).await;
    assert_eq!(row.summary.as_deref(), Some("I wrote hello.txt."));
    let branch = format!("devpilot/{id}-eng-9-write-the-notes");
    assert_eq!(remote.show(&branch, "hello.txt").as_deref(), Some("hi from the model\n"));
    assert_eq!(row.agent.agent.as_deref(), Some("claude"));
    assert!(row.agent.cost_usd.is_some_and(|c| c > 0.0), "{:?}", row.agent);
    assert!(row.agent.tokens_in.is_some_and(|t| t > 0) && row.agent.tokens_out.is_some_and(|t| t > 0));
    let session = row.agent.agent_session.clone().expect("the session id");
    assert!(laptop.cli_home.join(".claude/projects").exists());
    let main = model.main_requests();
    assert_eq!(main.len(), 2, "a tool call, then the final text");
    let first = texts(&main[0]);
    assert_eq!(first.matches("Write hello.txt saying hi.").count(), 1, "the prompt once: {first}");
    assert!(!first.contains("\\\"title\\\"") && !first.contains("ENG-9 Write the notes\\\""), "no payload JSON");
    assert!(main[0].headers.iter().any(|(k, v)| k == "x-claude-code-session-id" && *v == session));
    // Its log is a transcript streamed as it worked (stream-json): the start, the Write call
    // and its result, and the result object the outcome was read from, one event a line.
    let log = find_file(&laptop.home, &format!("job-{id}.log")).expect("the job's log");
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("type").is_some())
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|v| v["type"].as_str()).collect();
    let wrote = events.iter().any(|v| v["type"] == "assistant" && v.to_string().contains("\"name\":\"Write\""));
    assert!(kinds.first() == Some(&"system") && wrote && kinds.last() == Some(&"result"), "{kinds:?}");
    assert!(kinds.len() >= 4, "one event a line, as claude worked: {kinds:?}");
}

/// The file named `name` under `dir`, at any depth.
fn find_file(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// The real codex edits a file through its `exec` tool in the job's worktree; the job
/// completes with its last agent message, its tokens and its thread id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_makes_a_real_edit() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("codex-edit"), cli_root(), ModelServer::start().unwrap());
    let (remote, clone, _, id) = job_on_a_repo(&db, &orch, "Write hello.txt saying hi.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone, &model, "");
    let js = "const r = await tools.exec_command({cmd: \"printf 'hi from codex\\\\n' > hello.txt\"});\ntext(r);";
    model.script([Turn::Tool { name: "exec".into(), input: json!(js) }, Turn::Text("hello.txt is written.".into())]);
    let _a = laptop.run(&db, &orch, "codex", &[]);
    let row = wait_state(&db, id, &[JobState::Completed], Duration::from_secs(90)).await;
    ran_confined(&db, id).await;
    assert_eq!(row.summary.as_deref(), Some("hello.txt is written."));
    let branch = format!("devpilot/{id}-eng-9-write-the-notes");
    assert_eq!(remote.show(&branch, "hello.txt").as_deref(), Some("hi from codex\n"));
    assert_eq!(row.agent.agent.as_deref(), Some("codex"));
    assert!(row.agent.tokens_in.is_some_and(|t| t > 0), "{:?}", row.agent);
    let thread = row.agent.agent_session.clone().expect("the thread id");
    let first = texts(&model.main_requests()[0]);
    assert_eq!(first.matches("Write hello.txt saying hi.").count(), 1, "the prompt once");
    assert!(model.main_requests()[0].headers.iter().any(|(_, v)| *v == thread));
}

/// The laptop's claude writes part 1 and is waiting on the model when the laptop hands the
/// job off; the desktop claims it, restores the conversation under its own worktree path
/// and resumes it: its first request carries the laptop's turn 1 (the Write of part 1).
/// The desktop writes part 2 and hands off in turn; the tablet's first request carries both
/// turns (the session the desktop continued travels, not the copy it was given). The tablet
/// writes part 3 and completes; history says the session was carried and resumed, with
/// sizes, and the job says it resumed from the desktop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claude_conversation_travels() {
    conversation_travels("claude", |wt, part| Turn::Tool {
        name: "Write".into(),
        input: json!({"file_path": wt.join(format!("part{part}.txt")), "content": format!("part {part}\n")}),
    })
    .await;
}

/// The same hand-off with codex: the desktop's first request carries the laptop's `exec`
/// call that wrote part 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_codex_conversation_travels() {
    conversation_travels("codex", |_, part| Turn::Tool {
        name: "exec".into(),
        input: json!(format!(
            "const r = await tools.exec_command({{cmd: \"printf 'part {part}\\\\n' > part{part}.txt\"}});\ntext(r);"
        )),
    })
    .await;
}

/// The same hand-off with gemini: its session file is carried and loaded on the desktop
/// with `--session-file`; the desktop's first request carries the laptop's `write_file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gemini_conversation_travels() {
    conversation_travels("gemini", |wt, part| Turn::Tool {
        name: "write_file".into(),
        input: json!({"file_path": wt.join(format!("part{part}.txt")), "content": format!("part {part}\n")}),
    })
    .await;
}

async fn conversation_travels(preset: &str, write: impl Fn(&Path, u32) -> Turn) {
    let db = TestDb::new(Backend::Postgres).await;
    let (orch, root, model) = (db.orch(&format!("{preset}-travels")), cli_root(), ModelServer::start().unwrap());
    let (remote, clone_a, clone_b, id) = job_on_a_repo(&db, &orch, "Write part1.txt, part2.txt, then part3.txt.");
    let clone_c = remote.clone_to(&db.dir.path().join("tablet-src/webapp"));
    let laptop = Machine::new(&db, root.path(), "laptop", &clone_a, &model, "");
    let desktop = Machine::new(&db, root.path(), "desktop", &clone_b, &model, "");
    let tablet = Machine::new(&db, root.path(), "tablet", &clone_c, &model, "");
    let wt = |m: &Machine| worktree_of(&m.home, &orch, id);
    model.script([write(&wt(&laptop), 1), Turn::Hold(Duration::from_secs(120))]);
    let a = laptop.run(&db, &orch, preset, &[]);
    holding(&model, 2, preset).await;
    assert!(wt(&laptop).join("part1.txt").exists());
    let b = desktop.run(&db, &orch, preset, &[]);
    model.script([write(&wt(&desktop), 2), Turn::Hold(Duration::from_secs(120))]);
    hand_off(&db, &orch, &desktop, "laptop");
    holding(&model, 4, preset).await;
    assert!(wt(&desktop).join("part2.txt").exists());
    let c = tablet.run(&db, &orch, preset, &[]);
    model.script([write(&wt(&tablet), 3), Turn::Text("All three parts are written.".into())]);
    hand_off(&db, &orch, &tablet, "desktop");
    let row = wait_state(&db, id, &[JobState::Completed], Duration::from_secs(90)).await;

    let main = model.main_requests();
    let (desktop_first, tablet_first) = (texts(&main[2]), texts(&main[4]));
    assert!(desktop_first.contains("part 1") && desktop_first.contains("part1.txt"), "turn 1 arrived: {desktop_first}");
    assert!(!desktop_first.contains(&wt(&laptop).display().to_string()), "the worktree path was rewritten");
    for part in ["part 1", "part1.txt", "part 2", "part2.txt"] {
        assert!(tablet_first.contains(part), "the desktop's session travelled on, with {part}: {tablet_first}");
    }
    assert_eq!(row.summary.as_deref(), Some("All three parts are written."));
    assert_eq!(row.agent.session_from.as_deref(), Some("desktop"));
    let branch = format!("devpilot/{id}-eng-9-write-the-notes");
    for part in 1..=3 {
        assert_eq!(remote.show(&branch, &format!("part{part}.txt")), Some(format!("part {part}\n")));
    }
    let history = db.queue.history(id).await.unwrap();
    let carried: Vec<_> = history.iter().filter(|e| e.kind == "session_carried").collect();
    let resumed: Vec<_> = history.iter().filter(|e| e.kind == "session_resumed").collect();
    eprintln!("{preset}: {carried:?} / {resumed:?}");
    assert_eq!((carried.len(), resumed.len()), (2, 2), "two hand-offs, each carried and resumed");
    assert!(carried.iter().all(|e| e.detail.as_deref().is_some_and(|d| d.contains("KiB raw"))), "{carried:?}");
    for (e, from) in resumed.iter().zip(["from laptop", "from desktop"]) {
        assert!(e.detail.as_deref().is_some_and(|d| d.contains(from)), "{e:?}");
    }
    // The check below finds nothing in a directory that is not there: the restored
    // session's own directory must be.
    let own = match preset {
        "claude" => ".claude/projects",
        "codex" => ".codex/sessions",
        _ => ".gemini/tmp",
    };
    for m in [&desktop, &tablet] {
        assert!(m.cli_home.join(own).is_dir(), "{preset}'s sessions on {} are where the check looks", m.name);
    }
    if preset == "gemini" {
        // gemini streams its events (stream-json): the tablet's log is a transcript of its
        // start, its write_file call and its result, one event a line.
        let log = find_file(&tablet.home, &format!("job-{id}.log")).expect("the tablet's log");
        let text = std::fs::read_to_string(&log).unwrap();
        let kinds: Vec<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["type"].as_str().map(str::to_string))
            .collect();
        let has = |k: &str| kinds.iter().any(|x| x == k);
        assert!(has("init") && has("tool_use") && kinds.last().map(String::as_str) == Some("result"), "{kinds:?}");
    }
    for key in ["sk-ant-test-key", "sk-test-key", "gemini-test-key"] {
        // Where the sessions go (codex's shell snapshots, with its environment, stay local).
        for dir in [".claude/projects", ".codex/sessions", ".gemini/tmp"] {
            for m in [&desktop, &tablet] {
                assert_eq!(holder(&m.cli_home.join(dir), key), None, "no API key travels");
            }
        }
    }
    drop((a, b, c));
}

/// A hand-off pushes the work while it saves the conversation: with the machine's database
/// silent (a slow link at its worst), the branch reaches the remote before the save can
/// finish; once the database answers, the session is saved and the job released, safe.
/// Before, the push waited for the save: on a slow link their times added up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_pushes_while_the_conversation_is_saved() {
    let db = TestDb::new(Backend::Postgres).await;
    let (orch, root, model) = (db.orch("carry-beside"), cli_root(), ModelServer::start().unwrap());
    let (remote, clone_a, _, id) = job_on_a_repo(&db, &orch, "Write part1.txt, then wait.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone_a, &model, "");
    let pg = shared_pg();
    let fwd = Forwarder::start(([127, 0, 0, 1], pg.port).into());
    let name = db.raw_url.rsplit('/').next().unwrap();
    let url = format!("postgres://postgres:{}@127.0.0.1:{}/{name}", pg.password, fwd.port());
    let wt = worktree_of(&laptop.home, &orch, id);
    model.script([
        Turn::Tool { name: "Write".into(), input: json!({"file_path": wt.join("part1.txt"), "content": "part 1\n"}) },
        Turn::Hold(Duration::from_secs(120)),
    ]);
    let a = laptop.run_on(&url, &orch, "claude", &[]);
    holding(&model, 2, "claude").await;
    fwd.silence();
    let (home, asked_orch) = (laptop.home.clone(), orch.clone());
    let handoff = std::thread::spawn(move || {
        run_cli(&home, "postgres://unused@127.0.0.1:1/x", &["handoff", "--orchestrator", &asked_orch, "--json"], None)
    });
    let branch = format!("devpilot/{id}-eng-9-write-the-notes");
    let pushed = wait_for(Duration::from_secs(30), || async { remote.show(&branch, "part1.txt").is_some() }).await;
    let saved_before = db.queue.load_session(id).await.unwrap().is_some();
    fwd.open();
    assert!(pushed, "the work reached the remote while the save waited on the database");
    assert!(!saved_before, "the save could not have finished: the database was silent");
    let (code, out, err) = handoff.join().unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let verdict: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((verdict["safe"].as_bool(), verdict["jobs"][0]["branch"].as_str()), (Some(true), Some(&*branch)));
    assert!(db.queue.load_session(id).await.unwrap().is_some(), "the conversation was saved once it could be");
    let row = job(&db, id).await;
    assert_eq!((row.state, row.resume_branch.as_deref()), (JobState::Queued, Some(&*branch)), "released");
    drop(a);
}

/// Waits until the model has had `n` requests: the agent wrote its part and waits on it.
async fn holding(model: &ModelServer, n: usize, preset: &str) {
    let got = wait_for(Duration::from_secs(60), || async { model.main_requests().len() >= n }).await;
    assert!(got, "the {preset} agent wrote its part and waits on the model");
}

/// `devpilot release` of `machine`'s jobs, run on `on`, waiting for the hand-off.
fn hand_off(db: &TestDb, orch: &str, on: &Machine, machine: &str) {
    let args = ["release", "--orchestrator", orch, "--machine", machine, "--wait", "30s"];
    let (code, out, err) = run_cli(&on.home, &db.raw_url, &args, None);
    assert_eq!(code, 0, "{out}{err}");
}

/// The first file below `dir` that holds `text`.
fn holder(dir: &Path, text: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries.flatten().find_map(|e| match e.file_type() {
        Ok(t) if t.is_dir() => holder(&e.path(), text),
        Ok(t) if t.is_file() => {
            std::fs::read(e.path()).is_ok_and(|b| String::from_utf8_lossy(&b).contains(text)).then(|| e.path())
        }
        _ => None,
    })
}

/// aider exits 0 when its model call fails: with the key rejected (401), the attempt fails
/// with aider's own error line, never completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_with_a_rejected_key_fails() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("aider-401"), cli_root(), ModelServer::start().unwrap());
    let (_remote, clone, _, id) = job_on_a_repo(&db, &orch, "Write hello.txt.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone, &model, AIDER_SETTINGS);
    model.script([unauthorized()]);
    let _a = laptop.run(&db, &orch, "aider", &[]);
    let row = wait_state(&db, id, &[JobState::Dead, JobState::Failed], Duration::from_secs(90)).await;
    let error = row.last_error.unwrap_or_default();
    assert!(error.starts_with("aider: ") && error.to_lowercase().contains("authenticat"), "{error}");
}

/// The aider preset's settings: a model litellm sends to the OpenAI-compatible server.
const AIDER_SETTINGS: &str =
    "[agents.aider]\nargs = [\"--model\", \"openai/test-model\", \"--no-show-model-warnings\"]\n";

/// A 401 as each provider sends one.
fn unauthorized() -> Turn {
    Turn::Error {
        status: 401,
        headers: vec![],
        body: json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}}),
    }
}

/// aider's hand-off commit carries its work but none of its own files (`.aider*`) and no
/// `.gitignore` change; its chat history is carried to the desktop and restored there
/// (`--restore-chat-history`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_hands_off_clean_and_carries_its_history() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("aider-clean"), cli_root(), ModelServer::start().unwrap());
    let (remote, clone_a, clone_b, id) = job_on_a_repo(&db, &orch, "Say hello.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone_a, &model, AIDER_SETTINGS);
    let desktop = Machine::new(&db, root.path(), "desktop", &clone_b, &model, AIDER_SETTINGS);
    let wt_a = worktree_of(&laptop.home, &orch, id);
    model.script([Turn::Hold(Duration::from_secs(120))]);
    let a = laptop.run(&db, &orch, "aider", &[]);
    assert!(wait_for(Duration::from_secs(60), || async { !model.main_requests().is_empty() }).await);
    std::fs::write(wt_a.join("notes.txt"), "work in progress\n").unwrap();
    assert!(wt_a.join(".aider.chat.history.md").exists(), "aider keeps its history in the worktree");
    let b = desktop.run(&db, &orch, "aider", &[]);
    model.script([Turn::Text("Hello!".into())]);
    let (code, out, err) = run_cli(
        &desktop.home,
        &db.raw_url,
        &["release", "--orchestrator", &orch, "--machine", "laptop", "--wait", "30s"],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    wait_state(&db, id, &[JobState::Completed], Duration::from_secs(90)).await;
    let branch = format!("devpilot/{id}-eng-9-write-the-notes");
    let files = git(&clone_a, &["ls-tree", "-r", "--name-only", &format!("origin/{branch}")]);
    assert!(files.contains("notes.txt"), "{files}");
    assert!(!files.contains(".aider"), "no aider file in the commits: {files}");
    let changed = git(&clone_a, &["diff", "--name-only", "origin/main", &format!("origin/{branch}")]);
    assert!(!changed.contains(".gitignore"), "{changed}");
    let history = db.queue.history(id).await.unwrap();
    assert!(history.iter().any(|e| e.kind == "session_resumed"), "{history:?}");
    let desktop_first = texts(&model.main_requests()[1]);
    assert_eq!(desktop_first.matches("Say hello.").count(), 2, "the laptop's message came back: {desktop_first}");
    let _ = remote;
    drop((a, b));
}

/// codex never gives up on an API it cannot reach ("Reconnecting... waiting for network"):
/// the API watchdog ends the attempt within `api_timeout`, with a message that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_with_its_api_unreachable_ends_within_the_bound() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("codex-dead"), cli_root(), ModelServer::start().unwrap());
    let (_remote, clone, _, id) = job_on_a_repo(&db, &orch, "Write hello.txt.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone, &model, "[agents.codex]\napi_timeout = \"4s\"\n");
    let closed = format!("http://127.0.0.1:{}", free_port());
    codex_config(&laptop.cli_home, &closed);
    let started = std::time::Instant::now();
    // Unconfined: in DevPilot's sandbox an unreachable allowed host is a reset connection,
    // which codex reports at once; unconfined, a refused one makes it retry forever.
    let _a = laptop.run(&db, &orch, "codex", &["--sandbox", "off"]);
    // Failed, or parked when this machine has no network at all (as in CI here).
    assert!(
        wait_for(Duration::from_secs(60), || async {
            db.queue.history(id).await.unwrap().iter().any(|e| ["parked", "failed", "dead"].contains(&e.kind.as_str()))
        })
        .await,
        "the attempt ended"
    );
    let took = started.elapsed();
    let row = job(&db, id).await;
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("could not reach its model API for 4s"), "{error}");
    assert!(took < Duration::from_secs(40), "ended within the bound: {took:?}");
}

/// A usage limit parks the job rather than failing it, and the retry on the same machine
/// continues the conversation: claude writes part 1, meets a 429 (parked, its session
/// saved); the retry resumes the session, and its first request carries the Write of part 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_limit_parks_and_the_retry_resumes_the_conversation() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("claude-429"), cli_root(), ModelServer::start().unwrap());
    let (_remote, clone, _, id) = job_on_a_repo(&db, &orch, "Write part1.txt, then finish.");
    let extra = "[agents.claude.env]\nCLAUDE_CODE_MAX_RETRIES = \"0\"\n";
    let laptop = Machine::new(&db, root.path(), "laptop", &clone, &model, extra);
    let wt = worktree_of(&laptop.home, &orch, id);
    model.script([
        Turn::Tool { name: "Write".into(), input: json!({"file_path": wt.join("part1.txt"), "content": "part 1\n"}) },
        Turn::Error {
            status: 429,
            headers: vec![("retry-after".into(), "3600".into())],
            body: json!({"type": "error", "error": {"type": "rate_limit_error", "message": "usage limit"}}),
        },
    ]);
    let _a = laptop.run(&db, &orch, "claude", &[]);
    let parked = || async { db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "parked") };
    assert!(wait_for(Duration::from_secs(60), parked).await, "the 429 parks the job");
    let row = job(&db, id).await;
    assert_eq!((row.state, row.attempts), (JobState::Queued, 0), "parked, the attempt not counted");
    assert!(row.last_error.as_deref().is_some_and(|e| e.contains("claude hit a usage limit")), "{row:?}");
    model.script([Turn::Text("Resumed and finished.".into())]);
    // Its account is held until the reset, on this machine as on every other.
    db.exec(&format!("UPDATE account_holds SET until_at = until_at - {}", 4 * 3_600_000)).await;
    db.age_wait(id, Duration::from_secs(4 * 3600)).await;
    let row = wait_state(&db, id, &[JobState::Completed], Duration::from_secs(60)).await;
    assert_eq!(row.summary.as_deref(), Some("Resumed and finished."));
    let history = db.queue.history(id).await.unwrap();
    let main = model.main_requests();
    assert_eq!(main.len(), 3, "a Write, the 429, the retry's one request: {history:#?}");
    let retry_first = texts(&main[2]);
    assert!(retry_first.contains("part 1") && retry_first.contains("part1.txt"), "the session resumed");
    assert!(history.iter().any(|e| e.kind == "session_carried"), "{history:?}");
    // Its own file was still here: resumed as it is, never replaced by the carried copy.
    let here = |d: Option<&str>| d.is_some_and(|d| d.ends_with("its file was still here"));
    assert!(history.iter().any(|e| e.kind == "session_resumed" && here(e.detail.as_deref())), "{history:?}");
}

/// gemini exits with the HTTP status mod 256 (a 401 is 145) and says nothing on stdout: the
/// attempt fails with its own error, never completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_with_a_rejected_key_fails() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("gemini-401"), cli_root(), ModelServer::start().unwrap());
    let (_remote, clone, _, id) = job_on_a_repo(&db, &orch, "Write hello.txt.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone, &model, "");
    model.script([Turn::Error {
        status: 401,
        headers: vec![],
        body: json!({"error": {"code": 401, "message": "API key not valid. Please pass a valid API key.", "status": "UNAUTHENTICATED"}}),
    }]);
    let _a = laptop.run(&db, &orch, "gemini", &[]);
    let row = wait_state(&db, id, &[JobState::Dead, JobState::Failed], Duration::from_secs(90)).await;
    let error = row.last_error.unwrap_or_default();
    assert!(error.starts_with("gemini") && error.contains("401"), "{error}");
    assert!(!db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "completed"));
}

/// A 429 whose CLI says when to retry parks the job until then: gemini prints Google's
/// "Please retry in 3600s", and the job waits about an hour, its attempt not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_a_reset_time_parks_the_job_until_then() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (orch, root, model) = (db.orch("gemini-429"), cli_root(), ModelServer::start().unwrap());
    let (_remote, clone, _, id) = job_on_a_repo(&db, &orch, "Write hello.txt.");
    let laptop = Machine::new(&db, root.path(), "laptop", &clone, &model, "");
    let quota = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "Quota exceeded for quota metric 'Generate Content requests'. Please retry in 3600s.",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3600s"}]}});
    model.script((0..4).map(|_| Turn::Error { status: 429, headers: vec![], body: quota.clone() }));
    let _a = laptop.run(&db, &orch, "gemini", &[]);
    assert!(
        wait_for(Duration::from_secs(90), || async {
            db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "parked")
        })
        .await,
        "the 429 parks the job"
    );
    let row = job(&db, id).await;
    let wait = row.wait().expect("the job waits").as_secs();
    assert!((3500..=3700).contains(&wait), "parked until the reset: {wait} s");
    assert_eq!((row.state, row.attempts), (JobState::Queued, 0), "{row:?}");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("gemini hit a usage limit") && error.contains("retry in 3600s"), "{error}");
}

/// The job's agent ran in DevPilot's sandbox (the default): no `unconfined` entry in its
/// history, which a machine that cannot confine, or settings that say `sandbox = "off"`,
/// would have written.
async fn ran_confined(db: &TestDb, id: i64) {
    let h = db.queue.history(id).await.unwrap();
    assert!(!h.iter().any(|e| e.kind == "unconfined"), "the agent ran confined: {h:?}");
}
