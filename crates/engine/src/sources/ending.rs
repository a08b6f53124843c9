//! How an outbox row's delivery ends: delivered, given up (the tracker refused it), or
//! retried after a backoff or a rate limit's reset; and whether the tracker's failure ends
//! the whole pass.

use std::time::Duration;

use super::error::TrackerError;
use devpilot_store::queue::{Delivery, DeliveryEnd};

/// How a row's calls ended, as the row's end; a failure of the tracker itself also ends
/// the pass.
pub(super) fn ending(done: Result<(), TrackerError>, d: &Delivery) -> (DeliveryEnd, Option<TrackerError>) {
    match done {
        Ok(()) => (DeliveryEnd::Delivered, None),
        Err(e @ TrackerError::Refused(..)) => (DeliveryEnd::GiveUp { error: e.to_string() }, None),
        Err(e) => {
            let after = match &e {
                TrackerError::RateLimited { reset_at_ms: Some(at), .. } => until(*at),
                _ => backoff(d.tries),
            };
            (DeliveryEnd::Retry { after, error: e.to_string() }, Some(e))
        }
    }
}

/// 5 s, 10 s, 20 s … at most 15 minutes.
pub(super) fn backoff(tries: i32) -> Duration {
    let n = tries.clamp(1, 9) as u32 - 1;
    (Duration::from_secs(5) * 2u32.pow(n)).min(Duration::from_secs(900))
}

/// From now until `at_ms` (this machine's clock: a rate limit's reset is the tracker's).
fn until(at_ms: i64) -> Duration {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64);
    Duration::from_millis((at_ms - now.unwrap_or(at_ms)).clamp(1000, 3_600_000) as u64)
}

/// The row ends refused, with `reason`: it acts on nothing, and the pass goes on.
pub(super) fn refused(reason: String) -> (DeliveryEnd, Option<TrackerError>) {
    tracing::warn!("an outbox row was refused: {reason}");
    (DeliveryEnd::Refused { reason }, None)
}
