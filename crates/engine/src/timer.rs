//! A long wait that wakes its thread once, at its deadline.
//!
//! tokio's timer wheel keeps a deadline seconds away in a coarse slot (4 s wide for a wait
//! between 4 s and 4 min) and wakes at the start of that slot only to move the deadline into
//! a finer one: a 30 s wait wakes the runtime three or four times. An strace of the idle tray
//! showed one deadline cost `epoll_wait` timeouts of 27026, 1186, 45 and 7 ms in a row. An idle
//! machine's waits are that long: the poll's rest, a source's next turn, the tray host's
//! look. So on Linux a wait of a second to an hour is a `timerfd` that
//! the runtime's reactor watches: one wake-up, at the deadline, on the same monotonic clock
//! as tokio's (neither counts a suspend). Elsewhere, or if the timerfd cannot be made (out
//! of descriptors), it is tokio's timer, and the second is only logged.
//!
//! The engine's own tests run on tokio's clock (some pause it), so there this is tokio's
//! timer too; the timerfd has a test of its own.

use std::time::Duration;

use tokio::time::Instant;

/// The waits that are timerfds: from a second to an hour. Any wait past the wheel's finest
/// level (64 ms) wakes more than once, but a timerfd costs six system calls (made, armed,
/// watched, read, unwatched, closed), and a loop makes its wait again at every turn: a busy
/// machine waits short, and a machine with every slot busy waits "a day" (`FAR`, a wait
/// that never ends as such) while its loop turns at each message. Between the two is an
/// idle machine's wait, where those calls are nothing beside a wake-up.
#[cfg(all(target_os = "linux", not(test)))]
const IDLE: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);

/// Waits until `deadline`, as [`tokio::time::sleep_until`] does, waking once.
///
/// Not on a paused clock: the engine's own tests get tokio's timer, but a test elsewhere that
/// pauses tokio's clock would wait on the real one here.
pub async fn sleep_until(deadline: Instant) {
    #[cfg(all(target_os = "linux", not(test)))]
    {
        let left = deadline.saturating_duration_since(Instant::now());
        if IDLE.contains(&left) {
            match fd::sleep(left).await {
                Ok(()) => return,
                Err(e) => tracing::debug!(error = %e, "no timerfd for a long wait; tokio's timer instead"),
            }
        }
    }
    tokio::time::sleep_until(deadline).await
}

/// Waits `d` from now (the call, not the first poll), as [`tokio::time::sleep`] does, waking
/// once.
pub fn sleep(d: Duration) -> impl std::future::Future<Output = ()> {
    let now = Instant::now();
    // A wait too long for the clock ends in thirty years, as tokio's does.
    let deadline = now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30));
    sleep_until(deadline)
}

#[cfg(target_os = "linux")]
mod fd {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;

    /// Waits `d` on a timerfd of its own, closed when the wait ends or is dropped.
    pub(super) async fn sleep(d: Duration) -> io::Result<()> {
        let fd = armed(d)?;
        // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and the same
        // for as long as it is registered.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        loop {
            let mut ready = fd.readable().await?;
            let mut expirations = [0u8; 8];
            let read = ready.try_io(|fd| {
                // SAFETY: reads at most 8 bytes into a buffer of 8 we own, from a descriptor
                // the AsyncFd keeps open.
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), expirations.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(done) => return done,
                // Woken with nothing to read (it cleared the readiness): wait again.
                Err(_would_block) => continue,
            }
        }
    }

    /// A non-blocking CLOCK_MONOTONIC timerfd that expires once, `d` from now.
    fn armed(d: Duration) -> io::Result<OwnedFd> {
        // SAFETY: timerfd_create takes no pointers; a descriptor it returns is ours to own.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A zero value would disarm it: at least a nanosecond.
        let d = d.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: d.subsec_nanos() as _,
            },
        };
        // SAFETY: the spec is a valid itimerspec we own; no old value is asked for.
        if unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    #[cfg(test)]
    mod tests {
        use std::time::{Duration, Instant};

        /// The timerfds this process has open.
        fn timerfds() -> usize {
            let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return 0 };
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains("timerfd"))
                .count()
        }

        /// A timerfd wait ends at its deadline, not before, and a dropped one leaves no
        /// descriptor behind (counted over a hundred, as other tests make timerfds too).
        #[tokio::test]
        async fn a_timerfd_wait_ends_at_its_deadline() {
            let t = Instant::now();
            super::sleep(Duration::from_millis(150)).await.expect("a timerfd");
            let took = t.elapsed();
            assert!(took >= Duration::from_millis(150), "woke early: {took:?}");
            assert!(took < Duration::from_secs(5), "{took:?}");
            let before = timerfds();
            for _ in 0..100 {
                let dropped =
                    tokio::time::timeout(Duration::from_millis(1), super::sleep(Duration::from_secs(60))).await;
                assert!(dropped.is_err(), "a minute's wait did not end in a millisecond");
            }
            assert!(
                timerfds() < before + 10,
                "the dropped waits closed their timerfds: {} then {}",
                before,
                timerfds()
            );
        }

        /// The times a runtime's only thread blocked while it waited `d` with `wait`, on a
        /// runtime of its own with nothing else to do.
        fn blocks_while(
            d: Duration,
            wait: fn(Duration) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
        ) -> u64 {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
                let voluntary = || {
                    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
                    let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap_or_default();
                    line.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).expect("the thread's switches")
                };
                rt.block_on(async {
                    tokio::task::yield_now().await;
                    let before = voluntary();
                    wait(d).await;
                    voluntary() - before
                })
            })
            .join()
            .expect("the waiting thread")
        }

        /// Why this module exists: a five-second wait on tokio's timer wakes its thread at the
        /// coarse slot, then the finer ones, before the deadline; on a timerfd it wakes once.
        #[test]
        fn a_long_wait_wakes_its_thread_once() {
            let d = Duration::from_secs(5);
            let on_tokio = std::thread::spawn(move || blocks_while(d, |d| Box::pin(tokio::time::sleep(d))));
            let on_fd = blocks_while(d, |d| Box::pin(async move { super::sleep(d).await.expect("a timerfd") }));
            let on_tokio = on_tokio.join().expect("tokio's wait");
            assert!(on_fd <= 2, "the timerfd wait blocked {on_fd} times");
            assert!(on_fd < on_tokio, "the timerfd wait blocked {on_fd} times, tokio's {on_tokio}");
        }
    }
}
