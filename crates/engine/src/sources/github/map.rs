//! A GitHub issue as a job: its unique key (`github:acme/webapp#7`), its payload (title,
//! capped prompt, URL, repo, `requires`, branch, and where it came from) and its priority.

use serde_json::{json, Value};

use super::issues::GhIssue;
use crate::sources::settings::SourceSettings;
use crate::sources::text::{prompt_of, requires_from, title_of};

/// The job's unique key: `github:acme/webapp#7` (the repository as configured, lower case:
/// GitHub's names are case-insensitive).
pub fn key_of(repo: &str, number: u64) -> String {
    format!("github:{}#{number}", repo.to_lowercase())
}

/// The highest priority among the issue's labels that the source maps (case-insensitive).
pub fn priority_of(issue: &GhIssue, s: &SourceSettings) -> i32 {
    issue
        .label_names()
        .filter_map(|l| s.priority_labels.iter().find(|(k, _)| k.eq_ignore_ascii_case(l)).map(|(_, p)| *p))
        .max()
        .unwrap_or(0)
}

/// The repo: the first label with a mapping, else `maps_to`.
pub fn repo_of(issue: &GhIssue, s: &SourceSettings) -> Option<String> {
    let by_label = issue.label_names().find_map(|l| s.repo_by_label.get(l)).cloned();
    by_label.or_else(|| Some(s.maps_to.clone()).filter(|m| !m.is_empty()))
}

/// The labels with the source's prefix, without it.
pub fn requires_of(issue: &GhIssue, s: &SourceSettings) -> Vec<String> {
    requires_from(issue.label_names(), &s.requires_prefix)
}

/// The branch's name: `gh-7-fix-the-login` (the number, then the title's first words in
/// lower-case ASCII); the job's branch is `devpilot/<id>-gh-7-fix-the-login`.
pub fn branch_of(issue: &GhIssue) -> String {
    let mut slug = String::new();
    for c in issue.title.chars().flat_map(char::to_lowercase) {
        if slug.len() >= 40 {
            break;
        }
        match c {
            'a'..='z' | '0'..='9' => slug.push(c),
            _ if !slug.ends_with('-') && !slug.is_empty() => slug.push('-'),
            _ => {}
        }
    }
    let slug = slug.trim_end_matches('-');
    if slug.is_empty() {
        format!("gh-{}", issue.number)
    } else {
        format!("gh-{}-{slug}", issue.number)
    }
}

/// The job's payload.
pub fn payload_of(issue: &GhIssue, source: &str, s: &SourceSettings) -> Value {
    let title = title_of(&format!("#{}", issue.number), &issue.title);
    let mut p = json!({
        "title": title,
        "prompt": prompt_of(issue.body.as_deref(), s.prompt_cap, &issue.html_url),
        "url": issue.html_url,
        "branch": branch_of(issue),
        "source": {
            "kind": "github", "name": source, "repo": s.repo.to_lowercase(), "number": issue.number,
            "identifier": format!("#{}", issue.number), "url": issue.html_url, "updated_at": issue.updated_at,
        },
    });
    if let Some(repo) = repo_of(issue, s) {
        p["repo"] = repo.into();
    }
    let requires = requires_of(issue, s);
    if !requires.is_empty() {
        p["requires"] = requires.into();
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(title: &str, labels: &[&str]) -> GhIssue {
        let labels: Vec<Value> = labels.iter().map(|l| json!({ "name": l })).collect();
        serde_json::from_value(json!({
            "number": 7, "title": title, "body": "b", "html_url": "https://github.com/acme/webapp/issues/7",
            "state": "open", "labels": labels, "updated_at": "2026-12-02T10:00:00Z",
        }))
        .unwrap()
    }

    /// The key, the branch (ASCII, cut, never empty), the priority from mapped labels and
    /// the repo from `maps_to` come out as the settings say.
    #[test]
    fn an_issue_as_a_job() {
        let mut s = SourceSettings { repo: "Acme/WebApp".into(), maps_to: "webapp".into(), ..Default::default() };
        s.priority_labels.insert("Urgent".into(), 4);
        s.priority_labels.insert("low".into(), 1);
        assert_eq!(key_of(&s.repo, 7), "github:acme/webapp#7");
        let i = issue("Fix the login — ✨ fast!", &["urgent", "low", "agent"]);
        assert_eq!(branch_of(&i), "gh-7-fix-the-login-fast");
        assert_eq!(branch_of(&issue("✨✨", &[])), "gh-7");
        assert_eq!(priority_of(&i, &s), 4);
        let p = payload_of(&i, "gh", &s);
        assert_eq!(p["repo"], "webapp");
        assert_eq!(p["source"]["repo"], "acme/webapp");
        devpilot_store::spec::check_payload(&p).unwrap();
    }
}
