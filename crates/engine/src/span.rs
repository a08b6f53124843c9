//! Durations and times as people type them: "30m", "2s", "1h 30m" or a bare number of
//! seconds; RFC 3339 times.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use devpilot_store::error::{Error, Result};

/// Parses "30m", "2s", "1h 30m" or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(t).map_err(|source| Error::BadDuration { text: t.to_string(), source })
}

/// Parses an RFC 3339 time ("2026-12-01T10:00:00Z") into milliseconds since the epoch.
pub fn parse_time_ms(s: &str) -> std::result::Result<i64, humantime::TimestampError> {
    let t = humantime::parse_rfc3339_weak(s.trim())?;
    Ok(t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0))
}

/// A duration in the settings, parsed once when it is read, and written back the way it
/// was written: a settings file keeps its user's "14d" rather than becoming "14days", and
/// `devpilot config show` prints what the file says.
///
/// Two spans are equal when their durations are ("60s" = "1m").
#[derive(Clone)]
pub struct Span {
    value: Duration,
    text: String,
}

impl Span {
    /// Parses `text` ([`parse_duration`]).
    pub fn parse(text: &str) -> Result<Self> {
        Ok(Self { value: parse_duration(text)?, text: text.trim().to_string() })
    }

    pub fn get(&self) -> Duration {
        self.value
    }

    /// A default of the settings' table: a text the tests prove parses.
    pub(crate) fn default_of(text: &str) -> Self {
        Self::parse(text).unwrap_or(Self { value: Duration::ZERO, text: text.to_string() })
    }
}

impl From<Duration> for Span {
    fn from(value: Duration) -> Self {
        Self { value, text: humantime::format_duration(value).to_string() }
    }
}

impl PartialEq for Span {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Span {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Span::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// An optional span: missing or empty ("") is none.
pub mod optional {
    use super::Span;
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Span>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(t) if !t.trim().is_empty() => Span::parse(&t).map(Some).map_err(serde::de::Error::custom),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span keeps its text through a save and compares by its value.
    #[test]
    fn keeps_its_text_and_compares_by_value() {
        let s = Span::parse(" 14d ").unwrap();
        assert_eq!(s.get(), Duration::from_secs(14 * 86_400));
        assert_eq!(s.to_string(), "14d");
        assert_eq!(Span::parse("60s").unwrap(), Span::parse("1m").unwrap());
        assert_eq!(Span::parse("90").unwrap().get(), Duration::from_secs(90));
        let e = Span::parse("soon").unwrap_err().to_string();
        assert!(e.contains("'soon' is not a duration"), "{e}");
    }
}
