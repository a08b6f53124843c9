//! Redaction by value: the values of the secrets a machine knows (its database password, its
//! trackers' tokens, the API keys and `pass_env` values its agents are given) are replaced
//! in any text before it leaves the process. An agent can print what it was given, or what it
//! found; whatever the variable was called, its value is what must not reach a row or an
//! issue.
//!
//! One [`Redactor`] is shared by everything a machine runs (clones share its values), and it
//! learns a secret when the machine first holds it (a key read from the keychain later, say).

use std::borrow::Cow;
use std::sync::{Arc, RwLock};

/// What a secret's value becomes.
pub const REDACTED: &str = "[redacted]";

/// The shortest value redacted: a shorter one ("1", "true", a port) would blank out
/// ordinary words, and is no secret worth the name.
pub const MIN_SECRET: usize = 8;

/// The values to redact, longest first (so a secret that contains another is replaced
/// whole). Clones share them.
#[derive(Clone, Default)]
pub struct Redactor {
    values: Arc<RwLock<Arc<Vec<String>>>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} values)", self.values().len())
    }
}

impl Redactor {
    /// Learns `value` (trimmed; shorter than [`MIN_SECRET`]: ignored).
    pub fn learn(&self, value: &str) {
        let value = value.trim();
        if value.len() < MIN_SECRET || value.contains(REDACTED) {
            return;
        }
        let Ok(mut held) = self.values.write() else { return };
        if held.iter().any(|v| v == value) {
            return;
        }
        let mut next: Vec<String> = held.as_ref().clone();
        next.push(value.to_string());
        next.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        *held = Arc::new(next);
    }

    /// Learns every one of `values`.
    pub fn learn_all<S: AsRef<str>>(&self, values: impl IntoIterator<Item = S>) {
        for v in values {
            self.learn(v.as_ref());
        }
    }

    /// The values learned, longest first.
    pub fn values(&self) -> Arc<Vec<String>> {
        self.values.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// `text` with every learned value replaced by [`REDACTED`], and a value cut at the end
    /// of the text (a capped line, say) too, when at least [`MIN_SECRET`] of it is left.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let values = self.values();
        let mut out = Cow::Borrowed(text);
        for v in values.iter() {
            if out.contains(v.as_str()) {
                out = Cow::Owned(out.replace(v.as_str(), REDACTED));
            }
        }
        for v in values.iter() {
            if let Some(cut) = cut_at_end(&out, v) {
                let kept = out.len() - cut;
                out = Cow::Owned(format!("{}{REDACTED}", &out[..kept]));
            }
        }
        out
    }

    /// [`Redactor::redact`] of an optional text.
    pub fn redact_opt(&self, text: Option<&str>) -> Option<String> {
        text.map(|t| self.redact(t).into_owned())
    }
}

/// The length of the longest start of `value` (at least [`MIN_SECRET`] bytes, shorter than
/// all of it) that `text` ends with.
fn cut_at_end(text: &str, value: &str) -> Option<usize> {
    (MIN_SECRET..value.len()).rev().find(|&n| value.is_char_boundary(n) && text.ends_with(&value[..n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value is replaced wherever it appears, the longest first; short values are not
    /// learned; a value cut at the end of a text is replaced too; clones share what is learned.
    #[test]
    fn values_are_replaced_wherever_they_appear() {
        let r = Redactor::default();
        r.learn_all(["hunter2-secret", "hunter2-secret-longer", "short", "  padded-token-1  "]);
        let shared = r.clone();
        shared.learn("learned-later-xyz");
        assert_eq!(r.values().len(), 4, "the short one is not learned");
        let text = "a hunter2-secret-longer b hunter2-secret c padded-token-1 d learned-later-xyz short";
        assert_eq!(r.redact(text), "a [redacted] b [redacted] c [redacted] d [redacted] short");
        assert!(matches!(r.redact("nothing here"), Cow::Borrowed(_)), "no copy when nothing matches");
        assert_eq!(r.redact("the line was cut at hunter2-sec"), "the line was cut at [redacted]");
        assert_eq!(r.redact("ends with hunter2"), "ends with hunter2", "less than 8 bytes of it: kept");
        assert_eq!(r.redact_opt(Some("x learned-later-xyz")).as_deref(), Some("x [redacted]"));
    }
}
