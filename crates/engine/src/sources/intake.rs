//! One intake turn of a source: take the fleet's turn (one conditional UPDATE; zero rows
//! means another machine has it), read what changed since the cursor, make each issue the
//! source takes into exactly one job, update the waiting ones, cancel those whose issue left
//! the filter, and end the turn with a write fenced by it.
//!
//! The label pins the text ([`super::approval`]): an issue becomes a job only under an
//! approval (its label applied by someone with write access), a waiting job takes new text
//! only under a newer one, and an edit after approval is said once, on the issue and in the
//! source's status, and run never. Only an issue that is new to the intake or whose text
//! changed costs the tracker calls that check this.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use super::approval::{approval_of, with_approval, Verdict, EDITED_AFTER_APPROVAL};
use super::error::TrackerError;
use super::github::Writers;
use super::linear;
use super::settings::SourceSettings;
use super::tracker::{self, Item, TrackerClient, TurnRead};
use devpilot_store::job::JobState;
use devpilot_store::queue::{Holds, JobOptions, KeyedJob, Queue, Start, Turn, TurnEnd, WatchState};

/// Below this many requests left in the tracker's window, the source rests until the reset.
pub const RATE_FLOOR: i64 = 100;

/// A configured source, bound to its row.
#[derive(Clone, Debug)]
pub struct Bound {
    pub name: String,
    pub id: i64,
    pub settings: SourceSettings,
}

impl Bound {
    /// Who the intake's own writes name (a cancel's `cancel_requested_by`, history).
    pub fn actor(&self) -> String {
        format!("intake:{}", self.name)
    }
}

/// What a turn did, by unique key.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PollReport {
    pub source: String,
    pub added: Vec<(String, i64)>,
    pub updated: Vec<(String, i64)>,
    pub cancelled: Vec<(String, i64)>,
    /// Issues whose text changed after their label's approval: each job keeps (or was
    /// refused with) the approved text.
    pub edited: Vec<(String, i64)>,
    /// Issues with the label that nobody with write access applied: no job.
    pub unapproved: Vec<String>,
    /// Issues whose approval could not be read, and why: no job, and a live job unchanged.
    pub unreadable: Vec<(String, String)>,
    /// Issues that changed or were labelled after this turn read their text (the key, and
    /// the version read): nothing is done with that text, and the next turn reads them again.
    pub reread: Vec<(String, String)>,
    /// How many issues the tracker returned.
    pub seen: usize,
}

impl PollReport {
    /// `added linear:ENG-7 as job #12`, one line each.
    pub fn lines(&self) -> Vec<String> {
        let each = |verb: &str, list: &[(String, i64)]| -> Vec<String> {
            list.iter().map(|(k, id)| format!("{verb} {k} as job #{id}")).collect()
        };
        let mut out = each("added", &self.added);
        out.extend(each("updated", &self.updated));
        out.extend(each("cancelled", &self.cancelled));
        out.extend(self.edited.iter().map(|(k, id)| format!("{k} (job #{id}) was {EDITED_AFTER_APPROVAL}")));
        out.extend(
            self.unapproved.iter().map(|k| format!("{k}: its label was not applied by anyone with write access")),
        );
        out.extend(self.unreadable.iter().map(|(k, why)| format!("{k}: not taken: {why}")));
        out.extend(self.reread.iter().map(|(k, _)| format!("{k}: changed while it was read; read again next turn")));
        out
    }
}

/// Why a turn did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error(transparent)]
    Tracker(#[from] TrackerError),
    #[error(transparent)]
    Store(#[from] devpilot_store::Error),
}

/// What a try at the turn did: the turn's report if this machine took it, and when the
/// source's next turn is due (so a machine that lost waits until then, not a tick).
#[derive(Debug)]
pub struct Tried {
    pub report: Option<PollReport>,
    pub next_in: Duration,
    /// The turn this machine took (its later writes name it), if it took one.
    pub turn: Option<i64>,
    /// What the source held when the turn was tried (watched pull requests, an outbox
    /// backlog), so an idle machine skips the reads that would find nothing.
    pub holds: Holds,
}

/// Who takes a turn, and who hears of each job it writes.
pub struct Taker<'a> {
    pub queue: &'a Queue,
    pub orchestrator_id: &'a str,
    pub machine: &'a str,
    pub max_attempts: i32,
    /// Told at each job the turn adds or updates (the machine's "poll now"): a turn that
    /// writes many jobs lets its machine claim the first while it reads the next issues, and
    /// on SQLite, which has no NOTIFY, that is the only word a job is there.
    pub wrote: Option<&'a mpsc::UnboundedSender<()>>,
}

/// Runs one turn of `source` if it is due (or `force`).
pub async fn poll(
    taker: &Taker<'_>,
    source: &Bound,
    client: &TrackerClient,
    force: bool,
) -> Result<Tried, IntakeError> {
    let Taker { queue, orchestrator_id, machine, max_attempts, wrote } = *taker;
    let tried = queue.try_turn(source.id, machine, force).await?;
    let next_in = Duration::from_millis(tried.next_in_ms.max(0) as u64);
    let holds = tried.holds;
    let Some(turn) = tried.turn else { return Ok(Tried { report: None, next_in, turn: None, holds }) };
    let (cursor, etag) = (turn.cursor.as_deref(), turn.etag.as_deref());
    let read = match tracker::read(client, &source.name, &source.settings, cursor, etag).await {
        Ok(read) => read,
        Err(e) => {
            fail_turn(queue, &turn, &e).await;
            return Err(e.into());
        }
    };
    if read.truncated {
        tracing::warn!(source = %source.name, "more changed issues than one turn reads; the next turn goes on");
    }
    let ctx = Ctx { queue, orchestrator_id, source, client, max_attempts, wrote };
    let report = apply(&ctx, &read.items).await?;
    let (cursor, etag) = next_cursor(&read, &report);
    let end = TurnEnd {
        cursor,
        etag,
        hold_until: read.rate.hold_until(RATE_FLOOR),
        rate_remaining: read.rate.remaining,
        rate_reset_at: read.rate.reset_at_ms,
    };
    if !queue.end_turn(&turn, &end).await? {
        tracing::info!(source = %source.name, "a newer intake turn ended first; its cursor stands");
    }
    Ok(Tried { report: Some(report), next_in, turn: Some(turn.turn), holds })
}

/// Where the next turn reads from: the newest issue read (`None` keeps the current cursor),
/// but never past an issue whose text was read too early, so the next turn reads it again;
/// and then with no `ETag`, which belongs to the query from the newest. Times are compared
/// as times, not as text.
fn next_cursor(read: &TurnRead, report: &PollReport) -> (Option<String>, Option<String>) {
    if report.reread.is_empty() {
        return (read.newest.clone(), read.etag.clone());
    }
    let ms = |t: &str| crate::span::parse_time_ms(t).ok();
    let oldest = report.reread.iter().filter_map(|(_, v)| Some((ms(v)?, v))).min_by_key(|(t, _)| *t);
    let cursor = match (&read.newest, oldest) {
        (Some(newest), Some((t, v))) if ms(newest).is_none_or(|n| t < n) => Some(v.clone()),
        (newest, _) => newest.clone(),
    };
    (cursor, None)
}

/// Keeps the error on the source's row; a rate limit holds the source until its reset.
async fn fail_turn(queue: &Queue, turn: &Turn, e: &TrackerError) {
    if let Err(db) = queue.turn_failed(turn, &e.to_string(), e.reset_at_ms()).await {
        tracing::warn!(error = %db, "could not record the source's error");
    }
}

/// What a turn's writes need.
struct Ctx<'a> {
    queue: &'a Queue,
    orchestrator_id: &'a str,
    source: &'a Bound,
    client: &'a TrackerClient,
    max_attempts: i32,
    wrote: Option<&'a mpsc::UnboundedSender<()>>,
}

impl Ctx<'_> {
    /// A job was written: its machine may claim it now.
    fn tell(&self) {
        if let Some(w) = self.wrote {
            let _ = w.send(());
        }
    }
}

/// Makes the issues read into jobs: add, update or cancel, each at most once per key.
async fn apply(ctx: &Ctx<'_>, items: &[Item]) -> Result<PollReport, IntakeError> {
    let (queue, orchestrator_id, source) = (ctx.queue, ctx.orchestrator_id, ctx.source);
    let mut writers = Writers::new();
    let mut report = PollReport { source: source.name.clone(), seen: items.len(), ..Default::default() };
    // The same issue may come twice across pages if it changed during the read: the
    // newest version wins.
    let mut latest: HashMap<&str, &Item> = HashMap::new();
    for i in items {
        let newer = latest.get(i.key.as_str()).is_none_or(|seen| seen.version <= i.version);
        if newer {
            latest.insert(&i.key, i);
        }
    }
    let keys: Vec<String> = latest.keys().map(|k| k.to_string()).collect();
    let mut newest_job: HashMap<String, KeyedJob> = HashMap::new();
    for job in queue.jobs_by_key(orchestrator_id, &keys).await? {
        newest_job.entry(job.unique_key.clone()).or_insert(job);
    }
    let mut ordered: Vec<&Item> = latest.into_values().collect();
    ordered.sort_by(|a, b| a.key.cmp(&b.key));
    for item in ordered {
        let key = item.key.clone();
        let job = newest_job.get(&key);
        // Another source's job (or a job of the same key added by hand) is never this
        // source's to update or cancel; while it exists, this source adds none either.
        if job.is_some_and(|j| j.source_id != Some(source.id)) {
            continue;
        }
        // A read older than what the job already reflects (a turn that stalled while a newer
        // one ran) changes nothing.
        if job.is_some_and(|j| linear::version_of(&j.payload).is_some_and(|v| v > item.version.as_str())) {
            continue;
        }
        if item.matches {
            take(ctx, item, job, &mut writers, &mut report).await?;
        } else if let Some(job) = job.filter(|j| j.live() && item.left) {
            if let Some(outcome) = queue.cancel(job.id, &source.actor()).await? {
                tracing::info!(key, job = job.id, ?outcome, "the issue left the source's filter: cancelled");
                report.cancelled.push((key, job.id));
            }
        } else if let Some(job) = job.filter(|j| j.state == JobState::Completed && item.left) {
            // The issue lost its label (or closed): its pull request's review loop ends.
            if queue.end_watch(job.id, None, WatchState::Unlabelled).await? {
                tracing::info!(key, job = job.id, "the issue left the source's filter: its review loop ended");
            }
        }
    }
    Ok(report)
}

/// An issue the source takes: a job if it has none (or only one the intake itself cancelled,
/// when the label was applied again since), or its live job told of new text. A job that
/// completed, died or was cancelled by a person is never added again by the intake: the
/// same issue is never dispatched twice (a person requeues it on purpose).
async fn take(
    ctx: &Ctx<'_>,
    item: &Item,
    job: Option<&KeyedJob>,
    writers: &mut Writers,
    report: &mut PollReport,
) -> Result<(), IntakeError> {
    let actor = ctx.source.actor();
    let again = |j: &KeyedJob| j.state == JobState::Cancelled && j.cancelled_by.as_deref() == Some(&actor);
    // A repo found by remote depends on which machine polled (its clone may have another
    // name than the repository): a live job keeps the one it was added with.
    let kept;
    let item = match job {
        Some(j) if ctx.source.settings.repo_from_remote && j.live() => {
            let mut same = item.clone();
            match j.payload.get("repo") {
                Some(r) => same.payload["repo"] = r.clone(),
                None => drop(same.payload.as_object_mut().map(|p| p.remove("repo"))),
            }
            kept = same;
            &kept
        }
        _ => item,
    };
    match job {
        Some(j) if j.live() && refused(&j.payload) => refuse(ctx, &item.key, j.id, report).await,
        Some(j) if j.live() && linear::same_task(&j.payload, &item.payload) => Ok(()),
        Some(j) if j.live() => changed(ctx, item, j, writers, report).await,
        Some(j) if !again(j) => Ok(()),
        _ => add(ctx, item, job, writers, report).await,
    }
}

/// A live job's issue has new text: a waiting job takes it under a newer approval; else the
/// job keeps what was approved and the issue is told, once.
async fn changed(
    ctx: &Ctx<'_>,
    item: &Item,
    j: &KeyedJob,
    writers: &mut Writers,
    report: &mut PollReport,
) -> Result<(), IntakeError> {
    let verdict = tracker::approval(ctx.client, &ctx.source.settings, item, writers).await?;
    let payload = match verdict {
        None => item.payload.clone(),
        Some(Verdict::Approved(a)) if approval_of(&j.payload) != Some(a.id.as_str()) => {
            with_approval(&item.payload, &a)
        }
        Some(Verdict::Unreadable(why)) => {
            report.unreadable.push((item.key.clone(), why));
            return Ok(());
        }
        Some(Verdict::ReadTooEarly) => {
            report.reread.push((item.key.clone(), item.version.clone()));
            return Ok(());
        }
        Some(_) => {
            if ctx.queue.edited_after_approval(j.id, &ctx.source.actor(), EDITED_AFTER_APPROVAL).await? {
                tracing::info!(key = item.key, job = j.id, "{EDITED_AFTER_APPROVAL}");
                report.edited.push((item.key.clone(), j.id));
            }
            return Ok(());
        }
    };
    if j.waiting() && ctx.queue.update_waiting(j.id, &payload, &ctx.source.actor()).await? {
        report.updated.push((item.key.clone(), j.id));
        ctx.tell();
    }
    Ok(())
}

/// An issue with no live job: a job under a new approval, none while the approval is the
/// one the intake already acted on (a close and reopen), and a refused one when the issue
/// changed after its approval.
async fn add(
    ctx: &Ctx<'_>,
    item: &Item,
    prior: Option<&KeyedJob>,
    writers: &mut Writers,
    report: &mut PollReport,
) -> Result<(), IntakeError> {
    let verdict = tracker::approval(ctx.client, &ctx.source.settings, item, writers).await?;
    let acted_on = |id: &str| prior.is_some_and(|j| approval_of(&j.payload) == Some(id));
    let (payload, start) = match verdict {
        None => (item.payload.clone(), Start::Now),
        Some(Verdict::Unapproved) => {
            report.unapproved.push(item.key.clone());
            return Ok(());
        }
        Some(Verdict::Unreadable(why)) => {
            report.unreadable.push((item.key.clone(), why));
            return Ok(());
        }
        Some(Verdict::ReadTooEarly) => {
            report.reread.push((item.key.clone(), item.version.clone()));
            return Ok(());
        }
        Some(Verdict::Approved(a) | Verdict::ChangedAfter(a)) if acted_on(&a.id) => return Ok(()),
        Some(Verdict::Approved(a)) => (with_approval(&item.payload, &a), Start::Now),
        // Added not to start for a year and refused at once: no machine can claim it first.
        Some(Verdict::ChangedAfter(a)) => (mark_refused(with_approval(&item.payload, &a)), Start::After(A_YEAR)),
    };
    let opts = JobOptions {
        key: Some(item.key.clone()),
        priority: item.priority,
        max_attempts: ctx.max_attempts,
        source: Some(ctx.source.id),
        start,
        ..Default::default()
    };
    let added = ctx.queue.enqueue_keyed(ctx.orchestrator_id, &payload, &opts).await?;
    if added.existing.is_some() {
        return Ok(());
    }
    if refused(&payload) {
        return refuse(ctx, &item.key, added.id, report).await;
    }
    report.added.push((item.key.clone(), added.id));
    ctx.tell();
    Ok(())
}

/// How far ahead a refused job is added (it is cancelled in the next statement).
const A_YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// A payload added only to be refused (kept so that a turn cut between the two finishes it).
fn mark_refused(mut payload: serde_json::Value) -> serde_json::Value {
    if let Some(a) = payload.pointer_mut("/source/approval").and_then(serde_json::Value::as_object_mut) {
        a.insert("changed_after".into(), true.into());
    }
    payload
}

fn refused(payload: &serde_json::Value) -> bool {
    payload.pointer("/source/approval/changed_after").and_then(serde_json::Value::as_bool) == Some(true)
}

/// Cancels job `id`, added for an issue that changed after its approval, with the reason.
async fn refuse(ctx: &Ctx<'_>, key: &str, id: i64, report: &mut PollReport) -> Result<(), IntakeError> {
    if ctx.queue.refuse_edited(id, &ctx.source.actor(), EDITED_AFTER_APPROVAL).await? {
        tracing::info!(key, job = id, "{EDITED_AFTER_APPROVAL}: not added");
        report.edited.push((key.to_string(), id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(newest: Option<&str>) -> TurnRead {
        TurnRead { newest: newest.map(str::to_string), etag: Some("W/\"e\"".into()), ..Default::default() }
    }

    fn reread(versions: &[&str]) -> PollReport {
        let reread = versions.iter().map(|v| ("github:acme/webapp#1".to_string(), v.to_string())).collect();
        PollReport { reread, ..Default::default() }
    }

    /// An issue read too early holds the cursor at its version (the oldest of them, compared
    /// as times), with no ETag, so the next turn reads it again; a turn that keeps its cursor
    /// (`newest` is `None`) keeps it still; with none read too early, nothing changes.
    #[test]
    fn an_issue_read_too_early_holds_the_cursor() {
        let newest = "2026-12-01T10:00:09Z";
        assert_eq!(next_cursor(&read(Some(newest)), &reread(&[])), (Some(newest.into()), Some("W/\"e\"".into())));
        let pinned = next_cursor(&read(Some(newest)), &reread(&["2026-12-01T10:00:05Z", "2026-12-01T10:00:03.000Z"]));
        assert_eq!(pinned, (Some("2026-12-01T10:00:03.000Z".into()), None));
        assert_eq!(next_cursor(&read(None), &reread(&["2026-12-01T10:00:03Z"])), (None, None));
        assert_eq!(next_cursor(&read(Some(newest)), &reread(&["garbage"])), (Some(newest.into()), None));
    }
}
