//! Which database a machine uses: `DEVPILOT_DATABASE_URL` when set, else the settings' URL
//! (with its password from the keychain), else the embedded SQLite default, created on
//! first use. The tray and the CLI both ask here.

use devpilot_store::db::DbUrl;
use devpilot_store::error::Result;

use crate::config::Paths;
use crate::secrets;

/// Which database to use: `DEVPILOT_DATABASE_URL` when set, else the config file's URL with
/// its keychain password, else the embedded SQLite default. A keychain that cannot be reached
/// is an error for a PostgreSQL URL: there is never a plain-text fallback.
pub fn resolve_database(paths: &Paths, service: &str) -> Result<DbUrl> {
    let env_url = crate::seal::env_database_url();
    resolve_database_with(paths, service, env_url.as_deref())
}

/// [`resolve_database`] with the environment's URL passed in.
pub fn resolve_database_with(paths: &Paths, service: &str, env_url: Option<&str>) -> Result<DbUrl> {
    if let Some(raw) = env_url {
        return with_env_password(DbUrl::parse(raw)?);
    }
    let settings = paths.load()?;
    if let Some(raw) = settings.database_url.filter(|u| !u.trim().is_empty()) {
        // The settings' poll_only is pooled mode for every command, not only for `run`.
        let url = DbUrl::parse(&raw)?;
        let url = if settings.poll_only { url.with_pooled() } else { url };
        if url.is_sqlite() || url.password().is_some() {
            return Ok(url);
        }
        return match secrets::load_password(service, &url)? {
            Some(pw) => url.with_password(&pw),
            None => with_env_password(url),
        };
    }
    DbUrl::sqlite_file(&paths.default_db())
}

/// A PostgreSQL URL without a password gets `PGPASSWORD`'s, as the driver would have given
/// it: the variable itself left the environment at start ([`devpilot_engine::seal`]).
fn with_env_password(url: DbUrl) -> Result<DbUrl> {
    match crate::seal::env_pgpassword() {
        Some(pw) if !url.is_sqlite() && url.password().is_none() => url.with_password(&pw),
        _ => Ok(url),
    }
}
