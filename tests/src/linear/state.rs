//! The stand-in's data, as rows addressed by index (nothing is ever deleted), and every change
//! the tests or the mutations make to it. Each change to an issue (title, description, labels,
//! state, assignee, a comment, an attachment) bumps its `updatedAt`, as Linear does, so the
//! engine's `updatedAt`-ordered poll sees it. A change of labels, description or title by a
//! person is also an entry in the issue's history, naming who made it (see `edits`).

use std::sync::Arc;

use super::clock::{rfc3339, Clock};
use super::model::{Issue, IssueSeed, Team, WorkflowState};

/// The viewer (the key's owner) is user 0.
pub(crate) const VIEWER: usize = 0;

/// A team: its issues are numbered `KEY-1`, `KEY-2`, ...
pub(crate) struct TeamRow {
    pub id: String,
    pub key: String,
    pub name: String,
    pub next_number: u32,
}

/// A workflow state of one team.
pub(crate) struct StateRow {
    pub id: String,
    pub team: usize,
    pub name: String,
    pub kind: String,
    pub position: f64,
}

/// A workspace label.
pub(crate) struct LabelRow {
    pub id: String,
    pub name: String,
}

/// A user: the viewer, or someone else an issue can be assigned to. A guest is limited to a
/// few teams; everyone else is a member.
pub(crate) struct UserRow {
    pub id: String,
    pub name: String,
    pub guest: bool,
}

/// A project, known by name.
pub(crate) struct ProjectRow {
    pub id: String,
    pub name: String,
}

/// An issue.
pub(crate) struct IssueRow {
    pub id: String,
    pub team: usize,
    pub number: u32,
    pub title: String,
    pub description: Option<String>,
    pub priority: u8,
    pub project: Option<usize>,
    pub state: usize,
    pub assignee: Option<usize>,
    pub labels: Vec<usize>,
    /// Who filed it (`None`: an integration).
    pub creator: Option<usize>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// One entry of an issue's history: one change, by one user (`None`: an integration).
pub(crate) struct HistoryRow {
    pub id: String,
    pub issue: usize,
    pub actor: Option<usize>,
    pub created_ms: i64,
    pub added_labels: Vec<usize>,
    pub removed_labels: Vec<usize>,
    pub updated_description: bool,
    /// The title before and after, when the change renamed the issue.
    pub title: Option<(String, String)>,
}

/// A comment on an issue.
pub(crate) struct CommentRow {
    pub id: String,
    pub issue: usize,
    pub body: String,
    pub user: usize,
    pub created_ms: i64,
}

/// A URL linked on an issue.
pub(crate) struct AttachmentRow {
    pub id: String,
    pub issue: usize,
    pub url: String,
    pub title: String,
    pub created_ms: i64,
}

/// Everything the stand-in knows.
pub(crate) struct State {
    pub teams: Vec<TeamRow>,
    pub states: Vec<StateRow>,
    pub labels: Vec<LabelRow>,
    pub users: Vec<UserRow>,
    pub projects: Vec<ProjectRow>,
    pub issues: Vec<IssueRow>,
    pub comments: Vec<CommentRow>,
    pub attachments: Vec<AttachmentRow>,
    pub history: Vec<HistoryRow>,
    pub clock: Arc<Clock>,
    /// Linear's `lastSyncId`: one more per change.
    pub sync_id: u64,
}

/// A team's states when it is created, as a new Linear team has them.
const DEFAULT_STATES: [(&str, &str); 6] = [
    ("Backlog", "backlog"),
    ("Todo", "unstarted"),
    ("In Progress", "started"),
    ("In Review", "started"),
    ("Done", "completed"),
    ("Canceled", "canceled"),
];

/// A fresh UUID, as Linear's ids are.
pub(crate) fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The URL slug of a title: lowercase words joined by `-`, at most 60 characters.
pub(crate) fn slug(title: &str) -> String {
    let mut out = String::new();
    for word in title.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()) {
        if out.len() + word.len() + 1 > 60 && !out.is_empty() {
            break;
        }
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(&word.to_ascii_lowercase());
    }
    out.truncate(60);
    out
}

impl State {
    /// The viewer `Ada` and one other user, team `ENG` with the default states, and the
    /// labels `agent`, `needs:gpu` and `frontend`.
    pub(crate) fn new(clock: Arc<Clock>) -> Self {
        let mut state = Self {
            teams: Vec::new(),
            states: Vec::new(),
            labels: Vec::new(),
            users: ["Ada", "Grace"].iter().map(|n| UserRow { id: new_id(), name: (*n).into(), guest: false }).collect(),
            projects: Vec::new(),
            issues: Vec::new(),
            comments: Vec::new(),
            attachments: Vec::new(),
            history: Vec::new(),
            clock,
            sync_id: 1000,
        };
        state.add_team("ENG", "Engineering").expect("a fresh state has no ENG yet");
        for name in ["agent", "needs:gpu", "frontend"] {
            state.label(name);
        }
        state
    }

    /// A new team with Linear's default workflow states.
    pub(crate) fn add_team(&mut self, key: &str, name: &str) -> Result<Team, String> {
        if self.team_by_key(key).is_some() {
            return Err(format!("team {key} already exists"));
        }
        let team = self.teams.len();
        self.teams.push(TeamRow { id: new_id(), key: key.into(), name: name.into(), next_number: 1 });
        for (position, (name, kind)) in DEFAULT_STATES.iter().enumerate() {
            let position = f64::from(u32::try_from(position).unwrap_or(0));
            self.states.push(StateRow { id: new_id(), team, name: (*name).into(), kind: (*kind).into(), position });
        }
        self.sync_id += 1;
        Ok(self.team(team))
    }

    /// Adds a user (a member, or a guest); a name already taken is refused.
    pub(crate) fn add_user(&mut self, name: &str, guest: bool) -> Result<usize, String> {
        if self.users.iter().any(|u| u.name == name) {
            return Err(format!("the stand-in has a user named {name} already"));
        }
        self.users.push(UserRow { id: new_id(), name: name.into(), guest });
        self.sync_id += 1;
        Ok(self.users.len() - 1)
    }

    /// The user with this name.
    pub(crate) fn user_named(&self, name: &str) -> Result<usize, String> {
        self.users.iter().position(|u| u.name == name).ok_or_else(|| format!("the stand-in has no user named {name}"))
    }

    /// The label with this exact name, created if there is none.
    pub(crate) fn label(&mut self, name: &str) -> usize {
        if let Some(found) = self.labels.iter().position(|l| l.name == name) {
            return found;
        }
        self.labels.push(LabelRow { id: new_id(), name: name.into() });
        self.sync_id += 1;
        self.labels.len() - 1
    }

    /// The project with this name, created if there is none.
    fn project(&mut self, name: &str) -> usize {
        if let Some(found) = self.projects.iter().position(|p| p.name == name) {
            return found;
        }
        self.projects.push(ProjectRow { id: new_id(), name: name.into() });
        self.projects.len() - 1
    }

    /// The team with this key.
    pub(crate) fn team_by_key(&self, key: &str) -> Option<usize> {
        self.teams.iter().position(|t| t.key == key)
    }

    /// The state of this team with this name.
    pub(crate) fn state_named(&self, team: usize, name: &str) -> Result<usize, String> {
        let found = self.states.iter().position(|s| s.team == team && s.name == name);
        found.ok_or_else(|| format!("team {} has no workflow state named {name:?}", self.teams[team].key))
    }

    /// An issue by UUID or identifier (`ENG-7`), as Linear's `issue(id:)` takes either.
    pub(crate) fn issue_by_ref(&self, reference: &str) -> Option<usize> {
        self.issues.iter().position(|i| i.id == reference).or_else(|| {
            let (key, number) = reference.rsplit_once('-')?;
            let number: u32 = number.parse().ok()?;
            let team = self.teams.iter().position(|t| t.key.eq_ignore_ascii_case(key))?;
            self.issues.iter().position(|i| i.team == team && i.number == number)
        })
    }

    /// An issue by identifier, or an error naming it.
    pub(crate) fn issue_ref(&self, reference: &str) -> Result<usize, String> {
        self.issue_by_ref(reference).ok_or_else(|| format!("the stand-in has no issue {reference}"))
    }

    /// Files an issue.
    pub(crate) fn add_issue(&mut self, seed: &IssueSeed) -> Result<Issue, String> {
        let team = self.team_by_key(&seed.team).ok_or_else(|| format!("the stand-in has no team {}", seed.team))?;
        let state = self.state_named(team, &seed.state_name)?;
        if seed.priority > 4 {
            return Err(format!("priority {} is not 0..4", seed.priority));
        }
        let creator = match &seed.creator {
            Some(name) => self.user_named(name)?,
            None => VIEWER,
        };
        let labels = seed.labels.iter().map(|name| self.label(name)).collect();
        let project = seed.project.as_deref().map(|name| self.project(name));
        let now = self.clock.tick();
        let number = self.teams[team].next_number;
        self.teams[team].next_number += 1;
        self.issues.push(IssueRow {
            id: new_id(),
            team,
            number,
            title: seed.title.clone(),
            description: seed.description.clone(),
            priority: seed.priority,
            project,
            state,
            assignee: seed.assignee_me.then_some(VIEWER),
            labels,
            creator: Some(creator),
            created_ms: now,
            updated_ms: now,
        });
        self.sync_id += 1;
        Ok(self.snapshot(self.issues.len() - 1))
    }

    /// Records a change to an issue: a new `updatedAt` and `lastSyncId`.
    pub(crate) fn bump(&mut self, issue: usize) {
        self.issues[issue].updated_ms = self.clock.tick();
        self.sync_id += 1;
    }

    /// `ENG-7`.
    pub(crate) fn identifier(&self, issue: usize) -> String {
        let row = &self.issues[issue];
        format!("{}-{}", self.teams[row.team].key, row.number)
    }

    /// `https://linear.app/standin/issue/ENG-7/<slug>`.
    pub(crate) fn url(&self, issue: usize) -> String {
        format!("https://linear.app/standin/issue/{}/{}", self.identifier(issue), slug(&self.issues[issue].title))
    }

    /// `ada/eng-7-<slug>`: Linear's suggested branch, from the viewer's name.
    pub(crate) fn branch_name(&self, issue: usize) -> String {
        let viewer = self.users[VIEWER].name.to_lowercase();
        format!("{viewer}/{}-{}", self.identifier(issue).to_lowercase(), slug(&self.issues[issue].title))
    }

    /// A team as the API hands it out.
    pub(crate) fn team(&self, team: usize) -> Team {
        let row = &self.teams[team];
        Team { id: row.id.clone(), key: row.key.clone(), name: row.name.clone() }
    }

    /// A team's workflow states, in position order.
    pub(crate) fn workflow_states(&self, team: usize) -> Vec<WorkflowState> {
        let rows = self.states.iter().filter(|s| s.team == team);
        rows.map(|s| WorkflowState {
            id: s.id.clone(),
            name: s.name.clone(),
            kind: s.kind.clone(),
            position: s.position,
        })
        .collect()
    }

    /// An issue as the API hands it out.
    pub(crate) fn snapshot(&self, issue: usize) -> Issue {
        let row = &self.issues[issue];
        let state = &self.states[row.state];
        Issue {
            id: row.id.clone(),
            identifier: self.identifier(issue),
            title: row.title.clone(),
            description: row.description.clone(),
            url: self.url(issue),
            branch_name: self.branch_name(issue),
            priority: row.priority,
            team: self.teams[row.team].key.clone(),
            project: row.project.map(|p| self.projects[p].name.clone()),
            state_name: state.name.clone(),
            state_type: state.kind.clone(),
            assignee: row.assignee.map(|u| self.users[u].name.clone()),
            assignee_me: row.assignee == Some(VIEWER),
            labels: row.labels.iter().map(|l| self.labels[*l].name.clone()).collect(),
            updated_at: rfc3339(row.updated_ms),
        }
    }
}
