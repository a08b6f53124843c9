//! What callers hand the queue: job options, backoff, retry-after, retention, and the checks
//! of keys and orchestrator ids.

use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};

/// The longest dedupe key, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// When a new job may first be claimed (on the database clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Start {
    #[default]
    Now,
    /// At this time, in milliseconds since the epoch.
    At(i64),
    /// This long after the database receives the job.
    After(Duration),
}

/// A retry backoff: attempt n waits `base * 2^(n-1)`, at most `max`, with ±10 % jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Backoff {
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    #[serde(with = "humantime_serde")]
    pub max: Duration,
}

impl Backoff {
    pub const DEFAULT: Backoff = Backoff { base: Duration::from_secs(30), max: Duration::from_secs(3600) };

    /// Refuses a backoff the statements cannot compute (zero, or past 30 days).
    pub fn validate(&self) -> Result<()> {
        let month = Duration::from_secs(30 * 86_400);
        if self.base.is_zero() || self.base > month || self.max > month * 12 {
            return Err(Error::Invalid(
                "the retry backoff must be between 1 ms and 30 days (its cap at most a year)".into(),
            ));
        }
        if self.max < self.base {
            return Err(Error::Invalid("the retry backoff's maximum must not be below its base".into()));
        }
        Ok(())
    }

    /// The wait after failed attempt `attempt` (1-based), before jitter.
    pub fn delay(&self, attempt: i32) -> Duration {
        let shift = attempt.clamp(1, 31) as u32 - 1;
        Ord::min(self.base.saturating_mul(1u32 << Ord::min(shift, 30)), self.max)
    }

    /// `[base, max]` in ms.
    pub(super) fn ms(&self) -> [i64; 2] {
        [millis(self.base), millis(self.max)]
    }
}

/// ±10 %, so jobs that failed together do not come back together.
pub(super) fn jitter() -> f64 {
    use rand::Rng;
    rand::rng().random_range(0.9..=1.1)
}

/// A non-negative count of milliseconds as a duration.
pub(super) fn ms_duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Jobs added to the queue carry these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOptions {
    /// Attempts before the job is dead; stored on the row, read by the sweep and the fail path.
    pub max_attempts: i32,
    /// A dedupe key: while a job with this key is live on the orchestrator, no other is added.
    pub key: Option<String>,
    /// Higher runs first.
    pub priority: i32,
    pub start: Start,
    /// The job's own retry backoff; `None` leaves it to the runner's setting.
    pub backoff: Option<Backoff>,
    /// The tracker source it came from (a `sources` row): its reportable events then write
    /// outbox rows.
    pub source: Option<i64>,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self { max_attempts: 3, key: None, priority: 0, start: Start::Now, backoff: None, source: None }
    }
}

impl JobOptions {
    pub(super) fn validate(&self) -> Result<()> {
        if self.max_attempts < 1 {
            return Err(Error::Invalid("max attempts must be at least 1".into()));
        }
        if let Some(k) = &self.key {
            validate_key(k)?;
        }
        if let Some(b) = &self.backoff {
            b.validate()?;
        }
        Ok(())
    }

    /// `(absolute ms, delay ms)` for the insert's `COALESCE($abs, now + $delay)`.
    pub(super) fn start_values(&self) -> (Option<i64>, i64) {
        match self.start {
            Start::Now => (None, 0),
            Start::At(ms) => (Some(ms), 0),
            Start::After(d) => (None, millis(d)),
        }
    }
}

/// A dedupe key is non-empty, printable and at most [`MAX_KEY_LEN`] bytes.
pub fn validate_key(key: &str) -> Result<()> {
    if key.trim().is_empty() {
        return Err(Error::Invalid("the key must not be empty".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::Invalid(format!(
            "the key is {} bytes long; at most {MAX_KEY_LEN} are allowed (hash a longer identifier)",
            key.len()
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::Invalid("the key must not contain control characters".into()));
    }
    Ok(())
}

/// Why an agent asked to be tried later, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    /// At this time (ms since the epoch).
    At(i64),
    /// This long from now (database clock).
    In(Duration),
    /// After the job's retry backoff.
    Backoff,
}

/// How long finished work is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Completed and cancelled jobs, with their history.
    pub finished: Duration,
    /// Dead jobs, with their history.
    pub dead: Duration,
    /// Machines not seen for this long.
    pub machines: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        let day = Duration::from_secs(86_400);
        Self { finished: day * 14, dead: day * 30, machines: day * 30 }
    }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The label shown for a job: the payload's `title`, else `identifier`, else `id`.
pub fn title_of(payload: &serde_json::Value) -> Option<String> {
    ["title", "identifier", "id"].iter().find_map(|k| match payload.get(k) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Some(truncate(s, 120)),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

/// An orchestrator id is a short printable name.
pub fn validate_orchestrator(id: &str) -> Result<()> {
    if id.trim().is_empty() {
        return Err(Error::Invalid("the orchestrator id must not be empty".into()));
    }
    if id.len() > 200 || id.chars().any(|c| c.is_control()) {
        return Err(Error::Invalid("the orchestrator id must be at most 200 printable characters".into()));
    }
    Ok(())
}
