//! The headless `devpilot` command line. Its names and flags are a contract.
//!
//! Which database: `DEVPILOT_DATABASE_URL` when set, else the config file's URL (with its
//! password from the keychain), else the embedded SQLite default, created on first use.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::agent::AgentSpec;
use crate::config::{parse_duration, Paths};
use crate::db::{self, DbUrl, PoolSettings};
use crate::error::{Error, Result};
use crate::orchestrator::{self, ClaimMode, Event, RunConfig, StopMode};
use crate::queue::{Backoff, CancelOutcome, JobOptions, Queue, Start};
use crate::retry::{self, Budget};
use crate::secrets;

mod config_cmd;
mod docs;

#[derive(Parser, Debug)]
#[command(
    name = "devpilot",
    version,
    about = "DevPilot dispatch: one shared queue of coding-agent jobs, each run on exactly one machine."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create or upgrade the schema.
    Migrate,
    /// Add a job. The payload (JSON) comes from --payload, --payload-file or stdin. Prints
    /// the job's id; with --key, the id of the live job with that key if there is one.
    Enqueue(EnqueueArgs),
    /// Claim and run jobs until interrupted (SIGINT/SIGTERM hand off cleanly).
    Run(RunArgs),
    /// Jobs by state, who holds what and for how long, and machines.
    Status {
        #[arg(long, env = "DEVPILOT_ORCHESTRATOR")]
        orchestrator: String,
        #[arg(long)]
        json: bool,
    },
    /// Release stale claims once (the cron / systemd-timer backstop).
    Sweep {
        #[arg(long, default_value = "30m")]
        claim_timeout: String,
        /// Ignored: each job carries its own attempt budget (kept so old crontabs still run).
        #[arg(long, hide = true)]
        max_attempts: Option<i32>,
        /// Only this orchestrator (default: all).
        #[arg(long)]
        orchestrator: Option<String>,
    },
    /// Cancel a job, from any machine: a waiting job at once; a running one is stopped by its
    /// holder at its next renewal (or at once, through NOTIFY).
    Cancel {
        /// The job's id.
        id: i64,
    },
    /// Put a dead, failed or cancelled job back in the queue, with a fresh attempt budget.
    Requeue {
        /// The job's id.
        id: i64,
    },
    /// Delete finished jobs (with their history), old machines and old agent files now (the
    /// backstop of the retention that running machines do on their own).
    Prune {
        /// Completed and cancelled jobs finished longer ago than this (default: the settings'
        /// retention, 14d).
        #[arg(long)]
        older_than: Option<String>,
        /// Dead jobs finished longer ago than this (default: the settings' dead_retention, 30d).
        #[arg(long)]
        dead_older_than: Option<String>,
        /// Only this orchestrator (default: all).
        #[arg(long)]
        orchestrator: Option<String>,
    },
    /// Hand off everything a machine holds, so another machine takes it now. Run from any
    /// machine, it asks the holder to hand off (it commits and pushes each job's work in
    /// progress first) and waits for it; a holder that does not answer within --wait is
    /// released directly, and its work in progress stays on it.
    Release {
        #[arg(long, env = "DEVPILOT_ORCHESTRATOR")]
        orchestrator: String,
        /// The holder (default: this machine).
        #[arg(long)]
        machine: Option<String>,
        /// How long to wait for the holder to hand off. A holder renews at least once a
        /// heartbeat (30s by default), and at once through NOTIFY on PostgreSQL.
        #[arg(long, default_value = "45s")]
        wait: String,
    },
    /// List this machine's job worktrees (kept ones say why), or remove the finished ones.
    Worktrees {
        #[arg(long, env = "DEVPILOT_ORCHESTRATOR")]
        orchestrator: String,
        /// Remove the worktrees of finished jobs that hold nothing unsaved.
        #[arg(long)]
        prune: bool,
    },
    /// Store a PostgreSQL password in the OS keychain and the URL (without it) in the config.
    Login {
        /// postgres://USER@HOST:PORT/DB, with no password.
        #[arg(long)]
        database_url: String,
    },
    /// The config file: where it is, and what it says.
    Config {
        #[command(subcommand)]
        command: ConfigCmd,
    },
    /// Print a shell's completion script.
    ///
    /// E.g. `devpilot completions bash > ~/.local/share/bash-completion/completions/devpilot`
    /// (the Debian package installs them for bash, zsh and fish).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `devpilot man | man -l -`.
    #[command(hide = true)]
    Man,
    /// The article's claim of job ID, once: for races and diagnostics.
    #[command(hide = true)]
    Claim {
        #[arg(long, env = "DEVPILOT_ORCHESTRATOR")]
        orchestrator: String,
        #[arg(long)]
        machine: String,
        /// Open the queue, print `ready`, and claim only once a line arrives on stdin.
        #[arg(long)]
        wait_stdin: bool,
        /// The job's id.
        id: i64,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// Print the config file's path (it may not exist yet: then the defaults apply).
    Path,
    /// Print the settings as TOML, with where the database password is (never the password).
    Show,
}

#[derive(clap::Args, Debug)]
pub struct EnqueueArgs {
    #[arg(long, env = "DEVPILOT_ORCHESTRATOR")]
    pub orchestrator: String,
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Attempts before the job is dead (default: the settings' max_attempts, 3).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// A dedupe key: while a job with this key is live (queued, waiting to retry, or running)
    /// on the orchestrator, nothing is added and the live job's id is printed.
    #[arg(long)]
    pub key: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Not claimable before this time (RFC 3339, e.g. 2026-12-01T10:00:00Z).
    #[arg(long, conflicts_with = "delay")]
    pub run_at: Option<String>,
    /// Not claimable for this long (e.g. 10m), on the database's clock.
    #[arg(long)]
    pub delay: Option<String>,
    /// This job's retry backoff: attempt n waits this times 2^(n-1) (default: the runner's).
    #[arg(long)]
    pub retry_backoff: Option<String>,
    /// The cap of this job's retry backoff (default: the runner's, 1h).
    #[arg(long)]
    pub retry_backoff_max: Option<String>,
    /// The payload's title (a job label, and the first line of a preset's prompt).
    #[arg(long)]
    pub title: Option<String>,
    /// The payload's prompt: what the agent is asked to do.
    #[arg(long)]
    pub prompt: Option<String>,
    /// The repo the job runs in (a name machines configure with `run --repo NAME=PATH`).
    #[arg(long)]
    pub repo: Option<String>,
    /// The branch the job's worktree starts from (default: the remote's default branch).
    #[arg(long)]
    pub base: Option<String>,
    /// Labels the running machine must all have, e.g. gpu,linux.
    #[arg(long)]
    pub requires: Option<String>,
    /// Where the task comes from (an issue or ticket URL).
    #[arg(long)]
    pub url: Option<String>,
}

impl EnqueueArgs {
    fn builds_payload(&self) -> bool {
        self.title.is_some()
            || self.prompt.is_some()
            || self.repo.is_some()
            || self.base.is_some()
            || self.requires.is_some()
            || self.url.is_some()
    }

    /// The payload: --payload (or the file, or stdin) with the schema flags laid over it,
    /// or only the flags when no payload is given.
    fn payload(&self) -> Result<serde_json::Value> {
        let mut value = if self.builds_payload() && self.payload.is_none() && self.payload_file.is_none() {
            serde_json::json!({})
        } else {
            read_payload(self.payload.clone(), self.payload_file.clone())?
        };
        if !self.builds_payload() {
            return Ok(value);
        }
        let obj = value.as_object_mut().ok_or_else(|| {
            Error::Payload("--title, --prompt, --repo, --base, --requires and --url need an object payload".into())
        })?;
        for (k, v) in [
            ("title", &self.title),
            ("prompt", &self.prompt),
            ("repo", &self.repo),
            ("base", &self.base),
            ("url", &self.url),
        ] {
            if let Some(v) = v {
                obj.insert(k.into(), v.clone().into());
            }
        }
        if let Some(r) = &self.requires {
            obj.insert("requires".into(), crate::spec::parse_labels(r)?.into());
        }
        Ok(value)
    }
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[arg(long, env = "DEVPILOT_ORCHESTRATOR")]
    pub orchestrator: String,
    #[arg(long)]
    pub machine: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub concurrency: u32,
    #[arg(long, default_value = "30m")]
    pub claim_timeout: String,
    #[arg(long, default_value = "30s")]
    pub heartbeat: String,
    /// Ignored: each job carries its own attempt budget, set at enqueue.
    #[arg(long, hide = true)]
    pub max_attempts: Option<i32>,
    /// Exit 0 once the orchestrator has no claimable or running work left.
    #[arg(long)]
    pub until_empty: bool,
    #[arg(long, default_value = "2s")]
    pub poll_interval: String,
    /// The idle backoff ceiling.
    #[arg(long, default_value = "5m")]
    pub max_poll_interval: String,
    /// How often this process may sweep stale claims.
    #[arg(long, default_value = "60s")]
    pub sweep_interval: String,
    /// Pooled mode, for a transaction-mode pooler (PgBouncer, Supabase's transaction pooler,
    /// Neon's -pooler endpoint): no LISTEN, no prepared statements. The same as pooled=true in
    /// the database URL.
    #[arg(long, env = "DEVPILOT_POLL_ONLY")]
    pub poll_only: bool,
    #[arg(long, value_enum, default_value_t = ClaimModeArg::Pick)]
    pub claim_mode: ClaimModeArg,
    /// Pooled connections (LISTEN uses one more on PostgreSQL).
    #[arg(long, default_value_t = 1)]
    pub connections: u32,
    /// Grace between SIGTERM and SIGKILL when stopping an agent.
    #[arg(long, default_value = "10s")]
    pub cancel_grace: String,
    /// The retry backoff of jobs enqueued without one (default: the settings', 30s).
    #[arg(long)]
    pub retry_backoff: Option<String>,
    /// Its cap (default: the settings', 1h).
    #[arg(long)]
    pub retry_backoff_max: Option<String>,
    /// A built-in agent preset: claude, codex, aider or gemini (the settings' [agents.NAME]
    /// add args and env).
    #[arg(long = "agent", value_name = "NAME")]
    pub preset: Option<String>,
    /// A repo this machine can work on, NAME=PATH (repeatable; adds to the settings' repos).
    #[arg(long = "repo", value_name = "NAME=PATH")]
    pub repos: Vec<String>,
    /// This machine's labels, e.g. gpu,linux (default: the settings').
    #[arg(long)]
    pub labels: Option<String>,
    /// Stop an agent that prints nothing for this long, e.g. 20m (default: the settings').
    #[arg(long)]
    pub idle_timeout: Option<String>,
    /// Stop an agent that runs longer than this, e.g. 2h (default: the settings').
    #[arg(long)]
    pub max_runtime: Option<String>,
    /// How long a hand-off may spend pushing the work in progress (default: the settings', 4s).
    #[arg(long)]
    pub handoff_push_timeout: Option<String>,
    /// Variables of this environment agents and setup commands get besides the allowlist
    /// (names or PREFIX* patterns, e.g. MY_TOKEN,AWS_*; adds to the settings' pass_env).
    #[arg(long, value_name = "NAMES")]
    pub pass_env: Vec<String>,
    /// The agent: a program and its arguments, after `--`.
    #[arg(last = true)]
    pub agent: Vec<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ClaimModeArg {
    Pick,
    ById,
}

/// Entry point: parses, runs, and maps every error to a message and exit code 1.
pub fn main() -> std::process::ExitCode {
    // Before any thread: the database URL leaves the environment an agent could read.
    crate::seal::seal();
    let cli = Cli::parse();
    init_logging();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DEVPILOT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,devpilot=info"));
    // Colours only for a terminal: a runner's log is often a file or the journal.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Which database to use: `DEVPILOT_DATABASE_URL` when set, else the config file's URL with
/// its keychain password, else the embedded SQLite default. A keychain that cannot be reached
/// is an error for a PostgreSQL URL: there is never a plain-text fallback.
pub fn resolve_database(paths: &Paths, service: &str) -> Result<DbUrl> {
    let env_url = crate::seal::env_database_url();
    resolve_database_with(paths, service, env_url.as_deref())
}

/// [`resolve_database`] with the environment's URL passed in.
pub fn resolve_database_with(paths: &Paths, service: &str, env_url: Option<&str>) -> Result<DbUrl> {
    if let Some(raw) = env_url {
        return with_env_password(DbUrl::parse(raw)?);
    }
    let settings = paths.load()?;
    if let Some(raw) = settings.database_url.filter(|u| !u.trim().is_empty()) {
        // The settings' poll_only is pooled mode for every command, not only for `run`.
        let url = DbUrl::parse(&raw)?;
        let url = if settings.poll_only { url.with_pooled() } else { url };
        if url.is_sqlite() || url.password().is_some() {
            return Ok(url);
        }
        return match secrets::load_password(service, &url)? {
            Some(pw) => url.with_password(&pw),
            None => with_env_password(url),
        };
    }
    DbUrl::sqlite_file(&paths.default_db())
}

/// A PostgreSQL URL without a password gets `PGPASSWORD`'s, as the driver would have given
/// it: the variable itself left the environment at start ([`crate::seal`]).
fn with_env_password(url: DbUrl) -> Result<DbUrl> {
    match crate::seal::env_pgpassword() {
        Some(pw) if !url.is_sqlite() && url.password().is_none() => url.with_password(&pw),
        _ => Ok(url),
    }
}

async fn open_queue(pool: PoolSettings) -> Result<(Queue, DbUrl)> {
    open_queue_named(pool, None, false).await
}

/// Opens the configured queue, tagged `app_name`, in pooled mode if the URL says so or
/// `pooled` asks (`run --poll-only`).
async fn open_queue_named(pool: PoolSettings, app_name: Option<&str>, pooled: bool) -> Result<(Queue, DbUrl)> {
    let paths = Paths::for_app("devpilot")?;
    let mut url = tokio::task::spawn_blocking(move || resolve_database(&paths, secrets::SERVICE))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))??;
    if let Some(name) = app_name {
        url = url.with_application_name(name);
    }
    if pooled {
        url = url.with_pooled();
    }
    let conn = db::open(&url, &pool).await?;
    // Unprepared until proven safe (see Queue::pooled): a one-shot command gains nothing from
    // prepared statements, and `run`'s LISTEN probe switches its machine over.
    Ok((Queue::new(conn).pooled(true), url))
}

async fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Migrate => {
            let paths = Paths::for_app("devpilot")?;
            let url = resolve_database(&paths, secrets::SERVICE)?;
            let conn = db::connect(&url, &PoolSettings::default()).await?;
            db::migrate(&url, &conn).await?;
            println!("migrated {}", url.target());
            Ok(())
        }
        Cmd::Enqueue(args) => enqueue(args).await,
        Cmd::Run(args) => run(args).await,
        Cmd::Status { orchestrator, json } => status(&orchestrator, json).await,
        Cmd::Sweep { claim_timeout, max_attempts, orchestrator } => {
            let timeout = parse_duration(&claim_timeout)?;
            if max_attempts.is_some() {
                eprintln!("note: --max-attempts is ignored: each job carries the attempt budget it was enqueued with");
            }
            let (queue, _) = open_queue(PoolSettings::default()).await?;
            let swept = queue.sweep(orchestrator.as_deref(), timeout).await?;
            let dead = swept.iter().filter(|s| s.dead).count();
            println!("released {} stale claim(s), {} job(s) now dead", swept.len() - dead, dead);
            Ok(())
        }
        Cmd::Release { orchestrator, machine, wait } => {
            let machine = machine.unwrap_or_else(crate::config::default_machine_name);
            release(&orchestrator, &machine, parse_duration(&wait)?).await
        }
        Cmd::Worktrees { orchestrator, prune } => worktrees(&orchestrator, prune).await,
        Cmd::Cancel { id } => cancel(id).await,
        Cmd::Requeue { id } => requeue(id).await,
        Cmd::Prune { older_than, dead_older_than, orchestrator } => {
            prune(older_than.as_deref(), dead_older_than.as_deref(), orchestrator.as_deref()).await
        }
        Cmd::Login { database_url } => login(&database_url).await,
        Cmd::Config { command: ConfigCmd::Path } => {
            println!("{}", Paths::for_app("devpilot")?.config_file().display());
            Ok(())
        }
        Cmd::Config { command: ConfigCmd::Show } => config_cmd::show().await,
        Cmd::Completions { shell } => docs::print(&docs::completions(shell)),
        Cmd::Man => docs::print(&docs::man_page()?),
        Cmd::Claim { orchestrator, machine, wait_stdin, id } => claim(&orchestrator, &machine, wait_stdin, id).await,
    }
}

/// `devpilot claim`: `claimed ID TOKEN` (exit 0) on a win, `lost ID` (exit 3) when the
/// conditional UPDATE matched no row.
async fn claim(orchestrator: &str, machine: &str, wait_stdin: bool, id: i64) -> Result<()> {
    use std::io::Write;
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    if wait_stdin {
        println!("ready");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line)? == 0 {
            return Err(Error::Invalid("stdin closed before the line that starts the claim".into()));
        }
    }
    match queue.claim_by_id(id, orchestrator, machine).await? {
        Some(c) => println!("claimed {id} {}", c.token),
        None => {
            println!("lost {id}");
            std::io::stdout().flush()?;
            std::process::exit(3);
        }
    }
    Ok(())
}

/// Reads the payload from --payload, --payload-file or stdin, as JSON. Never more than the
/// payload cap (and some room for white space) is read: a 200 MB file is refused after
/// reading 2 MiB of it, not after loading it all.
fn read_payload(payload: Option<String>, payload_file: Option<PathBuf>) -> Result<serde_json::Value> {
    let limit = 2 * crate::spec::MAX_PAYLOAD as u64;
    let capped = |r: &mut dyn Read, from: &str| -> Result<String> {
        let mut s = String::new();
        r.take(limit + 1).read_to_string(&mut s).map_err(|e| Error::Payload(format!("cannot read {from}: {e}")))?;
        Ok(s)
    };
    let text = match (payload, payload_file) {
        (Some(p), _) => p,
        (None, Some(path)) => {
            let mut f = std::fs::File::open(&path)
                .map_err(|e| Error::Payload(format!("cannot read {}: {e}", path.display())))?;
            capped(&mut f, &path.display().to_string())?
        }
        (None, None) => {
            if std::io::stdin().is_terminal() {
                return Err(Error::Payload(
                    "no payload: pass --payload JSON, --payload-file PATH, or pipe JSON on stdin".into(),
                ));
            }
            capped(&mut std::io::stdin(), "stdin")?
        }
    };
    if text.len() as u64 > limit {
        return Err(Error::Payload(format!(
            "the payload is larger than {limit} bytes; a payload may be at most {} bytes (1 MiB) of JSON",
            crate::spec::MAX_PAYLOAD
        )));
    }
    serde_json::from_str(&text).map_err(|e| Error::Payload(format!("not valid JSON ({e})")))
}

/// A backoff from `--retry-backoff` and `--retry-backoff-max`, each falling back to
/// `defaults`; a cap that is not given is raised to the base if need be.
fn backoff_flags(base: Option<&str>, max: Option<&str>, defaults: Backoff) -> Result<Backoff> {
    let base = base.map(parse_duration).transpose()?.unwrap_or(defaults.base);
    let max = max.map(parse_duration).transpose()?.unwrap_or(defaults.max.max(base));
    let b = Backoff { base, max };
    b.validate()?;
    Ok(b)
}

/// The job options the flags ask for, checked before anything is sent.
fn job_options(a: &EnqueueArgs, settings: &crate::config::Settings) -> Result<JobOptions> {
    let start = match (&a.run_at, &a.delay) {
        (Some(t), _) => {
            let ms = crate::config::parse_time_ms(t).map_err(|e| {
                Error::Invalid(format!("--run-at '{t}' is not an RFC 3339 time ({e}); e.g. 2026-12-01T10:00:00Z"))
            })?;
            Start::At(ms)
        }
        (None, Some(d)) => Start::After(parse_duration(d)?),
        (None, None) => Start::Now,
    };
    let backoff = match (a.retry_backoff.as_deref(), a.retry_backoff_max.as_deref()) {
        (None, None) => None,
        (base, max) => Some(backoff_flags(base, max, settings.backoff().unwrap_or(Backoff::DEFAULT))?),
    };
    if let Some(k) = &a.key {
        crate::queue::validate_key(k)?;
    }
    Ok(JobOptions {
        max_attempts: a.max_attempts.unwrap_or(settings.max_attempts),
        key: a.key.clone(),
        priority: a.priority,
        start,
        backoff,
    })
}

async fn enqueue(a: EnqueueArgs) -> Result<()> {
    crate::queue::validate_orchestrator(&a.orchestrator)?;
    let settings = Paths::for_app("devpilot")?.load()?;
    let opts = job_options(&a, &settings)?;
    let value = a.payload()?;
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let added = queue.enqueue_keyed(&a.orchestrator, &value, &opts).await?;
    println!("{}", added.id);
    if let Some(state) = added.existing {
        eprintln!(
            "job #{} with key '{}' is already live ({state}); nothing was added",
            added.id,
            opts.key.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

/// This machine's name, as history records who asked.
fn who() -> String {
    Paths::for_app("devpilot")
        .and_then(|p| p.load())
        .map(|s| s.machine_name())
        .unwrap_or_else(|_| crate::config::default_machine_name())
}

async fn cancel(id: i64) -> Result<()> {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    match queue.cancel(id, &who()).await? {
        Some(CancelOutcome::Cancelled) => println!("cancelled #{id}"),
        Some(CancelOutcome::Requested { holder }) => println!(
            "asked {} to stop #{id}; it stops the agent at its next renewal and the job ends cancelled",
            shown(Some(holder.as_deref().unwrap_or("its holder")))
        ),
        None => {
            let (job, _) = queue.job(id).await?.ok_or_else(|| Error::Invalid(format!("there is no job #{id}")))?;
            match job.state.as_str() {
                "cancelled" => println!("#{id} is already cancelled"),
                "running" => println!(
                    "a cancel of #{id} was already asked for (by {}); {} stops it",
                    shown(Some(job.cancel_requested_by.as_deref().unwrap_or("?"))),
                    shown(Some(job.claimed_by.as_deref().unwrap_or("its holder")))
                ),
                other => return Err(Error::Invalid(format!("#{id} is {other}: there is nothing to cancel"))),
            }
        }
    }
    Ok(())
}

async fn requeue(id: i64) -> Result<()> {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    if queue.requeue(id, &who()).await? {
        println!("requeued #{id}");
        return Ok(());
    }
    let (job, _) = queue.job(id).await?.ok_or_else(|| Error::Invalid(format!("there is no job #{id}")))?;
    Err(Error::Invalid(format!("#{id} is {}: only dead, failed or cancelled jobs can be requeued", job.state)))
}

async fn prune(older_than: Option<&str>, dead_older_than: Option<&str>, orchestrator: Option<&str>) -> Result<()> {
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    let mut r = settings.retention()?;
    if let Some(t) = older_than {
        r.finished = parse_duration(t)?;
    }
    if let Some(t) = dead_older_than {
        r.dead = parse_duration(t)?;
    }
    if r.finished < Duration::from_secs(60) || r.dead < Duration::from_secs(60) {
        return Err(Error::Invalid("--older-than and --dead-older-than must be at least a minute".into()));
    }
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let pruned = queue.prune(orchestrator, &r, 500).await?;
    let dirs = vec![paths.job_log_dir(), orchestrator::payload_dir(&paths.data_dir)];
    let files = tokio::task::spawn_blocking(move || orchestrator::prune_files(&dirs, orchestrator::file_retention(&r)))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))?;
    println!(
        "deleted {} finished job(s) with their history, {} machine(s) not seen for {}, {} old agent file(s)",
        pruned.jobs,
        pruned.machines,
        human(r.machines),
        files
    );
    Ok(())
}

fn fmt_ids(ids: &[i64]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(": {}", ids.iter().map(|i| format!("#{i}")).collect::<Vec<_>>().join(", "))
    }
}

async fn run(a: RunArgs) -> Result<()> {
    crate::queue::validate_orchestrator(&a.orchestrator)?;
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    let agent = match (&a.preset, a.agent.is_empty()) {
        (Some(_), false) => {
            return Err(Error::Invalid("pass either --agent NAME or a command after `--`, not both".into()))
        }
        (Some(name), true) => settings.preset_spec(crate::preset::Preset::parse(name)?),
        (None, false) => AgentSpec::Command(a.agent.clone()),
        (None, true) => settings.agent_spec()?.ok_or_else(|| {
            Error::Invalid(
                "no agent: pass --agent claude|codex|aider|gemini, or a command after `--`, e.g. \
                 devpilot run --orchestrator ID -- my-agent --flag"
                    .into(),
            )
        })?,
    };
    agent.check()?;
    let machine = a.machine.clone().unwrap_or_else(crate::config::default_machine_name);
    let mut cfg = RunConfig::new(&a.orchestrator, &machine, agent, paths.data_dir.clone());
    cfg.concurrency = a.concurrency.max(1);
    cfg.claim_timeout = parse_duration(&a.claim_timeout)?;
    cfg.heartbeat = parse_duration(&a.heartbeat)?;
    cfg.until_empty = a.until_empty;
    cfg.poll_interval = parse_duration(&a.poll_interval)?;
    cfg.max_poll_interval = parse_duration(&a.max_poll_interval)?.max(cfg.poll_interval);
    cfg.sweep_every = parse_duration(&a.sweep_interval)?;
    cfg.cancel_grace = parse_duration(&a.cancel_grace)?;
    cfg.backoff = backoff_flags(a.retry_backoff.as_deref(), a.retry_backoff_max.as_deref(), settings.backoff()?)?;
    cfg.retention = settings.retention()?;
    machine_flags(&a, &settings, &mut cfg)?;
    cfg.claim_mode = match a.claim_mode {
        ClaimModeArg::Pick => ClaimMode::Pick,
        ClaimModeArg::ById => ClaimMode::ById,
    };
    cfg.check()?;
    if a.max_attempts.is_some() {
        eprintln!("note: --max-attempts is ignored by `run`: each job carries the attempt budget it was enqueued with (`devpilot enqueue --max-attempts`)");
    }
    let pool = PoolSettings {
        max_connections: a.connections.max(1),
        call_timeout: orchestrator::call_bound(cfg.heartbeat),
        ..PoolSettings::default()
    };
    // A machine started before its database answers (or while it restarts) waits for it,
    // as the tray does; a wrong password or a missing database is still reported at once.
    let name = format!("devpilot:{machine}");
    let (queue, url) =
        retry::transient("connecting", Budget::CONNECT, || open_queue_named(pool.clone(), Some(&name), a.poll_only))
            .await?;
    // Pooled mode needs no LISTEN connection: through a pooler it would hear nothing.
    let hints = if url.pooled() { None } else { crate::listen::spawn(&url, &a.orchestrator, &queue) };
    let bound = stop_bound(cfg.cancel_grace, cfg.push_bound);
    let (handle, mut join) = orchestrator::spawn(queue, cfg, hints);
    let mut events = handle.subscribe();
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            log_event(&ev);
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = &mut join => return Ok(()),
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    // A stop hands every job off (agents stopped, work in progress pushed within its bound,
    // claims released). It is bounded as a whole, whatever a job is stuck in, and a second
    // signal ends the process at once: the sweep recovers what was not released.
    tokio::select! {
        _ = handle.stop(StopMode::HandOff) => Ok(()),
        _ = tokio::time::sleep(bound) => Err(Error::Invalid(format!(
            "the hand-off did not finish within {}; exiting anyway (the sweep releases what is left)",
            human(bound)
        ))),
        _ = tokio::signal::ctrl_c() => Err(Error::Invalid("stopped at once by a second signal".into())),
        _ = term.recv() => Err(Error::Invalid("stopped at once by a second signal".into())),
    }
}

/// How long `run` may take to hand off and exit after SIGTERM or SIGINT: the agents' grace,
/// the hand-off's push, and 15 s for the releases and the last presence write.
pub fn stop_bound(cancel_grace: Duration, push_bound: Duration) -> Duration {
    cancel_grace + push_bound + Duration::from_secs(15)
}

/// The repos, labels, watchdog and hand-off bound of `run`: flags over the settings.
fn machine_flags(a: &RunArgs, settings: &crate::config::Settings, cfg: &mut RunConfig) -> Result<()> {
    cfg.repos = settings.repos()?;
    for flag in &a.repos {
        let repo = crate::worktree::Repo::from_flag(flag)?;
        if !repo.path.join(".git").exists() {
            return Err(Error::Invalid(format!("--repo {flag}: {} is not a git clone", repo.path.display())));
        }
        cfg.repos.insert(repo.name.clone(), repo);
    }
    cfg.labels = match &a.labels {
        Some(l) => crate::spec::parse_labels(l)?,
        None => settings.labels.clone(),
    };
    let mut w = settings.watchdog()?;
    if let Some(t) = &a.idle_timeout {
        w.idle = Some(parse_duration(t)?);
    }
    if let Some(t) = &a.max_runtime {
        w.max_runtime = Some(parse_duration(t)?);
    }
    cfg.watchdog = w;
    cfg.push_bound = parse_duration(a.handoff_push_timeout.as_deref().unwrap_or(&settings.handoff_push_timeout))?;
    cfg.pass_env = settings.pass_env.clone();
    for p in a.pass_env.iter().flat_map(|l| l.split(',')).map(str::trim).filter(|p| !p.is_empty()) {
        crate::environ::validate_pattern(p)?;
        cfg.pass_env.push(p.to_string());
    }
    Ok(())
}

/// `devpilot release`: ask the holder to hand off, wait for it, and say what moved; release
/// directly what it does not hand off in time.
async fn release(orchestrator: &str, machine: &str, wait: Duration) -> Result<()> {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let asked = queue.request_release(orchestrator, machine, &who()).await?;
    if asked.is_empty() {
        println!("{machine} holds no job");
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + wait;
    let mut left = asked.clone();
    while !left.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut still = vec![];
        for (id, token) in left {
            match queue.job(id).await? {
                Some((j, _)) if j.state == "running" && j.claim_token == token => still.push((id, token)),
                Some(_) => println!("#{id} handed off by {machine}{}", moved(&queue, id, token).await?),
                None => println!("#{id} is gone"),
            }
        }
        left = still;
    }
    if left.is_empty() {
        return Ok(());
    }
    let why = format!("{machine} did not answer within {}; released directly", human(wait));
    let ids = queue.release_unanswered(&left, machine, &why).await?;
    if !ids.is_empty() {
        println!(
            "{machine} did not answer within {}: released {} job(s) directly{}; their work in progress stayed on {machine}",
            human(wait),
            ids.len(),
            fmt_ids(&ids)
        );
    }
    let busy: Vec<i64> = left.iter().map(|(id, _)| *id).filter(|id| !ids.contains(id)).collect();
    if !busy.is_empty() {
        println!(
            "{machine} answered and is still handing off{}; it releases them once their work in progress is pushed",
            fmt_ids(&busy)
        );
    }
    Ok(())
}

/// What this claim's hand-off carried, from its history, for `release`'s report.
async fn moved(queue: &Queue, id: i64, token: i64) -> Result<String> {
    let history = queue.history(id).await?;
    let handed = history.iter().rev().find(|e| e.kind == "handed_off" && e.claim_token == Some(token));
    let detail = handed.and_then(|e| e.detail.as_deref()).unwrap_or_default();
    Ok(match (detail.find("pushed to "), queue.job(id).await?) {
        (Some(_), Some((j, _))) if j.resume_branch.is_some() => {
            format!("; its work in progress is on branch {}", shown(j.resume_branch.as_deref()))
        }
        _ if detail.contains("stayed on") => format!("; {}", shown(detail.split("; ").last())),
        _ => "; it carried no work in progress".into(),
    })
}

/// `devpilot worktrees [--prune]`.
async fn worktrees(orchestrator: &str, prune: bool) -> Result<()> {
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    let root = orchestrator::worktree_root(&paths.data_dir, orchestrator);
    let ws = crate::worktree::Workspaces::new(
        root.clone(),
        settings.repos()?,
        &settings.machine_name(),
        Duration::from_secs(10),
    );
    let records = ws.records();
    if records.is_empty() {
        println!("no worktrees under {}", root.display());
        return Ok(());
    }
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let ids: Vec<i64> = records.iter().map(|r| r.job).collect();
    let states: std::collections::HashMap<i64, crate::job::JobState> =
        queue.job_states(&ids).await?.into_iter().collect();
    let state_of = |id: i64| states.get(&id).map(|s| s.as_str()).unwrap_or("gone");
    if prune {
        let finished = |id: i64| states.get(&id).is_none_or(|s| s.is_finished());
        let (removed, kept) = ws.prune(&finished).await;
        for r in &removed {
            println!("removed #{} {} ({})", r.job, r.path.display(), r.branch);
        }
        for r in &kept {
            println!("kept    #{} {}: {}", r.job, r.path.display(), r.kept.clone().unwrap_or_default());
        }
        println!("{} removed, {} kept", removed.len(), kept.len());
        return Ok(());
    }
    for r in &records {
        let note = match (&r.kept, r.pending_push) {
            (_, true) => " (work in progress waiting to be pushed)".to_string(),
            (Some(k), _) => format!(" (kept: {k})"),
            _ => String::new(),
        };
        println!("#{:<6} {:<10} {} {} [{}]{note}", r.job, state_of(r.job), r.path.display(), r.branch, r.repo);
    }
    Ok(())
}

fn log_event(ev: &Event) {
    match ev {
        Event::Claimed { job } => tracing::info!("claimed {} (attempt {})", job.label(), job.attempt),
        Event::Completed { job, summary, .. } => match summary {
            Some(s) => tracing::info!("completed {}: {s}", job.label()),
            None => tracing::info!("completed {}", job.label()),
        },
        Event::Cancelled { job } => tracing::info!("cancelled {}; agent stopped", job.label()),
        Event::Parked { job, .. } => tracing::info!("parked {}: the agent asked to be tried later", job.label()),
        Event::Failed { job, error, dead } => {
            tracing::warn!("{} {}: {error}", if *dead { "dead" } else { "failed" }, job.label())
        }
        Event::LeaseLost { job, reason } => tracing::warn!("lost {} ({reason:?})", job.label()),
        Event::Released { job } => tracing::info!("handed off {}", job.label()),
        Event::AgentError { job, error } => tracing::error!("{}: {error}", job.label()),
        Event::AgentUnavailable { error } => tracing::error!("not claiming: {error}"),
        Event::AgentAvailable => tracing::info!("the agent can run again; claiming"),
        Event::Swept { released, dead } => tracing::info!("swept {released} stale claim(s), {dead} dead"),
        Event::SweepFailed { error } => tracing::warn!("sweep failed: {error}"),
        Event::DatabaseOffline { error } => tracing::warn!("database offline: {error}"),
        Event::DatabaseOnline => tracing::info!("database online"),
        Event::HeartbeatFailed { error } => tracing::warn!("heartbeat failed: {error}"),
        Event::LostRace { .. } | Event::StateChanged { .. } | Event::Stopped => {}
    }
}

async fn status(orchestrator: &str, json: bool) -> Result<()> {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let counts = queue.counts(orchestrator).await?;
    let running = queue.running(orchestrator).await?;
    let machines = queue.machines(orchestrator).await?;
    let waiting = queue.waiting(orchestrator, 20).await?;
    // Queued jobs that no online machine can take, and why.
    let stuck: Vec<(crate::queue::JobRow, String)> = queue
        .unclaimed(orchestrator, 200)
        .await?
        .into_iter()
        .filter_map(|j| crate::queue::unroutable(j.repo.as_deref(), &j.requires, &machines).map(|why| (j, why)))
        .collect();
    if json {
        let with_wait = |rows: &[crate::queue::JobRow]| -> Vec<serde_json::Value> {
            rows.iter()
                .map(|j| {
                    let mut v = serde_json::to_value(j).unwrap_or_default();
                    v["waiting"] = j.waiting_text().into();
                    v
                })
                .collect()
        };
        let recent = queue.jobs(orchestrator, None, 20).await?;
        let v = serde_json::json!({
            "orchestrator": orchestrator,
            "counts": counts,
            "running": running,
            "waiting": with_wait(&waiting),
            "recent": with_wait(&recent),
            "unroutable": stuck.iter().map(|(j, why)| serde_json::json!({"id": j.id, "title": j.title, "why": why})).collect::<Vec<_>>(),
            "machines": machines,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    println!("orchestrator {}", shown(Some(orchestrator)));
    println!(
        "  queued {}  running {}  failed {}  completed {}  dead {}  cancelled {}",
        counts.queued, counts.running, counts.failed, counts.completed, counts.dead, counts.cancelled
    );
    println!("running:");
    if running.is_empty() {
        println!("  (none)");
    }
    for j in &running {
        let held = Duration::from_millis(j.now.saturating_sub(j.claimed_at.unwrap_or(j.now)).max(0) as u64);
        let beat = Duration::from_millis(j.now.saturating_sub(j.heartbeat_at.unwrap_or(j.now)).max(0) as u64);
        println!(
            "  #{:<6} {:<30} held by {} for {} (last heartbeat {} ago, attempt {})",
            j.id,
            shown(j.title.as_deref()),
            shown(j.claimed_by.as_deref()),
            human(held),
            human(beat),
            j.attempts
        );
    }
    if !waiting.is_empty() {
        println!("waiting:");
    }
    for j in &waiting {
        let why = match (j.state.as_str(), &j.last_error) {
            ("failed", Some(e)) => format!(" after attempt {} of {}: {}", j.attempts, j.max_attempts, shown(Some(e))),
            _ => String::new(),
        };
        println!("  #{:<6} {:<30} {}{why}", j.id, shown(j.title.as_deref()), j.waiting_text().unwrap_or_default());
    }
    if !stuck.is_empty() {
        println!("no machine can take:");
    }
    for (j, why) in &stuck {
        println!("  #{:<6} {:<30} {}", j.id, shown(j.title.as_deref()), shown(Some(why)));
    }
    println!("machines:");
    if machines.is_empty() {
        println!("  (none)");
    }
    for m in &machines {
        let ago = Duration::from_millis(m.now.saturating_sub(m.last_seen_at).max(0) as u64);
        println!(
            "  {:<20} {:<8} running {}/{}  last seen {} ago",
            shown(Some(&m.machine)),
            shown(Some(&m.status)),
            m.running,
            m.concurrency,
            human(ago)
        );
        if let Some(p) = &m.problem {
            println!("  {:<20} not claiming: {}", "", shown(Some(p)));
        }
        if !m.repos.is_empty() || !m.labels.is_empty() {
            println!(
                "  {:<20} repos: {}  labels: {}",
                "",
                shown(Some(&m.repos.join(", "))),
                shown(Some(&m.labels.join(", ")))
            );
        }
    }
    Ok(())
}

/// Text from the database as the terminal gets it: every control character (ESC, BEL, CR,
/// a newline in a title) is written as an escape, so a job's title cannot rewrite the screen.
fn shown(text: Option<&str>) -> String {
    let text = text.unwrap_or_default();
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

async fn login(raw: &str) -> Result<()> {
    let url = DbUrl::parse(raw)?;
    if url.is_sqlite() {
        return Err(Error::Invalid("login is for PostgreSQL; a sqlite:// URL needs no password".into()));
    }
    if url.password().is_some() {
        return Err(Error::Invalid(
            "do not put the password in the URL (it would land in your shell history); you will be asked for it".into(),
        ));
    }
    let password = if std::io::stdin().is_terminal() {
        rpassword::prompt_password(format!("Password for {}: ", secrets::account(&url)))?
    } else {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s)?;
        s.trim_end_matches(['\r', '\n']).to_string()
    };
    let full = url.with_password(&password)?;
    let conn = db::connect(&full, &PoolSettings::default()).await?;
    drop(conn);
    let paths = Paths::for_app("devpilot")?;
    let mut settings = paths.load()?;
    let stored_url = url.clone();
    tokio::task::spawn_blocking(move || secrets::store_password(secrets::SERVICE, &stored_url, &password))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))??;
    settings.database_url = Some(url.without_password().to_string());
    paths.save(&settings)?;
    println!(
        "password verified and stored in the keychain for {}; settings saved to {}",
        secrets::account(&url),
        paths.config_file().display()
    );
    Ok(())
}
