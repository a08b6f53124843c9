//! `devpilot login`: a PostgreSQL password into the OS keychain, and the URL (without it)
//! into the config file.

use std::io::IsTerminal;

use devpilot_engine::config::Paths;
use devpilot_engine::secrets;
use devpilot_engine::sources::{keys, SourceKind};
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::error::{Error, Result};

use crate::exit::{done, Code, Fail, Out};

/// A secret typed at a prompt, or one line of stdin: never an argument, which `ps` and the
/// shell history would keep.
fn read_secret(prompt: &str) -> Result<String> {
    if std::io::stdin().is_terminal() {
        Ok(rpassword::prompt_password(prompt)?)
    } else {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s)?;
        Ok(s.trim_end_matches(['\r', '\n']).to_string())
    }
}

/// `devpilot login --linear`: tests the key (whose is it?), then keeps it in the keychain.
/// A key Linear refuses is not stored; with Linear unreachable it is stored, and says so.
pub async fn login_linear() -> Result<()> {
    let key = read_secret("Linear API key: ")?.trim().to_string();
    if key.is_empty() {
        return Err(Error::Invalid("no key given".into()));
    }
    let settings = Paths::for_app("devpilot")?.load()?;
    let probe = settings.sources.values().next().cloned().unwrap_or_default();
    let client = devpilot_engine::sources::linear::LinearClient::for_source(&probe, &key)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    use devpilot_engine::sources::linear::TrackerError;
    let who = match client
        .call::<serde_json::Value>(devpilot_engine::sources::linear::documents::VIEWER, serde_json::json!({}))
        .await
    {
        Ok((v, _)) => v.pointer("/viewer/name").and_then(|n| n.as_str()).map(str::to_string),
        Err(e @ TrackerError::Auth(..)) => return Err(Error::Invalid(format!("{e}; nothing was stored"))),
        Err(e) => {
            eprintln!("warning: the key could not be checked ({e}); storing it anyway");
            None
        }
    };
    tokio::task::spawn_blocking(move || devpilot_engine::sources::keys::store_linear_key(secrets::SERVICE, &key))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))??;
    match who {
        Some(name) => println!("Linear key of {name} stored in the keychain"),
        None => println!("Linear key stored in the keychain"),
    }
    Ok(())
}

/// `devpilot login --github`: the token typed (or one line of stdin), or, if the GitHub CLI
/// is logged in and the user says so (or `--from-gh`), `gh auth token`'s. Tested (whose is
/// it?), then kept in the keychain; a token GitHub refuses is not stored. `api_url`: the
/// token is for that GitHub API's host (its own keychain account), not github.com's.
pub async fn login_github(from_gh: bool, api_url: Option<String>) -> Result<()> {
    use devpilot_engine::sources::{keys, SourceKind, TrackerError};
    // `gh auth token` gives github.com's token: it is never offered for another host.
    let elsewhere = api_url.as_deref().is_some_and(|u| !keys::is_github_com(u));
    if elsewhere && from_gh {
        return Err(Error::Invalid(
            "--from-gh imports github.com's token, which is never sent to another host: \
             give that host's own token"
                .into(),
        ));
    }
    let ask_gh = !elsewhere && (from_gh || std::io::stdin().is_terminal());
    let gh = if ask_gh { keys::gh_token().await } else { None };
    let (token, imported) = match gh {
        Some(t) if from_gh || ask_yes("The GitHub CLI is logged in: import its token (gh auth token)? [Y/n] ")? => {
            (t, true)
        }
        _ if from_gh => {
            return Err(Error::Invalid("`gh auth token` gave no token: is gh installed and logged in?".into()))
        }
        _ => (read_secret("GitHub token: ")?.trim().to_string(), false),
    };
    if token.is_empty() {
        return Err(Error::Invalid("no token given".into()));
    }
    // Tested where it will be sent: github.com's API, or the host named.
    let probe = match api_url {
        Some(url) => devpilot_engine::sources::SourceSettings {
            kind: SourceKind::Github,
            api_url: Some(url),
            ..Default::default()
        },
        None => devpilot_engine::sources::SourceSettings { kind: SourceKind::Github, ..Default::default() },
    };
    let client = devpilot_engine::sources::github::GithubClient::for_source(&probe, &token)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let who = match client.login().await {
        Ok(login) => Some(login),
        Err(e @ TrackerError::Auth(..)) => return Err(Error::Invalid(format!("{e}; nothing was stored"))),
        Err(e) => {
            eprintln!("warning: the token could not be checked ({e}); storing it anyway");
            None
        }
    };
    let api = probe.api_url();
    tokio::task::spawn_blocking(move || keys::store_github_token_at(secrets::SERVICE, &api, &token, imported))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))??;
    let from = if imported { " (imported from gh)" } else { "" };
    match who {
        Some(name) => println!("GitHub token of {name}{from} stored in the keychain"),
        None => println!("GitHub token{from} stored in the keychain"),
    }
    Ok(())
}

/// A yes/no question on the terminal; Enter is yes.
fn ask_yes(question: &str) -> Result<bool> {
    use std::io::Write;
    print!("{question}");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(!line.trim().to_lowercase().starts_with('n'))
}

pub async fn login(raw: &str) -> Result<()> {
    let url = DbUrl::parse(raw)?;
    if url.is_sqlite() {
        return Err(Error::Invalid("login is for PostgreSQL; a sqlite:// URL needs no password".into()));
    }
    if url.password().is_some() {
        return Err(Error::Invalid(
            "do not put the password in the URL (it would land in your shell history); you will be asked for it".into(),
        ));
    }
    let password = read_secret(&format!("Password for {}: ", secrets::account(&url)))?;
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

/// A secret `devpilot login` stores and `logout` forgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secret {
    Database,
    Linear,
    Github,
}

impl Secret {
    fn words(self) -> &'static str {
        match self {
            Secret::Database => "the database password",
            Secret::Linear => "the Linear API key",
            Secret::Github => "the GitHub token",
        }
    }
}

/// The secret the flags name; `None`: none does, ask.
pub fn which(database: bool, linear: bool, github: bool) -> Option<Secret> {
    match (database, linear, github) {
        (true, _, _) => Some(Secret::Database),
        (_, true, _) => Some(Secret::Linear),
        (_, _, true) => Some(Secret::Github),
        _ => None,
    }
}

/// Asks which secret, on a terminal; elsewhere a usage error that names the flags.
fn ask_which(verb: &str, flags: &str) -> Result<Secret, Fail> {
    use std::io::Write;
    if !std::io::stdin().is_terminal() {
        return Err(Fail::new(Code::Usage, format!("say what to {verb}: {flags}")));
    }
    print!("What do you want to {verb}?\n  1) a PostgreSQL database password\n  2) a Linear API key\n  3) a GitHub token\nChoose 1, 2 or 3: ");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    match line.trim() {
        "1" => Ok(Secret::Database),
        "2" => Ok(Secret::Linear),
        "3" => Ok(Secret::Github),
        other => Err(Fail::new(Code::Usage, format!("'{}' is not 1, 2 or 3", other.escape_default()))),
    }
}

/// `devpilot login` with no flag: asks what to store.
pub async fn login_asked() -> Out {
    let flags = "--database-url postgres://USER@HOST/DB, --linear or --github";
    match ask_which("store", flags)? {
        Secret::Linear => done(login_linear().await),
        Secret::Github => done(login_github(false, None).await),
        Secret::Database => {
            use std::io::Write;
            print!("Database URL, without the password (postgres://USER@HOST:5432/DB): ");
            std::io::stdout().flush()?;
            let mut url = String::new();
            std::io::stdin().read_line(&mut url)?;
            done(login(url.trim()).await)
        }
    }
}

/// `devpilot logout`: forgets a stored secret. Status 4 when there was none.
pub async fn logout(which: Option<Secret>, as_json: bool) -> Out {
    let secret = match which {
        Some(s) => s,
        None => ask_which("forget", "--database, --linear or --github")?,
    };
    let service = secrets::SERVICE;
    let (account, url) = match secret {
        Secret::Linear => (keys::account_of(SourceKind::Linear).to_string(), None),
        Secret::Github => (keys::account_of(SourceKind::Github).to_string(), None),
        Secret::Database => {
            let settings = Paths::for_app("devpilot")?.load()?;
            let Some(raw) = settings.database_url else {
                return Err(Fail::new(Code::Nothing, "no PostgreSQL database is configured, so no password is stored")
                    .fix("the embedded SQLite default needs none"));
            };
            let url = DbUrl::parse(&raw)?;
            (secrets::account(&url), Some(url))
        }
    };
    let removed = tokio::task::spawn_blocking(move || -> Result<bool> {
        let had = secrets::has_secret(service, &account)?;
        match (secret, &url) {
            (Secret::Database, Some(url)) => secrets::delete_password(service, url)?,
            (Secret::Linear, _) => keys::delete_key(service, SourceKind::Linear)?,
            (Secret::Github, _) => keys::delete_key(service, SourceKind::Github)?,
            _ => {}
        }
        Ok(had)
    })
    .await
    .map_err(|e| Error::Invalid(e.to_string()))??;
    if as_json {
        crate::output::json(&serde_json::json!({"secret": format!("{secret:?}").to_lowercase(), "removed": removed}));
    } else if removed {
        println!("{} was removed from the keychain", secret.words());
    }
    if removed {
        Ok(Code::Ok)
    } else {
        Err(Fail::new(Code::Nothing, format!("{} was not stored in the keychain; nothing to remove", secret.words())))
    }
}
