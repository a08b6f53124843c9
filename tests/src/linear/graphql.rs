//! Linear's published schema (`contracts/linear/schema.graphql`), parsed and validated once
//! per process, and each request checked against it before anything runs: the document must
//! parse and validate, the operation must exist, and the variables must coerce to their
//! declared types (an input object with a key its type lacks is refused here). Then the
//! operation runs with resolvers over the state (`Root`), and each field error gets Linear's
//! `extensions.code`.

use std::sync::OnceLock;

use apollo_compiler::executable::{Operation, OperationType, Selection, SelectionSet};
use apollo_compiler::request::coerce_variable_values;
use apollo_compiler::resolvers::{Execution, FieldError, ObjectValue, ResolveInfo, ResolvedValue};
use apollo_compiler::response::{GraphQLError, JsonMap, JsonValue};
use apollo_compiler::validation::Valid;
use apollo_compiler::{ast, ExecutableDocument, Node as AstNode, Schema};

use super::objects::Ctx;
use super::state::State;
use super::{mutation, query};

/// The schema's text, as copied from Linear (see `contracts/linear/PROVENANCE.md`).
const SCHEMA_SDL: &str = include_str!("../../../contracts/linear/schema.graphql");

/// Linear's largest complexity for one query.
const MAX_COMPLEXITY: u64 = 10_000;

/// The schema, validated on first use (half a second in a debug build).
pub(crate) fn schema() -> &'static Valid<Schema> {
    static SCHEMA: OnceLock<Valid<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| match Schema::parse_and_validate(SCHEMA_SDL, "contracts/linear/schema.graphql") {
        Ok(schema) => schema,
        Err(invalid) => panic!("Linear's schema does not validate:\n{}", invalid.errors),
    })
}

/// A request the schema allows: the document, the operation's name and the coerced variables.
pub(crate) struct Checked {
    document: Valid<ExecutableDocument>,
    operation: Option<String>,
    variables: Valid<JsonMap>,
    /// The estimated complexity, in Linear's points.
    pub complexity: u64,
}

/// The name of the operation a request runs: `operationName`, else the document's only
/// operation's name (read without validating, so a refused document is still named).
pub(crate) fn operation_name(query: &str, operation_name: Option<&str>) -> Option<String> {
    if let Some(name) = operation_name {
        return Some(name.to_string());
    }
    let document = ast::Document::parse(query, "request.graphql").unwrap_or_else(|invalid| invalid.partial);
    let mut names = document.definitions.iter().filter_map(|d| match d {
        ast::Definition::OperationDefinition(op) => Some(op.name.as_ref().map(|n| n.to_string())),
        _ => None,
    });
    names.next().flatten()
}

/// Validates a request against the schema; on refusal, apollo-compiler's diagnostics.
pub(crate) fn check(query: &str, operation: Option<&str>, variables: &JsonMap) -> Result<Checked, Vec<GraphQLError>> {
    let schema = schema();
    let document = ExecutableDocument::parse_and_validate(schema, query, "request.graphql")
        .map_err(|invalid| invalid.errors.iter().map(|d| d.to_json()).collect::<Vec<_>>())?;
    let op = document.operations.get(operation).map_err(|e| vec![e.to_graphql_error(&document.sources)])?;
    let coerced =
        coerce_variable_values(schema, op, variables).map_err(|e| vec![e.to_graphql_error(&document.sources)])?;
    let complexity = complexity(&document, op, &coerced);
    let operation = operation.map(str::to_string);
    Ok(Checked { document, operation, variables: coerced, complexity })
}

/// Linear's cost model, roughly: a tenth of a point per scalar, a point per object, and a
/// connection's selection multiplied by its `first` (50 when absent); at most 10,000.
fn complexity(document: &ExecutableDocument, op: &Operation, variables: &JsonMap) -> u64 {
    let tenths = cost(document, &op.selection_set, variables, 0);
    tenths.div_ceil(10).clamp(1, MAX_COMPLEXITY)
}

/// The cost of a selection set in tenths of a point.
fn cost(document: &ExecutableDocument, set: &SelectionSet, variables: &JsonMap, depth: usize) -> u64 {
    if depth > 32 {
        return 0;
    }
    let items = set.selections.iter().map(|selection| match selection {
        Selection::Field(field) if field.selection_set.selections.is_empty() => 1,
        Selection::Field(field) => {
            let inner = cost(document, &field.selection_set, variables, depth + 1);
            let pages = field.definition.arguments.iter().any(|a| a.name == "first");
            let first = if pages { page_size(&field.arguments, variables) } else { 1 };
            10u64.saturating_add(inner.saturating_mul(first))
        }
        Selection::FragmentSpread(spread) => document
            .fragments
            .get(&spread.fragment_name)
            .map_or(0, |f| cost(document, &f.selection_set, variables, depth + 1)),
        Selection::InlineFragment(inline) => cost(document, &inline.selection_set, variables, depth + 1),
    });
    items.fold(0, u64::saturating_add)
}

/// A connection field's `first`, literal or variable; 50 when absent.
fn page_size(arguments: &[AstNode<ast::Argument>], variables: &JsonMap) -> u64 {
    let first = arguments.iter().find(|a| a.name == "first").map(|a| match a.value.as_ref() {
        ast::Value::Int(n) => n.try_to_i32().ok().map(i64::from),
        ast::Value::Variable(name) => variables.get(name.as_str()).and_then(JsonValue::as_i64),
        _ => None,
    });
    u64::try_from(first.flatten().unwrap_or(50)).unwrap_or(0)
}

/// What running a request produced: the JSON body and its errors' messages.
pub(crate) struct Executed {
    pub body: String,
    pub errors: Vec<String>,
}

/// Runs a checked request over the state: the response (`data`, then `errors` with Linear's
/// codes), fields in the order selected.
pub(crate) fn execute(checked: &Checked, state: &mut State) -> Executed {
    let schema = schema();
    let ctx = Ctx::new(state);
    let run = || -> Result<_, apollo_compiler::request::RequestError> {
        let op = checked.document.operations.get(checked.operation.as_deref())?;
        let root = Root { ctx: &ctx, mutation: op.operation_type == OperationType::Mutation };
        if op.operation_type == OperationType::Subscription {
            return Ok(None);
        }
        let execution =
            Execution::new(schema, &checked.document).operation(op).coerced_variable_values(&checked.variables);
        execution.execute_sync(&root).map(Some)
    };
    let mut response = match run() {
        Ok(Some(response)) => response,
        Ok(None) => return Executed::error("The Linear stand-in does not implement subscriptions", "INVALID_INPUT"),
        Err(e) => return Executed::error(&e.message().to_string(), "INTERNAL_SERVER_ERROR"),
    };
    for error in &mut response.errors {
        // apollo-compiler prefixes a resolver's message; Linear's messages have no prefix.
        let ours = error.message.strip_prefix("resolver error: ").and_then(|m| Some((m.to_string(), ctx.code_of(m)?)));
        let (message, code) = ours.unwrap_or_else(|| (error.message.clone(), "INTERNAL_SERVER_ERROR"));
        error.extensions = extensions_map(code, &message);
        error.message = message;
    }
    if let Some(data) = &mut response.data {
        data.values_mut().for_each(whole_floats_as_integers);
    }
    let errors = response.errors.iter().map(|e| e.message.clone()).collect();
    Executed { body: serde_json::to_string(&response).unwrap_or_default(), errors }
}

impl Executed {
    /// A response with one error and no data.
    fn error(message: &str, code: &str) -> Self {
        Self { body: error_body(message, code).to_string(), errors: vec![message.to_string()] }
    }
}

/// Linear's server is JavaScript: a `Float` that is a whole number goes out as `2`, not `2.0`.
fn whole_floats_as_integers(value: &mut JsonValue) {
    match value {
        JsonValue::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
                // Exact: a whole number below 2^53.
                #[allow(clippy::cast_possible_truncation)]
                let whole = f as i64;
                *value = JsonValue::from(whole);
            }
        }
        JsonValue::Array(items) => items.iter_mut().for_each(whole_floats_as_integers),
        JsonValue::Object(map) => map.values_mut().for_each(whole_floats_as_integers),
        _ => {}
    }
}

/// [`extensions`] as apollo-compiler's map.
fn extensions_map(code: &str, message: &str) -> JsonMap {
    let mut map = JsonMap::new();
    map.insert("code", code.into());
    map.insert("type", code.to_lowercase().replace('_', " ").into());
    map.insert("userPresentableMessage", message.into());
    map
}

/// Linear's `extensions` for an error: its code, type and a message to show a person.
pub(crate) fn extensions(code: &str, message: &str) -> serde_json::Value {
    let kind = code.to_lowercase().replace('_', " ");
    serde_json::json!({ "code": code, "type": kind, "userPresentableMessage": message })
}

/// A response with one error and no data.
pub(crate) fn error_body(message: &str, code: &str) -> serde_json::Value {
    serde_json::json!({ "errors": [{ "message": message, "extensions": extensions(code, message) }] })
}

/// The root object of a query or a mutation.
struct Root<'c, 's> {
    ctx: &'c Ctx<'s>,
    mutation: bool,
}

impl ObjectValue for Root<'_, '_> {
    fn type_name(&self) -> &str {
        if self.mutation {
            "Mutation"
        } else {
            "Query"
        }
    }

    fn resolve_field<'a>(&'a self, info: &'a ResolveInfo<'a>) -> Result<ResolvedValue<'a>, FieldError> {
        if self.mutation {
            mutation::field(self.ctx, info)
        } else {
            query::field(self.ctx, info)
        }
    }
}
