//! What the review loop's end-to-end tests share: a clone whose `origin` says github.com (and
//! whose machine's git sends that to a real bare repository), and waiting on the loop's rows
//! (a delivery, a watched pull request's read, a follow-up), with the quiet period passed by
//! moving the feedback's timestamps, never by sleeping.

// Harness code says "this must hold" by unwrapping: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use devpilot_store::job::JobState;
use devpilot_store::queue::{FeedbackRow, JobRow};

use crate::sources::{jobs, next_turn, WAIT};
use crate::{git, wait_for, GitRemote, TestDb};

/// The URL the users' clones name: their git config sends it to the bare repository.
pub const GITHUB_URL: &str = "https://github.com/acme/webapp.git";

/// A clone of `remote` for machine `name` under `root`, whose `origin` says github.com, and
/// the machine's global git config (`<root>/<name>/config/git/config`, its XDG config)
/// rewriting that URL to the bare repository: pushes land, and DevPilot sees GitHub.
pub fn github_clone(remote: &GitRemote, root: &Path, name: &str) -> PathBuf {
    let clone = remote.clone_to(&root.join(format!("clone-{name}")));
    git(&clone, &["remote", "set-url", "origin", GITHUB_URL]);
    let global = root.join(name).join("config").join("git");
    std::fs::create_dir_all(&global).unwrap();
    let key = format!("url.{}.insteadOf", remote.bare.display());
    git(&clone, &["config", "--file", &global.join("config").to_string_lossy(), &key, GITHUB_URL]);
    clone
}

/// One test's queue, waited on.
pub struct Loop<'a> {
    pub db: &'a TestDb,
    pub orch: &'a str,
}

impl Loop<'_> {
    /// The test's only job, once the intake added it.
    pub async fn job(&self) -> JobRow {
        let found = || async { !jobs(self.db, self.orch).await.is_empty() };
        assert!(wait_for(WAIT, found).await, "the issue became a job");
        jobs(self.db, self.orch).await.remove(0)
    }

    /// Job `id` as it is now.
    pub async fn job_now(&self, id: i64) -> JobRow {
        self.db.queue.job(id).await.unwrap().unwrap().0
    }

    /// Waits until the job's outbox row `event` (the `n`th of them) was delivered.
    pub async fn delivered(&self, id: i64, event: &str, n: usize, log: &Path) {
        let done = || async {
            let rows = self.db.queue.outbox_of(id).await.unwrap();
            rows.iter().filter(|r| r.event == event && r.outcome.as_deref() == Some("delivered")).count() >= n
        };
        let ok = wait_for(WAIT * 2, done).await;
        assert!(ok, "{event} #{n} of job {id} was delivered: {}", std::fs::read_to_string(log).unwrap_or_default());
    }

    /// The job's pull request number, once opened and watched.
    pub async fn pull(&self, id: i64, log: &Path) -> u64 {
        self.delivered(id, "pull_request", 1, log).await;
        let watched = self.db.queue.watch_of(id).await.unwrap().expect("the pull request is watched");
        assert_eq!(watched.state, "open");
        u64::try_from(watched.number).unwrap()
    }

    /// Takes the next intake turn and waits until it read every open pull request.
    pub async fn read(&self) {
        next_turn(self.db, self.orch).await;
        let unread = format!(
            "SELECT COUNT(*) FROM pr_watch w JOIN sources s ON s.id = w.source_id
              WHERE w.orchestrator_id = '{}' AND w.state = 'open' AND (w.read_at IS NULL OR w.read_at < s.polled_at)",
            self.orch
        );
        let done = || async { self.db.scalar(&unread).await == Some(0) };
        assert!(wait_for(WAIT, done).await, "the turn read every watched pull request");
    }

    /// Moves the job's feedback past the quiet period (2 minutes).
    pub async fn quiet(&self, id: i64) {
        self.db.exec(&format!("UPDATE pr_feedback SET received_at = received_at - 121000 WHERE job_id = {id}")).await;
    }

    pub async fn feedback(&self, id: i64) -> Vec<FeedbackRow> {
        self.db.queue.feedback_of(id).await.unwrap()
    }

    /// Waits for the job to complete follow-up `n`.
    pub async fn followed_up(&self, id: i64, n: i32, log: &Path) -> JobRow {
        let done = || async {
            let j = self.job_now(id).await;
            j.follow_ups == n && j.state == JobState::Completed
        };
        let ok = wait_for(WAIT * 2, done).await;
        assert!(ok, "job {id} completed follow-up {n}: {}", std::fs::read_to_string(log).unwrap_or_default());
        self.job_now(id).await
    }
}
