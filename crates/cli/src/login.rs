//! `devpilot login`: a PostgreSQL password into the OS keychain, and the URL (without it)
//! into the config file.

use std::io::IsTerminal;

use devpilot_engine::config::Paths;
use devpilot_engine::secrets;
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::error::{Error, Result};

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
