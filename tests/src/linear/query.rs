//! The root `Query` fields the stand-in answers: `viewer`, `teams`, `issueLabels`, `issues`,
//! `workflowStates`, `comment`, `issue` and `team`. Each reads its arguments through
//! [`Input`], so an argument or filter key it does not implement is an error, not ignored.

use apollo_compiler::resolvers::{FieldError, ResolveInfo, ResolvedValue};

use super::filter::{IssueFilter, LabelFilter, StateFilter, TeamFilter};
use super::input::{unimplemented, Input};
use super::objects::{in_order, paged, Ctx, Node, Obj};
use super::page::PageArgs;
use super::state::VIEWER;

/// Resolves one root `Query` field.
pub(crate) fn field<'a>(ctx: &'a Ctx<'_>, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
    let name = info.field_name();
    let args = Input::args(info.arguments(), name);
    let node = match name {
        "viewer" => args.finish().map(|()| Node::User(VIEWER)),
        "teams" => teams(ctx, args),
        "issueLabels" => labels(ctx, args),
        "issues" => issues(ctx, args),
        "workflowStates" => workflow_states(ctx, args),
        "comment" => comment(ctx, args),
        "issue" => issue(ctx, args),
        "team" => team(ctx, args),
        _ => Err(unimplemented(&format!("Query.{name}"))),
    };
    let node = node.map_err(|e| ctx.invalid(e))?;
    Ok(ResolvedValue::object(Obj { ctx, node }))
}

/// `teams(filter: { key, id }, first, after)`, in creation order.
fn teams(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let paging = PageArgs::read(&mut args)?;
    let filter = args.child("filter")?.map(TeamFilter::read).transpose()?;
    args.finish()?;
    let items = ctx.read(|s| {
        in_order((0..s.teams.len()).filter(|t| filter.as_ref().is_none_or(|f| f.matches(s, *t))).map(Node::Team))
    });
    Ok(paged("Team", items, false, &paging))
}

/// `issueLabels(filter: { name }, first, after)`, in creation order.
fn labels(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let paging = PageArgs::read(&mut args)?;
    let filter = args.child("filter")?.map(LabelFilter::read).transpose()?;
    args.finish()?;
    let items = ctx.read(|s| {
        in_order((0..s.labels.len()).filter(|l| filter.as_ref().is_none_or(|f| f.matches(s, *l))).map(Node::Label))
    });
    Ok(paged("IssueLabel", items, false, &paging))
}

/// `workflowStates(filter: { team, type, name }, first, after)`, in position order.
fn workflow_states(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let paging = PageArgs::read(&mut args)?;
    let filter = args.child("filter")?.map(StateFilter::read).transpose()?;
    args.finish()?;
    let items = ctx.read(|s| {
        in_order((0..s.states.len()).filter(|st| filter.as_ref().is_none_or(|f| f.matches(s, *st))).map(Node::State))
    });
    Ok(paged("WorkflowState", items, false, &paging))
}

/// `issues(filter, first, after, orderBy, sort)`: newest first by `createdAt` (Linear's
/// default) or, with `orderBy: updatedAt`, by `updatedAt` descending, then id; `sort:
/// [{updatedAt: {order: Ascending | Descending}}]` orders by `updatedAt` that way (any other
/// sort key is refused as not implemented).
fn issues(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let paging = PageArgs::read(&mut args)?;
    let filter = args.child("filter")?.map(IssueFilter::read).transpose()?.unwrap_or_default();
    let mut by_updated = match args.string("orderBy")? {
        None | Some("createdAt") => false,
        Some("updatedAt") => true,
        Some(other) => return Err(unimplemented(&format!("issues.orderBy: {other}"))),
    };
    let mut ascending = false;
    for mut sort in args.list("sort")? {
        let Some(mut updated) = sort.child("updatedAt")? else {
            return Err(unimplemented("issues.sort (other than updatedAt)"));
        };
        ascending = updated.string("order")? == Some("Ascending");
        updated.ignore("nulls");
        updated.finish()?;
        sort.finish()?;
        by_updated = true;
    }
    args.finish()?;
    let mut items: Vec<(String, Node)> = ctx.read(|s| {
        let matching = (0..s.issues.len()).filter(|i| filter.matches(s, *i));
        let key = |i: usize| {
            let row = &s.issues[i];
            format!("{:015}|{}", if by_updated { row.updated_ms } else { row.created_ms }, row.id)
        };
        matching.map(|i| (key(i), Node::Issue(i))).collect()
    });
    if ascending {
        items.sort_by(|a, b| a.0.cmp(&b.0));
    } else {
        items.sort_by(|a, b| b.0.cmp(&a.0));
    }
    Ok(paged("Issue", items, true, &paging))
}

/// `comment(id)`: the comment, or Linear's "Entity not found: Comment".
fn comment(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let id = args.string("id")?.map(str::to_string);
    args.finish()?;
    let id = id.ok_or("Argument Validation Error: comment needs an id (the stand-in does not implement `hash`)")?;
    let found = ctx.read(|s| s.comments.iter().position(|c| c.id.eq_ignore_ascii_case(&id)));
    found.map(Node::Comment).ok_or_else(|| "Entity not found: Comment".to_string())
}

/// `issue(id)`: by UUID or identifier.
fn issue(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let id = args.string("id")?.unwrap_or_default().to_string();
    args.finish()?;
    ctx.read(|s| s.issue_by_ref(&id)).map(Node::Issue).ok_or_else(|| "Entity not found: Issue".to_string())
}

/// `team(id)`: by UUID or key.
fn team(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let id = args.string("id")?.unwrap_or_default().to_string();
    args.finish()?;
    let found = ctx.read(|s| s.teams.iter().position(|t| t.id == id || t.key == id));
    found.map(Node::Team).ok_or_else(|| "Entity not found: Team".to_string())
}
