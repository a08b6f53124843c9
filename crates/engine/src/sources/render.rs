//! What a reportable event says on the tracker's issue, in Markdown. Agent text (a summary,
//! an error) is quoted as it is, capped, and never able to close the block it sits in.

use devpilot_store::job::event;
use devpilot_store::queue::{Delivery, JobRow};

use super::settings::ReportSettings;

/// The longest agent text a comment quotes.
const MAX_QUOTED: usize = 3000;

/// What a delivery does on the issue besides its comment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The comment, if this event posts one.
    pub comment: Option<String>,
    /// Move the issue to its team's first `started` state (the job's first claim).
    pub move_to_started: bool,
    /// Move the issue to the state with this name (a completion).
    pub move_to: Option<String>,
    /// Link this URL on the issue (a completion's result).
    pub link: Option<String>,
    /// Put the "working" label on the issue (`Some(true)`, a claim) or take it off.
    pub working: Option<bool>,
}

/// The report of `d` for `job` (its branch is `branch`), as `on` allows.
pub fn report(d: &Delivery, job: &JobRow, branch: &str, on: &ReportSettings) -> Report {
    let machine = d.machine.as_deref().unwrap_or("a machine");
    let detail = d.detail.as_deref().unwrap_or("");
    let mut r = Report::default();
    match d.event.as_str() {
        event::CLAIMED => {
            let first = d.claim_token == Some(1);
            r.move_to_started = first && on.move_to_started;
            if on.claimed || (on.handed_off && job.resumed_from.is_some()) {
                r.comment = Some(claimed(job, machine, detail, first));
            }
        }
        event::HANDED_OFF if on.handed_off => {
            let wip = job
                .resume_branch
                .as_deref()
                .map(|b| format!("; work in progress on branch `{}`", code(b)))
                .unwrap_or_default();
            r.comment = Some(format!("Handed off by {machine}{wip}. The next free machine picks it up."));
        }
        event::COMPLETED if on.completed || on.attachment || !on.completed_state.is_empty() => {
            if on.completed {
                r.comment = Some(completed(job, machine, branch));
            }
            r.link = job.url.clone().filter(|u| on.attachment && is_http(u));
            r.move_to = Some(on.completed_state.clone()).filter(|s| !s.trim().is_empty());
        }
        event::FAILED if on.failed => {
            r.comment = Some(format!("The attempt on {machine} failed; it will be tried again.\n\n{}", quote(detail)));
        }
        event::DEAD if on.failed => {
            let why = job.last_error.as_deref().unwrap_or(detail);
            r.comment = Some(format!("Failed on {machine}, and no attempts are left.\n\n{}", quote(why)));
        }
        event::PARKED if on.parked => {
            let until = until_of(detail);
            r.comment = Some(format!("Parked on {machine}: waiting for the usage limit{until}."));
        }
        event::CANCELLED if on.cancelled => {
            r.comment = Some(format!("Cancelled ({}).", one_line(detail)));
        }
        event::SWEPT if on.handed_off => {
            r.comment =
                Some(format!("{machine} stopped answering; the job went back to the queue for another machine."));
        }
        _ => {}
    }
    if !on.working_label.is_empty() && event::REPORTABLE.contains(&d.event.as_str()) {
        r.working = Some(d.event == event::CLAIMED);
    }
    r
}

fn claimed(job: &JobRow, machine: &str, detail: &str, first: bool) -> String {
    match (&job.resumed_from, &job.resume_branch) {
        (Some(from), Some(b)) if from != machine => {
            format!("Moved from {from} to {machine}; work in progress on branch `{}`.", code(b))
        }
        _ if first => format!("Started on {machine} (DevPilot job #{}).", job.id),
        _ => format!("Started again on {machine} ({}).", one_line(detail)),
    }
}

fn completed(job: &JobRow, machine: &str, branch: &str) -> String {
    let mut out = format!("Completed on {machine}.");
    if let Some(s) = job.summary.as_deref().filter(|s| !s.trim().is_empty()) {
        out.push_str(&format!("\n\n{}", quote(s)));
    }
    out.push_str(&format!("\n\nBranch: `{}`", code(branch)));
    if let Some(u) = job.url.as_deref().filter(|u| is_http(u)) {
        out.push_str(&format!("\nResult: {u}"));
    }
    out
}

/// A park's detail ends with "claimable again at 2026-12-02T14:30:00Z": " until 14:30 UTC".
fn until_of(detail: &str) -> String {
    let Some(at) = detail.rsplit("claimable again at ").next().filter(|_| detail.contains("claimable again at "))
    else {
        return String::new();
    };
    match at.get(11..16) {
        Some(hm) if at.len() >= 16 => format!(" until {hm} UTC"),
        _ => String::new(),
    }
}

/// Agent text as a Markdown quote: capped, each line quoted, so nothing it says can end
/// the quote or start a heading of its own.
fn quote(text: &str) -> String {
    let mut t = text.trim().to_string();
    if t.len() > MAX_QUOTED {
        let mut end = MAX_QUOTED;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
        t.push('…');
    }
    t.lines().map(|l| format!("> {l}")).collect::<Vec<_>>().join("\n")
}

/// A branch name inside backticks: no backtick can end the code span early.
fn code(s: &str) -> String {
    s.replace('`', "'")
}

fn one_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(300).collect()
}

fn is_http(u: &str) -> bool {
    u.starts_with("https://") || u.starts_with("http://")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A park's detail gives "until HH:MM UTC"; agent text is quoted line by line, so a
    /// summary that tries to close the quote or start a heading stays inside it.
    #[test]
    fn park_times_and_quotes() {
        let detail =
            "the agent asked to be tried later (exit 75, retry_after); claimable again at 2026-12-02T14:30:00Z";
        assert_eq!(until_of(detail), " until 14:30 UTC");
        assert_eq!(until_of("no time here"), "");
        assert_eq!(quote("done\n# Heading\n```"), "> done\n> # Heading\n> ```");
        assert_eq!(code("a`b"), "a'b");
    }
}
