//! The filters the stand-in implements, read from the coerced arguments: on issues `and`,
//! `team`, `labels.some`, `state`, `assignee`, `updatedAt` and `project.name`; on an issue's
//! comments `createdAt`; on teams, labels and workflow states the keys DevPilot uses. Any
//! other key is refused (see [`Input`]), so a filter the engine relies on is either applied
//! or an error, never ignored.

use super::clock::parse_rfc3339;
use super::input::Input;
use super::state::{CommentRow, IssueRow, State, VIEWER};

/// A `StringComparator` (or `IDComparator`) restricted to the operators given.
#[derive(Default)]
pub(crate) struct StrCmp {
    eq: Option<String>,
    eq_ignore_case: Option<String>,
    any: Option<Vec<String>>,
    none: Option<Vec<String>>,
}

impl StrCmp {
    /// Reads the comparator at `key` of `input`, allowing the operators in `ops` (of `eq`,
    /// `eqIgnoreCase`, `in`, `nin`).
    pub(crate) fn read(input: &mut Input<'_>, key: &'static str, ops: &[&'static str]) -> Result<Option<Self>, String> {
        let Some(mut cmp) = input.child(key)? else { return Ok(None) };
        let mut out = Self::default();
        for op in ops {
            match *op {
                "eq" => out.eq = cmp.string("eq")?.map(str::to_string),
                "eqIgnoreCase" => out.eq_ignore_case = cmp.string("eqIgnoreCase")?.map(str::to_string),
                "in" => out.any = cmp.strings("in")?,
                "nin" => out.none = cmp.strings("nin")?,
                other => return Err(format!("the stand-in has no string operator {other}")),
            }
        }
        cmp.finish()?;
        Ok(Some(out))
    }

    /// Whether `value` passes every operator given.
    pub(crate) fn matches(&self, value: &str) -> bool {
        self.eq.as_ref().is_none_or(|eq| eq == value)
            && self.eq_ignore_case.as_ref().is_none_or(|eq| eq.to_lowercase() == value.to_lowercase())
            && self.any.as_ref().is_none_or(|any| any.iter().any(|v| v == value))
            && self.none.as_ref().is_none_or(|none| none.iter().all(|v| v != value))
    }
}

/// A `TeamFilter`: `key` (`eq`, `in`) and `id` (`eq`, `in`).
#[derive(Default)]
pub(crate) struct TeamFilter {
    key: Option<StrCmp>,
    id: Option<StrCmp>,
}

impl TeamFilter {
    /// Reads a team filter.
    pub(crate) fn read(mut input: Input<'_>) -> Result<Self, String> {
        let key = StrCmp::read(&mut input, "key", &["eq", "in"])?;
        let id = StrCmp::read(&mut input, "id", &["eq", "in"])?;
        input.finish()?;
        Ok(Self { key, id })
    }

    /// Whether team `team` passes.
    pub(crate) fn matches(&self, state: &State, team: usize) -> bool {
        let row = &state.teams[team];
        self.key.as_ref().is_none_or(|c| c.matches(&row.key)) && self.id.as_ref().is_none_or(|c| c.matches(&row.id))
    }
}

/// An `IssueLabelFilter`: `name` (`eq`, `eqIgnoreCase`, `in`).
pub(crate) struct LabelFilter {
    name: Option<StrCmp>,
}

impl LabelFilter {
    /// Reads a label filter.
    pub(crate) fn read(mut input: Input<'_>) -> Result<Self, String> {
        let name = StrCmp::read(&mut input, "name", &["eq", "eqIgnoreCase", "in"])?;
        input.finish()?;
        Ok(Self { name })
    }

    /// Whether label `label` passes.
    pub(crate) fn matches(&self, state: &State, label: usize) -> bool {
        self.name.as_ref().is_none_or(|c| c.matches(&state.labels[label].name))
    }
}

/// A `WorkflowStateFilter`: `type` (`eq`, `in`, `nin`), `name` (`eq`, `in`) and `team`.
pub(crate) struct StateFilter {
    kind: Option<StrCmp>,
    name: Option<StrCmp>,
    team: Option<TeamFilter>,
}

impl StateFilter {
    /// Reads a workflow state filter.
    pub(crate) fn read(mut input: Input<'_>) -> Result<Self, String> {
        let kind = StrCmp::read(&mut input, "type", &["eq", "in", "nin"])?;
        let name = StrCmp::read(&mut input, "name", &["eq", "in"])?;
        let team = input.child("team")?.map(TeamFilter::read).transpose()?;
        input.finish()?;
        Ok(Self { kind, name, team })
    }

    /// Whether workflow state `id` passes.
    pub(crate) fn matches(&self, state: &State, id: usize) -> bool {
        let row = &state.states[id];
        self.kind.as_ref().is_none_or(|c| c.matches(&row.kind))
            && self.name.as_ref().is_none_or(|c| c.matches(&row.name))
            && self.team.as_ref().is_none_or(|t| t.matches(state, row.team))
    }
}

/// An `IssueFilter`, of the keys the stand-in implements.
#[derive(Default)]
pub(crate) struct IssueFilter {
    and: Vec<IssueFilter>,
    team: Option<TeamFilter>,
    labels_some: Option<LabelFilter>,
    state: Option<StateFilter>,
    /// `isMe.eq`, and `null` (true: unassigned).
    assignee: Option<(Option<bool>, Option<bool>)>,
    /// `updatedAt`: `gt`, `gte` (ms).
    updated: (Option<i64>, Option<i64>),
    /// `project.name` and `project.null`.
    project: Option<(Option<StrCmp>, Option<bool>)>,
}

impl IssueFilter {
    /// Reads an issue filter (absent or null: everything passes).
    pub(crate) fn read(mut input: Input<'_>) -> Result<Self, String> {
        let and = input.list("and")?.into_iter().map(IssueFilter::read).collect::<Result<_, _>>()?;
        let team = input.child("team")?.map(TeamFilter::read).transpose()?;
        let labels_some = match input.child("labels")? {
            Some(mut labels) => {
                let some = labels.child("some")?.map(LabelFilter::read).transpose()?;
                labels.finish()?;
                some
            }
            None => None,
        };
        let state = input.child("state")?.map(StateFilter::read).transpose()?;
        let assignee = input.child("assignee")?.map(read_assignee).transpose()?;
        let updated = match input.child("updatedAt")? {
            Some(mut at) => {
                let range = (time(&mut at, "gt")?, time(&mut at, "gte")?);
                at.finish()?;
                range
            }
            None => (None, None),
        };
        let project = input.child("project")?.map(read_project).transpose()?;
        input.finish()?;
        Ok(Self { and, team, labels_some, state, assignee, updated, project })
    }

    /// Whether issue `issue` passes.
    pub(crate) fn matches(&self, state: &State, issue: usize) -> bool {
        let row = &state.issues[issue];
        self.and.iter().all(|f| f.matches(state, issue))
            && self.team.as_ref().is_none_or(|t| t.matches(state, row.team))
            && self.labels_some.as_ref().is_none_or(|l| row.labels.iter().any(|label| l.matches(state, *label)))
            && self.state.as_ref().is_none_or(|s| s.matches(state, row.state))
            && self.assignee.as_ref().is_none_or(|a| assignee_matches(*a, row))
            && self.updated.0.is_none_or(|gt| row.updated_ms > gt)
            && self.updated.1.is_none_or(|gte| row.updated_ms >= gte)
            && self.project.as_ref().is_none_or(|p| project_matches(state, p, row))
    }
}

/// A `CommentFilter`: `createdAt` (`gt`, `gte`).
pub(crate) struct CommentFilter {
    /// `createdAt`: `gt`, `gte` (ms).
    created: (Option<i64>, Option<i64>),
}

impl CommentFilter {
    /// Reads a comment filter.
    pub(crate) fn read(mut input: Input<'_>) -> Result<Self, String> {
        let created = match input.child("createdAt")? {
            Some(mut at) => {
                let range = (time(&mut at, "gt")?, time(&mut at, "gte")?);
                at.finish()?;
                range
            }
            None => (None, None),
        };
        input.finish()?;
        Ok(Self { created })
    }

    /// Whether comment `row` passes.
    pub(crate) fn matches(&self, row: &CommentRow) -> bool {
        self.created.0.is_none_or(|gt| row.created_ms > gt) && self.created.1.is_none_or(|gte| row.created_ms >= gte)
    }
}

/// A `DateTime` operator of a `DateComparator`, as milliseconds.
fn time(input: &mut Input<'_>, op: &'static str) -> Result<Option<i64>, String> {
    input.string(op)?.map(parse_rfc3339).transpose()
}

/// `assignee: { isMe: { eq }, null }`.
fn read_assignee(mut input: Input<'_>) -> Result<(Option<bool>, Option<bool>), String> {
    let is_me = match input.child("isMe")? {
        Some(mut cmp) => {
            let eq = cmp.boolean("eq")?;
            cmp.finish()?;
            eq
        }
        None => None,
    };
    let null = input.boolean("null")?;
    input.finish()?;
    Ok((is_me, null))
}

/// Whether the issue's assignee passes `(isMe.eq, null)`.
fn assignee_matches((is_me, null): (Option<bool>, Option<bool>), row: &IssueRow) -> bool {
    is_me.is_none_or(|me| (row.assignee == Some(VIEWER)) == me)
        && null.is_none_or(|null| row.assignee.is_none() == null)
}

/// `project: { name: { eq }, null }`.
fn read_project(mut input: Input<'_>) -> Result<(Option<StrCmp>, Option<bool>), String> {
    let name = StrCmp::read(&mut input, "name", &["eq"])?;
    let null = input.boolean("null")?;
    input.finish()?;
    Ok((name, null))
}

/// Whether the issue's project passes `(name, null)`; an issue without a project fails any
/// name comparison, as in Linear.
fn project_matches(state: &State, (name, null): &(Option<StrCmp>, Option<bool>), row: &IssueRow) -> bool {
    let name_ok = name.as_ref().is_none_or(|c| row.project.is_some_and(|p| c.matches(&state.projects[p].name)));
    name_ok && null.is_none_or(|null| row.project.is_none() == null)
}
