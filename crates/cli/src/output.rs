//! Text helpers for what the commands print.

use std::time::Duration;

use devpilot_store::queue::AgentRun;

/// Text from the database as the terminal gets it: every control character (ESC, BEL, CR,
/// a newline in a title) is written as an escape, so a job's title cannot rewrite the screen.
pub fn shown(text: Option<&str>) -> String {
    let text = text.unwrap_or_default();
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// Prints `v` as pretty JSON: what `--json` prints, one document per command.
pub fn json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// A job's text as the terminal gets it, with the other control characters dropped but
/// newlines and tabs kept: agent output shown as lines, never as terminal commands.
pub fn inert(text: &str) -> String {
    text.chars().filter(|c| !c.is_control() || matches!(c, '\n' | '\t')).collect()
}

/// A database duration or time (milliseconds; a negative one is zero).
pub fn ms(n: i64) -> Duration {
    Duration::from_millis(n.max(0) as u64)
}

pub fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

pub fn fmt_ids(ids: &[i64]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(": {}", ids.iter().map(|i| format!("#{i}")).collect::<Vec<_>>().join(", "))
    }
}

/// `agent: claude · session b5f7c2d1… · $0.0997 · 24,693 in / 45 out tokens · resumed from
/// laptop`: what the CLI of a job's last attempt reported, or nothing when it reported none.
pub fn agent_line(a: &AgentRun) -> Option<String> {
    let mut parts = vec![];
    if let Some(name) = &a.agent {
        parts.push(format!("agent: {}", shown(Some(name))));
    }
    if let Some(id) = &a.agent_session {
        let short: String = id.chars().take(8).collect();
        let more = if short.len() < id.len() { "…" } else { "" };
        parts.push(format!("session {}{more}", shown(Some(&short))));
    }
    if let Some(cost) = a.cost_usd {
        parts.push(format!("${cost:.4}"));
    }
    match (a.tokens_in, a.tokens_out) {
        (None, None) => {}
        (i, o) => parts.push(format!(
            "{} in / {} out tokens",
            i.map(grouped).unwrap_or_else(|| "?".into()),
            o.map(grouped).unwrap_or_else(|| "?".into())
        )),
    }
    if let Some(m) = &a.session_from {
        parts.push(format!("resumed from {}", shown(Some(m))));
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// An amount of USD as the tray writes it: cents, or more digits for less than a cent.
pub fn usd(x: f64) -> String {
    if x != 0.0 && x.abs() < 0.01 {
        format!("${x:.4}")
    } else {
        format!("${x:.2}")
    }
}

/// An account's short name as the tray writes it ("claude · work"), or the account as it is.
pub fn account_label(account: &str) -> String {
    serde_json::from_value::<devpilot_engine::governor::Account>(account.into())
        .map(|a| a.label())
        .unwrap_or_else(|_| account.to_string())
}

/// 24693 as "24,693".
pub fn grouped(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_line_says_what_the_cli_reported() {
        assert_eq!(agent_line(&AgentRun::default()), None, "a plain command reports nothing");
        let a = AgentRun {
            agent: Some("claude".into()),
            agent_session: Some("b5f7c2d1-9e4a-4f0b-8c3d-2a1e6f7b9c0d".into()),
            cost_usd: Some(0.0997),
            tokens_in: Some(24_693),
            tokens_out: Some(45),
            session_from: Some("laptop".into()),
        };
        assert_eq!(
            agent_line(&a).as_deref(),
            Some("agent: claude · session b5f7c2d1… · $0.0997 · 24,693 in / 45 out tokens · resumed from laptop")
        );
        let a = AgentRun { agent: Some("aider".into()), tokens_out: Some(1_234_567), ..Default::default() };
        assert_eq!(agent_line(&a).as_deref(), Some("agent: aider · ? in / 1,234,567 out tokens"));
        let a = AgentRun { agent: Some("codex".into()), agent_session: Some("short".into()), ..Default::default() };
        assert_eq!(agent_line(&a).as_deref(), Some("agent: codex · session short"));
        assert_eq!(
            (grouped(0), grouped(999), grouped(1000), grouped(-12_345)),
            ("0".into(), "999".into(), "1,000".into(), "-12,345".into())
        );
    }
}
