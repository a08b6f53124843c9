//! What a notification about one job says and offers, read back from the shared queue: the
//! facts line ("Draft PR #42 · 12 min on desktop · $0.42"), the buttons beside Open ("Open
//! PR", "View log", "Retry"), why a parked job is parked, and the jobs other machines
//! finished (`notify.any_machine`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use devpilot_app::orchestrator::{Event, JobRef};
use devpilot_app::settings::NotifySettings;
use devpilot_app::Engine;
use tokio::sync::mpsc;

use crate::notice::{buttons_for, parked_text, Kind, Notice, Open, ParkReason};

/// Sends `n`, the notice of `ev`: at once, or for a job that finished or was parked, once
/// its row was read back (what came of it, why it is parked), on a task of its own.
pub fn tell(engine: &Arc<Engine>, ev: &Event, n: Notice, tx: &mpsc::UnboundedSender<Notice>) {
    let (engine, tx) = (engine.clone(), tx.clone());
    match ev {
        // Its PR is opened a moment after it completes.
        Event::Completed { job, .. } | Event::Failed { job, dead: true, .. } => {
            let id = job.id;
            tokio::spawn(async move {
                let _ = tx.send(with_outcome(&engine, n, id).await);
            });
        }
        Event::Parked { job, until_unix_ms } => {
            let (job, until) = (job.clone(), *until_unix_ms);
            tokio::spawn(async move {
                let _ = tx.send(with_park_reason(&engine, n, &job, until).await);
            });
        }
        _ => {
            let _ = tx.send(n);
        }
    }
}

/// `n` (about job `id`, completed or dead) with what came of it, read back from the queue:
/// its facts line and its pull request's button. A completion waits for its pull request to
/// be opened, up to [`devpilot_app::PR_WAIT`]. The queue unreadable: `n` as it was.
pub async fn with_outcome(engine: &Engine, mut n: Notice, id: i64) -> Notice {
    if let Some(o) = engine.outcome(id, devpilot_app::PR_WAIT).await {
        n.facts = Some(o.line).filter(|l| !l.is_empty());
        n.buttons = buttons_for(n.kind, id, o.pr.as_deref());
    }
    n
}

/// `n` (job `job` parked until `until_ms`) saying why, from the job's row: a spend cap, a
/// usage limit, or the agent's own ask. The queue unreadable: `n` as it was.
pub async fn with_park_reason(engine: &Engine, mut n: Notice, job: &JobRef, until_ms: i64) -> Notice {
    match engine.outcome(job.id, Duration::ZERO).await {
        Some(o) => {
            let reason = o.job.last_error.as_deref().map_or(ParkReason::None, ParkReason::Said);
            n.text = parked_text(job, until_ms, reason);
        }
        None => tracing::debug!(job = job.id, "cannot read why the job is parked; saying it generically"),
    }
    n
}

/// The notice for a job from this machine's sources that another machine finished (with
/// `notify.any_machine`), if its toggle is on.
pub fn notice_of_elsewhere(o: &devpilot_app::Outcome, on: &NotifySettings) -> Option<Notice> {
    let j = &o.job;
    let by = j.claimed_by.as_deref().unwrap_or("another machine");
    let (kind, text) = match j.state {
        devpilot_app::job::JobState::Completed if on.completed => {
            let said = j.summary.as_deref().map(|s| format!(": {s}")).unwrap_or_default();
            (Kind::Completed, format!("Finished on {by}{said}"))
        }
        devpilot_app::job::JobState::Dead if on.dead => {
            let why = j.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
            (Kind::Dead, format!("Dead on {by} after its last attempt{why}"))
        }
        _ => return None,
    };
    let subject = match j.title.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => t.to_string(),
        None => format!("DevPilot job #{}", j.id),
    };
    let otherwise = Box::new(j.issue_url.clone().map(Open::Url).unwrap_or(Open::Job(j.id)));
    Some(Notice {
        kind,
        subject: Some(subject),
        text,
        facts: Some(o.line.clone()).filter(|l| !l.is_empty()),
        open: Some(Open::Result { job: j.id, otherwise }),
        buttons: buttons_for(kind, j.id, o.pr.as_deref()),
    })
}

/// How often the fleet watch reads what other machines finished (with `notify.any_machine`).
pub const FLEET_EVERY: Duration = Duration::from_secs(10);

/// With `notify.any_machine`, tells the jobs from this machine's sources (or handed off from
/// here) that other machines finished, read from the shared queue. Off, it reads nothing and
/// has no timer: it waits for the settings to change (an idle tray stays quiet).
pub async fn watch_fleet(engine: Arc<Engine>, handed: Arc<Mutex<Vec<i64>>>, tx: mpsc::UnboundedSender<Notice>) {
    let mut w = devpilot_app::FleetWatch::default();
    let mut settings = engine.watch_settings();
    loop {
        if !settings.borrow_and_update().notify.any_machine {
            w = devpilot_app::FleetWatch::default();
            if settings.changed().await.is_err() {
                return;
            }
            // Hand-offs made while it was off are not followed (as before, when each tick
            // dropped them).
            handed.lock().map(|mut h| h.clear()).unwrap_or_default();
            continue;
        }
        devpilot_app::timer::sleep(FLEET_EVERY).await;
        for id in handed.lock().map(|mut h| std::mem::take(&mut *h)).unwrap_or_default() {
            w.handed_off(id);
        }
        let on = engine.settings().notify;
        if !on.any_machine {
            continue;
        }
        match engine.finished_elsewhere(&mut w).await {
            Ok(done) => {
                for n in done.iter().filter_map(|o| notice_of_elsewhere(o, &on)) {
                    if tx.send(n).is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read what other machines finished"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notice::{notice_for, render};
    use devpilot_app::orchestrator::{Event, JobRef};

    fn job(id: i64) -> JobRef {
        JobRef { id, title: Some(format!("T{id}")), attempt: 1, token: 1, issue_url: None }
    }

    /// A completion read back says what came of it first, and offers its PR and its log; a
    /// dead job offers its log and Retry; a burst shows neither.
    #[test]
    fn a_notice_says_what_came_of_the_job() {
        let on = NotifySettings::default();
        let ev = Event::Completed { job: job(12), summary: Some("fixed it".into()), url: None };
        let mut n = notice_for(&ev, &on).unwrap();
        n.facts = Some("Draft PR #42 · 12 min on desktop · $0.42".into());
        n.buttons = buttons_for(Kind::Completed, 12, Some("https://github.com/acme/webapp/pull/42"));
        let (title, body) = render(std::slice::from_ref(&n));
        assert_eq!(title, "T12");
        assert_eq!(body, "Draft PR #42 · 12 min on desktop · $0.42\nFinished T12 (#12): fixed it");
        let labels: Vec<&str> = n.buttons.iter().map(|b| b.label).collect();
        assert_eq!(labels, ["Open PR", "View log"]);
        assert_eq!(n.buttons[0].target, Open::Url("https://github.com/acme/webapp/pull/42".into()));
        let dead = notice_for(&Event::Failed { job: job(13), error: "exit 1".into(), dead: true }, &on).unwrap();
        let labels: Vec<&str> = dead.buttons.iter().map(|b| b.label).collect();
        assert_eq!(labels, ["View log", "Retry"]);
        assert_eq!(dead.buttons[1].target, Open::Retry(13));
        let (_, burst) = render(&[n.clone(), dead]);
        assert!(!burst.contains("Draft PR"), "a burst lists each job's own line: {burst}");
    }

    /// Another machine's finish is told as such, titled with the job, with its facts; off
    /// toggles silence it.
    #[test]
    fn another_machines_finish_reads_as_such() {
        let mut j = devpilot_app::queue::JobRow::bare(7, "o", devpilot_app::job::JobState::Completed);
        j.title = Some("ENG-7 Fix login redirect".into());
        j.claimed_by = Some("desktop".into());
        j.summary = Some("fixed the redirect".into());
        let o = devpilot_app::Outcome {
            job: j,
            line: "Draft PR #42 · 12 min on desktop".into(),
            pr: Some("https://github.com/a/b/pull/42".into()),
        };
        let n = notice_of_elsewhere(&o, &NotifySettings::default()).unwrap();
        let (title, body) = render(&[n]);
        assert_eq!(title, "ENG-7 Fix login redirect");
        assert_eq!(body, "Draft PR #42 · 12 min on desktop\nFinished on desktop: fixed the redirect");
        let off = NotifySettings { completed: false, ..Default::default() };
        assert!(notice_of_elsewhere(&o, &off).is_none());
    }
}
