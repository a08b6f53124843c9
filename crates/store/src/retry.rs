//! The one retry policy: exponential backoff with jitter (the `backon` crate), retrying only
//! what [`Error::is_transient`] says may succeed later. A wrong password or a missing
//! database is reported at once.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use crate::error::{Error, Result};

/// How long, at most, to keep trying.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub first: Duration,
    pub max_delay: Duration,
    pub total: Duration,
}

impl Budget {
    /// A fenced write after an agent ended (complete, fail, release): a database blip must not
    /// lose an outcome, and retrying a fenced write is always safe. Past this, the sweep
    /// recovers the job.
    pub const WRITE: Budget = Budget {
        first: Duration::from_millis(100),
        max_delay: Duration::from_secs(5),
        total: Duration::from_secs(120),
    };
    /// A history note (a loss, an expired lease): written once the database answers again.
    /// Tried at least every 4 s (jitter at most doubles a delay), so a note lands within one
    /// try of the database's return: held in memory for longer, it is lost if the runner is
    /// killed meanwhile. A handful of notes per machine keeps that cheap during an outage.
    pub const NOTE: Budget = Budget {
        first: Duration::from_millis(200),
        max_delay: Duration::from_secs(2),
        total: Duration::from_secs(900),
    };
    /// Connecting at start: keep trying while the database is only unreachable.
    pub const CONNECT: Budget =
        Budget { first: Duration::from_secs(1), max_delay: Duration::from_secs(10), total: Duration::MAX };

    fn backoff(self) -> ExponentialBuilder {
        let b = ExponentialBuilder::default()
            .with_min_delay(self.first)
            .with_max_delay(self.max_delay)
            .with_jitter()
            .without_max_times();
        if self.total == Duration::MAX {
            b
        } else {
            b.with_total_delay(Some(self.total))
        }
    }
}

/// Runs `op` until it succeeds, fails permanently, or `budget` is spent. `what` names the
/// operation in the log line of each retry. The budget is wall-clock time, tries included:
/// backoff's own total counts only the sleeps between them, and against a silent network
/// each try itself waits out its call bound.
pub async fn transient<T, F, Fut>(what: &str, budget: Budget, op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let tries = op
        .retry(budget.backoff())
        .sleep(tokio::time::sleep)
        .when(Error::is_transient)
        .notify(|e, wait| tracing::warn!(error = %e, "{what} failed; retrying in {wait:?}"));
    if budget.total == Duration::MAX {
        return tries.await;
    }
    tokio::time::timeout(budget.total, tries).await.map_err(|_| Error::Timeout(budget.total))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Transient errors are retried until success; a permanent one is returned at once.
    #[tokio::test(start_paused = true)]
    async fn retries_only_what_may_succeed() {
        let n = AtomicU32::new(0);
        let got = transient("t", Budget::WRITE, || async {
            if n.fetch_add(1, Ordering::SeqCst) < 3 {
                Err(Error::Timeout(Duration::from_secs(1)))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(got.ok(), Some(7));
        assert_eq!(n.load(Ordering::SeqCst), 4);
        let m = AtomicU32::new(0);
        let got: Result<()> = transient("t", Budget::WRITE, || async {
            m.fetch_add(1, Ordering::SeqCst);
            Err(Error::Auth { user: "u".into() })
        })
        .await;
        assert!(matches!(got, Err(Error::Auth { .. })));
        assert_eq!(m.load(Ordering::SeqCst), 1, "a wrong password is not retried");
    }

    /// A note lands within 4 s of the database's return, however long it was gone: the
    /// backoff does not grow past the point where a kill -9 in the wait would lose it.
    #[tokio::test(start_paused = true)]
    async fn a_note_lands_soon_after_an_outage_ends() {
        for outage_s in (5..=62).step_by(3) {
            let start = tokio::time::Instant::now();
            let back = start + Duration::from_secs(outage_s);
            let got = transient("t", Budget::NOTE, || async {
                if tokio::time::Instant::now() < back {
                    Err(Error::Timeout(Duration::from_millis(300)))
                } else {
                    Ok(tokio::time::Instant::now())
                }
            })
            .await;
            let late = got.expect("the note lands").duration_since(back);
            assert!(late <= Duration::from_secs(4), "after a {outage_s} s outage the note waited {late:?} more");
        }
    }
}
