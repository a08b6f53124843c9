//! The agent runner: starts one agent per claimed job and stops it on demand.
//!
//! The agent is an argv (program + arguments), never a shell string, and the payload never
//! becomes part of it: the agent reads the payload from stdin or from the file named by
//! `DEVPILOT_PAYLOAD_FILE`. Each agent runs in its own process group, so cancelling reaches
//! the whole tree, and it dies with its runner (PR_SET_PDEATHSIG) so a killed runner can
//! never leave an agent working on a job that the sweep has handed to someone else.
//! [`crate::spawner`] starts it without copying the runner's memory.
//!
//! An agent may be hostile (a prompt can talk it into anything it is allowed to do), so:
//! - it always runs in a directory of its own: the job's worktree, or a fresh scratch dir;
//! - its environment is an allowlist ([`crate::environ`]): the base variables, what its
//!   preset's CLI reads, the settings' `pass_env`, and the job's `DEVPILOT_*` variables;
//! - the files DevPilot writes for it are created new and private, never through a link it
//!   planted, and what it writes back is read only from a small regular file, without
//!   blocking, off the async runtime ([`crate::safe_fs`]);
//! - what it says (a summary, a link, its log) is cleaned before it is stored
//!   ([`clean_text`]), and a link is kept only if it is http(s).
//!
//! What the agent says back: its exit status (0 done, 75 = EX_TEMPFAIL "try later", anything
//! else failed) and, optionally, a JSON result file at `DEVPILOT_RESULT_FILE`:
//! `{"summary": "...", "url": "https://...", "retry_after": "2026-12-01T10:00:00Z" | 3600}`.
//! A malformed result file is logged and ignored; it never fails a job. With no summary in
//! it, the summary is the last non-empty line the agent printed.
//!
//! A preset ([`crate::preset`]) is an argv built per job from the payload's title, prompt
//! and URL (a prompt too long for one argument goes by the CLI's stdin or prompt-file mode);
//! a job with a `repo` runs in its git worktree ([`crate::worktree`]), with
//! `DEVPILOT_WORKTREE` and `DEVPILOT_BRANCH` (and, after a hand-off, `DEVPILOT_RESUME_BRANCH`
//! and `DEVPILOT_RESUMED_FROM`) in its environment.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::preset::trust::ProjectConfig;
use crate::preset::{Conversation, Preset, PresetSettings, PromptVia};
use crate::spawner::{AgentChild, Spawn, Stdin};
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::{Claim, RetryAfter};
use devpilot_store::spec::JobSpec;

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
    /// Variables of the runner's environment the settings pass on to every agent, besides
    /// the allowlist (names or `PREFIX*` patterns).
    pub pass_env: Vec<String>,
}

/// Extra environment variables for an agent.
type EnvVars = Vec<(String, String)>;

/// Where and for what one job's agent runs, besides its claim.
#[derive(Clone, Debug)]
pub struct Launch {
    pub spec: JobSpec,
    /// The directory the agent runs in: the job's worktree, or a scratch dir of its own.
    pub cwd: PathBuf,
    /// The job's worktree and branch, when it has a repo.
    pub worktree: Option<(PathBuf, String)>,
    /// A preset's conversation: new, or resumed from a carried session.
    pub talk: Conversation,
    /// The machine whose conversation it resumes, when not this one.
    pub moved_from: Option<String>,
    /// Whether a preset's CLI may load the project's own configuration in `cwd`.
    pub config: ProjectConfig,
    /// How the agent is confined; None when it runs unconfined (the machine cannot, or the
    /// settings say `sandbox = "off"`).
    pub sandbox: Option<crate::sandbox::Plan>,
    /// A follow-up's prompt (the review feedback that reopened the job), for a preset.
    pub follow_up: Option<String>,
}

/// Why an agent did not start.
#[derive(Debug)]
pub enum StartError {
    /// This machine cannot run agents now (the program is missing, the payload dir cannot be
    /// written): hand the job back and stop claiming until it can.
    Machine(Error),
    /// The job itself cannot start (its argv is too long, a bad working directory): the
    /// attempt counts and fails with this, and the machine goes on to the next job.
    Job(String),
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
    /// Why a preset's run is parked (its usage limit, an API it cannot reach), in its CLI's
    /// words; never from the result file.
    pub parked_why: Option<String>,
    /// The CLI said its account hit a usage limit: the park holds the account fleet-wide.
    /// Never from the result file.
    pub limited: bool,
}

/// Why an agent's result file is not used: the caller logs it, and the job goes on without
/// it.
#[derive(Debug, thiserror::Error)]
pub enum ResultFileError {
    #[error("not valid JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error("\"{field}\" must be a string, not {found}")]
    NotText { field: String, found: serde_json::Value },
    #[error("\"retry_after\" must be >= 0")]
    RetryAfterNegative,
    #[error("\"retry_after\" is not an RFC 3339 time ({0})")]
    RetryAfterTime(#[source] humantime::TimestampError),
    #[error("\"retry_after\" must be a time or a number of seconds, not {0}")]
    RetryAfterType(serde_json::Value),
    /// A symlink, a FIFO, a file over [`RESULT_FILE_CAP`]: `why` says which.
    #[error("{} is not read: {why}", .path.display())]
    Refused { path: PathBuf, why: String },
    #[error("cannot read {}: {source}", .path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    /// The blocking read's task did not finish.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
}

impl AgentResult {
    /// Parses a result file's text. Unknown fields are ignored; a wrong type is an error.
    pub fn parse(text: &str) -> std::result::Result<Self, ResultFileError> {
        use serde_json::Value;
        let v: Value = serde_json::from_str(text).map_err(ResultFileError::NotJson)?;
        let obj = v.as_object().ok_or(ResultFileError::NotObject)?;
        let text_field = |k: &str| match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ResultFileError::NotText { field: k.to_string(), found: other.clone() }),
        };
        let retry_after = match obj.get("retry_after") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => {
                let secs =
                    n.as_f64().filter(|s| s.is_finite() && *s >= 0.0).ok_or(ResultFileError::RetryAfterNegative)?;
                Some(RetryAfter::In(Duration::from_secs_f64(secs.min(366.0 * 86_400.0))))
            }
            Some(Value::String(s)) => {
                Some(RetryAfter::At(crate::span::parse_time_ms(s).map_err(ResultFileError::RetryAfterTime)?))
            }
            Some(other) => return Err(ResultFileError::RetryAfterType(other.clone())),
        };
        let summary = text_field("summary")?.map(|s| clean_text(&s)).filter(|s| !s.trim().is_empty());
        // A link that is not http(s) (`javascript:`, `file:`) is dropped, the rest kept.
        let url = text_field("url")?.and_then(|u| {
            let link = web_link(&u);
            if link.is_none() {
                tracing::warn!(url = %u.escape_debug(), "ignoring the agent's url: only http(s) links are kept");
            }
            link
        });
        Ok(Self { summary, url, retry_after, parked_why: None, limited: false })
    }
}

/// `text` as a link worth keeping: an absolute http(s) URL (never `javascript:`, `file:` or
/// a relative path), at most 2,000 bytes, as the URL parser writes it.
pub fn web_link(text: &str) -> Option<String> {
    let u = url::Url::parse(text.trim()).ok()?;
    let s = u.to_string();
    (matches!(u.scheme(), "http" | "https") && u.host().is_some() && s.len() <= 2000).then_some(s)
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

    /// The argv, the variable names its CLI reads, extra environment, and how the prompt
    /// travels, for one job.
    fn command_line(&self, claim: &Claim, launch: &Launch) -> Option<CommandLine> {
        match self {
            AgentSpec::Command(argv) => Some(CommandLine {
                argv: argv.clone(),
                needs: &[],
                env: vec![],
                prompt: PromptVia::Argv,
                payload_on_stdin: true,
            }),
            AgentSpec::Preset { preset, settings } => {
                let prompt = match &launch.talk {
                    // The conversation goes on: one sentence says where it is now, or the
                    // review feedback it answers.
                    Conversation::Resume { .. } => {
                        launch.follow_up.clone().unwrap_or_else(|| resume_sentence(launch.moved_from.as_deref()))
                    }
                    Conversation::New { .. } => {
                        let task = launch.spec.prompt_text(claim.resumed_from.as_deref(), &claim.payload);
                        format!("{task}{}", launch.follow_up.as_deref().unwrap_or_default())
                    }
                };
                // The CLI's own defaults first (a bound on its retries, gemini's trust of a
                // base's worktree): the user's environment and the settings' env override them.
                let mut env: EnvVars = preset.default_env(settings.api_timeout());
                env.extend(preset.config_env(&launch.config));
                env.retain(|(k, _)| std::env::var_os(k).is_none() && !settings.env.contains_key(k));
                env.extend(settings.env.iter().map(|(k, v)| (k.clone(), v.clone())));
                // What keeps the CLI from an agent's project configuration goes first.
                let extra = [preset.config_args(&launch.config), settings.args.clone()].concat();
                let (argv, via) = preset.invocation(&prompt, &extra, &launch.talk);
                let prompt = via.with(prompt);
                // A preset's CLI appends stdin to its prompt: the payload stays in its file.
                Some(CommandLine { argv, needs: preset.env_needs(), env, prompt, payload_on_stdin: false })
            }
            _ => None,
        }
    }

    /// The preset, if this agent is one.
    pub fn preset(&self) -> Option<Preset> {
        match self {
            AgentSpec::Preset { preset, .. } => Some(*preset),
            _ => None,
        }
    }

    /// Whether starting this agent writes anything (the in-process no-op does not).
    pub fn writes_log(&self) -> bool {
        !matches!(self, AgentSpec::NoOp)
    }

    /// Whether this agent is a process (and so needs a directory of its own to run in).
    pub fn is_process(&self) -> bool {
        matches!(self, AgentSpec::Command(_) | AgentSpec::Preset { .. })
    }

    /// Starts the agent for `claim` in `launch.cwd`, its output appended to `log` (see
    /// [`AgentEnv::open_log`]).
    pub async fn start(
        &self,
        claim: &Claim,
        env: &AgentEnv,
        launch: &Launch,
        log: Option<std::fs::File>,
    ) -> std::result::Result<RunningAgent, StartError> {
        let (log, log_path) = match log {
            Some(l) => (l, env.log_path(claim.fence.job)),
            // Nothing runs, so there is no output to keep. (Creating a file per job was most
            // of the client's CPU in the benchmark's no-op drain: ext4 inode allocation.)
            None => return Ok(RunningAgent::InProcess(None)),
        };
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        match self {
            AgentSpec::NoOp => Ok(RunningAgent::InProcess(None)),
            AgentSpec::Demo { duration } => Ok(RunningAgent::InProcess(Some(start_demo(claim, *duration, log)))),
            AgentSpec::Command(_) | AgentSpec::Preset { .. } => {
                self.start_process(claim, env, launch, log, LogSpan { path: log_path, start: log_start })
            }
        }
    }

    /// Starts the agent's process (a command or a preset) with the job's files and
    /// environment, its output appended to `log`, which `span` names.
    fn start_process(
        &self,
        claim: &Claim,
        env: &AgentEnv,
        launch: &Launch,
        log: std::fs::File,
        span: LogSpan,
    ) -> std::result::Result<RunningAgent, StartError> {
        let line = self.command_line(claim, launch).unwrap_or_default();
        let prog = match self {
            AgentSpec::Preset { preset, .. } => resolve_preset(*preset),
            _ => resolve_program(&line.argv[0]),
        }
        .map_err(StartError::Machine)?;
        let files = JobFiles::write(env, claim, &line.prompt).map_err(StartError::Machine)?;
        let stdin = stdin_for(&line, &files)?;
        let mut args: Vec<OsString> = line.argv[1..].iter().map(OsString::from).collect();
        if let PromptVia::File(_) = &line.prompt {
            args.push(format!("--message-file={}", files.prompt_file.display()).into());
        }
        let mut vars: BTreeMap<OsString, OsString> =
            crate::environ::allowed(&[crate::environ::BASE, line.needs], &env.pass_env).into_iter().collect();
        vars.extend(line.env.into_iter().map(|(k, v)| (k.into(), v.into())));
        let job_vars = [
            ("DEVPILOT_JOB_ID", claim.fence.job.to_string()),
            ("DEVPILOT_ATTEMPT", claim.attempt.to_string()),
            ("DEVPILOT_CLAIM_TOKEN", claim.fence.token.to_string()),
            ("DEVPILOT_ORCHESTRATOR_ID", claim.orchestrator_id.clone()),
            ("DEVPILOT_MACHINE", env.machine.clone()),
        ];
        vars.extend(job_vars.map(|(k, v)| (k.into(), v.into())));
        vars.insert("DEVPILOT_PAYLOAD_FILE".into(), files.payload_file.clone().into());
        vars.insert("DEVPILOT_RESULT_FILE".into(), files.result_file.clone().into());
        resume_env(&mut vars, claim, launch);
        let (prog, args, jail) = match &launch.sandbox {
            None => (prog, args, None),
            Some(plan) => {
                let (jail, p, a) = self.confined(plan, (prog, args), &mut vars, &files.dir, &launch.cwd)?;
                (p, a, Some(Box::new(jail)))
            }
        };
        let spawn = Spawn {
            program: prog,
            args,
            env: vars,
            cwd: launch.cwd.clone(),
            stdin,
            stdout: log.try_clone().map_err(|e| StartError::Machine(e.into()))?,
            stderr: log,
            shield: jail.is_some(),
        };
        let (child, stdin) = match spawn.start() {
            Ok(c) => c,
            Err(e) => return Err(self.start_failed(&line.argv[0], e)),
        };
        if let Some(mut stdin) = stdin {
            let body = files.body.clone();
            // The agent may ignore stdin; a closed pipe is not an error.
            tokio::spawn(async move {
                let _ = stdin.write_all(&body).await;
                let _ = stdin.shutdown().await;
            });
        }
        Ok(RunningAgent::Process { child: Box::new(child), files, log: span, jail })
    }

    /// The agent's command line inside its sandbox, and the sandbox (its proxy serving).
    /// A plain command's own arguments that name files (`python3 ~/agents/fix.py`) are shown
    /// read-only with their directory; a preset's never are (they hold the prompt).
    fn confined(
        &self,
        plan: &crate::sandbox::Plan,
        (prog, args): (PathBuf, Vec<OsString>),
        vars: &mut BTreeMap<OsString, OsString>,
        files: &Path,
        cwd: &Path,
    ) -> std::result::Result<(crate::sandbox::Jail, PathBuf, Vec<OsString>), StartError> {
        let (preset, configured) = match self {
            AgentSpec::Preset { preset, .. } => (Some(*preset), &[][..]),
            _ => (None, &args[..]),
        };
        let agent =
            crate::sandbox::Agent { preset, program: &prog, args: configured, env: vars, files: Some(files), cwd };
        let jail = plan.jail(&agent).map_err(|e| StartError::Machine(e.into()))?;
        jail.env(vars);
        vars.extend(plan.git_env().into_iter().map(|(k, v)| (k.into(), v.into())));
        let (p, a) = jail.wrap(&prog, args);
        Ok((jail, p, a))
    }

    /// Why a spawn failed: the machine's problem when the program is missing (it is looked
    /// for again), else the job's (an argument list too long, a NUL, a bad directory).
    fn start_failed(&self, program: &str, e: std::io::Error) -> StartError {
        match self.check() {
            Err(missing) => StartError::Machine(missing),
            Ok(()) if e.raw_os_error() == Some(libc::E2BIG) => {
                StartError::Job(format!("the agent could not start: its argument list is too long ({e})"))
            }
            Ok(()) => StartError::Job(format!("the agent '{program}' could not start for this job: {e}")),
        }
    }
}

/// The built-in demo agent: logs the payload, waits `duration`, succeeds.
fn start_demo(claim: &Claim, duration: Duration, mut log: std::fs::File) -> tokio::task::JoinHandle<AgentExit> {
    let payload = serde_json::to_string_pretty(&claim.payload).unwrap_or_default();
    tokio::spawn(async move {
        use std::io::Write;
        let _ = writeln!(log, "demo agent: received payload\n{payload}");
        tokio::time::sleep(duration).await;
        let _ = writeln!(log, "demo agent: done");
        AgentExit::Success
    })
}

/// Where the agent's stdin comes from, by how its prompt is passed.
fn stdin_for(line: &CommandLine, files: &JobFiles) -> std::result::Result<Stdin, StartError> {
    Ok(match &line.prompt {
        // A long prompt on stdin comes from its private file: no writer to keep up
        // with a CLI that reads only once it has started.
        PromptVia::Stdin(_) => {
            Stdin::File(std::fs::File::open(&files.prompt_file).map_err(|e| StartError::Machine(e.into()))?)
        }
        PromptVia::Argv if line.payload_on_stdin => Stdin::Pipe,
        PromptVia::File(_) | PromptVia::Argv => Stdin::Null,
    })
}

/// The job's worktree, and the branch and machine it resumes from, if any.
fn resume_env(vars: &mut BTreeMap<OsString, OsString>, claim: &Claim, launch: &Launch) {
    let mut set = |k: &str, v: &OsStr| {
        vars.insert(k.into(), v.to_owned());
    };
    if let Some((dir, branch)) = &launch.worktree {
        set("DEVPILOT_WORKTREE", dir.as_os_str());
        set("DEVPILOT_BRANCH", branch.as_ref());
    }
    if let Some(b) = &claim.resume_branch {
        set("DEVPILOT_RESUME_BRANCH", b.as_ref());
    }
    if let Some(m) = &claim.resumed_from {
        set("DEVPILOT_RESUMED_FROM", m.as_ref());
    }
}

/// An agent's command line, before it is started.
#[derive(Default)]
struct CommandLine {
    argv: Vec<String>,
    /// The variables its CLI reads (a preset's API keys and base URLs).
    needs: &'static [&'static str],
    env: EnvVars,
    prompt: PromptVia<String>,
    /// A plain command reads the payload on stdin; a preset's CLI gets an empty stdin.
    payload_on_stdin: bool,
}

/// The prompt of a resumed conversation: where it goes on.
fn resume_sentence(from: Option<&str>) -> String {
    match from {
        Some(m) => format!(
            "This conversation was moved here from the machine {m}, which handed the job off. The work so far is \
             committed on this branch. Go on from where you stopped, and finish the task."
        ),
        None => "Your earlier run stopped (a usage limit, or its lease ran out). The work so far is in this \
                 worktree. Go on from where you stopped, and finish the task."
            .to_string(),
    }
}

/// The files of one attempt: the payload (also on stdin), the result file the agent may
/// write, and a prompt file for a CLI that reads its prompt from one. All in a private
/// directory of the attempt's own (which a confined agent sees, and no other attempt's),
/// created new, removed when the agent is dropped.
#[derive(Debug)]
pub struct JobFiles {
    pub dir: PathBuf,
    pub payload_file: PathBuf,
    pub result_file: PathBuf,
    pub prompt_file: PathBuf,
    body: Vec<u8>,
}

impl JobFiles {
    fn write(env: &AgentEnv, claim: &Claim, prompt: &PromptVia<String>) -> Result<Self> {
        use std::io::Write;
        crate::safe_fs::private_dir(&env.payload_dir)?;
        let dir = env.payload_dir.join(format!("job-{}-{}", claim.fence.job, claim.fence.token));
        // A stale directory (or something planted where the agent will write) goes.
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&dir);
        crate::safe_fs::private_dir(&dir)?;
        let files = Self {
            payload_file: dir.join("payload.json"),
            result_file: dir.join("result.json"),
            prompt_file: dir.join("prompt.txt"),
            dir,
            body: serde_json::to_vec(&claim.payload).map_err(|e| Error::Payload(e.to_string()))?,
        };
        crate::safe_fs::create_private(&files.payload_file)?.write_all(&files.body)?;
        if let PromptVia::File(text) | PromptVia::Stdin(text) = prompt {
            crate::safe_fs::create_private(&files.prompt_file)?.write_all(text.as_bytes())?;
        }
        Ok(files)
    }
}

impl Drop for JobFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
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
    let Some((text, _)) = read_tail(path, from, 64 * 1024) else { return String::new() };
    let mut lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).rev().take(n).collect();
    lines.reverse();
    lines.join(" / ")
}

/// The last `max` bytes of the file at `path` (empty if it cannot be read), cut at a line.
pub fn tail_of(path: &Path, max: u64) -> String {
    let Some((text, cut)) = read_tail(path, 0, max) else { return String::new() };
    match (cut, text.find('\n')) {
        // Started mid-line: drop the partial first line.
        (true, Some(nl)) => text[nl + 1..].to_string(),
        _ => text,
    }
}

/// At most the last `max` bytes of the log at `path` after byte `from`, as text, and whether
/// it was cut. A log the agent replaced with a symlink (to `/dev/zero`, say) or a FIFO is
/// not read: it is opened without following links or blocking, and read no further than
/// `max`.
fn read_tail(path: &Path, from: u64, max: u64) -> Option<(String, bool)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = crate::safe_fs::open_regular(path).ok()??;
    let len = f.metadata().ok()?.len();
    let start = from.max(len.saturating_sub(max));
    let mut buf = vec![];
    f.seek(SeekFrom::Start(start)).ok()?;
    f.take(max).read_to_end(&mut buf).ok()?;
    Some((clean_text(&String::from_utf8_lossy(&buf)), start > from))
}

/// Text an agent produced, fit to store and show: no NUL (which PostgreSQL cannot store, and
/// which would end an inlined statement early) and no other control character but newline,
/// tab and carriage return. Shown on a terminal it is escaped again (by the CLI).
pub fn clean_text(text: &str) -> String {
    text.chars().filter(|c| !c.is_control() || matches!(c, '\n' | '\t' | '\r')).collect()
}

/// Where job `job`'s log is in the logs directory `dir`.
pub fn log_file(dir: &Path, job: i64) -> PathBuf {
    dir.join(format!("job-{job}.log"))
}

impl AgentEnv {
    pub fn log_path(&self, job: i64) -> PathBuf {
        log_file(&self.log_dir, job)
    }

    /// Opens the job's log for appending (0600, in a 0700 directory; never through a link),
    /// with a header line for this attempt.
    pub fn open_log(&self, claim: &Claim) -> Result<std::fs::File> {
        use std::io::Write;
        crate::safe_fs::private_dir(&self.log_dir)?;
        let mut log = crate::safe_fs::append_private(&self.log_path(claim.fence.job))?;
        let _ = writeln!(
            log,
            "=== job {} attempt {} (claim {}) on {} ===",
            claim.fence.job, claim.attempt, claim.fence.token, self.machine
        );
        Ok(log)
    }
}

/// The most of a result file that is read: a larger one is ignored (and logged).
pub const RESULT_FILE_CAP: u64 = 64 * 1024;

/// How often a confined agent's SIGTERM is sent again while it has not ended.
const SIGTERM_AGAIN: Duration = Duration::from_millis(250);

pub enum RunningAgent {
    /// `jail`: the agent's sandbox (its egress proxy serves while the agent lives).
    Process {
        child: Box<AgentChild>,
        files: JobFiles,
        log: LogSpan,
        jail: Option<Box<crate::sandbox::Jail>>,
    },
    InProcess(Option<tokio::task::JoinHandle<AgentExit>>),
}

impl RunningAgent {
    /// Waits for the agent to end on its own. Cancel-safe.
    pub async fn wait(&mut self) -> AgentExit {
        match self {
            RunningAgent::Process { child, jail, .. } => match child.wait().await {
                Ok(s) => exit_of(crate::sandbox::unwrap_status(s, jail.is_some())),
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
            RunningAgent::Process { child, jail, .. } => match child.try_wait() {
                Ok(Some(s)) => Some(exit_of(crate::sandbox::unwrap_status(s, jail.is_some()))),
                _ => None,
            },
            RunningAgent::InProcess(None) => Some(AgentExit::Success),
            RunningAgent::InProcess(Some(task)) => task.is_finished().then_some(AgentExit::Success),
        }
    }

    /// Stops the agent: SIGTERM to its process group, then SIGKILL after `grace`.
    pub async fn terminate(&mut self, grace: Duration) {
        match self {
            RunningAgent::Process { child, jail, .. } => {
                let Some(pid) = child.id() else { return };
                let pgid = pid as libc::pid_t;
                // SAFETY: plain kill(2) on the agent's own process group.
                unsafe { libc::kill(-pgid, libc::SIGTERM) };
                // A sandbox still being made ignores a SIGTERM (its init has no handler yet):
                // it is sent again until one lands. The init passes only the first on.
                let again = if jail.is_some() { SIGTERM_AGAIN } else { grace };
                let deadline = tokio::time::Instant::now() + grace;
                loop {
                    let wait = again.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
                    if tokio::time::timeout(wait, child.wait()).await.is_ok() {
                        return;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    unsafe { libc::kill(-pgid, libc::SIGTERM) };
                }
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = child.wait().await;
            }
            RunningAgent::InProcess(Some(task)) => task.abort(),
            RunningAgent::InProcess(None) => {}
        }
    }

    /// What the agent wrote to its result file: `Ok(None)` when it wrote nothing, `Err` with
    /// the reason when the file is malformed, or is not a regular file of at most
    /// [`RESULT_FILE_CAP`] bytes (the caller logs it and carries on). Read on a blocking
    /// thread, without following a link and without blocking on a FIFO.
    pub async fn result(&self) -> std::result::Result<Option<AgentResult>, ResultFileError> {
        let RunningAgent::Process { files, .. } = self else { return Ok(None) };
        let path = files.result_file.clone();
        let read = tokio::task::spawn_blocking(move || crate::safe_fs::read_regular(&path, RESULT_FILE_CAP)).await?;
        match read {
            Ok(crate::safe_fs::Found::Missing) => Ok(None),
            Ok(crate::safe_fs::Found::Refused(why)) => {
                Err(ResultFileError::Refused { path: files.result_file.clone(), why })
            }
            Ok(crate::safe_fs::Found::Read(bytes)) => {
                let text = String::from_utf8_lossy(&bytes);
                if text.trim().is_empty() {
                    return Ok(None);
                }
                AgentResult::parse(&text).map(Some)
            }
            Err(source) => Err(ResultFileError::Unreadable { path: files.result_file.clone(), source }),
        }
    }

    /// The agent's output so far, if it is a process.
    /// The hosts the agent's sandbox refused, each with a count (none when unconfined).
    pub fn refused_hosts(&self) -> Vec<(String, u32)> {
        match self {
            RunningAgent::Process { jail: Some(j), .. } => j.refused(),
            _ => vec![],
        }
    }

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
pub fn resolve_preset(preset: Preset) -> Result<PathBuf> {
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
    crate::environ::which(prog).ok_or_else(|| Error::AgentMissing(prog.to_string()))
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
        let err = |text: &str| AgentResult::parse(text).unwrap_err().to_string();
        assert!(err("not json").contains("not valid JSON"));
        assert!(err(r#"{"summary": 3}"#).contains("summary"));
        assert!(err(r#"{"retry_after": "soon"}"#).contains("RFC 3339"));
        assert!(AgentResult::parse(r#"{"retry_after": -1}"#).is_err());
        // Only http(s) links are kept, and text loses its NUL and control characters.
        let r = AgentResult::parse(r#"{"summary":"a\u0000b\u001b[2Jc","url":"javascript:alert(1)"}"#).unwrap();
        assert_eq!((r.summary.as_deref(), r.url), (Some("ab[2Jc"), None));
        assert_eq!(AgentResult::parse(r#"{"url":"file:///etc/passwd"}"#).unwrap().url, None);
        assert_eq!(web_link("https://github.com/a/b/pull/4").as_deref(), Some("https://github.com/a/b/pull/4"));
    }
}
