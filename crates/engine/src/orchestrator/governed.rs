//! The governor on one machine ([`crate::governor`] decides, the store's statements act):
//! the account its preset runs as, resolved once from the fleet's MAC key; what it may claim
//! (no job while its account is held, none past the day's cap); and while a preset's agent
//! runs, its spend read from what the CLI streams, with the 80 % warning given once and the
//! stop at a cap.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::{broadcast, OnceCell};

use super::status::{Event, JobRef, LossReason};
use crate::agent::{AgentResult, AgentSpec, LogSpan};
use crate::governor::account::{account_of, Account};
use crate::governor::budget::{day_bounds, describe, hold_until, Cap, Caps, Spending, Verdict};
use crate::governor::meter::{Meter, Tail};
use crate::governor::settings::LimitSettings;
use crate::preset::Preset;
use devpilot_store::error::Result;
use devpilot_store::job::JobState;
use devpilot_store::queue::{GovernedPark, Governor, MachineStore, ParkedFor, Queue, RetryAfter, Usage};
use devpilot_store::retry::{self, Budget};

/// How often a running agent's spend is read from its log.
const METER_EVERY: Duration = Duration::from_secs(1);

/// How often the day's spend (the fleet's, the account's) is read again while an agent runs.
const DAY_EVERY: Duration = Duration::from_secs(60);

/// The governor as this machine runs it.
#[derive(Debug)]
pub struct Governed {
    pub limits: LimitSettings,
    /// The zone of the fleet's day, read once (the system's zone is a file read).
    zone: crate::governor::TimeZone,
    agent: AgentSpec,
    machine: String,
    /// The account, once known; `None` inside: an agent with no account (a plain command).
    account: OnceCell<Option<String>>,
}

/// Why a running agent was stopped by a cap, and until when its job waits.
#[derive(Clone, Debug)]
pub struct CapStop {
    pub parked_for: ParkedFor,
    pub why: String,
    /// When the job may run again: now (a job's cap waits for a person) or tomorrow.
    pub until_ms: i64,
    /// What the attempt had spent, by the meter, when it was stopped.
    pub spent_usd: f64,
}

impl Governed {
    pub fn new(limits: LimitSettings, agent: &AgentSpec, machine: &str) -> Self {
        let zone = limits.time_zone();
        Self { limits, zone, agent: agent.clone(), machine: machine.into(), account: OnceCell::new() }
    }

    /// The account this machine's agent runs as (read once: the fleet's MAC key comes from
    /// the database, so two machines with the same key agree on its fingerprint).
    pub async fn account(&self, store: &MachineStore) -> Result<Option<String>> {
        let resolve = || async {
            let account = account_for(store.queue(), store.orchestrator_id(), &self.agent, &self.machine).await?;
            if let Some(a) = &account {
                tracing::info!(account = %a, "the agent runs as {}", a.label());
            }
            Ok(account.map(|a| a.as_str().to_string()))
        };
        self.account.get_or_try_init(resolve).await.cloned()
    }

    /// The account, if it is known already (no statement).
    pub fn known_account(&self) -> Option<String> {
        self.account.get().cloned().flatten()
    }

    /// Today's bounds in the user's zone (ms since the epoch).
    pub fn day(&self) -> (i64, i64) {
        day_bounds(super::bounds::now_ms(), &self.zone)
    }

    /// What this machine may claim now: its account unheld, the day's caps unreached.
    pub async fn governor(&self, store: &MachineStore) -> Result<Governor> {
        let account = self.account(store).await?;
        let daily = self.limits.day_usd.is_some() || self.limits.account_day_usd.is_some();
        Ok(Governor {
            account,
            skew_ms: self.limits.skew.get().as_millis() as i64,
            // Only a day's cap needs the day: a machine with none does no date arithmetic.
            day_start_ms: if daily { self.day().0 } else { 0 },
            day_usd: self.limits.day_usd,
            account_day_usd: self.limits.account_day_usd,
        })
    }

    fn caps(&self) -> Caps {
        Caps::from(&self.limits)
    }

    /// Whether any cap is set: with none, nothing is metered against them.
    pub fn capped(&self) -> bool {
        let c = self.caps();
        c.job.is_some() || c.day.is_some() || c.account_day.is_some()
    }

    /// A meter for this machine's preset, if it runs one.
    fn meter(&self) -> Option<Meter> {
        let AgentSpec::Preset { preset, settings } = &self.agent else { return None };
        let model = model_of(*preset, &settings.args);
        Some(Meter::new(*preset, model, self.limits.prices.clone()))
    }

    /// What the agent's attempt in `span` cost by its streamed usage, read whole once it has
    /// ended (the cap's watch reads only while it runs, and only with a cap set, so it misses
    /// the last lines: gemini's cost is all in its last): the cost the CLI reported, else its
    /// tokens priced. `None` when it says nothing, or the log cannot be read (logged).
    pub async fn price_log(&self, span: &LogSpan) -> Option<f64> {
        let mut meter = self.meter()?;
        let mut tail = Tail::new(span.path.clone(), span.start);
        // Off the runtime: a long run's log is many megabytes.
        let read = tokio::task::spawn_blocking(move || {
            tail.read_new(&mut meter)?;
            tail.finish(&mut meter);
            Ok::<_, std::io::Error>(meter.spent().usd)
        })
        .await;
        match read {
            Ok(Ok(usd)) => Some(usd).filter(|c| *c > 0.0),
            Ok(Err(e)) => {
                tracing::warn!(log = %span.path.display(), error = %e, "could not read the agent's log for its spend");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not price the agent's log");
                None
            }
        }
    }
}

/// The account `agent` runs as on machine `machine` of orchestrator `orch` (`None`: not a
/// preset): the fleet's MAC key is read from `q`, so every machine names it alike.
pub async fn account_for(q: &Queue, orch: &str, agent: &AgentSpec, machine: &str) -> Result<Option<Account>> {
    let AgentSpec::Preset { preset, settings } = agent else { return Ok(None) };
    let key = q.mac_key(orch).await?;
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_default();
    let env = |k: &str| std::env::var(k).ok();
    Ok(Some(account_of(*preset, settings, &env, &home, machine, key.bytes())?))
}

/// The model a preset runs with, when its settings' args say: `--model X`, `--model=X`, or
/// `-m X` where `-m` is the model (codex's and gemini's; aider's `-m` is a message). The last
/// one given wins, as with the CLIs' own parsers.
fn model_of(preset: Preset, args: &[String]) -> Option<String> {
    let short = matches!(preset, Preset::Codex | Preset::Gemini);
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--model" || (short && a == "-m") {
            found = it.next().cloned().or(found);
        } else if let Some(model) = a.strip_prefix("--model=") {
            found = Some(model.to_string());
        }
    }
    found.filter(|m| !m.is_empty())
}

/// What a running agent's watch needs.
pub(super) struct Watch<'a> {
    pub governed: &'a Governed,
    pub store: &'a MachineStore,
    pub events: &'a broadcast::Sender<Event>,
    pub job: &'a JobRef,
    /// What the job spent against its own cap before this attempt.
    pub spent_before: f64,
}

impl Watch<'_> {
    /// Reads the agent's spend from its log every second until a cap is reached (then says
    /// why), giving each 80 % warning once. Never ends when no cap is set.
    pub(super) async fn until_capped(&self, span: Option<LogSpan>) -> CapStop {
        let (Some(span), Some(mut meter), true) = (span, self.governed.meter(), self.governed.capped()) else {
            return std::future::pending().await;
        };
        let account = self.governed.known_account();
        let mut tail = Tail::new(span.path.clone(), span.start);
        let (mut day, mut day_read) = (self.governed.day(), None::<(tokio::time::Instant, f64, f64)>);
        let mut tick = tokio::time::interval(METER_EVERY);
        // The warnings the queue has answered for (given now or before, by any machine): not
        // asked again while the spend sits between 80 % and the cap.
        let mut answered = BTreeSet::new();
        loop {
            tick.tick().await;
            if let Err(e) = tail.read_new(&mut meter) {
                tracing::debug!(job = self.job.id, error = %e, "could not read the agent's log for its spend");
            }
            let live = meter.spent().usd;
            if self.governed.day() != day {
                (day, day_read) = (self.governed.day(), None);
            }
            if day_read.is_none_or(|(at, ..)| at.elapsed() >= DAY_EVERY) {
                day_read = self.read_day(day.0, account.as_deref()).await.or(day_read);
            }
            let (fleet, mine) = day_read.map_or((0.0, 0.0), |(_, f, a)| (f, a));
            let s = Spending { job: self.spent_before + live, day: fleet + live, account_day: mine + live };
            match self.governed.caps().judge(&s) {
                Verdict::Under => {}
                Verdict::Warn(cap) => {
                    if !answered.contains(&(cap, day.0)) && self.warn(cap, &s, day.0).await {
                        answered.insert((cap, day.0));
                    }
                }
                Verdict::Over(cap) => return self.stop(cap, &s, day.1, live),
            }
        }
    }

    /// The fleet's and the account's spend today; `None` when the database cannot say.
    async fn read_day(&self, start: i64, account: Option<&str>) -> Option<(tokio::time::Instant, f64, f64)> {
        let read = async {
            let fleet = self.store.spent_since(start, None).await?;
            let mine = match account {
                Some(a) => self.store.spent_since(start, Some(a)).await?,
                None => 0.0,
            };
            Ok::<_, devpilot_store::error::Error>((tokio::time::Instant::now(), fleet, mine))
        };
        read.await.inspect_err(|e| tracing::debug!(error = %e, "could not read today's spend")).ok()
    }

    /// The 80 % warning of `cap`, once: per job for its own cap, per day for the day's.
    /// Gives the warning for `cap` unless the queue says it was given; whether the queue
    /// answered (a failed write is tried again at the next reading).
    async fn warn(&self, cap: Cap, s: &Spending, day_start: i64) -> bool {
        let Some(limit) = self.governed.caps().limit(cap) else { return true };
        let text = describe(cap, spent_of(cap, s), limit);
        let first = match cap {
            Cap::Job => self.store.warn_spend_once(&self.job.fence(), &text).await,
            Cap::Day | Cap::AccountDay => self.store.warn_day_once(day_start).await,
        };
        match first {
            Ok(true) => {
                tracing::warn!(job = self.job.id, "{text}");
                let _ = self.events.send(Event::SpendWarning { job: self.job.clone(), text });
                true
            }
            Ok(false) => true,
            Err(e) => {
                tracing::debug!(job = self.job.id, error = %e, "could not record the spend warning");
                false
            }
        }
    }

    fn stop(&self, cap: Cap, s: &Spending, tomorrow: i64, live: f64) -> CapStop {
        let limit = self.governed.caps().limit(cap).unwrap_or_default();
        let why = describe(cap, spent_of(cap, s), limit);
        let (parked_for, until_ms) = match cap {
            Cap::Job => (ParkedFor::JobCap, super::bounds::now_ms()),
            Cap::Day | Cap::AccountDay => (ParkedFor::DayCap, tomorrow),
        };
        tracing::warn!(job = self.job.id, "{why}: stopping the agent");
        CapStop { parked_for, why, until_ms, spent_usd: live }
    }
}

fn spent_of(cap: Cap, s: &Spending) -> f64 {
    match cap {
        Cap::Job => s.job,
        Cap::Day => s.day,
        Cap::AccountDay => s.account_day,
    }
}

/// The park of a job stopped by a cap or held by its account's usage limit: its work is
/// pushed (`resume_branch`) so any machine resumes it.
pub(super) fn hold_of(account: Option<&str>, parked_for: ParkedFor) -> Option<&str> {
    (parked_for == ParkedFor::Limit).then_some(account).flatten()
}

/// Ends `account`'s hold after a success under it (an extra statement only for a preset).
pub(super) async fn success_under(store: &MachineStore, account: Option<&str>, job: i64) {
    let Some(account) = account else { return };
    match store.end_hold(account).await {
        Ok(true) => tracing::info!(job, account, "a success under {account} ended its hold early"),
        Ok(false) => {}
        Err(e) => tracing::debug!(job, error = %e, "could not end the hold on {account}"),
    }
}

/// Parks a job a cap stopped, after its work was pushed (`carried`): what the attempt spent
/// by the meter is recorded first (the CLI was stopped before it could say), so the day's
/// spend and the job's page count it.
pub(super) async fn park_capped(
    store: &MachineStore,
    job: JobRef,
    stop: &CapStop,
    carried: Option<&crate::worktree::HandOff>,
) -> Option<Event> {
    let fence = job.fence();
    if stop.spent_usd > 0.0 {
        let usage = Usage { cost_usd: Some(stop.spent_usd), ..Default::default() };
        let write = || store.record_agent_usage(&fence, &usage);
        if let Err(e) = retry::transient("recording the agent's usage", Budget::NOTE, write).await {
            tracing::warn!(job = job.id, error = %e, "could not record the stopped agent's spend");
        }
    }
    let park = GovernedPark {
        parked_for: stop.parked_for,
        until_ms: stop.until_ms,
        reason: &stop.why,
        hold: None,
        resume_branch: carried.and_then(|c| c.pushed.as_deref()),
    };
    parked(store, job, &park).await
}

/// Parks a job whose CLI hit its account's usage limit, holding the account fleet-wide in
/// the same statement, until the reset the CLI gave (or the default hold), at most the
/// machine's longest park. Its work was pushed (`pushed`), so any machine may resume it.
pub(super) async fn park_limited(
    (store, governed, max_park): (&MachineStore, &Governed, Duration),
    job: JobRef,
    result: AgentResult,
    pushed: Option<&str>,
) -> Option<Event> {
    let now = super::bounds::now_ms();
    let reset = match result.retry_after {
        Some(RetryAfter::At(ms)) => Some(ms),
        Some(RetryAfter::In(d)) => Some(now.saturating_add(d.as_millis() as i64)),
        _ => None,
    };
    let limits = &governed.limits;
    let longest = now.saturating_add(max_park.as_millis() as i64);
    let until = hold_until(reset, now, limits.default_hold.get()).min(longest);
    let account = governed.known_account();
    let why = result.parked_why.unwrap_or_else(|| "the agent's account hit a usage limit".into());
    let why = match &account {
        Some(a) => format!("{why}; {a} is held on every machine until its reset"),
        None => why,
    };
    let park = GovernedPark {
        parked_for: ParkedFor::Limit,
        until_ms: until,
        reason: &why,
        hold: hold_of(account.as_deref(), ParkedFor::Limit),
        resume_branch: pushed,
    };
    let id = job.id;
    let ev = parked(store, job, &park).await;
    if !limits.resume_after_limit && matches!(ev, Some(Event::Parked { .. })) {
        if let Err(e) = store.queue().set_resume_after_limit(store.orchestrator_id(), id, false).await {
            tracing::warn!(job = id, error = %e, "could not leave the job parked for a person");
        }
    }
    ev
}

/// Writes a governed park (fenced) and says what happened.
async fn parked(store: &MachineStore, job: JobRef, park: &GovernedPark<'_>) -> Option<Event> {
    let fence = job.fence();
    match retry::transient("parking", Budget::WRITE, || store.park_governed(&fence, park)).await {
        Ok(Some((JobState::Cancelled, _))) => Some(Event::Cancelled { job }),
        Ok(Some((_, until))) => Some(Event::Parked { job, until_unix_ms: until }),
        Ok(None) => Some(Event::LeaseLost { job, reason: LossReason::LeaseExpired }),
        Err(e) => {
            tracing::error!(job = job.id, error = %e, "gave up writing the park; the sweep hands the job on");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::PresetSettings;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// The model is read wherever `--model=X` stands, `-m` is the model only where the CLI
    /// says so (codex, gemini; aider's `-m` is a message), and the last one given wins.
    #[test]
    fn model_of_reads_each_spelling() {
        assert_eq!(model_of(Preset::Codex, &args(&["--model=gpt-5", "--full-auto"])).as_deref(), Some("gpt-5"));
        assert_eq!(model_of(Preset::Gemini, &args(&["-m", "gemini-2.5-pro", "-y"])).as_deref(), Some("gemini-2.5-pro"));
        assert_eq!(model_of(Preset::Aider, &args(&["-m", "fix it", "--model", "sonnet"])).as_deref(), Some("sonnet"));
        assert_eq!(model_of(Preset::Aider, &args(&["-m", "fix it"])), None);
        assert_eq!(model_of(Preset::Claude, &args(&["--model", "a", "--model=b"])).as_deref(), Some("b"));
        assert_eq!(model_of(Preset::Codex, &args(&["--model"])), None);
    }

    /// An attempt is priced from its whole log once it ended, with no cap set and its last
    /// line unended (gemini's cost is all in its result line): from the attempt's first byte,
    /// not counting an earlier attempt's.
    #[tokio::test]
    async fn price_log_reads_the_whole_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.log");
        let earlier = r#"{"type":"result","status":"success","stats":{"input_tokens":999000,"output_tokens":9}}"#;
        let init = r#"{"type":"init","session_id":"g-2","model":"gemini-2.5-flash"}"#;
        let result = r#"{"type":"result","status":"success","stats":{"input_tokens":120000,"output_tokens":7000}}"#;
        let head = format!("{earlier}\n");
        std::fs::write(&path, format!("{head}{init}\n{result}")).unwrap();
        let spec = AgentSpec::Preset { preset: Preset::Gemini, settings: PresetSettings::default() };
        let governed = Governed::new(LimitSettings::default(), &spec, "laptop");
        assert!(!governed.capped(), "no cap set");
        let span = LogSpan { path: path.clone(), start: head.len() as u64 };
        let usd = governed.price_log(&span).await.unwrap();
        // gemini-2.5-flash: $0.30 per million in, $2.50 per million out.
        assert!((usd - (120_000.0 * 0.3 + 7_000.0 * 2.5) / 1e6).abs() < 1e-9, "{usd}");
        let none = LogSpan { path: dir.path().join("missing.log"), start: 0 };
        assert_eq!(governed.price_log(&none).await, None, "no log, no cost");
        let plain = Governed::new(LimitSettings::default(), &AgentSpec::Command(vec!["true".into()]), "laptop");
        assert_eq!(plain.price_log(&span).await, None, "a plain command is not metered");
    }
}
