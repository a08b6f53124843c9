//! The lease keeper: renews this machine's leases by their [`Fence`]s, keeps a local deadline
//! for each, and declares losses.
//!
//! The database decides who holds a job; this machine can only learn it by asking. When it
//! cannot ask (a silent partition, a suspend), the **local deadline** decides instead:
//!
//! - it is the boot-clock time at which the last *confirmed* renewal was *sent*, plus the
//!   claim timeout, minus a margin of one heartbeat and the agent's kill grace. The database
//!   stamped that renewal no earlier than it was sent, so no sweep can release the job before
//!   `sent + claim_timeout`: the agent is dead before anyone else can start one;
//! - it runs on [`super::clock::BootClock`], which counts suspended time, so a machine that
//!   slept through its lease stops the agent on its first tick after waking, before it sends
//!   a renewal.
//!
//! Answers may arrive out of order (renewals overlap when one is slow). A confirmation only
//! ever moves a deadline forward, and a pair missing from an answer is a loss only if this
//! machine still holds exactly that (id, token): a late answer about an old claim of a job
//! never cancels a newer claim of the same job.
//!
//! A renewal also brings back which held jobs a user asked to cancel ([`News::CancelAsked`]),
//! so a cancel from any machine costs the holder no extra statement.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::clock::SharedClock;
use devpilot_store::error::{Error, Result};
use devpilot_store::queue::{Fence, MachineStore, Renewed};

/// Sends one renewal for the pairs held; answers with the pairs still held (and which of
/// them a user asked to cancel).
pub trait Renewer: Send + Sync + 'static {
    fn renew(&self, held: Vec<Fence>) -> Pin<Box<dyn Future<Output = Result<Renewed>> + Send + 'static>>;
}

impl Renewer for MachineStore {
    fn renew(&self, held: Vec<Fence>) -> Pin<Box<dyn Future<Output = Result<Renewed>> + Send + 'static>> {
        let store = self.clone();
        Box::pin(async move { store.renew(&held).await })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub heartbeat: Duration,
    pub claim_timeout: Duration,
    /// SIGTERM to SIGKILL when a deadline passes.
    pub kill_grace: Duration,
}

impl Timing {
    /// How long before the database could sweep a lease the machine gives up on it.
    pub fn margin(&self) -> Duration {
        self.heartbeat + self.kill_grace
    }

    /// How often the keeper looks at its deadlines (no query: the clock only).
    fn tick(&self) -> Duration {
        (self.heartbeat / 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// What the keeper tells the machine.
#[derive(Debug)]
pub enum News {
    /// A renewal found this lease gone: swept, and maybe claimed elsewhere.
    Lost(Fence),
    /// No renewal was confirmed before the local deadline.
    Expired(Fence),
    /// A renewal was answered.
    Reached,
    /// A user asked to cancel this held job.
    CancelAsked(Fence),
    /// Someone asked this machine to hand this held job off (`devpilot release --machine`).
    ReleaseAsked(Fence),
    /// A renewal failed or did not answer in time.
    Unreachable(Error),
}

impl PartialEq for News {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (News::Lost(a), News::Lost(b))
            | (News::Expired(a), News::Expired(b))
            | (News::CancelAsked(a), News::CancelAsked(b))
            | (News::ReleaseAsked(a), News::ReleaseAsked(b)) => a == b,
            (News::Reached, News::Reached) => true,
            (News::Unreachable(a), News::Unreachable(b)) => a.to_string() == b.to_string(),
            _ => false,
        }
    }
}

/// What the machine tells the keeper.
pub enum Order {
    /// This machine now holds `pair`; the claim statement was sent at `sent` (boot clock).
    Hold {
        fence: Fence,
        sent: Duration,
    },
    /// This machine no longer holds `pair` (it finished, failed or handed it back).
    Forget(Fence),
    /// Check every deadline and renew now; answer with the pairs lost or expired (after a wake).
    Recheck(oneshot::Sender<Vec<Fence>>),
    /// May the holder of `pair` still write its outcome? Deadlines are checked first, so an
    /// agent that ended while the machine was frozen past its deadline gets a firm no.
    Standing {
        fence: Fence,
        reply: oneshot::Sender<Standing>,
    },
    Retime(Timing),
    /// Renew now (a NOTIFY said a cancel or a release was asked for somewhere).
    RenewNow,
}

/// Where a lease stands, for its holder about to write an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Held,
    /// A renewal found it gone.
    Lost,
    /// Its local deadline passed.
    Expired,
}

struct Lease {
    /// The send time of the last confirmed renewal (or of the claim).
    confirmed: Duration,
}

struct Renewal {
    sent: Duration,
    asked: Vec<Fence>,
    answer: Result<Renewed>,
    reply: Option<oneshot::Sender<Vec<Fence>>>,
}

/// The keeper's state: leases by pair, and when the next renewal is due.
pub struct Keeper<R: Renewer> {
    renewer: R,
    clock: SharedClock,
    timing: Timing,
    leases: HashMap<Fence, Lease>,
    /// Leases that ended here (lost or expired) and whose job has not been forgotten yet.
    ended: HashMap<Fence, Standing>,
    next_renewal: Duration,
    news: mpsc::UnboundedSender<News>,
    /// Renewals sent, for the machine's counters.
    sent: Option<std::sync::Arc<super::stats::Stats>>,
    /// Rechecks waiting for their answer, and the leases that expired meanwhile (their
    /// answer includes them).
    rechecks: usize,
    expired_during_recheck: Vec<Fence>,
}

impl<R: Renewer + Clone> Keeper<R> {
    pub fn new(renewer: R, clock: SharedClock, timing: Timing, news: mpsc::UnboundedSender<News>) -> Self {
        Self {
            renewer,
            clock,
            timing,
            leases: HashMap::new(),
            ended: HashMap::new(),
            next_renewal: Duration::ZERO,
            news,
            sent: None,
            rechecks: 0,
            expired_during_recheck: vec![],
        }
    }

    fn deadline(&self, l: &Lease) -> Duration {
        (l.confirmed + self.timing.claim_timeout).saturating_sub(self.timing.margin())
    }

    /// Declares every lease whose deadline has passed as expired. Runs before any renewal.
    fn expire(&mut self) -> Vec<Fence> {
        let now = self.clock.now();
        let expired: Vec<Fence> =
            self.leases.iter().filter(|(_, l)| self.deadline(l) <= now).map(|(p, _)| *p).collect();
        if self.rechecks > 0 {
            self.expired_during_recheck.extend(expired.iter().copied());
        }
        for p in &expired {
            self.leases.remove(p);
            self.ended.insert(*p, Standing::Expired);
            tracing::warn!(job = p.job, "no renewal confirmed before the local deadline; stopping the agent");
            let _ = self.news.send(News::Expired(*p));
        }
        expired
    }

    fn renew(&mut self, renewals: &mut JoinSet<Renewal>, reply: Option<oneshot::Sender<Vec<Fence>>>) {
        let sent = self.clock.now();
        self.next_renewal = sent + self.timing.heartbeat;
        let asked: Vec<Fence> = self.leases.keys().copied().collect();
        if asked.is_empty() {
            if let Some(r) = reply {
                self.rechecks -= 1;
                let _ = r.send(std::mem::take(&mut self.expired_during_recheck));
            }
            return;
        }
        // Bounded here too, by the current heartbeat: a renewal that cannot answer within one
        // is news (the machine goes offline), not a wait.
        let bound = call_bound(self.timing.heartbeat);
        if let Some(stats) = &self.sent {
            stats.heartbeats.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let call = self.renewer.renew(asked.clone());
        renewals.spawn(async move {
            let answer = tokio::time::timeout(bound, call).await.unwrap_or(Err(Error::Timeout(bound)));
            Renewal { sent, asked, answer, reply }
        });
    }

    fn answered(&mut self, r: Renewal) {
        let mut lost = vec![];
        match r.answer {
            Ok(Renewed { kept, cancel, release }) => {
                let _ = self.news.send(News::Reached);
                for fence in r.asked {
                    let Some(lease) = self.leases.get_mut(&fence) else { continue };
                    if kept.contains(&fence) {
                        if cancel.contains(&fence) {
                            let _ = self.news.send(News::CancelAsked(fence));
                        } else if release.contains(&fence) {
                            let _ = self.news.send(News::ReleaseAsked(fence));
                        }
                        lease.confirmed = lease.confirmed.max(r.sent);
                    } else {
                        self.leases.remove(&fence);
                        self.ended.insert(fence, Standing::Lost);
                        lost.push(fence);
                        let _ = self.news.send(News::Lost(fence));
                    }
                }
            }
            Err(e) => {
                let _ = self.news.send(News::Unreachable(e));
            }
        }
        if let Some(reply) = r.reply {
            self.rechecks -= 1;
            lost.extend(std::mem::take(&mut self.expired_during_recheck));
            let _ = reply.send(lost);
        }
    }

    fn order(&mut self, o: Order, renewals: &mut JoinSet<Renewal>) {
        match o {
            Order::Hold { fence, sent } => {
                if self.leases.is_empty() {
                    self.next_renewal = sent + self.timing.heartbeat;
                }
                self.leases.insert(fence, Lease { confirmed: sent });
            }
            Order::Forget(fence) => {
                self.leases.remove(&fence);
                self.ended.remove(&fence);
            }
            Order::Standing { fence, reply } => {
                self.expire();
                let standing = match self.ended.get(&fence) {
                    Some(s) => *s,
                    // Held, or unknown here: the fenced write decides.
                    None => Standing::Held,
                };
                let _ = reply.send(standing);
            }
            Order::Recheck(reply) => {
                self.rechecks += 1;
                self.expire();
                self.renew(renewals, Some(reply));
            }
            Order::RenewNow => {
                self.expire();
                self.renew(renewals, None);
            }
            Order::Retime(t) => {
                self.timing = t;
                // Renew under the new timing now, rather than at the old interval.
                self.next_renewal = self.clock.now();
            }
        }
    }

    /// Counts each renewal sent in `stats.heartbeats`.
    pub fn counting(mut self, stats: std::sync::Arc<super::stats::Stats>) -> Self {
        self.sent = Some(stats);
        self
    }

    /// Runs until the machine drops its sender.
    pub async fn run(mut self, mut orders: mpsc::UnboundedReceiver<Order>) {
        let mut renewals: JoinSet<Renewal> = JoinSet::new();
        // A fixed grid of ticks while a lease is held: orders and answers arriving between
        // ticks must not push the next look at the deadlines further out. With no lease there
        // is nothing to look at, and no tick: an idle machine (the tray, most of the day)
        // must not wake every second. The grid starts again with the first lease.
        let mut next_tick = tokio::time::Instant::now() + self.timing.tick();
        loop {
            tokio::select! {
                biased;
                o = orders.recv() => match o {
                    Some(o) => {
                        let idle = self.leases.is_empty();
                        self.order(o, &mut renewals);
                        if idle && !self.leases.is_empty() {
                            next_tick = tokio::time::Instant::now() + self.timing.tick();
                        }
                    }
                    None => return,
                },
                Some(done) = renewals.join_next(), if !renewals.is_empty() => {
                    if let Ok(r) = done {
                        self.answered(r);
                    }
                }
                _ = tokio::time::sleep_until(next_tick), if !self.leases.is_empty() => {
                    next_tick += self.timing.tick();
                    if let Some(stats) = &self.sent {
                        stats.lease_ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    self.expire();
                    if !self.leases.is_empty() && self.clock.now() >= self.next_renewal {
                        self.renew(&mut renewals, None);
                    }
                }
            }
        }
    }
}

/// The bound on every database call of a machine with this heartbeat: shorter than the
/// heartbeat, so a silent network is noticed within one.
pub fn call_bound(heartbeat: Duration) -> Duration {
    (heartbeat * 3 / 4).clamp(Duration::from_millis(100), Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::super::clock::{Clock, TestClock};
    use super::*;

    fn f(job: i64, token: i64) -> Fence {
        Fence { job, token }
    }
    use std::sync::{Arc, Mutex};

    /// A renewal the test has not answered yet: what it asked, and where the answer goes.
    type Call = (Vec<Fence>, oneshot::Sender<Result<Renewed>>);

    /// A renewer whose answers the test hands out one by one, in any order.
    #[derive(Clone, Default)]
    struct Scripted {
        calls: Arc<Mutex<Vec<Call>>>,
    }

    impl Renewer for Scripted {
        fn renew(&self, held: Vec<Fence>) -> Pin<Box<dyn Future<Output = Result<Renewed>> + Send + 'static>> {
            let (tx, rx) = oneshot::channel();
            self.calls.lock().unwrap().push((held, tx));
            // An unanswered call hangs, as a silent network does.
            Box::pin(async move { rx.await.unwrap_or(Err(Error::Timeout(Duration::from_secs(1)))) })
        }
    }

    impl Scripted {
        fn count(&self) -> usize {
            self.calls.lock().unwrap().len()
        }

        /// Answers call `i` with `kept`.
        fn answer(&self, i: usize, kept: Vec<Fence>) {
            self.reply(i, kept.into());
        }

        fn reply(&self, i: usize, renewed: Renewed) {
            let (_, tx) = std::mem::replace(&mut self.calls.lock().unwrap()[i], (vec![], oneshot::channel().0));
            let _ = tx.send(Ok(renewed));
        }

        fn asked(&self, i: usize) -> Vec<Fence> {
            self.calls.lock().unwrap()[i].0.clone()
        }
    }

    const T: Timing = Timing {
        heartbeat: Duration::from_secs(1),
        claim_timeout: Duration::from_secs(6),
        kill_grace: Duration::from_secs(1),
    };

    fn start(clock: &TestClock) -> (Scripted, mpsc::UnboundedSender<Order>, mpsc::UnboundedReceiver<News>) {
        start_counting(clock, Arc::default())
    }

    fn start_counting(
        clock: &TestClock,
        stats: Arc<super::super::stats::Stats>,
    ) -> (Scripted, mpsc::UnboundedSender<Order>, mpsc::UnboundedReceiver<News>) {
        let r = Scripted::default();
        let (news_tx, news) = mpsc::unbounded_channel();
        let (orders, rx) = mpsc::unbounded_channel();
        tokio::spawn(Keeper::new(r.clone(), Arc::new(clock.clone()), T, news_tx).counting(stats).run(rx));
        (r, orders, news)
    }

    /// Lets the keeper run until tokio's paused clock has moved `d`.
    async fn advance(d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// The losses among the news so far (renewals that time out also send `Unreachable`).
    fn losses(news: &mut mpsc::UnboundedReceiver<News>) -> Vec<News> {
        drain(news).into_iter().filter(|n| matches!(n, News::Lost(_) | News::Expired(_))).collect()
    }

    fn drain(news: &mut mpsc::UnboundedReceiver<News>) -> Vec<News> {
        let mut v = vec![];
        while let Ok(n) = news.try_recv() {
            v.push(n);
        }
        v
    }

    /// Renewals go out every heartbeat naming (id, token); a confirmed renewal moves the
    /// deadline, so a lease renewed on time never expires.
    #[tokio::test(start_paused = true)]
    async fn renewed_leases_never_expire() {
        let clock = TestClock::new();
        let stats: Arc<super::super::stats::Stats> = Arc::default();
        let (r, orders, mut news) = start_counting(&clock, stats.clone());
        orders.send(Order::Hold { fence: f(7, 3), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(50)).await; // off the tick grid, so no timer ties
        for i in 0..20 {
            advance(Duration::from_millis(1000)).await;
            assert_eq!(r.count(), i + 1, "one renewal per heartbeat");
            assert_eq!(r.asked(i), vec![f(7, 3)]);
            r.answer(i, vec![f(7, 3)]);
        }
        advance(Duration::from_millis(10)).await;
        assert!(drain(&mut news).iter().all(|n| *n == News::Reached));
        assert_eq!(stats.heartbeats.load(std::sync::atomic::Ordering::Relaxed), 20, "each renewal is counted");
    }

    /// A keeper with no lease never wakes (an idle tray must not tick every second), and
    /// the first lease after a long idle spell starts the tick grid again: one renewal a
    /// heartbeat later, not a burst of missed ticks.
    #[tokio::test(start_paused = true)]
    async fn an_idle_keeper_does_not_tick() {
        let clock = TestClock::new();
        let stats: Arc<super::super::stats::Stats> = Arc::default();
        let (r, orders, _news) = start_counting(&clock, stats.clone());
        let ticks = || stats.lease_ticks.load(std::sync::atomic::Ordering::Relaxed);
        advance(Duration::from_secs(600)).await;
        assert_eq!(ticks(), 0, "no lease, no tick");
        orders.send(Order::Hold { fence: f(4, 1), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(1050)).await;
        assert_eq!(r.count(), 1, "one renewal a heartbeat after the hold");
        assert_eq!(ticks(), 2, "two ticks in a heartbeat: the grid starts at the hold");
        r.answer(0, vec![f(4, 1)]);
        orders.send(Order::Forget(f(4, 1))).unwrap();
        advance(Duration::from_millis(10)).await;
        let after = ticks();
        advance(Duration::from_secs(600)).await;
        assert_eq!(ticks(), after, "the last lease forgotten, the ticks stop");
    }

    /// An answer that no longer names the pair is a loss of exactly that pair.
    #[tokio::test(start_paused = true)]
    async fn a_missing_pair_is_a_lost_lease() {
        let clock = TestClock::new();
        let (r, orders, mut news) = start(&clock);
        orders.send(Order::Hold { fence: f(1, 1), sent: clock.now() }).unwrap();
        orders.send(Order::Hold { fence: f(2, 5), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(1050)).await;
        r.answer(0, vec![f(2, 5)]);
        advance(Duration::from_millis(10)).await;
        let n = drain(&mut news);
        assert!(n.contains(&News::Lost(f(1, 1))), "{n:?}");
        assert!(!n.iter().any(|x| matches!(x, News::Lost(Fence { job: 2, .. }))), "{n:?}");
        advance(Duration::from_millis(1000)).await;
        assert_eq!(r.asked(1), vec![f(2, 5)], "a lost lease is no longer renewed");
    }

    /// Answers out of order: a recheck's renewal overtakes a slow regular one, and the slow
    /// one arrives last with stale news about an old claim of job 9 (token 1) after the job
    /// was re-claimed here (token 2). It must not cancel the new claim, and the deadline
    /// counts from the newest confirmation.
    #[tokio::test(start_paused = true)]
    async fn out_of_order_answers_match_pairs_not_ids() {
        let clock = TestClock::new();
        let (r, orders, mut news) = start(&clock);
        orders.send(Order::Hold { fence: f(9, 1), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(1050)).await; // renewal 0 (sent at 1 s) asks for (9, 1)
        orders.send(Order::Forget(f(9, 1))).unwrap();
        orders.send(Order::Hold { fence: f(9, 2), sent: clock.now() }).unwrap();
        let (tx, rx) = oneshot::channel();
        orders.send(Order::Recheck(tx)).unwrap(); // renewal 1, at 1.05 s
        advance(Duration::from_millis(5)).await;
        assert_eq!(r.asked(1), vec![f(9, 2)]);
        r.answer(1, vec![f(9, 2)]);
        assert_eq!(rx.await.unwrap(), vec![]);
        r.answer(0, vec![]); // the stale answer, last: (9, 1) is gone, which is old news
        advance(Duration::from_millis(10)).await;
        assert!(losses(&mut news).is_empty());
        // Deadline: 1.05 + 6 - 2 = 5.05 s (counted from the claim at 0 s it would be 4 s).
        // Later renewals hang and time out.
        advance(Duration::from_millis(3530)).await; // 4.6 s
        assert!(losses(&mut news).is_empty(), "the deadline counts from the newest confirmation");
        advance(Duration::from_millis(1000)).await; // 5.6 s
        assert_eq!(losses(&mut news), vec![News::Expired(f(9, 2))]);
    }

    /// A renewal that hangs (a silent partition) does not hold the deadline back: the lease
    /// expires at claim time + claim timeout - margin, and is not renewed afterwards.
    #[tokio::test(start_paused = true)]
    async fn deadline_passes_while_a_renewal_hangs() {
        let clock = TestClock::new();
        let (r, orders, mut news) = start(&clock);
        orders.send(Order::Hold { fence: f(4, 1), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(3950)).await;
        assert!(losses(&mut news).is_empty());
        advance(Duration::from_millis(200)).await; // 4.1 s > 6 - 2
        assert_eq!(losses(&mut news), vec![News::Expired(f(4, 1))]);
        let calls = r.count();
        advance(Duration::from_secs(5)).await;
        assert_eq!(r.count(), calls, "an expired lease is not renewed");
    }

    /// A suspend longer than the lease: on the first tick after the wake the lease expires,
    /// before any renewal is sent.
    #[tokio::test(start_paused = true)]
    async fn a_wake_after_a_long_suspend_expires_before_any_query() {
        let clock = TestClock::new();
        let (r, orders, mut news) = start(&clock);
        orders.send(Order::Hold { fence: f(5, 1), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(1050)).await;
        r.answer(0, vec![f(5, 1)]);
        advance(Duration::from_millis(100)).await;
        drain(&mut news);
        let before = r.count();
        clock.suspend(Duration::from_secs(3600));
        advance(Duration::from_millis(500)).await; // one tick of monotonic time after the wake
        assert_eq!(losses(&mut news), vec![News::Expired(f(5, 1))]);
        assert_eq!(r.count(), before, "no renewal was sent for a lease the machine slept through");
    }

    /// An agent that ended while the machine was frozen past its deadline: asked whether it may
    /// write the outcome, the keeper looks at the deadline first and says no.
    #[tokio::test(start_paused = true)]
    async fn standing_checks_the_deadline_first() {
        let clock = TestClock::new();
        let (r, orders, _news) = start(&clock);
        orders.send(Order::Hold { fence: f(3, 1), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(1050)).await;
        r.answer(0, vec![f(3, 1)]);
        let ask = |orders: &mpsc::UnboundedSender<Order>| {
            let (tx, rx) = oneshot::channel();
            orders.send(Order::Standing { fence: f(3, 1), reply: tx }).unwrap();
            rx
        };
        assert_eq!(ask(&orders).await.unwrap(), Standing::Held);
        clock.suspend(Duration::from_secs(60)); // no tick has run since
        assert_eq!(ask(&orders).await.unwrap(), Standing::Expired);
    }

    /// A recheck (after a wake) answers with what was lost: expired locally or gone in the
    /// database.
    #[tokio::test(start_paused = true)]
    async fn recheck_reports_losses() {
        let clock = TestClock::new();
        let (r, orders, _news) = start(&clock);
        orders.send(Order::Hold { fence: f(1, 1), sent: clock.now() }).unwrap();
        orders.send(Order::Hold { fence: f(2, 1), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(150)).await;
        let (tx, rx) = oneshot::channel();
        orders.send(Order::Recheck(tx)).unwrap();
        advance(Duration::from_millis(10)).await;
        let i = r.count() - 1;
        r.answer(i, vec![f(2, 1)]);
        assert_eq!(rx.await.unwrap(), vec![f(1, 1)]);
    }

    /// A renewal that names a cancel tells the machine, and the lease stays held; a NOTIFY's
    /// RenewNow sends that renewal at once instead of at the next heartbeat.
    #[tokio::test(start_paused = true)]
    async fn a_cancel_asked_for_arrives_with_the_renewal() {
        let clock = TestClock::new();
        let (r, orders, mut news) = start(&clock);
        orders.send(Order::Hold { fence: f(4, 2), sent: clock.now() }).unwrap();
        advance(Duration::from_millis(50)).await;
        orders.send(Order::RenewNow).unwrap();
        advance(Duration::from_millis(10)).await;
        assert_eq!(r.count(), 1, "RenewNow renews before the heartbeat is due");
        assert_eq!(r.asked(0), vec![f(4, 2)]);
        r.reply(0, Renewed { kept: vec![f(4, 2)], cancel: vec![f(4, 2)], release: vec![] });
        advance(Duration::from_millis(10)).await;
        let got = drain(&mut news);
        assert!(got.contains(&News::CancelAsked(f(4, 2))), "{got:?}");
        assert!(!got.iter().any(|n| matches!(n, News::Lost(_) | News::Expired(_))), "{got:?}");
    }
}
