//! Database URLs: parsing, redaction, the password (user info or query), TLS file
//! parameters, pooled mode and the application name; also [`percent_decode`].

use sea_orm::DbBackend;

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

/// The spellings sqlx takes for a root certificate file.
pub(super) const ROOT_CERT_KEYS: &[&str] = &["sslrootcert", "ssl-root-cert", "ssl-ca"];

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
