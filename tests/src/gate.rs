//! A gate a stand-in holds one request at, so a test can change the service's data between
//! two of a client's calls, at the exact point it wants: the request arrives, the test sees
//! it ([`Gate::arrived`]), changes what it likes, and [`Gate::open`]s; the request is then
//! answered from the changed data. A gate nobody opens lets the request through after
//! [`MAX_HOLD`], so a failing test never hangs its stand-in. A gate [`Gate::drop_request`]
//! opens lets nothing through: the request is answered `502` and never applied, as one
//! whose sender died before it reached the service (the benchmark kills its machine there).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The longest a gate holds a request.
pub const MAX_HOLD: Duration = Duration::from_secs(30);

/// One request's gate (see the module).
#[derive(Default)]
pub struct Gate {
    arrived: AtomicBool,
    dropped: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    /// Whether the request has come and is held.
    pub fn arrived(&self) -> bool {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Lets the held request (or the one still to come) through.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.opened.notify_all();
    }

    /// Opens the gate on a request that is then never applied (see the module).
    pub fn drop_request(&self) {
        self.dropped.store(true, Ordering::SeqCst);
        self.open();
    }

    /// Called by the stand-in's connection thread: says the request arrived and waits until
    /// the gate opens (at most [`MAX_HOLD`]). False: the request is dropped, not applied.
    pub(crate) fn pass(&self) -> bool {
        self.arrived.store(true, Ordering::SeqCst);
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let waited = self.opened.wait_timeout_while(open, MAX_HOLD, |open| !*open);
        drop(waited.unwrap_or_else(PoisonError::into_inner));
        !self.dropped.load(Ordering::SeqCst)
    }
}
