//! A loopback stand-in for Linear's GraphQL API, so the engine's Linear intake is tested
//! against the contract rather than against a mock that agrees with whatever the client sends.
//!
//! Every request is checked against Linear's published schema (`contracts/linear`) with
//! apollo-compiler before anything runs: a document, operation or variables the schema does not
//! allow is refused with HTTP 400 `GRAPHQL_VALIDATION_FAILED` and recorded as rejected
//! ([`LinearStandIn::rejected`]; tests assert it stays empty). What the schema allows is
//! executed by resolvers over the stand-in's data; an argument, filter key or field the
//! stand-in does not implement is a GraphQL error naming it, never silently ignored.
//! Authentication, rate limits (and their headers) and error shapes are Linear's; faults
//! (a lost answer, a 5xx, a rate limit, a refused key) can be injected per operation.
//!
//! # Layout
//! - `http` (a std-only HTTP/1.1 server, one thread per connection) → `handler` (auth, faults,
//!   budget, validation, recording) → `graphql` (the schema, checking, complexity, execution)
//!   → `query`/`mutation` (root fields) → `objects`/`fields` (object types), `filter`/`input`
//!   (filters that refuse what they do not implement), `page` (cursors).
//! - `state`/`edits` (the data and its changes), `clock`, `limits`, `shared` (what the threads
//!   share), `model` (the public types), `admin` (the binary's `/_admin/` endpoints), `wire`.

mod admin;
mod clock;
mod edits;
mod fields;
mod filter;
mod graphql;
mod handler;
mod http;
mod input;
mod limits;
mod model;
mod mutation;
mod objects;
mod page;
mod query;
mod shared;
mod state;
mod wire;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use model::{Comment, Fault, Issue, IssueSeed, Recorded, Team, WorkflowState};

/// How to start a stand-in beyond its key.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The port on 127.0.0.1 (0: any free one).
    pub port: u16,
    /// Serve the `/_admin/` endpoints (the binary does, for the Python end-to-end test).
    pub admin: bool,
}

/// A running stand-in for `https://api.linear.app/graphql`. Cheap to clone (all clones share
/// one server and its data); the server stops when the last clone is dropped.
///
/// Team `ENG` (with Linear's default workflow states), the labels `agent`, `needs:gpu` and
/// `frontend`, the viewer `Ada` and one other member, `Grace`, exist from the start. Changes of
/// labels, description and title are recorded in the issue's history (`Issue.history`), by
/// the viewer unless a `*_as` method names another user; a comment is the viewer's (what the
/// engine posts) unless [`comment_as`](Self::comment_as) names another. The methods that name an issue take
/// its identifier (`ENG-1`) or UUID and panic on an unknown one: this is test harness code,
/// where a wrong name is the test's bug.
#[derive(Clone)]
pub struct LinearStandIn {
    shared: Arc<shared::Shared>,
    server: Arc<http::Server>,
}

impl fmt::Debug for LinearStandIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("LinearStandIn").field("url", &self.url()).finish_non_exhaustive()
    }
}

impl LinearStandIn {
    /// Starts a stand-in on a free loopback port that accepts `key` (as Linear accepts a
    /// personal API key: the bare key in `Authorization`, no `Bearer`).
    pub fn start(key: &str) -> Self {
        Self::start_with(key, Options::default()).expect("start the Linear stand-in")
    }

    /// Starts a stand-in with [`Options`].
    pub fn start_with(key: &str, options: Options) -> io::Result<Self> {
        let shared = Arc::new(shared::Shared::new(key, options.admin));
        // Validate the schema now rather than inside the first request's timeout.
        graphql::schema();
        let server = Arc::new(http::Server::start(shared.clone(), options.port)?);
        Ok(Self { shared, server })
    }

    /// `http://127.0.0.1:PORT/graphql`: what the engine's Linear endpoint setting takes.
    pub fn url(&self) -> String {
        format!("http://{}/graphql", self.server.addr())
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Adds a team (with Linear's default workflow states).
    pub fn add_team(&self, key: &str, name: &str) -> Team {
        self.shared.state().add_team(key, name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A team by key.
    pub fn team(&self, key: &str) -> Team {
        let state = self.shared.state();
        let team = state.team_by_key(key).unwrap_or_else(|| panic!("the stand-in has no team {key}"));
        state.team(team)
    }

    /// A team's workflow states, in position order.
    pub fn workflow_states(&self, team_key: &str) -> Vec<WorkflowState> {
        let state = self.shared.state();
        let team = state.team_by_key(team_key).unwrap_or_else(|| panic!("the stand-in has no team {team_key}"));
        state.workflow_states(team)
    }

    /// Adds a label (if it is new); its id.
    pub fn add_label(&self, name: &str) -> String {
        let mut state = self.shared.state();
        let label = state.label(name);
        state.labels[label].id.clone()
    }

    /// Files an issue, as a person would in Linear.
    pub fn add_issue(&self, seed: IssueSeed) -> Issue {
        self.shared.add_issue(&seed).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An issue as it is now.
    pub fn issue(&self, issue: &str) -> Issue {
        self.shared.issue(issue).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Replaces an issue's labels (a person relabelling it; bumps `updatedAt`).
    pub fn set_labels(&self, issue: &str, labels: &[&str]) -> Issue {
        self.edit(issue, |s, i| s.set_labels(i, labels))
    }

    /// Moves an issue to the state with this name in its team (bumps `updatedAt`).
    pub fn set_state(&self, issue: &str, state_name: &str) -> Issue {
        self.shared.set_state(issue, state_name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Replaces an issue's description (`None`: null).
    pub fn set_description(&self, issue: &str, description: Option<&str>) -> Issue {
        self.edit(issue, |s, i| s.set_description(i, description))
    }

    /// Renames an issue.
    pub fn set_title(&self, issue: &str, title: &str) -> Issue {
        self.edit(issue, |s, i| s.set_title(i, title))
    }

    /// Assigns an issue to the viewer (`true`) or unassigns it.
    pub fn set_assignee_me(&self, issue: &str, me: bool) -> Issue {
        self.edit(issue, |s, i| s.set_assignee_me(i, me))
    }

    /// Assigns an issue to the other user (someone who is not the viewer).
    pub fn set_assignee_other(&self, issue: &str) -> Issue {
        self.edit(issue, |s, i| s.set_assignee_other(i))
    }

    /// Adds a user to the workspace: a member, or a guest (`guest`), who may label and edit
    /// issues but whose label approves nothing. Panics on a name already taken.
    pub fn add_user(&self, name: &str, guest: bool) {
        self.shared.state().add_user(name, guest).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Applies a label to an issue as the user named `user` (one history entry naming them).
    pub fn label_as(&self, issue: &str, label: &str, user: &str) -> Issue {
        self.edit_as(issue, user, |s, i, u| s.label_by(i, label, true, u))
    }

    /// Removes a label from an issue as the user named `user`.
    pub fn unlabel_as(&self, issue: &str, label: &str, user: &str) -> Issue {
        self.edit_as(issue, user, |s, i, u| s.label_by(i, label, false, u))
    }

    /// Replaces an issue's description as the user named `user`, its author for instance.
    pub fn describe_as(&self, issue: &str, user: &str, description: &str) -> Issue {
        self.edit_as(issue, user, |s, i, u| s.set_description_by(i, Some(description), u))
    }

    /// One change to an issue by the user named `user`.
    fn edit_as(&self, issue: &str, user: &str, change: impl FnOnce(&mut state::State, usize, usize)) -> Issue {
        let edited = self.shared.edit(issue, |s, i| {
            let u = s.user_named(user)?;
            change(s, i, u);
            Ok(())
        });
        edited.unwrap_or_else(|e| panic!("{e}"))
    }

    /// One infallible change to an issue.
    fn edit(&self, issue: &str, change: impl FnOnce(&mut state::State, usize)) -> Issue {
        let edited = self.shared.edit(issue, |s, i| {
            change(s, i);
            Ok(())
        });
        edited.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Comments on an issue as the user named `user` (a member, or a guest: see
    /// [`add_user`](Self::add_user)); the comment's id.
    pub fn comment_as(&self, issue: &str, user: &str, body: &str) -> String {
        self.shared.comment_as(issue, user, body).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An issue's comments, oldest first.
    pub fn comments(&self, issue: &str) -> Vec<Comment> {
        self.shared.comments(issue).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An issue's linked URLs and their titles, oldest first.
    pub fn attachments(&self, issue: &str) -> Vec<(String, String)> {
        self.shared.attachments(issue).unwrap_or_else(|e| panic!("{e}"))
    }

    /// How many requests named this operation arrived (answered, rejected or faulted).
    pub fn calls(&self, operation: &str) -> usize {
        self.shared.call_counts().get(operation).copied().unwrap_or(0)
    }

    /// Requests per operation name (`<anonymous>` for unnamed ones).
    pub fn call_counts(&self) -> BTreeMap<String, usize> {
        self.shared.call_counts()
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests()
    }

    /// The requests refused because the schema does not allow them: the engine sent
    /// something Linear would refuse. Tests assert this is empty.
    pub fn rejected(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.rejected).collect()
    }

    /// Plays `fault` for the next `times` requests (only those of operation `only_op`, if
    /// given), in the order faults were injected. Panics on an operation DevPilot never sends.
    pub fn inject(&self, fault: Fault, times: usize, only_op: Option<&str>) {
        if let Err(e) = self.shared.inject(fault, times, only_op) {
            panic!("{e}");
        }
    }

    /// Holds the next request of operation `op` at a gate, answered once the test opens it
    /// (see [`crate::gate`]): the test changes the data between two calls of the client.
    /// Panics on an operation DevPilot never sends.
    pub fn gate(&self, op: &str) -> std::sync::Arc<crate::gate::Gate> {
        self.shared.gate(op).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Disarms every injected fault.
    pub fn clear_faults(&self) {
        self.shared.control().faults.clear();
    }

    /// Accepts another key from now on (the old one is refused, as after a rotation).
    pub fn set_key(&self, key: &str) {
        self.shared.control().key = key.into();
    }

    /// Sets how many requests are left in the hourly budget and when it refills.
    pub fn set_rate_limit(&self, remaining_requests: u64, reset_in: Duration) {
        self.shared.set_rate_limit(remaining_requests, reset_in);
    }

    /// Sets how many complexity points are left and when they refill.
    pub fn set_complexity_limit(&self, remaining_points: u64, reset_in: Duration) {
        self.shared.set_complexity_limit(remaining_points, reset_in);
    }

    /// Moves the stand-in's clock forward (later changes get later `updatedAt`s; budgets
    /// whose reset time passes refill).
    pub fn advance_clock(&self, by: Duration) {
        self.shared.clock.advance(by);
    }

    /// The stand-in's current time, as Linear writes a `DateTime`.
    pub fn now(&self) -> String {
        clock::rfc3339(self.shared.clock.now_ms())
    }
}
