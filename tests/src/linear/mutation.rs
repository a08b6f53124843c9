//! The root `Mutation` fields the stand-in applies: `commentCreate`, `issueUpdate` (a state
//! move) and `attachmentLinkURL`. Each reads and checks all of its input before it changes
//! anything, so a refused input never half-applies.

use apollo_compiler::resolvers::{FieldError, ResolveInfo, ResolvedValue};

use super::input::{unimplemented, Input};
use super::objects::{Ctx, Node, Obj};
use super::state::State;

/// Resolves one root `Mutation` field.
pub(crate) fn field<'a>(ctx: &'a Ctx<'_>, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
    let name = info.field_name();
    let args = Input::args(info.arguments(), name);
    let node = match name {
        "commentCreate" => comment_create(ctx, args),
        "issueUpdate" => issue_update(ctx, args),
        "attachmentLinkURL" => link_url(ctx, args),
        _ => Err(unimplemented(&format!("Mutation.{name}"))),
    };
    let node = node.map_err(|e| ctx.invalid(e))?;
    Ok(ResolvedValue::object(Obj { ctx, node }))
}

/// The issue an id or identifier names, or Linear's "Entity not found: Issue".
fn find_issue(s: &State, reference: &str) -> Result<usize, String> {
    s.issue_by_ref(reference).ok_or_else(|| "Entity not found: Issue".to_string())
}

/// `commentCreate(input: { issueId, body, id })`: a comment as the viewer; a client-chosen
/// `id` must be a UUID no comment has yet ("Entity already exists").
fn comment_create(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let mut input = args.child("input")?.ok_or("commentCreate needs an input")?;
    let issue = input.string("issueId")?;
    let body = input.string("body")?;
    let id = input.string("id")?;
    input.finish()?;
    args.finish()?;
    let issue =
        issue.ok_or("the stand-in implements comments on issues only: `commentCreate.input.issueId` is required")?;
    let body = body.ok_or("Argument Validation Error: `commentCreate.input.body` is required (the stand-in does not implement `bodyData`)")?;
    ctx.write(|s| {
        let issue = find_issue(s, issue)?;
        s.add_comment(issue, id, body).map(Node::CommentPayload)
    })
}

/// `issueUpdate(id, input: { stateId })`: moves the issue to one of its team's states.
fn issue_update(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let id = args.string("id")?.unwrap_or_default();
    let mut input = args.child("input")?.ok_or("issueUpdate needs an input")?;
    let state_id = input.string("stateId")?;
    input.finish()?;
    args.finish()?;
    let state_id = state_id.ok_or("the stand-in implements only `issueUpdate.input.stateId`, and it was not given")?;
    ctx.write(|s| {
        let issue = find_issue(s, id)?;
        let state = s.states.iter().position(|st| st.id == state_id).ok_or("Entity not found: WorkflowState")?;
        if s.states[state].team != s.issues[issue].team {
            return Err(format!(
                "Invalid input: workflow state {state_id} belongs to another team than {}",
                s.identifier(issue)
            ));
        }
        s.set_state(issue, state);
        Ok(Node::IssuePayload(issue))
    })
}

/// `attachmentLinkURL(issueId, url, title)`: one attachment per (issue, URL); linking the
/// same URL again succeeds and changes nothing.
fn link_url(ctx: &Ctx<'_>, mut args: Input<'_>) -> Result<Node, String> {
    let issue = args.string("issueId")?.unwrap_or_default();
    let url = args.string("url")?.unwrap_or_default();
    let title = args.string("title")?;
    args.finish()?;
    ctx.write(|s| {
        let issue = find_issue(s, issue)?;
        Ok(Node::AttachmentPayload(s.link_url(issue, url, title)))
    })
}
