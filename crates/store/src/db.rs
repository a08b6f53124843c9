//! Connecting to the queue database: URL checks, redaction, pool settings, migrations, and
//! turning driver errors into messages a person can act on.

use std::time::Duration;

use devpilot_migrations::{Migrator, MigratorTrait};
use std::sync::Arc;

use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr, QueryResult, RuntimeErr,
    TransactionTrait,
};

use crate::error::{Error, Result};

/// Our URL parameter for a transaction-mode pooler (see [`DbUrl::pooled`]).
pub const POOLED_PARAM: &str = "pooled";

/// A parsed database URL. `Debug` and `Display` never show the password.
#[derive(Clone)]
pub struct DbUrl {
    url: url::Url,
    backend: DbBackend,
}

impl std::fmt::Debug for DbUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DbUrl({})", self.redacted())
    }
}

impl std::fmt::Display for DbUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl DbUrl {
    /// Parses `postgres://…`, `postgresql://…` or `sqlite://PATH`. The error never echoes
    /// the input, which may hold a password.
    pub fn parse(raw: &str) -> Result<Self> {
        let raw = raw.trim();
        let url = url::Url::parse(raw)
            .map_err(|e| Error::BadUrl(format!("{e}; expected postgres://USER@HOST:PORT/DB or sqlite://PATH")))?;
        let backend = match url.scheme() {
            "postgres" | "postgresql" => DbBackend::Postgres,
            "sqlite" => DbBackend::Sqlite,
            other => {
                return Err(Error::BadUrl(format!("unsupported scheme '{other}'; expected postgres:// or sqlite://")))
            }
        };
        if backend == DbBackend::Postgres && url.host_str().unwrap_or("").is_empty() {
            return Err(Error::BadUrl("the postgres URL has no host".into()));
        }
        if backend == DbBackend::Sqlite && sqlite_path_of(&url).is_empty() {
            return Err(Error::BadUrl("the sqlite URL has no file path".into()));
        }
        let parsed = Self { url, backend };
        if let Some(v) = parsed.param(POOLED_PARAM) {
            if !matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on" | "false" | "0" | "no" | "off") {
                return Err(Error::BadUrl(format!("{POOLED_PARAM}={v}: expected true or false")));
            }
        }
        Ok(parsed)
    }

    /// A SQLite URL for a file path.
    pub fn sqlite_file(path: &std::path::Path) -> Result<Self> {
        Self::parse(&format!("sqlite://{}", path.display()))
    }

    pub fn backend(&self) -> DbBackend {
        self.backend
    }

    pub fn is_sqlite(&self) -> bool {
        self.backend == DbBackend::Sqlite
    }

    /// The password in the URL: its user info's, else a `password` query parameter (which
    /// the PostgreSQL driver also accepts).
    pub fn password(&self) -> Option<String> {
        self.url
            .password()
            .map(percent_decode)
            .or_else(|| self.url.query_pairs().find(|(k, _)| is_password_key(k)).map(|(_, v)| v.into_owned()))
    }

    /// The URL with every query parameter that carries a password replaced (`Some`) or
    /// removed (`None`).
    fn map_query_password(url: &mut url::Url, replacement: Option<&str>) {
        if url.query_pairs().any(|(k, _)| is_password_key(&k)) {
            rewrite_query(
                url,
                |k, v| if is_password_key(k) { replacement.map(str::to_string) } else { Some(v.to_string()) },
            );
        }
    }

    pub fn user(&self) -> String {
        self.url.username().to_string()
    }

    /// The same URL with `password` set (from the keychain).
    pub fn with_password(&self, password: &str) -> Result<Self> {
        let mut url = self.url.clone();
        url.set_password(Some(password)).map_err(|_| Error::BadUrl("this URL cannot carry a password".into()))?;
        Ok(Self { url, backend: self.backend })
    }

    /// Tags PostgreSQL connections with `application_name`, so `pg_stat_activity` shows
    /// which machine holds which connection. No-op on SQLite.
    pub fn with_application_name(&self, name: &str) -> Self {
        let mut url = self.url.clone();
        if self.backend == DbBackend::Postgres {
            rewrite_query(&mut url, |k, v| (k != "application_name").then(|| v.to_string()));
            url.query_pairs_mut().append_pair("application_name", name);
        }
        Self { url, backend: self.backend }
    }

    /// The same URL with no password: what may be written to the config file.
    pub fn without_password(&self) -> Self {
        let mut url = self.url.clone();
        let _ = url.set_password(None);
        Self::map_query_password(&mut url, None);
        Self { url, backend: self.backend }
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        let mut url = self.url.clone();
        if url.password().is_some() {
            let _ = url.set_password(Some("***"));
        }
        Self::map_query_password(&mut url, Some("***"));
        // `***` percent-encoded in the query reads badly; it carries nothing either way.
        url.to_string().replace("%2A%2A%2A", "***")
    }

    /// `host:port/db` or the SQLite path, for messages.
    pub fn target(&self) -> String {
        match self.backend {
            DbBackend::Postgres => {
                format!("{}:{}{}", self.url.host_str().unwrap_or("?"), self.url.port().unwrap_or(5432), self.url.path())
            }
            _ => sqlite_path_of(&self.url),
        }
    }

    /// The full URL, password included, for the driver only. Our own parameters (`pooled`)
    /// are taken out: they are not the driver's.
    pub(crate) fn expose(&self) -> String {
        match self.backend {
            DbBackend::Sqlite => {
                let mut s = format!("sqlite://{}", sqlite_path_of(&self.url));
                s.push_str("?mode=rwc");
                s
            }
            _ => {
                let mut url = self.url.clone();
                // libpq 16's `sslrootcert=system` is what sqlx does without one: the system's roots.
                rewrite_query(&mut url, |k, v| {
                    let ours = k == POOLED_PARAM || (ROOT_CERT_KEYS.contains(&k) && v == "system");
                    (!ours).then(|| v.to_string())
                });
                url.to_string()
            }
        }
    }

    /// The same URL in pooled mode (see [`DbUrl::pooled`]), as `poll_only` asks.
    pub fn with_pooled(&self) -> Self {
        let mut url = self.url.clone();
        if self.backend == DbBackend::Postgres && !self.pooled() {
            rewrite_query(&mut url, |k, v| (k != POOLED_PARAM).then(|| v.to_string()));
            url.query_pairs_mut().append_pair(POOLED_PARAM, "true");
        }
        Self { url, backend: self.backend }
    }

    pub fn param(&self, key: &str) -> Option<String> {
        self.url.query_pairs().find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
    }

    /// Whether this URL reaches PostgreSQL through a transaction-mode pooler, where a
    /// connection may change server between two transactions: then no statement may be
    /// prepared, and LISTEN hears nothing. `pooled=true` (or `false`) in the URL says so;
    /// without it, the pooled endpoints whose names give them away count: Neon's
    /// `…-pooler.…` hosts and Supabase's transaction pooler (`….pooler.supabase.com:6543`).
    pub fn pooled(&self) -> bool {
        if self.backend != DbBackend::Postgres {
            return false;
        }
        if let Some(v) = self.param(POOLED_PARAM) {
            return matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on");
        }
        let host = self.url.host_str().unwrap_or("").to_ascii_lowercase();
        host.contains("-pooler.") || (host.ends_with(".pooler.supabase.com") && self.url.port() == Some(6543))
    }

    pub fn sqlite_path(&self) -> Option<std::path::PathBuf> {
        self.is_sqlite().then(|| std::path::PathBuf::from(sqlite_path_of(&self.url)))
    }
}

/// Rewrites the query string pair by pair: `f` returns the new value, or `None` to drop the
/// pair. An empty result leaves no bare `?`.
fn rewrite_query(url: &mut url::Url, mut f: impl FnMut(&str, &str) -> Option<String>) {
    let pairs: Vec<(String, String)> =
        url.query_pairs().filter_map(|(k, v)| f(&k, &v).map(|nv| (k.into_owned(), nv))).collect();
    if pairs.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
}

/// The query parameters through which a PostgreSQL URL can carry a password.
fn is_password_key(key: &str) -> bool {
    key.eq_ignore_ascii_case("password") || key.eq_ignore_ascii_case("sslpassword")
}

/// `%XX` escapes decoded (an invalid one is kept as it is), lossily as UTF-8.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// `sqlite:///abs/path`, `sqlite://rel/path` and `sqlite:/abs` all name a file path.
fn sqlite_path_of(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or("");
    let path = url.path();
    if host.is_empty() {
        path.to_string()
    } else {
        format!("{host}{path}")
    }
}

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

/// The spellings sqlx takes for a root certificate file.
const ROOT_CERT_KEYS: &[&str] = &["sslrootcert", "ssl-root-cert", "ssl-ca"];

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

/// One statement over the simple query protocol: no Parse, no Bind, nothing prepared. The
/// only way a statement survives a transaction-mode pooler such as PgBouncer 1.18, which
/// may hand the Bind to another server than the Parse (sqlx prepares every statement, even
/// unnamed ones, in a round trip of its own). `sql` carries its values inline (see
/// [`inline_values`]). PostgreSQL only.
///
/// Each goes after an `UNLISTEN *`, in the same implicit transaction. A server connection of a
/// pooler may still LISTEN for another client (an older machine, another app) that is long
/// gone; our own trigger's NOTIFY would then be delivered to us at the commit, and the driver
/// would fail a statement that has committed. Unlistening in the same transaction means
/// nothing is delivered; on a connection that listens for nothing it costs nothing.
pub(crate) async fn query_simple(db: &DatabaseConnection, sql: String) -> Result<Vec<QueryResult>, DbErr> {
    let pool = db.get_postgres_connection_pool();
    let rows = sea_orm::sqlx::raw_sql(sea_orm::sqlx::AssertSqlSafe(format!("UNLISTEN *; {sql}")))
        .fetch_all(pool)
        .await
        .map_err(|e| DbErr::Query(RuntimeErr::SqlxError(Arc::new(e))))?;
    Ok(rows.into_iter().map(QueryResult::from).collect())
}

/// [`query_simple`] for a statement whose rows are not wanted: how many it touched.
pub(crate) async fn exec_simple(db: &DatabaseConnection, sql: String) -> Result<u64, DbErr> {
    let pool = db.get_postgres_connection_pool();
    let done = sea_orm::sqlx::raw_sql(sea_orm::sqlx::AssertSqlSafe(format!("UNLISTEN *; {sql}")))
        .execute(pool)
        .await
        .map_err(|e| DbErr::Exec(RuntimeErr::SqlxError(Arc::new(e))))?;
    Ok(done.rows_affected())
}

/// Writes each `$n` of `sql` as the SQL literal of `values[n - 1]`. A `$n` inside a quoted
/// literal or identifier, a comment or a dollar-quoted body, or right after an identifier
/// character, is not a placeholder and is left alone, as is one with no value. Our
/// statements are written with `$n` for every value, so a value never becomes SQL text.
pub(crate) fn inline_values(sql: &str, values: &[sea_orm::Value]) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16 * values.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        i = match b[i] {
            q @ (b'\'' | b'"') => sql[i + 1..].find(q as char).map_or(b.len(), |e| i + 1 + e + 1),
            b'-' if b.get(i + 1) == Some(&b'-') => sql[i..].find('\n').map_or(b.len(), |e| i + e),
            b'/' if b.get(i + 1) == Some(&b'*') => sql[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2),
            b'$' if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') => i + 1,
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let end = i + 1 + b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
                if let Some(v) = sql[i + 1..end].parse::<usize>().ok().and_then(|n| values.get(n.wrapping_sub(1))) {
                    out.push_str(&sql[copied..i]);
                    write_literal(&mut out, v);
                    copied = end;
                }
                end
            }
            b'$' => dollar_quote_end(sql, i),
            _ => i + 1,
        };
    }
    out.push_str(&sql[copied..]);
    out
}

/// Where the dollar-quoted string that starts at `start` (`$$…$$` or `$tag$…$tag$`) ends;
/// just past the `$` if none starts there.
fn dollar_quote_end(sql: &str, start: usize) -> usize {
    let rest = &sql[start + 1..];
    let tag_len = rest.find('$').filter(|&n| rest[..n].bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'));
    let Some(n) = tag_len else { return start + 1 };
    let tag = &sql[start..start + n + 2];
    let body = start + tag.len();
    sql[body..].find(tag).map_or(sql.len(), |e| body + e + tag.len())
}

/// A value as a PostgreSQL literal. Text (and JSON, as text) is written `E'…'` with both
/// backslashes and quotes doubled: correct whatever `standard_conforming_strings` and
/// `backslash_quote` are. The rest is sea-query's PostgreSQL writer (numbers, booleans, NULL).
fn write_literal(out: &mut String, v: &sea_orm::Value) {
    use sea_orm::sea_query::{PostgresQueryBuilder, QueryBuilder};
    let text = match v {
        sea_orm::Value::String(Some(s)) => s.clone(),
        sea_orm::Value::Json(Some(j)) => j.to_string(),
        other => return out.push_str(&PostgresQueryBuilder.value_to_string(other)),
    };
    out.push_str("E'");
    out.push_str(&text.replace('\\', "\\\\").replace('\'', "''"));
    out.push('\'');
}

/// Applies every pending migration. Through a transaction-mode pooler they run in one
/// transaction, so that every statement sea-orm prepares stays on one server, and the
/// statements sqlx leaves prepared there are deallocated before the commit: the next client
/// of that server connection must not find a `sqlx_s_1` already there.
pub async fn migrate(url: &DbUrl, db: &DatabaseConnection) -> Result<()> {
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
    let db = connect(url, pool).await?;
    if url.is_sqlite() {
        migrate(url, &db).await?;
    } else {
        check_schema(url, &db).await?;
    }
    Ok(db)
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

    /// A password never appears in the redacted or displayed URL, only in what the driver gets.
    #[test]
    fn redaction_hides_the_password() {
        let u = DbUrl::parse("postgres://alice:s3cr%40t@db.example:5433/dev").unwrap();
        assert_eq!(u.password().as_deref(), Some("s3cr@t"));
        assert!(!u.to_string().contains("s3cr"));
        assert!(!format!("{u:?}").contains("s3cr"));
        assert!(!u.without_password().expose().contains("s3cr"));
        assert_eq!(u.target(), "db.example:5433/dev");
        // What login writes to the config keeps the TLS parameters.
        let tls = DbUrl::parse("postgres://alice:pw@db.example/dev?sslmode=verify-full&sslrootcert=/ca.pem").unwrap();
        assert_eq!(
            tls.without_password().to_string(),
            "postgres://alice@db.example/dev?sslmode=verify-full&sslrootcert=/ca.pem"
        );
    }

    /// A password in the query (`?password=`, which the driver accepts) counts as a password:
    /// hidden when shown, dropped by `without_password`, refused where the URL is stored.
    #[test]
    fn a_query_password_is_a_password() {
        let u = DbUrl::parse("postgres://alice@db.example/dev?sslmode=require&password=q-s3cr3t").unwrap();
        assert_eq!(u.password().as_deref(), Some("q-s3cr3t"));
        assert!(!u.to_string().contains("q-s3cr3t"), "{u}");
        assert!(u.to_string().contains("password=***") && u.to_string().contains("sslmode=require"), "{u}");
        let bare = u.without_password();
        assert_eq!(bare.password(), None);
        assert_eq!(bare.to_string(), "postgres://alice@db.example/dev?sslmode=require");
        let only = DbUrl::parse("postgres://alice@db.example/dev?password=x").unwrap().without_password();
        assert_eq!(only.to_string(), "postgres://alice@db.example/dev");
    }

    /// Bad URLs are rejected with a message that names what was expected.
    #[test]
    fn bad_urls_are_explained() {
        for bad in ["", "not a url", "mysql://x/y", "postgres:///db", "sqlite://"] {
            let e = DbUrl::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid database URL"), "{bad}: {e}");
        }
        let e = DbUrl::parse("mysql://u:hunter2@h/d").unwrap_err().to_string();
        assert!(!e.contains("hunter2"));
    }

    /// A driver message that would carry the password is redacted.
    #[test]
    fn classify_never_echoes_the_password() {
        let u = DbUrl::parse("postgres://alice:s3cr3t-pw@db.example/dev").unwrap();
        let e = classify(&u, DbErr::Custom("bad options for s3cr3t-pw".into()));
        assert!(!e.to_string().contains("s3cr3t-pw"), "{e}");
        assert!(e.to_string().contains("***"), "{e}");
    }

    /// Values are written in as escaped literals; a `$` inside a quoted literal or identifier,
    /// and a placeholder with no value, are left as they are.
    #[test]
    fn inline_values_quotes_and_escapes() {
        let values = [sea_orm::Value::from("it's"), sea_orm::Value::from(7i64), sea_orm::Value::from(None::<String>)];
        let sql = inline_values("SELECT $1, $2, '$1', \"$2\", $3, $4, $20, a$1", &values);
        assert_eq!(sql, "SELECT E'it''s', 7, '$1', \"$2\", NULL, $4, $20, a$1");
        let back = inline_values("SELECT $1", &[sea_orm::Value::from("a\\b'; DROP TABLE x; --")]);
        assert_eq!(back, "SELECT E'a\\\\b''; DROP TABLE x; --'");
        let hidden = inline_values("SELECT 1 -- $1\n, $2 /* $1 */, $$ $1 $$, $q$ $1 $q$", &values);
        assert_eq!(hidden, "SELECT 1 -- $1\n, 7 /* $1 */, $$ $1 $$, $q$ $1 $q$");
    }

    /// `pooled=` is read, checked, kept in what is shown and written, and never given to the
    /// driver; the pooled endpoints of Neon and Supabase are recognised by name.
    #[test]
    fn pooled_mode_from_the_url() {
        let u = DbUrl::parse("postgres://a:pw@h:6432/d?pooled=true&sslmode=require").unwrap();
        assert!(u.pooled());
        assert!(u.to_string().contains("pooled=true"));
        assert_eq!(u.expose(), "postgres://a:pw@h:6432/d?sslmode=require");
        assert!(!DbUrl::parse("postgres://a@h/d").unwrap().pooled());
        assert!(DbUrl::parse("postgres://a@h/d").unwrap().with_pooled().pooled());
        assert!(DbUrl::parse("postgres://a@ep-cool-1-pooler.us-east-2.aws.neon.tech/d").unwrap().pooled());
        assert!(!DbUrl::parse("postgres://a@ep-cool-1.us-east-2.aws.neon.tech/d").unwrap().pooled());
        assert!(DbUrl::parse("postgres://a@aws-0-eu-central-1.pooler.supabase.com:6543/postgres").unwrap().pooled());
        assert!(!DbUrl::parse("postgres://a@aws-0-eu-central-1.pooler.supabase.com:5432/postgres").unwrap().pooled());
        assert!(!DbUrl::parse("postgres://a@x-pooler.example/d?pooled=false").unwrap().pooled());
        let e = DbUrl::parse("postgres://a@h/d?pooled=maybe").unwrap_err().to_string();
        assert!(e.contains("pooled=maybe: expected true or false"), "{e}");
    }

    /// The query rewrites keep every other parameter, replace rather than repeat their own,
    /// and leave no bare `?` when nothing is left.
    #[test]
    fn query_rewrites_keep_the_rest() {
        let u = DbUrl::parse("postgres://a:pw@h/d?pooled=true&sslrootcert=system").unwrap();
        assert_eq!(u.expose(), "postgres://a:pw@h/d");
        let u = DbUrl::parse("postgres://a@h/d?sslmode=verify-full&sslrootcert=/ca.pem&pooled=false").unwrap();
        assert_eq!(u.expose(), "postgres://a@h/d?sslmode=verify-full&sslrootcert=%2Fca.pem");
        assert_eq!(
            u.with_pooled().to_string(),
            "postgres://a@h/d?sslmode=verify-full&sslrootcert=%2Fca.pem&pooled=true"
        );
        let named = u.with_application_name("x").with_application_name("devpilot m1");
        assert_eq!(named.param("application_name").as_deref(), Some("devpilot m1"));
        assert_eq!(named.to_string().matches("application_name").count(), 1);
        assert_eq!(named.param("sslmode").as_deref(), Some("verify-full"));
        let bare = DbUrl::parse("postgres://a@h/d?password=pw").unwrap().without_password();
        assert_eq!(bare.to_string(), "postgres://a@h/d");
    }

    /// SQLite URLs map to file paths in the usual spellings.
    #[test]
    fn sqlite_paths() {
        assert_eq!(DbUrl::parse("sqlite:///tmp/a.db").unwrap().target(), "/tmp/a.db");
        assert_eq!(DbUrl::parse("sqlite://rel/a.db").unwrap().target(), "rel/a.db");
    }
}
