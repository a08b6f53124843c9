//! Every hand-off and its verdict ([`crate::verdict`]): the one thing a user needs before
//! closing the lid.
//!
//! Every hand-off (the window's, the tray's, the sleep hook's, and `devpilot handoff` through
//! the control socket) goes through
//! [`Engine::hand_off`], which publishes its verdict: the tray shows it as a line and as a
//! notification, the window as a notice.

use std::sync::atomic::Ordering;

use tokio::sync::broadcast::error::RecvError;

use devpilot_engine::orchestrator::{verdict, Event};
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
        self.handing_off.store(true, Ordering::SeqCst);
        // Marked as this hand-off's before the flag drops, so a late look at their events by
        // `watch_requested_releases` still knows them.
        let mark = |ids: &[i64]| {
            if let Ok(mut own) = self.own_releases.lock() {
                let now = std::time::Instant::now();
                own.retain(|_, at| now.duration_since(*at) < OWN_RELEASE_MEMORY);
                own.extend(ids.iter().map(|id| (*id, now)));
            }
        };
        let verdict = verdict::hand_off(&handle, pause, before_sleep, mark).await;
        self.handing_off.store(false, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;
    use devpilot_engine::orchestrator::{MachineState, Status};
    use std::time::Duration;

    /// An engine of a test's own on the embedded database, started, with the watcher of
    /// asked-for hand-offs running, and idle.
    async fn idle_engine(dir: &std::path::Path, queue: &str) -> std::sync::Arc<Engine> {
        use devpilot_engine::settings::Settings;
        use devpilot_engine::span::Span;
        let p = devpilot_engine::config::Paths {
            config_dir: dir.join("c"),
            data_dir: dir.join("d"),
            log_dir: dir.join("l"),
        };
        let s = Settings {
            orchestrator_id: queue.into(),
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
        assert!(reached(&e, |s| s.db_online && s.state == MachineState::Idle).await);
        e
    }

    /// Whether the engine's status satisfies `f` within 20 s.
    async fn reached(e: &Engine, f: fn(&Status) -> bool) -> bool {
        tokio::time::timeout(Duration::from_secs(20), e.watch_status().wait_for(f)).await.is_ok()
    }

    /// A hand-off another machine asks for is told on the holder as its own are, and a hand-off
    /// of this app is not told twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hand_off_asked_by_another_machine_gets_its_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let e = idle_engine(dir.path(), "asked").await;
        let id = e.enqueue_demo().await.unwrap();
        assert!(reached(&e, |s| !s.running.is_empty()).await, "the demo job runs here");
        let mut verdicts = e.watch_hand_off();
        e.queue().unwrap().request_release("asked", "laptop", "desktop").await.unwrap();
        let told = tokio::time::timeout(Duration::from_secs(20), verdicts.wait_for(Option::is_some)).await;
        let v = told.expect("a verdict").unwrap().clone().unwrap();
        assert!(v.safe && v.text.starts_with(&format!("Asked by another machine: Handed off #{id}.")), "{v:?}");
        // This app's own hand-off: one verdict, its own. (Claiming resumes first, if the asked
        // hand-off paused it.)
        e.resume().unwrap();
        let again = e.enqueue_demo().await.unwrap();
        assert!(reached(&e, |s| !s.running.is_empty()).await);
        let own = e.hand_off(false).await.unwrap();
        assert!(own.jobs.iter().any(|j| j.id == again || j.id == id), "{own:?}");
        // Past the watcher's 500 ms burst: an asked-for verdict would have replaced it by now.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(e.last_hand_off(), Some(own), "not overwritten by an asked-for verdict");
        e.stop(devpilot_engine::orchestrator::StopMode::HandOff).await;
    }

    /// `devpilot handoff` through the tray's control socket is the tray's own hand-off: its
    /// releases are this app's (never told as "asked by another machine"), and the terminal
    /// gets the verdict the tray publishes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hand_off_through_the_control_socket_is_the_trays_own() {
        use devpilot_engine::control;
        let dir = tempfile::tempdir().unwrap();
        let e = idle_engine(dir.path(), "socket").await;
        let id = e.enqueue_demo().await.unwrap();
        assert!(reached(&e, |s| !s.running.is_empty()).await, "the demo job runs here");
        let sock = control::socket_path(&dir.path().join("d"), "socket");
        let reply = control::ask(&sock, &control::Request::HandOff).await.unwrap();
        assert!(reply.ok, "{reply:?}");
        assert!(e.own_release(id), "the released job is marked as the tray's own");
        let v = reply.verdict.expect("the reply carries the verdict");
        assert!(v.safe && v.paused && v.text.starts_with(&format!("Handed off #{id}.")), "{v:?}");
        assert_eq!(e.last_hand_off(), Some(v), "the tray published the same verdict");
        e.stop(devpilot_engine::orchestrator::StopMode::HandOff).await;
    }
}
