//! The engine's one error type. It serialises as `{kind, message}` so the tray's commands can
//! hand it to the window unchanged, and its messages never carry a secret.
//!
//! Database errors are classified once, here, by driver variant and SQLSTATE (never by the
//! words of a message), into what a person can act on and whether trying again can help:
//! [`Error::is_transient`] is the one predicate the retry policy ([`crate::retry`]) uses.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{DbErr, RuntimeErr};
use serde::Serialize;

/// Everything the engine can report to a user.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("invalid database URL: {0}")]
    BadUrl(String),
    /// Refused, reset, timed out, shut down by an administrator: the database may come back.
    #[error("cannot reach the database at {target}: {reason}")]
    Unreachable { target: String, reason: String },
    /// The TLS handshake failed: most often the server's certificate was refused (an unknown
    /// CA, another host name, expired). Retrying cannot help.
    #[error("TLS to the database at {target} failed: {reason}")]
    Tls { target: String, reason: String },
    /// A statement or a connection did not answer within the machine's bound.
    #[error("the database did not answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// SQLSTATE 28P01/28000: retrying cannot help.
    #[error("the database rejected the login for user '{user}': wrong password or unknown user")]
    Auth { user: String },
    /// SQLSTATE 3D000.
    #[error("the database {target} does not exist: create it, or fix the database name")]
    NoDatabase { target: String },
    #[error("database error: {0}")]
    Db(#[source] DbErr),
    #[error("malformed payload: {0}")]
    Payload(String),
    #[error("agent program '{0}' was not found or is not executable")]
    AgentMissing(String),
    #[error("agent preset '{preset}' runs `{program}`, which was not found on PATH ({path}); install it, or set the agent to a command")]
    PresetMissing { preset: String, program: String, path: String },
    #[error("config file {path} is invalid: {reason}")]
    Config { path: String, reason: String },
    #[error("keychain: {0}")]
    Keychain(String),
    #[error("{0}")]
    Invalid(String),
    /// A duration as a person typed it ("30m") that does not parse. Kind `invalid`.
    #[error("'{text}' is not a duration ({source}); try 30s, 5m or 1h")]
    BadDuration { text: String, source: humantime::DurationError },
    /// A repo, label or other name outside 1-100 of letters, digits, `.`, `_` and `-`. Kind
    /// `invalid`.
    #[error("{what} '{name}' is not a valid name: use 1-100 letters, digits, '.', '_' or '-'")]
    BadName { what: String, name: String },
    /// A PostgreSQL database that `devpilot migrate` has not been run on. Kind `invalid`.
    #[error("the database {target} has no DevPilot schema yet: run `devpilot migrate` once")]
    NoSchema { target: String },
    /// Kind `invalid`.
    #[error("there is no job #{0}")]
    NoJob(i64),
    /// `context`, when there is one, says what was being done ("cannot render the manual
    /// page"). The error is shared, so that [`Error`] stays `Clone`.
    #[error("I/O error: {}{source}", io_context(.context))]
    Io { context: Option<String>, source: Arc<std::io::Error> },
}

/// The words before an I/O error's own: its context, if it has one.
fn io_context(context: &Option<String>) -> String {
    context.as_deref().map(|c| format!("{c}: ")).unwrap_or_default()
}

impl Error {
    /// A stable machine-readable name for the variant.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::BadUrl(_) => "bad_url",
            Error::Unreachable { .. } | Error::Timeout(_) => "unreachable",
            Error::Auth { .. } => "auth",
            Error::Tls { .. } => "tls",
            Error::NoDatabase { .. } => "no_database",
            Error::Db(_) => "db",
            Error::Payload(_) => "payload",
            Error::AgentMissing(_) | Error::PresetMissing { .. } => "agent_missing",
            Error::Config { .. } => "config",
            Error::Keychain(_) => "keychain",
            Error::Invalid(_)
            | Error::BadDuration { .. }
            | Error::BadName { .. }
            | Error::NoSchema { .. }
            | Error::NoJob(_) => "invalid",
            Error::Io { .. } => "io",
        }
    }

    /// Whether the same call may succeed later: the network or the server, not the request.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::Timeout(_) => true,
            Error::Db(e) => match db_code(e) {
                // A protocol violation in answer to a statement: sending it again repeats it.
                Some(Code::Sqlstate(c)) if c == "08P01" => matches!(e, DbErr::Conn(_)),
                Some(Code::Sqlstate(c)) => c.starts_with("08") || TRANSIENT_SQLSTATES.contains(&c.as_str()),
                // SQLite's primary result code is the low byte: SQLITE_BUSY (5), SQLITE_LOCKED (6).
                Some(Code::Sqlite(c)) => matches!(c & 0xff, 5 | 6),
                None => false,
            },
            _ => false,
        }
    }
}

impl Error {
    /// An I/O error with what was being done: `I/O error: <context>: <error>`.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: Some(context.into()), source: Arc::new(source) }
    }

    /// A unique index refused the row (SQLSTATE 23505; SQLite's SQLITE_CONSTRAINT_UNIQUE).
    pub fn is_unique_violation(&self) -> bool {
        match self {
            Error::Db(e) => match db_code(e) {
                Some(Code::Sqlstate(c)) => c == "23505",
                Some(Code::Sqlite(c)) => c == 2067,
                None => false,
            },
            _ => false,
        }
    }
}

/// A prepared statement that already exists (42P05) or does not (26000) on the server the
/// statement reached: the symptom of a transaction-mode pooler (see [`crate::Queue::pooled`]).
pub fn is_prepared_statement_error(e: &DbErr) -> bool {
    matches!(db_code(e), Some(Code::Sqlstate(c)) if c == "42P05" || c == "26000")
}

/// PostgreSQL states worth a retry besides connection exceptions (class 08): serialization
/// failure and deadlock, too many connections, admin shutdown, crash shutdown, cannot connect
/// now (starting up).
const TRANSIENT_SQLSTATES: &[&str] = &["40001", "40P01", "53300", "57P01", "57P02", "57P03"];

/// A database error's code, by backend.
enum Code {
    Sqlstate(String),
    Sqlite(i32),
}

fn db_code(e: &DbErr) -> Option<Code> {
    let sea_orm::sqlx::Error::Database(d) = sqlx_of(e)? else { return None };
    let code = d.code()?.into_owned();
    if d.try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>().is_some() {
        return code.parse().ok().map(Code::Sqlite);
    }
    Some(Code::Sqlstate(code))
}

fn sqlx_of(e: &DbErr) -> Option<&sea_orm::sqlx::Error> {
    match e {
        DbErr::Conn(RuntimeErr::SqlxError(x))
        | DbErr::Exec(RuntimeErr::SqlxError(x))
        | DbErr::Query(RuntimeErr::SqlxError(x)) => Some(x),
        _ => None,
    }
}

/// Classifies a driver error. `target` names the database in messages (`host:port/db`);
/// `user` is the login for an authentication failure.
pub fn classify(e: DbErr, target: &str, user: &str) -> Error {
    use sea_orm::sqlx::Error as Sqlx;
    let unreachable = |reason: String| Error::Unreachable { target: target.to_string(), reason };
    let tls = |reason: String| Error::Tls { target: target.to_string(), reason };
    if let DbErr::ConnectionAcquire(a) = &e {
        return unreachable(format!("no connection could be had: {a}"));
    }
    let Some(x) = sqlx_of(&e) else { return Error::Db(e) };
    match x {
        // Only a refusal of the server's identity is a TLS error that waiting cannot fix; a TLS
        // record broken mid-session is the network's.
        Sqlx::Io(io) => match rustls_of(io) {
            Some(r) if is_refusal(r) => tls(tls_reason(r, target)),
            Some(r) => unreachable(format!("TLS: {r}")),
            None => unreachable(io_reason(io)),
        },
        // Garbage in answer to the connection's first message ("unexpected response from
        // SSLRequest: 0x00"): a server going down or coming up mid-handshake, as an immediate
        // restart does. Waiting fixes it; a statement's protocol error stays the statement's.
        Sqlx::Protocol(p) if matches!(e, DbErr::Conn(_)) => {
            unreachable(format!("the server answered out of protocol while connecting ({p})"))
        }
        Sqlx::PoolTimedOut => unreachable("timed out waiting for a connection".into()),
        Sqlx::PoolClosed | Sqlx::WorkerCrashed => unreachable("the connection was closed".into()),
        Sqlx::Tls(t) => match rustls_of(t.as_ref()) {
            Some(r) if !is_refusal(r) => unreachable(format!("TLS: {r}")),
            Some(r) => tls(tls_reason(r, target)),
            // sqlx's own: the server offers no TLS, a root certificate file that is not PEM.
            None => tls(t.to_string()),
        },
        Sqlx::Database(d) => match d.code().as_deref() {
            Some("28P01") | Some("28000") => Error::Auth { user: user.to_string() },
            Some("3D000") => Error::NoDatabase { target: target.to_string() },
            Some("42P05") | Some("26000") => Error::Invalid(format!(
                "the connection to {target} goes through a transaction-mode pooler (PgBouncer, Supabase's or \
                 Neon's pooled endpoint), where prepared statements do not survive: add pooled=true to the \
                 database URL"
            )),
            Some(c) if c.starts_with("57P0") => unreachable(format!("the server is shutting down or starting ({c})")),
            // PgBouncer refusing a startup parameter it was not told to ignore: no retry helps.
            Some("08P01") if d.message().starts_with("unsupported startup parameter") => Error::Invalid(format!(
                "the pooler in front of {target} refused the login: {}; add pooled=true to the database URL \
                 (DevPilot then sends no such parameter), or `ignore_startup_parameters = extra_float_digits` \
                 to pgbouncer.ini",
                d.message()
            )),
            // 08P01 in answer to a statement that was sent (a NUL in an inlined literal, say):
            // the server read the message and refused it, and the same message is refused
            // again. Only while connecting is it the connection's failure.
            Some("08P01") if !matches!(e, DbErr::Conn(_)) => Error::Db(e),
            Some(c) if c.starts_with("08") => unreachable(format!("connection failure ({c})")),
            // SQLITE_CANTOPEN: the file or its directory cannot be opened.
            Some("14") => unreachable("unable to open the database file".into()),
            _ => Error::Db(e),
        },
        _ => Error::Db(e),
    }
}

/// The rustls error in a driver error's chain. A handshake failure reaches us as an
/// `io::Error` wrapping it, and `io::Error::source` skips what it wraps, so each link is
/// also looked into.
fn rustls_of<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut link = Some(e);
    while let Some(x) = link {
        if let Some(r) = x.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(r) = x.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()?.downcast_ref()) {
            return Some(r);
        }
        link = x.source();
    }
    None
}

/// Whether the handshake refused the server's identity (rather than failing in transit).
fn is_refusal(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::UnsupportedNameType
            | rustls::Error::PeerIncompatible(_)
    )
}

/// Why the handshake failed, in words: a refused certificate says so, and why.
fn tls_reason(e: &rustls::Error, target: &str) -> String {
    use rustls::CertificateError as C;
    let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
    let why = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "it is not signed by a CA this machine trusts (set sslrootcert to the \
                                 server's CA file, or add that CA to the system's roots)"
                .to_string(),
            C::NotValidForNameContext { presented, .. } => {
                format!("it does not name the host {host}, only {} (connect by one of those)", presented.join(", "))
            }
            C::NotValidForName => format!("it does not name the host {host} (connect by a name the certificate has)"),
            C::Expired | C::ExpiredContext { .. } => "it has expired".to_string(),
            C::NotValidYet | C::NotValidYetContext { .. } => "it is not valid yet (check this clock)".to_string(),
            C::Revoked => "it has been revoked".to_string(),
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
                "it is not a server certificate (its extended key usage lacks serverAuth)".to_string()
            }
            C::BadSignature | C::BadEncoding => "it is malformed or its signature does not verify".to_string(),
            other => format!("{other:?}"),
        },
        rustls::Error::NoCertificatesPresented => "the server presented none".to_string(),
        other => return format!("the TLS handshake failed: {other}"),
    };
    format!("the server's certificate was refused: {why}")
}

fn io_reason(io: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match io.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => "connection reset".into(),
        K::TimedOut => "connection timed out".into(),
        _ => io.to_string(),
    }
}

impl Serialize for Error {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Error", 2)?;
        st.serialize_field("kind", self.kind())?;
        st.serialize_field("message", &self.to_string())?;
        st.end()
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io { context: None, source: Arc::new(e) }
    }
}

impl From<DbErr> for Error {
    fn from(e: DbErr) -> Self {
        classify(e, "the database", "?")
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused connection is transient and unreachable; a type error is neither.
    #[test]
    fn io_errors_are_transient_and_others_are_not() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = classify(DbErr::Conn(RuntimeErr::SqlxError(sea_orm::sqlx::Error::Io(refused).into())), "h:1/d", "u");
        assert!(matches!(&e, Error::Unreachable { reason, .. } if reason == "connection refused"), "{e}");
        assert!(e.is_transient());
        // A server restarting mid-handshake (seen in fleet_under_faults: a runner started then
        // exited 1): transient while connecting, the statement's own error after.
        let garbage = || sea_orm::sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into());
        let e = classify(DbErr::Conn(RuntimeErr::SqlxError(garbage().into())), "h:1/d", "u");
        assert!(matches!(&e, Error::Unreachable { .. }) && e.is_transient(), "{e}");
        assert!(!classify(DbErr::Query(RuntimeErr::SqlxError(garbage().into())), "h:1/d", "u").is_transient());
        assert!(Error::Timeout(Duration::from_secs(1)).is_transient());
        let other = Error::from(DbErr::Type("x".into()));
        assert_eq!(other.kind(), "db");
        assert!(!other.is_transient());
        assert!(!Error::Auth { user: "u".into() }.is_transient());
    }

    /// An I/O error keeps its source, and says what it said before it did.
    #[test]
    fn io_errors_keep_their_source() {
        let bare = Error::from(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(bare.to_string(), format!("I/O error: {}", std::io::Error::from(std::io::ErrorKind::NotFound)));
        assert_eq!(bare.kind(), "io");
        let e = Error::io("cannot render the manual page", std::io::Error::other("disk full"));
        assert_eq!(e.to_string(), "I/O error: cannot render the manual page: disk full");
        assert_eq!(std::error::Error::source(&e).map(|s| s.to_string()).as_deref(), Some("disk full"));
    }
}
