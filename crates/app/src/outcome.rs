//! What a finished job came to, in one line a notification can carry: "Draft PR #42 · 12 min
//! on desktop · $0.42", or "Gave up after 3 attempts · 4 min on laptop".

use std::time::Duration;

use devpilot_engine::worktree::PrMode;
use devpilot_store::job::JobState;
use devpilot_store::queue::{JobRow, OutboxRow};

use crate::engine::Engine;

/// A finished job, read back from the queue for its notification.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub job: JobRow,
    /// "Draft PR #42 · 12 min on desktop · $0.42".
    pub line: String,
    /// Its pull request's address, once opened.
    pub pr: Option<String>,
}

/// The queue at a glance ([`Engine::board`]).
#[derive(Clone, Debug)]
pub struct Board {
    /// Waiting to be claimed (queued, or failed and waiting to retry).
    pub queued: i64,
    /// Running on any machine.
    pub running: i64,
    /// The three newest jobs that have ended.
    pub recent: Vec<Outcome>,
}

/// How far back the fleet watch's first look reads.
pub const LOOK_BACK: Duration = Duration::from_secs(30);

/// Where [`Engine::finished_elsewhere`] reads from next, and what it told that may be read
/// again.
#[derive(Debug, Default)]
pub struct FleetWatch {
    since: Option<i64>,
    told: std::collections::HashMap<i64, i64>,
    /// Jobs this machine handed off: told wherever they came from.
    handed: std::collections::HashSet<i64>,
}

impl FleetWatch {
    /// Job `id` was handed off from here: its end elsewhere is news, whatever its source.
    pub fn handed_off(&mut self, id: i64) {
        self.handed.insert(id);
    }
}

/// How long a completion's notification waits for its pull request to be opened (the outbox
/// opens it a moment after the job completes) before it is told without one.
pub const PR_WAIT: Duration = Duration::from_secs(20);

impl Engine {
    /// Job `id` as it ended, waiting up to `wait` while its pull request is still to be opened.
    /// `None` when the queue cannot be read (the caller tells what it already knows).
    pub async fn outcome(&self, id: i64, wait: Duration) -> Option<Outcome> {
        let q = self.queue().ok()?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let read = async { Ok::<_, devpilot_store::error::Error>((q.job(id).await?, q.outbox_of(id).await?)) };
            let (job, outbox) = match read.await {
                Ok((Some((job, _)), outbox)) => (job, outbox),
                Ok((None, _)) => return None,
                Err(e) => {
                    tracing::warn!(job = id, error = %e, "cannot read how the job ended");
                    return None;
                }
            };
            if !OutboxRow::pr_pending(&outbox) || tokio::time::Instant::now() >= deadline {
                let draft = self.pr_mode(job.repo.as_deref()) == PrMode::Draft;
                let pr = job.pull_request().map(str::to_string);
                return Some(Outcome { line: outcome_line(&job, draft), pr, job });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The jobs from this machine's sources (or handed off from here) that another machine
    /// finished (completed or dead) since `w` last looked, each told once. A completion whose pull request is still
    /// being opened waits for it (up to [`PR_WAIT`]) to the next look. The first look reads
    /// back [`LOOK_BACK`]: an end in the moments before the watch began is still news.
    pub async fn finished_elsewhere(&self, w: &mut FleetWatch) -> devpilot_store::error::Result<Vec<Outcome>> {
        let q = self.queue()?;
        let since = match w.since {
            Some(since) => since,
            None => q.now_ms().await? - LOOK_BACK.as_millis() as i64,
        };
        let s = self.settings();
        let me = s.machine_name();
        let rows = q.finished_since(&s.orchestrator_id, since, 50).await?;
        let mut next = rows.iter().filter_map(|r| r.finished_at).max().unwrap_or(since);
        let mut told = vec![];
        for job in rows {
            let (Some(end), Some(by)) = (job.finished_at, job.claimed_by.as_deref()) else { continue };
            let mine = w.handed.remove(&job.id) || job.source.as_deref().is_some_and(|src| s.sources.contains_key(src));
            if by == me || !mine || w.told.contains_key(&job.id) {
                continue;
            }
            if job.now - end < PR_WAIT.as_millis() as i64 && OutboxRow::pr_pending(&q.outbox_of(job.id).await?) {
                next = next.min(end - 1);
                continue;
            }
            w.told.insert(job.id, end);
            let draft = self.pr_mode(job.repo.as_deref()) == PrMode::Draft;
            told.push(Outcome { line: outcome_line(&job, draft), pr: job.pull_request().map(str::to_string), job });
        }
        w.told.retain(|_, end| *end > next);
        w.since = Some(next);
        Ok(told)
    }

    /// The queue at a glance, for the tray: how many jobs wait and run, and the last three
    /// that have ended (anywhere), newest first.
    pub async fn board(&self) -> devpilot_store::error::Result<Board> {
        let q = self.queue()?;
        let orch = self.settings().orchestrator_id;
        let counts = q.counts(&orch).await?;
        let recent = q
            .jobs(&orch, None, 40)
            .await?
            .into_iter()
            .filter(|j| j.state.is_finished())
            .take(3)
            .map(|job| {
                let draft = self.pr_mode(job.repo.as_deref()) == PrMode::Draft;
                Outcome { line: outcome_line(&job, draft), pr: job.pull_request().map(str::to_string), job }
            })
            .collect();
        Ok(Board { queued: counts.queued + counts.failed, running: counts.running, recent })
    }

    /// How this machine's settings open pull requests for `repo` (a repo not configured here:
    /// the default, draft).
    fn pr_mode(&self, repo: Option<&str>) -> PrMode {
        repo.and_then(|r| self.settings().repos.get(r).map(|r| r.pull_request)).unwrap_or_default()
    }
}

/// "Draft PR #42 · 12 min on desktop · $0.42": what came of it, how long it ran and where,
/// and what it cost. Parts that are not known are left out.
pub fn outcome_line(job: &JobRow, draft: bool) -> String {
    let mut parts = vec![];
    if let Some(pr) = job.pull_request() {
        let n = pr.rsplit("/pull/").next().unwrap_or_default().trim_end_matches('/');
        parts.push(format!("{}PR #{n}", if draft { "Draft " } else { "" }));
    } else if job.state == JobState::Completed && job.commits == Some(0) {
        parts.push("No changes".into());
    } else if job.state == JobState::Dead {
        let n = job.attempts;
        parts.push(format!("Gave up after {n} attempt{}", if n == 1 { "" } else { "s" }));
    }
    let end = job.finished_at.or(job.completed_at);
    if let (Some(start), Some(end)) = (job.started_at, end) {
        let took = took(Duration::from_millis(end.saturating_sub(start).max(0) as u64));
        parts.push(match &job.claimed_by {
            Some(m) => format!("{took} on {m}"),
            None => took,
        });
    }
    if let Some(c) = job.agent.cost_usd.filter(|c| *c > 0.0) {
        parts.push(format!("${c:.2}"));
    }
    parts.join(" · ")
}

/// "45 s", "12 min", "1 h 5 min".
fn took(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", (s + 30) / 60),
        _ => match (s / 3600, (s % 3600 + 30) / 60) {
            (h, 0) => format!("{h} h"),
            (h, m) => format!("{h} h {m} min"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overrides::Overrides;
    use devpilot_engine::config::Paths;
    use devpilot_engine::settings::Settings;
    use devpilot_engine::sources::{SourceKind, SourceSettings};

    fn row(state: JobState) -> JobRow {
        let mut j = JobRow::bare(12, "o", state);
        j.claimed_by = Some("desktop".into());
        j.started_at = Some(1_000);
        j.finished_at = Some(1_000 + 12 * 60_000 + 10_000);
        j
    }

    /// The line says the PR (draft or not), how long on which machine, and the cost.
    #[test]
    fn a_completion_with_its_pull_request() {
        let mut j = row(JobState::Completed);
        j.url = Some("https://github.com/acme/webapp/pull/42".into());
        j.agent.cost_usd = Some(0.4211);
        assert_eq!(outcome_line(&j, true), "Draft PR #42 · 12 min on desktop · $0.42");
        assert_eq!(outcome_line(&j, false), "PR #42 · 12 min on desktop · $0.42");
    }

    /// No PR, no changes, a dead job, and what is unknown left out.
    #[test]
    fn what_else_a_job_comes_to() {
        let mut j = row(JobState::Completed);
        j.commits = Some(0);
        assert_eq!(outcome_line(&j, true), "No changes · 12 min on desktop");
        let mut d = row(JobState::Dead);
        d.attempts = 3;
        d.started_at = None;
        assert_eq!(outcome_line(&d, true), "Gave up after 3 attempts");
        assert_eq!(took(Duration::from_secs(3 * 3600 + 4 * 60)), "3 h 4 min");
        assert_eq!(took(Duration::from_secs(44)), "44 s");
    }

    /// The fleet watch tells a job from this machine's source (or handed off from here) that
    /// another machine finished, once; never this machine's own, another source's, or a job
    /// added by hand.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_machines_finish_is_told_once() {
        let dir = tempfile::tempdir().unwrap();
        let p =
            Paths { config_dir: dir.path().join("c"), data_dir: dir.path().join("d"), log_dir: dir.path().join("l") };
        let gh = SourceSettings {
            kind: SourceKind::Github,
            repo: "acme/webapp".into(),
            no_repo: true,
            ..Default::default()
        };
        let mut s = Settings {
            orchestrator_id: "watch".into(),
            machine: Some("laptop".into()),
            dispatch_enabled: false,
            ..Settings::default()
        };
        s.sources.insert("gh".into(), gh);
        p.save(&s).unwrap();
        let e = Engine::new(p, "devpilot-test", Overrides::default());
        e.start().await;
        let mut st = e.watch_status();
        // (The status's read guard is dropped at once: the engine writes it.)
        let online = tokio::time::timeout(Duration::from_secs(20), st.wait_for(|s| s.db_online)).await.is_ok();
        assert!(online, "the embedded database opens");
        let q = e.queue().unwrap();
        let payload = |name: &str, n: u64| serde_json::json!({"title": format!("#{n}"), "source": {"kind": "github", "name": name, "number": n}});
        let finish = |machine: &'static str, payload: serde_json::Value| {
            let q = q.clone();
            async move {
                let id = q.enqueue("watch", &payload).await.unwrap();
                let c = q.claim_by_id(id, "watch", machine).await.unwrap().unwrap();
                assert!(q.complete(&c.fence, machine).await.unwrap());
                id
            }
        };
        let mut w = FleetWatch::default();
        let old = finish("desktop", payload("gh", 1)).await;
        let first: Vec<i64> = e.finished_elsewhere(&mut w).await.unwrap().iter().map(|o| o.job.id).collect();
        assert_eq!(first, [old], "the first look reads back a little");
        let theirs = finish("desktop", payload("gh", 2)).await;
        finish("laptop", payload("gh", 3)).await;
        finish("desktop", payload("other", 4)).await;
        finish("desktop", serde_json::json!({"title": "by hand"})).await;
        let handed = q.enqueue("watch", &serde_json::json!({"title": "handed"})).await.unwrap();
        w.handed_off(handed);
        let c = q.claim_by_id(handed, "watch", "desktop").await.unwrap().unwrap();
        assert!(q.complete(&c.fence, "desktop").await.unwrap());
        let told = e.finished_elsewhere(&mut w).await.unwrap();
        let ids: Vec<i64> = told.iter().map(|o| o.job.id).collect();
        assert_eq!(ids, [theirs, handed], "the desktop's job from source gh, and the one handed off from here");
        assert!(told[0].line.ends_with(" on desktop"), "{}", told[0].line);
        assert!(e.finished_elsewhere(&mut w).await.unwrap().is_empty(), "told once");
        e.stop(devpilot_engine::orchestrator::StopMode::HandOff).await;
    }
}
