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
        Err(e @ TrackerError::Auth(_)) => return Err(Error::Invalid(format!("{e}; nothing was stored"))),
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
