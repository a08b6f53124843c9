//! The governor's decisions, as pure functions of what was spent and when: the bounds of the
//! fleet's day, whether a cap is near or passed, and how long a usage limit holds its
//! account. The callers read the sums from the shared database and act on the verdicts.

use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::settings::LimitSettings;

const DAY_MS: i64 = 86_400_000;

/// The start of today and of tomorrow in `tz`, in milliseconds since the epoch, for the
/// instant `now_ms`. A day is not always 24 hours: a change to or from summer time makes it
/// 23 or 25, and a day may start at 01:00 where midnight does not exist.
pub fn day_bounds(now_ms: i64, tz: &TimeZone) -> (i64, i64) {
    let bounds = || -> Result<(i64, i64), jiff::Error> {
        let now = Timestamp::from_millisecond(now_ms)?.to_zoned(tz.clone());
        let today = now.start_of_day()?;
        let tomorrow = now.date().tomorrow()?.to_zoned(tz.clone())?.start_of_day()?;
        Ok((today.timestamp().as_millisecond(), tomorrow.timestamp().as_millisecond()))
    };
    // Only an instant beyond the years jiff handles (±9999) fails: a UTC day then.
    bounds().unwrap_or_else(|_| {
        let start = now_ms.div_euclid(DAY_MS) * DAY_MS;
        (start, start.saturating_add(DAY_MS))
    })
}

/// The wall-clock time of `at_ms` in `tz` as a person reads it next to `now_ms`: "14:05"
/// today, "Tue 14:05" on another day.
pub fn clock_of(at_ms: i64, now_ms: i64, tz: &TimeZone) -> String {
    let zoned = |ms: i64| Timestamp::from_millisecond(ms).ok().map(|t| t.to_zoned(tz.clone()));
    match (zoned(at_ms), zoned(now_ms)) {
        (Some(at), Some(now)) if at.date() == now.date() => at.strftime("%H:%M").to_string(),
        (Some(at), _) => at.strftime("%a %H:%M").to_string(),
        _ => "?".into(),
    }
}

/// A cap on spending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cap {
    /// One job, over all its attempts.
    Job,
    /// The whole fleet, today.
    Day,
    /// One account, today.
    AccountDay,
}

/// The caps in force (none: off) and the fraction of one at which to warn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Caps {
    pub job: Option<f64>,
    pub day: Option<f64>,
    pub account_day: Option<f64>,
    pub warn_at: f64,
}

impl From<&LimitSettings> for Caps {
    fn from(l: &LimitSettings) -> Self {
        Caps { job: l.job_usd, day: l.day_usd, account_day: l.account_day_usd, warn_at: l.warn_at }
    }
}

/// What has been spent, in USD, against each cap.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spending {
    pub job: f64,
    pub day: f64,
    pub account_day: f64,
}

/// How spending stands against the caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Under,
    /// At or past the warning fraction of this cap.
    Warn(Cap),
    /// At or past this cap.
    Over(Cap),
}

impl Caps {
    /// The most severe verdict: a cap passed beats a warning; between caps alike, the job's
    /// first (stopping the job is the smallest remedy), then the fleet's day, then the
    /// account's.
    pub fn judge(&self, s: &Spending) -> Verdict {
        let pairs = [
            (Cap::Job, self.job, s.job),
            (Cap::Day, self.day, s.day),
            (Cap::AccountDay, self.account_day, s.account_day),
        ];
        let set = || pairs.iter().filter_map(|&(cap, limit, spent)| limit.map(|l| (cap, l, spent)));
        if let Some((cap, ..)) = set().find(|&(_, l, spent)| spent >= l) {
            return Verdict::Over(cap);
        }
        match set().find(|&(_, l, spent)| spent >= l * self.warn_at) {
            Some((cap, ..)) => Verdict::Warn(cap),
            None => Verdict::Under,
        }
    }

    /// The limit of `cap`, if it is set.
    pub fn limit(&self, cap: Cap) -> Option<f64> {
        match cap {
            Cap::Job => self.job,
            Cap::Day => self.day,
            Cap::AccountDay => self.account_day,
        }
    }
}

/// What a verdict says, for a notification or a job's summary: spending at or past `limit`
/// is a cap reached ("spend cap: this job spent $0.06 of its $0.05 cap"), below it a
/// warning ("80 % of today's $20.00 cap spent ($16.12)").
pub fn describe(cap: Cap, spent: f64, limit: f64) -> String {
    if spent >= limit {
        let whose = match cap {
            Cap::Job => "this job spent",
            Cap::Day => "the fleet spent",
            Cap::AccountDay => "this account spent",
        };
        let of = match cap {
            Cap::Job => "its",
            Cap::Day | Cap::AccountDay => "today's",
        };
        return format!("spend cap: {whose} ${spent:.2} of {of} ${limit:.2} cap");
    }
    let share = if limit > 0.0 { (spent / limit * 100.0).floor() } else { 0.0 };
    let which = match cap {
        Cap::Job => "this job's",
        Cap::Day => "today's",
        Cap::AccountDay => "this account's daily",
    };
    format!("{share:.0} % of {which} ${limit:.2} cap spent (${spent:.2})")
}

/// When a hold on an account that hit a usage limit at `now_ms` ends: at the reset time the
/// CLI gave (never before now), else `default_hold` from now. The caller adds the skew.
pub fn hold_until(reset_ms: Option<i64>, now_ms: i64, default_hold: Duration) -> i64 {
    let default = i64::try_from(default_hold.as_millis()).unwrap_or(i64::MAX);
    match reset_ms {
        Some(reset) => reset.max(now_ms),
        None => now_ms.saturating_add(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time today reads as its hour, another day's with the weekday, in the zone given.
    #[test]
    fn clock_times_read_in_the_zone() {
        let tz = TimeZone::get("Europe/Paris").unwrap();
        let now = 1_796_212_800_000; // 2026-12-02 12:00 UTC, 13:00 in Paris
        assert_eq!(clock_of(now + 65 * 60_000, now, &tz), "14:05");
        assert_eq!(clock_of(now + 24 * 3_600_000, now, &tz), "Thu 13:00");
    }
    use jiff::civil::date;

    fn ms(zoned: jiff::Zoned) -> i64 {
        zoned.timestamp().as_millisecond()
    }

    /// The day runs from midnight to midnight in the zone: 24 hours in Paris in winter, 23
    /// on the day summer time starts, 25 on the day it ends; another zone, another day.
    #[test]
    fn days_follow_the_zone() {
        // The rules of Europe/Paris, from POSIX: no time zone database needed.
        let paris = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        let at = |y, m, d, h| ms(date(y, m, d).at(h, 30, 0, 0).to_zoned(paris.clone()).unwrap());
        let (start, end) = day_bounds(at(2026, 12, 6, 23), &paris);
        assert_eq!(start, ms(date(2026, 12, 6).to_zoned(paris.clone()).unwrap()));
        assert_eq!(start, ms(date(2026, 12, 5).at(23, 0, 0, 0).to_zoned(TimeZone::UTC).unwrap()), "UTC+1");
        assert_eq!(end - start, DAY_MS);
        let (start, end) = day_bounds(at(2026, 3, 29, 12), &paris);
        assert_eq!(end - start, DAY_MS - 3_600_000, "spring forward");
        let (start, end) = day_bounds(at(2026, 10, 25, 12), &paris);
        assert_eq!(end - start, DAY_MS + 3_600_000, "fall back");
        let now = at(2026, 12, 6, 0); // 00:30 in Paris is still the 5th in New York.
        let new_york = TimeZone::posix("EST5EDT,M3.2.0,M11.1.0").unwrap();
        let (ny_start, ny_end) = day_bounds(now, &new_york);
        assert_eq!(ny_start, ms(date(2026, 12, 5).at(5, 0, 0, 0).to_zoned(TimeZone::UTC).unwrap()));
        assert!(ny_start <= now && now < ny_end);
        assert_eq!(day_bounds(DAY_MS + 5, &TimeZone::UTC), (DAY_MS, 2 * DAY_MS));
    }

    /// Where midnight does not exist (a clock that springs forward at 00:00), the day
    /// starts at 01:00.
    #[test]
    fn a_day_may_start_after_midnight() {
        // Chile's old rule: summer time began at 24:00 on the first Saturday of September.
        let tz = TimeZone::posix("<-04>4<-03>,M9.1.6/24,M4.1.6/24").unwrap();
        let noon = ms(date(2026, 9, 6).at(12, 0, 0, 0).to_zoned(tz.clone()).unwrap());
        let (start, _) = day_bounds(noon, &tz);
        assert_eq!(start, ms(date(2026, 9, 6).at(1, 0, 0, 0).to_zoned(tz).unwrap()));
    }

    /// A cap reached beats a warning; among alike, the job's first; an unset cap is never
    /// judged.
    #[test]
    fn the_most_severe_verdict() {
        let caps = Caps { job: Some(2.0), day: Some(20.0), account_day: None, warn_at: 0.8 };
        let v = |job, day, account_day| caps.judge(&Spending { job, day, account_day });
        assert_eq!(v(0.5, 5.0, 1e9), Verdict::Under, "no account cap");
        assert_eq!(v(1.6, 5.0, 0.0), Verdict::Warn(Cap::Job));
        assert_eq!(v(1.6, 16.0, 0.0), Verdict::Warn(Cap::Job));
        assert_eq!(v(0.1, 16.0, 0.0), Verdict::Warn(Cap::Day));
        assert_eq!(v(1.9, 20.0, 0.0), Verdict::Over(Cap::Day), "over beats warn");
        assert_eq!(v(2.0, 25.0, 0.0), Verdict::Over(Cap::Job));
        let off = Caps::from(&LimitSettings::default());
        assert_eq!(off.judge(&Spending { job: 1e9, day: 1e9, account_day: 1e9 }), Verdict::Under);
        let account = Caps { account_day: Some(10.0), ..off };
        assert_eq!(
            account.judge(&Spending { account_day: 10.5, ..Default::default() }),
            Verdict::Over(Cap::AccountDay)
        );
        assert_eq!(account.limit(Cap::AccountDay), Some(10.0));
    }

    /// A cap reached and a warning each say what, how much and of which cap.
    #[test]
    fn verdicts_read_well() {
        assert_eq!(describe(Cap::Job, 0.06, 0.05), "spend cap: this job spent $0.06 of its $0.05 cap");
        assert_eq!(describe(Cap::Day, 16.12, 20.0), "80 % of today's $20.00 cap spent ($16.12)");
        assert_eq!(describe(Cap::Day, 21.0, 20.0), "spend cap: the fleet spent $21.00 of today's $20.00 cap");
        assert_eq!(describe(Cap::AccountDay, 8.0, 10.0), "80 % of this account's daily $10.00 cap spent ($8.00)");
    }

    /// A hold lasts until the reset the CLI gave (not before now), else the default.
    #[test]
    fn holds_end_at_the_reset() {
        let hour = Duration::from_secs(3600);
        assert_eq!(hold_until(Some(5_000_000), 1_000_000, hour), 5_000_000);
        assert_eq!(hold_until(Some(500), 1_000_000, hour), 1_000_000, "a reset in the past");
        assert_eq!(hold_until(None, 1_000_000, hour), 4_600_000);
        assert_eq!(hold_until(None, i64::MAX - 1, hour), i64::MAX);
    }
}
