//! The clock the local lease deadlines run on. It must keep counting while the machine is
//! suspended: a laptop that slept through its lease has to see, the moment it wakes, that the
//! deadline has passed. Tokio's `Instant` (CLOCK_MONOTONIC on Linux) stops during suspend, so
//! the deadlines use CLOCK_BOOTTIME on Linux and the continuous clock on macOS (there,
//! CLOCK_MONOTONIC counts sleep too).

use std::sync::Arc;
use std::time::Duration;

/// Time since an arbitrary origin, counting suspended time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Duration;
}

/// The system's suspend-aware clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> Duration {
        #[cfg(target_os = "linux")]
        const ID: libc::clockid_t = libc::CLOCK_BOOTTIME;
        #[cfg(not(target_os = "linux"))]
        const ID: libc::clockid_t = libc::CLOCK_MONOTONIC;
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec we own; both clock ids exist on their targets.
        unsafe { libc::clock_gettime(ID, &mut ts) };
        Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
    }
}

pub type SharedClock = Arc<dyn Clock>;

/// A clock for tests: tokio's (pausable) time plus whatever suspended time the test adds.
#[cfg(test)]
#[derive(Clone)]
pub struct TestClock {
    origin: tokio::time::Instant,
    slept: Arc<std::sync::Mutex<Duration>>,
}

#[cfg(test)]
impl TestClock {
    pub fn new() -> Self {
        Self { origin: tokio::time::Instant::now(), slept: Arc::default() }
    }

    /// The machine was suspended for `d`: boot time moved on, tokio's monotonic time did not.
    pub fn suspend(&self, d: Duration) {
        if let Ok(mut s) = self.slept.lock() {
            *s += d;
        }
    }
}

#[cfg(test)]
impl Clock for TestClock {
    fn now(&self) -> Duration {
        let slept = self.slept.lock().map(|s| *s).unwrap_or_default();
        self.origin.elapsed() + slept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boot clock moves forward with real time.
    #[test]
    fn boot_clock_moves_forward() {
        let a = BootClock.now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(BootClock.now() >= a + Duration::from_millis(5));
    }
}
