//! The stand-in's clock: wall time plus an offset the tests can advance, in milliseconds since
//! the Unix epoch, and Linear's timestamp format (RFC 3339, UTC, milliseconds). Each tick is
//! strictly after the previous one, so two changes never share an `updatedAt` and ordering by
//! it (as the engine's poll does) is deterministic.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, shared by the data (`updatedAt`) and the rate limits.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    /// Added to the wall clock: what [`Clock::advance`] moved it by.
    offset_ms: AtomicI64,
    /// The last value [`Clock::tick`] handed out.
    last_ms: AtomicI64,
}

impl Clock {
    /// The stand-in's current time.
    pub(crate) fn now_ms(&self) -> i64 {
        wall_ms() + self.offset_ms.load(Ordering::SeqCst)
    }

    /// A time for a change: now, or one millisecond after the previous change if now is not
    /// later than it.
    pub(crate) fn tick(&self) -> i64 {
        let now = self.now_ms();
        let previous = self.last_ms.fetch_max(now, Ordering::SeqCst);
        if previous < now {
            return now;
        }
        // Two changes in one millisecond (or the wall clock stepped back): one after the other.
        self.last_ms.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Moves the clock forward, as if that much time had passed.
    pub(crate) fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(i64::try_from(by.as_millis()).unwrap_or(i64::MAX / 2), Ordering::SeqCst);
    }
}

/// The wall clock in milliseconds since the Unix epoch.
fn wall_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX / 2)
}

/// `2026-07-22T10:00:00.123Z`: how Linear writes a `DateTime`.
pub(crate) fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// Reads a `DateTime` a client sent (UTC, `Z`, any fraction of a second) as milliseconds.
pub(crate) fn parse_rfc3339(text: &str) -> Result<i64, String> {
    let at = humantime::parse_rfc3339(text).map_err(|e| {
        format!("The Linear stand-in reads only RFC 3339 UTC timestamps such as 2026-07-22T10:00:00.000Z (not ISO 8601 durations or offsets); got {text:?}: {e}")
    })?;
    let since = at.duration_since(UNIX_EPOCH).map_err(|_| format!("timestamp before 1970: {text:?}"))?;
    i64::try_from(since.as_millis()).map_err(|_| format!("timestamp out of range: {text:?}"))
}

/// The wall-clock `SystemTime` of a stand-in time, for the request log.
pub(crate) fn system_time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
