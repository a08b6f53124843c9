//! What a notification says: the notice an engine event gives (if its toggle is on), its
//! title and body, the buttons beside its Open, and one notification for a burst. Pure
//! functions of the event and the settings, tested without a notification server.

use devpilot_app::orchestrator::{Event, LossReason};
use devpilot_app::settings::NotifySettings;
use devpilot_app::HealthState;
use serde::Serialize;

/// What a notification is about.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Claimed,
    Completed,
    /// A user cancelled a job this machine was running; its agent was stopped.
    Cancelled,
    /// Parked: a usage limit held its account, a spend cap stopped it, or the agent asked to
    /// be tried later (exit 75). Not a failure.
    Parked,
    /// A running job passed the warning share (80 %) of a spend cap. Always shown: the user
    /// set the cap, and this is said once per job (once a day for the day's caps).
    SpendWarning,
    Failed,
    Dead,
    LeaseLost,
    /// The agent cannot run here; the machine stopped claiming. Always shown: nothing else
    /// would tell the user why nothing happens.
    AgentMissing,
    Offline,
    Online,
    /// The config file could not be parsed: it was kept aside and the defaults are in force.
    /// Always shown, once per file set aside.
    ConfigSetAside,
    /// A tracker source has no usable API key here: no issue becomes a job until one is set.
    SourceTrouble,
    /// A hand-off's verdict: "Safe to close the lid", or which work stayed here. Always
    /// shown: the user asked for it (or the lid is closing).
    HandOff,
}

/// One event worth telling, before coalescing.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub kind: Kind,
    /// The job it is about, as its title says it ("ENG-7 Fix login redirect"): a single
    /// notice is titled with it.
    pub subject: Option<String>,
    pub text: String,
    /// What came of the job, read back from the queue ("Draft PR #42 · 12 min on desktop ·
    /// $0.42"): the first line of a notification about it alone.
    pub facts: Option<String>,
    /// What "Open" opens, for a notification about one job.
    pub open: Option<Open>,
    /// Its buttons beside Open ("Open PR", "View log", "Retry"), for a notification about it alone.
    pub buttons: Vec<Button>,
}

impl Notice {
    /// A notice about no job in particular, with no action.
    pub fn plain(kind: Kind, text: String) -> Self {
        Self { kind, subject: None, text, facts: None, open: None, buttons: vec![] }
    }
}

/// A notification's button and what it does.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Button {
    pub label: &'static str,
    pub target: Open,
}

/// What a notification's "Open" action opens.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Open {
    Url(String),
    Job(i64),
    Settings,
    /// The job's page in the window, at its transcript ("View log").
    Log(i64),
    /// Puts a failed or dead job back in the queue ("Retry").
    Retry(i64),
    /// A finished job: its result link as the queue has it when the user clicks, else
    /// `otherwise` (what was known when it finished).
    Result {
        job: i64,
        otherwise: Box<Open>,
    },
}

/// The buttons of a notification about job `id` alone, beside Open: its pull request (`pr`),
/// its log, and Retry for a job that failed for the last time.
pub fn buttons_for(kind: Kind, id: i64, pr: Option<&str>) -> Vec<Button> {
    let log = Button { label: "View log", target: Open::Log(id) };
    match kind {
        Kind::Completed => {
            let pr = pr.map(|u| Button { label: "Open PR", target: Open::Url(u.to_string()) });
            pr.into_iter().chain([log]).collect()
        }
        Kind::Dead => vec![log, Button { label: "Retry", target: Open::Retry(id) }],
        Kind::Failed | Kind::LeaseLost | Kind::Parked => vec![log],
        _ => vec![],
    }
}

/// Which notice an event gives, if its toggle is on. Offline/online are handled separately.
pub fn notice_for(ev: &Event, on: &NotifySettings) -> Option<Notice> {
    let n = |kind, text: String| Some(Notice::plain(kind, text));
    // About one job: titled with it, and "Open" shows it in the window.
    let about = |job: &devpilot_app::orchestrator::JobRef, kind, text: String| {
        let buttons = buttons_for(kind, job.id, None);
        Some(Notice { kind, subject: Some(subject_of(job)), text, facts: None, open: Some(Open::Job(job.id)), buttons })
    };
    match ev {
        Event::Claimed { job } if on.claimed => n(Kind::Claimed, format!("Started {}", job.label())),
        Event::Completed { job, summary, url } if on.completed => {
            let said = summary.as_deref().map(|s| format!(": {s}")).unwrap_or_default();
            let link = url.as_deref().map(|u| format!(" ({u})")).unwrap_or_default();
            // Its result link when the user clicks (a pull request opened since); else the issue
            // the work was asked in, where its result is read and discussed.
            let target = job.issue_url.clone().or_else(|| url.clone());
            let otherwise = Box::new(target.map(Open::Url).unwrap_or(Open::Job(job.id)));
            let open = Some(Open::Result { job: job.id, otherwise });
            let text = format!("Finished {}{said}{link}", job.label());
            let buttons = buttons_for(Kind::Completed, job.id, None);
            Some(Notice { kind: Kind::Completed, subject: Some(subject_of(job)), text, facts: None, open, buttons })
        }
        Event::Cancelled { job } if on.completed => {
            about(job, Kind::Cancelled, format!("Cancelled {}: the agent was stopped", job.label()))
        }
        // Why it is parked is the job's row (notify.rs reads it and calls `parked_text` again);
        // this is what is said when the queue cannot be read.
        Event::Parked { job, until_unix_ms } if on.failed => {
            about(job, Kind::Parked, parked_text(job, *until_unix_ms, ParkReason::Unknown))
        }
        Event::SpendWarning { job, text } => about(job, Kind::SpendWarning, format!("{}: {text}", job.label())),
        Event::Failed { job, error, dead: true } if on.dead => {
            about(job, Kind::Dead, format!("{} is dead after its last attempt: {error}", job.label()))
        }
        // A retry is told only when asked for: a job retried three times is one notification
        // (its last failure, dead), not three.
        Event::Failed { job, error, dead: false } if on.failed && on.every_retry => {
            about(job, Kind::Failed, format!("{} failed (attempt {}), will retry: {error}", job.label(), job.attempt))
        }
        Event::LeaseLost { job, reason } if on.lease_lost => about(job, Kind::LeaseLost, lost_text(job, *reason)),
        Event::AgentUnavailable { error } => Some(Notice {
            kind: Kind::AgentMissing,
            subject: None,
            text: format!("Not claiming jobs: {error}"),
            facts: None,
            open: Some(Open::Settings),
            buttons: vec![],
        }),
        // Said once by the machine as the source goes wrong. Only a key the user must set is
        // worth a notification (offline and rate limits mend themselves); both failure
        // toggles off silence it. The message names the tracker (Linear, GitHub) itself.
        Event::SourceTrouble { source, state: HealthState::NoKey | HealthState::WrongKey, message }
            if on.failed || on.dead =>
        {
            Some(Notice {
                kind: Kind::SourceTrouble,
                subject: None,
                text: format!("Source {source}: {message}"),
                facts: None,
                open: Some(Open::Settings),
                buttons: vec![],
            })
        }
        _ => None,
    }
}

/// Why a job is parked, as far as the notifier knows: its `last_error` read back from the
/// queue, or nothing known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParkReason<'a> {
    /// The queue could not be read.
    Unknown,
    /// Its row gives no reason: the agent asked to be tried later (exit 75) and said no more.
    None,
    /// Its row's reason ("spend cap: this job spent $2.01 of its $2.00 cap", "the agent's
    /// account hit a usage limit; claude:work is held on every machine until its reset").
    Said(&'a str),
}

/// What a parked job's notice says: "ENG-7 Fix login (#12) stopped at its spend cap: this job
/// spent $2.01 of its $2.00 cap", "… is parked until 14:05: the agent's account hit a usage
/// limit; …". `until_ms` is when it is claimable again (a job stopped at its own cap waits for
/// a person, whatever that says).
pub fn parked_text(job: &devpilot_app::orchestrator::JobRef, until_ms: i64, reason: ParkReason<'_>) -> String {
    let label = job.label();
    let until = crate::tray_text::clock(u64::try_from(until_ms).unwrap_or_default());
    match reason {
        ParkReason::Said(r) if r.starts_with("spend cap") => {
            let what = r.trim_start_matches("spend cap").trim_start_matches([':', ' ']);
            let next = if what.contains(" of its $") {
                "it waits for you (Let it go on, on its page)"
            } else {
                "it goes on when the day's spend allows"
            };
            format!("{label} stopped at its spend cap: {what}; {next}")
        }
        ParkReason::Said(r) => format!("{label} is parked until {until}: {r}; the attempt did not count"),
        ParkReason::None => {
            format!("{label} is parked until {until}: the agent asked to be tried later; the attempt did not count")
        }
        ParkReason::Unknown => {
            format!("{label} is parked (a usage limit or a spend cap, or the agent asked to be tried later)")
        }
    }
}

/// What a lost claim's notice says.
fn lost_text(job: &devpilot_app::orchestrator::JobRef, reason: LossReason) -> String {
    match reason {
        LossReason::LeaseExpired => {
            format!("Lost {}: its lease expired and another machine may have it. The agent was stopped.", job.label())
        }
        LossReason::DeadlinePassed => {
            format!(
                "Stopped {}: the database could not be reached to renew its lease, so another machine may take it.",
                job.label()
            )
        }
        LossReason::CompletionRejected => {
            format!(
                "{} finished here, but another machine had taken it over; this result was not recorded.",
                job.label()
            )
        }
    }
}

/// What a notification about `job` is titled: its title ("ENG-7 Fix login redirect", "#1 Fix
/// the login"), else "DevPilot job #12".
fn subject_of(job: &devpilot_app::orchestrator::JobRef) -> String {
    match job.title.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => t.to_string(),
        None => format!("DevPilot job #{}", job.id),
    }
}

/// One notification for a burst.
pub fn render(batch: &[Notice]) -> (String, String) {
    if let [one] = batch {
        if let Some(subject) = &one.subject {
            let body = match &one.facts {
                Some(f) => format!("{f}\n{}", one.text),
                None => one.text.clone(),
            };
            return (subject.clone(), body);
        }
        let summary = match one.kind {
            Kind::Claimed => "DevPilot: job started",
            Kind::Completed => "DevPilot: job finished",
            Kind::Cancelled => "DevPilot: job cancelled",
            Kind::Parked => "DevPilot: job parked",
            Kind::SpendWarning => "DevPilot: spend warning",
            Kind::Failed => "DevPilot: job failed",
            Kind::Dead => "DevPilot: job is dead",
            Kind::LeaseLost => "DevPilot: claim lost",
            Kind::AgentMissing => "DevPilot: the agent cannot run",
            Kind::Offline => "DevPilot: database offline",
            Kind::Online => "DevPilot: database back online",
            Kind::ConfigSetAside => "DevPilot: settings file could not be read",
            Kind::SourceTrouble => "DevPilot: a source needs its key or token",
            Kind::HandOff => "DevPilot: handed off",
        };
        return (summary.into(), one.text.clone());
    }
    let count = |k| batch.iter().filter(|n| n.kind == k).count();
    let mut parts = vec![];
    for (k, one, many) in [
        (Kind::LeaseLost, "claim lost", "claims lost"),
        (Kind::Dead, "job dead", "jobs dead"),
        (Kind::Failed, "job failed", "jobs failed"),
        (Kind::Completed, "job finished", "jobs finished"),
        (Kind::Cancelled, "job cancelled", "jobs cancelled"),
        (Kind::Parked, "job parked", "jobs parked"),
        (Kind::SpendWarning, "spend warning", "spend warnings"),
        (Kind::Claimed, "job started", "jobs started"),
    ] {
        match count(k) {
            0 => {}
            1 => parts.push(format!("1 {one}")),
            c => parts.push(format!("{c} {many}")),
        }
    }
    if count(Kind::AgentMissing) > 0 {
        parts.push("the agent cannot run".into());
    }
    if count(Kind::ConfigSetAside) > 0 {
        parts.push("settings file could not be read".into());
    }
    if count(Kind::SourceTrouble) > 0 {
        parts.push("a source needs its key or token".into());
    }
    for k in [Kind::Offline, Kind::Online] {
        if count(k) > 0 {
            parts.push(if k == Kind::Offline { "database offline".into() } else { "database back online".into() });
        }
    }
    let body: Vec<String> = batch.iter().take(5).map(|n| format!("• {}", n.text)).collect();
    let more = if batch.len() > 5 { format!("\n… and {} more", batch.len() - 5) } else { String::new() };
    (format!("DevPilot: {}", parts.join(", ")), format!("{}{more}", body.join("\n")))
}
