//! How a repo's review loop is configured: `[repos.NAME.review_loop]`.

use serde::{Deserialize, Serialize};

use crate::span::Span;
use devpilot_store::queue::LoopRules;

/// A repo's review loop (every field has a default, so the table may be left out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReviewLoop {
    /// Feedback on this repo's pull requests reopens their jobs (`false`: the PR is left to
    /// people, as before).
    pub enabled: bool,
    /// What a comment starts a line with to address DevPilot (`/devpilot please rename it`).
    pub prefix: String,
    /// Every comment from someone with write access counts, addressed or not.
    pub any_comment: bool,
    /// Feedback within this long of the previous piece joins the same follow-up.
    pub quiet: Span,
    /// The most follow-ups per pull request; then one comment hands it back.
    pub max_follow_ups: u32,
    /// The most the follow-ups of one pull request may spend, in US dollars (none by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_spend_usd: Option<f64>,
}

impl Default for ReviewLoop {
    fn default() -> Self {
        Self {
            enabled: true,
            prefix: "/devpilot".into(),
            any_comment: false,
            quiet: Span::default_of("2m"),
            max_follow_ups: 3,
            max_spend_usd: None,
        }
    }
}

impl ReviewLoop {
    /// Whether these are the defaults (then the settings file leaves the table out).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The store's rules of one job's loop.
    pub fn rules(&self) -> LoopRules {
        LoopRules {
            quiet_ms: i64::try_from(self.quiet.get().as_millis()).unwrap_or(i64::MAX),
            max_follow_ups: i32::try_from(self.max_follow_ups).unwrap_or(i32::MAX),
            max_spend_usd: self.max_spend_usd,
        }
    }

    /// What is wrong with these settings, if anything.
    pub fn check(&self) -> Result<(), String> {
        if self.prefix.trim().is_empty() {
            return Err("review_loop.prefix must not be empty (it is how a comment addresses DevPilot)".into());
        }
        if self.max_spend_usd.is_some_and(|s| !s.is_finite() || s < 0.0) {
            return Err("review_loop.max_spend_usd must be a positive number of dollars".into());
        }
        Ok(())
    }
}
