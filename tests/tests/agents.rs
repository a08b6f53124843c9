//! Real agents on real repositories: a git worktree per job, a hand-off that carries the
//! work in progress to the next machine, routing by repo and label, presets, the watchdog,
//! and the log tail any machine can read. Machines are `devpilot run` OS processes, each
//! with its own home (config, data, worktrees) and its own clone of a bare remote; the agent
//! is a script. Every test runs on PostgreSQL and on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::Fence;
use devpilot_tests::{
    enqueue, fast_flags, git, run_cli, spawn_runner, wait_for, worktree_of, write_config, Backend, GitRemote,
    RecordingAgent, Runner, TestDb,
};
use serde_json::json;

devpilot_tests::on_both_backends!(
    a_hand_off_carries_the_work_to_the_next_machine,
    a_failed_push_releases_anyway_and_pushes_later,
    routing_sends_each_job_to_a_machine_that_qualifies,
    presets_pass_the_prompt_as_one_argument,
    the_watchdog_fails_silent_and_overlong_agents,
    the_log_tail_is_visible_from_any_machine,
    setup_failures_and_worktree_cleanup,
    sql_producers_are_routed_too,
);

/// A machine's home with `repos` configured (`[repos.NAME] path = …`, plus `extra` TOML).
fn machine_home(root: &Path, name: &str, repos: &[(&str, &Path)], extra: &str) -> PathBuf {
    let home = root.join(name);
    let mut toml = String::new();
    toml.push_str(extra);
    for (repo, path) in repos {
        toml.push_str(&format!("\n[repos.{repo}]\npath = \"{}\"\npush = true\n", path.display()));
    }
    write_config(&home, &toml);
    home
}

fn runner(db: &TestDb, home: &Path, orch: &str, machine: &str, extra: &[&str], agent: &Path) -> Runner {
    let mut flags = fast_flags();
    flags.extend_from_slice(extra);
    spawn_runner(home, &db.raw_url, orch, machine, &flags, agent, &[])
}

async fn wait_state(db: &TestDb, id: i64, state: JobState, limit: Duration) -> bool {
    wait_for(limit, || async { db.queue.job(id).await.unwrap().is_some_and(|(j, _)| j.state == state) }).await
}

/// The agent of the hand-off tests: on a fresh worktree it writes part 1 and waits; on a
/// resumed one (part 1 is there, and it was handed off by the laptop) it writes part 2,
/// commits and exits 0.
fn two_part_agent(dir: &Path) -> RecordingAgent {
    RecordingAgent::new(
        dir,
        r#"if [ -f part1.txt ]; then
  [ "$DEVPILOT_RESUMED_FROM" = laptop ] || { echo "not resumed from the laptop: '$DEVPILOT_RESUMED_FROM'"; exit 3; }
  [ "$DEVPILOT_RESUME_BRANCH" = "$DEVPILOT_BRANCH" ] || { echo "wrong resume branch"; exit 4; }
  echo "part 2 by $DEVPILOT_MACHINE" > part2.txt
  git add part2.txt && git -c user.name=Agent -c user.email=agent@example.invalid commit -qm "part 2"
  echo "both parts are done"
else
  [ "$(pwd)" = "$DEVPILOT_WORKTREE" ] || { echo "not started in its worktree"; exit 5; }
  echo "part 1 by $DEVPILOT_MACHINE" > part1.txt
  echo "wrote part 1"
  echo "ready $DEVPILOT_JOB_ID $DEVPILOT_CLAIM_TOKEN $DEVPILOT_MACHINE 0 $$" >> "$rec"
  sleep 60 & wait
fi"#,
    )
}

/// The laptop's agent writes part 1 and waits; `devpilot release --machine laptop` from
/// elsewhere makes the laptop commit and push it and release the job naming the branch; the
/// desktop claims it, its agent finds part 1 in its own worktree, writes part 2 and exits 0.
/// The remote branch holds both parts, the job completed once, and the laptop's worktree is
/// gone (clean after its work-in-progress commit and push).
async fn a_hand_off_carries_the_work_to_the_next_machine(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("handoff");
    let remote = GitRemote::new(db.dir.path());
    let clone_a = remote.clone_to(&db.dir.path().join("laptop-src/webapp"));
    let clone_b = remote.clone_to(&db.dir.path().join("desktop-src/webapp"));
    let home_a = machine_home(db.dir.path(), "laptop", &[("webapp", &clone_a)], "");
    let home_b = machine_home(db.dir.path(), "desktop", &[("webapp", &clone_b)], "");
    let agent = two_part_agent(db.dir.path());
    let id = enqueue(&home_b, &db, &orch, &["--title", "ENG-7 Fix login redirect", "--repo", "webapp"]);
    let branch = format!("devpilot/{id}-eng-7-fix-login-redirect");

    let a = runner(&db, &home_a, &orch, "laptop", &[], &agent.script);
    assert!(wait_for(Duration::from_secs(30), || async { agent.records().iter().any(|r| r.kind == "ready") }).await);
    let b = runner(&db, &home_b, &orch, "desktop", &[], &agent.script);
    let (code, out, err) = run_cli(
        &home_b,
        &db.raw_url,
        &["release", "--orchestrator", &orch, "--machine", "laptop", "--wait", "20s"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("#{id} handed off by laptop; its work in progress is on branch {branch}")), "{out}");
    assert!(wait_state(&db, id, JobState::Completed, Duration::from_secs(30)).await, "the desktop completes it");

    assert_eq!(remote.show(&branch, "part1.txt").as_deref(), Some("part 1 by laptop\n"));
    assert_eq!(remote.show(&branch, "part2.txt").as_deref(), Some("part 2 by desktop\n"));
    let history = db.queue.history(id).await.unwrap();
    let completed: Vec<_> = history.iter().filter(|e| e.kind == "completed").collect();
    assert_eq!(completed.len(), 1, "{history:?}");
    assert_eq!(completed[0].machine.as_deref(), Some("desktop"));
    let handed = history.iter().find(|e| e.kind == "handed_off").expect("handed off");
    let detail = handed.detail.clone().unwrap_or_default();
    assert!(detail.contains(&format!("pushed to origin/{branch}")), "{detail}");
    // The measured hand-off: commit and push after the agent stopped.
    eprintln!("hand-off on {backend:?}: {detail}");
    assert!(history.iter().any(|e| e.kind == "release_requested"), "{history:?}");
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!(job.summary.as_deref(), Some("both parts are done"), "the summary is the agent's last line");
    assert!(!worktree_of(&home_a, &orch, id).exists(), "the laptop's worktree is gone");
    assert!(wait_for(Duration::from_secs(10), || async { !worktree_of(&home_b, &orch, id).exists() }).await);
    assert!(git(&clone_a, &["worktree", "list"]).lines().count() == 1, "no worktree left registered");
    drop((a, b));
}

/// With the remote unreachable, a SIGTERM hand-off still releases the job at once (never
/// stranded) and says the work stayed on the laptop at its path; the laptop's next run
/// pushes it and records the branch on the waiting job.
async fn a_failed_push_releases_anyway_and_pushes_later(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("offline");
    let remote = GitRemote::new(db.dir.path());
    let clone = remote.clone_to(&db.dir.path().join("laptop-src/webapp"));
    let home = machine_home(db.dir.path(), "laptop", &[("webapp", &clone)], "");
    let agent = two_part_agent(db.dir.path());
    let id = enqueue(&home, &db, &orch, &["--title", "Offline work", "--repo", "webapp"]);
    // No git identity on this machine: the work-in-progress commit uses DevPilot's.
    let mut flags = fast_flags();
    flags.extend(["--handoff-push-timeout", "3s"]);
    let no_identity = [("GIT_CONFIG_GLOBAL", "/dev/null"), ("GIT_CONFIG_NOSYSTEM", "1")];
    let mut a = spawn_runner(&home, &db.raw_url, &orch, "laptop", &flags, &agent.script, &no_identity);
    assert!(wait_for(Duration::from_secs(30), || async { agent.records().iter().any(|r| r.kind == "ready") }).await);
    let hidden = db.dir.path().join("remote-away.git");
    std::fs::rename(&remote.bare, &hidden).unwrap();
    unsafe { libc::kill(a.pid() as i32, libc::SIGTERM) };
    assert_eq!(a.wait_timeout(Duration::from_secs(20)), Some(0), "the runner hands off and exits");
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((job.state.as_str(), job.resume_branch.as_deref()), ("queued", None), "released, no branch to resume");
    let wt = worktree_of(&home, &orch, id);
    let detail = db.queue.history(id).await.unwrap().into_iter().rev().find(|e| e.kind == "handed_off").unwrap().detail;
    let detail = detail.unwrap_or_default();
    assert!(detail.contains(&format!("work in progress stayed on laptop at {}", wt.display())), "{detail}");
    assert!(wt.join("part1.txt").exists(), "the work is still here");
    assert!(git(&wt, &["log", "-1", "--format=%s"]).contains("work in progress handed off by laptop"));
    assert_eq!(
        git(&wt, &["log", "-1", "--format=%an <%ae>"]),
        "DevPilot <devpilot@localhost>",
        "the fallback identity"
    );

    // Keep the job from being claimed while the laptop comes back (the clock moves, not us).
    db.exec(&format!("UPDATE dispatch_queue SET run_at = run_at + 3600000 WHERE id = {id}")).await;
    std::fs::rename(&hidden, &remote.bare).unwrap();
    let b = runner(&db, &home, &orch, "laptop", &[], &agent.script);
    let branch = format!("devpilot/{id}-offline-work");
    assert!(
        wait_for(Duration::from_secs(20), || async {
            db.queue.job(id).await.unwrap().unwrap().0.resume_branch.as_deref() == Some(branch.as_str())
        })
        .await,
        "the next run pushed the work and named the branch"
    );
    assert_eq!(remote.show(&branch, "part1.txt").as_deref(), Some("part 1 by laptop\n"));
    assert!(db.queue.history(id).await.unwrap().iter().any(|e| e.kind == "work_pushed"));
    assert!(wait_for(Duration::from_secs(10), || async { !wt.exists() }).await, "then the clean worktree goes");
    drop(b);
}

/// Two machines with different repos and labels drain a mixed queue: every job runs on a
/// machine that qualifies, two jobs of one repo on one machine get two worktrees, and
/// `status` names the jobs no online machine can take, and why.
async fn routing_sends_each_job_to_a_machine_that_qualifies(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("route");
    let remote = GitRemote::new(db.dir.path());
    let alpha = remote.clone_to(&db.dir.path().join("x-src/alpha"));
    let beta = remote.clone_to(&db.dir.path().join("y-src/beta"));
    let home_x = machine_home(db.dir.path(), "x", &[("alpha", &alpha)], "labels = [\"gpu\"]\n");
    let home_y = machine_home(db.dir.path(), "y", &[("beta", &beta)], "");
    let dirs = db.dir.path().join("pwd");
    std::fs::create_dir_all(&dirs).unwrap();
    let agent =
        RecordingAgent::new(db.dir.path(), &format!("pwd > {}/$DEVPILOT_JOB_ID; sleep 0.3; echo done", dirs.display()));
    let mut want: Vec<(i64, &str)> = vec![];
    for _ in 0..4 {
        want.push((enqueue(&home_x, &db, &orch, &["--title", "a", "--repo", "alpha"]), "x"));
        want.push((enqueue(&home_x, &db, &orch, &["--title", "b", "--repo", "beta"]), "y"));
        want.push((enqueue(&home_x, &db, &orch, &["--title", "g", "--requires", "gpu"]), "x"));
        want.push((enqueue(&home_x, &db, &orch, &["--title", "ag", "--repo", "alpha", "--requires", "gpu"]), "x"));
    }
    let anywhere: Vec<i64> = (0..4).map(|_| enqueue(&home_x, &db, &orch, &["--title", "any"])).collect();
    let tpu = enqueue(&home_x, &db, &orch, &["--payload", r#"{"team": 3}"#, "--title", "t", "--requires", "tpu,gpu"]);
    let gamma = enqueue(&home_x, &db, &orch, &["--title", "c", "--repo", "gamma"]);
    let (_, payload) = db.queue.job(tpu).await.unwrap().unwrap();
    assert_eq!(payload, json!({"team": 3, "title": "t", "requires": ["gpu", "tpu"]}), "unknown fields are kept");

    let x = runner(&db, &home_x, &orch, "x", &["--concurrency", "2"], &agent.script);
    let y = runner(&db, &home_y, &orch, "y", &[], &agent.script);
    for (id, _) in &want {
        assert!(wait_state(&db, *id, JobState::Completed, Duration::from_secs(60)).await, "job {id} completes");
    }
    for id in &anywhere {
        assert!(wait_state(&db, *id, JobState::Completed, Duration::from_secs(30)).await);
    }
    for (id, machine) in &want {
        let h = db.queue.history(*id).await.unwrap();
        let done = h.iter().find(|e| e.kind == "completed").unwrap();
        assert_eq!(done.machine.as_deref(), Some(*machine), "job {id} ran on a machine that qualifies: {h:?}");
        // Not only the run that completed: no machine that does not qualify ever claimed it.
        let claims: Vec<_> = h.iter().filter(|e| e.kind == "claimed").collect();
        assert!(!claims.is_empty(), "job {id} has its claimed event: {h:?}");
        for c in claims {
            assert_eq!(
                c.machine.as_deref(),
                Some(*machine),
                "job {id} was claimed only by a machine that qualifies: {h:?}"
            );
        }
    }
    for id in &anywhere {
        let h = db.queue.history(*id).await.unwrap();
        let claims: Vec<_> = h.iter().filter(|e| e.kind == "claimed").collect();
        assert!(!claims.is_empty(), "job {id} has its claimed event: {h:?}");
        assert!(claims.iter().all(|c| matches!(c.machine.as_deref(), Some("x" | "y"))), "job {id}: {h:?}");
    }
    let alpha_dirs: std::collections::HashSet<String> = want
        .iter()
        .filter(|(_, m)| *m == "x")
        .filter_map(|(id, _)| std::fs::read_to_string(dirs.join(id.to_string())).ok())
        .filter(|d| d.contains("/worktrees/"))
        .collect();
    assert_eq!(alpha_dirs.len(), 8, "every alpha job had a worktree of its own: {alpha_dirs:?}");
    let (code, out, _) = run_cli(&home_x, &db.raw_url, &["status", "--orchestrator", &orch], None);
    assert_eq!(code, 0);
    assert!(out.contains("no machine can take:"), "{out}");
    assert!(out.contains(&format!("#{tpu}")) && out.contains("no online machine has label tpu"), "{out}");
    assert!(out.contains(&format!("#{gamma}")) && out.contains("no online machine has repo gamma"), "{out}");
    for id in [tpu, gamma] {
        assert_eq!(db.queue.job(id).await.unwrap().unwrap().0.state, JobState::Queued, "nobody took #{id}");
        let h = db.queue.history(id).await.unwrap();
        assert!(!h.iter().any(|e| e.kind == "claimed"), "nobody ever claimed #{id}: {h:?}");
    }
    drop((x, y));
}

/// `run --agent claude` runs the `claude` found on PATH with `-p PROMPT` (one element, with
/// every shell metacharacter intact) and this machine's extra args and env; a preset whose
/// CLI is missing says which preset, and which PATH was searched.
async fn presets_pass_the_prompt_as_one_argument(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("preset");
    let bin = db.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let argv_file = db.dir.path().join("argv");
    std::fs::write(
        bin.join("claude"),
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done > {}\necho \"model env $CLAUDE_TEST\"\n",
            argv_file.display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod").arg("+x").arg(bin.join("claude")).status().unwrap();
    let home = machine_home(
        db.dir.path(),
        "m",
        &[],
        "[agents.claude]\nargs = [\"--model\", \"opus\"]\n[agents.claude.env]\nCLAUDE_TEST = \"yes\"\n",
    );
    let title = "Fix $(whoami) `id` \"quotes\"; rm -rf /";
    let id = enqueue(&home, &db, &orch, &["--title", title, "--prompt=--model evil\nline 2", "--url", "https://x/7"]);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let mut c = devpilot_tests::devpilot(&home, &db.raw_url);
    // The stand-in CLI writes its argv beside itself, outside its sandbox.
    c.args(["run", "--orchestrator", &orch, "--machine", "m", "--agent", "claude", "--until-empty"])
        .args(fast_flags())
        .arg("--allow-write")
        .arg(db.dir.path())
        .env("PATH", &path);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let argv: Vec<String> = std::fs::read(&argv_file)
        .unwrap()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let prompt = format!("{title}\n\n--model evil\nline 2\n\nSource: https://x/7");
    let head =
        ["-p", prompt.as_str(), "--permission-mode", "acceptEdits", "--output-format", "stream-json", "--verbose"];
    assert_eq!(argv[..7], head, "{argv:?}");
    assert_eq!(argv[7], "--session-id", "{argv:?}");
    assert!(uuid_like(&argv[8]) && argv[9..11] == ["--model", "opus"], "a new session, then the extras: {argv:?}");
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((job.state.as_str(), job.summary.as_deref()), ("completed", Some("model env yes")));

    let (code, _, err) = run_cli(&home, &db.raw_url, &["run", "--orchestrator", &orch, "--agent", "codex"], None);
    assert_eq!(code, 1);
    assert!(err.contains("agent preset 'codex' runs `codex`, which was not found on PATH ("), "{err}");
    let (code, _, err) = run_cli(&home, &db.raw_url, &["run", "--orchestrator", &orch, "--agent", "cursor"], None);
    assert_eq!(code, 1);
    assert!(err.contains("the presets are claude, codex, aider and gemini"), "{err}");
}

/// `--idle-timeout` stops an agent that prints nothing for that long and `--max-runtime`
/// one that runs too long; each fails the attempt with a clear error, also in the history.
async fn the_watchdog_fails_silent_and_overlong_agents(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("watchdog");
    let home = machine_home(db.dir.path(), "m", &[], "");
    let agent = RecordingAgent::new(
        db.dir.path(),
        r#"if grep -q chatty "$DEVPILOT_PAYLOAD_FILE"; then
  while :; do echo tick; sleep 0.1; done
else
  echo "thinking"; sleep 60 & wait
fi"#,
    );
    let silent = enqueue(&home, &db, &orch, &["--payload", r#"{"kind":"silent"}"#, "--max-attempts", "1"]);
    let chatty = enqueue(&home, &db, &orch, &["--payload", r#"{"kind":"chatty"}"#, "--max-attempts", "1"]);
    let r = runner(
        &db,
        &home,
        &orch,
        "m",
        &["--concurrency", "2", "--idle-timeout", "1s", "--max-runtime", "3s"],
        &agent.script,
    );
    for (id, why) in [
        (silent, "no output for 1s; the watchdog stopped the agent"),
        (chatty, "ran longer than its maximum runtime of 3s; the watchdog stopped the agent"),
    ] {
        assert!(wait_state(&db, id, JobState::Dead, Duration::from_secs(30)).await, "job {id} is stopped");
        let (job, _) = db.queue.job(id).await.unwrap().unwrap();
        assert_eq!(job.last_error.as_deref(), Some(why));
        let h = db.queue.history(id).await.unwrap();
        assert!(h.iter().any(|e| e.detail.as_deref() == Some(why)), "{h:?}");
    }
    drop(r);
}

/// While a job runs, its holder stores the tail of the agent's log (fenced by the claim):
/// another machine reads it live; a write with an old token is refused.
async fn the_log_tail_is_visible_from_any_machine(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("logs");
    let home = machine_home(db.dir.path(), "desktop", &[], "");
    let agent =
        RecordingAgent::new(db.dir.path(), "for i in 1 2 3; do echo \"step $i of the agent\"; done; sleep 60 & wait");
    let id = enqueue(&home, &db, &orch, &["--title", "watch me"]);
    let r = runner(&db, &home, &orch, "desktop", &[], &agent.script);
    let other = db.another_queue().await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            other.log_tail(id).await.unwrap().is_some_and(|t| t.tail.contains("step 3 of the agent"))
        })
        .await,
        "the laptop sees the desktop's agent output"
    );
    let tail = other.log_tail(id).await.unwrap().unwrap();
    assert_eq!(tail.machine, "desktop");
    assert!(
        !other.store_log_tail(&Fence { job: id, token: tail.claim_token - 1 }, "laptop", "forged").await.unwrap(),
        "fenced"
    );
    assert!(other.log_tail(id).await.unwrap().unwrap().tail.contains("step 3"));
    drop(r);
}

/// A failing setup fails the attempt with the setup's own output in the log and the error;
/// `devpilot worktrees` lists what is left and `--prune` removes a finished job's clean
/// worktree but keeps one with uncommitted changes, saying so.
async fn setup_failures_and_worktree_cleanup(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("setup");
    let remote = GitRemote::new(db.dir.path());
    let web = remote.clone_to(&db.dir.path().join("src/web"));
    let broken = remote.clone_to(&db.dir.path().join("src/broken"));
    std::fs::write(web.join(".env"), "SECRET_FOR_TESTS=1\n").unwrap();
    // Copied in, and not ignored by the repo: still never committed nor counted as work.
    std::fs::write(web.join("local.json"), "{}\n").unwrap();
    let home = db.dir.path().join("m");
    write_config(
        &home,
        &format!(
            "[repos.web]\npath = \"{}\"\ncopy = [\".env\", \"local.json\"]\nsetup = [\"sh\", \"-c\", \"test -f .env && echo set up > setup.txt\"]\n\
             [repos.broken]\npath = \"{}\"\nsetup = [\"sh\", \"-c\", \"echo npm ERR! missing lockfile $((40 + 2)); exit 1\"]\n",
            web.display(),
            broken.display()
        ),
    );
    let agent = RecordingAgent::new(
        db.dir.path(),
        "test -f setup.txt || exit 9; if [ \"$DEVPILOT_JOB_ID\" = \"$DIRTY\" ]; then echo wip > notes.txt; fi; echo ok",
    );
    let bad = enqueue(&home, &db, &orch, &["--title", "bad", "--repo", "broken", "--max-attempts", "1"]);
    let clean = enqueue(&home, &db, &orch, &["--title", "clean", "--repo", "web"]);
    let dirty = enqueue(&home, &db, &orch, &["--title", "dirty", "--repo", "web"]);
    let mut flags = fast_flags();
    flags.push("--until-empty");
    let mut r = spawn_runner(&home, &db.raw_url, &orch, "m", &flags, &agent.script, &[("DIRTY", &dirty.to_string())]);
    assert_eq!(r.wait_timeout(Duration::from_secs(60)), Some(0));
    let (job, _) = db.queue.job(bad).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Dead);
    let err = job.last_error.unwrap_or_default();
    // "42" is the setup's own output: the command line only says $((40 + 2)).
    assert!(err.contains("setup `sh -c") && err.contains("npm ERR! missing lockfile 42"), "{err}");
    let log = std::fs::read_to_string(home.join(format!("data/devpilot/logs/jobs/job-{bad}.log"))).unwrap();
    assert!(log.contains("npm ERR! missing lockfile 42"), "{log}");
    assert!(!worktree_of(&home, &orch, clean).exists(), "a clean completed job's worktree goes at once");
    let (job, _) = db.queue.job(dirty).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Completed);
    let kept = job.worktree.unwrap_or_default();
    assert!(kept.contains(&worktree_of(&home, &orch, dirty).display().to_string()) && kept.contains("uncommitted"));

    let (code, out, _) = run_cli(&home, &db.raw_url, &["worktrees", "--orchestrator", &orch], None);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("#{bad}")) && out.contains(&format!("#{dirty}")), "{out}");
    let (code, out, _) = run_cli(&home, &db.raw_url, &["worktrees", "--orchestrator", &orch, "--prune"], None);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("removed #{bad}")), "{out}");
    assert!(out.contains(&format!("kept    #{dirty}")) && out.contains("uncommitted changes"), "{out}");
    assert!(!worktree_of(&home, &orch, bad).exists() && worktree_of(&home, &orch, dirty).join("notes.txt").exists());
}

/// A producer's plain SQL INSERT (the README's) gets its routing columns from the payload by
/// trigger, so its job goes only to a machine that qualifies.
async fn sql_producers_are_routed_too(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("sqlprod");
    db.exec(&format!(
        r#"INSERT INTO dispatch_queue (orchestrator_id, payload, title)
           VALUES ('{orch}', '{{"title": "from SQL", "repo": "webapp", "requires": ["gpu"]}}', 'from SQL')"#
    ))
    .await;
    let id = db.scalar("SELECT MAX(id) FROM dispatch_queue").await.unwrap();
    let (job, _) = db.queue.job(id).await.unwrap().unwrap();
    assert_eq!((job.repo.as_deref(), job.requires.to_vec()), (Some("webapp"), vec!["gpu".to_string()]));
    assert!(db.queue.claim_next(&orch, "plain", 1).await.unwrap().is_empty(), "a machine without the repo skips it");
    let route = devpilot_store::queue::Route {
        repos: vec!["webapp".into()],
        labels: vec!["gpu".into()],
        tracker_repos: None,
        governor: Default::default(),
    };
    let extras = devpilot_store::queue::PollExtras { route: Some(&route), ..Default::default() };
    let got = db.queue.claim_next_with(&orch, "qualified", 1, &extras).await.unwrap().claims;
    assert_eq!(got.iter().map(|c| c.fence.job).collect::<Vec<_>>(), vec![id]);
}

/// Whether `s` looks like a UUID (8-4-4-4-12 hex digits).
fn uuid_like(s: &str) -> bool {
    let parts: Vec<usize> = s.split('-').map(str::len).collect();
    parts == [8, 4, 4, 4, 12] && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}
