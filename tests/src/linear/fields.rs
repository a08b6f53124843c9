//! The fields of each object type the stand-in answers: what DevPilot's documents select and
//! the neighbours a reader would expect beside them. Anything else is refused by name (see
//! [`Obj::unknown`]) rather than answered with an invented value.

use apollo_compiler::resolvers::{FieldError, ResolveInfo, ResolvedValue};

use super::clock::rfc3339;
use super::filter::CommentFilter;
use super::input::Input;
use super::objects::{in_order, paged, Node, Obj};
use super::page::PageArgs;
use super::state::VIEWER;

/// A leaf value.
fn leaf<'a>(value: impl Into<apollo_compiler::response::JsonValue>) -> ResolvedValue<'a> {
    ResolvedValue::leaf(value)
}

/// Linear's name for a priority.
fn priority_label(priority: u8) -> &'static str {
    ["No priority", "Urgent", "High", "Medium", "Low"].get(usize::from(priority)).copied().unwrap_or("No priority")
}

impl Obj<'_, '_> {
    /// `User`.
    pub(crate) fn user<'a>(&'a self, user: usize, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        self.ctx.read(|s| {
            let row = &s.users[user];
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "name" => leaf(row.name.clone()),
                "displayName" => leaf(row.name.to_lowercase()),
                "email" => leaf(format!("{}@standin.example", row.name.to_lowercase())),
                "isMe" => leaf(user == VIEWER),
                "active" => leaf(true),
                "guest" => leaf(row.guest),
                "admin" | "app" => leaf(false),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `Team`.
    pub(crate) fn team<'a>(&'a self, team: usize, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        let (row_id, key, name, states) = self.ctx.read(|s| {
            let row = &s.teams[team];
            let states = s.states.iter().enumerate().filter(|(_, st)| st.team == team).map(|(i, _)| Node::State(i));
            (row.id.clone(), row.key.clone(), row.name.clone(), in_order(states))
        });
        Ok(match info.field_name() {
            "id" => leaf(row_id),
            "key" => leaf(key),
            "name" | "displayName" => leaf(name),
            "states" => return self.connection(info, "WorkflowState", states, false),
            _ => return Err(self.unknown(info)),
        })
    }

    /// `WorkflowState`.
    pub(crate) fn workflow_state<'a>(
        &'a self,
        state: usize,
        info: &ResolveInfo<'_>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        self.ctx.read(|s| {
            let row = &s.states[state];
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "name" => leaf(row.name.clone()),
                "type" => leaf(row.kind.clone()),
                "position" => leaf(row.position),
                "color" => leaf("#bec2c8"),
                "description" => ResolvedValue::null(),
                "team" => self.object(Node::Team(row.team)),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `IssueLabel`.
    pub(crate) fn label<'a>(&'a self, label: usize, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        self.ctx.read(|s| {
            let row = &s.labels[label];
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "name" => leaf(row.name.clone()),
                "color" => leaf("#5e6ad2"),
                "description" => ResolvedValue::null(),
                "isGroup" => leaf(false),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `Project`.
    pub(crate) fn project<'a>(
        &'a self,
        project: usize,
        info: &ResolveInfo<'_>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        self.ctx.read(|s| {
            let row = &s.projects[project];
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "name" => leaf(row.name.clone()),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `Issue`'s scalar fields and single objects; its connections are in `issue_connection`.
    pub(crate) fn issue<'a>(&'a self, issue: usize, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        if matches!(info.field_name(), "labels" | "comments" | "attachments" | "history") {
            return self.issue_connection(issue, info);
        }
        self.ctx.read(|s| {
            let row = &s.issues[issue];
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "identifier" => leaf(s.identifier(issue)),
                "number" => leaf(f64::from(row.number)),
                "title" => leaf(row.title.clone()),
                "description" => leaf(row.description.clone()),
                "url" => leaf(s.url(issue)),
                "branchName" => leaf(s.branch_name(issue)),
                "priority" => leaf(f64::from(row.priority)),
                "priorityLabel" => leaf(priority_label(row.priority)),
                "createdAt" => leaf(rfc3339(row.created_ms)),
                "updatedAt" => leaf(rfc3339(row.updated_ms)),
                "labelIds" => {
                    ResolvedValue::list(row.labels.iter().map(|l| leaf(s.labels[*l].id.clone())).collect::<Vec<_>>())
                }
                "team" => self.object(Node::Team(row.team)),
                "state" => self.object(Node::State(row.state)),
                "project" => self.nullable(row.project.map(Node::Project)),
                "assignee" => self.nullable(row.assignee.map(Node::User)),
                "creator" => self.nullable(row.creator.map(Node::User)),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `Issue.labels`, `Issue.comments`, `Issue.attachments`, `Issue.history` (oldest first).
    fn issue_connection<'a>(&'a self, issue: usize, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        if info.field_name() == "comments" {
            return self.issue_comments(issue, info);
        }
        let (of, items) = self.ctx.read(|s| match info.field_name() {
            "labels" => ("IssueLabel", in_order(s.issues[issue].labels.iter().map(|l| Node::Label(*l)))),
            "history" => {
                let entries = s.history.iter().enumerate().filter(|(_, h)| h.issue == issue);
                ("IssueHistory", in_order(entries.map(|(i, _)| Node::History(i))))
            }
            _ => {
                let attachments = s.attachments.iter().enumerate().filter(|(_, a)| a.issue == issue);
                ("Attachment", in_order(attachments.map(|(i, _)| Node::Attachment(i))))
            }
        });
        self.connection(info, of, items, false)
    }

    /// `Issue.comments(filter: { createdAt }, first, after)`, oldest first; a cursor names the
    /// comment itself, so a page after it is the same whatever was added since.
    fn issue_comments<'a>(&'a self, issue: usize, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        let mut args = Input::args(info.arguments(), "Issue.comments");
        let read = PageArgs::read(&mut args).and_then(|paging| {
            let filter = args.child("filter")?.map(CommentFilter::read).transpose()?;
            args.finish().map(|()| (paging, filter))
        });
        let (paging, filter) = read.map_err(|e| self.ctx.invalid(e))?;
        let items = self.ctx.read(|s| {
            let mine = s.comments.iter().enumerate().filter(|(_, c)| c.issue == issue);
            let passing = mine.filter(|(_, c)| filter.as_ref().is_none_or(|f| f.matches(c)));
            passing.map(|(i, _)| (format!("{i:08}"), Node::Comment(i))).collect()
        });
        Ok(self.object(paged("Comment", items, false, &paging)))
    }

    /// `Comment`: a person's (the stand-in has no integrations: `botActor` and `externalUser`
    /// are null).
    pub(crate) fn comment<'a>(
        &'a self,
        comment: usize,
        info: &ResolveInfo<'_>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        self.ctx.read(|s| {
            let row = &s.comments[comment];
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "body" => leaf(row.body.clone()),
                "createdAt" | "updatedAt" => leaf(rfc3339(row.created_ms)),
                "url" => leaf(format!("{}#comment-{}", s.url(row.issue), &row.id[..8])),
                "issueId" => leaf(s.issues[row.issue].id.clone()),
                "issue" => self.object(Node::Issue(row.issue)),
                "user" => self.object(Node::User(row.user)),
                "botActor" | "externalUser" | "parentId" | "editedAt" => ResolvedValue::null(),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `Attachment`.
    pub(crate) fn attachment<'a>(
        &'a self,
        attachment: usize,
        info: &ResolveInfo<'_>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        self.ctx.read(|s| {
            let row = &s.attachments[attachment];
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "url" => leaf(row.url.clone()),
                "title" => leaf(row.title.clone()),
                "subtitle" => ResolvedValue::null(),
                "createdAt" | "updatedAt" => leaf(rfc3339(row.created_ms)),
                "issue" => self.object(Node::Issue(row.issue)),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `IssueHistory`: who made the change, when, and what it changed of the labels, the
    /// description, the title, the team and the project (a list field of a change that did not touch it is null, as
    /// in Linear).
    pub(crate) fn history_entry<'a>(
        &'a self,
        entry: usize,
        info: &ResolveInfo<'_>,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        self.ctx.read(|s| {
            let row = &s.history[entry];
            let labels = |ids: &[usize], objects: bool| {
                if ids.is_empty() {
                    return ResolvedValue::null();
                }
                let one = |l: usize| if objects { self.object(Node::Label(l)) } else { leaf(s.labels[l].id.clone()) };
                ResolvedValue::list(ids.iter().map(|l| one(*l)).collect::<Vec<_>>())
            };
            Ok(match info.field_name() {
                "id" => leaf(row.id.clone()),
                "createdAt" | "updatedAt" => leaf(rfc3339(row.created_ms)),
                "actor" => self.nullable(row.actor.map(Node::User)),
                "actorId" => leaf(row.actor.map(|u| s.users[u].id.clone())),
                "addedLabelIds" => labels(&row.added_labels, false),
                "addedLabels" => labels(&row.added_labels, true),
                "removedLabelIds" => labels(&row.removed_labels, false),
                "removedLabels" => labels(&row.removed_labels, true),
                "updatedDescription" => leaf(row.updated_description.then_some(true)),
                "descriptionUpdatedBy" if row.updated_description => {
                    ResolvedValue::list(row.actor.map(|u| self.object(Node::User(u))).into_iter().collect::<Vec<_>>())
                }
                "descriptionUpdatedBy" => ResolvedValue::null(),
                "fromTitle" => leaf(row.title.as_ref().map(|t| t.0.clone())),
                "toTitle" => leaf(row.title.as_ref().map(|t| t.1.clone())),
                // The stand-in never moves an issue to another team or project.
                "fromTeamId" | "toTeamId" | "fromProjectId" | "toProjectId" => ResolvedValue::null(),
                "issue" => self.object(Node::Issue(row.issue)),
                _ => return Err(self.unknown(info)),
            })
        })
    }

    /// `CommentPayload`, `IssuePayload`, `AttachmentPayload`.
    pub(crate) fn payload<'a>(&'a self, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        Ok(match (info.field_name(), &self.node) {
            ("success", _) => leaf(true),
            ("lastSyncId", _) => leaf(self.ctx.read(|s| s.sync_id as f64)),
            ("comment", Node::CommentPayload(c)) => self.object(Node::Comment(*c)),
            ("issue", Node::IssuePayload(i)) => self.object(Node::Issue(*i)),
            ("attachment", Node::AttachmentPayload(a)) => self.object(Node::Attachment(*a)),
            _ => return Err(self.unknown(info)),
        })
    }
}
