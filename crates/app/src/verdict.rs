//! A hand-off's verdict, in words: "Handed off #12 (pushed devpilot/12-fix-login) and #15.
//! Claiming is paused. Safe to close the lid.", or, when a push failed or timed out, which
//! job's work stayed on this machine and why. Built by `handoff` from what each release did.
//! Also what became of an edit of the settings file ([`ConfigNote`]).

use serde::Serialize;

use devpilot_engine::orchestrator::Carried;

/// One job a hand-off released (or tried to).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HandedOff {
    pub id: i64,
    pub title: Option<String>,
    /// What became of its work; `None`: its claim was gone before the release (another
    /// machine may have it), and whatever it had here is kept here.
    pub carried: Option<Carried>,
    /// Its agent ended on its own as the hand-off began: how the attempt ended
    /// ("completed", "failed", "parked", "cancelled"), recorded as any attempt's end.
    pub ended: Option<String>,
}

/// What a hand-off did, in words.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HandOffVerdict {
    pub jobs: Vec<HandedOff>,
    /// Claiming is paused after it.
    pub paused: bool,
    /// Nothing is left only on this machine: safe to close the lid.
    pub safe: bool,
    /// "Safe to close the lid", or "Work stayed on this machine".
    pub title: String,
    /// The sentence: each job and its branch, whether claiming is paused, and the verdict.
    pub text: String,
    /// Asked by the sleep hook (the user may see it only at wake).
    pub before_sleep: bool,
}

impl HandOffVerdict {
    pub fn of(jobs: Vec<HandedOff>, paused: bool, before_sleep: bool) -> Self {
        let stayed: Vec<String> = jobs.iter().filter_map(stayed_line).collect();
        let handed: Vec<String> = jobs.iter().filter(|j| stayed_line(j).is_none()).map(handed_part).collect();
        let mut text = String::new();
        if !handed.is_empty() {
            text.push_str(&format!("Handed off {}. ", and_list(&handed)));
        } else if jobs.is_empty() {
            text.push_str("Nothing was running here. ");
        }
        for s in &stayed {
            text.push_str(s);
            text.push(' ');
        }
        text.push_str(if paused { "Claiming is paused. " } else { "Claiming goes on. " });
        let safe = stayed.is_empty();
        let title = if safe { "Safe to close the lid" } else { "Work stayed on this machine" };
        text.push_str(if safe {
            "Safe to close the lid."
        } else {
            "Keep it open and online until it is pushed: DevPilot retries on its own."
        });
        Self { jobs, paused, safe, title: title.into(), text, before_sleep }
    }
}

/// `#12 (pushed devpilot/12-fix-login)`, or `#15`.
fn handed_part(j: &HandedOff) -> String {
    match &j.carried {
        Some(Carried::Pushed { branch }) => format!("#{} (pushed {branch})", j.id),
        _ if j.ended.is_some() => format!("#{} ({} before the hand-off)", j.id, j.ended.as_deref().unwrap_or_default()),
        _ => format!("#{}", j.id),
    }
}

/// The sentence for a job whose work did not leave this machine, if it did not.
fn stayed_line(j: &HandedOff) -> Option<String> {
    let name = match &j.title {
        Some(t) => format!("#{} {t}", j.id),
        None => format!("#{}", j.id),
    };
    match &j.carried {
        Some(Carried::Stayed { why }) => Some(format!("{name}: its work stayed on this machine ({why}).")),
        None if j.ended.is_none() => Some(format!(
            "{name}: its claim was gone before the hand-off (another machine may have it); what it left is kept here."
        )),
        _ => None,
    }
}

/// "a", "a and b", "a, b and c".
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// What became of the last edit of the settings file.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ConfigNote {
    /// Applied; else the settings before it stay in force.
    pub ok: bool,
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, carried: Option<Carried>) -> HandedOff {
        HandedOff { id, title: Some(format!("Fix {id}")), carried, ended: None }
    }

    /// Pushed and nothing-to-carry jobs make the green verdict, naming each branch.
    #[test]
    fn every_job_carried_is_safe() {
        let pushed = Some(Carried::Pushed { branch: "devpilot/12-fix-login".into() });
        let v = HandOffVerdict::of(vec![job(12, pushed), job(15, Some(Carried::Nothing))], true, false);
        assert!(v.safe);
        assert_eq!(v.title, "Safe to close the lid");
        assert_eq!(
            v.text,
            "Handed off #12 (pushed devpilot/12-fix-login) and #15. Claiming is paused. Safe to close the lid."
        );
        let idle = HandOffVerdict::of(vec![], true, false);
        assert_eq!(idle.text, "Nothing was running here. Claiming is paused. Safe to close the lid.");
    }

    /// A failed push, or a claim gone before the release, makes the red verdict naming the
    /// job and why; the others are still said.
    #[test]
    fn work_left_here_is_named() {
        let stayed = Some(Carried::Stayed { why: "the push failed: timed out after 5s".into() });
        let v = HandOffVerdict::of(vec![job(12, stayed), job(15, Some(Carried::Nothing)), job(16, None)], false, false);
        assert!(!v.safe);
        assert_eq!(v.title, "Work stayed on this machine");
        assert!(
            v.text.starts_with(
                "Handed off #15. #12 Fix 12: its work stayed on this machine (the push failed: timed out after 5s)."
            ),
            "{}",
            v.text
        );
        assert!(v.text.contains("#16 Fix 16: its claim was gone"), "{}", v.text);
        assert!(v.text.contains("Claiming goes on.") && !v.text.contains("Safe to close"), "{}", v.text);
        // An agent that ended on its own as the hand-off began: its end is recorded, nothing stays.
        let done = HandedOff { ended: Some("completed".into()), ..job(17, None) };
        let v = HandOffVerdict::of(vec![done], true, false);
        assert!(v.safe && v.text.starts_with("Handed off #17 (completed before the hand-off)."), "{}", v.text);
        assert_eq!(and_list(&["a".into(), "b".into(), "c".into()]), "a, b and c");
    }
}
