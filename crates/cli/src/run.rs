//! `devpilot run`: its flags laid over the settings, the machine they describe, and how it
//! runs, logs and stops.

use std::time::Duration;

use clap::ValueEnum;

use devpilot_engine::agent::AgentSpec;
use devpilot_engine::config::Paths;
use devpilot_engine::control;
use devpilot_engine::orchestrator::{self, ClaimMode, Event, RunConfig, StopMode, Wiring};
use devpilot_engine::settings::Settings;
use devpilot_engine::span::{parse_duration, Span};
use devpilot_engine::worktree::overlay_repo_flag;
use devpilot_store::error::{Error, Result};

use crate::open::database_url;
use crate::output::human;

/// `devpilot run`'s flags. Those that name a setting are laid over the settings file
/// ([`RunArgs::overlay`]): a flag that is not given keeps the setting's value.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The queue, from the global `--orchestrator` (see [`crate::open::queue_name`]).
    #[arg(skip)]
    pub orchestrator: String,
    /// This machine's name (default: the settings', else the hostname).
    #[arg(long)]
    pub machine: Option<String>,
    /// Jobs run at once (default: the settings', 1).
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// How long a claim lives without a heartbeat (default: the settings', 30m).
    #[arg(long)]
    pub claim_timeout: Option<String>,
    /// How often held leases are renewed (default: the settings', 30s).
    #[arg(long)]
    pub heartbeat: Option<String>,
    /// Exit 0 once the orchestrator has no claimable or running work left.
    #[arg(long)]
    pub until_empty: bool,
    /// How often an idle machine looks for work (default: the settings', 2s).
    #[arg(long)]
    pub poll_interval: Option<String>,
    /// The idle backoff ceiling (default: the settings', 5m).
    #[arg(long)]
    pub max_poll_interval: Option<String>,
    /// How often this process may sweep stale claims.
    #[arg(long, default_value = orchestrator::SWEEP_EVERY)]
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
    #[arg(long, default_value = orchestrator::CANCEL_GRACE)]
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
    /// A repo this machine can work on, NAME=PATH (repeatable; adds to the settings' repos,
    /// and keeps the rest of a [repos.NAME] there: its remote, copy, setup and push).
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
    /// The longest a parked job waits, whatever its agent asked for (default: the settings', 7d).
    #[arg(long)]
    pub max_park: Option<String>,
    /// Variables of this environment agents and setup commands get besides the allowlist
    /// (names or PREFIX* patterns, e.g. MY_TOKEN,AWS_*; adds to the settings' pass_env).
    #[arg(long, value_name = "NAMES")]
    pub pass_env: Vec<String>,
    /// Confine agents (on, the default) or run them unconfined on purpose (off); default:
    /// the settings' `[sandbox] mode`.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    pub sandbox: Option<String>,
    /// A host every confined agent may reach besides its model's (`host`, `host:port` or
    /// `*.domain`); repeatable, adds to the settings' `[sandbox] allow_hosts`.
    #[arg(long, value_name = "HOST")]
    pub allow_host: Vec<String>,
    /// A path every confined agent may read; repeatable, adds to `[sandbox] read_only`.
    #[arg(long, value_name = "PATH")]
    pub allow_read: Vec<String>,
    /// A path every confined agent may write; repeatable, adds to `[sandbox] read_write`.
    #[arg(long, value_name = "PATH")]
    pub allow_write: Vec<String>,
    /// The agent: a program and its arguments, after `--`.
    #[arg(last = true)]
    pub agent: Vec<String>,
}

impl RunArgs {
    /// The settings with these flags laid over them. What a flag does not name keeps the
    /// settings' value: `--repo web=PATH` replaces `[repos.web]`'s path and keeps its remote,
    /// copy, setup and push; `--pass-env` adds to the settings' list.
    pub fn overlay(&self, mut s: Settings) -> Result<Settings> {
        s.orchestrator_id = self.orchestrator.clone();
        s.machine = self.machine.clone().or(s.machine);
        s.concurrency = self.concurrency.unwrap_or(s.concurrency);
        for (flag, span) in [
            (&self.claim_timeout, &mut s.claim_timeout),
            (&self.heartbeat, &mut s.heartbeat),
            (&self.poll_interval, &mut s.poll_interval),
            (&self.max_poll_interval, &mut s.max_poll_interval),
            (&self.retry_backoff, &mut s.retry_backoff),
            (&self.retry_backoff_max, &mut s.retry_backoff_max),
            (&self.handoff_push_timeout, &mut s.handoff_push_timeout),
            (&self.max_park, &mut s.max_park),
        ] {
            if let Some(text) = flag {
                *span = Span::parse(text)?;
            }
        }
        // A cap that is not given is raised to a base that is.
        if self.retry_backoff_max.is_none() && s.retry_backoff_max.get() < s.retry_backoff.get() {
            s.retry_backoff_max = s.retry_backoff.clone();
        }
        for (flag, limit) in [(&self.idle_timeout, &mut s.idle_timeout), (&self.max_runtime, &mut s.max_runtime)] {
            if let Some(text) = flag {
                *limit = Some(Span::parse(text)?);
            }
        }
        if let Some(l) = &self.labels {
            s.labels = devpilot_store::spec::parse_labels(l)?;
        }
        for flag in &self.repos {
            overlay_repo_flag(&mut s.repos, flag)?;
        }
        for p in self.pass_env.iter().flat_map(|l| l.split(',')).map(str::trim).filter(|p| !p.is_empty()) {
            devpilot_engine::environ::validate_pattern(p)?;
            s.pass_env.push(p.to_string());
        }
        s.poll_only |= self.poll_only;
        if let Some(mode) = &self.sandbox {
            s.sandbox.mode = if mode == "off" {
                devpilot_engine::sandbox::SandboxMode::Off
            } else {
                devpilot_engine::sandbox::SandboxMode::On
            };
        }
        s.sandbox.allow_hosts.extend(self.allow_host.iter().cloned());
        s.sandbox.read_only.extend(self.allow_read.iter().cloned());
        s.sandbox.read_write.extend(self.allow_write.iter().cloned());
        Ok(s)
    }

    /// The agent: `--agent NAME`, a command after `--`, or the settings'.
    fn agent(&self, settings: &Settings) -> Result<AgentSpec> {
        match (&self.preset, self.agent.is_empty()) {
            (Some(_), false) => {
                Err(Error::Invalid("pass either --agent NAME or a command after `--`, not both".into()))
            }
            (Some(name), true) => Ok(settings.preset_spec(devpilot_engine::preset::Preset::parse(name)?)),
            (None, false) => Ok(AgentSpec::Command(self.agent.clone())),
            (None, true) => settings.agent_spec()?.ok_or_else(|| {
                Error::Invalid(
                    "no agent: pass --agent claude|codex|aider|gemini, or a command after `--`, e.g. \
                     devpilot run --orchestrator ID -- my-agent --flag"
                        .into(),
                )
            }),
        }
    }

    /// The machine these flags and `settings` describe.
    fn run_config(&self, settings: &Settings, data_dir: &std::path::Path) -> Result<RunConfig> {
        let agent = self.agent(settings)?;
        agent.check()?;
        for flag in &self.repos {
            let name = flag.split_once('=').map_or(flag.as_str(), |(n, _)| n.trim());
            let path = settings.repos()?.get(name).map(|r| r.path.clone()).unwrap_or_default();
            if !path.join(".git").exists() {
                return Err(Error::Invalid(format!("--repo {flag}: {} is not a git clone", path.display())));
            }
        }
        let mut cfg = RunConfig::from_settings(settings, agent, data_dir)?;
        // A machine started by hand dispatches: the tray's on/off switch is the tray's.
        cfg.start_enabled = true;
        cfg.until_empty = self.until_empty;
        cfg.sweep_every = parse_duration(&self.sweep_interval)?;
        cfg.cancel_grace = parse_duration(&self.cancel_grace)?;
        cfg.claim_mode = match self.claim_mode {
            ClaimModeArg::Pick => ClaimMode::Pick,
            ClaimModeArg::ById => ClaimMode::ById,
        };
        Ok(cfg)
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ClaimModeArg {
    Pick,
    ById,
}

pub async fn run(a: RunArgs) -> Result<()> {
    devpilot_store::queue::validate_orchestrator(&a.orchestrator)?;
    let paths = Paths::for_app("devpilot")?;
    let settings = a.overlay(paths.load()?)?;
    let cfg = a.run_config(&settings, &paths.data_dir)?;
    let pool = orchestrator::machine_pool(cfg.heartbeat, a.connections);
    let url = database_url(Some(&format!("devpilot:{}", cfg.machine)), a.poll_only).await?;
    // A machine started before its database answers (or while it restarts) waits for it,
    // as the tray does; a wrong password or a missing database is still reported at once.
    let queue = orchestrator::connect(&url, &pool, || Ok(()), |_| {}).await?;
    let bound = stop_bound(cfg.cancel_grace, cfg.push_bound);
    let wiring = Wiring::own(&cfg);
    // Listening before the machine starts: an event it sends once (a source with no key) is
    // never sent before anyone hears it.
    let mut events = wiring.events.subscribe();
    let (handle, mut join) = orchestrator::start_machine(queue, &url, cfg, wiring);
    // `devpilot pause`, `resume` and `handoff` reach this machine here; the socket goes
    // when this function returns.
    let control = control::CancellationToken::new();
    let _control_guard = control.clone().drop_guard();
    control::spawn(control::socket_path(&paths.data_dir, &a.orchestrator), handle.clone(), control);
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

fn log_event(ev: &Event) {
    match ev {
        Event::Claimed { job } => tracing::info!("claimed {} (attempt {})", job.label(), job.attempt),
        Event::Completed { job, summary, .. } => match summary {
            Some(s) => tracing::info!("completed {}: {s}", job.label()),
            None => tracing::info!("completed {}", job.label()),
        },
        Event::Cancelled { job } => tracing::info!("cancelled {}; agent stopped", job.label()),
        Event::Parked { job, .. } => tracing::info!("parked {}: the agent asked to be tried later", job.label()),
        Event::SpendWarning { job, text } => tracing::warn!("{}: {text}", job.label()),
        Event::Failed { job, error, dead } => {
            tracing::warn!("{} {}: {error}", if *dead { "dead" } else { "failed" }, job.label())
        }
        Event::LeaseLost { job, reason } => tracing::warn!("lost {} ({reason:?})", job.label()),
        Event::Released { job, .. } => tracing::info!("handed off {}", job.label()),
        Event::AgentError { job, error } => tracing::error!("{}: {error}", job.label()),
        Event::AgentUnavailable { error } => tracing::error!("not claiming: {error}"),
        Event::AgentAvailable => tracing::info!("the agent can run again; claiming"),
        Event::Swept { released, dead } => tracing::info!("swept {released} stale claim(s), {dead} dead"),
        Event::SweepFailed { error } => tracing::warn!("sweep failed: {error}"),
        Event::DatabaseOffline { error } => tracing::warn!("database offline: {error}"),
        Event::DatabaseOnline => tracing::info!("database online"),
        Event::HeartbeatFailed { error } => tracing::warn!("heartbeat failed: {error}"),
        Event::SourceTrouble { source, message, .. } => tracing::error!("source {source}: {message}"),
        Event::SourceOk { source } => tracing::info!("source {source} works again"),
        Event::LostRace { .. } | Event::StateChanged { .. } | Event::Stopped => {}
    }
}
