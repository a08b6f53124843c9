//! The label pins the text. A job runs the issue's text as it was when someone with write
//! access applied the source's label: the label's application is the approval, and an edit
//! after it is never run without a new one. Each tracker says who applied the label and when
//! (GitHub: the issue's `labeled` events; Linear: the issue's history), and whether the
//! issue changed after it; the intake keeps the approval in the job's payload
//! (`source.approval`), so it can tell a new label from the one it already acted on.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One application of the source's label by someone with write access.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// The tracker's id of the event (a GitHub issue event's id, a Linear history entry's).
    pub id: String,
    /// Who applied the label (a GitHub login, a Linear user's name).
    pub by: String,
    /// When (RFC 3339, the tracker's clock).
    pub at: String,
}

/// What the tracker says of an issue's approval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The text read now is the text that was there when the label was applied.
    Approved(Approval),
    /// The issue changed after the newest approval (or cannot be shown not to have): the text
    /// read now is not the approved one.
    ChangedAfter(Approval),
    /// Nobody with write access applied the label.
    Unapproved,
    /// The issue changed, or was labelled, after the turn read its text (the history is read
    /// after the text): the text in hand may be older than what was approved. Nothing is
    /// done with it this turn; the next turn reads the issue again.
    ReadTooEarly,
    /// The tracker's record is longer than DevPilot reads, so the approval cannot be shown
    /// (the reason says which): this issue starts nothing, and the others go on.
    Unreadable(String),
}

/// What the source says, and the issue is told once, when its text changed after approval.
pub const EDITED_AFTER_APPROVAL: &str = "edited after approval; label it again to run the new text";

/// The approval a job's payload was added or updated under, if any.
pub fn approval_of(payload: &Value) -> Option<&str> {
    payload.pointer("/source/approval/id").and_then(Value::as_str)
}

/// `payload` with `approval` kept in its `source`.
pub fn with_approval(payload: &Value, approval: &Approval) -> Value {
    let mut p = payload.clone();
    if let Some(source) = p.get_mut("source").and_then(Value::as_object_mut) {
        source.insert("approval".into(), serde_json::json!(approval));
    }
    p
}

/// Whether a change at `changed` (RFC 3339) came after the label's application at `labelled`:
/// either unreadable counts as after, so an unprovable order never approves.
pub fn changed_after(changed: &str, labelled: &str) -> bool {
    match (crate::span::parse_time_ms(changed), crate::span::parse_time_ms(labelled)) {
        (Ok(c), Ok(l)) => c > l,
        _ => true,
    }
}

/// GitHub's verdict on text read at `read` (the issue's `updated_at` then) under `approval`,
/// the issue read again after its events saying `now`: changed since the text was read
/// ([`Verdict::ReadTooEarly`]: the text in hand may be older than what was approved), changed
/// after the label ([`Verdict::ChangedAfter`]), or as labelled ([`Verdict::Approved`]). Only
/// the issue's own `updated_at` is compared with itself for the first, so a label event a
/// second off the issue's time never keeps an unchanged issue waiting.
pub fn at_version(read: &str, now: &str, approval: Approval) -> Verdict {
    if read != now {
        Verdict::ReadTooEarly
    } else if changed_after(read, &approval.at) {
        Verdict::ChangedAfter(approval)
    } else {
        Verdict::Approved(approval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The approval rides in the payload's source and is read back; an order that cannot be
    /// read never approves.
    #[test]
    fn approvals_ride_in_the_payload() {
        let a = Approval { id: "9".into(), by: "ada".into(), at: "2026-12-02T10:00:00Z".into() };
        let p = with_approval(&serde_json::json!({ "source": { "kind": "github" } }), &a);
        assert_eq!(approval_of(&p), Some("9"));
        assert!(!changed_after("2026-12-02T10:00:00Z", &a.at));
        assert!(changed_after("2026-12-02T10:00:01Z", &a.at));
        assert!(changed_after("garbage", &a.at));
    }

    /// Text read before the issue last changed (a new label, an edit) is not the approved
    /// text, whatever the label says: it waits for the next turn's read. Unchanged since, it
    /// is approved at or after its label (even a label event a second later than the issue's
    /// time), and changed after it otherwise.
    #[test]
    fn text_read_before_the_issue_changed_is_read_again() {
        let a = Approval { id: "9".into(), by: "ada".into(), at: "2026-12-02T10:00:00Z".into() };
        let early = "2026-12-02T09:59:59Z";
        assert_eq!(at_version(early, "2026-12-02T10:00:00Z", a.clone()), Verdict::ReadTooEarly);
        assert_eq!(at_version(early, early, a.clone()), Verdict::Approved(a.clone()), "a skewed label event");
        let at = "2026-12-02T10:00:00Z";
        assert_eq!(at_version(at, at, a.clone()), Verdict::Approved(a.clone()));
        let later = "2026-12-02T10:00:01Z";
        assert_eq!(at_version(later, later, a.clone()), Verdict::ChangedAfter(a));
    }
}
