//! Everything a user can set, with one table of defaults and one `validate`.
//!
//! Durations are [`Span`]s: parsed once, when the file (or the window's form) is read, and
//! written back as the user wrote them. The settings hold no secret: a database password
//! lives in the OS keychain ([`crate::secrets`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use devpilot_store::db::DbUrl;
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::{Backoff, Retention};

use crate::agent::AgentSpec;
use crate::governor::settings::LimitSettings;
use crate::preset::{Preset, PresetSettings};
use crate::span::Span;
use crate::worktree::{Repo, RepoSettings};

/// Per-event notification switches. Failures and losses are on by default; routine events
/// are off, because a tray that talks all day gets muted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct NotifySettings {
    pub claimed: bool,
    pub completed: bool,
    pub failed: bool,
    pub dead: bool,
    pub lease_lost: bool,
    pub offline: bool,
    pub online: bool,
    /// Every failed attempt, not only a job's last (dead): one job retried three times
    /// otherwise makes one notification, not three.
    pub every_retry: bool,
    /// Jobs from this machine's sources that another machine finished (completed or dead):
    /// read from the shared queue, so a job handed to the desktop is heard of on the laptop.
    pub any_machine: bool,
}

impl Default for NotifySettings {
    fn default() -> Self {
        Self {
            claimed: false,
            completed: true,
            failed: true,
            dead: true,
            lease_lost: true,
            offline: true,
            online: true,
            every_retry: false,
            any_machine: false,
        }
    }
}

/// What to do when the machine is about to sleep.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SleepAction {
    #[default]
    HandOff,
    Pause,
}

/// Everything a user can set.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Settings {
    /// postgres://USER@HOST:PORT/DB (no password) or sqlite://PATH. Empty: the embedded default.
    pub database_url: Option<String>,
    pub orchestrator_id: String,
    /// Empty: this machine's hostname.
    pub machine: Option<String>,
    pub claim_timeout: Span,
    pub heartbeat: Span,
    pub max_attempts: i32,
    pub concurrency: u32,
    pub poll_interval: Span,
    /// The idle backoff ceiling.
    pub max_poll_interval: Span,
    /// The retry backoff of jobs enqueued without their own: attempt n waits
    /// `retry_backoff * 2^(n-1)`, at most `retry_backoff_max`, ±10 %.
    pub retry_backoff: Span,
    pub retry_backoff_max: Span,
    /// Completed and cancelled jobs (and their history) are deleted after this long.
    pub retention: Span,
    /// Dead jobs are deleted after this long.
    pub dead_retention: Span,
    /// The agent: a preset's name (`claude`, `codex`, `aider`, `gemini`), or a command line,
    /// split like a shell splits words. The payload is never part of a command line: the
    /// agent reads it from stdin or `$DEVPILOT_PAYLOAD_FILE`.
    pub agent: Option<String>,
    /// This machine's additions to each preset: `[agents.claude] args = [...]`, `env = {...}`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, PresetSettings>,
    /// The repos this machine can work on: `[repos.webapp] path = "~/src/webapp"`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub repos: BTreeMap<String, RepoSettings>,
    /// Trackers whose issues become jobs: `[sources.eng] kind = "linear"`, `teams = ["ENG"]`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, crate::sources::SourceSettings>,
    /// This machine's labels: it takes only jobs whose `requires` are all among them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Stop an agent that prints nothing for this long (e.g. "20m"); empty: never.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "crate::span::optional::deserialize")]
    pub idle_timeout: Option<Span>,
    /// Stop an agent that runs longer than this (e.g. "2h"); empty: never.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "crate::span::optional::deserialize")]
    pub max_runtime: Option<Span>,
    /// How long a hand-off may spend pushing the work in progress.
    pub handoff_push_timeout: Span,
    /// The longest a parked job waits (exit 75), whatever reset time or `retry_after` its
    /// agent gave: an agent cannot put its job away for years.
    pub max_park: Span,
    /// Variables of the environment that agents and setup commands get besides the
    /// allowlist (the base variables, and what a preset's CLI reads): names or `PREFIX*`
    /// patterns, e.g. `["MY_TOKEN", "AWS_*"]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
    /// Do not LISTEN (for transaction-mode poolers such as PgBouncer or Neon's pooled endpoint).
    pub poll_only: bool,
    pub dispatch_enabled: bool,
    pub sleep_action: SleepAction,
    /// While agents run here, ask the OS not to sleep when the machine is idle (a logind
    /// idle-sleep block inhibitor on Linux). Closing the lid still sleeps, after the hand-off.
    pub keep_awake: bool,
    pub autostart: bool,
    pub notify: NotifySettings,
    /// How agents are confined here: `[sandbox] mode = "off"`, `allow_hosts = [...]`.
    #[serde(skip_serializing_if = "crate::sandbox::SandboxSettings::is_default")]
    pub sandbox: crate::sandbox::SandboxSettings,
    /// What the fleet may spend on its agents, and what a usage limit holds: `[limits]
    /// job_usd = 2.0`, `day_usd = 20.0`. Every cap is off unless set.
    #[serde(skip_serializing_if = "LimitSettings::is_default")]
    pub limits: LimitSettings,
}

/// The one table of defaults. `devpilot run`'s flags, the window and the tray all start
/// from it.
impl Default for Settings {
    fn default() -> Self {
        Self {
            database_url: None,
            orchestrator_id: "personal".into(),
            machine: None,
            claim_timeout: Span::default_of("30m"),
            heartbeat: Span::default_of("30s"),
            max_attempts: 3,
            concurrency: 1,
            poll_interval: Span::default_of("2s"),
            max_poll_interval: Span::default_of("5m"),
            retry_backoff: Span::default_of("30s"),
            retry_backoff_max: Span::default_of("1h"),
            retention: Span::default_of("14d"),
            dead_retention: Span::default_of("30d"),
            agent: None,
            agents: BTreeMap::new(),
            repos: BTreeMap::new(),
            sources: BTreeMap::new(),
            labels: vec![],
            idle_timeout: None,
            max_runtime: None,
            handoff_push_timeout: Span::default_of("4s"),
            max_park: Span::default_of("7d"),
            pass_env: vec![],
            poll_only: false,
            dispatch_enabled: true,
            sleep_action: SleepAction::HandOff,
            keep_awake: false,
            autostart: false,
            notify: NotifySettings::default(),
            sandbox: Default::default(),
            limits: LimitSettings::default(),
        }
    }
}

/// The lease rule: a machine gives its lease up a heartbeat (and a kill grace) before the
/// claim timeout, and needs renewals in between, so the timeout is at least three heartbeats.
pub fn check_lease(claim_timeout: Duration, heartbeat: Duration) -> Result<()> {
    if heartbeat.is_zero() || claim_timeout < heartbeat * 3 {
        return Err(Error::Invalid(format!(
            "the claim timeout ({}) must be at least three heartbeats ({} each): a machine gives up its lease \
             one heartbeat and a kill grace before the claim timeout, and needs renewals in between",
            humantime::format_duration(claim_timeout),
            humantime::format_duration(heartbeat)
        )));
    }
    Ok(())
}

impl Settings {
    /// Checks every field, so a bad value is refused before anything is saved or started.
    pub fn validate(&self) -> Result<()> {
        devpilot_store::queue::validate_orchestrator(&self.orchestrator_id)?;
        check_lease(self.claim_timeout.get(), self.heartbeat.get())?;
        if self.poll_interval.get().is_zero() || self.max_poll_interval.get() < self.poll_interval.get() {
            return Err(Error::Invalid("the poll interval must be positive and at most the idle ceiling".into()));
        }
        if self.max_attempts < 1 {
            return Err(Error::Invalid("max attempts must be at least 1".into()));
        }
        self.backoff().validate()?;
        let r = self.retention();
        if r.finished < Duration::from_secs(60) || r.dead < Duration::from_secs(60) {
            return Err(Error::Invalid("retention must be at least a minute".into()));
        }
        if self.concurrency < 1 || self.concurrency > 256 {
            return Err(Error::Invalid("concurrency must be between 1 and 256".into()));
        }
        self.validate_database_url()?;
        self.agent_spec()?;
        self.repos()?;
        for (name, source) in &self.sources {
            source.validate(name)?;
        }
        self.validate_token_hosts()?;
        self.sandbox.validate().map_err(Error::Invalid)?;
        self.limits.validate()?;
        if self.max_park.get() < Duration::from_secs(60) {
            return Err(Error::Invalid(format!("max park '{}' must be at least a minute", self.max_park)));
        }
        for limit in [&self.idle_timeout, &self.max_runtime].into_iter().flatten() {
            if limit.get() < Duration::from_secs(1) {
                return Err(Error::Invalid(format!("'{limit}' is too short for a watchdog limit")));
            }
        }
        self.validate_names()
    }

    fn validate_database_url(&self) -> Result<()> {
        if let Some(url) = self.database_url.as_deref().filter(|u| !u.trim().is_empty()) {
            if DbUrl::parse(url)?.password().is_some() {
                return Err(Error::Invalid(
                    "the database URL in settings must not contain a password; it goes to the keychain".into(),
                ));
            }
        }
        Ok(())
    }

    /// No two GitHub hosts share a token variable (`ghe.corp.com` and `ghe-corp.com` are both
    /// `GITHUB_TOKEN_GHE_CORP_COM`): a token meant for one would reach the other.
    fn validate_token_hosts(&self) -> Result<()> {
        use crate::sources::keys::{host_of, is_github_com};
        let mut seen: BTreeMap<String, (String, &str)> = BTreeMap::new();
        for (name, source) in &self.sources {
            let url = source.api_url();
            let host = match source.kind {
                crate::sources::settings::SourceKind::Github if !is_github_com(&url) => host_of(&url),
                _ => None,
            };
            let Some(host) = host else { continue };
            let var = crate::seal::github_token_var(&host);
            match seen.get(&var) {
                Some((other_host, other)) if *other_host != host => {
                    return Err(Error::Invalid(format!(
                        "sources '{other}' ({other_host}) and '{name}' ({host}) would share {var}, so a token \
                         meant for one would reach the other: one of them must use another host name"
                    )));
                }
                _ => {
                    seen.insert(var, (host, name));
                }
            }
        }
        Ok(())
    }

    /// The agents' presets, labels, environment patterns and the machine's name.
    fn validate_names(&self) -> Result<()> {
        for (name, agent) in &self.agents {
            let preset = Preset::parse(name)?;
            if let Some(account) = &agent.account {
                crate::governor::account::check_name(preset, account)?;
            }
        }
        for l in &self.labels {
            devpilot_store::spec::validate_label(l)?;
        }
        for p in &self.pass_env {
            crate::environ::validate_pattern(p)?;
        }
        if let Some(m) = &self.machine {
            if m.chars().any(|c| c.is_control()) || m.len() > 200 {
                return Err(Error::Invalid("the machine name must be printable".into()));
            }
        }
        Ok(())
    }

    /// The retry backoff for jobs that carry none of their own.
    pub fn backoff(&self) -> Backoff {
        Backoff { base: self.retry_backoff.get(), max: self.retry_backoff_max.get() }
    }

    /// How long finished work is kept.
    pub fn retention(&self) -> Retention {
        Retention { finished: self.retention.get(), dead: self.dead_retention.get(), ..Retention::default() }
    }

    pub fn machine_name(&self) -> String {
        self.machine.clone().filter(|m| !m.trim().is_empty()).unwrap_or_else(default_machine_name)
    }

    /// The configured agent: a preset when `agent` names one, else the command line.
    pub fn agent_spec(&self) -> Result<Option<AgentSpec>> {
        let Some(line) = self.agent.as_deref().filter(|a| !a.trim().is_empty()) else { return Ok(None) };
        if let Some(preset) = Preset::named(line) {
            return Ok(Some(self.preset_spec(preset)));
        }
        Ok(Some(AgentSpec::Command(split_command(line)?)))
    }

    /// `preset` with this machine's additions.
    pub fn preset_spec(&self, preset: Preset) -> AgentSpec {
        let settings = self.agents.get(preset.name()).cloned().unwrap_or_default();
        AgentSpec::Preset { preset, settings }
    }

    /// The configured repos, checked.
    pub fn repos(&self) -> Result<BTreeMap<String, Repo>> {
        self.repos.iter().map(|(n, r)| Ok((n.clone(), Repo::from_settings(n, r)?))).collect()
    }
}

/// Splits a command line into argv the way a POSIX shell splits words, with no expansion.
pub fn split_command(line: &str) -> Result<Vec<String>> {
    let argv =
        shell_words::split(line).map_err(|e| Error::Invalid(format!("the agent command cannot be parsed: {e}")))?;
    if argv.is_empty() {
        return Err(Error::Invalid("the agent command is empty".into()));
    }
    Ok(argv)
}

/// This machine's hostname.
pub fn default_machine_name() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "this-machine".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(t: &str) -> Span {
        Span::parse(t).unwrap()
    }

    /// Defaults are valid, and each bad field is refused with a message naming it.
    #[test]
    fn validation_names_the_problem() {
        assert!(Settings::default().validate().is_ok());
        let bad = |f: &dyn Fn(&mut Settings)| {
            let mut s = Settings::default();
            f(&mut s);
            s.validate().unwrap_err().to_string()
        };
        assert!(bad(&|s| s.orchestrator_id = " ".into()).contains("orchestrator id"));
        assert!(bad(&|s| s.heartbeat = span("1h")).contains("heartbeat"));
        assert!(bad(&|s| s.max_attempts = 0).contains("max attempts"));
        assert!(bad(&|s| s.retry_backoff = span("2h")).contains("maximum"));
        assert!(bad(&|s| s.retention = span("1s")).contains("retention"));
        assert!(bad(&|s| s.agent = Some("echo 'unclosed".into())).contains("agent command"));
        assert!(bad(&|s| s.database_url = Some("postgres://u:pw@h/d".into())).contains("keychain"));
        assert!(bad(&|s| s.idle_timeout = Some(span("10ms"))).contains("watchdog"));
        assert!(bad(&|s| s.max_park = span("30s")).contains("max park"));
        assert!(bad(&|s| s.labels = vec!["a b".into()]).contains("label"));
        assert!(bad(&|s| {
            s.repos.insert("web".into(), RepoSettings::default());
        })
        .contains("no path"));
        assert!(bad(&|s| {
            s.agents.insert("cursor".into(), Default::default());
        })
        .contains("no agent preset"));
        assert!(bad(&|s| s.limits.warn_at = 2.0).contains("warn_at"));
        assert!(bad(&|s| {
            s.agents.insert("claude".into(), PresetSettings { account: Some(" ".into()), ..Default::default() });
        })
        .contains("account"));
    }

    /// Two GitHub hosts whose token variables would be one are refused, naming both; one
    /// host for two sources, or two hosts with their own variables, are fine.
    #[test]
    fn hosts_that_share_a_token_variable_are_refused() {
        use crate::sources::settings::{SourceKind, SourceSettings};
        let on = |url: &str| SourceSettings {
            kind: SourceKind::Github,
            repo: "acme/webapp".into(),
            api_url: Some(url.into()),
            ..SourceSettings::default()
        };
        let with = |urls: &[&str]| {
            let mut s = Settings::default();
            for (i, u) in urls.iter().enumerate() {
                s.sources.insert(format!("s{i}"), on(u));
            }
            s.validate()
        };
        let e = with(&["https://ghe.corp.com/api/v3", "https://ghe-corp.com/api/v3"]).unwrap_err().to_string();
        assert!(e.contains("GITHUB_TOKEN_GHE_CORP_COM") && e.contains("ghe-corp.com"), "{e}");
        assert!(with(&["https://ghe.corp.com/api/v3", "https://ghe.corp.com/api/v3"]).is_ok());
        assert!(with(&["https://ghe.corp.com/api/v3", "https://ghe.other.com/api/v3"]).is_ok());
    }

    /// A duration that does not parse is refused where it is read, naming the value: in a
    /// settings file, and in the window's form (JSON).
    #[test]
    fn a_bad_duration_is_refused_when_read() {
        let e = toml::from_str::<Settings>("claim_timeout = \"soon\"").unwrap_err().to_string();
        assert!(e.contains("'soon' is not a duration"), "{e}");
        let e = serde_json::from_str::<Settings>(r#"{"idle_timeout": "soon"}"#).unwrap_err().to_string();
        assert!(e.contains("'soon' is not a duration"), "{e}");
        let s: Settings = toml::from_str("idle_timeout = \"\"\nretention = \"21d\"").unwrap();
        assert_eq!(s.idle_timeout, None);
        assert_eq!(s.retention.get(), Duration::from_secs(21 * 86_400));
        assert!(toml::to_string(&s).unwrap().contains("retention = \"21d\""), "written as written");
    }

    /// `[limits]` is read into the settings and checked with them; with no caps set it is
    /// left out of the file.
    #[test]
    fn limits_are_read_and_checked() {
        let s: Settings = toml::from_str("[limits]\njob_usd = 2.0\ntime_zone = \"Europe/Paris\"\n").unwrap();
        assert_eq!((s.limits.job_usd, s.limits.day_usd), (Some(2.0), None));
        s.validate().unwrap();
        assert!(toml::to_string(&s).unwrap().contains("[limits]"));
        assert!(!toml::to_string(&Settings::default()).unwrap().contains("limits"));
        let bad: Settings = toml::from_str("[limits]\ntime_zone = \"Nowhere/Atlantis\"\n").unwrap();
        assert!(bad.validate().unwrap_err().to_string().contains("'Nowhere/Atlantis'"));
        let named: Settings = toml::from_str("[agents.claude]\naccount = \"work\"\n").unwrap();
        assert_eq!(named.agents["claude"].account.as_deref(), Some("work"));
        named.validate().unwrap();
    }

    /// `agent = "claude"` is the preset, with this machine's extra args; a command line is
    /// a command.
    #[test]
    fn agent_names_a_preset_or_a_command() {
        let mut s = Settings { agent: Some("claude".into()), ..Settings::default() };
        s.agents.insert("claude".into(), PresetSettings { args: vec!["--model".into()], ..Default::default() });
        match s.agent_spec().unwrap() {
            Some(AgentSpec::Preset { preset, settings }) => {
                assert_eq!(preset, Preset::Claude);
                assert_eq!(settings.args, vec!["--model"]);
            }
            other => panic!("not a preset: {other:?}"),
        }
        s.agent = Some("claude --print".into());
        assert!(matches!(s.agent_spec().unwrap(), Some(AgentSpec::Command(_))));
    }
}
