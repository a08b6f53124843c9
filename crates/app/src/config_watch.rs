//! The settings file, watched: an edit by hand or by the CLI (`devpilot sources add`,
//! `devpilot login`) is applied as a save from the window is, live where it can be and by a
//! restart of the engine where it must (another database, orchestrator or machine name). An
//! edit that cannot be read leaves the settings in force and says why.
//!
//! The watch is inotify's (through the `notify` crate): an idle app wakes for nothing.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engine;
pub use crate::verdict::ConfigNote;
use devpilot_engine::settings::Settings;
use notify::{RecursiveMode, Watcher};

/// How long a burst of writes (an editor's save, a rename into place) settles before the
/// file is read.
const SETTLE: Duration = Duration::from_millis(300);

impl Engine {
    /// Watches the settings file: the watch is set up now, and the future it answers applies
    /// each edit for as long as it runs. A watch that cannot be set up is logged (`None`), and
    /// the app runs on without it.
    pub fn watch_config_file(self: Arc<Self>) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let file = self.paths.config_file();
        let dir = self.paths.config_dir.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let wanted = file.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) if ev.paths.contains(&wanted) && !ev.kind.is_access() => {
                let _ = tx.send(());
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "settings file watch"),
        });
        let started = watcher.and_then(|mut w| {
            std::fs::create_dir_all(&dir).map_err(notify::Error::io)?;
            // The folder, not the file: editors and `save` replace the file by a rename.
            w.watch(&dir, RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        let watcher = match started {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, file = %file.display(), "cannot watch the settings file; edits need a restart");
                return None;
            }
        };
        Some(async move {
            let _watcher = watcher;
            while rx.recv().await.is_some() {
                tokio::time::sleep(SETTLE).await;
                while rx.try_recv().is_ok() {}
                self.reload_config().await;
            }
        })
    }

    /// Applies the settings file as it is now, unless it is what is in force already (the
    /// window's own save, or a write that changed nothing).
    pub async fn reload_config(self: &Arc<Self>) {
        let name = self.paths.config_file().display().to_string();
        let note = |ok, text: String| {
            tracing::info!(ok, "{text}");
            self.config_note.send_replace(Some(ConfigNote { ok, text }));
        };
        let fresh = match self.paths.load().and_then(|s| s.validate().map(|()| s)) {
            Ok(s) => s,
            Err(e) => {
                return note(false, format!("{name} was edited, but {e}. The settings before the edit stay in force."));
            }
        };
        // The app's own write (its apply may still be under way), or what is in force.
        let ours = self.written.lock().ok().is_some_and(|w| w.as_ref() == Some(&fresh));
        let now = self.settings();
        if ours || self.with_overrides(fresh.clone()) == now {
            return;
        }
        // An edit by hand is in force now: the app's last own write is no longer what the
        // file says, so an edit back to it is news too.
        if let Ok(mut w) = self.written.lock() {
            *w = None;
        }
        match self.apply(&now, fresh, false).await {
            Ok(()) => note(true, format!("Settings reloaded from {name}.")),
            Err(e) => note(false, format!("{name} was edited, but it cannot be applied: {e}")),
        }
    }

    /// Saves the settings file as the app's own write: the watch does not apply it again.
    pub(crate) fn save_file(&self, s: &Settings) -> devpilot_store::error::Result<()> {
        self.paths.save(s)?;
        if let Ok(mut w) = self.written.lock() {
            *w = Some(s.clone());
        }
        Ok(())
    }

    /// What became of the last edit of the settings file, as it changes.
    pub fn watch_config_note(&self) -> tokio::sync::watch::Receiver<Option<ConfigNote>> {
        self.config_note.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overrides::Overrides;
    use devpilot_engine::config::Paths;

    /// An edit by hand applies live (no restart: the machine and its queue stay); an edit that
    /// cannot be read leaves the settings in force and says why; the app's own save is not
    /// news.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_edit_of_the_settings_file_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let p =
            Paths { config_dir: dir.path().join("c"), data_dir: dir.path().join("d"), log_dir: dir.path().join("l") };
        let s = Settings { orchestrator_id: "watched".into(), max_attempts: 3, ..Settings::default() };
        p.save(&s).unwrap();
        let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
        e.start().await;
        tokio::spawn(e.clone().watch_config_file().expect("inotify works here"));
        let mut notes = e.watch_config_note();
        let next = |notes: &mut tokio::sync::watch::Receiver<Option<ConfigNote>>| {
            let mut notes = notes.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), notes.changed()).await.expect("a note").unwrap();
                let note = notes.borrow_and_update().clone();
                note.expect("a note")
            }
        };
        std::fs::write(p.config_file(), "orchestrator_id = \"watched\"\nmax_attempts = 7\n").unwrap();
        let note = next(&mut notes).await;
        assert!(note.ok && note.text.starts_with("Settings reloaded from "), "{note:?}");
        assert_eq!(e.settings().max_attempts, 7, "in force at once");
        notes.borrow_and_update();
        std::fs::write(p.config_file(), "max_attempts = \"many\"\n").unwrap();
        let note = next(&mut notes).await;
        assert!(!note.ok && note.text.contains("The settings before the edit stay in force"), "{note:?}");
        assert_eq!(e.settings().max_attempts, 7, "unchanged");
        notes.borrow_and_update();
        // What is in force, written again (the window's own save): no news.
        let mut same = e.settings();
        same.database_url = None;
        p.save(&same).unwrap();
        e.reload_config().await;
        assert!(!notes.has_changed().unwrap(), "{:?}", notes.borrow());
        e.stop(devpilot_engine::orchestrator::StopMode::HandOff).await;
    }

    /// An edit by hand back to what the window last saved is applied: the window saves 5
    /// attempts, a hand edit makes them 7, and putting the window's file back makes them 5
    /// again (it was taken for the window's own write, and ignored).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_edit_back_to_the_windows_last_save_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let p =
            Paths { config_dir: dir.path().join("c"), data_dir: dir.path().join("d"), log_dir: dir.path().join("l") };
        p.save(&Settings { orchestrator_id: "watched".into(), ..Settings::default() }).unwrap();
        let e = Engine::new(p.clone(), "devpilot-test", Overrides::default());
        e.start().await;
        let mut saved = e.settings();
        saved.max_attempts = 5;
        e.apply_settings(saved, &crate::DbForm::of(None), None).await.unwrap();
        let window = std::fs::read_to_string(p.config_file()).unwrap();
        std::fs::write(p.config_file(), window.replace("max_attempts = 5", "max_attempts = 7")).unwrap();
        e.reload_config().await;
        assert_eq!(e.settings().max_attempts, 7, "the hand edit is in force");
        std::fs::write(p.config_file(), &window).unwrap();
        e.reload_config().await;
        assert_eq!(e.settings().max_attempts, 5, "and so is the edit back");
        e.stop(devpilot_engine::orchestrator::StopMode::HandOff).await;
    }
}
