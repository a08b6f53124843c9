#!/usr/bin/env python3
"""Extract the GitHub REST operations DevPilot uses from GitHub's OpenAPI description.

The full description is 13 MB; the tests need nineteen operations. This writes
contracts/github/api.github.com.2022-11-28.subset.json: for each operation its
method, path, operationId, parameters (name, in, required, schema), request
body (required, schema) and responses (status -> a reduced schema: type,
required and property names with their types). Every `$ref` is inlined so the
subset stands alone; descriptions, examples and the `x-octokit`/`x-github`
extensions are dropped.

Two constraints GitHub states only in prose are added, each marked with an
`x-devpilot-derived` key naming the sentence it comes from (see
contracts/github/PROVENANCE.md):
  * `per_page`: "The number of results per page (max 100)" -> maximum 100;
  * pulls/create: `title` is "Required unless `issue` is specified" ->
    anyOf [required title, required issue].

Usage: scripts/vendor_github_openapi.py [INPUT_JSON] [OUTPUT_JSON]
  INPUT_JSON  default /tmp/ghapi/package/generated/api.github.com.json (the
              @octokit/openapi npm package, unpacked)
  OUTPUT_JSON default contracts/github/api.github.com.2022-11-28.subset.json
Standard library only.
"""
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_INPUT = "/tmp/ghapi/package/generated/api.github.com.json"
DEFAULT_OUTPUT = os.path.join(ROOT, "contracts", "github", "api.github.com.2022-11-28.subset.json")

# (method, path, operationId): what the engine's GitHub source may call.
OPERATIONS = [
    ("get", "/repos/{owner}/{repo}/issues", "issues/list-for-repo"),
    ("get", "/repos/{owner}/{repo}", "repos/get"),
    ("get", "/user", "users/get-authenticated"),
    ("get", "/repos/{owner}/{repo}/issues/{issue_number}/comments", "issues/list-comments"),
    ("post", "/repos/{owner}/{repo}/issues/{issue_number}/comments", "issues/create-comment"),
    ("post", "/repos/{owner}/{repo}/issues/{issue_number}/labels", "issues/add-labels"),
    ("delete", "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}", "issues/remove-label"),
    ("get", "/repos/{owner}/{repo}/pulls", "pulls/list"),
    ("post", "/repos/{owner}/{repo}/pulls", "pulls/create"),
    ("get", "/repos/{owner}/{repo}/labels/{name}", "issues/get-label"),
    # Who applied the source's label, and when (the `labeled` events), and whether they may
    # write to the repository: what pins a job's text to the label's approval.
    ("get", "/repos/{owner}/{repo}/issues/{issue_number}/events", "issues/list-events"),
    ("get", "/repos/{owner}/{repo}/collaborators/{username}/permission", "repos/get-collaborator-permission-level"),
    # The issue read again after its events: whether it changed since its text was read.
    ("get", "/repos/{owner}/{repo}/issues/{issue_number}", "issues/get"),
    # The review loop: a pull request's state and head, the reviews and inline comments on it
    # (and a reply in an inline comment's thread), and the checks and statuses on its head.
    ("get", "/repos/{owner}/{repo}/pulls/{pull_number}", "pulls/get"),
    ("get", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews", "pulls/list-reviews"),
    ("get", "/repos/{owner}/{repo}/pulls/{pull_number}/comments", "pulls/list-review-comments"),
    ("post", "/repos/{owner}/{repo}/pulls/{pull_number}/comments/{comment_id}/replies",
     "pulls/create-reply-for-review-comment"),
    ("get", "/repos/{owner}/{repo}/commits/{ref}/check-runs", "checks/list-for-ref"),
    ("get", "/repos/{owner}/{repo}/commits/{ref}/status", "repos/get-combined-status-for-ref"),
]

# Schema keywords kept in parameter and request-body schemas; everything else
# (description, example(s), title, x-*) is dropped.
KEPT = {
    "type", "enum", "format", "default", "minimum", "maximum", "minLength", "maxLength", "minItems",
    "maxItems", "nullable", "required", "properties", "items", "oneOf", "anyOf", "allOf",
    "additionalProperties", "x-devpilot-derived",
}


def resolve(doc, node, seen=()):
    """`node` with every `$ref` inlined (a cycle is cut to an empty schema)."""
    if isinstance(node, list):
        return [resolve(doc, item, seen) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        if ref in seen:
            return {}
        if not ref.startswith("#/"):
            sys.exit(f"external $ref not supported: {ref}")
        target = doc
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        return resolve(doc, target, seen + (ref,))
    return {key: resolve(doc, value, seen) for key, value in node.items()}


def strip(schema):
    """A resolved schema with only the validating keywords."""
    if isinstance(schema, list):
        return [strip(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key not in KEPT:
            continue
        if key == "properties":
            out[key] = {name: strip(sub) for name, sub in value.items()}
        elif key in ("items", "oneOf", "anyOf", "allOf") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = strip(value)
        else:
            out[key] = value
    return out


def reduce_response(schema, depth=0):
    """What tests read of a response schema: type, required, property names and their types."""
    if not isinstance(schema, dict):
        return {}
    out = {}
    for key in ("type", "nullable"):
        if key in schema:
            out[key] = schema[key]
    if "required" in schema:
        out["required"] = sorted(schema["required"])
    if "properties" in schema:
        if depth == 0:
            out["properties"] = {name: reduce_response(sub, 1) for name, sub in schema["properties"].items()}
        else:
            out["properties"] = sorted(schema["properties"])
    if "items" in schema and depth == 0:
        out["items"] = reduce_response(schema["items"], 0)
    for key in ("oneOf", "anyOf", "allOf"):
        if key in schema:
            out[key] = [reduce_response(sub, depth) for sub in schema[key]]
    return out


def parameter(doc, raw):
    """One parameter: name, in, required, schema."""
    param = resolve(doc, raw)
    schema = strip(param.get("schema", {}))
    if param["name"] == "per_page" and "(max 100)" in param.get("description", "") and "maximum" not in schema:
        schema["maximum"] = 100
        schema["x-devpilot-derived"] = "maximum: the parameter's description says \"(max 100)\""
    return {"name": param["name"], "in": param["in"], "required": bool(param.get("required", False)),
            "schema": schema}


def request_body(doc, operation_id, raw):
    """The JSON request body: required and schema (None when the operation takes none)."""
    if raw is None:
        return None
    body = resolve(doc, raw)
    schema = strip(body["content"]["application/json"]["schema"])
    if operation_id == "pulls/create":
        described = body["content"]["application/json"]["schema"]["properties"]["title"].get("description", "")
        if "Required unless `issue` is specified" in described:
            schema["anyOf"] = [{"required": ["title"]}, {"required": ["issue"]}]
            schema["x-devpilot-derived"] = "anyOf: `title` is \"Required unless `issue` is specified\""
    return {"required": bool(body.get("required", False)), "schema": schema}


def responses(doc, raw):
    """Status -> reduced schema of the JSON answer ({} when there is no JSON body)."""
    out = {}
    for status, answer in raw.items():
        answer = resolve(doc, answer)
        content = answer.get("content", {})
        json_content = content.get("application/json") or content.get("application/scim+json") or {}
        out[status] = reduce_response(json_content.get("schema", {}))
    return out


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_INPUT
    target = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_OUTPUT
    with open(source, "rb") as f:
        raw = f.read()
    doc = json.loads(raw)
    operations = []
    for method, path, operation_id in OPERATIONS:
        op = doc["paths"][path][method]
        if op["operationId"] != operation_id:
            sys.exit(f"{method.upper()} {path} is {op['operationId']}, expected {operation_id}")
        params = doc["paths"][path].get("parameters", []) + op.get("parameters", [])
        operations.append({
            "method": method.upper(),
            "path": path,
            "operationId": operation_id,
            "parameters": [parameter(doc, p) for p in params],
            "requestBody": request_body(doc, operation_id, op.get("requestBody")),
            "responses": responses(doc, op["responses"]),
        })
    subset = {
        "source": {
            "file": "generated/api.github.com.json of the npm package @octokit/openapi",
            "info.version": doc["info"]["version"],
            "openapi": doc["openapi"],
            "sha256": hashlib.sha256(raw).hexdigest(),
        },
        "operations": operations,
    }
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        json.dump(subset, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(operations)} operations to {target} ({os.path.getsize(target)} bytes)")


if __name__ == "__main__":
    main()
