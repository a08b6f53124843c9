//! The job's shape: what a payload may say, and what the engine reads from it.
//!
//! Every field is optional and unknown fields are kept (they reach the agent untouched):
//!
//! ```json
//! {"title": "ENG-7 Fix login redirect", "prompt": "…", "repo": "webapp", "base": "main",
//!  "requires": ["gpu"], "url": "https://linear.app/…/ENG-7"}
//! ```
//!
//! - `title`: the job's label, and the first line of a preset agent's prompt.
//! - `prompt`: what the agent is asked to do.
//! - `repo`: the name of a repository the running machine has configured; the job runs in a
//!   git worktree of it. Only machines with that repo pick the job.
//! - `base`: the branch the worktree starts from (default: the remote's default branch).
//! - `requires`: labels the running machine must all have (`devpilot run --labels gpu`).
//! - `url`: where the task came from (an issue, a ticket); it goes into the prompt.
//! - `branch`: the job's branch, after `devpilot/<id>-` (default: the slug of the title).
//! - `source`: set by a tracker's intake: which issue the job is (`kind`, `name`, `id`,
//!   `identifier`, `url`); its outcomes are reported there.
//!
//! `repo` and `requires` are copied into columns at enqueue, so the pick can route by them.
//!
//! Caps, checked at enqueue by [`check_payload`] and, for a plain SQL INSERT, by the
//! database's trigger (`m20261205_000001_caps`): the payload is at most [`MAX_PAYLOAD`]
//! bytes of JSON, `requires` at most [`MAX_LABELS`] labels of at most [`MAX_LABEL`] bytes,
//! `title` at most [`MAX_TITLE`] bytes, `prompt` at most [`MAX_PROMPT`], `url` at most
//! [`MAX_URL`]. No text in a payload may contain a NUL character.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The largest payload, as JSON text: 1 MiB.
pub const MAX_PAYLOAD: usize = 1024 * 1024;
/// The most labels a job may require.
pub const MAX_LABELS: usize = 32;
/// The longest label, in bytes.
pub const MAX_LABEL: usize = 64;
/// The longest title, in bytes.
pub const MAX_TITLE: usize = 1024;
/// The longest prompt, in bytes: 256 KiB.
pub const MAX_PROMPT: usize = 256 * 1024;
/// The longest source URL, in bytes.
pub const MAX_URL: usize = 2048;

/// A payload read as the documented schema.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The name of the job's branch after `devpilot/<id>-` (a tracker's own name for the
    /// issue's branch, e.g. Linear's `branchName`); unset: the slug of the title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Every other field, kept as it came.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl JobSpec {
    /// Reads a payload, refusing a documented field of the wrong type with its name. An array
    /// payload (allowed for custom agents) has none of the fields.
    pub fn parse(payload: &Value) -> Result<Self> {
        if !payload.is_object() {
            return Ok(Self::default());
        }
        let spec = Self::deserialize(payload).map_err(|e| {
            Error::Payload(format!(
                "{e}; title, prompt, repo, base, branch and url are strings and requires is a list of labels, e.g. [\"gpu\"]"
            ))
        })?;
        if let Some(repo) = &spec.repo {
            validate_name("repo", repo)?;
        }
        if spec.requires.len() > MAX_LABELS {
            return Err(Error::Payload(format!(
                "requires names {} labels; at most {MAX_LABELS} are allowed",
                spec.requires.len()
            )));
        }
        for l in &spec.requires {
            validate_label(l)?;
        }
        if let Some(base) = &spec.base {
            validate_base(base)?;
        }
        if let Some(branch) = &spec.branch {
            validate_base(branch)?;
        }
        for (field, text, max) in
            [("title", &spec.title, MAX_TITLE), ("prompt", &spec.prompt, MAX_PROMPT), ("url", &spec.url, MAX_URL)]
        {
            match text.as_deref() {
                Some(t) if t.len() > max => {
                    return Err(Error::Payload(format!("{field} is {} bytes long; at most {max} are allowed", t.len())))
                }
                Some(t) if t.contains('\0') => {
                    return Err(Error::Payload(format!("{field} contains a NUL character, which text may not")))
                }
                _ => {}
            }
        }
        Ok(spec)
    }

    /// The payload: the fields set, plus the kept ones.
    pub fn to_payload(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Map::new()))
    }

    /// The routing columns: `repo`, and `requires` as a sorted JSON array (NULL when empty).
    pub fn route_columns(&self) -> (Option<String>, Option<String>) {
        let mut labels = self.requires.clone();
        labels.sort();
        labels.dedup();
        let requires = (!labels.is_empty()).then(|| Value::from(labels).to_string());
        (self.repo.clone(), requires)
    }

    /// The prompt a preset agent gets: the title, the prompt and the URL; and, for a job
    /// handed off from another machine, one sentence saying so. A payload with neither a
    /// title nor a prompt gives the payload itself.
    pub fn prompt_text(&self, resumed_from: Option<&str>, payload: &Value) -> String {
        let mut parts: Vec<String> = vec![];
        if let Some(t) = self.title.as_deref().filter(|t| !t.trim().is_empty()) {
            parts.push(t.trim().to_string());
        }
        if let Some(p) = self.prompt.as_deref().filter(|p| !p.trim().is_empty()) {
            parts.push(p.trim().to_string());
        }
        if parts.is_empty() {
            parts.push(serde_json::to_string_pretty(payload).unwrap_or_default());
        }
        if let Some(u) = self.url.as_deref().filter(|u| !u.trim().is_empty()) {
            parts.push(format!("Source: {}", u.trim()));
        }
        if let Some(m) = resumed_from {
            parts.push(format!(
                "You continue work that was handed off from the machine {m}: the work so far is committed on this \
                 branch. Read it first, then go on from where it stopped."
            ));
        }
        let text = parts.join("\n\n");
        // Never mistaken for a flag by the CLI's parser, whatever the title says.
        if text.starts_with('-') {
            format!("Task: {text}")
        } else {
            text
        }
    }

    /// The branch of job `id`: `devpilot/<id>-<branch>` when the payload names one, else
    /// `devpilot/<id>-<slug of title>`.
    pub fn branch(&self, id: i64) -> String {
        if let Some(b) = self.branch.as_deref().map(str::trim).filter(|b| !b.is_empty()) {
            return format!("devpilot/{id}-{}", b.trim_start_matches("devpilot/"));
        }
        let slug = slugify(self.title.as_deref().unwrap_or_default());
        if slug.is_empty() {
            format!("devpilot/{id}")
        } else {
            format!("devpilot/{id}-{slug}")
        }
    }
}

/// Checks a payload at the door: at most [`MAX_PAYLOAD`] bytes of JSON, no NUL character
/// in any text (a key or a value), and the documented fields as [`JobSpec::parse`] reads
/// them. The spec, for the routing columns.
pub fn check_payload(payload: &Value) -> Result<JobSpec> {
    let size = serde_json::to_vec(payload).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_PAYLOAD {
        return Err(Error::Payload(format!(
            "the payload is {size} bytes of JSON; at most {MAX_PAYLOAD} (1 MiB) are allowed"
        )));
    }
    if let Some(at) = nul_at(payload, String::new()) {
        return Err(Error::Payload(format!(
            "the payload has a NUL character at {}; text may not contain NUL",
            if at.is_empty() { "its top level" } else { &at }
        )));
    }
    JobSpec::parse(payload)
}

/// The JSON pointer of the first text (key or string) with a NUL character in it.
fn nul_at(v: &Value, at: String) -> Option<String> {
    match v {
        Value::String(s) if s.contains('\0') => Some(at),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, x)| nul_at(x, format!("{at}/{i}"))),
        Value::Object(map) => map.iter().find_map(|(k, x)| {
            let here = format!("{at}/{}", k.replace('\0', "\\0"));
            if k.contains('\0') {
                Some(here)
            } else {
                nul_at(x, here)
            }
        }),
        _ => None,
    }
}

/// A branch to start from: what `git check-ref-format --branch` would take, and never
/// something git could read as an option.
pub fn validate_base(base: &str) -> Result<()> {
    let bad = base.trim().is_empty()
        || base.len() > 200
        || base.starts_with(['-', '/', '.'])
        || base.ends_with(['/', '.'])
        || base.ends_with(".lock")
        || base.contains("..")
        || base.contains("@{")
        || base.contains("//")
        || base.contains("/.")
        || base.chars().any(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(c));
    if bad {
        return Err(Error::Payload(format!("base '{}' is not a branch name", base.escape_debug())));
    }
    Ok(())
}

/// A label: a name ([`validate_name`]) of at most [`MAX_LABEL`] bytes.
pub fn validate_label(label: &str) -> Result<()> {
    validate_name("label", label)?;
    if label.len() > MAX_LABEL {
        return Err(Error::Invalid(format!("label '{label}' is longer than {MAX_LABEL} bytes")));
    }
    Ok(())
}

/// Lower-case ASCII words joined by `-`, at most 40 characters, cut at a word.
pub fn slugify(title: &str) -> String {
    let mut out = String::new();
    for word in title.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()) {
        if out.len() + word.len() + 1 > 40 {
            break;
        }
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(&word.to_ascii_lowercase());
    }
    out
}

/// A repo or label name: 1–100 of letters, digits, `.`, `_` and `-`, not starting with `-`.
pub fn validate_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadName { what: what.to_string(), name: name.to_string() })
    }
}

/// Splits `a,b` into labels, each checked.
pub fn parse_labels(list: &str) -> Result<Vec<String>> {
    let mut labels = vec![];
    for l in list.split(',').map(str::trim).filter(|l| !l.is_empty()) {
        validate_label(l)?;
        labels.push(l.to_string());
    }
    labels.sort();
    labels.dedup();
    if labels.len() > MAX_LABELS {
        return Err(Error::Invalid(format!("{} labels; at most {MAX_LABELS} are allowed", labels.len())));
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Unknown fields survive a round trip; documented fields of the wrong type are refused
    /// by name.
    #[test]
    fn payloads_parse_keep_extras_and_explain() {
        let p = json!({"title": "ENG-7 Fix login", "repo": "webapp", "requires": ["gpu", "gpu", "big"], "team": 3});
        let s = JobSpec::parse(&p).unwrap();
        assert_eq!(s.repo.as_deref(), Some("webapp"));
        assert_eq!(s.extra.get("team"), Some(&json!(3)));
        assert_eq!(s.to_payload()["team"], json!(3));
        assert_eq!(s.route_columns(), (Some("webapp".into()), Some(r#"["big","gpu"]"#.into())));
        assert!(JobSpec::parse(&json!({"requires": "gpu"})).unwrap_err().to_string().contains("requires"));
        assert!(JobSpec::parse(&json!({"repo": "../etc"})).unwrap_err().to_string().contains("repo"));
        assert!(JobSpec::parse(&json!({"base": "--upload-pack=x"})).is_err());
        assert_eq!(JobSpec::parse(&json!([1, 2])).unwrap(), JobSpec::default());
    }

    /// The caps and the NUL rule name what is wrong; a payload at the caps is fine.
    #[test]
    fn caps_and_nul_are_refused_by_name() {
        let err = |v: serde_json::Value| check_payload(&v).unwrap_err().to_string();
        assert!(err(json!({"prompt": "x".repeat(MAX_PAYLOAD)})).contains("at most 1048576 (1 MiB)"));
        assert!(err(json!({"prompt": "x".repeat(MAX_PROMPT + 1)})).contains("prompt is 262145 bytes"));
        assert!(err(json!({"title": "t".repeat(MAX_TITLE + 1)})).contains("title is"));
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("l{i}")).collect();
        assert!(err(json!({"requires": many})).contains("at most 32"));
        assert!(err(json!({"requires": ["x".repeat(MAX_LABEL + 1)]})).contains("longer than 64 bytes"));
        assert!(err(json!({"prompt": "a\u{0}b"})).contains("NUL"));
        assert!(err(json!({"extra": {"deep": ["ok", "a\u{0}"]}})).contains("/extra/deep/1"));
        assert!(err(json!({"base": "main..x"})).contains("not a branch name"));
        assert!(err(json!({"base": "a b"})).contains("not a branch name"));
        assert!(check_payload(&json!({"prompt": "x".repeat(MAX_PROMPT), "base": "release/2.x"})).is_ok());
    }

    /// The prompt carries title, prompt, URL and the hand-off sentence; the branch is a slug.
    #[test]
    fn prompt_and_branch() {
        let s =
            JobSpec::parse(&json!({"title": "ENG-7 Fix login redirect!", "prompt": "Do it.", "url": "https://x/7"}))
                .unwrap();
        let text = s.prompt_text(Some("laptop"), &json!({}));
        assert!(text.starts_with("ENG-7 Fix login redirect!\n\nDo it.\n\nSource: https://x/7"), "{text}");
        assert!(text.contains("handed off from the machine laptop"), "{text}");
        assert_eq!(s.branch(7), "devpilot/7-eng-7-fix-login-redirect");
        assert_eq!(JobSpec::default().branch(3), "devpilot/3");
        assert!(slugify(&"word ".repeat(30)).len() <= 40);
        let dash = JobSpec { title: Some("--model=x do it".into()), ..Default::default() };
        assert_eq!(dash.prompt_text(None, &json!({})), "Task: --model=x do it", "never a flag");
    }
}
