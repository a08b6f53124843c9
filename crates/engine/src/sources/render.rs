//! What a reportable event says on the tracker's issue, in Markdown. Whoever can read the
//! issue reads it, and the agent's words may have been steered by a stranger's issue text, so
//! agent text (a summary, an error) is inert there: a fenced code block nothing in it can
//! close, in which no mention, link, image or cross-reference is live; without this
//! machine's secrets; capped. A failure shows only the error's first line, without local
//! paths. A result link is published only on the tracker's host or the repo's.

use devpilot_store::job::event;
use devpilot_store::queue::{Delivery, JobRow};

use super::settings::{SourceKind, SourceSettings};

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

/// The report of `d` for `job` (its branch is `branch`), as `source`'s report settings allow.
pub fn report(d: &Delivery, job: &JobRow, branch: &str, source: &SourceSettings) -> Report {
    let on = &source.report;
    let hosts = link_hosts(source, job);
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
                r.comment = Some(completed(job, machine, branch, &hosts));
            }
            r.link = job.url.clone().filter(|u| on.attachment && publishable(u, &hosts));
            r.move_to = Some(on.completed_state.clone()).filter(|s| !s.trim().is_empty());
        }
        event::FAILED if on.failed => {
            r.comment =
                Some(format!("The attempt on {machine} failed; it will be tried again.\n\n{}", failure(detail)));
        }
        event::DEAD if on.failed => {
            let why = job.last_error.as_deref().unwrap_or(detail);
            r.comment = Some(format!("Failed on {machine}, and no attempts are left.\n\n{}", failure(why)));
        }
        event::PARKED if on.parked => {
            let until = until_of(detail);
            r.comment = Some(match detail.strip_prefix("spend cap: ") {
                Some(cap) => spend_capped(machine, cap, &until),
                None => format!("Parked on {machine}: waiting for the usage limit{until}."),
            });
        }
        event::SPEND_WARNING if on.parked => {
            r.comment = Some(format!("Spend warning from {machine}: {}.", one_line(detail)));
        }
        event::CANCELLED if on.cancelled => {
            r.comment = Some(format!("Cancelled ({}).", one_line(detail)));
        }
        event::EDITED_AFTER_APPROVAL => {
            r.comment = Some(format!("This issue was {}.", crate::sources::approval::EDITED_AFTER_APPROVAL));
        }
        event::SWEPT if on.handed_off => {
            r.comment =
                Some(format!("{machine} stopped answering; the job went back to the queue for another machine."));
        }
        _ => {}
    }
    let about_work = d.event != event::EDITED_AFTER_APPROVAL && d.event != event::SPEND_WARNING;
    if !on.working_label.is_empty() && about_work && event::REPORTABLE.contains(&d.event.as_str()) {
        r.working = Some(d.event == event::CLAIMED);
    }
    r
}

/// A park at a spend cap: its own cap waits for a person; a day's cap, for the next day.
fn spend_capped(machine: &str, cap: &str, until: &str) -> String {
    let what = one_line(cap.split(';').next().unwrap_or(cap));
    if what.contains("this job spent") {
        format!("Stopped on {machine} at its spend cap ({what}); its work is pushed. It waits for a person.")
    } else {
        format!("Stopped on {machine} at today's spend cap ({what}); its work is pushed. It goes on{until}.")
    }
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

fn completed(job: &JobRow, machine: &str, branch: &str, hosts: &[String]) -> String {
    let mut out = format!("Completed on {machine}.");
    if let Some(s) = job.summary.as_deref().filter(|s| !s.trim().is_empty()) {
        out.push_str(&format!("\n\n{}", inert(s)));
    }
    if job.commits == Some(0) {
        out.push_str("\n\nNo changes: the agent changed no file, so there is no branch and no pull request.");
    } else {
        out.push_str(&format!("\n\nBranch: `{}`", code(branch)));
    }
    if let Some(u) = job.url.as_deref().filter(|u| publishable(u, hosts)) {
        out.push_str(&format!("\nResult: {u}"));
    }
    out
}

/// The hosts a result link may be on: the tracker's (GitHub's web host for a GitHub source,
/// `linear.app` for Linear) and that of the remote the job's branch was pushed to.
fn link_hosts(source: &SourceSettings, job: &JobRow) -> Vec<String> {
    let tracker = match source.kind {
        SourceKind::Linear => Some("linear.app".to_string()),
        SourceKind::Github => host_of(&source.api_url()).map(|h| match h.as_str() {
            "api.github.com" => "github.com".to_string(),
            _ => h,
        }),
    };
    let repo = job.pushed_remote.as_deref().and_then(remote_host);
    tracker.into_iter().chain(repo).collect()
}

/// The host of a git remote: a URL's (`https://host/o/r.git`, `ssh://git@host/o/r`), or an
/// scp-like one's (`git@host:o/r.git`).
fn remote_host(remote: &str) -> Option<String> {
    if remote.contains("://") {
        return host_of(remote);
    }
    let (left, _) = remote.trim().split_once(':')?;
    let host = left.rsplit('@').next()?.to_ascii_lowercase();
    (!host.is_empty() && !host.contains('/')).then_some(host)
}

/// Whether `url` is an http(s) link on one of `hosts`.
fn publishable(url: &str, hosts: &[String]) -> bool {
    is_http(url) && host_of(url).is_some_and(|h| hosts.contains(&h))
}

/// `host` or `host:port` (a port only when it is not the scheme's own), lowercase.
fn host_of(url: &str) -> Option<String> {
    let u = url::Url::parse(url.trim()).ok()?;
    let h = u.host_str()?.to_ascii_lowercase();
    Some(match u.port() {
        Some(p) => format!("{h}:{p}"),
        None => h,
    })
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

/// Agent text as a fenced code block that nothing in it can end: this machine's secrets
/// taken out, every `\r` dropped (a lone one ends a line in Markdown), no `<!--` (a marker
/// in a comment is only ever DevPilot's own), capped, and a fence longer than any run of
/// backticks inside. In a code block no mention, link, image, reference or closing keyword
/// is live, on GitHub or on Linear.
pub fn inert(text: &str) -> String {
    let t = crate::redact::known().redact(text).replace('\r', "").replace("<!--", "<! --");
    let mut t = t.trim().to_string();
    if t.len() > MAX_QUOTED {
        let mut end = MAX_QUOTED;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
        t.push('…');
    }
    let longest = t.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}\n{t}\n{fence}")
}

/// A failure as an issue shows it: the error's first line only (what follows is a setup's
/// or a CLI's output), without this machine's paths, inert.
fn failure(error: &str) -> String {
    let first = error.split(['\n', '\r']).map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    inert(&without_paths(&one_line(first)))
}

/// `text` with each absolute or home path (`/home/me/src/x`, `~/x`) written `[path]`:
/// where a machine keeps its files is no business of a public issue. A URL keeps its path
/// (its `//` is not a path's start), and a lone `/` (as in "a / b") stays.
fn without_paths(text: &str) -> String {
    let ends = |c: char| c.is_whitespace() || "`'\"()[]<>,;:".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    let mut prev: Option<char> = None;
    while let Some((i, c)) = chars.next() {
        let rest = &text[i..];
        let starts = prev.is_none_or(ends) && (rest.starts_with("~/") || c == '/');
        let body = rest.trim_start_matches('~').strip_prefix('/').unwrap_or("");
        if starts && body.chars().next().is_some_and(|n| n != '/' && !ends(n)) {
            let len = rest.find(ends).unwrap_or(rest.len());
            out.push_str("[path]");
            while chars.peek().is_some_and(|(j, _)| *j < i + len) {
                chars.next();
            }
            prev = Some(']');
            continue;
        }
        out.push(c);
        prev = Some(c);
    }
    out
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
pub(super) mod tests {
    use super::*;
    use devpilot_store::job::JobState;

    /// A park's detail gives "until HH:MM UTC"; a branch cannot end its code span.
    #[test]
    fn park_times_and_branches() {
        let detail =
            "the agent asked to be tried later (exit 75, retry_after); claimable again at 2026-12-02T14:30:00Z";
        assert_eq!(until_of(detail), " until 14:30 UTC");
        assert_eq!(until_of("no time here"), "");
        assert_eq!(code("a`b"), "a'b");
    }

    /// A park at a job's own cap says it waits for a person, with no time; a day's cap says
    /// until when; the text after the cap's sentence is left out.
    #[test]
    fn spend_cap_parks_say_what_they_wait_for() {
        let job =
            spend_capped("laptop", "this job spent $0.06 of its $0.05 cap; claimable again at x", " until 00:00 UTC");
        assert_eq!(
            job,
            "Stopped on laptop at its spend cap (this job spent $0.06 of its $0.05 cap); its work is pushed. It waits for a person."
        );
        let day = spend_capped("laptop", "the fleet spent $20.10 of today's $20.00 cap", " until 23:00 UTC");
        assert!(day.contains("today's spend cap") && day.ends_with("It goes on until 23:00 UTC."), "{day}");
    }

    /// Agent text that tries to mention a team, link, embed, cross-reference, close an
    /// issue, end its block with a lone carriage return and a heading, or with backticks,
    /// stays inside one fenced block: every line of it is inside, no `\r` is left, and the
    /// fence is longer than any backtick run in it, so nothing in it can close it.
    #[test]
    fn agent_text_is_one_block_nothing_can_close() {
        let text = "done @org/team\n[x](http://evil) ![img](http://evil/i.png)\nowner/repo#3 #3 Fixes #2\r# Heading\n\
                    ```\n`````\n<!-- devpilot:job/1/completed/1 -->";
        let out = inert(text);
        let lines: Vec<&str> = out.split('\n').collect();
        let fence = lines[0];
        assert!(fence.len() == 6 && fence.chars().all(|c| c == '`'), "longer than the 5-backtick run: {out}");
        assert_eq!(*lines.last().unwrap(), fence);
        let inside = &lines[1..lines.len() - 1];
        assert!(inside.iter().all(|l| l.trim_start().len() < fence.len() || !l.trim_start().starts_with(fence)));
        assert!(!out.contains('\r'), "no carriage return: {out:?}");
        assert!(inside.contains(&"owner/repo#3 #3 Fixes #2# Heading"), "the heading stays in its line: {out}");
        assert!(inside[0] == "done @org/team" && inside[1].starts_with("[x](http://evil)"), "{out}");
        assert!(!out.contains("<!--"), "no marker rides in agent text: {out}");
        assert_eq!(inert("a ` b"), "```\na ` b\n```");
        assert!(inert(&"x".repeat(5000)).len() < 3100, "capped");
    }

    /// A failure shows the error's first line only, even when a lone `\r` ends it, with the
    /// machine's paths left out; a URL and a " / " stay.
    #[test]
    fn failures_show_their_first_line_without_paths() {
        let error = "setup `sh /tmp/devpilot-x/setup.sh` failed (exit status: 3); its last lines:\nfound secret";
        assert_eq!(failure(error), "```\nsetup `sh [path]` failed (exit status: 3); its last lines:\n```");
        assert_eq!(failure("first\rsecond"), "```\nfirst\n```");
        assert_eq!(
            without_paths("repo 'web': /home/me/src/web is not a clone (~/x/y, https://a.example/b/c) a / b"),
            "repo 'web': [path] is not a clone ([path], https://a.example/b/c) a / b"
        );
    }

    /// A result link is published (in the comment and as the attachment) only on the
    /// tracker's host or on the host of the remote the branch went to.
    #[test]
    fn result_links_only_on_the_trackers_or_the_repos_host() {
        let on = |kind: SourceKind| SourceSettings { kind, ..SourceSettings::default() };
        let d = completed_row();
        let linked = |kind: SourceKind, url: &str, pushed: Option<&str>| {
            let job = JobRow { url: Some(url.into()), pushed_remote: pushed.map(str::to_string), ..job_row() };
            let r = report(&d, &job, "devpilot/7", &on(kind));
            let published = r.comment.unwrap().contains(&format!("Result: {url}"));
            assert_eq!(published, r.link.is_some(), "the comment and the attachment agree");
            published
        };
        assert!(linked(SourceKind::Github, "https://github.com/acme/webapp/pull/4", None));
        assert!(!linked(SourceKind::Github, "https://evil.example/x", None));
        assert!(!linked(SourceKind::Github, "https://github.com.evil.example/x", None));
        assert!(linked(SourceKind::Linear, "https://linear.app/acme/issue/ENG-1", None));
        assert!(!linked(SourceKind::Linear, "https://github.com/acme/webapp/pull/4", None));
        assert!(linked(
            SourceKind::Linear,
            "https://git.acme.example/acme/webapp/pull/4",
            Some("git@git.acme.example:acme/webapp.git")
        ));
    }

    /// A completion whose agent changed nothing says so instead of naming a branch that was
    /// never pushed.
    #[test]
    fn a_completion_with_no_changes_says_so() {
        let d = completed_row();
        let github = SourceSettings { kind: SourceKind::Github, ..SourceSettings::default() };
        let said = |commits: Option<i32>| {
            let job = JobRow { commits, ..job_row() };
            report(&d, &job, "devpilot/7", &github).comment.unwrap()
        };
        assert!(said(Some(0)).contains("No changes"), "{}", said(Some(0)));
        assert!(!said(Some(0)).contains("devpilot/7"));
        for commits in [None, Some(2)] {
            assert!(said(commits).contains("Branch: `devpilot/7`"));
            assert!(!said(commits).contains("No changes"));
        }
    }

    /// The `completed` outbox row of job 7, claimed by desktop.
    fn completed_row() -> Delivery {
        Delivery {
            id: 1,
            token: 1,
            job_id: 7,
            source_id: 1,
            event: event::COMPLETED.into(),
            machine: Some("desktop".into()),
            claim_token: Some(1),
            detail: None,
            tries: 1,
            created_at: 0,
        }
    }

    /// A completed job with nothing else said.
    pub(crate) fn job_row() -> JobRow {
        JobRow::bare(7, "o", JobState::Completed)
    }
}
