//! Notifications through notify-rust, one toggle per event.
//!
//! - Bursts are coalesced: events that arrive within [`COALESCE`] of each other become one
//!   notification ("3 jobs finished").
//! - "Database offline" is sent once, only if the database is still offline after
//!   [`OFFLINE_GRACE`], and never in the first [`WAKE_QUIET`] after a wake from sleep (the
//!   network is usually just coming back). "Back online" follows only an offline notice.
//! - notify-rust's blocking `show()` runs on a blocking thread, never on an async worker
//!   (it panics there on Linux). A missing notification daemon is logged, never fatal.
//! - A finished job's notification carries an "Open" action where the server supports
//!   actions: it opens the job's result link as the queue has it when the user clicks (the
//!   pull request a tracker's job opens comes some seconds after the completion), else the
//!   tracker issue the job came from, else the result URL it finished with, else the job in
//!   the window.
//! - A tracker source that cannot work here for want of a usable API key (none, or refused)
//!   is told once as it goes wrong, under the failure toggles; its "Open" opens Settings.
//! - A settings file that could not be parsed and was kept aside at a start is told exactly
//!   once per kept file, whatever the toggles; its "Open" opens Settings.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devpilot_app::orchestrator::Event;
use devpilot_app::Engine;
use serde::Serialize;
use tokio::sync::mpsc;

pub const COALESCE: Duration = Duration::from_millis(1500);
pub const OFFLINE_GRACE: Duration = Duration::from_secs(20);
pub const WAKE_QUIET: Duration = Duration::from_secs(90);

pub use crate::notice::{notice_for, render, Button, Kind, Notice, Open};

/// Runs an "Open" action (set by the app: it has the window).
pub type OnOpen = Arc<dyn Fn(Open) + Send + Sync>;

/// A notification that was shown (or attempted).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Sent {
    pub summary: String,
    pub body: String,
    pub kinds: Vec<Kind>,
    /// `None` when the daemon accepted it; otherwise why not.
    pub error: Option<String>,
    /// The "Open" action offered with it, if the server supports actions.
    pub action: Option<Open>,
    /// The labels of the buttons offered beside it.
    pub buttons: Vec<String>,
}

/// Sends notifications for the engine's events.
#[derive(Clone)]
pub struct Notifier {
    engine: Arc<Engine>,
    on_open: Arc<Mutex<Option<OnOpen>>>,
    recent: Arc<Mutex<VecDeque<Sent>>>,
    started: Arc<AtomicBool>,
}

impl Notifier {
    pub fn new(engine: Arc<Engine>) -> Self {
        Self {
            engine,
            on_open: Arc::default(),
            recent: Arc::new(Mutex::new(VecDeque::new())),
            started: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What an "Open" action does (the app opens a URL or the job's window).
    pub fn set_on_open(&self, f: OnOpen) {
        if let Ok(mut o) = self.on_open.lock() {
            *o = Some(f);
        }
    }

    /// What was sent, newest last (at most 50).
    pub fn recent(&self) -> Vec<Sent> {
        self.recent.lock().map(|r| r.iter().cloned().collect()).unwrap_or_default()
    }

    /// Starts listening (once). Subscribes before it returns, so an event the engine sends
    /// right after is not missed.
    pub fn start(&self) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let (tx, rx) = mpsc::unbounded_channel::<Notice>();
        let me = self.clone();
        let events = self.engine.subscribe();
        tauri::async_runtime::spawn(me.clone().batcher(rx));
        tauri::async_runtime::spawn(watch_set_aside(self.engine.watch_set_aside(), tx.clone()));
        let handed = Arc::new(Mutex::new(Vec::new()));
        tauri::async_runtime::spawn(crate::notify_job::watch_fleet(self.engine.clone(), handed.clone(), tx.clone()));
        tauri::async_runtime::spawn(me.listen(events, handed, tx));
    }

    /// Turns events into notices; the jobs handed off from here go to `handed`, for the fleet
    /// watch.
    async fn listen(
        self,
        mut events: tokio::sync::broadcast::Receiver<Event>,
        handed: Arc<Mutex<Vec<i64>>>,
        tx: mpsc::UnboundedSender<Notice>,
    ) {
        let offline_sent = Arc::new(AtomicBool::new(false));
        let mut offline_timer: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let ev = match events.recv().await {
                Ok(ev) => ev,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(skipped = n, "notifications lagged behind events");
                    continue;
                }
                Err(_) => break,
            };
            let on = self.engine.settings().notify;
            // A finished offline timer leaves the slot free for the next outage.
            if offline_timer.as_ref().is_some_and(|t| t.is_finished()) {
                offline_timer = None;
            }
            match &ev {
                Event::Released { job, .. } => {
                    if let Ok(mut h) = handed.lock() {
                        h.push(job.id);
                    }
                }
                Event::DatabaseOffline { error } => {
                    if offline_timer.is_some() || offline_sent.load(Ordering::SeqCst) {
                        continue;
                    }
                    let (engine, tx, sent, error) =
                        (self.engine.clone(), tx.clone(), offline_sent.clone(), error.clone());
                    offline_timer = Some(tokio::spawn(async move {
                        tokio::time::sleep(OFFLINE_GRACE).await;
                        if engine.status().db_online {
                            return;
                        }
                        if engine.since_wake().is_some_and(|d| d < WAKE_QUIET + OFFLINE_GRACE) {
                            tracing::info!("database offline right after a wake; not notifying");
                            return;
                        }
                        sent.store(true, Ordering::SeqCst);
                        if engine.settings().notify.offline {
                            let _ = tx.send(Notice::plain(
                                Kind::Offline,
                                format!("Nothing is claimed until it is back. {error}"),
                            ));
                        }
                    }));
                }
                Event::DatabaseOnline => {
                    if let Some(t) = offline_timer.take() {
                        t.abort();
                    }
                    if offline_sent.swap(false, Ordering::SeqCst) && on.online {
                        let _ = tx.send(Notice::plain(Kind::Online, "Dispatch carries on.".into()));
                    }
                }
                // A finished or parked job's notice says what its row says (read back first).
                other => {
                    if let Some(n) = notice_for(other, &on) {
                        crate::notify_job::tell(&self.engine, other, n, &tx);
                    }
                }
            }
        }
    }

    /// A hand-off's verdict, at once and on its own (never coalesced with job events): its
    /// title is the verdict; red (critical) when work stayed here. "Open" shows the window.
    pub fn hand_off(&self, v: &devpilot_app::HandOffVerdict) {
        let me = self.clone();
        let summary = format!("DevPilot: {}", v.title);
        // The title says the verdict: the body need not end with it again.
        let text = v.text.trim_end_matches(" Safe to close the lid.");
        let body = if v.before_sleep { format!("Before sleep: {text}") } else { text.to_string() };
        let urgent = !v.safe;
        let open = v.jobs.first().map(|j| Open::Job(j.id));
        tauri::async_runtime::spawn(async move {
            let on_open = me.on_open.lock().ok().and_then(|o| o.clone());
            let (s2, b2) = (summary.clone(), body.clone());
            let res = tokio::task::spawn_blocking(move || show(&s2, &b2, urgent, open, vec![], on_open)).await;
            me.record(summary, body, vec![Kind::HandOff], res);
        });
    }

    /// Logs and keeps what was sent (at most 50, newest last).
    fn record(&self, summary: String, body: String, kinds: Vec<Kind>, res: Result<Shown, tokio::task::JoinError>) {
        let (error, action, buttons) = match res {
            Ok(Ok((action, buttons))) => (None, action, buttons),
            Ok(Err(e)) => (Some(e), None, vec![]),
            Err(e) => (Some(format!("notification thread failed: {e}")), None, vec![]),
        };
        match &error {
            None => tracing::info!(%summary, "notified"),
            Some(e) => {
                tracing::warn!(%summary, error = %e, "cannot show a notification (is a notification daemon running?)")
            }
        }
        if let Ok(mut r) = self.recent.lock() {
            r.push_back(Sent { summary, body, kinds, error, action, buttons });
            while r.len() > 50 {
                r.pop_front();
            }
        }
    }

    async fn batcher(self, mut rx: mpsc::UnboundedReceiver<Notice>) {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + COALESCE;
            while let Ok(Some(n)) = tokio::time::timeout_at(deadline, rx.recv()).await {
                batch.push(n);
            }
            let (summary, body) = render(&batch);
            let kinds = batch.iter().map(|n| n.kind).collect();
            let urgent = batch.iter().any(|n| matches!(n.kind, Kind::Dead | Kind::LeaseLost | Kind::Offline));
            let (s2, b2) = (summary.clone(), body.clone());
            // "Open" and the buttons only for a notification about one job.
            let (open, buttons) = match batch.as_slice() {
                [one] => (one.open.clone(), one.buttons.clone()),
                _ => (None, vec![]),
            };
            let on_open = self.on_open.lock().ok().and_then(|o| o.clone());
            let res = tokio::task::spawn_blocking(move || show(&s2, &b2, urgent, open, buttons, on_open)).await;
            self.record(summary, body, kinds, res);
        }
    }
}

/// One notification per config file set aside (the watch repeats the same value on other
/// changes, such as a dismissal; each file is told once).
async fn watch_set_aside(
    mut rx: tokio::sync::watch::Receiver<Option<devpilot_app::config::SetAside>>,
    tx: mpsc::UnboundedSender<Notice>,
) {
    let mut told: Option<String> = None;
    loop {
        let now = rx.borrow_and_update().clone();
        if let Some(n) = now.as_ref().and_then(|k| set_aside_notice(k, told.as_deref())) {
            told = now.map(|k| k.kept_as);
            let _ = tx.send(n);
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The notice for a config file set aside, unless `told` already names it.
pub fn set_aside_notice(kept: &devpilot_app::config::SetAside, told: Option<&str>) -> Option<Notice> {
    (told != Some(kept.kept_as.as_str())).then(|| Notice {
        kind: Kind::ConfigSetAside,
        subject: None,
        text: format!(
            "It could not be parsed ({}). It was kept as {} and DevPilot started with default settings; nothing was overwritten.",
            kept.reason, kept.kept_as
        ),
        facts: None,
        open: Some(Open::Settings),
        buttons: vec![],
    })
}

/// Blocking: runs on a blocking thread. With `open` and a server that supports actions, the
/// notification offers "Open" and `buttons`, and a thread of its own waits for the click.
/// The action and the buttons offered, if any were.
fn show(
    summary: &str,
    body: &str,
    urgent: bool,
    open: Option<Open>,
    buttons: Vec<Button>,
    on_open: Option<OnOpen>,
) -> Shown {
    let mut n = notify_rust::Notification::new();
    n.appname("DevPilot").summary(summary).body(&markup_escaped(body)).icon("dialog-information");
    #[cfg(all(unix, not(target_os = "macos")))]
    {
        n.urgency(if urgent { notify_rust::Urgency::Critical } else { notify_rust::Urgency::Normal });
    }
    let _ = urgent;
    n.timeout(notify_rust::Timeout::Milliseconds(8000));
    let can = on_open.is_some() && (open.is_some() || !buttons.is_empty()) && supports_actions();
    let offered = open.filter(|_| can);
    let buttons = if can { buttons } else { vec![] };
    if offered.is_some() {
        n.action("default", "Open").action("open", "Open");
    }
    // A button's action key is its place: "b0", "b1", …
    for (i, b) in buttons.iter().enumerate() {
        n.action(&format!("b{i}"), b.label);
    }
    let labels = buttons.iter().map(|b| b.label.to_string()).collect();
    let handle = n.show().map_err(|e| e.to_string())?;
    #[cfg(all(unix, not(target_os = "macos")))]
    if let Some(f) = on_open.filter(|_| can) {
        let target = offered.clone();
        std::thread::spawn(move || {
            handle.wait_for_action(|action| {
                let picked = match action {
                    "open" | "default" => target.clone(),
                    b => b
                        .strip_prefix('b')
                        .and_then(|i| i.parse::<usize>().ok())
                        .and_then(|i| buttons.get(i))
                        .map(|b| b.target.clone()),
                };
                if let Some(t) = picked {
                    tracing::info!(action, target = ?t, "notification action");
                    f(t);
                }
            })
        });
    }
    #[cfg(not(all(unix, not(target_os = "macos"))))]
    let _ = (handle, on_open, buttons);
    Ok((offered, labels))
}

/// What [`show`] did: the action and the button labels it offered, or why nothing was shown.
type Shown = Result<(Option<Open>, Vec<String>), String>;

/// A body as the notification server reads it: servers that support body markup (most do;
/// the spec's subset of HTML) would otherwise render a job's title, an agent's summary or an
/// error as markup (`<a href=…>`, `<img src=…>`). Escaped, the text is shown as it is.
pub fn markup_escaped(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Whether the notification server shows action buttons (not every one does).
fn supports_actions() -> bool {
    #[cfg(all(unix, not(target_os = "macos")))]
    {
        match notify_rust::get_capabilities() {
            Ok(caps) => caps.iter().any(|c| c == "actions"),
            Err(e) => {
                tracing::debug!(error = %e, "cannot ask the notification server what it supports");
                false
            }
        }
    }
    #[cfg(not(all(unix, not(target_os = "macos"))))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use devpilot_app::orchestrator::JobRef;
    use devpilot_app::orchestrator::LossReason;
    use devpilot_app::settings::NotifySettings;
    use devpilot_app::HealthState;

    fn job(id: i64) -> JobRef {
        JobRef { id, title: Some(format!("T{id}")), attempt: 1, token: 1, issue_url: None }
    }

    /// Toggles decide; routine events are off by default, failures and losses on.
    #[test]
    fn toggles() {
        let d = NotifySettings::default();
        assert!(notice_for(&Event::Claimed { job: job(1) }, &d).is_none());
        assert!(notice_for(&Event::Failed { job: job(1), error: "x".into(), dead: true }, &d)
            .unwrap()
            .text
            .contains("dead"));
        let off = NotifySettings { lease_lost: false, ..d };
        assert!(notice_for(&Event::LeaseLost { job: job(1), reason: LossReason::LeaseExpired }, &off).is_none());
        let expired = notice_for(&Event::LeaseLost { job: job(2), reason: LossReason::DeadlinePassed }, &d).unwrap();
        assert!(expired.text.contains("could not be reached"), "{}", expired.text);
    }

    /// A machine that cannot run its agent says so once, whatever the toggles, and names it.
    #[test]
    fn a_missing_agent_is_always_told() {
        let none = NotifySettings {
            claimed: false,
            completed: false,
            failed: false,
            dead: false,
            lease_lost: false,
            offline: false,
            online: false,
            every_retry: false,
            any_machine: false,
        };
        let ev = Event::AgentUnavailable { error: "agent program 'claude' was not found".into() };
        let n = notice_for(&ev, &none).unwrap();
        assert_eq!(n.kind, Kind::AgentMissing);
        assert!(n.text.contains("'claude'"), "{}", n.text);
        assert_eq!(render(&[n]).0, "DevPilot: the agent cannot run");
    }

    /// A burst renders as one notification that counts each kind.
    #[test]
    fn bursts_coalesce() {
        let on = NotifySettings { claimed: true, ..NotifySettings::default() };
        let mut batch: Vec<Notice> = (1..=7)
            .filter_map(|i| notice_for(&Event::Completed { job: job(i), summary: None, url: None }, &on))
            .collect();
        batch.push(notice_for(&Event::LeaseLost { job: job(9), reason: LossReason::CompletionRejected }, &on).unwrap());
        let (s, b) = render(&batch);
        assert_eq!(s, "DevPilot: 1 claim lost, 7 jobs finished");
        assert!(b.contains("… and 3 more"), "{b}");
        let (s, b) = render(&batch[..1]);
        assert_eq!((s.as_str(), b.as_str()), ("T1", "Finished T1 (#1)"), "one job's notice is titled with the job");
    }

    /// A job retried until it is dead makes one notification, its last failure, and opens the
    /// job; every retry is told only when the setting asks for it.
    #[test]
    fn only_the_last_failure_is_told() {
        let d = NotifySettings::default();
        let retry = Event::Failed { job: job(1), error: "exit 1".into(), dead: false };
        let last = Event::Failed { job: job(1), error: "exit 1".into(), dead: true };
        let told: Vec<Notice> = [&retry, &retry, &last].into_iter().filter_map(|e| notice_for(e, &d)).collect();
        assert_eq!(told.len(), 1, "three failed attempts, one notification: {told:?}");
        assert_eq!((told[0].kind, told[0].open.clone()), (Kind::Dead, Some(Open::Job(1))));
        assert_eq!(render(&told).0, "T1");
        let every = NotifySettings { every_retry: true, ..d };
        assert!(notice_for(&retry, &every).is_some_and(|n| n.kind == Kind::Failed));
    }

    /// A config file set aside is told once, names where it was kept, and opens Settings.
    #[test]
    fn a_set_aside_config_is_told_once() {
        let kept =
            devpilot_app::config::SetAside { kept_as: "/c/config.toml.bad-1".into(), reason: "expected `]`".into() };
        let n = set_aside_notice(&kept, None).unwrap();
        assert!(n.text.contains("/c/config.toml.bad-1") && n.text.contains("expected `]`"), "{}", n.text);
        assert_eq!(n.open, Some(Open::Settings));
        assert_eq!(render(&[n]).0, "DevPilot: settings file could not be read");
        assert!(set_aside_notice(&kept, Some("/c/config.toml.bad-1")).is_none());
    }

    /// A completion's notice carries what the agent said it did, and its link.
    #[test]
    fn completion_notice_carries_the_summary() {
        let ev = Event::Completed {
            job: job(3),
            summary: Some("fixed the redirect".into()),
            url: Some("https://x.test/pr/9".into()),
        };
        let n = notice_for(&ev, &NotifySettings::default()).unwrap();
        assert!(n.text.contains("fixed the redirect") && n.text.contains("https://x.test/pr/9"), "{}", n.text);
        let otherwise = Box::new(Open::Url("https://x.test/pr/9".into()));
        assert_eq!(n.open, Some(Open::Result { job: 3, otherwise }), "Open opens the link (unless a newer one)");
        let plain = notice_for(&Event::Completed { job: job(4), summary: None, url: None }, &NotifySettings::default());
        let otherwise = Box::new(Open::Job(4));
        assert_eq!(plain.unwrap().open, Some(Open::Result { job: 4, otherwise }), "with no link, Open opens the job");
        let json = serde_json::to_value(Open::Result { job: 4, otherwise: Box::new(Open::Job(4)) }).unwrap();
        assert_eq!(json, serde_json::json!({"result": {"job": 4, "otherwise": {"job": 4}}}));
    }

    /// A job from a tracker issue: its completion's Open opens the issue, even with a result
    /// link (the link is still in the text), unless the queue has a result link when clicked.
    #[test]
    fn completion_of_an_issue_opens_the_issue() {
        let issue = JobRef { issue_url: Some("https://linear.app/acme/issue/ENG-7".into()), ..job(5) };
        let ev = Event::Completed { job: issue, summary: None, url: Some("https://x.test/pr/9".into()) };
        let n = notice_for(&ev, &NotifySettings::default()).unwrap();
        let otherwise = Box::new(Open::Url("https://linear.app/acme/issue/ENG-7".into()));
        assert_eq!(n.open, Some(Open::Result { job: 5, otherwise }));
        assert!(n.text.contains("https://x.test/pr/9"), "{}", n.text);
    }

    /// A source with no key, or a refused one, is told (once: the machine says it once), names
    /// the source and opens Settings; the troubles that mend themselves are not told, and both
    /// failure toggles off silence it.
    #[test]
    fn a_source_without_a_usable_key_is_told() {
        let trouble = |state| Event::SourceTrouble {
            source: "eng".into(),
            state,
            message: "Linear refused the API key (401)".into(),
        };
        let d = NotifySettings::default();
        let n = notice_for(&trouble(HealthState::WrongKey), &d).unwrap();
        assert_eq!(
            (n.kind, n.text.as_str(), n.open.clone()),
            (Kind::SourceTrouble, "Source eng: Linear refused the API key (401)", Some(Open::Settings))
        );
        assert_eq!(render(&[n]).0, "DevPilot: a source needs its key or token");
        assert!(notice_for(&trouble(HealthState::NoKey), &d).is_some());
        for passing in [HealthState::Offline, HealthState::RateLimited, HealthState::Error] {
            assert!(notice_for(&trouble(passing), &d).is_none(), "{passing:?}");
        }
        assert!(notice_for(&trouble(HealthState::NoKey), &NotifySettings { dead: false, ..d.clone() }).is_some());
        let quiet = NotifySettings { failed: false, dead: false, ..d };
        assert!(notice_for(&trouble(HealthState::NoKey), &quiet).is_none());
        assert!(notice_for(&Event::SourceOk { source: "eng".into() }, &NotifySettings::default()).is_none());
    }

    /// A spend warning is told whatever the toggles (the user set the cap), about its job; a
    /// park says why, from the job's row: a spend cap as such, a usage limit with until when,
    /// and something generic but not wrong when the row cannot be read.
    #[test]
    fn spend_warnings_and_parks_say_why() {
        use crate::notice::{parked_text, ParkReason};
        let none = NotifySettings { failed: false, dead: false, completed: false, ..NotifySettings::default() };
        let text = "80 % of this job's $0.05 cap spent ($0.04)".to_string();
        let n = notice_for(&Event::SpendWarning { job: job(7), text }, &none).unwrap();
        assert_eq!((n.kind, n.open.clone()), (Kind::SpendWarning, Some(Open::Job(7))));
        assert_eq!(
            render(std::slice::from_ref(&n)),
            ("T7".into(), "T7 (#7): 80 % of this job's $0.05 cap spent ($0.04)".into())
        );
        let parked = |r| parked_text(&job(8), 0, r);
        assert_eq!(
            parked(ParkReason::Said("spend cap: this job spent $0.05 of its $0.05 cap")),
            "T8 (#8) stopped at its spend cap: this job spent $0.05 of its $0.05 cap; it waits for you (Let it go on, on its page)"
        );
        let day = parked(ParkReason::Said("spend cap: the fleet spent $20.01 of today's $20.00 cap"));
        assert!(day.ends_with("today's $20.00 cap; it goes on when the day's spend allows"), "{day}");
        let limit = parked(ParkReason::Said(
            "the agent's account hit a usage limit; claude:work is held on every machine until its reset",
        ));
        assert!(
            limit.starts_with("T8 (#8) is parked until ") && limit.contains(": the agent's account hit a usage limit;"),
            "{limit}"
        );
        assert!(!parked(ParkReason::None).contains("limit"));
        let unknown = notice_for(&Event::Parked { job: job(8), until_unix_ms: 0 }, &NotifySettings::default()).unwrap();
        assert_eq!(
            unknown.text,
            "T8 (#8) is parked (a usage limit or a spend cap, or the agent asked to be tried later)"
        );
        let (s, _) = render(&[n, unknown]);
        assert_eq!(s, "DevPilot: 1 job parked, 1 spend warning");
    }

    /// A summary that is markup is shown as text: the body is escaped before it is sent.
    #[test]
    fn bodies_are_markup_escaped() {
        let said = "<a href=\"https://evil.test\">click</a> & <img src=x>";
        assert_eq!(markup_escaped(said), "&lt;a href=\"https://evil.test\"&gt;click&lt;/a&gt; &amp; &lt;img src=x&gt;");
        assert_eq!(markup_escaped("fixed the redirect"), "fixed the redirect");
    }
}
