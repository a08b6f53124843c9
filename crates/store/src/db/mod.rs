//! Connecting to the queue database: URL checks, redaction, pool settings, migrations, and
//! turning driver errors into messages a person can act on.
//!
//! # Layout
//! - `url.rs`: [`DbUrl`] (parsing, redaction, password, TLS files, pooled mode) and [`percent_decode`].
//! - `connect.rs`: [`PoolSettings`], [`connect()`], [`open`], [`migrate`], the schema check, [`classify`].
//! - `pooled.rs`: pooled mode's unprepared statements: `query_simple`, `exec_simple`, `inline_values`.

mod connect;
mod pooled;
mod url;

pub use self::connect::{classify, connect, migrate, open, schema_present, PoolSettings};
pub(crate) use self::pooled::{exec_simple, inline_values, query_simple};
pub use self::url::{percent_decode, DbUrl, POOLED_PARAM};
