//! What a job's outcome may carry out of the runner: the agent's words without this
//! machine's secrets (they go to the events, the window and the runner's log as well as the
//! store), and a park no longer than the machine's cap, saying so when the agent asked for
//! more.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::agent::{AgentExit, AgentResult};
use devpilot_store::queue::RetryAfter;
use devpilot_store::redact::Redactor;

/// `exit` and `result` with `redactor`'s values taken out of every text in them.
pub(super) fn redacted(redactor: &Redactor, exit: AgentExit, mut result: AgentResult) -> (AgentExit, AgentResult) {
    let exit = match exit {
        AgentExit::Failed(msg) => AgentExit::Failed(redactor.redact(&msg).into_owned()),
        other => other,
    };
    result.summary = redactor.redact_opt(result.summary.as_deref());
    result.url = redactor.redact_opt(result.url.as_deref());
    result.parked_why = redactor.redact_opt(result.parked_why.as_deref());
    (exit, result)
}

/// The park `after` at most `cap` from `now_ms` (this machine's clock), and why the job
/// waits less than asked when it was more: a CLI's reset time or a result file's
/// `retry_after` is the agent's to say, and it could say 2096.
pub(super) fn capped(after: RetryAfter, cap: Duration, now_ms: i64) -> (RetryAfter, Option<String>) {
    let cap_ms = i64::try_from(cap.as_millis()).unwrap_or(i64::MAX);
    let asked = match after {
        RetryAfter::At(ms) if ms.saturating_sub(now_ms) > cap_ms => rfc3339(ms),
        RetryAfter::In(d) if d > cap => format!("a wait of {}", humantime::format_duration(d)),
        _ => return (after, None),
    };
    (RetryAfter::In(cap), Some(format!("the agent asked for {asked}; capped at {}", span_text(cap))))
}

/// The reason a park gives, with the note of its cap: after the CLI's words (a usage limit),
/// else alone (the store's exit-75 sentence otherwise).
pub(super) fn park_reason(why: Option<String>, cap_note: Option<String>) -> Option<String> {
    match (why, cap_note) {
        (Some(w), Some(n)) => Some(format!("{w}; {n}")),
        (w, n) => w.or(n),
    }
}

/// This machine's clock, in ms since the epoch.
pub(super) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `2096-01-01T00:00:00Z` for a time in ms (as it is, when it cannot be written so).
fn rfc3339(ms: i64) -> String {
    match u64::try_from(ms).ok().and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms))) {
        Some(t) if ms < 253_402_300_800_000 => humantime::format_rfc3339_seconds(t).to_string(),
        _ => format!("{ms} ms after 1970"),
    }
}

/// "7 days", "1 day", else as humantime writes it ("12h", "30m").
fn span_text(d: Duration) -> String {
    match d.as_secs() {
        86_400 => "1 day".into(),
        s if s > 0 && s % 86_400 == 0 => format!("{} days", s / 86_400),
        _ => humantime::format_duration(d).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEEK: Duration = Duration::from_secs(7 * 86_400);

    /// A reset time or wait past the cap becomes the cap, and the note says what was asked;
    /// one within it, or the backoff, is kept as it is.
    #[test]
    fn parks_past_the_cap_are_capped_and_say_so() {
        let now = 1_796_119_200_000;
        let far = 3_976_214_400_000; // 2096-01-01T00:00:00Z
        let (after, note) = capped(RetryAfter::At(far), WEEK, now);
        assert_eq!(after, RetryAfter::In(WEEK));
        assert_eq!(note.as_deref(), Some("the agent asked for 2096-01-01T00:00:00Z; capped at 7 days"));
        let (after, note) = capped(RetryAfter::In(Duration::from_secs(30 * 86_400)), WEEK, now);
        assert_eq!(
            (after, note.unwrap().as_str()),
            (RetryAfter::In(WEEK), "the agent asked for a wait of 30days; capped at 7 days")
        );
        let soon = RetryAfter::At(now + 3_600_000);
        assert_eq!(capped(soon, WEEK, now), (soon, None));
        assert_eq!(capped(RetryAfter::Backoff, WEEK, now), (RetryAfter::Backoff, None));
        let (_, note) = capped(RetryAfter::In(Duration::from_secs(7200)), Duration::from_secs(3600), now);
        assert!(note.unwrap().ends_with("capped at 1h"));
        assert_eq!(park_reason(Some("usage limit".into()), Some("n".into())).as_deref(), Some("usage limit; n"));
        assert_eq!(park_reason(None, None), None);
    }

    /// Every text of an outcome loses the machine's secrets.
    #[test]
    fn outcomes_lose_the_machines_secrets() {
        let r = Redactor::default();
        r.learn("sk-outcome-secret-1");
        let result = AgentResult {
            summary: Some("said sk-outcome-secret-1".into()),
            url: Some("https://x.example/?k=sk-outcome-secret-1".into()),
            parked_why: Some("limit sk-outcome-secret-1".into()),
            ..AgentResult::default()
        };
        let (exit, result) = redacted(&r, AgentExit::Failed("cli: sk-outcome-secret-1".into()), result);
        assert_eq!(exit, AgentExit::Failed("cli: [redacted]".into()));
        assert_eq!(result.summary.as_deref(), Some("said [redacted]"));
        assert_eq!(result.url.as_deref(), Some("https://x.example/?k=[redacted]"));
        assert_eq!(result.parked_why.as_deref(), Some("limit [redacted]"));
    }
}
