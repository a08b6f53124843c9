//! Every hand-off and its verdict ([`crate::verdict`]): the one thing a user needs before
//! closing the lid.
//!
//! Every hand-off (the window's, the tray's, the sleep hook's) goes through
//! [`Engine::hand_off`], which publishes its verdict: the tray shows it as a line and as a
//! notification, the window as a notice.

use std::collections::BTreeMap;

use std::sync::atomic::Ordering;

use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use devpilot_engine::orchestrator::{Carried, Event};
use devpilot_store::error::Result;

use crate::engine::Engine;

/// How long this app's own releases are told apart from asked ones.
const OWN_RELEASE_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);
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
        let before: Vec<(i64, Option<String>)> =
            self.status().running.iter().map(|r| (r.job.id, r.job.title.clone())).collect();
        // Subscribed before the hand-off: each released job's event is in the buffer when
        // the hand-off returns (its task sends it before it ends).
        let mut events = self.subscribe();
        self.handing_off.store(true, Ordering::SeqCst);
        let ids = unanswered_too(handle.hand_off(pause).await, &before);
        // Marked as this hand-off's before the flag drops, so a late look at their events by
        // `watch_requested_releases` still knows them.
        if let Ok(mut own) = self.own_releases.lock() {
            let now = std::time::Instant::now();
            own.retain(|_, at| now.duration_since(*at) < OWN_RELEASE_MEMORY);
            own.extend(ids.iter().map(|id| (*id, now)));
        }
        self.handing_off.store(false, Ordering::SeqCst);
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
                (None, None) => {
                    let title = before.iter().find(|(b, _)| *b == id).and_then(|(_, t)| t.clone());
                    HandedOff { id, title, carried: None, ended: None }
                }
            })
            .collect();
        let verdict = HandOffVerdict::of(jobs, pause, before_sleep);
        tracing::info!(safe = verdict.safe, "{}", verdict.text);
        self.hand_off_tx.send_replace(Some(verdict.clone()));
        Ok(verdict)
    }

    /// Tells a hand-off that another machine asked for (`devpilot release`, the window's "Ask
    /// to hand off") as this machine's own are told: each burst of releases made while no
    /// hand-off of this app runs becomes a verdict. Runs until the engine's events end.
    pub async fn watch_requested_releases(self: std::sync::Arc<Self>) {
        let mut events = self.subscribe();
        loop {
            let first = match events.recv().await {
                Ok(Event::Released { job, carried }) if !self.own_release(job.id) => (job, carried),
                Ok(_) | Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            };
            // The rest of the burst: the holder releases every asked job at one renewal.
            let mut jobs = vec![first];
            let until = tokio::time::Instant::now() + std::time::Duration::from_millis(500);
            while let Ok(Ok(ev)) = tokio::time::timeout_at(until, events.recv()).await {
                match ev {
                    Event::Released { job, carried } if !self.own_release(job.id) => jobs.push((job, carried)),
                    _ => {}
                }
            }
            let jobs = jobs
                .into_iter()
                .map(|(job, carried)| HandedOff { id: job.id, title: job.title, carried: Some(carried), ended: None })
                .collect();
            let mut v = HandOffVerdict::of(jobs, self.status().paused, false);
            v.text = format!("Asked by another machine: {}", v.text);
            tracing::info!(safe = v.safe, "{}", v.text);
            self.hand_off_tx.send_replace(Some(v));
        }
    }

    /// Whether a release of job `id` is this app's own hand-off's (under way, or just made).
    fn own_release(&self, id: i64) -> bool {
        let recent =
            self.own_releases.lock().map(|own| own.get(&id).is_some_and(|at| at.elapsed() < OWN_RELEASE_MEMORY));
        self.handing_off.load(Ordering::SeqCst) || recent.unwrap_or(false)
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

/// The jobs a hand-off answered for, and each job that was running here before it but that it
/// did not answer for (its machine stopped under it): such a job is not "nothing was running",
/// and the verdict says its claim was gone.
fn unanswered_too(mut ids: Vec<i64>, before: &[(i64, Option<String>)]) -> Vec<i64> {
    for (id, _) in before {
        if !ids.contains(id) {
            ids.push(*id);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-off that answered for nothing while a job ran here does not read "safe".
    #[test]
    fn a_job_the_hand_off_did_not_answer_for_is_not_safe() {
        let before = [(12, Some("Fix login".to_string()))];
        let ids = unanswered_too(vec![], &before);
        assert_eq!(ids, [12]);
        let v = HandOffVerdict::of(
            vec![HandedOff { id: 12, title: Some("Fix login".into()), carried: None, ended: None }],
            true,
            false,
        );
        assert!(!v.safe && v.text.contains("#12 Fix login: its claim was gone before the hand-off"), "{v:?}");
        assert_eq!(unanswered_too(vec![12, 13], &before), [12, 13], "answered: unchanged");
    }

    /// A hand-off another machine asks for is told on the holder as its own are, and a hand-off
    /// of this app is not told twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hand_off_asked_by_another_machine_gets_its_verdict() {
        use devpilot_engine::settings::Settings;
        use devpilot_engine::span::Span;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let p = devpilot_engine::config::Paths {
            config_dir: dir.path().join("c"),
            data_dir: dir.path().join("d"),
            log_dir: dir.path().join("l"),
        };
        let s = Settings {
            orchestrator_id: "asked".into(),
            machine: Some("laptop".into()),
            poll_interval: Span::parse("200ms").unwrap(),
            heartbeat: Span::parse("300ms").unwrap(),
            ..Settings::default()
        };
        p.save(&s).unwrap();
        let e = Engine::with_demo_duration(
            p,
            "devpilot-test",
            crate::overrides::Overrides::default(),
            Duration::from_secs(60),
        );
        e.start().await;
        tokio::spawn(e.clone().watch_requested_releases());
        let mut st = e.watch_status();
        let ok = |f: fn(&devpilot_engine::orchestrator::Status) -> bool| {
            let mut st = st.clone();
            async move { tokio::time::timeout(Duration::from_secs(20), st.wait_for(f)).await.is_ok() }
        };
        assert!(ok(|s| s.db_online && s.state == devpilot_engine::orchestrator::MachineState::Idle).await);
        let id = e.enqueue_demo().await.unwrap();
        assert!(ok(|s| !s.running.is_empty()).await, "the demo job runs here");
        let mut verdicts = e.watch_hand_off();
        e.queue().unwrap().request_release("asked", "laptop", "desktop").await.unwrap();
        let told = tokio::time::timeout(Duration::from_secs(20), verdicts.wait_for(Option::is_some)).await;
        let v = told.expect("a verdict").unwrap().clone().unwrap();
        assert!(v.safe && v.text.starts_with(&format!("Asked by another machine: Handed off #{id}.")), "{v:?}");
        // This app's own hand-off: one verdict, its own. (Claiming resumes first, if the asked
        // hand-off paused it.)
        e.resume().unwrap();
        let again = e.enqueue_demo().await.unwrap();
        assert!(ok(|s| !s.running.is_empty()).await);
        let own = e.hand_off(false).await.unwrap();
        assert!(own.jobs.iter().any(|j| j.id == again || j.id == id), "{own:?}");
        // Past the watcher's 500 ms burst: an asked-for verdict would have replaced it by now.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(e.last_hand_off(), Some(own), "not overwritten by an asked-for verdict");
        st.borrow_and_update();
        e.stop(devpilot_engine::orchestrator::StopMode::HandOff).await;
    }
}
