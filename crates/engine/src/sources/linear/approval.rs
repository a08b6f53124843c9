//! Who applied the source's label to a Linear issue, and whether the job changed after.
//! Linear keeps an issue's history: each entry says who made it (`actor`), when (`createdAt`,
//! and `updatedAt` when Linear folded later changes into it), which labels it added and
//! removed, whether it changed the description or the title, and whether it moved the issue
//! to another team or project. So the job read is the approved one when no entry that changed
//! what the job is can have come after the newest application of the label by a member: its
//! text (description, title), and what picks its repo and its machine (a label the source
//! maps to a repo or reads as a requirement, the team, the project). A label the issue had
//! when it was filed was applied by its creator, at its creation. The label must still be
//! the member's: when the newest entry that touches it is not a member's application (a
//! removal, and someone else applying it again), nothing is approved.
//!
//! "Write access" on Linear is a member: an active user who is not a guest and not an app.
//! Linear has no per-team write permission the API shows; every member may edit the issues of
//! the teams they are in, while a guest is someone from outside invited to a few teams (the
//! public, on a GitHub repository) and an app is an integration acting on its own.

use serde::Deserialize;
use serde_json::json;

use super::client::{LinearClient, RateLimit, TrackerError};
use super::documents;
use crate::sources::approval::{Approval, Verdict};
use crate::sources::settings::SourceSettings;
use crate::sources::text::requires_from;

/// The most pages of history read for one issue (50 entries each).
const MAX_PAGES: usize = 10;

#[derive(Deserialize)]
struct HistoryData {
    issue: IssueHistory,
}

/// An issue's creation and one page of its history.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IssueHistory {
    pub id: String,
    pub created_at: String,
    /// Its last change, as this answer says: compared with the version whose text is in hand.
    pub updated_at: String,
    /// Null when an integration filed it, or its account was deleted.
    pub creator: Option<User>,
    pub history: Page,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Page {
    pub nodes: Vec<Entry>,
    pub page_info: PageInfo,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PageInfo {
    pub has_next_page: bool,
    pub end_cursor: Option<String>,
}

/// A user, as far as approval needs one.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct User {
    pub id: String,
    pub name: String,
    pub guest: bool,
    pub active: bool,
    pub app: bool,
}

impl User {
    /// A member: active, neither a guest nor an app.
    fn member(&self) -> bool {
        self.active && !self.guest && !self.app
    }
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Named {
    pub name: String,
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Id {
    pub id: String,
}

/// One history entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry {
    pub id: String,
    pub created_at: String,
    pub updated_at: String,
    /// Null for an integration or an automation.
    pub actor: Option<User>,
    pub added_labels: Option<Vec<Named>>,
    pub removed_labels: Option<Vec<Named>>,
    pub updated_description: Option<bool>,
    pub description_updated_by: Option<Vec<Id>>,
    pub to_title: Option<String>,
    pub from_team_id: Option<String>,
    pub to_team_id: Option<String>,
    pub from_project_id: Option<String>,
    pub to_project_id: Option<String>,
}

/// What decides a job besides its text: the source's label (the approval) and the labels the
/// source maps to a repo or reads as a requirement.
pub(crate) struct Steering<'a> {
    pub label: &'a str,
    pub settings: Option<&'a SourceSettings>,
}

impl Steering<'_> {
    /// Whether a label named `name` picks the job's repo or its machine.
    fn steers(&self, name: &str) -> bool {
        self.settings.is_some_and(|s| {
            s.repo_by_label.contains_key(name) || !requires_from(std::iter::once(name), &s.requires_prefix).is_empty()
        })
    }
}

impl Entry {
    fn adds(&self, label: &str) -> bool {
        has(&self.added_labels, label)
    }

    fn touches(&self, label: &str) -> bool {
        self.adds(label) || has(&self.removed_labels, label)
    }

    /// It changed the description or the title: the text a job runs.
    fn changes_text(&self) -> bool {
        self.updated_description == Some(true) || self.to_title.is_some()
    }

    /// It changed what the job is: its text, a label that steers it, its team or project.
    fn changes_job(&self, steering: &Steering<'_>) -> bool {
        let labels = self.added_labels.iter().chain(&self.removed_labels).flatten();
        self.changes_text()
            || labels.into_iter().any(|l| steering.steers(&l.name))
            || [&self.from_team_id, &self.to_team_id, &self.from_project_id, &self.to_project_id]
                .iter()
                .any(|moved| moved.is_some())
    }

    /// Whether every edit of the text in this entry was made by user `id`.
    fn edited_only_by(&self, id: &str) -> bool {
        let actor = self.actor.as_ref().is_some_and(|a| a.id == id);
        match self.description_updated_by.as_deref() {
            Some(by) if !by.is_empty() => actor && by.iter().all(|u| u.id == id),
            _ => actor,
        }
    }
}

fn has(labels: &Option<Vec<Named>>, label: &str) -> bool {
    labels.iter().flatten().any(|l| l.name.eq_ignore_ascii_case(label.trim()))
}

/// A time in ms; `None` when it cannot be read.
fn ms(at: &str) -> Option<i64> {
    crate::span::parse_time_ms(at).ok()
}

/// The approval of issue `id` under source settings `s`: its whole history, read page by
/// page, judged by [`judge`]. A history longer than [`MAX_PAGES`] is [`Verdict::Unreadable`]:
/// that issue waits for a person, and the turn goes on with the others.
pub async fn approval(
    client: &LinearClient,
    id: &str,
    version: &str,
    s: &SourceSettings,
) -> Result<Verdict, TrackerError> {
    let mut after: Option<String> = None;
    let mut entries = Vec::new();
    let mut moved: Option<String> = None;
    let steering = Steering { label: &s.label, settings: Some(s) };
    for _ in 0..MAX_PAGES {
        let (data, _): (HistoryData, RateLimit) =
            client.call(documents::ISSUE_HISTORY, json!({ "id": id, "after": after })).await?;
        let mut issue = data.issue;
        entries.append(&mut issue.history.nodes);
        // A change between two pages counts as much as one before the first.
        if issue.updated_at != version {
            moved.get_or_insert(issue.updated_at.clone());
        }
        if let Some(m) = &moved {
            issue.updated_at.clone_from(m);
        }
        match (issue.history.page_info.has_next_page, issue.history.page_info.end_cursor.take()) {
            (true, Some(next)) => after = Some(next),
            _ => return Ok(judge(&issue, &entries, &steering, version)),
        }
    }
    Ok(Verdict::Unreadable(format!(
        "its history has more than {} entries, so who applied the label cannot be read",
        MAX_PAGES * 50
    )))
}

/// Where an approval came from: a history entry, or the issue's creation.
struct Applied<'a> {
    approval: Approval,
    /// The earliest the label can have been applied (ms).
    from: i64,
    entry: Option<&'a Entry>,
    by_id: String,
}

/// The verdict on `issue` (its creation) with its history `entries` (any order), for the
/// text read at `version` (the issue's `updatedAt` then): the newest application of the label
/// by a member (or, if none and the issue had the label when it was filed, its filing by a
/// member), and whether any change of the job may have come after. The history is read after
/// the text, so an issue whose `updatedAt` moved since `version` (a new label, an edit the new
/// label approved) may hold other text than the one in hand: [`Verdict::ReadTooEarly`]. Only
/// the issue's own time is compared with itself, so a history entry a millisecond off the
/// issue's time never keeps an unchanged issue waiting.
pub(crate) fn judge(issue: &IssueHistory, entries: &[Entry], steering: &Steering<'_>, version: &str) -> Verdict {
    let Some(applied) = applied(issue, entries, steering.label) else { return Verdict::Unapproved };
    if issue.updated_at != version {
        return Verdict::ReadTooEarly;
    }
    let after = entries.iter().filter(|e| e.changes_job(steering)).any(|e| match applied.entry {
        // Folded into the approving entry: the approver's own changes are approved, anyone
        // else's edit of the text is not.
        Some(l) if l.id == e.id => !e.edited_only_by(&applied.by_id),
        // Provably earlier only if the entry's last change came before the label.
        _ => ms(&e.updated_at).is_none_or(|t| t >= applied.from),
    });
    if after {
        Verdict::ChangedAfter(applied.approval)
    } else {
        Verdict::Approved(applied.approval)
    }
}

/// The approving application of `label`, if any: the newest entry that touches the label,
/// when it is a member's application of it (a removal withdraws an approval, and someone
/// else's application after it approves nothing).
fn applied<'a>(issue: &IssueHistory, entries: &'a [Entry], label: &str) -> Option<Applied<'a>> {
    let touching = entries.iter().filter(|e| e.touches(label));
    let newest = touching.map(|e| (ms(&e.created_at).unwrap_or(i64::MAX), e)).max_by_key(|(t, _)| *t);
    if let Some((from, e)) = newest {
        let actor = e.actor.as_ref().filter(|a| a.member() && e.adds(label) && from != i64::MAX)?;
        let approval = Approval { id: e.id.clone(), by: actor.name.clone(), at: e.created_at.clone() };
        return Some(Applied { approval, from, entry: Some(e), by_id: actor.id.clone() });
    }
    // No entry touches the label: the issue was filed with it, by its creator.
    let creator = issue.creator.as_ref().filter(|c| c.member())?;
    let approval = Approval { id: issue.id.clone(), by: creator.name.clone(), at: issue.created_at.clone() };
    Some(Applied { approval, from: ms(&issue.created_at)?, entry: None, by_id: creator.id.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The source's label, with no label that steers a job.
    const AGENT: Steering<'static> = Steering { label: "agent", settings: None };
    /// When the text was read: after every entry of these histories.
    const LATE: &str = "2026-12-02T00:00:00.000Z";

    fn user(id: &str, guest: bool) -> User {
        User { id: id.into(), name: id.into(), guest, active: true, app: false }
    }

    fn entry(id: &str, at: &str, actor: Option<User>) -> Entry {
        Entry {
            id: id.into(),
            created_at: at.into(),
            updated_at: at.into(),
            actor,
            added_labels: None,
            removed_labels: None,
            updated_description: None,
            description_updated_by: None,
            to_title: None,
            from_team_id: None,
            to_team_id: None,
            from_project_id: None,
            to_project_id: None,
        }
    }

    fn labelled(id: &str, at: &str, by: User) -> Entry {
        Entry { added_labels: Some(vec![Named { name: "Agent".into() }]), ..entry(id, at, Some(by)) }
    }

    fn edited(id: &str, at: &str, by: User) -> Entry {
        Entry { updated_description: Some(true), ..entry(id, at, Some(by)) }
    }

    fn issue(creator: Option<User>) -> IssueHistory {
        let page = Page { nodes: vec![], page_info: PageInfo { has_next_page: false, end_cursor: None } };
        IssueHistory {
            id: "issue".into(),
            created_at: "2026-12-01T10:00:00.000Z".into(),
            updated_at: LATE.into(),
            creator,
            history: page,
        }
    }

    fn id_of(v: &Verdict) -> Option<&str> {
        match v {
            Verdict::Approved(a) | Verdict::ChangedAfter(a) => Some(&a.id),
            Verdict::Unapproved | Verdict::Unreadable(_) | Verdict::ReadTooEarly => None,
        }
    }

    /// A member's label approves the text; an edit before it does not count, one after it
    /// does, and a guest's label approves nothing.
    #[test]
    fn the_newest_members_label_against_the_edits() {
        let (ada, mal) = (user("ada", false), user("mal", true));
        let i = issue(Some(mal.clone()));
        let before = edited("e1", "2026-12-01T10:01:00.000Z", mal.clone());
        let label = labelled("l1", "2026-12-01T10:02:00.000Z", ada.clone());
        let v = judge(&i, &[before.clone(), label.clone()], &AGENT, LATE);
        assert!(matches!(v, Verdict::Approved(ref a) if a.id == "l1" && a.by == "ada"), "{v:?}");
        let after = edited("e2", "2026-12-01T10:03:00.000Z", mal.clone());
        let v = judge(&i, &[after.clone(), before, label], &AGENT, LATE);
        assert!(matches!(v, Verdict::ChangedAfter(ref a) if a.id == "l1"), "{v:?}");
        let guest = labelled("l2", "2026-12-01T10:04:00.000Z", mal.clone());
        assert_eq!(judge(&i, &[guest], &AGENT, LATE), Verdict::Unapproved);
        let title = Entry { to_title: Some("x".into()), ..entry("t", "2026-12-01T10:05:00.000Z", Some(mal)) };
        let v = judge(&i, &[labelled("l3", "2026-12-01T10:04:00.000Z", ada), title], &AGENT, LATE);
        assert!(matches!(v, Verdict::ChangedAfter(_)), "a title is text too: {v:?}");
    }

    /// The text in hand was read before the history: if the issue changed since (its
    /// `updatedAt` moved: a new label, an edit), it is not the approved text and waits for the
    /// next read; unchanged since, the same history approves it, even with a label entry a
    /// millisecond later than the issue's own time.
    #[test]
    fn text_read_before_the_issue_changed_is_read_again() {
        let (ada, mal) = (user("ada", false), user("mal", true));
        let edit = edited("e", "2026-12-01T10:01:00.000Z", mal);
        let label = labelled("l", "2026-12-01T10:02:00.000Z", ada);
        let history = [edit, label];
        let now = |at: &str| IssueHistory { updated_at: at.into(), ..issue(None) };
        let read = "2026-12-01T10:00:30.000Z";
        let v = judge(&now("2026-12-01T10:02:00.000Z"), &history, &AGENT, read);
        assert_eq!(v, Verdict::ReadTooEarly, "read before the edit and the label");
        let skewed = "2026-12-01T10:01:59.999Z";
        let v = judge(&now(skewed), &history, &AGENT, skewed);
        assert!(matches!(v, Verdict::Approved(_)), "unchanged since the read: {v:?}");
        assert!(matches!(judge(&issue(None), &history, &AGENT, LATE), Verdict::Approved(_)));
    }

    /// An entry that began before the label but took a change after it counts as after; so
    /// does one whose time cannot be read, and one at the same millisecond.
    #[test]
    fn only_a_provably_earlier_edit_is_before() {
        let (ada, mal) = (user("ada", false), user("mal", true));
        let label = labelled("l", "2026-12-01T10:02:00.000Z", ada);
        let folded = Entry {
            updated_at: "2026-12-01T10:03:00.000Z".into(),
            ..edited("e", "2026-12-01T10:01:00.000Z", mal.clone())
        };
        let same = edited("s", "2026-12-01T10:02:00.000Z", mal.clone());
        let garbled = Entry { updated_at: "yesterday".into(), ..edited("g", "2026-12-01T10:01:00.000Z", mal) };
        for e in [folded, same, garbled] {
            let v = judge(&issue(None), &[label.clone(), e], &AGENT, LATE);
            assert!(matches!(v, Verdict::ChangedAfter(_)), "{v:?}");
        }
    }

    /// The label's own entry may carry an edit: the labeller's own is approved, anyone else's
    /// folded into it is not.
    #[test]
    fn an_edit_in_the_labels_own_entry_counts_unless_the_labeller_made_it() {
        let ada = user("ada", false);
        let own = Entry { updated_description: Some(true), ..labelled("l", "2026-12-01T10:02:00.000Z", ada.clone()) };
        assert!(matches!(judge(&issue(None), std::slice::from_ref(&own), &AGENT, LATE), Verdict::Approved(_)));
        let others = Entry { description_updated_by: Some(vec![Id { id: "mal".into() }]), ..own };
        assert!(matches!(judge(&issue(None), &[others], &AGENT, LATE), Verdict::ChangedAfter(_)));
    }

    /// An issue filed with the label by a member is approved at its creation, and any edit
    /// after counts; filed by a guest or an integration, or labelled later by a guest, it is
    /// not approved at all.
    #[test]
    fn a_label_from_the_filing_is_the_creators() {
        let (ada, mal) = (user("ada", false), user("mal", true));
        let v = judge(&issue(Some(ada.clone())), &[], &AGENT, LATE);
        assert_eq!(id_of(&v), Some("issue"));
        assert!(matches!(v, Verdict::Approved(_)));
        let later = edited("e", "2026-12-01T10:05:00.000Z", ada.clone());
        assert!(matches!(judge(&issue(Some(ada.clone())), &[later], &AGENT, LATE), Verdict::ChangedAfter(_)));
        assert_eq!(judge(&issue(Some(mal.clone())), &[], &AGENT, LATE), Verdict::Unapproved);
        assert_eq!(judge(&issue(None), &[], &AGENT, LATE), Verdict::Unapproved);
        let by_guest = labelled("l", "2026-12-01T10:05:00.000Z", mal);
        assert_eq!(judge(&issue(Some(ada.clone())), &[by_guest], &AGENT, LATE), Verdict::Unapproved);
        let inactive = User { active: false, ..ada };
        assert_eq!(judge(&issue(Some(inactive)), &[], &AGENT, LATE), Verdict::Unapproved);
    }

    /// After the member's label, a label that picks the repo or the machine, or a move to
    /// another team or project, changes the job as an edit does; a label that steers nothing
    /// does not, and the member's own steering in the label's entry is approved.
    #[test]
    fn a_change_of_what_steers_the_job_counts_as_a_change() {
        let (ada, mal) = (user("ada", false), user("mal", true));
        let settings = SourceSettings {
            repo_by_label: [("frontend".to_string(), "webapp".to_string())].into(),
            ..SourceSettings::default()
        };
        let steering = Steering { label: "agent", settings: Some(&settings) };
        let label = labelled("l", "2026-12-01T10:02:00.000Z", ada.clone());
        let at = "2026-12-01T10:03:00.000Z";
        let named = |n: &str| Some(vec![Named { name: n.into() }]);
        let changes = [
            Entry { added_labels: named("frontend"), ..entry("a", at, Some(mal.clone())) },
            Entry { removed_labels: named("needs:gpu"), ..entry("r", at, Some(mal.clone())) },
            Entry { to_team_id: Some("t2".into()), from_team_id: Some("t1".into()), ..entry("t", at, None) },
            Entry { from_project_id: Some("p".into()), ..entry("p", at, Some(mal.clone())) },
        ];
        for e in changes {
            let v = judge(&issue(None), &[label.clone(), e.clone()], &steering, LATE);
            assert!(matches!(v, Verdict::ChangedAfter(_)), "{e:?}: {v:?}");
        }
        let noise = Entry { added_labels: named("bug"), ..entry("n", at, Some(mal)) };
        assert!(matches!(judge(&issue(None), &[label.clone(), noise], &steering, LATE), Verdict::Approved(_)));
        let own = Entry {
            added_labels: Some(vec![Named { name: "Agent".into() }, Named { name: "frontend".into() }]),
            ..label
        };
        assert!(matches!(judge(&issue(None), &[own], &steering, LATE), Verdict::Approved(_)));
    }

    /// The label must still be the member's: removed after the member applied it and applied
    /// again by a guest, or removed from an issue filed with it, it approves nothing; applied
    /// again by a member, it approves at that application.
    #[test]
    fn a_removal_withdraws_the_members_label() {
        let (ada, mal) = (user("ada", false), user("mal", true));
        let label = labelled("l", "2026-12-01T10:02:00.000Z", ada.clone());
        let removed = Entry {
            removed_labels: Some(vec![Named { name: "agent".into() }]),
            ..entry("r", "2026-12-01T10:03:00.000Z", Some(ada.clone()))
        };
        let by_guest = labelled("g", "2026-12-01T10:04:00.000Z", mal);
        let v = judge(&issue(None), &[label.clone(), removed.clone(), by_guest.clone()], &AGENT, LATE);
        assert_eq!(v, Verdict::Unapproved);
        let filed = issue(Some(ada.clone()));
        assert_eq!(judge(&filed, &[removed.clone(), by_guest], &AGENT, LATE), Verdict::Unapproved);
        let again = labelled("m", "2026-12-01T10:05:00.000Z", ada);
        let v = judge(&issue(None), &[label, removed, again], &AGENT, LATE);
        assert_eq!(id_of(&v), Some("m"));
    }
}
