//! Every GraphQL document DevPilot sends to Linear. Nothing else is ever sent: the client
//! takes one of these constants, never a string built at run time, and a unit test
//! validates each against Linear's published schema (`contracts/linear/schema.graphql`).
//! Values travel only as variables.

/// Who the key belongs to: the connection test, and a wrong key's first symptom.
pub const VIEWER: &str = "query DevpilotViewer { viewer { id name } }";

/// The teams with these keys (the connection test names the ones it found).
pub const TEAMS: &str = "query DevpilotTeams($keys: [String!]) {
  teams(filter: { key: { in: $keys } }, first: 50) { nodes { id key name } }
}";

/// Labels with this name, any case (the connection test names the one it found).
pub const LABELS: &str = "query DevpilotLabels($name: String!) {
  issueLabels(filter: { name: { eqIgnoreCase: $name } }, first: 50) { nodes { id name } }
}";

/// One page of issues, oldest change first, so a turn that stops after its last page (or
/// at the page limit) leaves nothing older behind its new cursor. Linear prices a query by
/// the page sizes it asks for, not by what comes back: 25 issues of at most 20 labels each
/// cost about a quarter of 50 × 50, so a 60 s interval stays far inside the hourly
/// complexity budget (an issue's labels past its 20th are not seen).
pub const ISSUES: &str = "query DevpilotIssues($filter: IssueFilter, $after: String) {
  issues(filter: $filter, first: 25, after: $after, sort: [{ updatedAt: { order: Ascending } }]) {
    nodes {
      id identifier title description url branchName priority updatedAt
      team { id key }
      project { name }
      state { type }
      assignee { isMe }
      labels(first: 20) { nodes { name } }
    }
    pageInfo { hasNextPage endCursor }
  }
}";

/// A team's workflow states, to find its first `started` one or a state named in the
/// settings.
pub const STATES: &str = "query DevpilotStates($team: ID!) {
  workflowStates(filter: { team: { id: { eq: $team } } }, first: 100) { nodes { id name type position } }
}";

/// Whether a comment with this id exists: a delivery that may have been applied before
/// its answer was lost looks before it posts again.
pub const FIND_COMMENT: &str = "query DevpilotFindComment($id: String!) { comment(id: $id) { id } }";

/// A comment with a client-chosen id (a UUID derived from the job, the event and the claim).
pub const POST_COMMENT: &str = "mutation DevpilotPostComment($input: CommentCreateInput!) {
  commentCreate(input: $input) { success comment { id } }
}";

/// Moves an issue to a workflow state.
pub const MOVE_ISSUE: &str = "mutation DevpilotMoveIssue($id: String!, $stateId: String!) {
  issueUpdate(id: $id, input: { stateId: $stateId }) { success }
}";

/// Links a URL (the branch or the pull request) on the issue; Linear dedupes by URL.
pub const LINK_URL: &str = "mutation DevpilotLinkUrl($issueId: String!, $url: String!, $title: String) {
  attachmentLinkURL(issueId: $issueId, url: $url, title: $title) { success }
}";

/// An issue's team, as Linear has it: a delivery checks it against the source's teams.
pub const ISSUE_TEAM: &str = "query DevpilotIssueTeam($id: String!) { issue(id: $id) { id team { id key } } }";

/// An issue's filing, its last change (`updatedAt`: whether it changed since its text was
/// read) and one page of its history: who applied which label, and whether an entry changed
/// the text, and when ([`super::approval`]). Read only for an issue that is new to the intake
/// or whose text changed.
pub const ISSUE_HISTORY: &str = "query DevpilotIssueHistory($id: String!, $after: String) {
  issue(id: $id) {
    id createdAt updatedAt
    creator { id name guest active app }
    history(first: 50, after: $after) {
      nodes {
        id createdAt updatedAt
        actor { id name guest active app }
        addedLabels { name }
        removedLabels { name }
        updatedDescription
        descriptionUpdatedBy { id }
        toTitle
        fromTeamId toTeamId fromProjectId toProjectId
      }
      pageInfo { hasNextPage endCursor }
    }
  }
}";

/// One page of an issue's comments written after a time (the review loop reads those after
/// its pull request opened, `super::comments`), with who wrote each: a user (a guest, a
/// deactivated one, an app's, or the key's own, `isMe`), or an integration (`user` null, a
/// `botActor` or an `externalUser`). The issue's team comes along, to check it is the
/// source's. Linear prices the page by its 50 comments, about 200 points.
pub const ISSUE_COMMENTS: &str =
    "query DevpilotIssueComments($id: String!, $since: DateTimeOrDuration!, $after: String) {
  issue(id: $id) {
    id
    team { key }
    comments(filter: { createdAt: { gt: $since } }, first: 50, after: $after) {
      nodes {
        id body createdAt url
        user { id name displayName guest active app isMe }
        botActor { name type }
        externalUser { name }
      }
      pageInfo { hasNextPage endCursor }
    }
  }
}";

/// Every document, for the schema test.
pub const ALL: [(&str, &str); 12] = [
    ("VIEWER", VIEWER),
    ("TEAMS", TEAMS),
    ("LABELS", LABELS),
    ("ISSUES", ISSUES),
    ("STATES", STATES),
    ("FIND_COMMENT", FIND_COMMENT),
    ("POST_COMMENT", POST_COMMENT),
    ("MOVE_ISSUE", MOVE_ISSUE),
    ("LINK_URL", LINK_URL),
    ("ISSUE_TEAM", ISSUE_TEAM),
    ("ISSUE_HISTORY", ISSUE_HISTORY),
    ("ISSUE_COMMENTS", ISSUE_COMMENTS),
];

#[cfg(test)]
mod tests {
    //! Every document in [`ALL`](super::ALL) against Linear's published schema: a field,
    //! argument or variable type Linear does not have fails here, not against the live API.

    use apollo_compiler::validation::Valid;
    use apollo_compiler::{ExecutableDocument, Schema};

    /// Linear's schema as published (`contracts/linear/PROVENANCE.md`).
    const SCHEMA: &str = include_str!("../../../../../contracts/linear/schema.graphql");

    /// The schema, parsed and validated; its own diagnostics on failure.
    fn schema() -> Valid<Schema> {
        match Schema::parse_and_validate(SCHEMA, "contracts/linear/schema.graphql") {
            Ok(schema) => schema,
            Err(invalid) => panic!("Linear's schema does not validate:\n{}", invalid.errors),
        }
    }

    /// The diagnostics for one document, or `None` when it parses and validates.
    fn diagnostics(schema: &Valid<Schema>, name: &str, document: &str) -> Option<String> {
        ExecutableDocument::parse_and_validate(schema, document, format!("{name}.graphql"))
            .err()
            .map(|invalid| invalid.errors.to_string())
    }

    /// Each document DevPilot sends parses and validates against the schema, with no errors.
    #[test]
    fn every_document_validates_against_linears_schema() {
        let schema = schema();
        let failures: Vec<String> = super::ALL
            .iter()
            .filter_map(|(name, document)| {
                diagnostics(&schema, name, document).map(|errors| format!("{name}:\n{errors}"))
            })
            .collect();
        assert!(failures.is_empty(), "documents Linear's schema refuses:\n{}", failures.join("\n"));
    }

    /// The check can fail: a field Linear's schema does not have is refused.
    #[test]
    fn a_field_linear_lacks_is_refused() {
        let errors = diagnostics(&schema(), "BAD", "query { viewer { nosuchfield } }")
            .expect("the schema has no User.nosuchfield");
        assert!(errors.contains("nosuchfield"), "{errors}");
    }
}
