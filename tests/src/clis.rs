//! The real agent CLIs' machines: where the pinned CLIs are, and one machine of a test (its
//! DevPilot home, the HOME its CLIs see, its runner's environment) whose CLIs talk to the
//! scripted model server.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::JobRow;

use serde_json::json;

use crate::{devpilot, fast_flags, wait_for, write_config, ModelServer, Runner, TestDb};

/// Where the pinned CLIs are (`scripts/agent_clis.sh` installs them; CI runs it first).
pub fn clis() -> PathBuf {
    let dir = std::env::var("DEVPILOT_AGENT_CLIS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/devpilot-agent-clis"));
    let bin = dir.join("bin");
    for cli in ["claude", "codex", "gemini", "aider"] {
        let ok = std::fs::metadata(bin.join(cli)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        assert!(ok, "the agent CLI {cli} is not installed: run scripts/agent_clis.sh");
    }
    bin
}

/// One machine of a test: its DevPilot home (config, data), the HOME its CLIs see (outside
/// the temp dir: codex refuses to set itself up under it), and its runner's environment.
pub struct Machine {
    pub name: &'static str,
    pub home: PathBuf,
    pub cli_home: PathBuf,
    pub env: Vec<(String, String)>,
}

/// The CLI homes of one test, removed at its end.
pub fn cli_root() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("devpilot-cli-").tempdir_in("/var/tmp").expect("a dir in /var/tmp")
}

impl Machine {
    /// A machine with `repo` configured (pushing on completion) and `extra` TOML, whose
    /// CLIs talk to `model`.
    pub fn new(db: &TestDb, root: &Path, name: &'static str, repo: &Path, model: &ModelServer, extra: &str) -> Self {
        let home = db.dir.path().join(name);
        let cli_home = root.join(name);
        std::fs::create_dir_all(&cli_home).unwrap();
        let toml = format!("{extra}\n[repos.webapp]\npath = \"{}\"\npush = true\n", repo.display());
        write_config(&home, &toml);
        codex_config(&cli_home, &model.url());
        gemini_settings(&cli_home);
        let path = format!("{}:{}", clis().display(), std::env::var("PATH").unwrap());
        let env = [
            ("PATH", path),
            ("HOME", cli_home.display().to_string()),
            ("CODEX_HOME", cli_home.join(".codex").display().to_string()),
            ("ANTHROPIC_BASE_URL", model.url()),
            ("ANTHROPIC_API_KEY", "sk-ant-test-key".to_string()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
            ("OPENAI_API_KEY", "sk-test-key".to_string()),
            ("OPENAI_API_BASE", format!("{}/v1", model.url())),
            ("GEMINI_API_KEY", "gemini-test-key".to_string()),
            ("GOOGLE_GEMINI_BASE_URL", model.url()),
        ];
        let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Machine { name, home, cli_home, env }
    }

    /// `devpilot run --agent PRESET` as this machine.
    pub fn run(&self, db: &TestDb, orch: &str, preset: &str, extra: &[&str]) -> Runner {
        self.run_on(&db.raw_url, orch, preset, extra)
    }

    /// [`Machine::run`] on the database at `url` (a forwarder's, say).
    pub fn run_on(&self, url: &str, orch: &str, preset: &str, extra: &[&str]) -> Runner {
        let log_path = self.home.join(format!("runner-{}.log", self.name));
        std::fs::create_dir_all(&self.home).unwrap();
        let log = std::fs::File::create(&log_path).expect("runner log");
        let mut c = devpilot(&self.home, url);
        c.args(["run", "--orchestrator", orch, "--machine", self.name, "--agent", preset])
            .args(fast_flags())
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(log));
        for (k, v) in &self.env {
            c.env(k, v);
        }
        let child = c.spawn().expect("spawn devpilot run");
        Runner { child, machine: self.name.to_string(), log: log_path }
    }
}

/// codex's config: the scripted server as a Responses provider, over HTTP (not WebSockets),
/// with no retries of its own (so an error ends the turn at once).
pub fn codex_config(cli_home: &Path, url: &str) {
    let dir = cli_home.join(".codex");
    std::fs::create_dir_all(&dir).unwrap();
    let toml = format!(
        "model_provider = \"mock\"\n\n[model_providers.mock]\nname = \"mock\"\nbase_url = \"{url}/v1\"\n\
         env_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\nsupports_websockets = false\n\
         request_max_retries = 0\nstream_max_retries = 0\nstream_idle_timeout_ms = 20000\n"
    );
    std::fs::write(dir.join("config.toml"), toml).unwrap();
}

/// gemini's settings: API-key auth (the key and base URL come from the environment), and
/// two tries of a model call rather than ten (a 429 ends in seconds, not minutes).
pub fn gemini_settings(cli_home: &Path) {
    let dir = cli_home.join(".gemini");
    std::fs::create_dir_all(&dir).unwrap();
    let settings = json!({"general": {"maxAttempts": 2}, "security": {"auth": {"selectedType": "gemini-api-key"}}});
    std::fs::write(dir.join("settings.json"), settings.to_string()).unwrap();
}

/// Job `id` as the database has it now.
pub async fn job(db: &TestDb, id: i64) -> JobRow {
    db.queue.job(id).await.unwrap().unwrap().0
}

/// Job `id` once it is in one of `states`, within `limit` (else the test fails, saying where
/// it is and why).
pub async fn wait_state(db: &TestDb, id: i64, states: &[JobState], limit: Duration) -> JobRow {
    let done = wait_for(limit, || async { states.contains(&job(db, id).await.state) }).await;
    let row = job(db, id).await;
    assert!(done, "job {id} is {:?}, not one of {states:?}: {:?}", row.state, row.last_error);
    row
}
