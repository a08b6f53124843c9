//! The machine's sleep and wake: hand off or pause before, re-check leases and resume after.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
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
        // What was said before this hand-off: the red verdict goes only over that.
        let seen = self.hand_off_tx.subscribe();
        let me = self.clone();
        let mut task = tokio::spawn(async move { me.prepare_for_sleep().await });
        match tokio::time::timeout(limit, &mut task).await {
            Ok(done) => Some(done.unwrap_or_default()),
            Err(_) => {
                let v = HandOffVerdict::of(running, true, true);
                if say_late(&self.hand_off_tx, &seen, v.clone()) {
                    tracing::warn!("{}", v.text);
                }
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

/// Says the red verdict of a hand-off that outlasted the sleep delay, unless that hand-off
/// has said its own since `seen` was taken: it can end in the instant the delay runs out,
/// and a red verdict over its own would stand for good ("not handed off" about work that
/// was). The look and the write are one step under the value's lock, so no verdict lands
/// between them. True: said.
fn say_late(
    tx: &watch::Sender<Option<HandOffVerdict>>,
    seen: &watch::Receiver<Option<HandOffVerdict>>,
    red: HandOffVerdict,
) -> bool {
    tx.send_if_modified(|now| {
        let own_said = seen.has_changed().unwrap_or(false) && now.as_ref().is_some_and(|v| v.before_sleep);
        if !own_said {
            *now = Some(red);
        }
        !own_said
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stayed(id: i64) -> HandOffVerdict {
        let why = "the hand-off took longer than 5s before sleep".to_string();
        let job = HandedOff { id, title: None, carried: Some(Carried::Stayed { why }), ended: None };
        HandOffVerdict::of(vec![job], true, true)
    }

    /// A hand-off that ends as the sleep delay runs out keeps its own verdict: the late red
    /// one is said only over what was there before. (It used to replace the hand-off's safe
    /// verdict, which was never said again: the app tests' slow hand-off saw it on a loaded
    /// CI run.) Over older news, or another machine's ask, the red verdict is said.
    #[test]
    fn a_late_red_verdict_never_hides_the_hand_offs_own() {
        let (tx, _) = watch::channel(None);
        let seen = tx.subscribe();
        let own = HandOffVerdict::of(vec![], true, true);
        assert!(own.safe);
        tx.send_replace(Some(own.clone()));
        assert!(!say_late(&tx, &seen, stayed(7)), "the hand-off had said its own");
        assert_eq!(*tx.borrow(), Some(own));
        let seen = tx.subscribe();
        assert!(say_late(&tx, &seen, stayed(7)), "nothing new since: said");
        assert_eq!(*tx.borrow(), Some(stayed(7)));
        let seen = tx.subscribe();
        tx.send_replace(Some(HandOffVerdict::of(vec![], false, false)));
        assert!(say_late(&tx, &seen, stayed(8)), "another machine's ask is no answer to this hand-off");
    }
}
