//! The runner: prepares a job's place (its git worktree, the repo's setup), starts one agent
//! per claim, stops it when told (and why) or when its watchdog trips, keeps the tail of its
//! output in the database, and reports the outcome with fenced writes. A job's task never
//! decides *whether* to stop; the machine does (a hand-off, a lost or expired lease, a user's
//! cancel) through the job's [`Cancel`]. A hand-off of a job with a worktree commits and
//! pushes its work first, and the release names the branch.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::conversation;
use super::job::Outcome;
pub use super::job::{Cancel, CancelReason, Completer, JobCtx, JobDone, Rider};
use super::lease::{Order, Standing};
use super::report::{report, report_exit, report_with_worktree};
use super::scratch::Scratch;
use super::status::{Event, JobRef};
use crate::agent::{AgentExit, AgentResult, Launch, LogSpan, RunningAgent, StartError};
use crate::preset::trust::ProjectConfig;
use crate::preset::Conversation;
use crate::worktree::{Workspaces, Worktree};
use devpilot_store::error::Error;
use devpilot_store::job::event;
use devpilot_store::queue::{Claim, Fence, MachineStore};
use devpilot_store::retry::{self, Budget};
use devpilot_store::spec::JobSpec;

/// The most of an agent's log kept in the database for other machines to watch.
pub const LOG_TAIL_BYTES: u64 = 16 * 1024;

/// Why a job's place could not be prepared.
enum NotReady {
    /// This machine cannot run agents now (say, its log directory is unwritable): hand the
    /// job back and stop claiming.
    Machine(Error),
    /// The job's worktree or setup failed: the attempt fails with this.
    Job(String),
    /// The machine stopped the job while it was being prepared (and why).
    Stopped(CancelReason),
    /// This machine may not run the job (a tracker's job it cannot confine): hand it back
    /// for a machine that can, and go on claiming.
    Refused(String),
}

/// Where a job's agent runs, once prepared.
struct Place {
    log: Option<std::fs::File>,
    spec: JobSpec,
    worktree: Option<Worktree>,
    /// A job with no repo: a fresh directory of its own, removed when the job's task ends.
    scratch: Option<Scratch>,
    /// How its agent is confined (None: unconfined, said in the job's history).
    sandbox: Option<crate::sandbox::Plan>,
    /// Why its agent runs unconfined, for the job's history, when it does.
    unconfined: Option<String>,
}

/// How a job's agent runs: confined by its sandbox's plan, or unconfined and why.
#[derive(Default)]
struct Confined {
    plan: Option<crate::sandbox::Plan>,
    unconfined: Option<String>,
}

/// Runs `claim` to its end and reports it.
pub async fn run_job(ctx: Arc<JobCtx>, claim: Claim, cancel: Cancel) {
    let job = JobRef::of(&claim);
    let fence = claim.fence;
    let prepared = tokio::select! {
        biased;
        _ = cancel.token.cancelled() => Err(NotReady::Stopped(cancel.reason())),
        p = prepare(&ctx, &claim) => p,
    };
    let Place { log, spec, worktree, scratch, sandbox, unconfined } = match prepared {
        Ok(p) => p,
        Err(why) => return not_ready(&ctx, job, why).await,
    };
    let noted = unconfined.map(|why| note_unconfined(&ctx, fence, why));
    let (mut launch, talk) = launch_of(&ctx, &claim, spec, worktree.as_ref(), scratch.as_ref()).await;
    launch.sandbox = sandbox;
    let mut agent = match ctx.agent.start(&claim, &ctx.env, &launch, log).await {
        Ok(a) => a,
        Err(e) => return not_started(&ctx, job, worktree.as_ref(), e, noted).await,
    };
    let span = agent.log().cloned();
    let tail = span.clone().map(|s| spawn_log_tail(&ctx, fence, s));
    let watch = super::governed::Watch {
        governed: &ctx.governed,
        store: &ctx.store,
        events: &ctx.events,
        job: &job,
        spent_before: claim.spent_usd,
    };
    let capped = watch.until_capped(span.clone());
    let outcome = supervise(&ctx, &mut agent, &cancel, span.clone(), talk.as_ref(), fence.job, capped).await;
    noted_first(noted).await;
    let refused = agent.refused_hosts();
    drop(agent);
    after_jail(&ctx, fence, &launch, worktree.as_ref(), refused).await;
    if let Some(t) = tail {
        t.abort();
        // The last words, on a task of its own: no outcome waits on a slow database. An
        // agent that printed nothing has no words to store (that was one statement per job).
        if let Some(s) = span.clone().filter(|s| s.written() > 0) {
            let ctx = ctx.clone();
            tokio::spawn(async move { store_tail(&ctx, fence, &s).await });
        }
    }
    let outcome = match outcome {
        Outcome::Exited(exit, result) => held(&ctx, fence, talk.as_ref(), span.as_ref(), exit, result).await,
        Outcome::Stopped(exit, result) => held(&ctx, fence, None, span.as_ref(), exit, result).await,
        cancelled => cancelled,
    };
    // The conversation goes with the work: saved while a hand-off commits and pushes (on a
    // slow link the two overlap), before the worktree is removed (aider's history is in it)
    // and before the release or park that ends the claim, which fences the save.
    let carried = carries(&outcome, claim.source_id.is_some());
    let carry = async {
        if let (Some(t), true) = (&talk, carried) {
            t.carry(&ctx.store, fence, span.as_ref()).await;
        }
    };
    // A success offers its completion to the next poll ([`ride`]), which frees its slot.
    let rode = matches!(outcome, Outcome::Exited(AgentExit::Success, _) | Outcome::Stopped(AgentExit::Success, _));
    let ev = match (&ctx.workspaces, &worktree) {
        (Some(ws), Some(wt)) => report_with_worktree(&ctx, ws, wt, job, outcome, carry).await,
        _ => {
            carry.await;
            report(&ctx, job, outcome, None).await
        }
    };
    if let Some(ev) = ev {
        let _ = ctx.events.send(ev);
    }
    drop(scratch);
    let _ = ctx.done.send(JobDone { fence, agent_error: None, rider: None, slot_freed: rode });
}

/// An agent that could not start: its history note written, its worktree let go, its job
/// reported not ready.
async fn not_started(
    ctx: &JobCtx,
    job: JobRef,
    worktree: Option<&Worktree>,
    e: StartError,
    noted: Option<tokio::task::JoinHandle<()>>,
) {
    noted_first(noted).await;
    if let (Some(ws), Some(wt)) = (&ctx.workspaces, worktree) {
        ws.finish(wt, false).await;
    }
    let why = match e {
        StartError::Machine(e) => NotReady::Machine(e),
        StartError::Job(msg) => NotReady::Job(msg),
    };
    not_ready(ctx, job, why).await
}

/// Writes "the agent ran unconfined" into the job's history beside the agent's start, not
/// before it: that statement, which every job of an unconfined machine writes, held each
/// slot for a round trip (section (v) of the benchmark: `--sandbox off` ran at half its
/// rate). [`noted_first`] waits for it while the claim is held, before the job's end.
fn note_unconfined(ctx: &Arc<JobCtx>, fence: Fence, why: String) -> tokio::task::JoinHandle<()> {
    let ctx = ctx.clone();
    tokio::spawn(async move { ctx.store.note_agent(&fence, event::UNCONFINED, &why).await })
}

/// Waits for the history note written beside the agent's start, so it comes before the
/// job's end in its history.
async fn noted_first(note: Option<tokio::task::JoinHandle<()>>) {
    if let Some(n) = note {
        let _ = n.await;
    }
}

/// The outcome of an agent that ended, if the claim is still ours: as its preset's CLI
/// reported it (`talk`), else as it exited.
async fn held(
    ctx: &JobCtx,
    fence: Fence,
    talk: Option<&conversation::Talk>,
    span: Option<&LogSpan>,
    exit: AgentExit,
    result: Option<AgentResult>,
) -> Outcome {
    match standing(ctx, fence).await {
        Standing::Held => {
            let (exit, result) = match talk {
                Some(t) => reported(ctx, t, fence, span, exit, result).await,
                None => (exit, result),
            };
            Outcome::Exited(exit, with_summary(result, span))
        }
        // Past the deadline (say the runner was frozen while its agent finished) the
        // outcome is not ours to write, even if the agent did the work.
        Standing::Expired => Outcome::Cancelled(CancelReason::LeaseExpired),
        Standing::Lost => Outcome::Cancelled(CancelReason::LeaseLost),
    }
}

/// Whether an outcome leaves the job to a next attempt that should continue the agent's
/// conversation: a hand-off, a stop at the lease deadline, a park; and a tracker's job's
/// success (`tracked`), whose pull request's review may reopen it as a follow-up.
fn carries(outcome: &Outcome, tracked: bool) -> bool {
    let success = matches!(outcome, Outcome::Exited(AgentExit::Success, _));
    matches!(
        outcome,
        Outcome::Cancelled(CancelReason::HandOff | CancelReason::LeaseExpired)
            | Outcome::Exited(AgentExit::TryLater, _)
            | Outcome::Capped(_)
    ) || (tracked && success)
}

/// A preset's run as its CLI reported it: a failed model call fails the attempt, a usage
/// limit parks it (until its reset, when said), the result's text is the summary; the
/// session id, cost and tokens are kept on the job (fenced). The result file still wins
/// where it says something.
async fn reported(
    ctx: &JobCtx,
    talk: &conversation::Talk,
    fence: Fence,
    span: Option<&LogSpan>,
    exit: AgentExit,
    result: Option<AgentResult>,
) -> (AgentExit, Option<AgentResult>) {
    let mut report = talk.read(span, &exit);
    // A CLI that says no cost (codex, gemini) is priced from its tokens, so the day's
    // spend counts it too.
    if let (None, Some(span)) = (report.usage.cost_usd, span) {
        report.usage.cost_usd = ctx.governed.price_log(span).await;
    }
    if report.usage != Default::default() {
        let write = || ctx.store.record_agent_usage(&fence, &report.usage);
        if let Err(e) = retry::transient("recording the agent's usage", Budget::NOTE, write).await {
            tracing::warn!(job = fence.job, error = %e, "could not record the agent's usage");
        }
    }
    let mut result = result.unwrap_or_default();
    let said = report.summary.map(|s| crate::agent::clean_text(&s));
    if report.exit == Some(AgentExit::TryLater) {
        // A usage limit's words say why the job waits, not what it did.
        result.parked_why = said.or(result.parked_why);
        result.limited = true;
    } else {
        result.summary = result.summary.or(said);
    }
    result.retry_after = result.retry_after.or(report.retry_after);
    (report.exit.unwrap_or(exit), Some(result))
}

/// Where and how the agent starts: its directory, its worktree, and (a preset) its
/// conversation, new or resumed from a carried session.
async fn launch_of(
    ctx: &JobCtx,
    claim: &Claim,
    spec: JobSpec,
    worktree: Option<&Worktree>,
    scratch: Option<&Scratch>,
) -> (Launch, Option<conversation::Talk>) {
    let cwd = match (worktree, scratch) {
        (Some(w), _) => w.path.clone(),
        (None, Some(s)) => s.0.clone(),
        (None, None) => std::path::PathBuf::new(),
    };
    let account = match ctx.governed.account(&ctx.store).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(job = claim.fence.job, error = %e, "could not tell which account the agent runs as");
            None
        }
    };
    let runs = conversation::Runs {
        store: &ctx.store,
        agent: &ctx.agent,
        env: &ctx.env,
        cwd: &cwd,
        account: account.as_deref(),
    };
    let talk = conversation::begin(runs, claim).await;
    let conversation = talk.as_ref().map_or(Conversation::New { id: None }, |t| t.conversation.clone());
    let moved_from = talk.as_ref().and_then(|t| t.moved_from.clone());
    let resumed = matches!(conversation, Conversation::Resume { .. });
    let follow_up = super::follow_up::prompt_of(&ctx.store, claim, resumed).await;
    let config = worktree.map_or(ProjectConfig::Trusted, |w| ProjectConfig::from(&w.start));
    let worktree = worktree.map(|w| (w.path.clone(), w.branch.clone()));
    (Launch { spec, cwd, worktree, talk: conversation, moved_from, config, sandbox: None, follow_up }, talk)
}

/// How the job's agent runs ([`Confining::decide`](super::confine::Confining::decide)): the
/// sandbox's plan, or why it runs unconfined (which the job's history will say). A tracker's
/// job that this machine cannot confine is handed back, not run.
async fn confine(ctx: &JobCtx, claim: &Claim, wt: Option<&Worktree>) -> std::result::Result<Confined, NotReady> {
    use super::confine::Decision;
    if !ctx.agent.is_process() {
        return Ok(Confined::default());
    }
    let fence = claim.fence;
    let private = ctx.env.payload_dir.join(format!("jail-{}-{}", fence.job, fence.token));
    let from_tracker = claim.source_id.is_some();
    match ctx.confining.decide(ctx.workspaces.as_deref(), wt, from_tracker, private).await {
        Decision::Confined(plan) => Ok(Confined { plan: Some(*plan), unconfined: None }),
        Decision::Unconfined(why) => {
            Ok(Confined { plan: None, unconfined: Some(format!("the agent ran unconfined: {why}")) })
        }
        Decision::Refused(why) => Err(NotReady::Refused(why)),
        Decision::Failed(why) => Err(NotReady::Job(why)),
    }
}

/// After a confined agent: its branch taken back into the clone (its commits fetched, and
/// so checked, from the job's own store), the hosts its sandbox refused said in the job's
/// history, and its private directory removed.
async fn after_jail(ctx: &JobCtx, fence: Fence, launch: &Launch, wt: Option<&Worktree>, refused: Vec<(String, u32)>) {
    let Some(plan) = &launch.sandbox else { return };
    if let (Some(ws), Some(wt), Some(view)) = (&ctx.workspaces, wt, &plan.git) {
        if let Err(e) = ws.absorb(wt, view).await {
            tracing::warn!(job = fence.job, error = %e, "could not take the agent's branch back from its store");
            let detail = format!("the agent's commits could not be taken back: {e}");
            ctx.store.note_agent(&fence, event::SANDBOX, &detail).await;
        }
    }
    if let Some(detail) = crate::sandbox::refusals(&refused) {
        tracing::info!(job = fence.job, "{detail}");
        ctx.store.note_agent(&fence, event::EGRESS_REFUSED, &detail).await;
    }
    plan.done();
}

/// Waits for whichever comes first: the agent's exit, a stop (the agent is terminated), the
/// watchdog or (a preset) the API watchdog (likewise).
async fn supervise(
    ctx: &JobCtx,
    agent: &mut RunningAgent,
    cancel: &Cancel,
    span: Option<LogSpan>,
    talk: Option<&conversation::Talk>,
    id: i64,
    capped: impl std::future::Future<Output = super::governed::CapStop>,
) -> Outcome {
    let api_span = span.clone();
    let api = async move {
        match talk {
            Some(t) => t.api_stalled(api_span).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        exit = agent.wait() => Outcome::Exited(exit, result_of(agent, id).await),
        _ = cancel.token.cancelled() => {
            let why = cancel.reason();
            match agent.try_exit() {
                // It finished just as we were told to stop by a hand-off: report the outcome
                // (fenced). After a lost or expired lease the outcome is not ours to write.
                Some(exit) if why == CancelReason::HandOff => Outcome::Exited(exit, result_of(agent, id).await),
                _ => {
                    let grace = if why == CancelReason::HandOff { ctx.grace } else { ctx.kill_grace };
                    let asked = std::time::Instant::now();
                    agent.terminate(grace).await;
                    let took_ms = asked.elapsed().as_millis() as u64;
                    tracing::info!(job = id, took_ms, "the agent stopped ({why:?})");
                    Outcome::Cancelled(why)
                }
            }
        }
        why = ctx.watchdog.tripped(span) => {
            tracing::warn!(job = id, "{why}");
            agent.terminate(ctx.grace).await;
            Outcome::Stopped(AgentExit::Failed(why), None)
        }
        (exit, why) = api => {
            tracing::warn!(job = id, "{why}");
            agent.terminate(ctx.kill_grace).await;
            Outcome::Stopped(exit, Some(AgentResult { parked_why: Some(why), ..Default::default() }))
        }
        // Stopped as a hand-off stops it: with its grace, so the CLI keeps its conversation.
        stop = capped => {
            agent.terminate(ctx.grace).await;
            Outcome::Capped(stop)
        }
    }
}

/// Reads the payload (strictly: a payload that does not parse, or whose `repo` is not the
/// one the pick routed it by, is never run), opens the job's log and gives the agent a place
/// of its own: the job's worktree (created, with the repo's setup where it may run), or for
/// a job with no repo a fresh scratch directory. Never the runner's own directory.
async fn prepare(ctx: &JobCtx, claim: &Claim) -> std::result::Result<Place, NotReady> {
    let spec = JobSpec::parse(&claim.payload).map_err(|e| NotReady::Job(format!("{e}; the job was not run")))?;
    if spec.repo != claim.repo {
        return Err(NotReady::Job(format!(
            "the job was routed as repo {} but its payload says repo {}; the job was not run",
            claim.repo.as_deref().unwrap_or("(none)"),
            spec.repo.as_deref().unwrap_or("(none)")
        )));
    }
    let needs_log = ctx.agent.writes_log() || spec.repo.is_some();
    let mut log = match needs_log.then(|| ctx.env.open_log(claim)).transpose() {
        Ok(l) => l,
        Err(e) => return Err(NotReady::Machine(e)),
    };
    let Some(repo) = spec.repo.clone() else {
        let scratch = match ctx.agent.is_process() {
            true => Some(Scratch::new(&ctx.scratch_root, claim).map_err(NotReady::Machine)?),
            false => None,
        };
        let c = confine(ctx, claim, None).await?;
        return Ok(Place { log, spec, worktree: None, scratch, sandbox: c.plan, unconfined: c.unconfined });
    };
    let Some(ws) = &ctx.workspaces else {
        return Err(NotReady::Job(format!("this machine has no repo '{repo}' configured")));
    };
    let Some(l) = log.as_mut() else {
        return Ok(Place { log: None, spec, worktree: None, scratch: None, sandbox: None, unconfined: None });
    };
    let branch = spec.branch(claim.fence.job);
    let wt = ws
        .prepare(claim.fence.job, &repo, &branch, spec.base.as_deref(), claim.resume_branch.as_deref(), l)
        .await
        .map_err(|e| NotReady::Job(e.to_string()))?;
    let Confined { plan: sandbox, unconfined } = match confine(ctx, claim, Some(&wt)).await {
        Ok(c) => c,
        Err(why) => {
            ws.finish(&wt, false).await;
            return Err(why);
        }
    };
    // The repo's setup runs as its agent would: a setup that ran unconfined is in the job's
    // history even when the agent never starts.
    let setup = ws.setup(&wt, l, &ctx.env.log_path(claim.fence.job), sandbox.as_ref()).await;
    // A CLI that would load an agent's project configuration never starts.
    let refused = || ctx.agent.preset().and_then(|p| p.refusal(&wt));
    if let Some(why) = setup.err().map(|e| e.to_string()).or_else(refused) {
        ws.finish(&wt, false).await;
        if let Some(u) = &unconfined {
            ctx.store.note_agent(&claim.fence, event::UNCONFINED, u).await;
        }
        return Err(NotReady::Job(why));
    }
    Ok(Place { log, spec, worktree: Some(wt), scratch: None, sandbox, unconfined })
}

/// A job whose place could not be prepared, or whose agent could not start.
async fn not_ready(ctx: &JobCtx, job: JobRef, why: NotReady) {
    let (fence, id) = (job.fence(), job.id);
    let agent_error = match why {
        NotReady::Machine(e) => {
            // A broken agent is this machine's problem, not the job's: hand it back unharmed,
            // and tell the machine, which stops claiming until the agent is back.
            tracing::error!(job = id, error = %e, "agent could not start");
            let _ = ctx.events.send(Event::AgentError { job: job.clone(), error: e.to_string() });
            let reason = format!("not run here: {e}");
            let _ = retry::transient("handing back", Budget::WRITE, || ctx.store.release(&fence, &reason, None)).await;
            Some(e)
        }
        NotReady::Job(msg) => {
            // A setup's output is in it: the machine's secrets go before it is logged.
            let msg = ctx.store.redactor().redact(&msg).into_owned();
            tracing::warn!(job = id, "{msg}");
            if let Some(ev) = report_exit(ctx, job, AgentExit::Failed(msg), AgentResult::default(), None).await {
                let _ = ctx.events.send(ev);
            }
            None
        }
        NotReady::Refused(why) => {
            tracing::warn!(job = id, "{why}");
            let reason = format!("not run here: {why}");
            let _ = retry::transient("handing back", Budget::WRITE, || ctx.store.release(&fence, &reason, None)).await;
            None
        }
        NotReady::Stopped(why) => {
            if let Some(ev) = report(ctx, job, Outcome::Cancelled(why), None).await {
                let _ = ctx.events.send(ev);
            }
            None
        }
    };
    let _ = ctx.done.send(JobDone { fence, agent_error, rider: None, slot_freed: false });
}

/// With no summary in the result file, the last line the agent printed.
fn with_summary(result: Option<AgentResult>, span: Option<&LogSpan>) -> Option<AgentResult> {
    let mut r = result.unwrap_or_default();
    if r.summary.is_none() {
        r.summary = span.and_then(LogSpan::last_line);
    }
    Some(r)
}

/// Stores the tail of the agent's log every `log_every` while it grows.
fn spawn_log_tail(ctx: &Arc<JobCtx>, fence: Fence, span: LogSpan) -> tokio::task::JoinHandle<()> {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        // Nothing is worth storing until the agent writes something: our header line alone
        // would cost a statement per job.
        let mut last = Some(0);
        let mut tick = tokio::time::interval(ctx.log_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let written = span.written();
            if last != Some(written) {
                last = Some(written);
                store_tail(&ctx, fence, &span).await;
            }
        }
    })
}

/// One try: the next heartbeat's store carries the same text anyway.
async fn store_tail(ctx: &JobCtx, fence: Fence, span: &LogSpan) {
    let tail = crate::agent::tail_of(&span.path, LOG_TAIL_BYTES);
    if let Err(e) = ctx.store.store_log_tail(&fence, &tail).await {
        tracing::debug!(job = fence.job, error = %e, "could not store the log's tail");
    }
}

/// Asks the lease keeper where this claim stands. No keeper (the machine is going away):
/// held, and the fenced write decides.
async fn standing(ctx: &JobCtx, fence: Fence) -> Standing {
    let (tx, rx) = oneshot::channel();
    if ctx.keeper.send(Order::Standing { fence, reply: tx }).is_err() {
        return Standing::Held;
    }
    rx.await.unwrap_or(Standing::Held)
}

/// What the agent wrote to its result file; a malformed file is logged and ignored.
async fn result_of(agent: &RunningAgent, id: i64) -> Option<AgentResult> {
    match agent.result().await {
        Ok(r) => r,
        Err(why) => {
            tracing::warn!(job = id, "ignoring the agent's result file: {why}");
            None
        }
    }
}

/// Pushes, now and then every `every`, the work in progress that a hand-off could not push
/// (offline, say), and records the branch on its job so the next claim resumes from it.
pub async fn push_pending(ws: Arc<Workspaces>, store: MachineStore, every: Duration, stop: CancellationToken) {
    loop {
        for (job, branch) in ws.push_pending().await {
            if let Err(e) = store.resume_later(job, &branch).await {
                tracing::warn!(job, error = %e, "pushed the work in progress but could not record it on the job");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
