//! The user's commands: dispatch on or off, pause and resume, hand off, enqueue, the job
//! lists, a job's detail and log, requeue and cancel.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devpilot_engine::orchestrator::Handle;
use devpilot_store::error::{Error, Result};
use devpilot_store::job::JobState;
use devpilot_store::queue::{Counts, JobRow};

use crate::engine::Engine;

/// What the claiming control is set to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Claiming {
    On,
    /// For `minutes`, or until resumed.
    Paused {
        minutes: Option<u64>,
    },
    Off,
}
use crate::views::{Fleet, JobDetail, NewJob};

impl Engine {
    /// Switches dispatch on or off, and remembers it across restarts.
    pub async fn set_dispatch(&self, on: bool) -> Result<()> {
        let mut file = self.paths.load()?;
        file.dispatch_enabled = on;
        self.save_file(&file)?;
        self.effective.send_modify(|eff| eff.dispatch_enabled = on);
        if let Some(h) = self.orchestrator() {
            h.set_enabled(on);
        }
        // Show the choice at once; the orchestrator's own snapshot follows.
        self.status_tx.send_modify(|s| s.dispatch_enabled = on);
        Ok(())
    }

    pub fn pause(&self, for_: Option<Duration>) -> Result<()> {
        self.paused_for_sleep.store(false, Ordering::SeqCst);
        self.running_orchestrator()?.pause(for_);
        Ok(())
    }

    pub fn resume(&self) -> Result<()> {
        self.paused_for_sleep.store(false, Ordering::SeqCst);
        self.running_orchestrator()?.resume();
        // The last hand-off's verdict is about a pause that is over.
        self.hand_off_tx.send_replace(None);
        Ok(())
    }

    /// The one claiming control (window and tray): on, paused for a while or until resumed,
    /// or off. Each choice ends the others: "on" resumes a pause, a pause switches dispatch on.
    pub async fn set_claiming(&self, c: Claiming) -> Result<()> {
        match c {
            Claiming::Off => return self.set_dispatch(false).await,
            Claiming::On | Claiming::Paused { .. } if !self.status().dispatch_enabled => {
                self.set_dispatch(true).await?
            }
            _ => {}
        }
        match c {
            Claiming::Paused { minutes } => self.pause(minutes.map(|m| Duration::from_secs(m.saturating_mul(60)))),
            _ if self.status().paused => self.resume(),
            _ => Ok(()),
        }
    }

    pub(crate) fn running_orchestrator(&self) -> Result<Handle> {
        self.orchestrator().ok_or_else(|| {
            let st = self.status();
            Error::Invalid(match st.message {
                Some(m) => format!("dispatch is not running: {m}"),
                None => "dispatch is not running yet".into(),
            })
        })
    }

    /// Enqueues a demo job on this orchestrator and wakes the loop.
    pub async fn enqueue_demo(&self) -> Result<i64> {
        Ok(self.enqueue_demo_keyed(None).await?.id)
    }

    /// Enqueues a demo job with an optional dedupe key: while a job with that key is live,
    /// nothing is added and the answer names the live job.
    pub async fn enqueue_demo_keyed(&self, key: Option<&str>) -> Result<devpilot_store::queue::Enqueued> {
        let key = key.map(str::trim).filter(|k| !k.is_empty());
        let s = self.settings();
        let q = self.queue()?;
        let n = q.counts(&s.orchestrator_id).await.map(|c| c.queued + c.running + c.completed + 1).unwrap_or(1);
        let payload = serde_json::json!({
            "title": format!("Demo job {n}"),
            "source": "devpilot-tray",
            "machine": s.machine_name(),
            "note": "The demo agent logs this payload and succeeds after a few seconds.",
        });
        let opts = devpilot_store::queue::JobOptions {
            max_attempts: s.max_attempts.max(1),
            key: key.map(str::to_string),
            ..Default::default()
        };
        let added = q.enqueue_keyed(&s.orchestrator_id, &payload, &opts).await?;
        if let Some(h) = self.orchestrator() {
            h.wake();
        }
        Ok(added)
    }

    /// Up to `limit` jobs (in `state`, or in any), and the counts per state.
    pub async fn jobs(&self, state: Option<JobState>, limit: u32) -> Result<(Vec<JobRow>, Counts)> {
        let s = self.settings();
        let q = self.queue()?;
        let jobs = q.jobs(&s.orchestrator_id, state.map(JobState::as_str), limit.clamp(1, 500)).await?;
        let counts = q.counts(&s.orchestrator_id).await?;
        Ok((jobs, counts))
    }

    /// Of `jobs`, the queued ones no online machine can take, with why.
    pub async fn unroutable(&self, jobs: &[JobRow]) -> Result<std::collections::BTreeMap<i64, String>> {
        let waiting: Vec<&JobRow> = jobs
            .iter()
            .filter(|j| j.claimed_at.is_none() && JobState::CLAIMABLE.contains(&j.state))
            .filter(|j| j.repo.is_some() || !j.requires.is_empty())
            .collect();
        if waiting.is_empty() {
            return Ok(Default::default());
        }
        let machines = self.queue()?.machines(&self.settings().orchestrator_id).await?;
        Ok(waiting
            .into_iter()
            .filter_map(|j| {
                devpilot_store::queue::unroutable(j.repo.as_deref(), &j.requires, &machines).map(|w| (j.id, w))
            })
            .collect())
    }

    pub async fn fleet(&self) -> Result<Fleet> {
        let s = self.settings();
        let q = self.queue()?;
        Ok(Fleet {
            machines: q.machines(&s.orchestrator_id).await?,
            running: q.running(&s.orchestrator_id).await?,
            counts: q.counts(&s.orchestrator_id).await?,
        })
    }

    pub async fn job_detail(&self, id: i64) -> Result<JobDetail> {
        let q = self.queue()?;
        let (job, payload) = q.job(id).await?.ok_or_else(|| Error::Invalid(format!("there is no job #{id}")))?;
        let history = q.history(id).await?;
        let me = self.settings().machine_name();
        let held_elsewhere = job.state == JobState::Running && job.claimed_by.as_deref() != Some(me.as_str());
        let local = self.log_tail(id, 256 * 1024);
        let (log_tail, log_from) = if !held_elsewhere && !local.is_empty() {
            (local, Some("local".to_string()))
        } else {
            match q.log_tail(id).await? {
                Some(t) => (t.tail, Some(t.machine)),
                // Its holder stores a tail once the agent prints something: until then the
                // log is the holder's, and empty, so the window keeps following it.
                None if held_elsewhere => (String::new(), job.claimed_by.clone()),
                None => (local, None),
            }
        };
        let unroutable = q.why_unroutable(&job).await?;
        let branch = job.branch(&payload);
        let deliveries = q.outbox_of(id).await?;
        let review_loop = crate::review::review_loop(&q, id, &history, &deliveries).await?;
        let spend = crate::limits::job_spend(&q, id, &self.settings().limits).await?;
        let worktree_here = self.worktree_path(id).is_some();
        let log_path = Some(self.job_log(id)).filter(|p| p.exists()).map(|p| p.display().to_string());
        Ok(JobDetail {
            job,
            payload,
            history,
            log_tail,
            log_from,
            unroutable,
            branch,
            deliveries,
            worktree_here,
            log_path,
            review_loop,
            spend,
        })
    }

    /// Job `id`'s worktree on this machine, if it has one now.
    pub fn worktree_path(&self, id: i64) -> Option<PathBuf> {
        let s = self.settings();
        let root = devpilot_engine::orchestrator::worktree_root(&self.paths.data_dir, &s.orchestrator_id);
        Some(root.join(id.to_string())).filter(|p| p.is_dir())
    }

    /// Asks machine `machine` to hand off its jobs (it releases them at its next renewal);
    /// what was asked, in words.
    pub async fn ask_hand_off(&self, machine: &str) -> Result<String> {
        let s = self.settings();
        let asked = self.queue()?.request_release(&s.orchestrator_id, machine, &s.machine_name()).await?;
        Ok(match asked.len() {
            0 => format!("{machine} holds no job to hand off."),
            n => format!(
                "Asked {machine} to hand off {n} job{}: it releases {} at its next renewal, pushing the work.",
                if n == 1 { "" } else { "s" },
                if n == 1 { "it" } else { "them" }
            ),
        })
    }

    /// Where a finished job's notification "Open" goes, asked when the user clicks it: the
    /// job's result link as the queue has it now (a pull request is opened, and becomes the
    /// link, some seconds after the job completed), if it is an http(s) one. `None`: no such
    /// link (or the queue cannot be read): the caller opens what it would have opened anyway.
    pub async fn result_link(&self, id: i64) -> Option<String> {
        let found = match self.queue() {
            Ok(q) => q.job(id).await,
            Err(e) => Err(e),
        };
        match found {
            Ok(found) => {
                found.and_then(|(job, _)| job.url).filter(|u| u.starts_with("https://") || u.starts_with("http://"))
            }
            Err(e) => {
                tracing::warn!(job = id, error = %e, "cannot read the job's result link");
                None
            }
        }
    }

    /// Enqueues a job from the New job form and wakes the loop.
    pub async fn enqueue_job(&self, form: NewJob) -> Result<devpilot_store::queue::Enqueued> {
        let title = form.title.trim();
        if title.is_empty() {
            return Err(Error::Invalid("a job needs a title".into()));
        }
        let spec = devpilot_store::spec::JobSpec {
            title: Some(title.to_string()),
            prompt: Some(form.prompt.trim().to_string()).filter(|p| !p.is_empty()),
            repo: form.repo.map(|r| r.trim().to_string()).filter(|r| !r.is_empty()),
            requires: devpilot_store::spec::parse_labels(&form.labels)?,
            ..Default::default()
        };
        let s = self.settings();
        let key = form.key.map(|k| k.trim().to_string()).filter(|k| !k.is_empty());
        if let Some(k) = &key {
            devpilot_store::queue::validate_key(k)?;
        }
        let opts = devpilot_store::queue::JobOptions {
            max_attempts: s.max_attempts.max(1),
            key,
            priority: form.priority,
            ..Default::default()
        };
        let added = self.queue()?.enqueue_keyed(&s.orchestrator_id, &spec.to_payload(), &opts).await?;
        if let Some(h) = self.orchestrator() {
            h.wake();
        }
        Ok(added)
    }

    /// The last `max` bytes of this machine's agent log for job `id` (empty if none).
    pub fn log_tail(&self, id: i64, max: u64) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.job_log(id);
        let Ok(mut f) = std::fs::File::open(&path) else { return String::new() };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
        let mut buf = vec![];
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    pub fn job_log(&self, id: i64) -> PathBuf {
        self.paths.job_log(id)
    }

    pub async fn requeue(&self, id: i64) -> Result<bool> {
        let by = self.settings().machine_name();
        self.queue()?.requeue(id, &by).await
    }

    /// Cancels a job from this machine, wherever it runs. `None`: it was finished already.
    /// When this machine holds it, its leases are renewed at once, so the agent stops now
    /// rather than at the next heartbeat (SQLite has no NOTIFY to say so).
    pub async fn cancel(&self, id: i64) -> Result<Option<devpilot_store::queue::CancelOutcome>> {
        let by = self.settings().machine_name();
        let outcome = self.queue()?.cancel(id, &by).await?;
        if let Some(devpilot_store::queue::CancelOutcome::Requested { holder: Some(h) }) = &outcome {
            if *h == by {
                if let Some(o) = self.orchestrator() {
                    tokio::spawn(async move { o.recheck_leases().await });
                }
            }
        }
        Ok(outcome)
    }
}
