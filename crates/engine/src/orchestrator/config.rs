//! What a machine runs with: [`RunConfig`], mapped once from the [`Settings`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use devpilot_store::error::Result;
use devpilot_store::queue::{Backoff, Retention, Route};

use super::lease::Timing;
use super::watchdog::Watchdog;
use crate::agent::AgentSpec;
use crate::settings::Settings;
use crate::span::Span;
use crate::worktree::Repo;

/// How often a process may sweep stale claims, unless told otherwise
/// (`devpilot run --sweep-interval`).
pub const SWEEP_EVERY: &str = "60s";

/// SIGTERM to SIGKILL when an agent is stopped, unless told otherwise
/// (`devpilot run --cancel-grace`).
pub const CANCEL_GRACE: &str = "10s";

/// How the orchestrator picks work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// One statement picks and claims up to k jobs, skipping rows others hold.
    #[default]
    Pick,
    /// The path "Claiming work exactly once, with one UPDATE" takes: read candidate ids, then
    /// conditionally claim each by id.
    ById,
}

/// Everything the loop needs to know. All of it but the orchestrator and the machine can be
/// changed while jobs run ([`Handle::reconfigure`]).
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub orchestrator_id: String,
    pub machine: String,
    pub concurrency: u32,
    pub claim_timeout: Duration,
    pub heartbeat: Duration,
    pub poll_interval: Duration,
    /// The idle backoff ceiling.
    pub max_poll_interval: Duration,
    /// The opportunistic sweep runs at most this often per process.
    pub sweep_every: Duration,
    /// Retention runs at most this often per process.
    pub prune_every: Duration,
    pub retention: Retention,
    /// The retry backoff of jobs that carry none of their own.
    pub backoff: Backoff,
    pub presence_every: Duration,
    /// SIGTERM to SIGKILL on a hand-off.
    pub cancel_grace: Duration,
    pub until_empty: bool,
    pub claim_mode: ClaimMode,
    pub agent: AgentSpec,
    pub log_dir: PathBuf,
    pub payload_dir: PathBuf,
    pub start_enabled: bool,
    /// The repos this machine can work on, by name: jobs of these run in a git worktree.
    pub repos: BTreeMap<String, Repo>,
    /// This machine's labels: it picks only jobs whose `requires` are all among them.
    pub labels: Vec<String>,
    /// Where job worktrees go: `<data dir>/worktrees/<orchestrator>`.
    pub worktree_root: PathBuf,
    /// Where a job with no repo gets a scratch dir ([`scratch_root`]).
    pub scratch_root: PathBuf,
    /// Variables of this process's environment that agents and setup commands get besides
    /// the allowlist ([`crate::environ`]): names or `PREFIX*` patterns.
    pub pass_env: Vec<String>,
    /// The bound on a hand-off's push of the work in progress.
    pub push_bound: Duration,
    pub watchdog: Watchdog,
    /// The longest a park may wait, whatever the agent asked for.
    pub max_park: Duration,
    /// The tracker sources this machine polls and delivers for (the enabled ones).
    pub sources: BTreeMap<String, crate::sources::SourceSettings>,
    /// The attempts a job the intake adds gets.
    pub max_attempts: i32,
    /// Where the trackers' API keys come from.
    pub keys: crate::sources::KeyStore,
    /// How agents are confined here ([`crate::sandbox`]).
    pub confining: std::sync::Arc<super::confine::Confining>,
    /// The governor of usage limits and spend ([`crate::governor`]).
    pub limits: crate::governor::settings::LimitSettings,
}

impl RunConfig {
    /// The poller's base interval. A drain that ends when the queue is empty
    /// (`until_empty`) looks again within 50 ms: its last jobs, or another process's, may
    /// still be finishing, and it should exit then, not a whole poll interval later (that
    /// was 2 s of every `devpilot run --until-empty`, most of a 2,000-job drain's time).
    pub fn poll_base(&self) -> Duration {
        if self.until_empty {
            self.poll_interval.min(Duration::from_millis(50))
        } else {
            self.poll_interval
        }
    }

    /// A machine with the settings' defaults ([`Settings::default`]).
    pub fn new(orchestrator_id: &str, machine: &str, agent: AgentSpec, data_dir: PathBuf) -> Self {
        let settings = Settings { orchestrator_id: orchestrator_id.into(), ..Settings::default() };
        let mut cfg = Self::with(&settings, agent, &data_dir, BTreeMap::new());
        cfg.machine = machine.into();
        cfg
    }

    /// The machine `settings` describe: they are validated (the one check of every value),
    /// then mapped here, the one mapping the tray and `devpilot run` share.
    pub fn from_settings(settings: &Settings, agent: AgentSpec, data_dir: &Path) -> Result<Self> {
        settings.validate()?;
        Ok(Self::with(settings, agent, data_dir, settings.repos()?))
    }

    fn with(s: &Settings, agent: AgentSpec, data_dir: &Path, repos: BTreeMap<String, Repo>) -> Self {
        let orchestrator_id = s.orchestrator_id.as_str();
        Self {
            orchestrator_id: orchestrator_id.into(),
            machine: s.machine_name(),
            concurrency: s.concurrency.max(1),
            claim_timeout: s.claim_timeout.get(),
            heartbeat: s.heartbeat.get(),
            poll_interval: s.poll_interval.get(),
            max_poll_interval: s.max_poll_interval.get().max(s.poll_interval.get()),
            sweep_every: Span::default_of(SWEEP_EVERY).get(),
            prune_every: Duration::from_secs(3600),
            retention: s.retention(),
            backoff: s.backoff(),
            presence_every: Duration::from_secs(30),
            cancel_grace: Span::default_of(CANCEL_GRACE).get(),
            until_empty: false,
            claim_mode: ClaimMode::Pick,
            agent,
            log_dir: data_dir.join("logs").join("jobs"),
            payload_dir: payload_dir(data_dir),
            start_enabled: s.dispatch_enabled,
            repos,
            labels: s.labels.clone(),
            worktree_root: worktree_root(data_dir, orchestrator_id),
            scratch_root: scratch_root(data_dir, orchestrator_id),
            pass_env: s.pass_env.clone(),
            push_bound: s.handoff_push_timeout.get(),
            watchdog: Watchdog {
                idle: s.idle_timeout.as_ref().map(Span::get),
                max_runtime: s.max_runtime.as_ref().map(Span::get),
            },
            max_park: s.max_park.get(),
            sources: s.sources.iter().filter(|(_, x)| x.enabled).map(|(n, x)| (n.clone(), x.clone())).collect(),
            max_attempts: s.max_attempts.max(1),
            keys: crate::sources::KeyStore::Keychain { service: crate::secrets::SERVICE.into() },
            confining: std::sync::Arc::new(super::confine::Confining::new(&s.sandbox)),
            limits: s.limits.clone(),
        }
    }

    /// What the sources service runs with.
    pub fn sources_cfg(&self) -> crate::sources::SourcesCfg {
        use crate::sources::RepoRemote;
        crate::sources::SourcesCfg {
            orchestrator_id: self.orchestrator_id.clone(),
            machine: self.machine.clone(),
            sources: self.sources.clone(),
            max_attempts: self.max_attempts,
            keys: self.keys.clone(),
            pull_requests: self.repos.iter().map(|(n, r)| (n.clone(), r.pull_request)).collect(),
            review_loops: self.repos.iter().map(|(n, r)| (n.clone(), r.review_loop.clone())).collect(),
            remotes: self
                .repos
                .iter()
                .map(|(n, r)| (n.clone(), RepoRemote { clone: r.path.clone(), remote: r.remote.clone() }))
                .collect(),
        }
    }

    /// What this machine may pick.
    pub fn route(&self) -> Route {
        Route {
            repos: self.repos.keys().cloned().collect(),
            labels: self.labels.clone(),
            tracker_repos: self.confining.tracker_repos(&self.repos),
            governor: Default::default(),
        }
    }

    /// The lease keeper's timing. The kill grace after a lost lease is at most one
    /// heartbeat: it is part of the margin the local deadline keeps before the database
    /// could hand the job to someone else.
    pub fn timing(&self) -> Timing {
        Timing {
            heartbeat: self.heartbeat,
            claim_timeout: self.claim_timeout,
            kill_grace: self.cancel_grace.min(self.heartbeat),
        }
    }

    /// How often a machine whose agent cannot run looks again: as often as an idle machine
    /// polls, and at least every 30 s. Looking is a stat of the program, not a query.
    pub fn problem_recheck(&self) -> Duration {
        self.max_poll_interval.min(Duration::from_secs(30))
    }
}

/// `<data dir>/worktrees/<orchestrator>`, the orchestrator's name made safe for a path.
pub fn worktree_root(data_dir: &std::path::Path, orchestrator_id: &str) -> PathBuf {
    data_dir.join("worktrees").join(safe_name(orchestrator_id))
}

/// An orchestrator's name as one path component: a separator, `.` or `..` cannot leave the
/// directory it is joined to.
fn safe_name(orchestrator_id: &str) -> String {
    let safe: String =
        orchestrator_id.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if safe.chars().all(|c| c == '.') {
        safe.replace('.', "_")
    } else {
        safe
    }
}

/// This data dir's own directory in the session's runtime dir (`XDG_RUNTIME_DIR`, a tmpfs
/// private to the user), when there is one: `<runtime dir>/devpilot/<what>-<tag>`, the tag
/// naming the data dir, so two setups never share one.
fn in_runtime_dir(data_dir: &std::path::Path, what: &str) -> Option<PathBuf> {
    use md5::{Digest, Md5};
    let rt = PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR")?);
    if !(rt.is_absolute() && rt.is_dir()) {
        return None;
    }
    let digest = Md5::digest(data_dir.as_os_str().as_encoded_bytes());
    let tag: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    Some(rt.join("devpilot").join(format!("{what}-{tag}")))
}

/// Where the agents' payload files go: the session's runtime dir when there is one, else
/// `<data dir>/payloads`. A payload file lives only while its agent runs. Written and
/// deleted once per job on ext4, its inode churn was the largest cost of a short job besides
/// the agent itself (ext4 scans past recently deleted inodes to allocate a new one;
/// `bench/NOTES.md`), and on tmpfs the payload never reaches a disk.
pub fn payload_dir(data_dir: &std::path::Path) -> PathBuf {
    in_runtime_dir(data_dir, "payloads").unwrap_or_else(|| data_dir.join("payloads"))
}

/// Where a job with no repo gets its scratch dir: `<runtime dir>/devpilot/scratch-<tag>/
/// <orchestrator>` when there is a runtime dir, else `<data dir>/scratch/<orchestrator>`.
/// A scratch dir lives only while its agent runs, so, like a payload file, it is made and
/// removed once per job: on the runtime dir's tmpfs that costs no disk inodes (on the
/// benchmark's agent path, about 15 % more jobs a second).
pub fn scratch_root(data_dir: &std::path::Path, orchestrator_id: &str) -> PathBuf {
    let root = in_runtime_dir(data_dir, "scratch").unwrap_or_else(|| data_dir.join("scratch"));
    root.join(safe_name(orchestrator_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults written as text parse (a typo would otherwise become zero), and a
    /// machine with the settings' defaults is the one the table describes.
    #[test]
    fn text_defaults_parse() {
        for text in [SWEEP_EVERY, CANCEL_GRACE] {
            assert!(Span::parse(text).is_ok_and(|s| !s.get().is_zero()), "{text}");
        }
        let cfg = RunConfig::new("o", "m", AgentSpec::NoOp, PathBuf::from("/tmp/devpilot-unit"));
        let s = Settings::default();
        assert_eq!((cfg.heartbeat, cfg.claim_timeout), (s.heartbeat.get(), s.claim_timeout.get()));
        assert_eq!(cfg.sweep_every, Duration::from_secs(60));
    }
}
