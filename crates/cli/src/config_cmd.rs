//! `devpilot config show`: the settings as TOML, headed by comments that say which file they
//! come from, which database the commands use, and where its password is. A password is never
//! printed: not the keychain's (which is not even read, only looked up), not one left in a URL.

use std::time::Duration;

use devpilot_engine::config::Paths;
use devpilot_engine::secrets;
use devpilot_engine::settings::Settings;
use devpilot_store::db::DbUrl;
use devpilot_store::error::{Error, Result};

/// How long the keychain may take to say whether it holds the password. A Secret Service that
/// is starting, or a D-Bus peer that never answers, must not hang a command that only reads.
const KEYCHAIN_WAIT: Duration = Duration::from_secs(10);

pub async fn show() -> Result<()> {
    let paths = Paths::for_app("devpilot")?;
    let file = paths.config_file();
    let settings = paths.load()?;
    let mut out = format!(
        "# config file: {}{}\n",
        file.display(),
        if file.exists() { "" } else { " (not created yet: these are the defaults)" }
    );
    let (database, password) = database(&paths, &settings).await;
    out.push_str(&format!("# database: {database}\n# database password: {password}\n"));
    if let Some(raw) = devpilot_engine::seal::env_database_url() {
        match DbUrl::parse(&raw) {
            Ok(u) => out.push_str(&format!(
                "# note: DEVPILOT_DATABASE_URL is set, so devpilot commands use {u} instead of database_url\n"
            )),
            Err(e) => {
                out.push_str(&format!("# note: DEVPILOT_DATABASE_URL is set but cannot be used: {}\n", one_line(&e)))
            }
        }
    }
    let text = toml::to_string_pretty(&shown(&settings))
        .map_err(|e| Error::Invalid(format!("cannot show the settings: {e}")))?;
    out.push_str(&text);
    crate::docs::print(out.as_bytes())
}

/// Which database the config file names, and where its password is.
async fn database(paths: &Paths, settings: &Settings) -> (String, String) {
    const NO_PASSWORD: &str = "none (SQLite needs none)";
    let Some(raw) = settings.database_url.as_deref().filter(|u| !u.trim().is_empty()) else {
        return (format!("the embedded SQLite file {}", paths.default_db().display()), NO_PASSWORD.into());
    };
    let url = match DbUrl::parse(raw) {
        Ok(u) => u,
        // The parser's message never echoes the URL, which may hold a password.
        Err(e) => return (format!("database_url cannot be used: {}", one_line(&e)), "none".into()),
    };
    if url.is_sqlite() {
        return (url.to_string(), NO_PASSWORD.into());
    }
    if url.password().is_some() {
        let hint = "in the config file's URL (hidden here); it belongs in the keychain: remove it from the file, then run `devpilot login --database-url URL`";
        return (url.to_string(), hint.into());
    }
    let password = match keychain_has(url.clone()).await {
        Ok(true) => "stored in keychain".to_string(),
        Ok(false) => "none".to_string(),
        Err(e) => {
            let why = match e {
                Error::Keychain(why) => why,
                other => other.to_string(),
            };
            tracing::debug!(error = %why, "keychain lookup failed");
            format!("keychain unavailable: {}", one_line(&why))
        }
    };
    (url.to_string(), password)
}

/// Whether the keychain holds a password for `url`, within [`KEYCHAIN_WAIT`]. The lookup runs
/// on a thread of its own (inside this runtime's context, which the D-Bus client needs), so a
/// lookup that never returns is left behind when the command exits instead of holding it up.
async fn keychain_has(url: DbUrl) -> Result<bool> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let rt = tokio::runtime::Handle::current();
    std::thread::Builder::new().name("keychain-lookup".into()).spawn(move || {
        let _rt = rt.enter();
        let _ = tx.send(secrets::has_password(secrets::SERVICE, &url));
    })?;
    match tokio::time::timeout(KEYCHAIN_WAIT, rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(Error::Keychain("the lookup ended without an answer".into())),
        Err(_) => Err(Error::Keychain(format!("no answer within {}s", KEYCHAIN_WAIT.as_secs()))),
    }
}

/// The settings as they may be shown: the database URL redacted, and agent environment values
/// whose names say they are secrets masked (the file should hold none; if one slipped in, it
/// is not echoed to a terminal or a bug report).
fn shown(settings: &Settings) -> Settings {
    let mut s = settings.clone();
    if let Some(raw) = s.database_url.as_deref().filter(|u| !u.trim().is_empty()) {
        s.database_url = Some(match DbUrl::parse(raw) {
            Ok(u) => u.redacted(),
            Err(_) => "(not a valid database URL; not shown)".into(),
        });
    }
    for preset in s.agents.values_mut() {
        for (name, value) in preset.env.iter_mut() {
            if looks_secret(name) {
                *value = "***".into();
            }
        }
    }
    s
}

fn looks_secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSW", "CREDENTIAL", "AUTH"].iter().any(|w| n.contains(w))
}

/// A message on one comment line.
fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What is shown hides a URL's password and secret-looking agent variables, and keeps
    /// everything else as it is.
    #[test]
    fn shown_settings_hide_secrets() {
        let mut s = Settings {
            database_url: Some("postgres://alice:pw-in-url@db.example/q?password=pw-in-query".into()),
            ..Settings::default()
        };
        let mut preset = devpilot_engine::preset::PresetSettings::default();
        preset.env.insert("ANTHROPIC_API_KEY".into(), "sk-live".into());
        preset.env.insert("CLAUDE_MODEL".into(), "opus".into());
        s.agents.insert("claude".into(), preset);
        let text = toml::to_string_pretty(&shown(&s)).unwrap();
        for secret in ["pw-in-url", "pw-in-query", "sk-live"] {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
        assert!(text.contains("postgres://alice:***@db.example/q?password=***"), "{text}");
        assert!(text.contains("CLAUDE_MODEL = \"opus\""), "{text}");
        s.database_url = Some("postgres://alice:pw-bad-url@@/".into());
        assert!(!toml::to_string_pretty(&shown(&s)).unwrap().contains("pw-bad-url"));
    }
}
