//! `devpilot login`: a PostgreSQL password into the OS keychain, and the URL (without it)
//! into the config file.

use std::io::IsTerminal;

use devpilot_engine::config::Paths;
use devpilot_engine::secrets;
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::error::{Error, Result};

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
    let password = if std::io::stdin().is_terminal() {
        rpassword::prompt_password(format!("Password for {}: ", secrets::account(&url)))?
    } else {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s)?;
        s.trim_end_matches(['\r', '\n']).to_string()
    };
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
