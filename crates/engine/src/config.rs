//! Where the app keeps its files, and the settings file: read, set aside when corrupt, saved.
//!
//! The config file is TOML ([`Settings`]) and holds no secret: a database password lives in the OS keychain
//! (see [`crate::secrets`]). A corrupt file is reported with its path and the parser's reason,
//! and is never overwritten by a half-read copy: [`Paths::load`] refuses it, and an app's
//! start ([`Paths::load_or_set_aside`]) renames it to `config.toml.bad-<time>` first, keeps
//! it, and goes on with the defaults.

use serde::Serialize;
use std::path::{Path, PathBuf};

use devpilot_store::error::{Error, Result};

use crate::settings::Settings;

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

    /// Job `id`'s log on this machine (its agents' output, each attempt after a header).
    pub fn job_log(&self, id: i64) -> PathBuf {
        crate::agent::log_file(&self.job_log_dir(), id)
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
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_115_600);
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
