//! Hostile input cannot escape the worktree. Each test is one finding of the audit in
//! issue 20, reproduced as an attacker would: a base branch, a payload, an agent or its
//! result file is hostile, and a real `devpilot run` process with real git must hold. Every
//! test that involves a database runs on PostgreSQL and on SQLite (and the NUL summary also
//! through PgBouncer in pooled mode).

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::JobOptions;
use devpilot_tests::{
    devpilot, enqueue, fast_flags, git, run_cli, spawn_runner, wait_for, write_config, Backend, GitRemote,
    RecordingAgent, TestDb,
};
use sea_orm::ConnectionTrait;
use serde_json::json;

devpilot_tests::on_both_backends!(
    a_symlinked_copy_file_is_never_written_through,
    an_unparsable_payload_never_runs_and_no_job_runs_in_the_runners_directory,
    code_the_agent_plants_never_runs_in_devpilots_git,
    setup_runs_only_on_the_remotes_base,
    a_base_is_taken_only_from_the_remote,
    a_poison_prompt_never_blocks_the_machine,
    a_fifo_or_dev_zero_result_file_is_ignored_and_sigterm_works,
    oversized_jobs_are_refused_at_every_door,
    status_escapes_control_characters,
    agents_get_only_the_allowlisted_environment,
    until_empty_leaves_jobs_no_machine_here_can_take,
    a_nul_summary_is_cleaned_and_a_script_url_dropped,
    a_url_rewrite_in_the_clone_makes_devpilots_git_refuse,
);

/// The NUL summary through PgBouncer too, in pooled mode, where it once ended the inlined
/// statement early.
mod pooled {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nul_summary_is_cleaned_and_a_script_url_dropped() {
        super::a_nul_summary_is_cleaned_and_a_script_url_dropped(devpilot_tests::Backend::Pooled).await
    }
}

/// A machine's home with `toml` as its config.
fn home_with(root: &Path, name: &str, toml: &str) -> PathBuf {
    let home = root.join(name);
    write_config(&home, toml);
    home
}

/// `[repos.web]` at `clone`, pushing on completion, plus `extra` lines for the repo.
fn web_repo(clone: &Path, extra: &str) -> String {
    format!("[repos.web]\npath = \"{}\"\npush = true\n{extra}\n", clone.display())
}

/// Runs `devpilot run --until-empty` to its end (at most `limit`): its exit code and log.
fn drain(home: &Path, db: &TestDb, orch: &str, agent: &Path, extra: &[&str], limit: Duration) -> (Option<i32>, String) {
    let mut flags = fast_flags();
    flags.push("--until-empty");
    flags.extend_from_slice(extra);
    let mut r = spawn_runner(home, &db.raw_url, orch, "m", &flags, agent, &[]);
    let code = r.wait_timeout(limit);
    (code, std::fs::read_to_string(&r.log).unwrap_or_default())
}

/// Runs `c` to its end (at most `limit`, else it is killed), its stderr into a file: its
/// exit code and what it logged.
fn finish(mut c: Command, dir: &Path, limit: Duration) -> (Option<i32>, String) {
    let log = dir.join(format!("run-{}.log", rand::random::<u32>()));
    let mut child = c.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
    let start = std::time::Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

async fn job(db: &TestDb, id: i64) -> devpilot_store::queue::JobRow {
    db.queue.job(id).await.unwrap().unwrap().0
}

fn job_log(home: &Path, id: i64) -> String {
    std::fs::read_to_string(home.join(format!("data/devpilot/logs/jobs/job-{id}.log"))).unwrap_or_default()
}

/// Finding 1. A base branch tracks `.env -> leaked.txt` and `.envrc -> <a file outside>`, and
/// the repo copies `.env` and `.envrc` in: neither is written through its link, so the
/// clone's secret is never committed or pushed, and the file outside is untouched.
async fn a_symlinked_copy_file_is_never_written_through(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("symlink");
    let remote = GitRemote::new(db.dir.path());
    let victim = db.dir.path().join("victim.txt");
    std::fs::write(&victim, "the user's own file\n").unwrap();
    let seed = db.dir.path().join("seed");
    git(&seed, &["checkout", "--quiet", "-b", "evil"]);
    symlink("leaked.txt", seed.join(".env")).unwrap();
    symlink(&victim, seed.join(".envrc")).unwrap();
    git(&seed, &["add", "-f", ".env", ".envrc"]);
    git(&seed, &["commit", "--quiet", "-m", "links"]);
    git(&seed, &["push", "--quiet", "origin", "evil"]);
    let clone = remote.clone_to(&db.dir.path().join("src/web"));
    std::fs::write(clone.join(".env"), "API_KEY=sk-live-1234\n").unwrap();
    std::fs::write(clone.join(".envrc"), "export PATH=/evil:$PATH\n").unwrap();
    let home = home_with(db.dir.path(), "m", &web_repo(&clone, "copy = [\".env\", \".envrc\"]"));
    let agent = RecordingAgent::new(db.dir.path(), "echo did the work > work.txt; echo done");
    let id = enqueue(&home, &db, &orch, &["--title", "Leak", "--repo", "web", "--base", "evil", "--max-attempts", "1"]);
    let (code, log) = drain(&home, &db, &orch, &agent.script, &[], Duration::from_secs(60));
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(job(&db, id).await.state, JobState::Completed);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's own file\n", "nothing written outside");
    let branch = format!("devpilot/{id}-leak");
    assert_eq!(remote.show(&branch, "work.txt").as_deref(), Some("did the work\n"), "the job's work was pushed");
    let leaked = remote.show(&branch, "leaked.txt").unwrap_or_default();
    assert!(!leaked.contains("sk-live"), "the clone's .env was pushed as leaked.txt");
    let jl = job_log(&home, id);
    assert!(jl.contains("did not copy .env") && jl.contains("did not copy .envrc"), "{jl}");
}

/// Finding 2. Rows a producer wrote by hand whose payload does not parse (`title: 5`), whose
/// `repo` column disagrees with the payload, or whose base is not a branch name fail their
/// attempt with the reason and never run; a job with no repo runs in a scratch directory of
/// its own, never in the runner's, and the directory is gone afterwards. Logs and payload
/// files are private.
async fn an_unparsable_payload_never_runs_and_no_job_runs_in_the_runners_directory(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("badpayload");
    let remote = GitRemote::new(db.dir.path());
    let clone = remote.clone_to(&db.dir.path().join("src/web"));
    let home = home_with(db.dir.path(), "m", &web_repo(&clone, ""));
    let rows = [
        (r#"{"repo": "web", "title": 5}"#, "NULL"),
        ("{}", "'web'"),
        (r#"{"repo": "web", "base": "main..x"}"#, "NULL"),
        (r#"{"title": "no repo"}"#, "NULL"),
    ];
    for (payload, repo) in rows {
        db.exec(&format!(
            "INSERT INTO dispatch_queue (orchestrator_id, payload, title, max_attempts, repo)
             VALUES ('{orch}', '{payload}', 'hand-written', 1, {repo})"
        ))
        .await;
    }
    let first =
        db.scalar(&format!("SELECT MIN(id) FROM dispatch_queue WHERE orchestrator_id = '{orch}'")).await.unwrap();
    let ids: Vec<i64> = (first..first + 4).collect();
    let pwd = db.dir.path().join("pwd");
    std::fs::create_dir_all(&pwd).unwrap();
    let agent = RecordingAgent::new(db.dir.path(), &format!("pwd > {}/$DEVPILOT_JOB_ID", pwd.display()));
    let runner_cwd = db.dir.path().join("runner-cwd");
    std::fs::create_dir_all(&runner_cwd).unwrap();
    let mut c = devpilot(&home, &db.raw_url);
    c.args(["run", "--orchestrator", &orch, "--machine", "m", "--until-empty"])
        .args(fast_flags())
        // The agent records what it did beside its script, outside its sandbox.
        .args(["--allow-write", &db.dir.path().display().to_string()])
        .arg("--")
        .arg(&agent.script)
        .current_dir(&runner_cwd);
    let (code, log) = finish(c, db.dir.path(), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{log}");
    for (id, why) in ids[..3].iter().zip([
        "malformed payload",
        "routed as repo web but its payload says repo (none)",
        "not a branch name",
    ]) {
        let j = job(&db, *id).await;
        let err = j.last_error.unwrap_or_default();
        assert_eq!(j.state, JobState::Dead, "job {id}: {err}");
        assert!(err.contains(why) && err.contains("the job was not run"), "job {id}: {err}");
        assert!(!pwd.join(id.to_string()).exists(), "job {id} ran an agent");
    }
    assert_eq!(job(&db, ids[3]).await.state, JobState::Completed);
    let ran_in = std::fs::read_to_string(pwd.join(ids[3].to_string())).unwrap();
    let scratch = devpilot_engine::orchestrator::scratch_root(&home.join("data/devpilot"), &orch);
    assert!(ran_in.trim().starts_with(&scratch.display().to_string()), "ran in {ran_in}");
    assert!(!Path::new(ran_in.trim()).exists(), "the scratch dir is removed afterwards");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let logs = home.join("data/devpilot/logs/jobs");
    assert_eq!(mode(&logs), 0o700, "the log dir is private");
    assert_eq!(mode(&logs.join(format!("job-{}.log", ids[3]))), 0o600, "the log is private");
    let payloads = devpilot_engine::orchestrator::payload_dir(&home.join("data/devpilot"));
    assert_eq!(mode(&payloads), 0o700, "the payload dir is private");
    assert_eq!(mode(&scratch), 0o700, "the scratch root is private");
    assert_eq!(mode(scratch.parent().unwrap()), 0o700, "the scratch root's parent is private");
}

/// The bash function an agent plants with: a script at `$2` that appends "`$1` ran" and the
/// environment it ran with to the marker file.
fn planting_agent(dir: &Path, mark: &Path, body: &str) -> RecordingAgent {
    let prelude = format!(
        "mark={}\nplant() {{ printf '#!/bin/sh\\necho \"%s ran, with: $(env | tr \"\\\\n\" \" \")\" >> %s\\ncat >/dev/null 2>&1 || true\\nexit 0\\n' \"$1\" \"$mark\" > \"$2\"; chmod +x \"$2\"; }}\n",
        mark.display()
    );
    RecordingAgent::new(dir, &format!("{prelude}{body}"))
}

/// Finding 3. The agent points the worktree's `.git` at a gitdir of its own with
/// `core.fsmonitor`, writes hooks into the clone's shared hooks directory and a
/// `core.hooksPath` of its own, a filter and a receive-pack in the clone's config, and a
/// hook in the (local) remote. DevPilot's own commit, push and the next job's worktree run
/// none of them, and its work is still committed and pushed.
async fn code_the_agent_plants_never_runs_in_devpilots_git(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("plant");
    let remote = GitRemote::new(db.dir.path());
    let clone = remote.clone_to(&db.dir.path().join("src/web"));
    let home = home_with(db.dir.path(), "m", &web_repo(&clone, ""));
    let mark = db.dir.path().join("planted.log");
    let hooks = db.dir.path().join("myhooks");
    // `set -e`: a plant that fails fails the job, so an empty marker below means the planted
    // code did not run, not that it was never planted.
    let body = format!(
        r#"set -e
common=$(git rev-parse --path-format=absolute --git-common-dir)
hooks="{hooks}"; mkdir -p "$hooks"
for h in post-checkout post-commit post-index-change pre-push reference-transaction pre-commit post-merge pre-auto-gc; do
  plant "shared hook $h" "$common/hooks/$h"; plant "hooksPath $h" "$hooks/$h"
done
plant "remote post-receive" "{bare}/hooks/post-receive"; plant "remote pre-receive" "{bare}/hooks/pre-receive"
git config core.hooksPath "$hooks"
plant "clone fsmonitor" "$hooks/fsmonitor"; git config core.fsmonitor "$hooks/fsmonitor"
plant "clone filter" "$hooks/filter"; git config filter.evil.clean "$hooks/filter"; git config filter.evil.smudge "$hooks/filter"
plant "receive-pack" "$hooks/rp"; git config remote.origin.receivepack "$hooks/rp"; git config remote.origin.uploadpack "$hooks/rp"
plant "sshCommand" "$hooks/ssh"; git config core.sshCommand "$hooks/ssh"
echo '* filter=evil' > .gitattributes
# A gitdir of its own: a copy of the repository whose config runs a monitor.
cp -r "$common" "$hooks/fakegit"; git config --file "$hooks/fakegit/config" core.fsmonitor "$hooks/fsmonitor"
git config --file "$hooks/fakegit/config" core.bare false
echo "gitdir: $hooks/fakegit" > .git
echo planted > work.txt
echo planted everything"#,
        hooks = hooks.display(),
        bare = remote.bare.display()
    );
    let agent = planting_agent(db.dir.path(), &mark, &body);
    let id = enqueue(&home, &db, &orch, &["--title", "Plant", "--repo", "web", "--max-attempts", "1"]);
    let next =
        enqueue(&home, &db, &orch, &["--title", "Next", "--repo", "web", "--max-attempts", "1", "--priority", "-1"]);
    // Unconfined on purpose: this proves DevPilot's own git where an agent can write the
    // clone (a machine that cannot confine, or `sandbox = "off"`). Confined, the agent cannot
    // plant at all (tests/sandbox.rs).
    let flags = ["--concurrency", "1", "--sandbox", "off"];
    let (code, log) = drain(&home, &db, &orch, &agent.script, &flags, Duration::from_secs(90));
    assert_eq!(code, Some(0), "{log}");
    let planted = std::fs::read_to_string(&mark).unwrap_or_default();
    assert!(planted.is_empty(), "code the agent planted ran inside DevPilot's git:\n{planted}");
    assert!(!planted.contains("DEVPILOT_DATABASE_URL"), "and saw the database URL");
    assert_eq!(job(&db, id).await.state, JobState::Completed, "{}", job_log(&home, id));
    assert_eq!(remote.show(&format!("devpilot/{id}-plant"), "work.txt").as_deref(), Some("planted\n"));
    // The second job's agent plants again; its worktree was made with all of it in place.
    assert_eq!(job(&db, next).await.state, JobState::Completed, "{}", job_log(&home, next));
    plain_git_runs_what_was_planted(&clone, &mark);
}

/// The control: a plain git, without DevPilot's hardening, in the clone the agent planted in
/// runs the planted code (its hooksPath, its fsmonitor, the clone's shared hooks, and the
/// remote's hooks on a push), so the test above could have seen it run.
fn plain_git_runs_what_was_planted(clone: &Path, mark: &Path) {
    let plain = |args: &[&str]| {
        let out = Command::new("git").arg("-C").arg(clone).args(args).stdin(Stdio::null()).output().unwrap();
        assert!(out.status.success(), "plain git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let common = git(clone, &["rev-parse", "--path-format=absolute", "--git-common-dir"]);
    plain(&["status"]);
    let (name, email) = ("user.name=T", "user.email=t@example.invalid");
    plain(&["-c", name, "-c", email, "commit", "--allow-empty", "-m", "control"]);
    let shared = format!("core.hooksPath={common}/hooks");
    plain(&["-c", &shared, "-c", name, "-c", email, "commit", "--allow-empty", "-m", "c"]);
    // The planted receive-pack would hang a push, and `-c` cannot take back the clone's own
    // `remote.*.receivepack`: the command line names git's own.
    plain(&["push", "--receive-pack=git-receive-pack", "origin", "HEAD:refs/heads/control"]);
    let ran = std::fs::read_to_string(mark).unwrap_or_default();
    let hooks = ["hooksPath pre-commit ran", "hooksPath post-commit ran", "hooksPath pre-push ran"];
    let others =
        ["clone fsmonitor ran", "shared hook post-commit ran", "remote pre-receive ran", "remote post-receive ran"];
    for what in hooks.into_iter().chain(others) {
        assert!(ran.contains(what), "a plain git did not run \"{what}\": was it planted?\n{ran}");
    }
}

/// A key of the clone's config that `-c` cannot take back (here a `pushInsteadOf` that would
/// send the push to a repository the agent made) makes DevPilot's git refuse to run rather
/// than follow it: nothing reaches that repository, the job still ends, and its worktree is
/// kept with the reason.
async fn a_url_rewrite_in_the_clone_makes_devpilots_git_refuse(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("rewrite");
    let remote = GitRemote::new(db.dir.path());
    let clone = remote.clone_to(&db.dir.path().join("src/web"));
    let home = home_with(db.dir.path(), "m", &web_repo(&clone, ""));
    let evil = db.dir.path().join("evil.git");
    let agent = RecordingAgent::new(
        db.dir.path(),
        &format!(
            r#"git init --quiet --bare {evil}
git config url.{evil}.pushInsteadOf "$(git remote get-url origin)"
echo work > work.txt"#,
            evil = evil.display()
        ),
    );
    let id = enqueue(&home, &db, &orch, &["--title", "Rewrite", "--repo", "web", "--max-attempts", "1"]);
    // Unconfined on purpose, as above: confined, the clone's config is read-only to the agent.
    let (code, log) = drain(&home, &db, &orch, &agent.script, &["--sandbox", "off"], Duration::from_secs(60));
    assert_eq!(code, Some(0), "{log}");
    let refs = Command::new("git").arg("--git-dir").arg(&evil).args(["for-each-ref"]).output().unwrap();
    assert!(refs.stdout.is_empty(), "the push went to the agent's repository");
    assert!(remote.show(&format!("devpilot/{id}-rewrite"), "work.txt").is_none(), "nor anywhere else");
    let j = job(&db, id).await;
    assert_eq!(j.state, JobState::Completed);
    let kept = j.worktree.unwrap_or_default();
    assert!(kept.contains("pushinsteadof") && kept.contains("does not follow"), "{kept}");
}

/// Finding 4. `setup` runs in a worktree made from the remote's base, and not again when the
/// worktree is reused for the next attempt (the agent rewrote `setup.sh` in between), nor in
/// one made from a branch an agent pushed (`--base devpilot/…`).
async fn setup_runs_only_on_the_remotes_base(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("setup");
    let remote = GitRemote::new(db.dir.path());
    let marker = db.dir.path().join("setup-ran.log");
    let seed = db.dir.path().join("seed");
    std::fs::write(seed.join("setup.sh"), format!("echo base-setup >> {}\n", marker.display())).unwrap();
    git(&seed, &["add", "setup.sh"]);
    git(&seed, &["commit", "--quiet", "-m", "setup"]);
    git(&seed, &["push", "--quiet", "origin", "main"]);
    let clone = remote.clone_to(&db.dir.path().join("src/web"));
    let home = home_with(db.dir.path(), "m", &web_repo(&clone, "setup = [\"sh\", \"setup.sh\"]"));
    let agent = RecordingAgent::new(
        db.dir.path(),
        &format!(
            "echo 'echo AGENT-CODE >> {}' > setup.sh\nif [ \"$DEVPILOT_ATTEMPT\" = 1 ] && [ \"$DEVPILOT_BRANCH\" != \"${{DEVPILOT_BRANCH#*-first}}\" ]; then exit 1; fi\necho done",
            marker.display()
        ),
    );
    let first = enqueue(
        &home,
        &db,
        &orch,
        &["--title", "first", "--repo", "web", "--max-attempts", "2", "--retry-backoff", "100ms"],
    );
    let (code, log) = drain(&home, &db, &orch, &agent.script, &[], Duration::from_secs(60));
    assert_eq!(code, Some(0), "{log}");
    let j = job(&db, first).await;
    assert_eq!((j.state.as_str(), j.attempts), ("completed", 2), "failed once, then reused its worktree");
    let branch = format!("devpilot/{first}-first");
    assert!(remote.show(&branch, "setup.sh").unwrap_or_default().contains("AGENT-CODE"));
    let second = enqueue(&home, &db, &orch, &["--title", "second", "--repo", "web", "--base", &branch]);
    let (code, log) = drain(&home, &db, &orch, &agent.script, &[], Duration::from_secs(60));
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(job(&db, second).await.state, JobState::Completed);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "base-setup\n", "setup ran once, on the base only");
    let jl = job_log(&home, first);
    assert!(jl.contains("setup `sh setup.sh` not run: this worktree holds an agent's work"), "{jl}");
}

/// Finding 5. A base that exists only as a local branch of the clone (private work) is not
/// used: the job fails and nothing of it reaches the remote.
async fn a_base_is_taken_only_from_the_remote(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("localbase");
    let remote = GitRemote::new(db.dir.path());
    let clone = remote.clone_to(&db.dir.path().join("src/web"));
    git(&clone, &["checkout", "--quiet", "-b", "secret-wip"]);
    std::fs::write(clone.join("secret.txt"), "private notes\n").unwrap();
    git(&clone, &["add", "secret.txt"]);
    git(&clone, &["commit", "--quiet", "-m", "wip"]);
    git(&clone, &["checkout", "--quiet", "main"]);
    let home = home_with(db.dir.path(), "m", &web_repo(&clone, ""));
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let id =
        enqueue(&home, &db, &orch, &["--title", "wip", "--repo", "web", "--base", "secret-wip", "--max-attempts", "1"]);
    let (code, log) = drain(&home, &db, &orch, &agent.script, &[], Duration::from_secs(60));
    assert_eq!(code, Some(0), "{log}");
    let j = job(&db, id).await;
    assert_eq!(j.state, JobState::Dead);
    assert!(j.last_error.unwrap_or_default().contains("no branch 'secret-wip' on origin"));
    let refs = Command::new("git")
        .arg("--git-dir")
        .arg(&remote.bare)
        .args(["for-each-ref", "--format=%(refname)"])
        .output()
        .unwrap();
    let refs = String::from_utf8_lossy(&refs.stdout);
    assert!(!refs.contains("devpilot/") && !refs.contains("secret-wip"), "published: {refs}");
}

/// Finding 6. A 200 KB prompt reaches a preset's CLI whole (on stdin, since no argument may
/// be that long), and a prompt with a NUL (which no argument can hold) fails its own attempt
/// with the reason, or on PostgreSQL never gets in; either way the next job still runs.
async fn a_poison_prompt_never_blocks_the_machine(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("poison");
    let bin = db.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = db.dir.path().join("claude.log");
    std::fs::write(
        bin.join("claude"),
        format!(
            "#!/bin/sh\nn=$(cat | wc -c)\necho \"$DEVPILOT_JOB_ID args $# stdin $n\" >> {}\necho answered\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = home_with(db.dir.path(), "m", "");
    let big = "x".repeat(200_000);
    let prio = |p| JobOptions { priority: p, max_attempts: 1, ..JobOptions::default() };
    let long = db.queue.enqueue_with(&orch, &json!({"title": "big", "prompt": big}), prio(5)).await.unwrap();
    let small = db.queue.enqueue_with(&orch, &json!({"title": "small", "prompt": "hi"}), prio(0)).await.unwrap();
    let nul = format!(
        r#"INSERT INTO dispatch_queue (orchestrator_id, payload, title, priority, max_attempts)
           VALUES ('{orch}', '{{"title": "nul", "prompt": "a\u0000b"}}', 'nul', 9, 1)"#
    );
    let nul_id = if backend.is_postgres() {
        let refused = db.admin().execute_unprepared(&nul).await.unwrap_err().to_string();
        assert!(refused.contains("Unicode escape"), "PostgreSQL's jsonb refuses it: {refused}");
        None
    } else {
        db.exec(&nul).await;
        db.scalar("SELECT MAX(id) FROM dispatch_queue").await
    };
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let mut c = devpilot(&home, &db.raw_url);
    // The stand-in CLI records its calls beside itself, outside its sandbox.
    c.args(["run", "--orchestrator", &orch, "--machine", "m", "--agent", "claude", "--until-empty"])
        .args(fast_flags())
        .args(["--allow-write", &db.dir.path().display().to_string()])
        .env("PATH", &path);
    let (code, log) = finish(c, db.dir.path(), Duration::from_secs(60));
    assert_eq!(code, Some(0), "the machine drained the queue: {log}");
    let calls = std::fs::read_to_string(&calls).unwrap();
    let line = calls.lines().find(|l| l.starts_with(&format!("{long} "))).unwrap();
    let stdin: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(stdin >= 200_000, "the whole prompt arrived on stdin: {line}");
    for id in [long, small] {
        assert_eq!(job(&db, id).await.state, JobState::Completed, "job {id}");
    }
    if let Some(id) = nul_id {
        let j = job(&db, id).await;
        assert_eq!(j.state, JobState::Dead);
        assert!(j.last_error.unwrap_or_default().contains("NUL"), "failed with the reason");
    }
}

/// Finding 7. An agent's summary with a NUL (which PostgreSQL cannot store, and which ended
/// an inlined statement early through the pooler: 08P01, retried for 15 minutes) is stored
/// without it at once, and a `javascript:` link is dropped.
async fn a_nul_summary_is_cleaned_and_a_script_url_dropped(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("nulsum");
    let home = home_with(db.dir.path(), "m", "");
    let agent = RecordingAgent::new(
        db.dir.path(),
        r#"printf '{"summary": "before\\u0000after", "url": "javascript:alert(1)"}' > "$DEVPILOT_RESULT_FILE""#,
    );
    let id = enqueue(&home, &db, &orch, &["--title", "nul summary"]);
    let pooled: &[&str] = if backend == Backend::Pooled { &["--poll-only"] } else { &[] };
    let (code, log) = drain(&home, &db, &orch, &agent.script, pooled, Duration::from_secs(30));
    assert_eq!(code, Some(0), "the job is done in seconds: {log}");
    let j = job(&db, id).await;
    assert_eq!((j.state.as_str(), j.summary.as_deref(), j.url.as_deref()), ("completed", Some("beforeafter"), None));
}

/// Finding 8. A FIFO or a symlink to /dev/zero where the agent's result file goes is not
/// read (the job completes, with the agent's last line as its summary), and SIGTERM hands a
/// running job off and ends the runner within its bound.
async fn a_fifo_or_dev_zero_result_file_is_ignored_and_sigterm_works(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("fifo");
    let home = home_with(db.dir.path(), "m", "");
    let agent = RecordingAgent::new(
        db.dir.path(),
        r#"case "$payload" in
  *fifo*) rm -f "$DEVPILOT_RESULT_FILE"; mkfifo "$DEVPILOT_RESULT_FILE" ;;
  *zero*) rm -f "$DEVPILOT_RESULT_FILE"; ln -s /dev/zero "$DEVPILOT_RESULT_FILE" ;;
  *stay*) rm -f "$DEVPILOT_RESULT_FILE"; mkfifo "$DEVPILOT_RESULT_FILE"; echo staying; sleep 60 & wait ;;
esac
echo finished"#,
    );
    let fifo = enqueue(&home, &db, &orch, &["--payload", r#"{"kind": "fifo"}"#, "--priority", "2"]);
    let zero = enqueue(&home, &db, &orch, &["--payload", r#"{"kind": "zero"}"#, "--priority", "1"]);
    let mut r = spawn_runner(&home, &db.raw_url, &orch, "m", &fast_flags(), &agent.script, &[]);
    for id in [fifo, zero] {
        let done =
            wait_for(Duration::from_secs(30), || async { job(&db, id).await.state == JobState::Completed }).await;
        assert!(done, "job {id} completes: {}", std::fs::read_to_string(&r.log).unwrap_or_default());
        assert_eq!(job(&db, id).await.summary.as_deref(), Some("finished"));
    }
    let stay = enqueue(&home, &db, &orch, &["--payload", r#"{"kind": "stay"}"#]);
    assert!(wait_for(Duration::from_secs(30), || async { job(&db, stay).await.state == JobState::Running }).await);
    assert!(
        wait_for(Duration::from_secs(10), || async {
            agent.records().iter().any(|x| x.kind == "start" && x.job == stay)
        })
        .await
    );
    // SAFETY: plain kill(2) of the runner we started.
    unsafe { libc::kill(r.pid() as i32, libc::SIGTERM) };
    assert_eq!(r.wait_timeout(Duration::from_secs(20)), Some(0), "the runner hands off and exits");
    assert_eq!(job(&db, stay).await.state, JobState::Queued, "handed back");
}

/// Finding 9. A 2 MB payload is refused by the CLI (before it is all read) and by a plain
/// INSERT, as are 33 labels, a 65-byte label and an oversized title: each with a clear
/// error, and no row.
async fn oversized_jobs_are_refused_at_every_door(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("caps");
    let home = home_with(db.dir.path(), "m", "");
    let file = db.dir.path().join("big.json");
    std::fs::write(&file, json!({"title": "big", "prompt": "y".repeat(2 * 1024 * 1024)}).to_string()).unwrap();
    let f = file.display().to_string();
    let (code, _, err) = run_cli(&home, &db.raw_url, &["enqueue", "--orchestrator", &orch, "--payload-file", &f], None);
    assert_eq!(code, 1);
    assert!(err.contains("1 MiB"), "{err}");
    let many: Vec<String> = (0..33).map(|i| format!("l{i}")).collect();
    let (code, _, err) =
        run_cli(&home, &db.raw_url, &["enqueue", "--orchestrator", &orch, "--requires", &many.join(",")], None);
    assert_eq!(code, 1);
    assert!(err.contains("at most 32"), "{err}");
    let insert = |payload: String, title: &str| {
        format!(
            "INSERT INTO dispatch_queue (orchestrator_id, payload, title) VALUES ('{orch}', '{payload}', '{title}')"
        )
    };
    let cases = [
        (insert(json!({"prompt": "y".repeat(2 * 1024 * 1024)}).to_string(), "t"), "1048576"),
        (insert(json!({"requires": many}).to_string(), "t"), "32"),
        (insert(json!({"requires": ["z".repeat(65)]}).to_string(), "t"), "64 bytes"),
        (insert(json!({"title": "t".repeat(1025)}).to_string(), "t"), "1024"),
        (insert("{}".into(), &"t".repeat(1025)), "1024"),
    ];
    for (sql, says) in cases {
        let e = db.admin().execute_unprepared(&sql).await.unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
    }
    assert_eq!(
        db.scalar(&format!("SELECT COUNT(*) FROM dispatch_queue WHERE orchestrator_id = '{orch}'")).await,
        Some(0)
    );
    db.exec(&insert(json!({"title": "fits", "requires": ["gpu"]}).to_string(), "fits")).await;
    assert_eq!(
        db.scalar(&format!("SELECT COUNT(*) FROM dispatch_queue WHERE orchestrator_id = '{orch}'")).await,
        Some(1)
    );
}

/// Finding 10. `devpilot status` shows a title with ESC, BEL and CR escaped: the title cannot
/// rewrite the terminal.
async fn status_escapes_control_characters(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("esc");
    let home = home_with(db.dir.path(), "m", "");
    let title = "ok\u{1b}[2J\u{7}\rFAKE";
    // It needs a label no machine has, so `status` lists it under "no machine can take".
    db.queue.enqueue(&orch, &json!({"title": title, "requires": ["gpu"]})).await.unwrap();
    let (code, out, err) = run_cli(&home, &db.raw_url, &["status", "--orchestrator", &orch], None);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains(['\u{1b}', '\u{7}', '\r']), "raw control characters: {out:?}");
    assert!(out.contains("ok\\u{1b}[2J\\u{7}\\rFAKE"), "{out}");
    let (code, json_out, err) = run_cli(&home, &db.raw_url, &["status", "--orchestrator", &orch, "--json"], None);
    assert_eq!(code, 0, "{err}");
    assert!(!json_out.contains('\u{1b}'), "JSON escapes them too");
    assert!(json_out.contains("ok\\u001b[2J\\u0007\\rFAKE"), "the title is there, escaped: {json_out}");
}

/// The variables in `f`, an `env -0` dump: (name, value) pairs.
fn read_env_dump(f: &Path) -> Vec<(String, String)> {
    std::fs::read(f)
        .unwrap()
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let e = String::from_utf8_lossy(e);
            let (k, v) = e.split_once('=').unwrap_or((&e, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// The agent's environment is an allowlist: every variable an agent sees is a base one, a
/// job's `DEVPILOT_*` one, one its preset's CLI reads, or one `pass_env` names. A secret in
/// the runner's environment (a database URL, a token, a variable nobody has heard of yet)
/// never reaches it.
async fn agents_get_only_the_allowlisted_environment(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("env");
    let home = home_with(db.dir.path(), "m", "");
    let dump = db.dir.path().join("env");
    std::fs::create_dir_all(&dump).unwrap();
    let fresh = format!("SOME_NEW_SECRET_{}", std::process::id());
    let secrets = [
        (fresh.as_str(), "leak-fresh"),
        ("DATABASE_URL", "postgres://u:leak-db@h/d"),
        ("GITHUB_TOKEN", "leak-gh"),
        ("AWS_SECRET_ACCESS_KEY", "leak-aws"),
        ("OPENAI_API_KEY", "leak-openai"),
        ("ANTHROPIC_API_KEY", "sk-ant-for-claude"),
        ("MY_VISIBLE", "passed on"),
    ];
    let agent = RecordingAgent::new(db.dir.path(), &format!("env -0 > {}/$DEVPILOT_JOB_ID", dump.display()));
    let bin = db.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("claude"), format!("#!/bin/sh\nenv -0 > {}/claude\necho ok\n", dump.display())).unwrap();
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let id = enqueue(&home, &db, &orch, &["--title", "env"]);
    let run = |args: &[&str], path: Option<&str>| {
        let mut c = devpilot(&home, &db.raw_url);
        c.args(["run", "--orchestrator", &orch, "--machine", "m", "--until-empty", "--pass-env", "MY_VISIBLE"])
            .args(fast_flags())
            .args(["--allow-write", &db.dir.path().display().to_string()])
            .args(args);
        for (k, v) in secrets {
            c.env(k, v);
        }
        if let Some(p) = path {
            c.env("PATH", p);
        }
        let (code, log) = finish(c, db.dir.path(), Duration::from_secs(60));
        assert_eq!(code, Some(0), "{log}");
    };
    run(&["--", &agent.script.display().to_string()], None);
    let job_vars = [
        "DEVPILOT_JOB_ID",
        "DEVPILOT_ATTEMPT",
        "DEVPILOT_CLAIM_TOKEN",
        "DEVPILOT_ORCHESTRATOR_ID",
        "DEVPILOT_MACHINE",
        "DEVPILOT_PAYLOAD_FILE",
        "DEVPILOT_RESULT_FILE",
    ];
    // What the agent's own bash adds to what it was given, and what its sandbox sets (its
    // proxy, its own temp dir and git config, who it commits as: no secret among them).
    let shell = ["PWD", "SHLVL", "_", "OLDPWD"];
    let sandbox = ["DEVPILOT_SANDBOX", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "GIT_AUTHOR_NAME"];
    let sandbox = [&sandbox[..], &["GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"]].concat();
    let allowed = |name: &str, more: &[&str]| {
        devpilot_engine::environ::BASE.iter().chain(more).any(|p| devpilot_engine::environ::matches(p, name))
            || job_vars.contains(&name)
            || shell.contains(&name)
            || sandbox.contains(&name)
            || name == "MY_VISIBLE"
    };
    let seen = read_env_dump(&dump.join(id.to_string()));
    for (k, v) in &seen {
        assert!(allowed(k, &[]), "{k} reached a command agent");
        assert!(!v.contains("leak"), "{k}={v} carries a secret");
    }
    assert!(seen.iter().any(|(k, v)| k == "MY_VISIBLE" && v == "passed on"), "pass_env reaches it");
    assert!(seen.iter().any(|(k, _)| k == "PATH") && seen.iter().any(|(k, _)| k == "HOME"));

    enqueue(&home, &db, &orch, &["--title", "claude env"]);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    run(&["--agent", "claude"], Some(&path));
    let seen = read_env_dump(&dump.join("claude"));
    let needs = devpilot_engine::preset::Preset::Claude.env_needs();
    for (k, v) in &seen {
        assert!(allowed(k, needs), "{k} reached claude");
        assert!(!v.contains("leak"), "{k}={v} carries a secret");
    }
    assert!(seen.iter().any(|(k, v)| k == "ANTHROPIC_API_KEY" && v == "sk-ant-for-claude"), "claude gets its key");
}

/// `run --until-empty` counts only the jobs this machine can take: a queued job that needs a
/// label it lacks is left, and the runner says so and exits.
async fn until_empty_leaves_jobs_no_machine_here_can_take(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("leftover");
    let home = home_with(db.dir.path(), "m", "");
    let agent = RecordingAgent::new(db.dir.path(), "echo done");
    let plain = enqueue(&home, &db, &orch, &["--title", "plain"]);
    let gpu = enqueue(&home, &db, &orch, &["--title", "needs a gpu", "--requires", "gpu"]);
    let (code, log) = drain(&home, &db, &orch, &agent.script, &[], Duration::from_secs(30));
    assert_eq!(code, Some(0), "it exits: {log}");
    assert!(log.contains("1 queued job(s) wait for a machine with other repos or labels"), "{log}");
    assert_eq!(job(&db, plain).await.state, JobState::Completed);
    assert_eq!(job(&db, gpu).await.state, JobState::Queued);
}

/// SQLSTATE 08P01 in answer to a statement the server received (here PostgreSQL's own, to a
/// NUL in a simple query) is not transient: sending it again is refused again, so it is not
/// retried (it once was, 52 times, for 15 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_violation_after_sending_is_not_retried() {
    use std::sync::Arc;
    let db = TestDb::new(Backend::Postgres).await;
    let pool = db.queue.connection().get_postgres_connection_pool();
    let raw = sea_orm::sqlx::raw_sql(sea_orm::sqlx::AssertSqlSafe("SELECT 'a\0b'")).execute(pool).await.unwrap_err();
    let code = raw.as_database_error().and_then(|d| d.code()).map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("08P01"), "{raw}");
    let e = devpilot_store::Error::from(sea_orm::DbErr::Query(sea_orm::RuntimeErr::SqlxError(Arc::new(raw))));
    assert!(!e.is_transient(), "{e} would be retried");
    assert!(db.queue.now_ms().await.is_ok(), "and the connection is still good");
}
