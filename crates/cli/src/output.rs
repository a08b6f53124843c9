//! Text helpers for what the commands print.

use std::time::Duration;

/// Text from the database as the terminal gets it: every control character (ESC, BEL, CR,
/// a newline in a title) is written as an escape, so a job's title cannot rewrite the screen.
pub fn shown(text: Option<&str>) -> String {
    let text = text.unwrap_or_default();
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
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
