//! The agent runner: starts one agent per claimed job and stops it on demand.
//!
//! The agent is an argv (program + arguments), never a shell string, and the payload never
//! becomes part of it: the agent reads the payload from stdin or from the file named by
//! `DEVPILOT_PAYLOAD_FILE`. Each agent runs in its own process group, so cancelling reaches
//! the whole tree, and it dies with its runner (PR_SET_PDEATHSIG) so a killed runner can
//! never leave an agent working on a job that the sweep has handed to someone else.
//!
//! What the agent says back: its exit status (0 done, 75 = EX_TEMPFAIL "try later", anything
//! else failed) and, optionally, a JSON result file at `DEVPILOT_RESULT_FILE`:
//! `{"summary": "...", "url": "https://...", "retry_after": "2026-12-01T10:00:00Z" | 3600}`.
//! A malformed result file is logged and ignored; it never fails a job. With no summary in
//! it, the summary is the last non-empty line the agent printed.
//!
//! A preset ([`crate::preset`]) is an argv built per job from the payload's title, prompt
//! and URL; a job with a `repo` runs in its git worktree ([`crate::worktree`]), with
//! `DEVPILOT_WORKTREE` and `DEVPILOT_BRANCH` (and, after a hand-off, `DEVPILOT_RESUME_BRANCH`
//! and `DEVPILOT_RESUMED_FROM`) in its environment.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::error::{Error, Result};
use crate::preset::{Preset, PresetSettings};
use crate::queue::{Claim, RetryAfter};
use crate::spec::JobSpec;

/// What runs a job.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentSpec {
    /// A real agent process.
    Command(Vec<String>),
    /// A built-in preset (claude, codex, aider, gemini), with this machine's additions.
    Preset { preset: Preset, settings: PresetSettings },
    /// The built-in demo: logs the payload and succeeds after `duration`.
    Demo { duration: Duration },
    /// Succeeds at once, in process (benchmarks of the queue itself).
    NoOp,
}

/// Where agents write and who they run for.
#[derive(Clone, Debug)]
pub struct AgentEnv {
    pub log_dir: PathBuf,
    pub payload_dir: PathBuf,
    pub machine: String,
}

/// Extra environment variables for an agent.
type EnvVars = Vec<(String, String)>;

/// Where and for what one job's agent runs, besides its claim.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    pub spec: JobSpec,
    /// The job's worktree and branch, when it has a repo.
    pub worktree: Option<(PathBuf, String)>,
}

/// How an agent ended.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentExit {
    Success,
    Failed(String),
    /// Exit 75 (EX_TEMPFAIL): not a failure; try again later (a usage limit, say).
    TryLater,
}

/// The exit status that means "try later" (sysexits.h's EX_TEMPFAIL).
pub const EX_TEMPFAIL: i32 = 75;

/// What an agent wrote to its result file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentResult {
    pub summary: Option<String>,
    pub url: Option<String>,
    pub retry_after: Option<RetryAfter>,
}

impl AgentResult {
    /// Parses a result file's text. Unknown fields are ignored; a wrong type is an error.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON ({e})"))?;
        let obj = v.as_object().ok_or("not a JSON object")?;
        let text_field = |k: &str| match obj.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("\"{k}\" must be a string, not {other}")),
        };
        let retry_after = match obj.get("retry_after") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Number(n)) => {
                let secs = n.as_f64().filter(|s| s.is_finite() && *s >= 0.0).ok_or("\"retry_after\" must be >= 0")?;
                Some(RetryAfter::In(Duration::from_secs_f64(secs.min(366.0 * 86_400.0))))
            }
            Some(serde_json::Value::String(s)) => {
                let ms = crate::config::parse_time_ms(s)
                    .map_err(|e| format!("\"retry_after\" is not an RFC 3339 time ({e})"))?;
                Some(RetryAfter::At(ms))
            }
            Some(other) => return Err(format!("\"retry_after\" must be a time or a number of seconds, not {other}")),
        };
        Ok(Self { summary: text_field("summary")?, url: text_field("url")?, retry_after })
    }
}

impl AgentSpec {
    /// Checks that the agent program exists and is executable, so a typo is reported before
    /// any job is claimed.
    pub fn check(&self) -> Result<()> {
        match self {
            AgentSpec::Command(argv) => {
                let prog = argv.first().ok_or_else(|| Error::Invalid("the agent command is empty".into()))?;
                resolve_program(prog).map(|_| ())
            }
            AgentSpec::Preset { preset, .. } => resolve_preset(*preset).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// What a person would call this agent: the preset's name, or the program.
    pub fn describe(&self) -> String {
        match self {
            AgentSpec::Command(argv) => argv.first().cloned().unwrap_or_default(),
            AgentSpec::Preset { preset, .. } => format!("the {preset} preset"),
            AgentSpec::Demo { .. } => "the demo agent".into(),
            AgentSpec::NoOp => "no agent".into(),
        }
    }

    /// The argv and extra environment for one job.
    fn command_line(&self, claim: &Claim, spec: &JobSpec) -> Option<(Vec<String>, EnvVars)> {
        match self {
            AgentSpec::Command(argv) => Some((argv.clone(), vec![])),
            AgentSpec::Preset { preset, settings } => {
                let prompt = spec.prompt_text(claim.resumed_from.as_deref(), &claim.payload);
                let env = settings.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                Some((preset.argv(&prompt, &settings.args), env))
            }
            _ => None,
        }
    }

    /// Whether starting this agent writes anything (the in-process no-op does not).
    pub fn writes_log(&self) -> bool {
        !matches!(self, AgentSpec::NoOp)
    }

    /// Starts the agent for `claim`, its output appended to `log` (see [`AgentEnv::open_log`]).
    pub async fn start(
        &self,
        claim: &Claim,
        env: &AgentEnv,
        launch: &Launch,
        log: Option<std::fs::File>,
    ) -> Result<RunningAgent> {
        let (log, log_path) = match log {
            Some(l) => (l, env.log_path(claim.id)),
            // Nothing runs, so there is no output to keep. (Creating a file per job was most
            // of the client's CPU in the benchmark's no-op drain: ext4 inode allocation.)
            None => return Ok(RunningAgent::InProcess(None)),
        };
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        match self {
            AgentSpec::NoOp => Ok(RunningAgent::InProcess(None)),
            AgentSpec::Demo { duration } => {
                let mut log = log;
                let payload = serde_json::to_string_pretty(&claim.payload).unwrap_or_default();
                let duration = *duration;
                let task = tokio::spawn(async move {
                    use std::io::Write;
                    let _ = writeln!(log, "demo agent: received payload\n{payload}");
                    tokio::time::sleep(duration).await;
                    let _ = writeln!(log, "demo agent: done");
                    AgentExit::Success
                });
                Ok(RunningAgent::InProcess(Some(task)))
            }
            AgentSpec::Command(_) | AgentSpec::Preset { .. } => {
                let (argv, extra_env) = self.command_line(claim, &launch.spec).unwrap_or_default();
                let prog = match self {
                    AgentSpec::Preset { preset, .. } => resolve_preset(*preset)?,
                    _ => resolve_program(&argv[0])?,
                };
                std::fs::create_dir_all(&env.payload_dir)?;
                let payload_file = env.payload_dir.join(format!("job-{}-{}.json", claim.id, claim.token));
                let result_file = env.payload_dir.join(format!("job-{}-{}.result.json", claim.id, claim.token));
                let _ = std::fs::remove_file(&result_file);
                let body = serde_json::to_vec(&claim.payload).map_err(|e| Error::Payload(e.to_string()))?;
                {
                    use std::io::Write;
                    let mut f = crate::config::private_file(&payload_file)?;
                    f.write_all(&body)?;
                }
                let mut cmd = Command::new(&prog);
                cmd.args(&argv[1..])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::from(log.try_clone()?))
                    .stderr(Stdio::from(log))
                    .env("DEVPILOT_JOB_ID", claim.id.to_string())
                    .env("DEVPILOT_ATTEMPT", claim.attempt.to_string())
                    .env("DEVPILOT_CLAIM_TOKEN", claim.token.to_string())
                    .env("DEVPILOT_ORCHESTRATOR_ID", &claim.orchestrator_id)
                    .env("DEVPILOT_MACHINE", &env.machine)
                    .env("DEVPILOT_PAYLOAD_FILE", &payload_file)
                    .env("DEVPILOT_RESULT_FILE", &result_file)
                    // A secret in the runner's environment is not the agent's business.
                    .env_remove("DEVPILOT_DATABASE_URL")
                    .env_remove("PGPASSWORD")
                    .envs(extra_env)
                    .kill_on_drop(true)
                    .process_group(0);
                if let Some((dir, branch)) = &launch.worktree {
                    cmd.current_dir(dir).env("DEVPILOT_WORKTREE", dir).env("DEVPILOT_BRANCH", branch);
                }
                if let Some(b) = &claim.resume_branch {
                    cmd.env("DEVPILOT_RESUME_BRANCH", b);
                }
                if let Some(m) = &claim.resumed_from {
                    cmd.env("DEVPILOT_RESUMED_FROM", m);
                }
                #[cfg(target_os = "linux")]
                // SAFETY: prctl is async-signal-safe and touches only the child being exec'd.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let mut child = cmd.spawn().map_err(|e| {
                    let _ = std::fs::remove_file(&payload_file);
                    if e.kind() == std::io::ErrorKind::NotFound || e.kind() == std::io::ErrorKind::PermissionDenied {
                        match self {
                            AgentSpec::Preset { preset, .. } => preset_missing(*preset),
                            _ => Error::AgentMissing(argv[0].clone()),
                        }
                    } else {
                        Error::Io(format!("cannot start the agent '{}': {e}", argv[0]))
                    }
                })?;
                if let Some(mut stdin) = child.stdin.take() {
                    // The agent may ignore stdin; a closed pipe is not an error.
                    tokio::spawn(async move {
                        let _ = stdin.write_all(&body).await;
                        let _ = stdin.shutdown().await;
                    });
                }
                Ok(RunningAgent::Process {
                    child: Box::new(child),
                    payload_file,
                    result_file,
                    log: LogSpan { path: log_path, start: log_start },
                })
            }
        }
    }
}

/// The part of a job's log that one attempt's agent wrote.
#[derive(Clone, Debug)]
pub struct LogSpan {
    pub path: PathBuf,
    pub start: u64,
}

impl LogSpan {
    /// How many bytes the agent has written so far.
    pub fn written(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len().saturating_sub(self.start)).unwrap_or(0)
    }

    /// The last non-empty line the agent printed (at most 300 characters).
    pub fn last_line(&self) -> Option<String> {
        let line = last_lines(&self.path, self.start, 1);
        (!line.is_empty()).then(|| line.chars().take(300).collect())
    }
}

/// The last `n` non-empty lines of the file at `path` after byte `from` (reading at most its
/// last 64 KiB), joined by " / ".
pub fn last_lines(path: &Path, from: u64, n: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = from.max(len.saturating_sub(64 * 1024));
    let mut buf = vec![];
    if f.seek(SeekFrom::Start(start)).is_err() || f.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).rev().take(n).collect();
    lines.reverse();
    lines.join(" / ")
}

/// The last `max` bytes of the file at `path` (empty if it cannot be read), cut at a line.
pub fn tail_of(path: &Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(max);
    let mut buf = vec![];
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    match (from > 0, text.find('\n')) {
        // Started mid-line: drop the partial first line.
        (true, Some(nl)) => text[nl + 1..].to_string(),
        _ => text,
    }
}

impl AgentEnv {
    pub fn log_path(&self, job: i64) -> PathBuf {
        self.log_dir.join(format!("job-{job}.log"))
    }

    /// Opens the job's log for appending, with a header line for this attempt.
    pub fn open_log(&self, claim: &Claim) -> Result<std::fs::File> {
        use std::io::Write;
        std::fs::create_dir_all(&self.log_dir)?;
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(claim.id))?;
        let _ = writeln!(
            log,
            "=== job {} attempt {} (claim {}) on {} ===",
            claim.id, claim.attempt, claim.token, self.machine
        );
        Ok(log)
    }
}

/// A started agent.
pub enum RunningAgent {
    Process { child: Box<Child>, payload_file: PathBuf, result_file: PathBuf, log: LogSpan },
    InProcess(Option<tokio::task::JoinHandle<AgentExit>>),
}

impl RunningAgent {
    /// Waits for the agent to end on its own. Cancel-safe.
    pub async fn wait(&mut self) -> AgentExit {
        match self {
            RunningAgent::Process { child, .. } => match child.wait().await {
                Ok(s) => exit_of(s),
                Err(e) => AgentExit::Failed(format!("lost track of the agent: {e}")),
            },
            RunningAgent::InProcess(None) => AgentExit::Success,
            RunningAgent::InProcess(Some(task)) => match task.await {
                Ok(exit) => exit,
                Err(e) => AgentExit::Failed(format!("the built-in agent stopped: {e}")),
            },
        }
    }

    /// The agent's exit, if it has already ended (without waiting).
    pub fn try_exit(&mut self) -> Option<AgentExit> {
        match self {
            RunningAgent::Process { child, .. } => match child.try_wait() {
                Ok(Some(s)) => Some(exit_of(s)),
                _ => None,
            },
            RunningAgent::InProcess(None) => Some(AgentExit::Success),
            RunningAgent::InProcess(Some(task)) => task.is_finished().then_some(AgentExit::Success),
        }
    }

    /// Stops the agent: SIGTERM to its process group, then SIGKILL after `grace`.
    pub async fn terminate(&mut self, grace: Duration) {
        match self {
            RunningAgent::Process { child, .. } => {
                let Some(pid) = child.id() else { return };
                let pgid = pid as libc::pid_t;
                // SAFETY: plain kill(2) on the agent's own process group.
                unsafe { libc::kill(-pgid, libc::SIGTERM) };
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                    let _ = child.wait().await;
                }
            }
            RunningAgent::InProcess(Some(task)) => task.abort(),
            RunningAgent::InProcess(None) => {}
        }
    }

    /// What the agent wrote to its result file: `Ok(None)` when it wrote nothing, `Err` with
    /// the reason when the file is malformed (the caller logs it and carries on).
    pub fn result(&self) -> std::result::Result<Option<AgentResult>, String> {
        let RunningAgent::Process { result_file, .. } = self else { return Ok(None) };
        match std::fs::read_to_string(result_file) {
            Ok(text) if text.trim().is_empty() => Ok(None),
            Ok(text) => AgentResult::parse(&text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", result_file.display())),
        }
    }

    /// The agent's output so far, if it is a process.
    pub fn log(&self) -> Option<&LogSpan> {
        match self {
            RunningAgent::Process { log, .. } => Some(log),
            RunningAgent::InProcess(_) => None,
        }
    }

    /// The agent's process id, if it is a process.
    pub fn pid(&self) -> Option<u32> {
        match self {
            RunningAgent::Process { child, .. } => child.id(),
            RunningAgent::InProcess(_) => None,
        }
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let RunningAgent::Process { payload_file, result_file, .. } = self {
            let _ = std::fs::remove_file(payload_file);
            let _ = std::fs::remove_file(result_file);
        }
    }
}

fn exit_of(s: std::process::ExitStatus) -> AgentExit {
    match s.code() {
        Some(0) => AgentExit::Success,
        Some(EX_TEMPFAIL) => AgentExit::TryLater,
        _ => AgentExit::Failed(describe_status(s)),
    }
}

fn describe_status(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("agent exited with status {c}"),
        (None, Some(sig)) => format!("agent was killed by signal {sig}"),
        _ => "agent ended abnormally".into(),
    }
}

/// The program of `preset` on PATH, or the error that names the preset and the PATH searched.
pub(crate) fn resolve_preset(preset: Preset) -> Result<PathBuf> {
    resolve_program(preset.program()).map_err(|_| preset_missing(preset))
}

fn preset_missing(preset: Preset) -> Error {
    Error::PresetMissing {
        preset: preset.name().into(),
        program: preset.program().into(),
        path: std::env::var("PATH").unwrap_or_default(),
    }
}

/// Finds `prog` on PATH (or as a path) and checks it is an executable file.
pub fn resolve_program(prog: &str) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable =
        |p: &Path| std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        return if executable(&p) { Ok(p) } else { Err(Error::AgentMissing(prog.to_string())) };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| executable(p))
        .ok_or_else(|| Error::AgentMissing(prog.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result file's fields parse; both forms of retry_after work; a bad one is an error.
    #[test]
    fn result_files_parse_or_explain() {
        let r = AgentResult::parse(r#"{"summary":"fixed it","url":"https://x/1","retry_after":90,"extra":1}"#).unwrap();
        assert_eq!(r.summary.as_deref(), Some("fixed it"));
        assert_eq!(r.url.as_deref(), Some("https://x/1"));
        assert_eq!(r.retry_after, Some(RetryAfter::In(Duration::from_secs(90))));
        let r = AgentResult::parse(r#"{"retry_after":"2026-12-01T10:00:00Z"}"#).unwrap();
        assert_eq!(r.retry_after, Some(RetryAfter::At(1_796_119_200_000)));
        assert_eq!(AgentResult::parse("{}").unwrap(), AgentResult::default());
        assert!(AgentResult::parse("not json").unwrap_err().contains("not valid JSON"));
        assert!(AgentResult::parse(r#"{"summary": 3}"#).unwrap_err().contains("summary"));
        assert!(AgentResult::parse(r#"{"retry_after": "soon"}"#).unwrap_err().contains("RFC 3339"));
        assert!(AgentResult::parse(r#"{"retry_after": -1}"#).is_err());
    }
}
