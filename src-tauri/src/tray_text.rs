//! What the tray says, as text: the menu's state line, job lines and troubled sources' lines,
//! and the hover text (tooltip). Pure functions of the engine's [`Status`] and the clock, so they are tested
//! without a display.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, TimeZone};
use devpilot_app::{HealthState, MachineState as S, Status};

/// The hover text's running-jobs part stops after this many characters ("…" follows): tray
/// hosts show one or two lines, and a long list would push the state out of view.
const HOVER_JOBS_MAX: usize = 90;

/// One line for the state, as the menu's first item shows it.
pub fn state_line(st: &Status) -> String {
    let word = match st.state {
        S::Starting => "Starting…".to_string(),
        S::Idle => "Idle: waiting for jobs".to_string(),
        S::Working => {
            let n = st.running.len();
            format!("Working: {n} job{}{}", if n == 1 { "" } else { "s" }, paused_suffix(st))
        }
        S::Paused => format!("Paused {}", until(st)),
        S::Off => "Dispatch off".to_string(),
        S::Offline => "Offline: database unreachable".to_string(),
        S::Error => match first_clause(st.message.as_deref()) {
            Some(m) => format!("Needs attention: {m}"),
            None => "Needs attention (see Settings)".to_string(),
        },
        S::NeedsAgent => "Set an agent command (Settings)".to_string(),
        S::Stopped => "Stopped".to_string(),
    };
    if st.orchestrator_id.is_empty() {
        word
    } else {
        format!("{word} — {}", st.orchestrator_id)
    }
}

/// "until 14:30" (local time) for a timed pause, "until resumed" for the other kind.
fn until(st: &Status) -> String {
    match st.paused_until_unix_ms {
        Some(ms) => format!("until {}", clock(ms)),
        None => "until resumed".to_string(),
    }
}

/// Jobs keep running while claiming is paused; the state line still says it is paused.
fn paused_suffix(st: &Status) -> String {
    if st.paused {
        format!(" · paused {}", until(st))
    } else {
        String::new()
    }
}

/// The first clause of a problem (what is wrong; what to do follows), at most 90 characters.
fn first_clause(message: Option<&str>) -> Option<String> {
    let m = message?.split(['.', ';']).next()?.trim();
    (!m.is_empty()).then(|| shorten(m, 90))
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        s.chars().take(max.saturating_sub(1)).collect::<String>() + "…"
    }
}

/// The hover text: "DevPilot — dispatching · 2 running: #12 Fix login, #15 Add tests",
/// "DevPilot — paused until 14:30", "DevPilot — offline: connection refused".
pub fn hover_text(st: &Status) -> String {
    let mut text = format!("DevPilot — {}", hover_state(st));
    if !st.running.is_empty() {
        let jobs: Vec<String> = st
            .running
            .iter()
            .map(|r| match r.job.title.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
                Some(t) => format!("#{} {t}", r.job.id),
                None => format!("#{}", r.job.id),
            })
            .collect();
        text.push_str(&format!(" · {} running: {}", jobs.len(), shorten(&jobs.join(", "), HOVER_JOBS_MAX)));
    }
    for line in source_lines(st) {
        text.push_str(&format!(" · {line}"));
    }
    text
}

/// A line for each tracker source that does not work here: "Linear eng: wrong key" (a source
/// that works, or has not polled yet, says nothing: the tray only speaks of what needs a
/// look), then one where agents run unconfined: "Agents run unconfined here".
pub fn source_lines(st: &Status) -> Vec<String> {
    let sandbox = st.sandbox.iter().map(|w| w.line.clone());
    st.sources
        .iter()
        .filter_map(|h| {
            let what = match h.state {
                HealthState::Ok | HealthState::Starting => return None,
                HealthState::NoKey => "no API key",
                HealthState::WrongKey => "wrong key",
                HealthState::Offline => "offline",
                HealthState::RateLimited => "rate limited",
                HealthState::Error => "error",
            };
            // Linear is the only kind of source there is; another kind names itself.
            let kind = if h.kind.is_empty() || h.kind == "linear" { "Linear".to_string() } else { h.kind.clone() };
            Some(format!("{kind} {}: {what}", shorten(&h.name, 32)))
        })
        .chain(sandbox)
        .collect()
}

fn hover_state(st: &Status) -> String {
    let claiming = if st.paused {
        format!("paused {}", until(st))
    } else if st.dispatch_enabled {
        "dispatching".to_string()
    } else {
        "dispatch off".to_string()
    };
    match st.state {
        S::Starting => "starting".to_string(),
        S::Idle if st.running.is_empty() => "dispatching · nothing running".to_string(),
        S::Idle | S::Working | S::Paused | S::Off => claiming,
        S::Offline => {
            format!("offline: {}", first_clause(st.message.as_deref()).unwrap_or("database unreachable".into()))
        }
        S::Error => {
            format!("needs attention: {}", first_clause(st.message.as_deref()).unwrap_or("see Settings".into()))
        }
        S::NeedsAgent => "no agent command set (Settings)".to_string(),
        S::Stopped => "stopped".to_string(),
    }
}

/// A wall-clock time as the user's clock shows it: "14:30" today, "Wed 14:30" on another day.
pub fn clock(unix_ms: u64) -> String {
    clock_in(&chrono::Local, unix_ms, now_ms())
}

fn clock_in<Tz: TimeZone>(tz: &Tz, unix_ms: u64, now_ms: u64) -> String
where
    Tz::Offset: std::fmt::Display,
{
    let at = |ms: u64| -> Option<DateTime<Tz>> { tz.timestamp_millis_opt(ms as i64).single() };
    match (at(unix_ms), at(now_ms)) {
        (Some(t), Some(now)) if t.date_naive() == now.date_naive() => t.format("%H:%M").to_string(),
        (Some(t), _) => t.format("%a %H:%M").to_string(),
        (None, _) => "?".to_string(),
    }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m", s / 60)
    } else {
        format!("{}h {}m", s / 3600, (s % 3600) / 60)
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The running-job lines: "▶ Title (#12) · 3m".
pub fn job_lines(st: &Status) -> Vec<String> {
    let now = now_ms();
    st.running
        .iter()
        .map(|r| {
            let label = shorten(&r.job.label(), 48);
            format!("▶ {label} · {}", human(Duration::from_millis(now.saturating_sub(r.started_unix_ms))))
        })
        .collect()
}

/// The Jobs submenu's first line: "2 running here · 3 queued" (the queue once read).
pub fn jobs_title(running_here: usize, board: Option<&devpilot_app::Board>) -> String {
    let queued = board.map(|b| format!(" · {} queued", b.queued)).unwrap_or_default();
    match running_here {
        0 => format!("Nothing running here{queued}"),
        n => format!("{n} running here{queued}"),
    }
}

/// A recent result's line: "✓ ENG-7 Fix login (#12) · Draft PR #42 · 12 min on desktop",
/// "✗ … · Gave up after 3 attempts", "⊘ … cancelled".
pub fn result_line(o: &devpilot_app::Outcome) -> String {
    use devpilot_app::job::JobState;
    let mark = match o.job.state {
        JobState::Completed => "\u{2713}",
        JobState::Dead => "\u{2717}",
        _ => "\u{2298}",
    };
    let title = match &o.job.title {
        Some(t) => format!("{} (#{})", shorten(t, 40), o.job.id),
        None => format!("#{}", o.job.id),
    };
    match (o.job.state, o.line.is_empty()) {
        (JobState::Cancelled, _) => format!("{mark} {title} · cancelled"),
        (_, true) => format!("{mark} {title}"),
        (_, false) => format!("{mark} {title} · {}", o.line),
    }
}

/// The claiming control's first line: "Now: on", "Now: paused until 14:30", "Now: off".
pub fn claiming_title(st: &Status) -> String {
    match (st.dispatch_enabled, st.paused) {
        (false, _) => "Now: off".to_string(),
        (true, true) => format!("Now: paused {}", until(st)),
        (true, false) => "Now: on".to_string(),
    }
}

/// The tray menu's line for the last hand-off: "✓ Safe to close the lid: Handed off #12
/// (pushed devpilot/12-fix-login). Claiming is paused.", or "⚠ Work stayed on this machine: …".
pub fn verdict_line(v: &devpilot_app::HandOffVerdict) -> String {
    let mark = if v.safe { "\u{2713}" } else { "\u{26a0}" };
    let text = v.text.trim_end_matches(" Safe to close the lid.");
    format!("{mark} {}: {text}", v.title)
}

#[cfg(test)]
mod tests {
    use super::*;
    use devpilot_app::orchestrator::{JobRef, RunningJob};

    fn running(id: i64, title: &str) -> RunningJob {
        RunningJob {
            job: JobRef { id, title: Some(title.into()), attempt: 1, token: 1, issue_url: None },
            started_unix_ms: now_ms(),
        }
    }

    /// The hover text names the state and what runs, and cuts a long list short.
    #[test]
    fn hover_text_says_state_and_jobs() {
        let mut st = Status { state: S::Idle, dispatch_enabled: true, ..Status::default() };
        assert_eq!(hover_text(&st), "DevPilot — dispatching · nothing running");
        st.state = S::Working;
        st.running = vec![running(12, "Fix login"), running(15, "Add tests")];
        assert_eq!(hover_text(&st), "DevPilot — dispatching · 2 running: #12 Fix login, #15 Add tests");
        st.running = (1..=20).map(|i| running(i, "A rather long job title")).collect();
        let long = hover_text(&st);
        assert!(long.starts_with("DevPilot — dispatching · 20 running: #1 A rather") && long.ends_with('…'), "{long}");
        assert!(long.chars().count() < 160, "{long}");
        let st = Status {
            state: S::Offline,
            message: Some("cannot reach the database at h:5432/d: connection refused. Retrying.".into()),
            ..Status::default()
        };
        assert_eq!(hover_text(&st), "DevPilot — offline: cannot reach the database at h:5432/d: connection refused");
        let st = Status { state: S::Paused, paused: true, dispatch_enabled: true, ..Status::default() };
        assert_eq!(hover_text(&st), "DevPilot — paused until resumed");
    }

    /// A source that does not work here gets a line, in the menu and the hover text; one that
    /// works (or has not polled yet) does not.
    #[test]
    fn troubled_sources_get_a_line() {
        use devpilot_app::SourceHealth;
        let source =
            |name: &str, state| SourceHealth { name: name.into(), kind: "linear".into(), state, ..Default::default() };
        let mut st = Status { state: S::Idle, dispatch_enabled: true, ..Status::default() };
        st.sources = vec![source("eng", HealthState::Ok), source("ops", HealthState::Starting)];
        assert!(source_lines(&st).is_empty());
        assert_eq!(hover_text(&st), "DevPilot — dispatching · nothing running");
        st.sources.push(source("eng2", HealthState::WrongKey));
        st.sources.push(source("web", HealthState::NoKey));
        assert_eq!(source_lines(&st), ["Linear eng2: wrong key", "Linear web: no API key"]);
        assert_eq!(
            hover_text(&st),
            "DevPilot — dispatching · nothing running · Linear eng2: wrong key · Linear web: no API key"
        );
    }

    /// A timed pause says until when, on the local clock, in the menu and the hover text.
    #[test]
    fn a_timed_pause_says_until_when() {
        let until = now_ms() + 30 * 60 * 1000;
        let st = Status {
            state: S::Paused,
            paused: true,
            dispatch_enabled: true,
            paused_until_unix_ms: Some(until),
            orchestrator_id: "home".into(),
            ..Status::default()
        };
        let hhmm = clock(until);
        assert_eq!(state_line(&st), format!("Paused until {hhmm} — home"));
        assert_eq!(hover_text(&st), format!("DevPilot — paused until {hhmm}"));
        let working = Status { state: S::Working, running: vec![running(3, "x")], ..st };
        assert_eq!(state_line(&working), format!("Working: 1 job · paused until {hhmm} — home"));
    }

    /// HH:MM in the given zone; another day's time names the day.
    #[test]
    fn clock_is_local_and_names_another_day() {
        let ist = chrono::FixedOffset::east_opt(5 * 3600 + 1800).unwrap();
        // 2026-12-01 09:00 UTC is 14:30 in UTC+05:30.
        let t = 1_796_115_600_000;
        assert_eq!(clock_in(&ist, t, t - 60_000), "14:30");
        assert_eq!(clock_in(&chrono::Utc, t, t), "09:00");
        assert_eq!(clock_in(&ist, t + 86_400_000, t), "Wed 14:30");
    }

    /// The claiming title says the one state of the control; a result line says what came of
    /// the job with its mark.
    #[test]
    fn claiming_and_result_lines() {
        let mut st = Status { dispatch_enabled: true, ..Default::default() };
        assert_eq!(claiming_title(&st), "Now: on");
        st.paused = true;
        assert_eq!(claiming_title(&st), "Now: paused until resumed");
        st.dispatch_enabled = false;
        assert_eq!(claiming_title(&st), "Now: off");
        let mut job = devpilot_app::queue::JobRow::bare(12, "o", devpilot_app::job::JobState::Completed);
        job.title = Some("ENG-7 Fix login".into());
        let o = devpilot_app::Outcome { job, line: "Draft PR #42 · 12 min on desktop".into(), pr: None };
        assert_eq!(result_line(&o), "\u{2713} ENG-7 Fix login (#12) · Draft PR #42 · 12 min on desktop");
        assert_eq!(jobs_title(2, None), "2 running here");
        assert_eq!(jobs_title(0, None), "Nothing running here");
    }
}
