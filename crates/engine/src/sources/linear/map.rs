//! An issue as a job: its unique key, its payload (title, capped prompt, URL, repo,
//! `requires`, branch, and where it came from) and its priority.

use serde_json::{json, Value};

use super::issues::Issue;
use crate::sources::settings::SourceSettings;
use crate::sources::text::{prompt_of, requires_from, title_of};

/// The job's unique key: `linear:ENG-7`.
pub fn key_of(identifier: &str) -> String {
    format!("linear:{identifier}")
}

/// Linear's priority (1 urgent … 4 low, 0 none) as the job's (higher runs first): urgent 4,
/// high 3, medium 2, low 1, none 0.
pub fn priority_of(linear: f64) -> i32 {
    match linear.round() as i64 {
        1 => 4,
        2 => 3,
        3 => 2,
        4 => 1,
        _ => 0,
    }
}

/// The repo: the first label with a mapping, else the project's, else the team's, else the
/// source's `maps_to`.
pub fn repo_of(issue: &Issue, s: &SourceSettings) -> Option<String> {
    let by_label = issue.label_names().find_map(|l| s.repo_by_label.get(l));
    let by_project = issue.project.as_ref().and_then(|p| s.repo_by_project.get(&p.name));
    let by_team = s.repo_by_team.get(&issue.team.key);
    let mapped = by_label.or(by_project).or(by_team).cloned();
    mapped.or_else(|| Some(s.maps_to.clone()).filter(|m| !m.is_empty()))
}

/// The labels with the source's prefix, without it ([`requires_from`]).
pub fn requires_of(issue: &Issue, s: &SourceSettings) -> Vec<String> {
    requires_from(issue.label_names(), &s.requires_prefix)
}

/// The job's branch name, from Linear's own `branchName` for the issue (its last part,
/// e.g. `eng-7-fix-login`): the job's branch is `devpilot/<id>-eng-7-fix-login`, which holds
/// the identifier, so Linear links the branch and its pull request to the issue, and the job
/// id keeps two jobs of one issue off each other's branch.
pub fn branch_of(issue: &Issue) -> Option<String> {
    let b = issue.branch_name.trim().rsplit('/').next().unwrap_or_default();
    devpilot_store::spec::validate_base(b).ok().map(|_| b.to_string())
}

/// The issue version a job's payload reflects (`source.updated_at`).
pub fn version_of(payload: &Value) -> Option<&str> {
    payload.pointer("/source/updated_at").and_then(Value::as_str)
}

/// Whether two payloads ask for the same work: equal but for the version they came from
/// (a comment of ours changes the issue's `updatedAt` and nothing else) and the approval the
/// job was added under.
pub fn same_task(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(s) = v.get_mut("source").and_then(Value::as_object_mut) {
            s.remove("updated_at");
            s.remove("approval");
        }
        v
    };
    strip(a) == strip(b)
}

/// The job's payload.
pub fn payload_of(issue: &Issue, source: &str, s: &SourceSettings) -> Value {
    let title = title_of(&issue.identifier, &issue.title);
    let mut p = json!({
        "title": title,
        "prompt": prompt_of(issue.description.as_deref(), s.prompt_cap, &issue.url),
        "url": issue.url,
        "source": {
            "kind": "linear", "name": source, "id": issue.id, "identifier": issue.identifier,
            "team": issue.team.id, "url": issue.url, "updated_at": issue.updated_at,
        },
    });
    if let Some(repo) = repo_of(issue, s) {
        p["repo"] = repo.into();
    }
    let requires = requires_of(issue, s);
    if !requires.is_empty() {
        p["requires"] = requires.into();
    }
    if let Some(b) = branch_of(issue) {
        p["branch"] = b.into();
    }
    p
}
