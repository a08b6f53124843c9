//! A delivery acts only on its own source. The job row (its payload's `source`, its
//! `pushed_remote`) was written by a producer or another machine, and either may be hostile:
//! so the repo, team and host of every comment, label, state move, attachment and pull
//! request come from the settings of the source on this machine, and the payload only
//! chooses among what those allow. A row that names anything else is refused, with the
//! reason, and acts on nothing.
//!
//! - GitHub: the issue must be in the source's `repo`; the calls go to the source's own API.
//! - Linear: the issue is looked up by its id with this machine's key, and its team must be
//!   one of the source's `teams`; the team the state moves use is the one Linear names, not
//!   the payload's (see `linear::deliver`).
//! - A pull request: only on the remote configured for the job's repo on this machine.

use serde_json::Value;

use super::github::{self, pulls::GithubRemote};
use super::linear;
use super::settings::{valid_github_repo, SourceKind, SourceSettings};

/// The issue a delivery may act on, as the source's settings allow it.
#[derive(Clone, Debug)]
pub enum Target {
    Github(github::IssueRef),
    Linear(linear::IssueRef),
}

/// The issue `payload` names, if `source` allows it; else why not.
pub fn issue_of(source_name: &str, source: &SourceSettings, payload: &Value) -> Result<Target, String> {
    let named = payload.pointer("/source/kind").and_then(Value::as_str).unwrap_or("none");
    if named != source.kind.as_str() {
        return Err(format!("the job names a {named} issue, and source '{source_name}' is {}", source.kind.as_str()));
    }
    match source.kind {
        SourceKind::Github => github_issue(source_name, source, payload).map(Target::Github),
        SourceKind::Linear => linear_issue(payload).map(Target::Linear),
    }
}

/// The GitHub issue: a valid `owner/repo` that is the source's own, and a number.
fn github_issue(source_name: &str, source: &SourceSettings, payload: &Value) -> Result<github::IssueRef, String> {
    let issue = github::IssueRef::of(payload).ok_or("the job's GitHub issue is not an owner/repo and a number")?;
    if !valid_github_repo(&issue.repo) || issue.number == 0 {
        return Err(format!("the job names '{}#{}', which is not a GitHub issue", one_line(&issue.repo), issue.number));
    }
    if !issue.repo.eq_ignore_ascii_case(&source.repo) {
        return Err(format!(
            "the job names {}#{}, and source '{source_name}' watches {}",
            issue.repo, issue.number, source.repo
        ));
    }
    // The settings' spelling, not the row's.
    Ok(github::IssueRef { repo: source.repo.clone(), number: issue.number })
}

/// The Linear issue: an id of the shape Linear gives (its team is checked with Linear).
fn linear_issue(payload: &Value) -> Result<linear::IssueRef, String> {
    let issue = linear::IssueRef::of(payload).ok_or("the job's Linear issue has no id and team")?;
    let plain = |s: &str| !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !plain(&issue.id) || !plain(&issue.team) {
        return Err(format!("the job names the Linear issue '{}', which is not an id", one_line(&issue.id)));
    }
    Ok(issue)
}

/// Whether `pushed` (where the completing machine says it pushed the branch) is `configured`
/// (the remote of the job's repo on this machine): the same host and repository.
pub fn same_remote(pushed: &GithubRemote, configured: &str) -> Result<(), String> {
    let Some(here) = GithubRemote::parse(configured) else {
        return Err("the job's repo on this machine has no GitHub remote".into());
    };
    let same =
        here.host.eq_ignore_ascii_case(&pushed.host) && here.full_name().eq_ignore_ascii_case(&pushed.full_name());
    if same {
        Ok(())
    } else {
        Err(format!(
            "the job says its branch went to {}/{}, and its repo's remote on this machine is {}/{}",
            pushed.host,
            pushed.full_name(),
            here.host,
            here.full_name()
        ))
    }
}

/// The first line of row text, short, for a reason.
fn one_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().filter(|c| !c.is_control()).take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn github_source() -> SourceSettings {
        SourceSettings { kind: SourceKind::Github, repo: "acme/webapp".into(), ..Default::default() }
    }

    /// Only the source's own repo (any case, spelt as the settings spell it) is acted on;
    /// another repo, `..`, a zero number or another tracker's issue is refused with why.
    #[test]
    fn a_github_delivery_is_bound_to_its_repo() {
        let s = github_source();
        let p = |repo: &str, n: u64| json!({"source": {"kind": "github", "repo": repo, "number": n}});
        let Ok(Target::Github(ok)) = issue_of("gh", &s, &p("ACME/WebApp", 7)) else { panic!() };
        assert_eq!((ok.repo.as_str(), ok.number), ("acme/webapp", 7));
        let other = issue_of("gh", &s, &p("other/private", 5)).unwrap_err();
        assert!(other.contains("other/private#5") && other.contains("watches acme/webapp"), "{other}");
        assert!(issue_of("gh", &s, &p("../..", 5)).is_err());
        assert!(issue_of("gh", &s, &p("acme/webapp", 0)).is_err());
        let linear = json!({"source": {"kind": "linear", "id": "abc", "team": "t"}});
        assert!(issue_of("gh", &s, &linear).unwrap_err().contains("linear issue"));
    }

    /// A pull request goes only where this machine's clone of the repo pushes.
    #[test]
    fn a_pull_request_is_bound_to_the_configured_remote() {
        let pushed = GithubRemote::parse("https://github.com/acme/webapp.git").unwrap();
        assert!(same_remote(&pushed, "git@github.com:Acme/webapp.git").is_ok());
        let why = same_remote(&pushed, "https://github.com/other/private").unwrap_err();
        assert!(why.contains("other/private"), "{why}");
        assert!(same_remote(&pushed, "/srv/git/webapp.git").is_err());
        assert_eq!(GithubRemote::parse("https://github.com/../webapp"), None);
        assert_eq!(GithubRemote::parse("https://github.com/acme/.."), None);
        assert_eq!(GithubRemote::parse("git@github.com:acme/.."), None);
        assert_eq!(GithubRemote::parse("git@github.com:./webapp"), None);
    }
}
