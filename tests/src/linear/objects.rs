//! The GraphQL objects the resolvers hand to apollo-compiler's executor: one [`Obj`] type for
//! every object type, a [`Node`] saying which row (or connection, or payload) it is, and a
//! [`Ctx`] with the state for the length of one request. A field the stand-in does not
//! implement is a field error naming it; the per-type fields are in `fields`.

use std::cell::RefCell;
use std::rc::Rc;

use apollo_compiler::resolvers::{FieldError, ObjectValue, ResolveInfo, ResolvedValue};

use super::input::{unimplemented, Input};
use super::page::{page, PageArgs, PageInfo};
use super::state::State;

/// Linear's error code for a bad argument, an unknown entity or a duplicate.
pub(crate) const INVALID_INPUT: &str = "INVALID_INPUT";

/// One request's view of the state, and the codes of the field errors raised so far
/// (apollo-compiler's `FieldError` carries only a message; the code goes in `extensions`).
pub(crate) struct Ctx<'s> {
    state: RefCell<&'s mut State>,
    codes: RefCell<Vec<(String, &'static str)>>,
}

impl<'s> Ctx<'s> {
    /// A context over the locked state.
    pub(crate) fn new(state: &'s mut State) -> Self {
        Self { state: RefCell::new(state), codes: RefCell::new(Vec::new()) }
    }

    /// Reads the state.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.borrow())
    }

    /// Changes the state (mutations run one at a time, so this never overlaps a read).
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.borrow_mut())
    }

    /// A field error with Linear's `extensions.code`.
    pub(crate) fn fail(&self, code: &'static str, message: impl Into<String>) -> FieldError {
        let message = message.into();
        self.codes.borrow_mut().push((message.clone(), code));
        FieldError { message }
    }

    /// An `INVALID_INPUT` field error.
    pub(crate) fn invalid(&self, message: impl Into<String>) -> FieldError {
        self.fail(INVALID_INPUT, message)
    }

    /// The code a field error with this message was raised with.
    pub(crate) fn code_of(&self, message: &str) -> Option<&'static str> {
        self.codes.borrow().iter().find(|(m, _)| m == message).map(|(_, code)| *code)
    }
}

/// What an [`Obj`] is: a row by index, a page of a connection, or a mutation's payload.
#[derive(Clone)]
pub(crate) enum Node {
    User(usize),
    Team(usize),
    State(usize),
    Label(usize),
    Project(usize),
    Issue(usize),
    Comment(usize),
    Attachment(usize),
    History(usize),
    Connection(Rc<Connection>),
    Edge(Rc<Connection>, usize),
    PageInfo(Rc<Connection>),
    CommentPayload(usize),
    IssuePayload(usize),
    AttachmentPayload(usize),
}

/// One page of a connection (`IssueConnection`, ...), its nodes with their cursors.
pub(crate) struct Connection {
    type_name: String,
    edge_name: String,
    nodes: Vec<(String, Node)>,
    page: PageInfo,
}

/// A GraphQL object of any type, resolved field by field.
pub(crate) struct Obj<'c, 's> {
    pub ctx: &'c Ctx<'s>,
    pub node: Node,
}

impl<'c, 's> Obj<'c, 's> {
    /// A child object.
    pub(crate) fn object<'a>(&'a self, node: Node) -> ResolvedValue<'a> {
        ResolvedValue::object(Obj { ctx: self.ctx, node })
    }

    /// A child object or null.
    pub(crate) fn nullable<'a>(&'a self, node: Option<Node>) -> ResolvedValue<'a> {
        ResolvedValue::nullable_object(node.map(|node| Obj { ctx: self.ctx, node }))
    }

    /// The error for a field the stand-in does not implement.
    pub(crate) fn unknown(&self, info: &ResolveInfo<'_>) -> FieldError {
        self.ctx.invalid(unimplemented(&format!("{}.{}", self.type_name(), info.field_name())))
    }

    /// A connection field: one page of `items` (sort key, node; in order, descending or
    /// not) by the field's `first` and `after`; any other argument with a value is refused.
    pub(crate) fn connection<'a>(
        &'a self,
        info: &ResolveInfo<'_>,
        of: &str,
        items: Vec<(String, Node)>,
        descending: bool,
    ) -> Result<ResolvedValue<'a>, FieldError> {
        let path = format!("{}.{}", self.type_name(), info.field_name());
        let mut args = Input::args(info.arguments(), &path);
        let paging = PageArgs::read(&mut args).and_then(|paging| args.finish().map(|()| paging));
        let paging = paging.map_err(|e| self.ctx.invalid(e))?;
        Ok(self.object(paged(of, items, descending, &paging)))
    }

    /// A connection, its page info or an edge.
    fn connection_field<'a>(&'a self, info: &ResolveInfo<'_>) -> Result<ResolvedValue<'a>, FieldError> {
        let field = info.field_name();
        Ok(match &self.node {
            Node::Connection(c) if field == "nodes" => {
                ResolvedValue::list(c.nodes.iter().map(|(_, n)| self.object(n.clone())))
            }
            Node::Connection(c) if field == "edges" => {
                ResolvedValue::list((0..c.nodes.len()).map(|i| self.object(Node::Edge(c.clone(), i))))
            }
            Node::Connection(c) if field == "pageInfo" => self.object(Node::PageInfo(c.clone())),
            Node::Edge(c, i) if field == "node" => self.object(c.nodes[*i].1.clone()),
            Node::Edge(c, i) if field == "cursor" => ResolvedValue::leaf(c.nodes[*i].0.clone()),
            Node::PageInfo(c) => match field {
                "hasNextPage" => ResolvedValue::leaf(c.page.has_next_page),
                "hasPreviousPage" => ResolvedValue::leaf(c.page.has_previous_page),
                "startCursor" => ResolvedValue::leaf(c.page.start_cursor.clone()),
                "endCursor" => ResolvedValue::leaf(c.page.end_cursor.clone()),
                _ => return Err(self.unknown(info)),
            },
            _ => return Err(self.unknown(info)),
        })
    }
}

/// Sort keys in the order given (creation order, for everything but issues).
pub(crate) fn in_order(nodes: impl Iterator<Item = Node>) -> Vec<(String, Node)> {
    nodes.enumerate().map(|(i, node)| (format!("{i:08}"), node)).collect()
}

/// A connection node over one page of `items`.
pub(crate) fn paged(of: &str, items: Vec<(String, Node)>, descending: bool, paging: &PageArgs) -> Node {
    let (nodes, page) = page(items, descending, paging);
    Node::Connection(Rc::new(Connection {
        type_name: format!("{of}Connection"),
        edge_name: format!("{of}Edge"),
        nodes,
        page,
    }))
}

impl ObjectValue for Obj<'_, '_> {
    fn type_name(&self) -> &str {
        match &self.node {
            Node::User(_) => "User",
            Node::Team(_) => "Team",
            Node::State(_) => "WorkflowState",
            Node::Label(_) => "IssueLabel",
            Node::Project(_) => "Project",
            Node::Issue(_) => "Issue",
            Node::Comment(_) => "Comment",
            Node::Attachment(_) => "Attachment",
            Node::History(_) => "IssueHistory",
            Node::Connection(c) => &c.type_name,
            Node::Edge(c, _) => &c.edge_name,
            Node::PageInfo(_) => "PageInfo",
            Node::CommentPayload(_) => "CommentPayload",
            Node::IssuePayload(_) => "IssuePayload",
            Node::AttachmentPayload(_) => "AttachmentPayload",
        }
    }

    fn resolve_field<'a>(&'a self, info: &'a ResolveInfo<'a>) -> Result<ResolvedValue<'a>, FieldError> {
        match self.node.clone() {
            Node::User(u) => self.user(u, info),
            Node::Team(t) => self.team(t, info),
            Node::State(s) => self.workflow_state(s, info),
            Node::Label(l) => self.label(l, info),
            Node::Project(p) => self.project(p, info),
            Node::Issue(i) => self.issue(i, info),
            Node::Comment(c) => self.comment(c, info),
            Node::Attachment(a) => self.attachment(a, info),
            Node::History(h) => self.history_entry(h, info),
            Node::Connection(_) | Node::Edge(..) | Node::PageInfo(_) => self.connection_field(info),
            Node::CommentPayload(_) | Node::IssuePayload(_) | Node::AttachmentPayload(_) => self.payload(info),
        }
    }
}
