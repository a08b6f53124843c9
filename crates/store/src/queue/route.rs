//! Routing: what a machine may pick, and why no machine can take a job.

use sea_orm::Value;
use serde::Serialize;

use super::rows::MachineRow;

/// What a machine may pick: jobs with no repo or one of `repos`, and jobs whose `requires`
/// labels are all among `labels`. It is part of the pick's WHERE, so the pick stays one
/// herd-free statement; the repo and label names are parameters, never SQL.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Route {
    pub repos: Vec<String>,
    pub labels: Vec<String>,
}

impl Route {
    /// The routing predicate over `dispatch_queue`; the names become parameters after `values`.
    pub(super) fn sql(&self, values: &mut Vec<Value>) -> String {
        let mut list = |names: &[String]| -> String {
            let ph: Vec<String> = names
                .iter()
                .map(|n| {
                    values.push(n.clone().into());
                    format!("${}", values.len())
                })
                .collect();
            ph.join(", ")
        };
        let repo = if self.repos.is_empty() {
            "dispatch_queue.repo IS NULL".to_string()
        } else {
            format!("(dispatch_queue.repo IS NULL OR dispatch_queue.repo IN ({}))", list(&self.repos))
        };
        let requires = if self.labels.is_empty() {
            "dispatch_queue.requires IS NULL".to_string()
        } else {
            format!(
                "(dispatch_queue.requires IS NULL OR NOT EXISTS (SELECT 1 FROM {{REQUIRES_EACH}} WHERE r.value NOT IN ({})))",
                list(&self.labels)
            )
        };
        format!("{repo} AND {requires}")
    }

    /// Why a machine with this route cannot take a job of `repo` needing `requires`.
    pub fn refuses(&self, repo: Option<&str>, requires: &[String]) -> Option<String> {
        if let Some(r) = repo.filter(|r| !self.repos.iter().any(|x| x == r)) {
            return Some(format!("repo {r}"));
        }
        let missing: Vec<&str> = requires.iter().filter(|l| !self.labels.contains(l)).map(String::as_str).collect();
        (!missing.is_empty()).then(|| format!("label {}", missing.join(", ")))
    }
}

/// A JSON array of names, or NULL for none.
pub(super) fn names_json(names: &[String]) -> Option<String> {
    (!names.is_empty()).then(|| serde_json::Value::from(names.to_vec()).to_string())
}

/// A JSON array column as names (NULL or unreadable: none).
pub(super) fn names_of(col: Option<String>) -> Vec<String> {
    col.and_then(|c| serde_json::from_str(&c).ok()).unwrap_or_default()
}

/// Why no online machine can take a job of `repo` needing `requires` (`None`: one can).
pub fn unroutable(repo: Option<&str>, requires: &[String], machines: &[MachineRow]) -> Option<String> {
    let online: Vec<&MachineRow> = machines.iter().filter(|m| m.online()).collect();
    if online.is_empty() {
        return (repo.is_some() || !requires.is_empty()).then(|| "no machine is online".to_string());
    }
    let reasons: Vec<String> = online.iter().filter_map(|m| m.route().refuses(repo, requires)).collect();
    if reasons.len() < online.len() {
        return None;
    }
    // Name the first reason: every online machine refuses it for one.
    Some(format!("no online machine has {}", reasons[0]))
}
