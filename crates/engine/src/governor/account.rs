//! Which account a preset runs as on this machine, named so that every machine running as
//! the same account gives it the same name: a usage limit one machine hits then holds them
//! all, and an account's day cap counts them together.
//!
//! The name never holds a secret. A key or a login's id is known only by a fingerprint,
//! HMAC-SHA256 under the fleet's MAC key (kept in the shared database): machines with the
//! same key agree on it, and a log, the tray or a status print holds nothing a key can be
//! recovered from or guessed against. (Someone who reads the whole database holds the MAC
//! key too, so could test a guessed key; the fingerprint cannot be reversed.)

use std::fmt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;

use devpilot_store::error::{Error, Result};

use crate::preset::{Preset, PresetSettings};

/// An account a preset runs as: `{preset}:{name}` for a configured name,
/// `{preset}:key-{12 hex}` for an API key, `{preset}:login-{12 hex}` for the CLI's own
/// login, `{preset}:machine-{machine}` when neither says which account it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Account(String);

/// The prefixes of the names DevPilot makes: a configured name may not start with one, so
/// it cannot pass for a key's fingerprint or another machine.
const MADE: [&str; 3] = ["key-", "login-", "machine-"];

/// The longest configured account name, in characters.
const NAME_MAX: usize = 64;

impl Account {
    /// The account as stored and compared.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short form for the tray: "claude · work", "claude · key 3f9a1c…", "claude · login
    /// 77ab01…", "claude · this machine".
    pub fn label(&self) -> String {
        let (preset, name) = self.0.split_once(':').unwrap_or(("", &self.0));
        let short = |hex: &str| format!("{}…", hex.chars().take(6).collect::<String>());
        let who = if let Some(hex) = name.strip_prefix("key-") {
            format!("key {}", short(hex))
        } else if let Some(hex) = name.strip_prefix("login-") {
            format!("login {}", short(hex))
        } else if name.starts_with("machine-") {
            "this machine".to_string()
        } else {
            name.to_string()
        };
        format!("{preset} · {who}")
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The account `preset` runs as here, the first rule that applies:
/// 1. the configured `[agents.<preset>] account`;
/// 2. the fingerprint of the API key its CLI would use (the settings' `env`, then `env`,
///    in [`Preset::key_vars`] order), so machines with the same key agree;
/// 3. the fingerprint of the account id its CLI's own login file records (claude's
///    `oauthAccount.accountUuid`, codex's `tokens.account_id`);
/// 4. this machine: nothing says the account is shared, so a limit it hits holds this
///    machine only, and its day cap counts this machine only.
///
/// `key` is the fleet's MAC key, `home` the user's home, `machine` this machine's name.
pub fn account_of(
    preset: Preset,
    settings: &PresetSettings,
    env: &dyn Fn(&str) -> Option<String>,
    home: &Path,
    machine: &str,
    key: &[u8; 32],
) -> Result<Account> {
    let p = preset.name();
    let var = |k: &str| settings.env.get(k).cloned().or_else(|| env(k)).filter(|v| !v.trim().is_empty());
    let secret = preset.key_vars().iter().find_map(|k| var(k));
    if let Some(name) = &settings.account {
        return Ok(Account(format!("{p}:{}", configured(preset, name, secret.as_deref())?)));
    }
    if let Some(secret) = secret {
        return Ok(Account(format!("{p}:key-{}", fingerprint(key, preset, secret.trim()))));
    }
    if let Some(id) = login_id(preset, &var, home) {
        return Ok(Account(format!("{p}:login-{}", fingerprint(key, preset, &id))));
    }
    Ok(Account(format!("{p}:machine-{}", machine.trim())))
}

/// A configured name, trimmed: printable, at most [`NAME_MAX`] characters, none of the names
/// DevPilot makes, and not the API key itself. The error never repeats the name, which may
/// be a key pasted in the wrong place.
fn configured<'a>(preset: Preset, name: &'a str, secret: Option<&str>) -> Result<&'a str> {
    let n = name.trim();
    let bad = |why: &str| Err(Error::Invalid(format!("[agents.{preset}] account: the name {why}")));
    if n.is_empty() {
        return bad("is empty");
    }
    if n.chars().count() > NAME_MAX {
        return bad(&format!("is longer than {NAME_MAX} characters"));
    }
    if n.chars().any(char::is_control) {
        return bad("must be printable");
    }
    if MADE.iter().any(|m| n.starts_with(m)) {
        return bad("must not start with key-, login- or machine-, which DevPilot's own names use");
    }
    if secret.is_some_and(|s| s.trim() == n) {
        return bad("is the API key: name the account instead (e.g. \"work\")");
    }
    Ok(n)
}

/// Checks a configured account name as [`account_of`] will (when the settings are read).
pub fn check_name(preset: Preset, name: &str) -> Result<()> {
    configured(preset, name, None).map(|_| ())
}

/// The first 6 bytes of HMAC-SHA256(`key`, "devpilot account v1\0" preset "\0" `secret`),
/// in hex.
#[allow(clippy::expect_used, reason = "HMAC takes a key of any length: new_from_slice cannot fail")]
fn fingerprint(key: &[u8; 32], preset: Preset, secret: &str) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(b"devpilot account v1\0");
    mac.update(preset.name().as_bytes());
    mac.update(b"\0");
    mac.update(secret.as_bytes());
    mac.finalize().into_bytes()[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The account id the CLI's own login file records, if it records one: claude's
/// `.claude.json` (in `$CLAUDE_CONFIG_DIR`, else the home), codex's `auth.json` (in
/// `$CODEX_HOME`, default `~/.codex`).
fn login_id(preset: Preset, var: &dyn Fn(&str) -> Option<String>, home: &Path) -> Option<String> {
    let (files, pointer): (Vec<PathBuf>, &str) = match preset {
        Preset::Claude => {
            let moved = var("CLAUDE_CONFIG_DIR").map(|d| PathBuf::from(d).join(".claude.json"));
            (moved.into_iter().chain([home.join(".claude.json")]).collect(), "/oauthAccount/accountUuid")
        }
        Preset::Codex => {
            let dir = var("CODEX_HOME").map_or_else(|| home.join(".codex"), PathBuf::from);
            (vec![dir.join("auth.json")], "/tokens/account_id")
        }
        Preset::Gemini | Preset::Aider => return None,
    };
    files.iter().find_map(|f| {
        // `.claude.json` also keeps every project's history: it may be large.
        let crate::safe_fs::Found::Read(bytes) = crate::safe_fs::read_regular(f, 64 << 20).ok()? else {
            return None;
        };
        let v: Value = serde_json::from_slice(&bytes).ok()?;
        v.pointer(pointer).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const MAC: [u8; 32] = [7; 32];

    fn of(preset: Preset, settings: &PresetSettings, env: &[(&str, &str)], home: &Path, machine: &str) -> Account {
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        account_of(preset, settings, &|k| env.get(k).cloned(), home, machine, &MAC).unwrap()
    }

    /// Two machines with the same key and MAC key name the same account; another key, or
    /// another fleet's MAC key, names another.
    #[test]
    fn the_same_key_is_the_same_account_everywhere() {
        let home = tempfile::tempdir().unwrap();
        let s = PresetSettings::default();
        let key = [("ANTHROPIC_API_KEY", "sk-ant-api03-secret-value")];
        let laptop = of(Preset::Claude, &s, &key, home.path(), "laptop");
        let desktop = of(Preset::Claude, &s, &key, home.path(), "desktop");
        assert_eq!(laptop, desktop);
        assert!(laptop.as_str().starts_with("claude:key-") && laptop.as_str().len() == "claude:key-".len() + 12);
        let other = of(Preset::Claude, &s, &[("ANTHROPIC_API_KEY", "sk-ant-api03-other")], home.path(), "laptop");
        assert_ne!(laptop, other);
        let env = |k: &str| (k == "ANTHROPIC_API_KEY").then(|| "sk-ant-api03-secret-value".to_string());
        let fleet = account_of(Preset::Claude, &s, &env, home.path(), "laptop", &[8; 32]).unwrap();
        assert_ne!(laptop, fleet, "another fleet's MAC key");
        assert_eq!(laptop.label(), format!("claude · key {}…", &laptop.as_str()[11..17]));
    }

    /// The account's name, its label and its Debug form never hold the key.
    #[test]
    fn the_account_never_holds_the_key() {
        let home = tempfile::tempdir().unwrap();
        let secret = "sk-proj-0123456789abcdef";
        let a = of(Preset::Codex, &PresetSettings::default(), &[("OPENAI_API_KEY", secret)], home.path(), "m");
        for shown in [a.to_string(), a.label(), format!("{a:?}"), serde_json::to_string(&a).unwrap()] {
            assert!(!shown.contains(secret) && !shown.contains("0123456789"), "{shown}");
        }
    }

    /// A configured name wins over a key, is trimmed, and a bad one is refused.
    #[test]
    fn a_configured_name_wins() {
        let home = tempfile::tempdir().unwrap();
        let s = PresetSettings { account: Some("  work ".into()), ..Default::default() };
        let a = of(Preset::Claude, &s, &[("ANTHROPIC_API_KEY", "sk-ant-x")], home.path(), "m");
        assert_eq!((a.as_str(), a.label()), ("claude:work", "claude · work".to_string()));
        let bad = |name: &str| {
            let s = PresetSettings { account: Some(name.into()), ..Default::default() };
            account_of(Preset::Claude, &s, &|_| None, home.path(), "m", &MAC).unwrap_err().to_string()
        };
        assert!(bad("  ").contains("[agents.claude] account: the name is empty"));
        assert!(bad(&"x".repeat(65)).contains("longer than 64"));
        assert!(bad("a\nb").contains("printable"));
        assert!(bad("key-3f9a1c0d2e4b").contains("must not start with"));
        let pasted = PresetSettings { account: Some("sk-ant-x".into()), ..Default::default() };
        let env = |k: &str| (k == "ANTHROPIC_API_KEY").then(|| "sk-ant-x".to_string());
        let e = account_of(Preset::Claude, &pasted, &env, home.path(), "m", &MAC).unwrap_err().to_string();
        assert!(e.contains("is the API key") && !e.contains("sk-ant-x"), "{e}");
    }

    /// The key in the settings' env is the one the CLI gets, so it is the one fingerprinted;
    /// claude's variables are read in its own order.
    #[test]
    fn the_key_the_cli_would_use() {
        let home = tempfile::tempdir().unwrap();
        let mut s = PresetSettings::default();
        s.env.insert("OPENAI_API_KEY".into(), "sk-from-settings".into());
        let from_settings = of(Preset::Codex, &s, &[("OPENAI_API_KEY", "sk-from-env")], home.path(), "m");
        let direct =
            of(Preset::Codex, &PresetSettings::default(), &[("OPENAI_API_KEY", "sk-from-settings")], home.path(), "m");
        assert_eq!(from_settings, direct);
        let d = PresetSettings::default();
        let token = of(
            Preset::Claude,
            &d,
            &[("CLAUDE_CODE_OAUTH_TOKEN", "t1"), ("ANTHROPIC_AUTH_TOKEN", "t2")],
            home.path(),
            "m",
        );
        assert_eq!(token, of(Preset::Claude, &d, &[("ANTHROPIC_AUTH_TOKEN", "t2")], home.path(), "m"));
        assert_eq!(of(Preset::Gemini, &d, &[("GEMINI_API_KEY", " ")], home.path(), "m").as_str(), "gemini:machine-m");
    }

    /// With no key, the account id of the CLI's login file is fingerprinted: claude's in
    /// `$CLAUDE_CONFIG_DIR` or the home, codex's in `$CODEX_HOME`.
    #[test]
    fn the_login_file_names_the_account() {
        let home = tempfile::tempdir().unwrap();
        let d = PresetSettings::default();
        let uuid = "6f1e0c2a-93b4-4f0e-8d7a-2b5c9e1f3a70";
        let json = format!(r#"{{"numStartups":3,"oauthAccount":{{"accountUuid":"{uuid}","emailAddress":"a@b.c"}}}}"#);
        std::fs::write(home.path().join(".claude.json"), &json).unwrap();
        let a = of(Preset::Claude, &d, &[], home.path(), "laptop");
        assert!(a.as_str().starts_with("claude:login-") && !a.as_str().contains(uuid), "{a}");
        assert!(a.label().starts_with("claude · login ") && a.label().ends_with('…'), "{}", a.label());
        let moved = home.path().join("cfg");
        std::fs::create_dir_all(&moved).unwrap();
        std::fs::write(moved.join(".claude.json"), json.replace(uuid, "another-id")).unwrap();
        let elsewhere = of(Preset::Claude, &d, &[("CLAUDE_CONFIG_DIR", moved.to_str().unwrap())], home.path(), "m");
        assert!(elsewhere.as_str().starts_with("claude:login-") && elsewhere != a);
        let codex = home.path().join("codex");
        std::fs::create_dir_all(&codex).unwrap();
        std::fs::write(codex.join("auth.json"), r#"{"tokens":{"id_token":"x","account_id":"acct-1"}}"#).unwrap();
        let c = of(Preset::Codex, &d, &[("CODEX_HOME", codex.to_str().unwrap())], home.path(), "m");
        assert!(c.as_str().starts_with("codex:login-"), "{c}");
        let none = of(Preset::Codex, &d, &[], home.path(), "desk");
        assert_eq!((none.as_str(), none.label()), ("codex:machine-desk", "codex · this machine".to_string()));
    }
}
