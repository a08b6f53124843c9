//! The `[limits]` table of a machine's settings: what the fleet may spend (per job, per day,
//! per account per day), the day those caps count in, and what a usage limit does to the
//! account that hit it. Every cap is off unless set, so a machine that writes no `[limits]`
//! runs as before.
//!
//! ```toml
//! [limits]
//! job_usd = 2.0
//! day_usd = 20.0
//! account_day_usd = 10.0
//! time_zone = "Europe/Paris"
//! warn_at = 0.8
//! default_hold = "1h"
//! skew = "30s"
//! resume_after_limit = true
//! [limits.prices."claude-sonnet-4-5"]
//! input = 3.0
//! output = 15.0
//! ```

use std::collections::BTreeMap;

use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

use devpilot_store::error::{Error, Result};

use super::price::Price;
use crate::span::Span;

/// The machine's `[limits]` settings. The caps are fleet-wide: every machine should carry the
/// same ones (each enforces what it reads).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LimitSettings {
    /// USD one job may spend over all its attempts; none: no cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_usd: Option<f64>,
    /// USD the whole fleet may spend per calendar day in `time_zone`; none: no cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day_usd: Option<f64>,
    /// USD one account may spend per day; none: no cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_day_usd: Option<f64>,
    /// The IANA zone whose midnight starts the fleet's day (e.g. "Europe/Paris"); none: this
    /// machine's zone, which only agrees with the others' if they share it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The fraction of a cap at which a warning is given, once.
    pub warn_at: f64,
    /// How long an account is held when its CLI hit a usage limit without saying when it
    /// resets.
    pub default_hold: Span,
    /// A hold ends this long after its reset time, for machines whose clocks disagree.
    pub skew: Span,
    /// Whether a job parked on a usage limit resumes by itself when the hold ends; `false`:
    /// it waits for a person.
    pub resume_after_limit: bool,
    /// Prices that override or extend the vendored table, USD per million tokens, by model.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            job_usd: None,
            day_usd: None,
            account_day_usd: None,
            time_zone: None,
            warn_at: 0.8,
            default_hold: Span::default_of("1h"),
            skew: Span::default_of("30s"),
            resume_after_limit: true,
            prices: BTreeMap::new(),
        }
    }
}

impl LimitSettings {
    /// Whether these are the defaults (then the settings file leaves the table out).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Each cap finite and positive, the warning a fraction strictly between 0 and 1, the
    /// zone one the time zone database knows, holds positive, every price valid.
    pub fn validate(&self) -> Result<()> {
        let caps = [("job_usd", self.job_usd), ("day_usd", self.day_usd), ("account_day_usd", self.account_day_usd)];
        for (name, cap) in caps {
            if let Some(c) = cap.filter(|c| !(c.is_finite() && *c > 0.0)) {
                return Err(Error::Invalid(format!("[limits] {name} = {c} must be a positive amount of USD")));
            }
        }
        if !(self.warn_at > 0.0 && self.warn_at < 1.0) {
            return Err(Error::Invalid(format!(
                "[limits] warn_at = {} must be a fraction between 0 and 1 (0.8 warns at 80 %)",
                self.warn_at
            )));
        }
        if let Some(tz) = &self.time_zone {
            if TimeZone::get(tz.trim()).is_err() {
                return Err(Error::Invalid(format!(
                    "[limits] time_zone '{tz}' is not a time zone this machine knows (an IANA name such as \
                     \"Europe/Paris\")"
                )));
            }
        }
        if self.default_hold.get().is_zero() {
            return Err(Error::Invalid("[limits] default_hold must be positive".into()));
        }
        for (model, price) in &self.prices {
            if !price.is_valid() {
                return Err(Error::Invalid(format!(
                    "[limits.prices] '{model}': every price must be a finite amount, 0 or more"
                )));
            }
        }
        Ok(())
    }

    /// The zone whose calendar day the day caps count in: the configured one, else this
    /// machine's (UTC if it has none it can name).
    pub fn time_zone(&self) -> TimeZone {
        match &self.time_zone {
            Some(name) => TimeZone::get(name.trim()).unwrap_or_else(|_| TimeZone::system()),
            None => TimeZone::system(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole table reads from TOML, and writes back as written.
    #[test]
    fn reads_the_limits_table() {
        let text = r#"
job_usd = 2.0
day_usd = 20
account_day_usd = 10.0
time_zone = "Europe/Paris"
warn_at = 0.9
default_hold = "2h"
skew = "45s"
resume_after_limit = false
[prices."claude-sonnet-4-5"]
input = 3.0
output = 15.0
cache_write = 3.75
cache_read = 0.3
"#;
        let l: LimitSettings = toml::from_str(text).unwrap();
        assert_eq!((l.job_usd, l.day_usd, l.account_day_usd), (Some(2.0), Some(20.0), Some(10.0)));
        assert_eq!((l.warn_at, l.default_hold.get().as_secs(), l.skew.get().as_secs()), (0.9, 7200, 45));
        assert!(!l.resume_after_limit);
        assert_eq!(l.prices["claude-sonnet-4-5"].cache_read, 0.3);
        assert_eq!(l.time_zone().iana_name(), Some("Europe/Paris"));
        l.validate().unwrap();
        let again: LimitSettings = toml::from_str(&toml::to_string(&l).unwrap()).unwrap();
        assert_eq!(again, l);
        assert!(toml::to_string(&l).unwrap().contains("default_hold = \"2h\""));
    }

    /// No table is every cap off, and valid.
    #[test]
    fn off_by_default() {
        let l: LimitSettings = toml::from_str("").unwrap();
        assert!(l.is_default() && l.job_usd.is_none() && l.day_usd.is_none() && l.account_day_usd.is_none());
        assert!(l.resume_after_limit);
        l.validate().unwrap();
    }

    /// Each bad value is refused with a message naming it.
    #[test]
    fn validation_names_the_problem() {
        let bad = |f: &dyn Fn(&mut LimitSettings)| {
            let mut l = LimitSettings::default();
            f(&mut l);
            l.validate().unwrap_err().to_string()
        };
        assert!(bad(&|l| l.job_usd = Some(0.0)).contains("job_usd"));
        assert!(bad(&|l| l.day_usd = Some(f64::NAN)).contains("day_usd"));
        assert!(bad(&|l| l.account_day_usd = Some(-1.0)).contains("account_day_usd"));
        assert!(bad(&|l| l.warn_at = 1.0).contains("warn_at"));
        assert!(bad(&|l| l.warn_at = 0.0).contains("warn_at"));
        assert!(bad(&|l| l.time_zone = Some("Mars/Olympus".into())).contains("'Mars/Olympus'"));
        assert!(bad(&|l| l.default_hold = Span::parse("0s").unwrap()).contains("default_hold"));
        let e = bad(&|l| {
            l.prices.insert("m".into(), Price { input: f64::INFINITY, output: 1.0, cache_write: 1.0, cache_read: 1.0 });
        });
        assert!(e.contains("'m'"), "{e}");
    }
}
