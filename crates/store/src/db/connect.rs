//! Pools: settings, connecting (TLS files checked first), migrations, the schema check,
//! and driver errors in plain words.

use std::time::Duration;

use devpilot_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbErr, TransactionTrait};

use super::pooled::query_simple;
use super::url::{DbUrl, ROOT_CERT_KEYS};
use crate::error::{Error, Result};

/// Pool settings. A machine holds at most `max_connections` pooled connections, plus one
/// LISTEN connection on PostgreSQL.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub max_connections: u32,
    /// How long establishing a connection may take, handshake included; also the pool's
    /// acquire timeout. It is not the per-call bound: on a loaded machine a password handshake
    /// alone can take longer than a short heartbeat, and a connect cut short at every call
    /// never completes (see [`crate::Queue`]'s reconnect in the background).
    pub connect_timeout: Duration,
    /// The bound a machine puts on each call (below its heartbeat, so a silent network is
    /// noticed within one); on SQLite, also the wait for the file's write lock. The calls
    /// themselves are bounded by [`crate::Queue::with_call_timeout`].
    pub call_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self { max_connections: 1, connect_timeout: Duration::from_secs(5), call_timeout: Duration::from_secs(30) }
    }
}

/// Opens a pool and checks it with one round trip, so a bad password or an unreachable host
/// is reported now, in words, rather than on the first poll.
pub async fn connect(url: &DbUrl, pool: &PoolSettings) -> Result<DatabaseConnection> {
    if let Some(path) = url.sqlite_path() {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::Unreachable {
                target: url.target(),
                reason: format!("cannot create the directory {}: {e}", dir.display()),
            })?;
        }
    }
    check_tls_files(url)?;
    let mut opts = ConnectOptions::new(url.expose());
    opts.max_connections(pool.max_connections.max(1))
        .min_connections(0)
        .connect_timeout(pool.connect_timeout)
        .acquire_timeout(pool.connect_timeout.max(pool.call_timeout))
        .sqlx_logging(false);
    if url.is_sqlite() {
        // A file does not hang up, so the pool's ping before every statement (sqlx's
        // default) only adds a round trip to the connection's worker thread and back: two
        // thread wake-ups per statement on an idle tray, for nothing.
        opts.test_before_acquire(false);
        let busy = pool.call_timeout;
        opts.map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sea_orm::sqlx::sqlite::SqliteSynchronous::Normal)
                .busy_timeout(busy)
                .foreign_keys(true)
        });
    }
    if url.pooled() {
        // A transaction-mode pooler: the queue's statements go unprepared (see
        // [`query_simple`]). What still goes through sea-orm (the migrations, pinned to one
        // transaction) must not reuse a cached statement; sqlx still names each one (sqlx_s_N)
        // and leaves it prepared, which `migrate` deallocates. Nor is extra_float_digits sent: a
        // pooler refuses startup parameters it does not know unless told to ignore them.
        opts.map_sqlx_postgres_opts(|o| o.statement_cache_capacity(0).extra_float_digits(None));
    }
    let db = Database::connect(opts).await.map_err(|e| classify(url, e))?;
    db.ping().await.map_err(|e| classify(url, e))?;
    Ok(db)
}

/// A root certificate (or client certificate) the URL names must exist: the driver would
/// only say "No such file" as if the network had failed.
fn check_tls_files(url: &DbUrl) -> Result<()> {
    let keys = ROOT_CERT_KEYS.iter().chain(&["sslcert", "ssl-cert", "sslkey", "ssl-key"]);
    for key in keys {
        if let Some(path) = url.param(key).filter(|p| !(ROOT_CERT_KEYS.contains(key) && p == "system")) {
            if !std::path::Path::new(&path).is_file() {
                return Err(Error::BadUrl(format!("{key}={path}: no such file")));
            }
        }
    }
    Ok(())
}

/// Applies every pending migration. Through a transaction-mode pooler they run in one
/// transaction, so that every statement sea-orm prepares stays on one server, and the
/// statements sqlx leaves prepared there are deallocated before the commit: the next client
/// of that server connection must not find a `sqlx_s_1` already there.
pub async fn migrate(url: &DbUrl, db: &DatabaseConnection) -> Result<()> {
    if let Some(path) = url.sqlite_path() {
        // Processes that migrate one SQLite file at once (the tray, `devpilot run`, a
        // `devpilot show` or `devpilot migrate` typed meanwhile) take turns: two migrations at
        // once would both add the same column, and one would fail.
        let _turn = sqlite_turn(path).await?;
        return Migrator::up(db, None).await.map_err(|e| classify(url, e));
    }
    if !url.pooled() {
        return Migrator::up(db, None).await.map_err(|e| classify(url, e));
    }
    let pinned = async {
        let txn = db.begin().await?;
        txn.execute_unprepared(DEALLOCATE_SQLX).await?;
        // In a savepoint, so that after a failed migration the transaction is still alive to
        // deallocate (PREPARE and DEALLOCATE are not undone by a rollback).
        let inner = txn.begin().await?;
        let applied = Migrator::up(&inner, None).await;
        match &applied {
            Ok(()) => inner.commit().await?,
            Err(_) => inner.rollback().await?,
        }
        txn.execute_unprepared(DEALLOCATE_SQLX).await?;
        applied?;
        txn.commit().await
    };
    pinned.await.map_err(|e| classify(url, e))
}

/// Deallocates this session's statements that sqlx prepared (`sqlx_s_N`), and only those:
/// a pooler that tracks prepared statements itself (PgBouncer 1.21+) names its own
/// differently, and they are left alone.
const DEALLOCATE_SQLX: &str = "DO $$DECLARE s text; BEGIN
    FOR s IN SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'sqlx_s_') LOOP
        EXECUTE format('DEALLOCATE %I', s);
    END LOOP;
END$$";

/// Connects, and on SQLite (the embedded default) migrates on first use. PostgreSQL is shared,
/// so its schema changes only through an explicit `devpilot migrate`; a missing schema gets a
/// message that says so.
pub async fn open(url: &DbUrl, pool: &PoolSettings) -> Result<DatabaseConnection> {
    if let Some(path) = url.sqlite_path() {
        // The connect takes its turn too: a new connection's first statements (WAL mode, the
        // check's round trip) on a file another process is migrating can fail at once with
        // "database is locked", since SQLite answers a lock it could deadlock on without
        // waiting out the busy timeout.
        let turn = sqlite_turn(path).await?;
        let db = connect(url, pool).await?;
        Migrator::up(&db, None).await.map_err(|e| classify(url, e))?;
        drop(turn);
        return Ok(db);
    }
    let db = connect(url, pool).await?;
    check_schema(url, &db).await?;
    Ok(db)
}

/// [`migrate_turn`] off the async workers.
async fn sqlite_turn(path: std::path::PathBuf) -> Result<std::fs::File> {
    tokio::task::spawn_blocking(move || migrate_turn(&path)).await.map_err(|e| Error::Invalid(e.to_string()))?
}

/// This process's turn to migrate the SQLite file at `path`: an exclusive lock on
/// `<path>-migrate.lock` (its directory made if need be), held until the returned file is
/// dropped (or the process ends).
fn migrate_turn(path: &std::path::Path) -> Result<std::fs::File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create the database's directory", e))?;
    }
    let mut name = path.as_os_str().to_owned();
    name.push("-migrate.lock");
    let lock_path = std::path::PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io("cannot open the database's migration lock", e))?;
    file.lock().map_err(|e| Error::io("cannot lock the database for its migration", e))?;
    Ok(file)
}

async fn check_schema(url: &DbUrl, db: &DatabaseConnection) -> Result<()> {
    if schema_present(url, db).await? {
        Ok(())
    } else {
        Err(Error::NoSchema { target: url.target() })
    }
}

/// Whether DevPilot's tables exist in this database (the first-run guide offers to create them).
pub async fn schema_present(url: &DbUrl, db: &DatabaseConnection) -> Result<bool> {
    // The simple protocol on every backend connection kind: this runs before the queue has
    // had a chance to learn that it is behind a pooler.
    let sql = "SELECT to_regclass('dispatch_queue') IS NOT NULL AS present".to_string();
    let rows = query_simple(db, sql).await.map_err(|e| classify(url, e))?;
    Ok(rows.first().map(|r| r.try_get::<bool>("", "present")).transpose()?.unwrap_or(false))
}

/// Turns a driver error into one of the engine's errors (by driver variant and SQLSTATE, see
/// [`crate::error::classify`]), naming this URL's target and user and never its password.
pub fn classify(url: &DbUrl, e: DbErr) -> Error {
    let classified = crate::error::classify(e, &url.target(), &url.user());
    // No driver message is known to echo the password; should one ever do, it must not
    // reach a log line or the window.
    match url.password().filter(|p| !p.is_empty()) {
        Some(pw) if classified.to_string().contains(&pw) => Error::Invalid(classified.to_string().replace(&pw, "***")),
        _ => classified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver message that would carry the password is redacted.
    #[test]
    fn classify_never_echoes_the_password() {
        let u = DbUrl::parse("postgres://alice:s3cr3t-pw@db.example/dev").unwrap();
        let e = classify(&u, DbErr::Custom("bad options for s3cr3t-pw".into()));
        assert!(!e.to_string().contains("s3cr3t-pw"), "{e}");
        assert!(e.to_string().contains("***"), "{e}");
    }
}
