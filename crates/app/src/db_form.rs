//! [`DbForm`]: the database part of the settings form, to and from a stored URL, and its
//! [`DbMode`].

use serde::{Deserialize, Serialize};

use devpilot_store::db::DbUrl;
use devpilot_store::error::{Error, Result};

/// Where the form's database is; in JSON "embedded", "postgres" or "url", as the window's
/// select names them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DbMode {
    /// The embedded SQLite default (also read from "", and from a form with no mode).
    #[default]
    #[serde(alias = "")]
    Embedded,
    /// A PostgreSQL server, from the host, port, database, user and TLS fields.
    Postgres,
    /// A sqlite:// URL, in the form's `url`.
    Url,
    /// A mode this version does not know, kept as sent so [`DbForm::to_url`] refuses it by name.
    #[serde(untagged)]
    Unknown(String),
}

/// The database part of the settings form. The password never travels back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
#[serde(default)]
pub struct DbForm {
    pub mode: DbMode,
    pub host: String,
    pub port: Option<u16>,
    pub database: String,
    pub user: String,
    pub sslmode: String,
    /// The CA file the server's certificate must chain to (PostgreSQL's `sslrootcert`),
    /// checked with sslmode verify-ca or verify-full. Kept in the URL: a path, not a secret.
    pub sslrootcert: String,
    pub url: String,
}

impl DbForm {
    /// The form for a stored URL.
    pub fn of(url: Option<&str>) -> Self {
        let Some(raw) = url.filter(|u| !u.trim().is_empty()) else {
            return Self { mode: DbMode::Embedded, ..Self::default() };
        };
        match url::Url::parse(raw) {
            Ok(u) if u.scheme().starts_with("postgres") => Self {
                mode: DbMode::Postgres,
                host: u.host_str().unwrap_or("").to_string(),
                port: u.port(),
                database: devpilot_store::db::percent_decode(u.path().trim_start_matches('/')),
                user: u.username().to_string(),
                sslmode: query_value(&u, "sslmode"),
                sslrootcert: query_value(&u, "sslrootcert"),
                url: String::new(),
            },
            _ => Self { mode: DbMode::Url, url: raw.to_string(), ..Self::default() },
        }
    }

    /// The URL to store (never with a password), or `None` for the embedded default.
    pub fn to_url(&self) -> Result<Option<DbUrl>> {
        match &self.mode {
            DbMode::Embedded => Ok(None),
            DbMode::Url => {
                let u = DbUrl::parse(&self.url)?;
                if u.password().is_some() {
                    return Err(Error::Invalid(
                        "do not put the password in the URL; type it in the password field and it goes to the keychain"
                            .into(),
                    ));
                }
                Ok(Some(u))
            }
            DbMode::Postgres => {
                let host = self.host.trim();
                if host.is_empty() {
                    return Err(Error::Invalid("the database host must not be empty".into()));
                }
                if host.chars().any(|c| c.is_whitespace() || "/@?#".contains(c)) {
                    return Err(Error::Invalid(format!("'{host}' is not a host name")));
                }
                let user = self.user.trim();
                if user.is_empty() {
                    return Err(Error::Invalid("the database user must not be empty".into()));
                }
                let dbname = self.database.trim();
                if dbname.is_empty() {
                    return Err(Error::Invalid("the database name must not be empty".into()));
                }
                let mut u = url::Url::parse(&format!("postgres://{host}"))
                    .map_err(|e| Error::BadUrl(format!("host '{host}': {e}")))?;
                u.set_username(user).map_err(|_| Error::BadUrl("the user name cannot be used".into()))?;
                u.set_port(Some(self.port.unwrap_or(5432)))
                    .map_err(|_| Error::BadUrl("the port cannot be used".into()))?;
                u.path_segments_mut()
                    .map_err(|_| Error::BadUrl("the database name cannot be used".into()))?
                    .push(dbname);
                for (key, value) in self.tls_params()? {
                    u.query_pairs_mut().append_pair(key, &value);
                }
                Ok(Some(DbUrl::parse(u.as_str())?))
            }
            DbMode::Unknown(other) => Err(Error::Invalid(format!("unknown database mode '{other}'"))),
        }
    }

    /// `sslmode` and `sslrootcert`, checked. A root certificate with no mode means
    /// verify-full; with a mode that does not verify the server it is refused, since it
    /// would be silently unused.
    fn tls_params(&self) -> Result<Vec<(&'static str, String)>> {
        const MODES: [&str; 6] = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];
        let cert = self.sslrootcert.trim();
        let mode = match self.sslmode.trim() {
            "" if !cert.is_empty() => "verify-full",
            m => m,
        };
        let mut params = vec![];
        if !mode.is_empty() {
            if !MODES.contains(&mode) {
                return Err(Error::Invalid(format!("sslmode '{mode}' is not one of {}", MODES.join(", "))));
            }
            params.push(("sslmode", mode.to_string()));
        }
        if !cert.is_empty() {
            if !matches!(mode, "verify-ca" | "verify-full") {
                return Err(Error::Invalid(format!(
                    "a root certificate is only checked with sslmode verify-ca or verify-full, not {mode}; choose one of those, or clear the certificate"
                )));
            }
            params.push(("sslrootcert", root_cert_path(cert)?));
        }
        Ok(params)
    }
}

/// The root certificate's full path (a leading `~/` is the home directory): it must be an
/// existing file, since the driver reads it at every connection, from whatever directory.
fn root_cert_path(raw: &str) -> Result<String> {
    let path = devpilot_engine::worktree::expand_home(raw);
    if !path.is_absolute() {
        return Err(Error::Invalid(format!("give the root certificate's full path, not '{raw}'")));
    }
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path.display().to_string()),
        Ok(_) => Err(Error::Invalid(format!("the root certificate {} is not a file", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::Invalid(format!("the root certificate {} does not exist", path.display())))
        }
        Err(e) => Err(Error::Invalid(format!("cannot read the root certificate {}: {e}", path.display()))),
    }
}

fn query_value(u: &url::Url, key: &str) -> String {
    u.query_pairs().find(|(k, _)| k == key).map(|(_, v)| v.into_owned()).unwrap_or_default()
}
