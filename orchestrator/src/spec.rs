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
//!
//! `repo` and `requires` are copied into columns at enqueue, so the pick can route by them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

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
                "{e}; title, prompt, repo, base and url are strings and requires is a list of labels, e.g. [\"gpu\"]"
            ))
        })?;
        if let Some(repo) = &spec.repo {
            validate_name("repo", repo)?;
        }
        for l in &spec.requires {
            validate_name("label", l)?;
        }
        if let Some(base) = &spec.base {
            if base.trim().is_empty() || base.starts_with('-') || base.chars().any(|c| c.is_whitespace()) {
                return Err(Error::Payload(format!("base '{base}' is not a branch name")));
            }
        }
        Ok(spec)
    }

    /// [`JobSpec::parse`] for a payload that was accepted at enqueue: a payload written by
    /// hand into the table that does not parse is run as if it said nothing.
    pub fn lenient(payload: &Value) -> Self {
        Self::parse(payload).unwrap_or_default()
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

    /// The branch of job `id`: `devpilot/<id>-<slug of title>`.
    pub fn branch(&self, id: i64) -> String {
        let slug = slugify(self.title.as_deref().unwrap_or_default());
        if slug.is_empty() {
            format!("devpilot/{id}")
        } else {
            format!("devpilot/{id}-{slug}")
        }
    }
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
        Err(Error::Invalid(format!("{what} '{name}' is not a valid name: use 1-100 letters, digits, '.', '_' or '-'")))
    }
}

/// Splits `a,b` into labels, each checked.
pub fn parse_labels(list: &str) -> Result<Vec<String>> {
    let mut labels = vec![];
    for l in list.split(',').map(str::trim).filter(|l| !l.is_empty()) {
        validate_name("label", l)?;
        labels.push(l.to_string());
    }
    labels.sort();
    labels.dedup();
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
