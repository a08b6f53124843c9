//! The machine's sleep and wake: hand off or pause before, re-check leases and resume after.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use devpilot_engine::orchestrator::Carried;
use devpilot_engine::settings::SleepAction;

use crate::engine::Engine;
use crate::verdict::{HandOffVerdict, HandedOff};

impl Engine {
    /// Before the machine sleeps: hand off (default) or pause, as the user chose.
    /// Returns the ids handed off.
    pub async fn prepare_for_sleep(&self) -> Vec<i64> {
        let Some(h) = self.orchestrator() else { return vec![] };
        let st = h.status();
        if st.paused || !st.dispatch_enabled {
            // Already not claiming: only release what runs, if the user wants hand-off.
            if self.settings().sleep_action == SleepAction::HandOff && !st.running.is_empty() {
                return self.sleep_hand_off(false).await;
            }
            return vec![];
        }
        self.paused_for_sleep.store(true, Ordering::SeqCst);
        match self.settings().sleep_action {
            SleepAction::HandOff => self.sleep_hand_off(true).await,
            SleepAction::Pause => {
                h.pause(None);
                vec![]
            }
        }
    }

    /// [`Engine::prepare_for_sleep`] within `limit` (logind's sleep delay). Past it, the
    /// machine is let sleep: a red verdict names each job still running here as not handed
    /// off (shown at wake if the notification goes unseen), and the hand-off carries on in
    /// the background, its own verdict replacing that one when it ends. `None`: it did not
    /// finish in time.
    pub async fn prepare_for_sleep_within(self: &Arc<Self>, limit: Duration) -> Option<Vec<i64>> {
        let running: Vec<HandedOff> = self
            .status()
            .running
            .iter()
            .map(|r| HandedOff {
                id: r.job.id,
                title: r.job.title.clone(),
                carried: Some(Carried::Stayed {
                    why: format!("the hand-off took longer than {}s before sleep", limit.as_secs()),
                }),
                ended: None,
            })
            .collect();
        let me = self.clone();
        let mut task = tokio::spawn(async move { me.prepare_for_sleep().await });
        match tokio::time::timeout(limit, &mut task).await {
            Ok(done) => Some(done.unwrap_or_default()),
            Err(_) => {
                let v = HandOffVerdict::of(running, true, true);
                tracing::warn!("{}", v.text);
                self.hand_off_tx.send_replace(Some(v));
                None
            }
        }
    }

    /// The sleep hook's hand-off, its verdict published like any other; the ids handed off.
    async fn sleep_hand_off(&self, pause: bool) -> Vec<i64> {
        match self.hand_off_as(pause, true).await {
            Ok(v) => v.jobs.iter().map(|j| j.id).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "could not hand off before sleep");
                vec![]
            }
        }
    }

    /// After a wake: re-check every lease first, then resume what sleep paused.
    /// Returns the ids whose lease was lost while asleep. A red verdict of the hand-off before
    /// sleep is published again: its notification may have gone unseen as the lid closed.
    pub async fn woke(&self) -> Vec<i64> {
        if let Ok(mut w) = self.woke_at.lock() {
            *w = Some(Instant::now());
        }
        self.hand_off_tx.send_if_modified(|v| v.as_ref().is_some_and(|v| v.before_sleep && !v.safe));
        let Some(h) = self.orchestrator() else { return vec![] };
        let lost = h.recheck_leases().await;
        if self.paused_for_sleep.swap(false, Ordering::SeqCst) {
            h.resume();
        }
        lost
    }

    /// Time since the last wake from sleep, if there was one.
    pub fn since_wake(&self) -> Option<Duration> {
        self.woke_at.lock().ok().and_then(|w| w.map(|t| t.elapsed()))
    }
}
