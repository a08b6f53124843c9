//! What the server threads and the handles share: the data, the controls (the key, armed
//! faults, rate limits, the request log) and the operations the Rust API and the admin
//! endpoints both offer. The key is kept only to compare against; nothing here prints it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::clock::Clock;
use super::graphql::operation_name;
use super::limits::Limits;
use super::model::{Comment, Fault, Issue, IssueSeed, Recorded};
use super::state::State;
use crate::gate::Gate;

/// A fault armed for the next `left` requests (of one operation, or of any).
pub(crate) struct Armed {
    pub fault: Fault,
    pub left: usize,
    pub only_op: Option<String>,
}

/// The knobs and the log.
pub(crate) struct Control {
    pub key: String,
    pub faults: Vec<Armed>,
    /// Armed gates: the next request of each operation waits at its gate.
    pub gates: Vec<(String, Arc<Gate>)>,
    pub limits: Limits,
    pub log: Vec<Recorded>,
}

/// Everything one stand-in holds.
pub(crate) struct Shared {
    pub clock: Arc<Clock>,
    pub state: Mutex<State>,
    pub control: Mutex<Control>,
    /// Whether the `/_admin/` endpoints are served (the binary's, for the Python e2e).
    pub admin: bool,
}

/// A lock that survives a panicking holder (a test's failed assertion elsewhere must not turn
/// every later request into a second panic).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// A fresh stand-in accepting `key`.
    pub(crate) fn new(key: &str, admin: bool) -> Self {
        let clock = Arc::new(Clock::default());
        let limits = Limits::new(clock.now_ms());
        Self {
            state: Mutex::new(State::new(clock.clone())),
            control: Mutex::new(Control {
                key: key.into(),
                faults: Vec::new(),
                gates: Vec::new(),
                limits,
                log: Vec::new(),
            }),
            clock,
            admin,
        }
    }

    /// The state, locked.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The controls, locked.
    pub(crate) fn control(&self) -> MutexGuard<'_, Control> {
        lock(&self.control)
    }

    /// Takes one use of the first armed fault that applies to `operation`.
    pub(crate) fn take_fault(&self, operation: Option<&str>) -> Option<Fault> {
        let mut control = self.control();
        let found = control.faults.iter().position(|a| a.only_op.as_deref().is_none_or(|op| Some(op) == operation))?;
        let armed = &mut control.faults[found];
        armed.left -= 1;
        let fault = armed.fault.clone();
        if armed.left == 0 {
            control.faults.remove(found);
        }
        Some(fault)
    }

    /// Arms a gate for the next request of operation `op` (see [`crate::gate`]); an operation
    /// no document of DevPilot's is named is refused, as for a fault.
    pub(crate) fn gate(&self, op: &str) -> Result<Arc<Gate>, String> {
        let known = known_operations();
        if !known.iter().any(|k| k == op) {
            return Err(format!("no document of DevPilot's is named {op:?} (they are {})", known.join(", ")));
        }
        let gate = Arc::new(Gate::default());
        self.control().gates.push((op.to_string(), gate.clone()));
        Ok(gate)
    }

    /// Takes the gate armed for `operation`, if any (each holds one request).
    pub(crate) fn take_gate(&self, operation: Option<&str>) -> Option<Arc<Gate>> {
        let mut control = self.control();
        let found = control.gates.iter().position(|(op, _)| Some(op.as_str()) == operation)?;
        Some(control.gates.remove(found).1)
    }

    /// Arms `fault` for the next `times` requests (of `only_op`, if given). An operation no
    /// document of DevPilot's is named is refused: a fault armed for it would never fire, and
    /// the test that armed it would pass without its fault.
    pub(crate) fn inject(&self, fault: Fault, times: usize, only_op: Option<&str>) -> Result<(), String> {
        if let Some(op) = only_op {
            let known = known_operations();
            if !known.iter().any(|k| k == op) {
                return Err(format!("no document of DevPilot's is named {op:?} (they are {})", known.join(", ")));
            }
        }
        if times > 0 {
            self.control().faults.push(Armed { fault, left: times, only_op: only_op.map(str::to_string) });
        }
        Ok(())
    }

    /// Files an issue.
    pub(crate) fn add_issue(&self, seed: &IssueSeed) -> Result<Issue, String> {
        self.state().add_issue(seed)
    }

    /// Changes an issue (by identifier or UUID) and returns it as it is now.
    pub(crate) fn edit(
        &self,
        issue: &str,
        change: impl FnOnce(&mut State, usize) -> Result<(), String>,
    ) -> Result<Issue, String> {
        let mut state = self.state();
        let index = state.issue_ref(issue)?;
        change(&mut state, index)?;
        Ok(state.snapshot(index))
    }

    /// Moves an issue to the state with this name in its team.
    pub(crate) fn set_state(&self, issue: &str, state_name: &str) -> Result<Issue, String> {
        self.edit(issue, |s, i| {
            let state = s.state_named(s.issues[i].team, state_name)?;
            s.set_state(i, state);
            Ok(())
        })
    }

    /// An issue as it is now.
    pub(crate) fn issue(&self, issue: &str) -> Result<Issue, String> {
        self.edit(issue, |_, _| Ok(()))
    }

    /// Comments on an issue as the user named `user`; the comment's id.
    pub(crate) fn comment_as(&self, issue: &str, user: &str, body: &str) -> Result<String, String> {
        let mut state = self.state();
        let (issue, user) = (state.issue_ref(issue)?, state.user_named(user)?);
        let comment = state.comment_by(issue, user, body);
        Ok(state.comments[comment].id.clone())
    }

    /// An issue's comments.
    pub(crate) fn comments(&self, issue: &str) -> Result<Vec<Comment>, String> {
        let state = self.state();
        Ok(state.comments_of(state.issue_ref(issue)?))
    }

    /// An issue's linked URLs and titles.
    pub(crate) fn attachments(&self, issue: &str) -> Result<Vec<(String, String)>, String> {
        let state = self.state();
        Ok(state.attachments_of(state.issue_ref(issue)?))
    }

    /// Requests per operation name (`<anonymous>` for an unnamed one).
    pub(crate) fn call_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for recorded in &self.control().log {
            *counts.entry(recorded.operation.clone().unwrap_or_else(|| "<anonymous>".into())).or_insert(0) += 1;
        }
        counts
    }

    /// Every request so far, oldest first.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.control().log.clone()
    }

    /// Sets the request budget's remaining count and when it refills.
    pub(crate) fn set_rate_limit(&self, remaining: u64, reset_in: Duration) {
        let reset = self.reset_at(reset_in);
        self.control().limits.requests.set(remaining, reset);
    }

    /// Sets the complexity budget's remaining points and when it refills.
    pub(crate) fn set_complexity_limit(&self, remaining: u64, reset_in: Duration) {
        let reset = self.reset_at(reset_in);
        self.control().limits.complexity.set(remaining, reset);
    }

    /// The stand-in time `reset_in` from now.
    fn reset_at(&self, reset_in: Duration) -> i64 {
        self.clock.now_ms() + i64::try_from(reset_in.as_millis()).unwrap_or(i64::MAX / 4)
    }
}

/// The operations DevPilot sends: the names of its documents.
fn known_operations() -> Vec<String> {
    devpilot_engine::sources::linear::documents::ALL.iter().filter_map(|(_, doc)| operation_name(doc, None)).collect()
}
