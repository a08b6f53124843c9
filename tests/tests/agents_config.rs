//! The real agent CLIs never run project configuration an agent wrote (the README's "Security
//! model"), offline against the scripted model server: the laptop's agent (a plain command)
//! commits a CLI's config file to the job's branch and is handed off; the desktop's real CLI
//! then works on that branch. The same file on the remote's base is honoured (the positive
//! control shows each file is really read).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::JobRow;
use devpilot_tests::*;
use serde_json::json;

/// Where the pinned CLIs are (`scripts/agent_clis.sh` installs them).
fn clis() -> PathBuf {
    let dir = std::env::var("DEVPILOT_AGENT_CLIS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/devpilot-agent-clis"));
    for cli in ["claude", "gemini", "aider"] {
        assert!(dir.join("bin").join(cli).exists(), "the agent CLIs are not installed: run scripts/agent_clis.sh");
    }
    dir.join("bin")
}

/// The test: a database, a repo on a bare remote with the laptop's and the desktop's clones,
/// the model server, and the CLIs' home (outside the temp dir, as codex wants).
struct Setup {
    db: TestDb,
    orch: String,
    remote: GitRemote,
    model: ModelServer,
    laptop: PathBuf,
    desktop: PathBuf,
    cli_home: tempfile::TempDir,
}

impl Setup {
    async fn new(name: &str, extra: &str) -> Setup {
        let db = TestDb::new(Backend::Sqlite).await;
        let orch = db.orch(name);
        let remote = GitRemote::new(db.dir.path());
        let model = ModelServer::start().unwrap();
        let cli_home = tempfile::Builder::new().prefix("devpilot-cli-").tempdir_in("/var/tmp").unwrap();
        let gemini = cli_home.path().join(".gemini");
        std::fs::create_dir_all(&gemini).unwrap();
        let settings = json!({"general": {"maxAttempts": 1}, "security": {"auth": {"selectedType": "gemini-api-key"}}});
        std::fs::write(gemini.join("settings.json"), settings.to_string()).unwrap();
        let (laptop, desktop) = (db.dir.path().join("laptop"), db.dir.path().join("desktop"));
        for (home, m) in [(&laptop, "laptop"), (&desktop, "desktop")] {
            let clone = remote.clone_to(&db.dir.path().join(format!("{m}-src/webapp")));
            write_config(home, &format!("{extra}\n[repos.webapp]\npath = \"{}\"\npush = true\n", clone.display()));
        }
        Setup { db, orch, remote, model, laptop, desktop, cli_home }
    }

    /// A job for the repo, from its base.
    fn job(&self, title: &str) -> i64 {
        let args = ["--title", title, "--prompt", "Say hello.", "--repo", "webapp", "--max-attempts", "1"];
        enqueue(&self.laptop, &self.db, &self.orch, &args)
    }

    /// The laptop runs `body` as its agent in job `id`'s worktree and is handed off: the
    /// files it wrote are committed to the job's branch and pushed.
    async fn laptop_commits(&self, id: i64, body: &str) {
        let agent = RecordingAgent::new(self.db.dir.path(), &format!("set -e\n{body}\nsleep 120"));
        let mut a =
            spawn_runner(&self.laptop, &self.db.raw_url, &self.orch, "laptop", &fast_flags(), &agent.script, &[]);
        let started = || async { std::fs::read_to_string(&agent.record).is_ok_and(|r| r.contains("start")) };
        assert!(wait_for(Duration::from_secs(30), started).await, "the laptop's agent started");
        let args = ["release", "--orchestrator", &self.orch, "--machine", "laptop", "--wait", "30s"];
        let (code, out, err) = run_cli(&self.laptop, &self.db.raw_url, &args, None);
        assert_eq!(code, 0, "{out}{err}");
        let _ = a.child.kill();
        let _ = a.child.wait();
        assert_eq!(job(&self.db, id).await.state, JobState::Queued, "handed off");
    }

    /// The desktop runs `preset` until the queue is empty.
    fn desktop_runs(&self, preset: &str, model_url: &str) {
        let mut c = devpilot(&self.desktop, &self.db.raw_url);
        c.args(["run", "--orchestrator", &self.orch, "--machine", "desktop", "--agent", preset, "--until-empty"])
            .args(fast_flags())
            // The hooks and MCP servers of the positive controls mark the test's directory,
            // outside the CLI's sandbox.
            .arg("--allow-write")
            .arg(self.db.dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.desktop.join(format!("run-{preset}.log"))).unwrap());
        let path = format!("{}:{}", clis().display(), std::env::var("PATH").unwrap());
        let home = self.cli_home.path().display().to_string();
        let env = [
            ("PATH", path),
            ("HOME", home),
            ("ANTHROPIC_BASE_URL", model_url.to_string()),
            ("ANTHROPIC_API_KEY", "sk-ant-test-key".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("OPENAI_API_KEY", "sk-test-key".into()),
            ("OPENAI_API_BASE", format!("{model_url}/v1")),
            ("GEMINI_API_KEY", "gemini-test-key".into()),
            ("GOOGLE_GEMINI_BASE_URL", model_url.to_string()),
        ];
        for (k, v) in env {
            c.env(k, v);
        }
        let status = c.status().expect("devpilot run");
        assert!(status.success(), "{}", self.log(preset));
    }

    fn log(&self, preset: &str) -> String {
        std::fs::read_to_string(self.desktop.join(format!("run-{preset}.log"))).unwrap_or_default()
    }

    /// Commits `files` (path, content) to the remote's base.
    fn on_base(&self, files: &[(&str, &str)]) {
        let seed = self.db.dir.path().join("seed");
        for (path, text) in files {
            let p = seed.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
            git(&seed, &["add", "-f", path]);
        }
        git(&seed, &["commit", "--quiet", "-m", "the team's CLI config"]);
        git(&seed, &["push", "--quiet", "origin", "main"]);
    }

    fn branch_has(&self, id: i64, file: &str) -> bool {
        self.remote.show(&format!("devpilot/{id}-agent-config"), file).is_some()
    }
}

async fn job(db: &TestDb, id: i64) -> JobRow {
    db.queue.job(id).await.unwrap().unwrap().0
}

/// The shell lines that write `text` to `path` in the worktree and stage it (even where
/// ignored).
fn write(path: &str, text: &str) -> String {
    format!("mkdir -p \"$(dirname {path})\"\ncat > {path} <<'EOF'\n{text}\nEOF\ngit add -f {path}")
}

/// claude: a SessionStart and a Stop hook in `.claude/settings.json` that the laptop's agent
/// committed never run on the desktop (`--setting-sources user`); the same hooks committed
/// to the remote's base do run there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_never_runs_an_agents_hooks_but_runs_the_bases() {
    let s = Setup::new("claude-cfg", "").await;
    let mark = s.db.dir.path().join("hooks.log");
    let settings = |who: &str| {
        let hook = |event: &str| json!([{"hooks": [{"type": "command", "command": format!("echo {who}-{event} >> {}", mark.display())}]}]);
        json!({"hooks": {"SessionStart": hook("start"), "Stop": hook("stop")}}).to_string()
    };
    let id = s.job("Agent config");
    s.laptop_commits(id, &write(".claude/settings.json", &settings("agent"))).await;
    assert!(s.branch_has(id, ".claude/settings.json"), "the agent's settings are on the job's branch");
    s.model.script([Turn::Text("Hello.".into())]);
    s.desktop_runs("claude", &s.model.url());
    assert_eq!(job(&s.db, id).await.state, JobState::Completed, "{}", s.log("claude"));
    let ran = std::fs::read_to_string(&mark).unwrap_or_default();
    assert!(!ran.contains("agent"), "the agent's hooks ran on the desktop:\n{ran}");

    // The positive control: the team's own hooks, on the base, in a worktree made from it.
    s.on_base(&[(".claude/settings.json", &settings("base"))]);
    let base = s.job("From the base");
    s.model.script([Turn::Text("Hello.".into())]);
    s.desktop_runs("claude", &s.model.url());
    assert_eq!(job(&s.db, base).await.state, JobState::Completed, "{}", s.log("claude"));
    let ran = std::fs::read_to_string(&mark).unwrap_or_default();
    assert!(ran.contains("base-start") && ran.contains("base-stop"), "the base's hooks ran: {ran:?}");
    assert!(!ran.contains("agent"), "{ran}");
}

/// The aider preset's settings: a model litellm sends to the OpenAI-compatible server.
const AIDER_SETTINGS: &str =
    "[agents.aider]\nargs = [\"--model\", \"openai/test-model\", \"--no-show-model-warnings\"]\n";

/// aider: an `.aider.conf.yml` and a `.env` that the laptop's agent committed, pointing the
/// API at another server, never send the key there: the desktop refuses the attempt (aider
/// has no switch to ignore them) and says why. The same `.aider.conf.yml` on the base is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_never_sends_the_key_where_an_agent_pointed_it() {
    let elsewhere = ModelServer::start().unwrap();
    // The base's config names the other server: the sandbox lets aider reach it only because
    // this machine's settings allow that host (a repo's config never widens the sandbox).
    let allow = format!("[sandbox]\nallow_hosts = [\"{}\"]\n", elsewhere.url().trim_start_matches("http://"));
    let s = Setup::new("aider-cfg", &format!("{AIDER_SETTINGS}{allow}")).await;
    let conf = format!("openai-api-base: {}/v1", elsewhere.url());
    let env = format!("OPENAI_API_BASE={}/v1", elsewhere.url());
    let id = s.job("Agent config");
    s.laptop_commits(id, &format!("{}\n{}", write(".aider.conf.yml", &conf), write(".env", &env))).await;
    assert!(s.branch_has(id, ".aider.conf.yml") && s.branch_has(id, ".env"), "both are on the job's branch");
    s.model.script([Turn::Text("Hello.".into())]);
    elsewhere.script([Turn::Text("Hello from elsewhere.".into())]);
    s.desktop_runs("aider", &s.model.url());
    let keyed = |m: &ModelServer| m.requests().iter().any(|r| r.headers.iter().any(|(_, v)| v.contains("sk-test-key")));
    assert!(!keyed(&elsewhere), "the key went where the agent pointed it: {:?}", elsewhere.requests());
    let row = job(&s.db, id).await;
    assert_ne!(row.state, JobState::Completed);
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("aider preset was not started") && error.contains(".aider.conf.yml"), "{error}");

    // The positive control: the team's `.aider.conf.yml` on the base is read.
    s.on_base(&[(".aider.conf.yml", &conf)]);
    let base = s.job("From the base");
    s.desktop_runs("aider", &s.model.url());
    assert_eq!(job(&s.db, base).await.state, JobState::Completed, "{}", s.log("aider"));
    assert!(keyed(&elsewhere), "the base's config pointed aider at the other server");
}

/// gemini: an `mcpServers` command in `.gemini/settings.json` that the laptop's agent
/// committed never starts on the desktop: gemini runs headless only in a folder it trusts,
/// and loads a trusted folder's `.gemini/`, so the attempt is refused with the reason. The
/// same server on the base does start there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_never_starts_an_agents_mcp_server_but_starts_the_bases() {
    let s = Setup::new("gemini-cfg", "").await;
    let mark = s.db.dir.path().join("mcp.log");
    let settings = |who: &str| {
        let cmd = format!("echo {who}-mcp >> {}; exit 1", mark.display());
        json!({"mcpServers": {"tools": {"command": "sh", "args": ["-c", cmd]}}}).to_string()
    };
    let id = s.job("Agent config");
    s.laptop_commits(id, &write(".gemini/settings.json", &settings("agent"))).await;
    assert!(s.branch_has(id, ".gemini/settings.json"));
    s.model.script([Turn::Text("Hello.".into())]);
    s.desktop_runs("gemini", &s.model.url());
    let ran = std::fs::read_to_string(&mark).unwrap_or_default();
    assert!(!ran.contains("agent"), "the agent's MCP server started on the desktop:\n{ran}");
    let error = job(&s.db, id).await.last_error.unwrap_or_default();
    assert!(error.contains("gemini preset was not started") && error.contains(".gemini"), "{error}");

    s.on_base(&[(".gemini/settings.json", &settings("base"))]);
    let base = s.job("From the base");
    s.desktop_runs("gemini", &s.model.url());
    assert_eq!(job(&s.db, base).await.state, JobState::Completed, "{}", s.log("gemini"));
    let ran = std::fs::read_to_string(&mark).unwrap_or_default();
    assert!(ran.contains("base-mcp"), "the base's MCP server started: {ran:?}");
}
