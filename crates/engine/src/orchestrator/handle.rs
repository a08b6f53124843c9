//! The way in: a [`Handle`] sends the user's wishes to the machine as [`Command`]s and reads
//! its status, events and counters.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::config::RunConfig;
use super::stats::Stats;
use super::status::{Event, Status};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// Stop the agents and release their claims now.
    HandOff,
    /// Claim nothing more, let running jobs finish for up to `grace`, then hand off the rest.
    Drain { grace: Duration },
}

/// What the machine is asked to do.
pub(super) enum Command {
    SetEnabled(bool),
    Pause(Option<Duration>),
    Resume,
    HandOff { pause: bool, done: oneshot::Sender<Vec<i64>> },
    Recheck(oneshot::Sender<Vec<i64>>),
    Wake,
    NextPoll(oneshot::Sender<Option<Duration>>),
    Reconfigure(Box<RunConfig>),
    Stop { mode: StopMode, done: oneshot::Sender<()> },
}

/// The way in: clone it freely.
#[derive(Clone)]
pub struct Handle {
    pub(super) cmd: mpsc::UnboundedSender<Command>,
    pub(super) events: broadcast::Sender<Event>,
    pub(super) status: watch::Receiver<Status>,
    pub(super) stats: Arc<Stats>,
}

impl Handle {
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    pub fn watch_status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Switches dispatch on or off. Off claims nothing; running jobs finish.
    pub fn set_enabled(&self, on: bool) {
        let _ = self.cmd.send(Command::SetEnabled(on));
    }

    /// Pauses claiming for `for_` (or until resumed). Running jobs finish.
    pub fn pause(&self, for_: Option<Duration>) {
        let _ = self.cmd.send(Command::Pause(for_));
    }

    pub fn resume(&self) {
        let _ = self.cmd.send(Command::Resume);
    }

    /// Polls now (a hint: work was just enqueued).
    pub fn wake(&self) {
        let _ = self.cmd.send(Command::Wake);
    }

    /// How long until the next poll, as the loop sees it when it reads this: `None` while one
    /// is in flight. (Tests wait on it to know that only the timer or a hint can poll next.)
    pub async fn next_poll(&self) -> Option<Duration> {
        let (tx, rx) = oneshot::channel();
        let _ = self.cmd.send(Command::NextPoll(tx));
        rx.await.ok().flatten()
    }

    /// Applies new settings while jobs run: concurrency, timeouts, polling, the agent for
    /// jobs claimed from now on. The orchestrator and machine names are not changed.
    pub fn reconfigure(&self, cfg: RunConfig) {
        let _ = self.cmd.send(Command::Reconfigure(Box::new(cfg)));
    }

    /// Stops every running agent and releases its claim at once; with `pause`, claims nothing
    /// new afterwards. Returns the ids handed off, once they are.
    pub async fn hand_off(&self, pause: bool) -> Vec<i64> {
        let (tx, rx) = oneshot::channel();
        let _ = self.cmd.send(Command::HandOff { pause, done: tx });
        rx.await.unwrap_or_default()
    }

    /// Checks every local deadline, then renews every lease now (after a wake from sleep).
    /// Returns the ids that were lost or had expired.
    pub async fn recheck_leases(&self) -> Vec<i64> {
        let (tx, rx) = oneshot::channel();
        let _ = self.cmd.send(Command::Recheck(tx));
        rx.await.unwrap_or_default()
    }

    /// Stops the loop; returns once every task it started has ended.
    pub async fn stop(&self, mode: StopMode) {
        let (tx, rx) = oneshot::channel();
        if self.cmd.send(Command::Stop { mode, done: tx }).is_ok() {
            let _ = rx.await;
        }
    }
}
