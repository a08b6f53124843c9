//! The database the commands use, and the queue on it.
//!
//! Which database: `DEVPILOT_DATABASE_URL` when set, else the config file's URL (with its
//! password from the keychain), else the embedded SQLite default, created on first use.

use devpilot_engine::config::Paths;
use devpilot_engine::database::resolve_database;
use devpilot_engine::secrets;
use devpilot_store::db::{self, DbUrl, PoolSettings};
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::Queue;

/// `devpilot migrate`: create or upgrade the schema.
pub async fn migrate() -> Result<()> {
    let paths = Paths::for_app("devpilot")?;
    let url = resolve_database(&paths, secrets::SERVICE)?;
    if url.is_sqlite() {
        // Connects in the file's migration turn too (see `db::open`).
        db::open(&url, &PoolSettings::default()).await?;
    } else {
        let conn = db::connect(&url, &PoolSettings::default()).await?;
        db::migrate(&url, &conn).await?;
    }
    println!("migrated {}", url.target());
    Ok(())
}

pub async fn open_queue(pool: PoolSettings) -> Result<(Queue, DbUrl)> {
    open_queue_named(pool, None, false).await
}

/// The configured database's URL (from the environment, the settings or the keychain),
/// tagged `app_name`, in pooled mode if the URL says so or `pooled` asks (`run --poll-only`).
pub async fn database_url(app_name: Option<&str>, pooled: bool) -> Result<DbUrl> {
    let paths = Paths::for_app("devpilot")?;
    let mut url = tokio::task::spawn_blocking(move || resolve_database(&paths, secrets::SERVICE))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))??;
    if let Some(name) = app_name {
        url = url.with_application_name(name);
    }
    if pooled {
        url = url.with_pooled();
    }
    Ok(url)
}

/// Opens the configured queue, tagged `app_name`, in pooled mode if the URL says so or
/// `pooled` asks.
pub async fn open_queue_named(pool: PoolSettings, app_name: Option<&str>, pooled: bool) -> Result<(Queue, DbUrl)> {
    let url = database_url(app_name, pooled).await?;
    let conn = db::open(&url, &pool).await?;
    // Unprepared until proven safe (see Queue::pooled): a one-shot command gains nothing from
    // prepared statements.
    Ok((Queue::new(conn).pooled(true), url))
}

/// Which queue (orchestrator) a command uses: `--orchestrator` (or `DEVPILOT_ORCHESTRATOR`,
/// which clap reads into it), else the config file's `orchestrator_id`, else the default,
/// `personal`, which the window uses too; then one line on stderr says so.
pub fn queue_name(flag: Option<&str>) -> Result<String> {
    if let Some(name) = flag {
        devpilot_store::queue::validate_orchestrator(name)?;
        return Ok(name.to_string());
    }
    let paths = Paths::for_app("devpilot")?;
    let settings = paths.load()?;
    if !configured_queue(&paths) {
        eprintln!(
            "note: using the default queue '{}' (set orchestrator_id in the config, DEVPILOT_ORCHESTRATOR or --orchestrator)",
            settings.orchestrator_id
        );
    }
    Ok(settings.orchestrator_id)
}

/// Whether the config file names a queue itself.
fn configured_queue(paths: &Paths) -> bool {
    std::fs::read_to_string(paths.config_file())
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .is_some_and(|t| t.contains_key("orchestrator_id"))
}
