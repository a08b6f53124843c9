//! Every hand-off and its verdict ([`crate::verdict`]): the one thing a user needs before
//! closing the lid.
//!
//! Every hand-off (the window's, the tray's, the sleep hook's) goes through
//! [`Engine::hand_off`], which publishes its verdict: the tray shows it as a line and as a
//! notification, the window as a notice.

use std::collections::BTreeMap;

use tokio::sync::broadcast::error::TryRecvError;

use devpilot_engine::orchestrator::{Carried, Event};
use devpilot_store::error::Result;

use crate::engine::Engine;
use crate::verdict::{HandOffVerdict, HandedOff};

impl Engine {
    /// Releases every claim of this machine now; with `pause`, claims nothing new after.
    /// The verdict is returned and published ([`Engine::watch_hand_off`]).
    pub async fn hand_off(&self, pause: bool) -> Result<HandOffVerdict> {
        self.hand_off_as(pause, false).await
    }

    /// [`Engine::hand_off`], saying whether the sleep hook asked.
    pub(crate) async fn hand_off_as(&self, pause: bool, before_sleep: bool) -> Result<HandOffVerdict> {
        let handle = self.running_orchestrator()?;
        // Subscribed before the hand-off: each released job's event is in the buffer when
        // the hand-off returns (its task sends it before it ends).
        let mut events = self.subscribe();
        let ids = handle.hand_off(pause).await;
        let mut released: BTreeMap<i64, (Option<String>, Carried)> = BTreeMap::new();
        // An agent that exited as the hand-off began ends its attempt as usual: said as such.
        let mut ended: BTreeMap<i64, (Option<String>, &str)> = BTreeMap::new();
        loop {
            match events.try_recv() {
                Ok(Event::Released { job, carried }) => {
                    released.insert(job.id, (job.title, carried));
                }
                Ok(Event::Completed { job, .. }) => drop(ended.insert(job.id, (job.title, "completed"))),
                Ok(Event::Failed { job, .. }) => drop(ended.insert(job.id, (job.title, "failed"))),
                Ok(Event::Parked { job, .. }) => drop(ended.insert(job.id, (job.title, "parked"))),
                Ok(Event::Cancelled { job }) => drop(ended.insert(job.id, (job.title, "cancelled"))),
                Ok(_) | Err(TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        let jobs = ids
            .into_iter()
            .map(|id| match (released.remove(&id), ended.remove(&id)) {
                (Some((title, carried)), _) => HandedOff { id, title, carried: Some(carried), ended: None },
                (None, Some((title, how))) => HandedOff { id, title, carried: None, ended: Some(how.into()) },
                (None, None) => HandedOff { id, title: None, carried: None, ended: None },
            })
            .collect();
        let verdict = HandOffVerdict::of(jobs, pause, before_sleep);
        tracing::info!(safe = verdict.safe, "{}", verdict.text);
        self.hand_off_tx.send_replace(Some(verdict.clone()));
        Ok(verdict)
    }

    /// The last hand-off's verdict, as it changes (the tray's line and notification, the
    /// window's notice). Cleared when claiming resumes.
    pub fn watch_hand_off(&self) -> tokio::sync::watch::Receiver<Option<HandOffVerdict>> {
        self.hand_off_tx.subscribe()
    }

    /// The last hand-off's verdict, until claiming resumes.
    pub fn last_hand_off(&self) -> Option<HandOffVerdict> {
        self.hand_off_tx.borrow().clone()
    }
}
