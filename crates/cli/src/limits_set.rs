//! `devpilot limits set`: the caps in this machine's `[limits]` table, set or turned off in
//! one line, checked before the file is written (a bad value leaves it as it was). The caps
//! are the fleet's, but each machine enforces what its own config says: the verdict says so.

use devpilot_engine::config::Paths;
use devpilot_engine::governor::LimitSettings;

use crate::exit::{Code, Fail, Out};
use crate::output::{json, usd};

/// A cap `--off` turns off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Cap {
    /// `--job`: one job's spend.
    Job,
    /// `--day`: the fleet's spend per day.
    Day,
    /// `--account-day`: one account's spend per day.
    AccountDay,
}

/// `devpilot limits set`: what to change; what is not named stays as the file says.
#[derive(clap::Args, Debug)]
pub struct SetArgs {
    /// The cap on one job's spend over all its attempts, in USD (e.g. 2 or 2.50).
    #[arg(long, value_name = "USD", allow_negative_numbers = true, value_parser = amount)]
    pub job: Option<f64>,
    /// The cap on the whole fleet's spend per day, in USD.
    #[arg(long, value_name = "USD", allow_negative_numbers = true, value_parser = amount)]
    pub day: Option<f64>,
    /// The cap on one account's spend per day, in USD.
    #[arg(long, value_name = "USD", allow_negative_numbers = true, value_parser = amount)]
    pub account_day: Option<f64>,
    /// The IANA time zone whose midnight starts the day the caps count in (e.g.
    /// Europe/Paris). Unset: this machine's zone.
    #[arg(long, value_name = "ZONE")]
    pub time_zone: Option<String>,
    /// The share of a cap at which a warning is given, once: 0.8 (or 80%) warns at 80 %.
    #[arg(long, value_name = "FRACTION", allow_negative_numbers = true, value_parser = fraction)]
    pub warn_at: Option<f64>,
    /// Turn a cap off (repeat, or separate with commas).
    #[arg(long, value_enum, value_name = "CAP", value_delimiter = ',')]
    pub off: Vec<Cap>,
}

/// An amount of USD: a number, with or without a leading `$`. Whether it is a positive one is
/// [`LimitSettings::validate`]'s to say.
fn amount(s: &str) -> Result<f64, String> {
    let t = s.trim();
    t.strip_prefix('$').unwrap_or(t).parse().map_err(|_| format!("'{s}' is not an amount of USD (e.g. 20 or 2.50)"))
}

/// A fraction (0.8) or a percentage (80%).
fn fraction(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let bad = |_| format!("'{s}' is not a fraction (e.g. 0.8, or 80%)");
    match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0).map_err(bad),
        None => t.parse().map_err(bad),
    }
}

impl Cap {
    fn flag(self) -> &'static str {
        match self {
            Cap::Job => "job",
            Cap::Day => "day",
            Cap::AccountDay => "account-day",
        }
    }
}

impl SetArgs {
    fn is_empty(&self) -> bool {
        self.job.is_none()
            && self.day.is_none()
            && self.account_day.is_none()
            && self.time_zone.is_none()
            && self.warn_at.is_none()
            && self.off.is_empty()
    }

    /// `l` changed as the flags say, and what each change means, in words.
    fn apply(&self, l: &mut LimitSettings) -> Vec<String> {
        let mut said = vec![];
        let caps = [
            (Cap::Job, self.job, &mut l.job_usd, "each job's cap", "no job has a cap"),
            (Cap::Day, self.day, &mut l.day_usd, "the fleet's daily cap", "the fleet has no daily cap"),
            (
                Cap::AccountDay,
                self.account_day,
                &mut l.account_day_usd,
                "each account's daily cap",
                "no account has a daily cap",
            ),
        ];
        for (cap, given, field, name, none) in caps {
            if let Some(v) = given {
                *field = Some(v);
                said.push(format!("{name} is now {}", usd(v)));
            } else if self.off.contains(&cap) {
                *field = None;
                said.push(format!("{none} now"));
            }
        }
        if let Some(z) = &self.time_zone {
            l.time_zone = Some(z.trim().to_string());
            said.push(format!("the day starts at midnight in {}", z.trim()));
        }
        if let Some(w) = self.warn_at {
            l.warn_at = w;
            said.push(format!("a warning comes at {:.0} % of a cap", w * 100.0));
        }
        said
    }
}

/// `devpilot limits set`: checks, writes this machine's `[limits]`, says what was set.
pub fn set(a: SetArgs, as_json: bool) -> Out {
    if a.is_empty() {
        return Err(Fail::new(Code::Usage, "nothing to set: name a cap, --time-zone, --warn-at or --off")
            .fix("e.g. `devpilot limits set --day 20 --time-zone Europe/Paris`; `devpilot limits` shows them now"));
    }
    let given = [(Cap::Job, a.job.is_some()), (Cap::Day, a.day.is_some()), (Cap::AccountDay, a.account_day.is_some())];
    if let Some((cap, _)) = given.iter().find(|(cap, given)| *given && a.off.contains(cap)) {
        let f = cap.flag();
        return Err(Fail::new(Code::Usage, format!("--{f} and --off {f} ask for opposite things: give one")));
    }
    let paths = Paths::for_app("devpilot")?;
    let mut settings = paths.load()?;
    let mut limits = settings.limits.clone();
    let said = a.apply(&mut limits);
    limits.validate().map_err(|e| {
        Fail::new(Code::Usage, format!("{e}; nothing was written"))
            .fix("`devpilot limits set --help` says what each flag takes")
    })?;
    settings.limits = limits;
    paths.save(&settings)?;
    let file = paths.config_file();
    let text =
        format!("{}; each machine enforces the caps in its own config: set the same on every machine", said.join("; "));
    if as_json {
        let l = &settings.limits;
        json(&serde_json::json!({
            "file": file, "job_usd": l.job_usd, "day_usd": l.day_usd, "account_day_usd": l.account_day_usd,
            "time_zone": l.time_zone, "warn_at": l.warn_at, "text": text,
        }));
    } else {
        println!(
            "saved [limits] to {} (the tray applies it at once; `devpilot run` at its next start)",
            file.display()
        );
        println!("{text}");
    }
    Ok(Code::Ok)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Amounts take a `$`, fractions a `%`; anything else is refused with the value named.
    #[test]
    fn amounts_and_fractions() {
        assert_eq!((amount("20").unwrap(), amount("$2.50").unwrap(), amount("-3").unwrap()), (20.0, 2.5, -3.0));
        assert!(amount("lots").unwrap_err().contains("'lots'"));
        assert_eq!((fraction("0.8").unwrap(), fraction("90%").unwrap()), (0.8, 0.9));
        assert!(fraction("most").unwrap_err().contains("'most'"));
    }
}
