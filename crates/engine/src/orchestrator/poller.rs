//! The poller: when to poll, and the claim itself. It claims into free slots, wakes on
//! NOTIFY hints or its timer, backs off while the queue is empty, and never has more than one
//! poll in flight.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::config::ClaimMode;
use super::stats::Stats;
use super::status::{Event, PresenceFields};
use devpilot_store::error::Result;
use devpilot_store::queue::{Claim, Fence, MachineStore, PollExtras, Polled, Presence, Route};

/// Effectively never: a command, a hint or a finished job wakes the poller first.
pub const FAR: Duration = Duration::from_secs(86_400);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollState {
    /// The next poll is due at this time.
    Waiting(Instant),
    /// A poll is in flight; its answer decides the next.
    InFlight,
}

#[derive(Debug)]
pub struct Poller {
    state: PollState,
    base: Duration,
    ceiling: Duration,
    backoff: Duration,
    /// Woken while a poll was in flight: the answer must not put the next poll off.
    rewake: bool,
    /// A due time learnt while a poll was in flight (a NOTIFY about a job the poll's snapshot
    /// may not see): the answer's wait is capped by it.
    due_by: Option<Instant>,
}

impl Poller {
    pub fn new(base: Duration, ceiling: Duration) -> Self {
        Self { state: PollState::Waiting(Instant::now()), base, ceiling, backoff: base, rewake: false, due_by: None }
    }

    /// When the next poll is due, or `None` while one is in flight.
    pub fn due(&self) -> Option<Instant> {
        match self.state {
            PollState::Waiting(t) => Some(t),
            PollState::InFlight => None,
        }
    }

    pub fn started(&mut self) {
        self.state = PollState::InFlight;
    }

    /// Poll as soon as possible (work was just enqueued, a slot freed, a setting changed).
    pub fn now(&mut self) {
        self.backoff = self.base;
        match self.state {
            PollState::Waiting(_) => self.state = PollState::Waiting(Instant::now()),
            PollState::InFlight => self.rewake = true,
        }
    }

    /// Nothing to claim for now (not accepting, or every slot busy): look again after `d`.
    pub fn rest(&mut self, d: Duration) {
        self.rewake = false;
        self.state = PollState::Waiting(Instant::now() + d);
    }

    /// A poll came back with `got` claims of `asked`; `busy` says every slot is now taken.
    /// An empty answer doubles the wait up to `ceiling` (`until_empty` caps it at 0.5 s).
    pub fn answered(&mut self, got: usize, asked: u32, busy: bool, until_empty: bool) {
        let next = if got > 0 {
            self.backoff = self.base;
            if got as u32 >= asked && busy {
                FAR // all slots busy; a finished job wakes us
            } else if got as u32 >= asked {
                Duration::ZERO // slots freed while this poll was in flight: fill them now
            } else {
                jitter(self.base)
            }
        } else {
            let ceiling = if until_empty { self.ceiling.min(Duration::from_millis(500)) } else { self.ceiling };
            let wait = jitter(self.backoff);
            self.backoff = (self.backoff * 2).min(ceiling).max(self.base.min(ceiling));
            wait
        };
        let next = if std::mem::take(&mut self.rewake) { Duration::ZERO } else { next };
        let at = Instant::now() + next;
        self.state = PollState::Waiting(self.due_by.take().map_or(at, |d| d.min(at)));
    }

    /// The poll failed (the database is unreachable, or slow): retry soon, backing off to 10 s.
    pub fn failed(&mut self) {
        self.rewake = false;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(10));
        self.state = PollState::Waiting(Instant::now() + jitter(self.backoff));
    }

    /// Poll no later than `within` from now (a job becomes due then). A little after, so the
    /// poll does not land a hair before the database's clock says it is due.
    pub fn cap(&mut self, within: Duration) {
        let at = Instant::now() + within + Duration::from_millis(5);
        match self.state {
            PollState::Waiting(t) if at < t => self.state = PollState::Waiting(at),
            PollState::Waiting(_) => {}
            PollState::InFlight => self.due_by = Some(self.due_by.map_or(at, |d| d.min(at))),
        }
    }

    pub fn retime(&mut self, base: Duration, ceiling: Duration) {
        self.base = base;
        self.ceiling = ceiling.max(base);
        self.now();
    }
}

/// One poll's statement(s), as the claim mode says.
pub struct ClaimRequest {
    pub store: MachineStore,
    pub mode: ClaimMode,
    pub free: u32,
    pub presence: Option<PresenceFields>,
    pub stale_after: Option<Duration>,
    pub route: Arc<Route>,
    /// What the governor lets this machine claim now, added to `route` at each poll.
    pub governed: Arc<super::governed::Governed>,
    pub stats: Arc<Stats>,
    pub events: broadcast::Sender<Event>,
    /// Completions riding this poll (claim mode `pick` only).
    pub done: Vec<Fence>,
}

impl ClaimRequest {
    pub async fn run(mut self) -> Result<Polled> {
        self.stats.claim_queries.fetch_add(1, Ordering::Relaxed);
        // The day's start moves at midnight, and the account is read once: each poll asks.
        let governor = self.governed.governor(&self.store).await?;
        Arc::make_mut(&mut self.route).governor = governor;
        if self.mode == ClaimMode::ById {
            let claims = claim_by_ids(&self).await?;
            return Ok(Polled { claims, stale: false, next_due: None, completed: vec![] });
        }
        let presence: Option<Presence<'_>> =
            self.presence.as_ref().map(|f| f.presence(self.store.orchestrator_id(), self.store.machine(), &self.route));
        let extras = PollExtras { presence, stale_after: self.stale_after, route: Some(&self.route), done: &self.done };
        self.store.poll(self.free, &extras).await
    }
}

/// The path "Claiming work exactly once, with one UPDATE" takes, for comparison: read candidates,
/// claim each by id, count lost races.
async fn claim_by_ids(r: &ClaimRequest) -> Result<Vec<Claim>> {
    let ids = r.store.candidates(r.free.saturating_mul(4).max(1), &r.route).await?;
    let mut claims = vec![];
    for id in ids {
        if claims.len() as u32 >= r.free {
            break;
        }
        match r.store.claim(id).await? {
            Some(c) => claims.push(c),
            None => {
                // Another machine won this one; not an error. Next candidate.
                r.stats.lost_races.fetch_add(1, Ordering::Relaxed);
                let _ = r.events.send(Event::LostRace { job_id: id });
            }
        }
    }
    Ok(claims)
}

/// ±20 %, so machines that started together do not poll in lockstep.
pub fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::rng().random_range(0.8..1.2);
    d.mul_f64(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A due time caps the wait, whether it arrives while the poller waits or while a poll is
    /// in flight; a later due time changes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_due_time_caps_the_next_poll() {
        let five_min = Duration::from_secs(300);
        let mut p = Poller::new(five_min, five_min);
        p.started();
        p.answered(0, 1, false, false);
        assert!(p.due().unwrap() >= Instant::now() + Duration::from_secs(200), "idle: minutes away");
        p.cap(Duration::from_secs(40));
        let capped = p.due().unwrap();
        assert!(
            capped >= Instant::now() + Duration::from_secs(40) && capped <= Instant::now() + Duration::from_secs(41)
        );
        p.cap(Duration::from_secs(100));
        assert_eq!(p.due(), Some(capped));
        p.started();
        p.cap(Duration::from_secs(10));
        p.answered(0, 1, false, false);
        assert!(p.due().unwrap() <= Instant::now() + Duration::from_secs(11), "learnt in flight, kept for the answer");
        p.started();
        p.answered(0, 1, false, false);
        assert!(p.due().unwrap() >= Instant::now() + Duration::from_secs(200), "and used once");
    }
}
