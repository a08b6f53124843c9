//! A hand-off's verdict, in words: "Handed off #12 (pushed devpilot/12-fix-login) and #15.
//! Claiming is paused. Safe to close the lid.", or, when a push failed or timed out, which
//! job's work stayed on this machine and why, and the hand-off that yields it ([`hand_off`]).
//! Every hand-off of this computer (the tray's, its sleep hook's, `devpilot handoff`
//! through the control socket to the tray or `devpilot run`) ends with one of these.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::TryRecvError;

use super::{Carried, Event, Handle};

/// One job a hand-off released (or tried to).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
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
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
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

/// Hands `handle`'s jobs off (pausing claims with `pause`) and tells what became of each.
/// `mark` gets the jobs the hand-off answered for before their release events are read (the
/// tray remembers them as its own).
pub async fn hand_off(handle: &Handle, pause: bool, before_sleep: bool, mark: impl FnOnce(&[i64])) -> HandOffVerdict {
    let before: Vec<(i64, Option<String>)> =
        handle.status().running.iter().map(|r| (r.job.id, r.job.title.clone())).collect();
    // Subscribed before the hand-off: each released job's event is in the buffer when the
    // hand-off returns (its task sends it before it ends).
    let mut events = handle.subscribe();
    let ids = unanswered_too(handle.hand_off(pause).await, &before);
    mark(&ids);
    let mut released: BTreeMap<i64, (Option<String>, Carried)> = BTreeMap::new();
    // An agent that exited as the hand-off began ends its attempt as usual: said as such.
    let mut ended: BTreeMap<i64, (Option<String>, &str)> = BTreeMap::new();
    loop {
        match events.try_recv() {
            Ok(Event::Released { job, carried }) => {
                released.insert(job.id, (job.title, carried));
            }
            Ok(Event::Completed { job, .. }) => drop(ended.insert(job.id, (job.title, "completed"))),
            Ok(Event::Failed { job, .. }) => drop(ended.insert(job.id, (job.title, "failed"))),
            Ok(Event::Parked { job, .. }) => drop(ended.insert(job.id, (job.title, "parked"))),
            Ok(Event::Cancelled { job }) => drop(ended.insert(job.id, (job.title, "cancelled"))),
            Ok(_) | Err(TryRecvError::Lagged(_)) => {}
            Err(_) => break,
        }
    }
    let jobs = ids
        .into_iter()
        .map(|id| match (released.remove(&id), ended.remove(&id)) {
            (Some((title, carried)), _) => HandedOff { id, title, carried: Some(carried), ended: None },
            (None, Some((title, how))) => HandedOff { id, title, carried: None, ended: Some(how.into()) },
            (None, None) => {
                let title = before.iter().find(|(b, _)| *b == id).and_then(|(_, t)| t.clone());
                HandedOff { id, title, carried: None, ended: None }
            }
        })
        .collect();
    HandOffVerdict::of(jobs, pause, before_sleep)
}

/// The jobs a hand-off answered for, and each job that was running here before it but that it
/// did not answer for (its machine stopped under it): such a job is not "nothing was running",
/// and the verdict says its claim was gone.
fn unanswered_too(mut ids: Vec<i64>, before: &[(i64, Option<String>)]) -> Vec<i64> {
    for (id, _) in before {
        if !ids.contains(id) {
            ids.push(*id);
        }
    }
    ids
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

    /// A hand-off that answered for nothing while a job ran here does not read "safe".
    #[test]
    fn a_job_the_hand_off_did_not_answer_for_is_not_safe() {
        let before = [(12, Some("Fix login".to_string()))];
        let ids = unanswered_too(vec![], &before);
        assert_eq!(ids, [12]);
        let v = HandOffVerdict::of(
            vec![HandedOff { id: 12, title: Some("Fix login".into()), carried: None, ended: None }],
            true,
            false,
        );
        assert!(!v.safe && v.text.contains("#12 Fix login: its claim was gone before the hand-off"), "{v:?}");
        assert_eq!(unanswered_too(vec![12, 13], &before), [12, 13], "answered: unchanged");
    }
}
