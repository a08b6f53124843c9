//! Routing: what a machine may pick, and why no machine can take a job.

use sea_orm::{ColIdx, QueryResult, TryGetError, TryGetable, Value};
use serde::Serialize;

use super::dialect::Dialect;

/// What a machine may pick: jobs with no repo or one of `repos`, and jobs whose `requires`
/// labels are all among `labels`. It is part of the pick's WHERE, so the pick stays one
/// herd-free statement; the repo and label names are parameters, never SQL.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Route {
    pub repos: Vec<String>,
    pub labels: Vec<String>,
    /// Which repos' tracker jobs (a stranger's issue) this machine takes: all of its repos
    /// (None), or only these (a machine that cannot confine its agents takes a tracker's
    /// job only for a repo whose settings say `sandbox = "off"`).
    pub tracker_repos: Option<Vec<String>>,
    /// What the governor lets it claim: nothing of a held account, nothing past the day's
    /// cap, and no job parked for a person.
    pub governor: Governor,
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
        let governed = self.governor.sql(d, values);
        format!("{repo} AND {requires}{trackers} AND {governed}")
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

/// What the governor lets a machine claim, as part of its pick's WHERE (see
/// [`Route`](super::Route)). It joins statements whose orchestrator is `$1`, so each of its
/// subqueries is uncorrelated: PostgreSQL runs each once per statement, not once per row.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Governor {
    /// The account this machine's agent runs as: none of its jobs is claimed while a hold
    /// on it lasts (plus `skew_ms`). `None`: an agent with no account (a plain command).
    pub account: Option<String>,
    /// How long past its reset a hold still holds, for clocks that disagree.
    pub skew_ms: i64,
    /// The start of the user's day (ms since the epoch), from which the day's spend counts.
    pub day_start_ms: i64,
    /// The fleet's cap on a day's spend (USD); `None`: off.
    pub day_usd: Option<f64>,
    /// The cap on a day's spend under this machine's account (USD); `None`: off.
    pub account_day_usd: Option<f64>,
}

/// A job parked for a person is not claimable: one parked on its own cap, or on a limit
/// when it (or the fleet, `governor.limits_paused_at`) says not to resume after a limit.
const PARKED_CLAIMABLE: &str = "(dispatch_queue.parked_for IS NULL OR dispatch_queue.parked_for = 'day_cap'
      OR (dispatch_queue.parked_for = 'limit' AND dispatch_queue.resume_after_limit = 1
          AND NOT EXISTS (SELECT 1 FROM governor g WHERE g.orchestrator_id = {o} AND g.limits_paused_at IS NOT NULL)))";

impl Governor {
    /// The governor's predicate over `dispatch_queue` in dialect `d`, its values appended to
    /// `values` (the statement's `$1` is the orchestrator).
    pub(super) fn sql(&self, d: &Dialect, values: &mut Vec<Value>) -> String {
        let mut param = |v: Value| {
            values.push(v);
            d.p(values.len())
        };
        let o = d.p(1);
        let mut out = PARKED_CLAIMABLE.replace("{o}", &o);
        let account = self.account.clone().map(|a| param(a.into()));
        if let Some(a) = &account {
            let skew = param(self.skew_ms.into());
            out.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM account_holds h
                                   WHERE h.orchestrator_id = {o} AND h.account = {a} AND h.until_at + {skew} > {now})",
                now = d.now
            ));
        }
        // From the quarter hours' running totals (`spend_quarters`, kept by triggers on
        // `spend`): at most 96 rows a day, however many attempts spent.
        let spent = |day: &str, whose: &str| {
            format!(
                "(SELECT COALESCE(SUM(t.cost_usd), 0) FROM spend_quarters t
                   WHERE t.orchestrator_id = {o} AND t.account = {whose} AND t.quarter_at >= {day})"
            )
        };
        if self.day_usd.is_some() || (self.account_day_usd.is_some() && account.is_some()) {
            let day = param(self.day_start_ms.into());
            if let Some(cap) = self.day_usd {
                out.push_str(&format!(" AND {} < {}", spent(&day, "'*'"), param(cap.into())));
            }
            if let (Some(cap), Some(a)) = (self.account_day_usd, &account) {
                out.push_str(&format!(" AND {} < {}", spent(&day, a), param(cap.into())));
            }
        }
        out
    }
}
