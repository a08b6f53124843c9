//! The watchdog of a running agent: silent too long, or running too long.

use std::time::Duration;

use crate::agent::LogSpan;

/// Stops an agent that prints nothing for `idle`, or runs longer than `max_runtime`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watchdog {
    pub idle: Option<Duration>,
    pub max_runtime: Option<Duration>,
}

impl Watchdog {
    /// Resolves, with the reason, when the agent has been silent or running too long; never
    /// when neither limit is set. Output is what the agent appended to its log.
    pub(super) async fn tripped(self, log: Option<LogSpan>) -> String {
        let (Some(log), true) = (log, self.idle.is_some() || self.max_runtime.is_some()) else {
            return std::future::pending().await;
        };
        let started = tokio::time::Instant::now();
        let (mut seen, mut quiet_since) = (log.written(), started);
        let tick = self.idle.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(1)) / 4;
        loop {
            tokio::time::sleep(tick.max(Duration::from_millis(20))).await;
            let now = tokio::time::Instant::now();
            let written = log.written();
            if written != seen {
                (seen, quiet_since) = (written, now);
            }
            if let Some(idle) = self.idle.filter(|i| now - quiet_since >= *i) {
                return format!("no output for {}; the watchdog stopped the agent", humantime::format_duration(idle));
            }
            if let Some(max) = self.max_runtime.filter(|m| now - started >= *m) {
                return format!(
                    "ran longer than its maximum runtime of {}; the watchdog stopped the agent",
                    humantime::format_duration(max)
                );
            }
        }
    }
}
