//! The sources service: a machine's intake turns and outbox deliveries, on a task of their
//! own. The poll path only asks ([`Sources::tick`], throttled, never awaited), as it asks
//! maintenance for a sweep; a reportable event of this machine asks for a delivery at once.
//! Failures are logged, kept on the source's row and shown in the machine's [`Status`]; they
//! never reach the poll path, and a source that fails leaves the others and the jobs alone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::status::{Event, Status};
use crate::sources::deliver::{deliver_pending, GithubTokens};
use crate::sources::intake::{self, Bound, Tried};
use crate::sources::keys;
use crate::sources::review;
use crate::sources::{ApiKey, HealthState, SourceHealth, SourceKind, SourceSettings, SourcesCfg};
use crate::sources::{TrackerClient, TrackerError};
use devpilot_store::queue::{Queue, SourceSpec};

/// What the service is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    /// The poll path's tick: take the turns that are due.
    Tick,
    /// A reportable event happened here: deliver now.
    Deliver,
}

/// The poll path's side of the service. Cheap to clone; the service ends when the last
/// clone is dropped.
#[derive(Clone)]
pub struct Sources {
    asks: mpsc::Sender<Ask>,
    cfgs: mpsc::UnboundedSender<SourcesCfg>,
    throttle: Arc<Mutex<Option<Instant>>>,
    every: Arc<Mutex<Duration>>,
}

/// A quarter of the shortest interval, at most a minute (the settings keep an interval at
/// 15 s or more): how often the poll path may ask, and how long a service with nothing
/// scheduled waits.
fn tick_of(cfg: &SourcesCfg) -> Duration {
    let shortest = cfg.sources.values().map(|s| s.interval.get()).min().unwrap_or(Duration::from_secs(60));
    (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(60))
}

/// The most a machine's try at a due turn waits past the due time: enough that a fleet's
/// tries do not meet on the database at one instant (the first one takes the turn, the
/// others learn the next due time from their zero-row try), and little enough that a label
/// waits at most a second more than its source's interval says (when the last turn's review
/// reads end in time). Half a tick used to be the bound: 7.5 s at the default interval,
/// 3.75 s on average for every label.
const MAX_SPREAD: Duration = Duration::from_secs(1);

/// A random wait in `[0, MAX_SPREAD)` (shorter with a very short interval: half a tick).
fn spread(cfg: &SourcesCfg) -> Duration {
    (tick_of(cfg) / 2).min(MAX_SPREAD).mul_f64(rand::random::<f64>())
}

impl Sources {
    /// Starts the service on `queue`. It hears this machine's `events` to deliver at once,
    /// shows how each source is doing in `status` (`Status::sources`), and tells the machine
    /// to `poll_now` at each job a turn writes.
    pub fn spawn(
        queue: Queue,
        cfg: SourcesCfg,
        events: broadcast::Sender<Event>,
        status: watch::Sender<Status>,
        poll_now: mpsc::UnboundedSender<()>,
    ) -> Self {
        let (asks, ask_rx) = mpsc::channel(1);
        let (cfgs, cfg_rx) = mpsc::unbounded_channel();
        let me = Self { asks, cfgs, throttle: Arc::new(Mutex::new(None)), every: Arc::new(Mutex::new(tick_of(&cfg))) };
        let health = initial_health(&cfg);
        let heard = events.subscribe();
        let (pass_ended, passes) = mpsc::unbounded_channel();
        let service = Service {
            queue,
            cfg,
            bound: BTreeMap::new(),
            clients: BTreeMap::new(),
            github_key: None,
            refused: BTreeMap::new(),
            next_try: BTreeMap::new(),
            next_delivery: None,
            outbox_waits: true,
            reviews: BTreeMap::new(),
            pass_ended,
            waiting: BTreeSet::new(),
            events,
            status,
            health,
            poll_now,
        };
        service.publish();
        tokio::spawn(service.run(ask_rx, cfg_rx, heard, passes));
        me
    }

    /// The poll path's ask: at most once per tick, never waiting.
    pub fn tick(&self) {
        let every = self.every.lock().map(|e| *e).unwrap_or(Duration::from_secs(15));
        let Ok(mut last) = self.throttle.lock() else { return };
        if last.is_some_and(|l| l.elapsed() < every) {
            return;
        }
        *last = Some(Instant::now());
        let _ = self.asks.try_send(Ask::Tick);
    }

    /// New settings: the service registers the sources again before its next turn.
    pub fn reconfigure(&self, cfg: SourcesCfg) {
        if let Ok(mut e) = self.every.lock() {
            *e = tick_of(&cfg);
        }
        let _ = self.cfgs.send(cfg);
        // A source just added or changed is registered and polled now, not a tick later.
        let _ = self.asks.try_send(Ask::Tick);
    }
}

/// github.com's API as this machine reaches it (`DEVPILOT_GITHUB_API_URL` in its place).
fn github_com_api() -> String {
    let default = crate::sources::SourceSettings { kind: SourceKind::Github, ..Default::default() };
    default.api_url()
}

fn initial_health(cfg: &SourcesCfg) -> Vec<SourceHealth> {
    cfg.sources
        .iter()
        .map(|(n, s)| SourceHealth { name: n.clone(), kind: s.kind.as_str().into(), ..Default::default() })
        .collect()
}

/// The service's own state.
struct Service {
    queue: Queue,
    cfg: SourcesCfg,
    /// Sources registered on the database, by name.
    bound: BTreeMap<String, Bound>,
    /// A client per source this machine has a usable key for.
    clients: BTreeMap<String, (TrackerClient, ApiKey)>,
    /// The GitHub token pull requests are opened with, once read (`Some(None)`: none here);
    /// read again when the settings change.
    github_key: Option<Option<ApiKey>>,
    /// The key each source's tracker refused: not tried again until it changes.
    refused: BTreeMap<String, ApiKey>,
    /// When this machine next tries each source's turn (when it is due, plus a spread).
    next_try: BTreeMap<String, Instant>,
    /// When the outbox next has a row this machine could take (a retry falls due, another
    /// machine's delivery lease ends), as its last pass learnt.
    next_delivery: Option<Instant>,
    /// Whether a try at a turn since the last delivery pass saw an undelivered outbox row
    /// (or could not say). An idle machine's interval pass (two statements) runs only then;
    /// every machine tries every source's turn each interval, so a row a dead machine left
    /// is still seen within one.
    outbox_waits: bool,
    /// Each source's review-loop pass in flight, on a task of its own: its reads (every
    /// watched pull request, three calls each at least) can take many seconds on a real
    /// tracker, and a delivery must not wait behind them. Aborted when the service ends or
    /// the settings change.
    reviews: BTreeMap<String, AbortOnDropHandle<()>>,
    /// Where a pass says it ended (its source's name).
    pass_ended: mpsc::UnboundedSender<String>,
    /// The sources whose due turn waits for their last pass to end.
    waiting: BTreeSet<String>,
    events: broadcast::Sender<Event>,
    status: watch::Sender<Status>,
    /// How each source is doing here, as `status` shows it.
    health: Vec<SourceHealth>,
    /// The machine's "poll now", told at each job a turn writes: this machine may take it
    /// then, not at its next backed-off poll (the job's label is already a turn old).
    poll_now: mpsc::UnboundedSender<()>,
}

impl Service {
    async fn run(
        mut self,
        mut asks: mpsc::Receiver<Ask>,
        mut cfgs: mpsc::UnboundedReceiver<SourcesCfg>,
        mut heard: broadcast::Receiver<Event>,
        mut passes: mpsc::UnboundedReceiver<String>,
    ) {
        let mut first = true;
        loop {
            // The poll path asks at most once per tick; an idle machine's poll path may rest
            // for minutes, so the service also wakes itself when a source's turn falls due
            // (and at once when it starts).
            let later = if first { Duration::ZERO } else { tick_of(&self.cfg) };
            first = false;
            let wake = self.next_try.values().chain(&self.next_delivery).min().copied();
            let wake = wake.unwrap_or_else(|| Instant::now() + later);
            let ask = tokio::select! {
                a = asks.recv() => match a { Some(a) => a, None => return },
                e = heard.recv() => match e {
                    Ok(e) if reportable(&e) => Ask::Deliver,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                // A source's due turn that waited for its pass is taken now.
                ended = passes.recv() => match ended {
                    Some(name) if self.waiting.remove(&name) => {
                        self.next_try.insert(name, Instant::now());
                        Ask::Tick
                    }
                    _ => continue,
                },
                _ = crate::timer::sleep_until(wake) => Ask::Tick,
            };
            while let Ok(c) = cfgs.try_recv() {
                self.cfg = c;
                self.bound.clear();
                self.clients.clear();
                self.github_key = None;
                self.refused.clear();
                self.next_try.clear();
                self.next_delivery = None;
                self.outbox_waits = true;
                self.reviews.clear();
                self.waiting.clear();
                self.health = initial_health(&self.cfg);
                self.publish();
            }
            if self.cfg.sources.is_empty() {
                continue;
            }
            self.bind().await;
            self.refresh_keys().await;
            if ask == Ask::Tick {
                self.turns().await;
            }
            let due = self.next_delivery.is_some_and(|t| t <= Instant::now());
            if ask == Ask::Deliver || due || self.outbox_waits {
                self.deliveries().await;
            }
        }
    }

    /// Shows the sources' health in the machine's status, if it changed.
    fn publish(&self) {
        self.status.send_if_modified(|s| {
            let changed = s.sources != self.health;
            if changed {
                s.sources = self.health.clone();
            }
            changed
        });
    }

    fn set_health(&mut self, name: &str, f: impl FnOnce(&mut SourceHealth)) {
        if let Some(h) = self.health.iter_mut().find(|h| h.name == name) {
            f(h);
        }
        self.publish();
    }

    /// Registers every configured source not yet bound to its row.
    async fn bind(&mut self) {
        // A source whose jobs would run repo-less and be thrown away waits, and its health
        // says why.
        let waiting: Vec<(String, String)> =
            self.cfg.sources.iter().filter_map(|(n, s)| s.names_no_repo().map(|why| (n.clone(), why))).collect();
        for (name, why) in &waiting {
            let told = self.health.iter().any(|h| h.name == *name && h.message.as_deref() == Some(why.as_str()));
            if !told {
                self.trouble(name, HealthState::Error, why.clone());
            }
        }
        for (name, s) in &self.cfg.sources {
            if self.bound.contains_key(name) || waiting.iter().any(|(n, _)| n == name) {
                continue;
            }
            let filter = s.filter_text();
            let spec = SourceSpec { name, kind: s.kind.as_str(), filter: &filter, interval: s.interval.get() };
            match self.queue.register_source(&self.cfg.orchestrator_id, &spec).await {
                Ok(id) => {
                    // An unmapped GitHub source's jobs run in this machine's clone of its
                    // repository, or wait for a machine that has one.
                    let settings = crate::sources::maps::mapped(s.clone(), &self.cfg.remotes).await;
                    self.bound.insert(name.clone(), Bound { name: name.clone(), id, settings });
                }
                Err(e) => tracing::warn!(source = %name, error = %e, "could not register the source"),
            }
        }
    }

    /// Makes a client for each source that has none: its key is read only then (a source
    /// that works never touches the keychain again), and a source with no key says so once.
    async fn refresh_keys(&mut self) {
        let missing: Vec<(String, SourceSettings)> = self
            .cfg
            .sources
            .iter()
            .filter(|(n, _)| !self.clients.contains_key(*n))
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        if missing.is_empty() {
            return;
        }
        // One lookup per credential: Linear's key, and GitHub's token per API host.
        let mut keys: BTreeMap<String, Option<ApiKey>> = BTreeMap::new();
        for (name, s) in missing {
            let kind = s.kind;
            let account = match kind {
                SourceKind::Linear => kind.as_str().to_string(),
                SourceKind::Github => keys::github_account(&s.api_url()),
            };
            let key = match keys.get(&account) {
                Some(k) => k.clone(),
                None => {
                    let k = self.cfg.keys.for_source(&s).await;
                    keys.insert(account, k.clone());
                    k
                }
            };
            let Some(k) = key else {
                self.trouble(&name, HealthState::NoKey, keys::no_key_here(&s));
                continue;
            };
            if self.refused.get(&name) == Some(&k) {
                continue;
            }
            match TrackerClient::for_source(&s, k.secret()) {
                Ok(c) => {
                    self.set_health(&name, |h| {
                        h.key_from = Some(k.from().into());
                        if h.state == HealthState::NoKey {
                            h.state = HealthState::Starting;
                            h.message = None;
                        }
                    });
                    self.clients.insert(name, (c, k));
                }
                Err(e) => self.trouble(&name, HealthState::WrongKey, e.to_string()),
            }
        }
    }

    /// Takes the turn of each source this machine can poll, if it is due.
    async fn turns(&mut self) {
        let names: Vec<String> = self.bound.keys().cloned().collect();
        for name in names {
            if self.next_try.get(&name).is_some_and(|t| *t > Instant::now()) {
                continue;
            }
            if self.reviews.get(&name).is_some_and(|p| !p.is_finished()) {
                // Its last turn's review pass still reads: a newer turn would end that pass
                // at its next recorded read (each names its turn). The turn waits, as it did
                // when the pass ran on this task, and is taken when the pass says it ended
                // (or a tick later, should that word be lost); deliveries do not wait.
                self.next_try.insert(name.clone(), Instant::now() + tick_of(&self.cfg));
                self.waiting.insert(name);
                continue;
            }
            let (Some(source), Some((client, _))) = (self.bound.get(&name), self.clients.get(&name)) else {
                // No client here (no key, or one the tracker refused): tried again a tick
                // later, when the key is read again. A due time left in the past would wake
                // the service again at once, for ever.
                self.next_try.insert(name, Instant::now() + tick_of(&self.cfg));
                continue;
            };
            self.waiting.remove(&name);
            let (source, client) = (source.clone(), client.clone());
            let c = &self.cfg;
            let taker = intake::Taker {
                queue: &self.queue,
                orchestrator_id: &c.orchestrator_id,
                machine: &c.machine,
                max_attempts: c.max_attempts,
                wrote: Some(&self.poll_now),
            };
            // A turn's interval runs from its try, as the database counts it (`polled_at`),
            // not from its end: a turn that reads and writes for a second would otherwise
            // push every later turn a second back, and each label waits that much longer.
            // A turn that took most of its interval still rests a tick before the next, so
            // a slow tracker is not read back to back.
            let tried_at = Instant::now();
            let tried = intake::poll(&taker, &source, &client, false).await;
            let interval = source.settings.interval.get();
            let due = match tried {
                Ok(t) => self.tried(&name, &source, t, tried_at).await,
                Err(intake::IntakeError::Tracker(e)) => {
                    // The turn's statement saw the outbox, but its answer went with the
                    // error: the next pass looks.
                    self.outbox_waits = true;
                    self.tracker_failed(&source, &e).await;
                    Instant::now() + interval
                }
                Err(intake::IntakeError::Store(e)) => {
                    tracing::warn!(source = %name, error = %e, "the intake turn failed on the database");
                    Instant::now() + tick_of(&self.cfg)
                }
            };
            // Every machine learns the same due time: a random wait of up to a second spreads
            // their tries, and the first one takes the turn; the others learn the next due
            // time from their zero-row try. About one statement per machine per interval.
            // (`next_in` is counted at the try's statement, a moment after `tried_at`: a try
            // that comes that moment early finds the turn not yet due and learns how long.)
            self.next_try.insert(name, due + spread(&self.cfg));
        }
    }

    /// After a try at `source`'s turn, tried at `tried_at`: the turn's report shown, its
    /// review pass started when a pull request is watched. When to try next: an interval
    /// after the try, and after a turn taken, at least a tick after its end.
    async fn tried(&mut self, name: &str, source: &Bound, tried: Tried, tried_at: Instant) -> Instant {
        let Tried { report, next_in, turn, holds } = tried;
        self.outbox_waits |= holds.backlog;
        if let Some(report) = report {
            for line in report.lines() {
                tracing::info!(source = %name, "{line}");
            }
            self.recovered(name);
            self.set_health(name, |h| h.last_poll = Some(report));
        }
        // The review loop's reads (every watched pull request) come after the jobs are
        // written and the machine told, beside the service's work; a source with none
        // watched has none to read.
        if let Some(turn) = turn.filter(|_| holds.watched) {
            self.watch_reviews(source, turn).await;
        }
        let due = tried_at + next_in;
        match turn {
            Some(_) => due.max(Instant::now() + tick_of(&self.cfg)),
            None => due,
        }
    }

    /// Delivers what the outbox holds for the sources this machine has keys for.
    async fn deliveries(&mut self) {
        let ready: Vec<(Bound, TrackerClient)> = self
            .bound
            .values()
            .filter_map(|b| self.clients.get(&b.name).map(|(c, _)| (b.clone(), c.clone())))
            .collect();
        self.next_delivery = None;
        self.outbox_waits = false;
        if ready.is_empty() {
            return;
        }
        let github = self.github_tokens().await;
        match deliver_pending(&self.queue, &self.cfg, &ready, &github).await {
            Ok(next) => self.next_delivery = next.map(|d| Instant::now() + d),
            Err((source, e)) => {
                if let Some(b) = self.bound.get(&source).cloned() {
                    self.tracker_failed(&b, &e).await;
                }
            }
        }
    }

    /// The tokens pull requests are opened and read with, by API host: each GitHub source's,
    /// and github.com's from the keychain (read only when no source has it already).
    async fn github_tokens(&mut self) -> GithubTokens {
        let mut github = GithubTokens::new();
        for (c, k) in self.clients.values() {
            if let Some(host) = c.github_host() {
                github.insert(host, k.clone());
            }
        }
        let home = keys::host_of(&github_com_api()).unwrap_or_default();
        if let std::collections::btree_map::Entry::Vacant(slot) = github.entry(home) {
            if let Some(k) = self.github_com_key().await {
                slot.insert(k);
            }
        }
        github
    }

    /// The review loop's part of a turn this machine took: the source's watched pull
    /// requests read once, and a Linear source's jobs' issues with its client (see
    /// [`crate::sources::review`]), on a task of its own. Its trouble is only logged: the
    /// intake's turn went well, and the next turn reads again.
    async fn watch_reviews(&mut self, source: &Bound, turn: i64) {
        let tokens = self.github_tokens().await;
        let queue = self.queue.clone();
        let (machine, orchestrator_id) = (self.cfg.machine.clone(), self.cfg.orchestrator_id.clone());
        let loops = self.cfg.review_loops.clone();
        let tracker = self.clients.get(&source.name).map(|(c, _)| c.clone());
        let source = source.clone();
        let (name, ended) = (source.name.clone(), self.pass_ended.clone());
        let pass = tokio::spawn(async move {
            let w = review::watch::Watching {
                queue: &queue,
                machine: &machine,
                source: source.id,
                turn,
                loops: &loops,
                tokens: &tokens,
                timeout: source.settings.timeout.get(),
                orchestrator_id: &orchestrator_id,
                name: &source.name,
                settings: &source.settings,
                tracker: tracker.as_ref(),
            };
            match review::watch::pass(&w).await {
                Ok(done) if done.pulls > 0 => tracing::info!(source = %source.name, ?done, "review loop"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(source = %source.name, error = %e, "the review loop's read failed on the database")
                }
            }
            let _ = ended.send(source.name.clone());
        });
        self.reviews.insert(name, AbortOnDropHandle::new(pass));
    }

    /// github.com's token from the keychain (or `GITHUB_TOKEN`), read once.
    async fn github_com_key(&mut self) -> Option<ApiKey> {
        if let Some(k) = &self.github_key {
            return k.clone();
        }
        let k = self.cfg.keys.github_at(&github_com_api()).await;
        self.github_key = Some(k.clone());
        k
    }

    /// A tracker error: a refused key stops the source here; the rest is shown and retried.
    async fn tracker_failed(&mut self, source: &Bound, e: &TrackerError) {
        tracing::warn!(source = %source.name, error = %e, "the tracker failed");
        let state = match e {
            TrackerError::Auth(..) => {
                // This key stays refused here until it changes (a new login, a new variable).
                if let Some((_, k)) = self.clients.remove(&source.name) {
                    self.refused.insert(source.name.clone(), k);
                }
                let line = format!("{}: {e}", self.cfg.machine);
                if let Err(db) = self.queue.source_error(source.id, &line).await {
                    tracing::warn!(error = %db, "could not record the source's error");
                }
                HealthState::WrongKey
            }
            TrackerError::RateLimited { .. } => HealthState::RateLimited,
            TrackerError::Unreachable(..) | TrackerError::Server(..) => HealthState::Offline,
            TrackerError::Refused(..) => HealthState::Error,
        };
        self.trouble(&source.name, state, e.to_string());
    }

    /// A source went wrong: shown, and said once (an event) on the way in.
    fn trouble(&mut self, name: &str, state: HealthState, message: String) {
        let mut changed = false;
        self.set_health(name, |h| {
            changed = h.state != state;
            h.state = state;
            h.message = Some(message.clone());
        });
        if changed {
            let _ = self.events.send(Event::SourceTrouble { source: name.into(), state, message });
        }
    }

    fn recovered(&mut self, name: &str) {
        let mut was_bad = false;
        self.set_health(name, |h| {
            was_bad = !matches!(h.state, HealthState::Ok | HealthState::Starting);
            h.state = HealthState::Ok;
            h.message = None;
        });
        if was_bad {
            let _ = self.events.send(Event::SourceOk { source: name.into() });
        }
    }
}

/// The events of this machine that leave an outbox row to deliver.
fn reportable(e: &Event) -> bool {
    matches!(
        e,
        Event::Claimed { .. }
            | Event::Completed { .. }
            | Event::Failed { .. }
            | Event::Parked { .. }
            | Event::Released { .. }
            | Event::Cancelled { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::{ApiKey, KeyStore};

    fn cfg_every(interval: Duration) -> SourcesCfg {
        let s = SourceSettings { interval: interval.into(), ..Default::default() };
        SourcesCfg {
            orchestrator_id: "o".into(),
            machine: "m".into(),
            sources: [("gh".to_string(), s)].into(),
            max_attempts: 3,
            keys: KeyStore::Given(ApiKey::given("k")),
            pull_requests: Default::default(),
            review_loops: Default::default(),
            remotes: Default::default(),
        }
    }

    /// A machine tries a due turn within a second of its due time at the default interval
    /// (it used to wait up to half a tick, 7.5 s), and the tries are still spread.
    #[test]
    fn a_due_turn_is_tried_within_a_second_of_it() {
        let cfg = cfg_every(Duration::from_secs(60));
        let draws: Vec<Duration> = (0..10_000).map(|_| spread(&cfg)).collect();
        assert!(draws.iter().all(|d| *d < MAX_SPREAD), "{:?}", draws.iter().max());
        assert!(draws.iter().any(|d| *d > MAX_SPREAD / 2), "the tries are spread");
        let short = cfg_every(Duration::from_secs(1));
        assert!((0..1_000).all(|_| spread(&short) < tick_of(&short) / 2), "half a tick when that is less");
    }
}
