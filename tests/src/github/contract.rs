//! GitHub's published contract, enforced on every request the stand-in receives, so the engine's
//! GitHub source is tested against what GitHub documents rather than against whatever the
//! stand-in happens to accept.
//!
//! The contract is the vendored subset of GitHub's OpenAPI description
//! (`contracts/github/api.github.com.2022-11-28.subset.json`, see its PROVENANCE.md). [`check`]
//! finds the operation whose method and path template match (path segments percent-decoded; a
//! `{name}` matches one non-empty segment), then checks the query parameters (each declared
//! `in: query`, its value fitting the schema), the required parameters and the JSON body
//! against a small JSON-schema subset: `type` (and type arrays), `nullable`, `enum`,
//! `required`, `properties` (an undeclared property is refused), `items`, `oneOf`/`anyOf`/
//! `allOf`, `minimum`/`maximum`, `minItems`/`maxItems`, `minLength`/`maxLength` and
//! `format: date-time`.

use std::sync::OnceLock;

use serde_json::Value;

use crate::http_server::decode_bytes;

/// The vendored subset, parsed once.
fn contract() -> &'static Value {
    static CONTRACT: OnceLock<Value> = OnceLock::new();
    CONTRACT.get_or_init(|| {
        let text = include_str!("../../../contracts/github/api.github.com.2022-11-28.subset.json");
        // The file is part of the build; a broken one is the harness's own bug.
        serde_json::from_str(text).unwrap_or_else(|e| panic!("contracts/github subset is not JSON: {e}"))
    })
}

/// Every operation in the subset.
fn operations() -> &'static [Value] {
    contract()["operations"].as_array().map_or(&[], Vec::as_slice)
}

/// One request as sent.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// `GET`, `POST`, …
    pub method: &'a str,
    /// The path without the query, percent-encoded as sent.
    pub path: &'a str,
    /// The query parameters, decoded, in the order sent.
    pub query: &'a [(String, String)],
    /// The parsed JSON body, if the request had one.
    pub body: Option<&'a Value>,
}

/// The operationId of the operation `call` is, or why the contract does not allow it (naming the
/// parameter or field at fault).
pub fn check(call: &Call) -> Result<&'static str, String> {
    let segments = call
        .path
        .strip_prefix('/')
        .ok_or_else(|| format!("path {:?} does not start with /", call.path))?
        .split('/')
        .map(|s| String::from_utf8(decode_bytes(s, false)).map_err(|_| format!("path segment {s:?} is not UTF-8")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut path_matched = false;
    for op in operations() {
        let Some(path_params) = match_template(str_of(op, "path"), &segments) else { continue };
        path_matched = true;
        if !str_of(op, "method").eq_ignore_ascii_case(call.method) {
            continue;
        }
        let id = str_of(op, "operationId");
        check_params(op, &path_params, call.query).map_err(|e| format!("{id}: {e}"))?;
        check_body(op, call.body).map_err(|e| format!("{id}: {e}"))?;
        return Ok(id);
    }
    Err(if path_matched {
        format!("{} is not an operation on {} in GitHub's description", call.method, call.path)
    } else {
        format!("no operation in GitHub's description matches {} {}", call.method, call.path)
    })
}

/// Every operationId in the contract.
pub fn operation_ids() -> Vec<&'static str> {
    operations().iter().map(|op| str_of(op, "operationId")).collect()
}

/// A string field of a contract object ("" when absent).
fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The `{name}` → segment bindings if `segments` fit `template`.
fn match_template<'s>(template: &str, segments: &'s [String]) -> Option<Vec<(String, &'s str)>> {
    let parts: Vec<&str> = template.trim_start_matches('/').split('/').collect();
    if parts.len() != segments.len() {
        return None;
    }
    let mut bound = Vec::new();
    for (part, segment) in parts.iter().zip(segments) {
        match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some(name) if !segment.is_empty() => bound.push((name.to_string(), segment.as_str())),
            Some(_) => return None,
            None if part == segment => {}
            None => return None,
        }
    }
    Some(bound)
}

/// Path and query parameters: declared, fitting their schemas, the required ones present.
fn check_params(op: &Value, path: &[(String, &str)], query: &[(String, String)]) -> Result<(), String> {
    let declared = op["parameters"].as_array().map_or(&[][..], Vec::as_slice);
    let find =
        |name: &str, place: &str| declared.iter().find(|p| str_of(p, "name") == name && str_of(p, "in") == place);
    for (name, value) in path {
        let param = find(name, "path").ok_or_else(|| format!("path parameter `{name}` is not declared"))?;
        check_text(&param["schema"], value).map_err(|e| format!("path parameter `{name}`: {e}"))?;
    }
    for (i, (name, value)) in query.iter().enumerate() {
        let param = find(name, "query").ok_or_else(|| format!("query parameter `{name}` is not declared"))?;
        if query[..i].iter().any(|(earlier, _)| earlier == name) {
            return Err(format!("query parameter `{name}` is given more than once"));
        }
        check_text(&param["schema"], value).map_err(|e| format!("query parameter `{name}`={value:?}: {e}"))?;
    }
    for param in declared.iter().filter(|p| p["required"] == Value::Bool(true)) {
        let name = str_of(param, "name");
        let present = match str_of(param, "in") {
            "path" => path.iter().any(|(n, _)| n == name),
            "query" => query.iter().any(|(n, _)| n == name),
            _ => true,
        };
        if !present {
            return Err(format!("required parameter `{name}` is missing"));
        }
    }
    Ok(())
}

/// A parameter's text against its (scalar) schema.
fn check_text(schema: &Value, text: &str) -> Result<(), String> {
    let value = match str_of(schema, "type") {
        "integer" => Value::from(text.parse::<i64>().map_err(|_| "not an integer".to_string())?),
        "number" => {
            let number = text.parse::<f64>().map_err(|_| "not a number".to_string())?;
            serde_json::Number::from_f64(number).map(Value::Number).ok_or("not a finite number")?
        }
        "boolean" => Value::Bool(text.parse::<bool>().map_err(|_| "not true or false".to_string())?),
        _ => Value::String(text.to_string()),
    };
    validate(schema, &value, "value")
}

/// The body is present when required, absent when the operation takes none, and fits.
fn check_body(op: &Value, body: Option<&Value>) -> Result<(), String> {
    let declared = op.get("requestBody").filter(|b| !b.is_null());
    match (declared, body) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err("this operation takes no request body".into()),
        (Some(declared), None) if declared["required"] == Value::Bool(true) => {
            Err("the request body is required".into())
        }
        (Some(_), None) => Ok(()),
        (Some(declared), Some(body)) => validate(&declared["schema"], body, "body"),
    }
}

/// `value` (at `at`, e.g. `body.labels[0]`) against `schema`.
pub(crate) fn validate(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if value.is_null() && schema["nullable"] == Value::Bool(true) {
        return Ok(());
    }
    check_type(schema, value, at)?;
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            return Err(format!("{at}: {value} is not one of {}", Value::Array(allowed.clone())));
        }
    }
    check_bounds(schema, value, at)?;
    match value {
        Value::Object(_) => check_object(schema, value, at)?,
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(item_schema, item, &format!("{at}[{i}]"))?;
                }
            }
        }
        _ => {}
    }
    check_combinators(schema, value, at)
}

/// `type`: one name or a list of names.
fn check_type(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let types: Vec<&str> = match schema.get("type") {
        None => return Ok(()),
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        Some(other) => return Err(format!("{at}: the contract's type {other} is not understood")),
    };
    let fits = |t: &str| match t {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "null" => value.is_null(),
        _ => false,
    };
    if types.iter().any(|t| fits(t)) {
        Ok(())
    } else {
        Err(format!("{at}: {value} is not of type {}", types.join(" or ")))
    }
}

/// `minimum`/`maximum`, `minLength`/`maxLength`, `minItems`/`maxItems`, `format: date-time`.
fn check_bounds(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    if let Some(n) = value.as_f64() {
        if bound("minimum").is_some_and(|min| n < min) || bound("maximum").is_some_and(|max| n > max) {
            return Err(format!("{at}: {value} is outside [{:?}, {:?}]", bound("minimum"), bound("maximum")));
        }
    }
    let length = match value {
        Value::String(s) => Some((s.chars().count() as f64, "Length")),
        Value::Array(a) => Some((a.len() as f64, "Items")),
        _ => None,
    };
    if let Some((len, kind)) = length {
        let (min, max) = (bound(&format!("min{kind}")), bound(&format!("max{kind}")));
        if min.is_some_and(|m| len < m) || max.is_some_and(|m| len > m) {
            return Err(format!("{at}: {len} {} is outside [{min:?}, {max:?}]", kind.to_lowercase()));
        }
    }
    if let (Some(text), Some("date-time")) = (value.as_str(), schema.get("format").and_then(Value::as_str)) {
        humantime::parse_rfc3339(text)
            .map_err(|e| format!("{at}: {text:?} is not an ISO 8601 UTC date-time (YYYY-MM-DDTHH:MM:SSZ): {e}"))?;
    }
    Ok(())
}

/// `required`, and `properties` (strict: a property the schema does not name is refused,
/// unless `additionalProperties` explicitly allows it).
fn check_object(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let Some(object) = value.as_object() else { return Ok(()) };
    for name in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        if !object.contains_key(name) {
            return Err(format!("{at}: required field `{name}` is missing"));
        }
    }
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(()) };
    let extra = schema.get("additionalProperties");
    for (name, field) in object {
        match (properties.get(name), extra) {
            (Some(declared), _) => validate(declared, field, &format!("{at}.{name}"))?,
            (None, Some(Value::Bool(true))) => {}
            (None, Some(extra @ Value::Object(_))) => validate(extra, field, &format!("{at}.{name}"))?,
            (None, _) => return Err(format!("{at}: field `{name}` is not in GitHub's description")),
        }
    }
    Ok(())
}

/// `oneOf`/`anyOf` (at least one branch fits; a lenient `oneOf`) and `allOf` (every branch).
fn check_combinators(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    for branch in schema.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        validate(branch, value, at)?;
    }
    for key in ["oneOf", "anyOf"] {
        let Some(branches) = schema.get(key).and_then(Value::as_array) else { continue };
        let mut why = Vec::new();
        for branch in branches {
            match validate(branch, value, at) {
                Ok(()) => {
                    why.clear();
                    break;
                }
                Err(e) => why.push(e),
            }
        }
        if !why.is_empty() {
            return Err(format!("{at}: fits no branch of {key}: {}", why.join("; ")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{check, Call};

    /// `(name, value)` pairs.
    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
    }

    /// Checks one call.
    fn call(
        method: &str,
        path: &str,
        pairs: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> Result<&'static str, String> {
        check(&Call { method, path, query: &query(pairs), body })
    }

    /// The engine's issue poll is an `issues/list-for-repo` the description allows.
    #[test]
    fn a_good_list_call_passes() {
        let pairs = [("state", "open"), ("labels", "agent"), ("per_page", "100"), ("since", "2026-12-02T10:00:00Z")];
        assert_eq!(call("GET", "/repos/acme/webapp/issues", &pairs, None), Ok("issues/list-for-repo"));
    }

    /// `per_page` above 100 is refused (the description's "(max 100)").
    #[test]
    fn per_page_over_100_fails() {
        let err = call("GET", "/repos/acme/webapp/issues", &[("per_page", "101")], None).unwrap_err();
        assert!(err.contains("per_page"), "{err}");
    }

    /// A query parameter the operation does not declare is refused, by name.
    #[test]
    fn an_unknown_query_parameter_fails() {
        let err = call("GET", "/repos/acme/webapp/issues", &[("label", "agent")], None).unwrap_err();
        assert!(err.contains("`label`"), "{err}");
    }

    /// A value outside an `enum` or not an integer is refused.
    #[test]
    fn enum_and_integer_values_are_checked() {
        assert!(call("GET", "/repos/acme/webapp/issues", &[("state", "opened")], None).is_err());
        assert!(call("GET", "/repos/acme/webapp/issues", &[("page", "two")], None).is_err());
        assert!(call("GET", "/repos/acme/webapp/issues/x/comments", &[], None).is_err());
    }

    /// pulls/create without `title` (and without `issue`) is refused.
    #[test]
    fn a_pull_without_title_fails() {
        let body = json!({ "head": "agent/eng-1", "base": "main" });
        let err = call("POST", "/repos/acme/webapp/pulls", &[], Some(&body)).unwrap_err();
        assert!(err.contains("title"), "{err}");
        let good = json!({ "title": "Fix", "head": "agent/eng-1", "base": "main", "body": "b", "draft": true });
        assert_eq!(call("POST", "/repos/acme/webapp/pulls", &[], Some(&good)), Ok("pulls/create"));
    }

    /// A body field the description does not name is refused, by name.
    #[test]
    fn an_undeclared_body_field_fails() {
        let body = json!({ "title": "Fix", "head": "h", "base": "main", "reviewers": ["bob"] });
        let err = call("POST", "/repos/acme/webapp/pulls", &[], Some(&body)).unwrap_err();
        assert!(err.contains("reviewers"), "{err}");
        let labels = json!({ "labels": ["agent"], "replace": true });
        assert!(call("POST", "/repos/acme/webapp/issues/1/labels", &[], Some(&labels)).is_err());
    }

    /// A required body is required; an operation without one takes none.
    #[test]
    fn body_presence_follows_the_description() {
        assert!(call("POST", "/repos/acme/webapp/issues/1/comments", &[], None).is_err());
        assert!(call("GET", "/user", &[], Some(&json!({}))).is_err());
        let labels = json!({ "labels": ["agent", { "name": "needs review" }] });
        assert_eq!(call("POST", "/repos/acme/webapp/issues/1/labels", &[], Some(&labels)), Ok("issues/add-labels"));
    }

    /// A percent-encoded label name with a space and an emoji is one `{name}` segment.
    #[test]
    fn a_delete_label_with_an_encoded_name_passes() {
        let path = "/repos/acme/webapp/issues/7/labels/agent%20%F0%9F%A4%96";
        assert_eq!(call("DELETE", path, &[], None), Ok("issues/remove-label"));
    }

    /// A path or method the subset does not have is refused.
    #[test]
    fn unknown_paths_and_methods_fail() {
        assert!(call("GET", "/repos/acme/webapp/branches", &[], None).is_err());
        assert!(call("PATCH", "/repos/acme/webapp", &[], None).is_err());
        assert!(call("GET", "/repos/acme//issues", &[], None).is_err());
    }
}
