//! Settings, file locations and the rule for which database to use.
//!
//! The config file is TOML and holds no secret: a database password lives in the OS keychain
//! (see [`crate::secrets`]). A corrupt file is reported with its path and the parser's reason,
//! and is never overwritten by a half-read copy: [`Paths::load`] refuses it, and an app's
//! start ([`Paths::load_or_set_aside`]) renames it to `config.toml.bad-<time>` first, keeps
//! it, and goes on with the defaults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::db::DbUrl;
use crate::error::{Error, Result};

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

/// Everything a user can set. Durations are human strings ("30m", "2s").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Settings {
    /// postgres://USER@HOST:PORT/DB (no password) or sqlite://PATH. Empty: the embedded default.
    pub database_url: Option<String>,
    pub orchestrator_id: String,
    /// Empty: this machine's hostname.
    pub machine: Option<String>,
    pub claim_timeout: String,
    pub heartbeat: String,
    pub max_attempts: i32,
    pub concurrency: u32,
    pub poll_interval: String,
    pub max_poll_interval: String,
    /// The retry backoff of jobs enqueued without their own: attempt n waits
    /// `retry_backoff * 2^(n-1)`, at most `retry_backoff_max`, ±10 %.
    pub retry_backoff: String,
    pub retry_backoff_max: String,
    /// Completed and cancelled jobs (and their history) are deleted after this long.
    pub retention: String,
    /// Dead jobs are deleted after this long.
    pub dead_retention: String,
    /// The agent: a preset's name (`claude`, `codex`, `aider`, `gemini`), or a command line,
    /// split like a shell splits words. The payload is never part of a command line: the
    /// agent reads it from stdin or `$DEVPILOT_PAYLOAD_FILE`.
    pub agent: Option<String>,
    /// This machine's additions to each preset: `[agents.claude] args = [...]`, `env = {...}`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, crate::preset::PresetSettings>,
    /// The repos this machine can work on: `[repos.webapp] path = "~/src/webapp"`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub repos: BTreeMap<String, crate::worktree::RepoSettings>,
    /// This machine's labels: it takes only jobs whose `requires` are all among them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Stop an agent that prints nothing for this long (e.g. "20m"); empty: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// Stop an agent that runs longer than this (e.g. "2h"); empty: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_runtime: Option<String>,
    /// How long a hand-off may spend pushing the work in progress.
    pub handoff_push_timeout: String,
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
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            database_url: None,
            orchestrator_id: "personal".into(),
            machine: None,
            claim_timeout: "30m".into(),
            heartbeat: "30s".into(),
            max_attempts: 3,
            concurrency: 1,
            poll_interval: "2s".into(),
            max_poll_interval: "5m".into(),
            retry_backoff: "30s".into(),
            retry_backoff_max: "1h".into(),
            retention: "14d".into(),
            dead_retention: "30d".into(),
            agent: None,
            agents: BTreeMap::new(),
            repos: BTreeMap::new(),
            labels: vec![],
            idle_timeout: None,
            max_runtime: None,
            handoff_push_timeout: "4s".into(),
            pass_env: vec![],
            poll_only: false,
            dispatch_enabled: true,
            sleep_action: SleepAction::HandOff,
            keep_awake: false,
            autostart: false,
            notify: NotifySettings::default(),
        }
    }
}

/// Parses "30m", "2s", "1h 30m" or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(t)
        .map_err(|e| Error::Invalid(format!("'{t}' is not a duration ({e}); try 30s, 5m or 1h")))
}

/// Parses an RFC 3339 time ("2026-12-01T10:00:00Z") into milliseconds since the epoch.
pub fn parse_time_ms(s: &str) -> std::result::Result<i64, humantime::TimestampError> {
    let t = humantime::parse_rfc3339_weak(s.trim())?;
    Ok(t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0))
}

impl Settings {
    /// Checks every field, so a bad value is refused before anything is saved.
    pub fn validate(&self) -> Result<()> {
        crate::queue::validate_orchestrator(&self.orchestrator_id)?;
        let timeout = parse_duration(&self.claim_timeout)?;
        let hb = parse_duration(&self.heartbeat)?;
        let poll = parse_duration(&self.poll_interval)?;
        let max_poll = parse_duration(&self.max_poll_interval)?;
        if hb.is_zero() || timeout < hb * 3 {
            return Err(Error::Invalid(
                "the claim timeout must be at least three heartbeats (a machine gives its lease up a heartbeat early)"
                    .into(),
            ));
        }
        if poll.is_zero() || max_poll < poll {
            return Err(Error::Invalid("the poll interval must be positive and at most the idle ceiling".into()));
        }
        if self.max_attempts < 1 {
            return Err(Error::Invalid("max attempts must be at least 1".into()));
        }
        self.backoff()?;
        self.retention()?;
        if self.concurrency < 1 || self.concurrency > 256 {
            return Err(Error::Invalid("concurrency must be between 1 and 256".into()));
        }
        if let Some(url) = self.database_url.as_deref().filter(|u| !u.trim().is_empty()) {
            let u = DbUrl::parse(url)?;
            if u.password().is_some() {
                return Err(Error::Invalid(
                    "the database URL in settings must not contain a password; it goes to the keychain".into(),
                ));
            }
        }
        self.agent_spec()?;
        self.repos()?;
        self.watchdog()?;
        parse_duration(&self.handoff_push_timeout)?;
        for name in self.agents.keys() {
            crate::preset::Preset::parse(name)?;
        }
        for l in &self.labels {
            crate::spec::validate_label(l)?;
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
    pub fn backoff(&self) -> Result<crate::queue::Backoff> {
        let b = crate::queue::Backoff {
            base: parse_duration(&self.retry_backoff)?,
            max: parse_duration(&self.retry_backoff_max)?,
        };
        b.validate()?;
        Ok(b)
    }

    /// How long finished work is kept.
    pub fn retention(&self) -> Result<crate::queue::Retention> {
        let r = crate::queue::Retention {
            finished: parse_duration(&self.retention)?,
            dead: parse_duration(&self.dead_retention)?,
            ..crate::queue::Retention::default()
        };
        if r.finished < Duration::from_secs(60) || r.dead < Duration::from_secs(60) {
            return Err(Error::Invalid("retention must be at least a minute".into()));
        }
        Ok(r)
    }

    pub fn machine_name(&self) -> String {
        self.machine.clone().filter(|m| !m.trim().is_empty()).unwrap_or_else(default_machine_name)
    }

    /// The configured agent: a preset when `agent` names one, else the command line.
    pub fn agent_spec(&self) -> Result<Option<crate::agent::AgentSpec>> {
        let Some(line) = self.agent.as_deref().filter(|a| !a.trim().is_empty()) else { return Ok(None) };
        if let Some(preset) = crate::preset::Preset::named(line) {
            return Ok(Some(self.preset_spec(preset)));
        }
        Ok(Some(crate::agent::AgentSpec::Command(split_command(line)?)))
    }

    /// `preset` with this machine's additions.
    pub fn preset_spec(&self, preset: crate::preset::Preset) -> crate::agent::AgentSpec {
        let settings = self.agents.get(preset.name()).cloned().unwrap_or_default();
        crate::agent::AgentSpec::Preset { preset, settings }
    }

    /// The configured repos, checked.
    pub fn repos(&self) -> Result<BTreeMap<String, crate::worktree::Repo>> {
        self.repos.iter().map(|(n, r)| Ok((n.clone(), crate::worktree::Repo::from_settings(n, r)?))).collect()
    }

    /// The watchdog's limits.
    pub fn watchdog(&self) -> Result<crate::orchestrator::Watchdog> {
        let limit = |v: &Option<String>| -> Result<Option<Duration>> {
            match v.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
                None => Ok(None),
                Some(t) => {
                    let d = parse_duration(t)?;
                    if d < Duration::from_secs(1) {
                        return Err(Error::Invalid(format!("'{t}' is too short for a watchdog limit")));
                    }
                    Ok(Some(d))
                }
            }
        };
        Ok(crate::orchestrator::Watchdog { idle: limit(&self.idle_timeout)?, max_runtime: limit(&self.max_runtime)? })
    }

    pub fn agent_argv(&self) -> Result<Option<Vec<String>>> {
        match self.agent.as_deref().filter(|a| !a.trim().is_empty()) {
            Some(a) => Ok(Some(split_command(a)?)),
            None => Ok(None),
        }
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

/// Where the app keeps its files. `app` is "devpilot", or "devpilot-dev" for dev builds so
/// they never touch a production profile.
#[derive(Clone, Debug)]
pub struct Paths {
    pub config_dir: PathBuf,
    pub data_dir: PathBuf,
    pub log_dir: PathBuf,
}

impl Paths {
    pub fn for_app(app: &str) -> Result<Self> {
        let dirs = directories::ProjectDirs::from("dev", "DevPilot", app)
            .ok_or_else(|| Error::Invalid("cannot find a home directory for the config and data files".into()))?;
        let data_dir = dirs.data_local_dir().to_path_buf();
        Ok(Self { config_dir: dirs.config_dir().to_path_buf(), log_dir: data_dir.join("logs"), data_dir })
    }

    pub fn config_file(&self) -> PathBuf {
        self.config_dir.join("config.toml")
    }

    /// The embedded default database.
    pub fn default_db(&self) -> PathBuf {
        self.data_dir.join("devpilot.sqlite")
    }

    pub fn job_log_dir(&self) -> PathBuf {
        self.log_dir.join("jobs")
    }

    /// Reads the settings. A missing file gives defaults; a corrupt one is an error that
    /// names the file, and the file is left as it is.
    pub fn load(&self) -> Result<Settings> {
        load_from(&self.config_file())
    }

    /// Reads the settings for an app's start. A file that cannot be parsed is renamed to
    /// `config.toml.bad-<time>` (never overwritten, never deleted) and the defaults are used,
    /// so the app starts and can say what happened. A file that cannot be *read* (permissions,
    /// I/O) is still an error: it may be fine, and nothing is moved.
    pub fn load_or_set_aside(&self) -> Result<Loaded> {
        load_or_set_aside(&self.config_file(), std::time::SystemTime::now())
    }

    /// Validates, then writes atomically (temp file + rename), so a crash never leaves half a
    /// config behind. The file is private to the user.
    pub fn save(&self, settings: &Settings) -> Result<()> {
        settings.validate()?;
        save_to(&self.config_file(), settings)
    }
}

pub fn load_from(path: &Path) -> Result<Settings> {
    match read_config(path)? {
        Some(text) => parse_config(path, &text),
        None => Ok(Settings::default()),
    }
}

/// The file's text, or `None` when there is no file.
fn read_config(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Config { path: path.display().to_string(), reason: e.to_string() }),
    }
}

fn parse_config(path: &Path, text: &str) -> Result<Settings> {
    toml::from_str(text)
        .map_err(|e| Error::Config { path: path.display().to_string(), reason: e.message().to_string() })
}

/// What an app's start read: the settings, and the corrupt file it set aside, if it did.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    pub settings: Settings,
    pub set_aside: Option<SetAside>,
}

/// A config file that could not be parsed, kept under another name.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SetAside {
    /// Where the file is now: `…/config.toml.bad-20261201T142501Z`.
    pub kept_as: String,
    /// Why it could not be parsed (the parser's words; a config file holds no secret).
    pub reason: String,
}

pub fn load_or_set_aside(path: &Path, now: std::time::SystemTime) -> Result<Loaded> {
    let Some(text) = read_config(path)? else { return Ok(Loaded { settings: Settings::default(), set_aside: None }) };
    let reason = match parse_config(path, &text) {
        Ok(settings) => return Ok(Loaded { settings, set_aside: None }),
        Err(Error::Config { reason, .. }) => reason,
        Err(e) => return Err(e),
    };
    let kept = set_aside(path, now).map_err(|e| Error::Config {
        path: path.display().to_string(),
        reason: format!("{reason}; it could not be renamed to keep it ({e}), so it was left as it is"),
    })?;
    Ok(Loaded {
        settings: Settings::default(),
        set_aside: Some(SetAside { kept_as: kept.display().to_string(), reason }),
    })
}

/// Renames `path` to `<name>.bad-<UTC time>` (then `-2`, `-3`, … if taken), never onto an
/// existing file: the hard link fails rather than replace one, where `rename` would not.
fn set_aside(path: &Path, now: std::time::SystemTime) -> std::io::Result<PathBuf> {
    let stamp: String =
        humantime::format_rfc3339_seconds(now).to_string().chars().filter(|c| *c != '-' && *c != ':').collect();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "config.toml".into());
    for n in 1..=100 {
        let suffix = if n == 1 { String::new() } else { format!("-{n}") };
        let dest = path.with_file_name(format!("{name}.bad-{stamp}{suffix}"));
        match std::fs::hard_link(path, &dest) {
            Ok(()) => {
                std::fs::remove_file(path)?;
                return Ok(dest);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            // A file system without hard links: rename, onto a name that is free.
            Err(_) if std::fs::symlink_metadata(&dest).is_err() => {
                std::fs::rename(path, &dest)?;
                return Ok(dest);
            }
            Err(_) => continue,
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "100 set-aside copies with this time exist already"))
}

pub fn save_to(path: &Path, settings: &Settings) -> Result<()> {
    let text =
        toml::to_string_pretty(settings).map_err(|e| Error::Invalid(format!("cannot serialise settings: {e}")))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("toml.tmp");
    {
        use std::io::Write;
        let mut f = private_file(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Creates (truncating) a file readable only by this user.
pub fn private_file(path: &Path) -> Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    Ok(o.open(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults are valid, and each bad field is refused with a message naming it.
    #[test]
    fn validation_names_the_problem() {
        assert!(Settings::default().validate().is_ok());
        let bad = |f: fn(&mut Settings)| {
            let mut s = Settings::default();
            f(&mut s);
            s.validate().unwrap_err().to_string()
        };
        assert!(bad(|s| s.orchestrator_id = " ".into()).contains("orchestrator id"));
        assert!(bad(|s| s.claim_timeout = "soon".into()).contains("not a duration"));
        assert!(bad(|s| s.heartbeat = "1h".into()).contains("heartbeat"));
        assert!(bad(|s| s.max_attempts = 0).contains("max attempts"));
        assert!(bad(|s| s.retry_backoff = "2h".into()).contains("maximum"));
        assert!(bad(|s| s.retention = "1s".into()).contains("retention"));
        assert!(bad(|s| s.agent = Some("echo 'unclosed".into())).contains("agent command"));
        assert!(bad(|s| s.database_url = Some("postgres://u:pw@h/d".into())).contains("keychain"));
        assert!(bad(|s| s.idle_timeout = Some("soon".into())).contains("not a duration"));
        assert!(bad(|s| s.labels = vec!["a b".into()]).contains("label"));
        assert!(bad(|s| {
            s.repos.insert("web".into(), crate::worktree::RepoSettings::default());
        })
        .contains("no path"));
        assert!(bad(|s| {
            s.agents.insert("cursor".into(), Default::default());
        })
        .contains("no agent preset"));
    }

    /// A corrupt config file is an error naming the file, and is left untouched.
    #[test]
    fn corrupt_config_is_reported_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        std::fs::write(&p, "orchestrator_id = [unterminated").unwrap();
        let e = load_from(&p).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("invalid"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "orchestrator_id = [unterminated");
    }

    /// A file that cannot be parsed is renamed aside (same bytes, never over another copy) and
    /// the defaults are used; a second one in the same second gets its own name.
    #[test]
    fn corrupt_config_is_set_aside_and_defaults_used() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_796_115_600);
        std::fs::write(&p, "concurrency = \"lots\"\n[[[").unwrap();
        let first = load_or_set_aside(&p, now).unwrap();
        assert_eq!(first.settings, Settings::default());
        let kept = first.set_aside.unwrap();
        assert!(kept.kept_as.ends_with("config.toml.bad-20261201T090000Z"), "{kept:?}");
        assert!(!kept.reason.is_empty());
        assert!(!p.exists(), "the corrupt file is no longer where a save would overwrite it");
        assert_eq!(std::fs::read_to_string(&kept.kept_as).unwrap(), "concurrency = \"lots\"\n[[[");
        std::fs::write(&p, "also = [bad").unwrap();
        let second = load_or_set_aside(&p, now).unwrap().set_aside.unwrap();
        assert!(second.kept_as.ends_with("config.toml.bad-20261201T090000Z-2"), "{second:?}");
        assert_eq!(std::fs::read_to_string(&kept.kept_as).unwrap(), "concurrency = \"lots\"\n[[[", "not overwritten");
        assert_eq!(std::fs::read_to_string(&second.kept_as).unwrap(), "also = [bad");
        // A good file and no file are read as they are.
        save_to(&p, &Settings { concurrency: 2, ..Settings::default() }).unwrap();
        assert_eq!(load_or_set_aside(&p, now).unwrap().settings.concurrency, 2);
        std::fs::remove_file(&p).unwrap();
        assert_eq!(load_or_set_aside(&p, now).unwrap(), Loaded { settings: Settings::default(), set_aside: None });
    }

    /// A file that cannot be read (here: a directory in its place) is an error, and nothing
    /// is moved.
    #[test]
    fn unreadable_config_is_an_error_and_stays() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        std::fs::create_dir(&p).unwrap();
        let e = load_or_set_aside(&p, std::time::SystemTime::now()).unwrap_err();
        assert_eq!(e.kind(), "config", "{e}");
        assert!(p.is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no copy was made");
    }

    /// `agent = "claude"` is the preset, with this machine's extra args; a command line is
    /// a command.
    #[test]
    fn agent_names_a_preset_or_a_command() {
        let mut s = Settings { agent: Some("claude".into()), ..Settings::default() };
        s.agents.insert(
            "claude".into(),
            crate::preset::PresetSettings { args: vec!["--model".into()], ..Default::default() },
        );
        match s.agent_spec().unwrap() {
            Some(crate::agent::AgentSpec::Preset { preset, settings }) => {
                assert_eq!(preset, crate::preset::Preset::Claude);
                assert_eq!(settings.args, vec!["--model"]);
            }
            other => panic!("not a preset: {other:?}"),
        }
        s.agent = Some("claude --print".into());
        assert!(matches!(s.agent_spec().unwrap(), Some(crate::agent::AgentSpec::Command(_))));
    }

    /// Settings survive a save and load unchanged.
    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        let mut s = Settings { agent: Some("claude --print".into()), dispatch_enabled: false, ..Settings::default() };
        s.repos.insert(
            "webapp".into(),
            crate::worktree::RepoSettings {
                path: "~/src/webapp".into(),
                copy: vec![".env".into()],
                setup: vec!["npm".into(), "ci".into()],
                push: true,
                ..Default::default()
            },
        );
        s.labels = vec!["gpu".into()];
        s.agents.insert(
            "claude".into(),
            crate::preset::PresetSettings { args: vec!["--model".into(), "opus".into()], ..Default::default() },
        );
        save_to(&p, &s).unwrap();
        assert_eq!(load_from(&p).unwrap(), s);
    }
}
