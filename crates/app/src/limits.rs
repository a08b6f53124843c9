//! The governor as the tray, the window and `devpilot status` tell it: each account the
//! fleet knows today (held until when, or what it spent against its cap), this machine's
//! own, the day's spend against the fleet's cap, and whether jobs parked on a limit wait
//! for a person.

use serde::Serialize;

use devpilot_engine::governor::{clock_of, day_bounds, Account, LimitSettings, TimeZone};
use devpilot_engine::orchestrator::governed::account_for;
use devpilot_store::error::Result;

use crate::engine::Engine;
use devpilot_store::queue::{GovernorView, Queue, SpendRow};

/// The fleet's limits and budgets, today.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LimitsView {
    /// The account this machine's agent runs as (`None`: a plain command, or not known).
    pub this_account: Option<String>,
    /// Every account held now or that spent today, this machine's first.
    pub accounts: Vec<AccountView>,
    pub day: DayView,
    /// The cap on one job's spend (USD), if set.
    pub job_cap_usd: Option<f64>,
    /// Jobs parked on a usage limit wait for a person (`devpilot pause --limits`).
    pub limits_paused: bool,
}

/// How an account stands.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AccountState {
    Ok,
    /// A usage limit holds it on every machine until `held_until`.
    Limited,
    /// At or past the warning share of its daily cap.
    NearCap,
    /// At or past its daily cap: no machine under it claims today.
    Capped,
}

/// One account.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AccountView {
    pub account: String,
    /// "claude · work", "claude · key 3f9a1c…".
    pub label: String,
    pub state: AccountState,
    /// When its hold ends (ms since the epoch), while it is limited.
    pub held_until: Option<i64>,
    pub spent_today_usd: f64,
    pub cap_usd: Option<f64>,
    /// What the tray says of it: "limited until 14:05", "ok", "80 % of today's cap".
    pub line: String,
}

/// The fleet's day.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DayView {
    /// When the day started (ms since the epoch), in `time_zone`.
    pub start_ms: i64,
    pub time_zone: String,
    pub spent_usd: f64,
    pub cap_usd: Option<f64>,
    /// The share of the cap spent (0..), when there is one.
    pub share: Option<f64>,
    /// "today: $3.20 of $20.00 (16 %)", or "today: $3.20" with no cap.
    pub line: String,
}

impl Engine {
    /// The fleet's limits and budgets today, with this machine's account (the tray's menu,
    /// the window's status).
    pub async fn limits(&self) -> Result<LimitsView> {
        let s = self.settings();
        let q = self.queue()?;
        let agent = self.agent_for(&s, false)?;
        let this = match &agent {
            Some(a) => account_for(&q, &s.orchestrator_id, a, &s.machine_name()).await?,
            None => None,
        };
        limits_view(&q, &s.orchestrator_id, &s.limits, this.as_ref().map(Account::as_str)).await
    }

    /// Sets the fleet's switch: while on, jobs parked on a usage limit wait for a person.
    pub async fn set_limits_paused(&self, paused: bool) -> Result<()> {
        let s = self.settings();
        self.queue()?.set_limits_paused(&s.orchestrator_id, paused, &s.machine_name()).await
    }

    /// Whether job `id` resumes by itself after a usage limit; `false` when it is not live.
    pub async fn set_resume_after_limit(&self, id: i64, resume: bool) -> Result<bool> {
        self.queue()?.set_resume_after_limit(&self.settings().orchestrator_id, id, resume).await
    }

    /// Lets job `id`, parked at a cap or on a limit, go on now; `false` when it is not so parked.
    pub async fn let_go(&self, id: i64) -> Result<bool> {
        let s = self.settings();
        self.queue()?.let_go(&s.orchestrator_id, id, &s.machine_name()).await
    }

    /// Ends the hold on `account` before its reset; `false` when it held nothing.
    pub async fn end_hold(&self, account: &str) -> Result<bool> {
        self.queue()?.end_hold(&self.settings().orchestrator_id, account).await
    }
}

/// The limits as the fleet's database says them, judged by these `limits`, for a machine
/// whose agent runs as `this` (when known).
pub async fn limits_view(q: &Queue, orch: &str, limits: &LimitSettings, this: Option<&str>) -> Result<LimitsView> {
    let tz = limits.time_zone();
    let now = q.now_ms().await?;
    let (start, _) = day_bounds(now, &tz);
    let g = q.governor_view(orch, start).await?;
    Ok(judged(&g, limits, this, now, start))
}

/// [`limits_view`]'s judgement of what the database said, at `now` (no I/O).
pub fn judged(g: &GovernorView, limits: &LimitSettings, this: Option<&str>, now: i64, start: i64) -> LimitsView {
    let tz = limits.time_zone();
    let mut names: Vec<String> = g.holds.iter().map(|h| h.account.clone()).collect();
    names.extend(g.by_account.iter().filter_map(|a| a.account.clone()));
    names.extend(this.map(str::to_string));
    names.sort();
    names.dedup();
    // This machine's first, then by name.
    names.sort_by_key(|n| Some(n.as_str()) != this);
    let accounts = names
        .into_iter()
        .map(|name| {
            let hold = g.holds.iter().find(|h| h.account == name).map(|h| h.until_at);
            let mine = g.by_account.iter().filter(|a| a.account.as_deref() == Some(&name));
            // Folded from +0.0: an empty float `sum()` is -0.0, which prints as "$-0.00".
            let spent = mine.fold(0.0, |t, a| t + a.spent_usd);
            account_view(name, hold, spent, limits, now, &tz)
        })
        .collect();
    let share = limits.day_usd.map(|cap| g.day_spent_usd / cap);
    let line = match (limits.day_usd, share) {
        (Some(cap), Some(s)) => format!("today: ${:.2} of ${cap:.2} ({:.0} %)", g.day_spent_usd, (s * 100.0).floor()),
        _ => format!("today: ${:.2}", g.day_spent_usd),
    };
    LimitsView {
        this_account: this.map(str::to_string),
        accounts,
        day: DayView {
            start_ms: start,
            time_zone: tz.iana_name().unwrap_or("local").to_string(),
            spent_usd: g.day_spent_usd,
            cap_usd: limits.day_usd,
            share,
            line,
        },
        job_cap_usd: limits.job_usd,
        limits_paused: g.limits_paused,
    }
}

fn account_view(
    account: String,
    held_until: Option<i64>,
    spent: f64,
    limits: &LimitSettings,
    now: i64,
    tz: &TimeZone,
) -> AccountView {
    let cap = limits.account_day_usd;
    let share = cap.map(|c| spent / c).unwrap_or(0.0);
    let (state, line) = match held_until {
        Some(until) => (AccountState::Limited, format!("limited until {}", clock_of(until, now, tz))),
        None if cap.is_some() && share >= 1.0 => (AccountState::Capped, "today's cap reached".to_string()),
        None if cap.is_some() && share >= limits.warn_at => {
            (AccountState::NearCap, format!("{:.0} % of today's cap", (share * 100.0).floor()))
        }
        None => (AccountState::Ok, "ok".to_string()),
    };
    let label = account_label(&account);
    AccountView { account, label, state, held_until, spent_today_usd: spent, cap_usd: cap, line }
}

/// An account's short name for the tray.
fn account_label(account: &str) -> String {
    serde_json::from_value::<Account>(serde_json::Value::String(account.to_string()))
        .map(|a| a.label())
        .unwrap_or_else(|_| account.to_string())
}

/// A job's spend, each attempt's against the job's cap.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobSpend {
    pub attempts: Vec<SpendRow>,
    pub total_usd: f64,
    pub cap_usd: Option<f64>,
}

/// Job `id`'s spend, by attempt; `None` when it spent nothing and no cap is set.
pub async fn job_spend(q: &Queue, id: i64, limits: &LimitSettings) -> Result<Option<JobSpend>> {
    let attempts = q.job_spend(id).await?;
    if attempts.is_empty() && limits.job_usd.is_none() {
        return Ok(None);
    }
    let total_usd = attempts.iter().fold(0.0, |t, a| t + a.cost_usd);
    Ok(Some(JobSpend { attempts, total_usd, cap_usd: limits.job_usd }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use devpilot_store::queue::{AccountSpend, HoldRow};

    fn limits() -> LimitSettings {
        LimitSettings {
            day_usd: Some(20.0),
            account_day_usd: Some(10.0),
            time_zone: Some("UTC".into()),
            ..LimitSettings::default()
        }
    }

    /// A held account reads "limited until HH:MM", one at 85 % of its cap reads so, one
    /// past it is capped, and this machine's account comes first even with nothing spent.
    #[test]
    fn accounts_read_as_the_tray_says_them() {
        let now = 1_796_212_800_000; // 12:00 UTC
        let hold = HoldRow {
            account: "claude:work".into(),
            until_at: now + 125 * 60_000,
            reason: None,
            machine: "laptop".into(),
            job_id: Some(1),
            held_at: now,
        };
        let spend = |a: &str, usd: f64| AccountSpend { account: Some(a.into()), spent_usd: usd };
        let g = GovernorView {
            holds: vec![hold],
            day_spent_usd: 19.5,
            by_account: vec![spend("codex:home", 8.5), spend("gemini:x", 11.0)],
            limits_paused: true,
        };
        let v = judged(&g, &limits(), Some("aider:mine"), now, now - 12 * 3_600_000);
        let lines: Vec<(&str, &str)> = v.accounts.iter().map(|a| (a.account.as_str(), a.line.as_str())).collect();
        assert_eq!(
            lines,
            [
                ("aider:mine", "ok"),
                ("claude:work", "limited until 14:05"),
                ("codex:home", "85 % of today's cap"),
                ("gemini:x", "today's cap reached"),
            ]
        );
        assert_eq!(v.accounts[1].state, AccountState::Limited);
        assert_eq!(v.day.line, "today: $19.50 of $20.00 (97 %)");
        assert!(v.limits_paused);
    }

    /// A day with no spend reads "$0.00", never "$-0.00" (an empty float sum is -0.0).
    #[test]
    fn nothing_spent_reads_zero() {
        let v = judged(&GovernorView::default(), &limits(), Some("claude:work"), 0, 0);
        assert_eq!(v.day.line, "today: $0.00 of $20.00 (0 %)");
        assert_eq!(v.accounts[0].line, "ok");
        assert!(v.accounts[0].spent_today_usd.is_sign_positive());
    }
}
