//! Routing: what a machine may pick, and why no machine can take a job.

use sea_orm::{ColIdx, QueryResult, TryGetError, TryGetable, Value};
use serde::Serialize;

use super::dialect::Dialect;

/// What a machine may pick: jobs with no repo or one of `repos`, and jobs whose `requires`
/// labels are all among `labels`. It is part of the pick's WHERE, so the pick stays one
/// herd-free statement; the repo and label names are parameters, never SQL.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Route {
    pub repos: Vec<String>,
    pub labels: Vec<String>,
    /// Which repos' tracker jobs (a stranger's issue) this machine takes: all of its repos
    /// (None), or only these (a machine that cannot confine its agents takes a tracker's
    /// job only for a repo whose settings say `sandbox = "off"`).
    pub tracker_repos: Option<Vec<String>>,
}

impl Route {
    /// The routing predicate over `dispatch_queue` in dialect `d`; the names become
    /// parameters after `values`.
    pub(super) fn sql(&self, d: &Dialect, values: &mut Vec<Value>) -> String {
        let mut list = |names: &[String]| -> String {
            let ph: Vec<String> = names
                .iter()
                .map(|n| {
                    values.push(n.clone().into());
                    d.p(values.len())
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
                "(dispatch_queue.requires IS NULL OR NOT EXISTS (SELECT 1 FROM {} WHERE r.value NOT IN ({})))",
                d.requires_each,
                list(&self.labels)
            )
        };
        let trackers = match &self.tracker_repos {
            None => String::new(),
            Some(r) if r.is_empty() => " AND dispatch_queue.source_id IS NULL".to_string(),
            Some(r) => format!(" AND (dispatch_queue.source_id IS NULL OR dispatch_queue.repo IN ({}))", list(r)),
        };
        format!("{repo} AND {requires}{trackers}")
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

/// Names stored as a JSON array in a text column (`requires`, `repos`, `labels`), read as a
/// list: NULL or unreadable is none. Serialized as the list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Names(pub Vec<String>);

impl std::ops::Deref for Names {
    type Target = Vec<String>;

    fn deref(&self) -> &Vec<String> {
        &self.0
    }
}

impl From<Vec<String>> for Names {
    fn from(names: Vec<String>) -> Self {
        Self(names)
    }
}

impl From<Names> for Vec<String> {
    fn from(names: Names) -> Self {
        names.0
    }
}

impl PartialEq<Vec<String>> for Names {
    fn eq(&self, other: &Vec<String>) -> bool {
        &self.0 == other
    }
}

impl TryGetable for Names {
    fn try_get_by<I: ColIdx>(res: &QueryResult, index: I) -> Result<Self, TryGetError> {
        let col = Option::<String>::try_get_by(res, index)?;
        Ok(Self(col.and_then(|c| serde_json::from_str(&c).ok()).unwrap_or_default()))
    }
}
