//! How a preset's run ended, read from what its CLI printed: its structured output where it
//! has one (claude's result object, codex's and gemini's JSON events), else its exit code
//! and its known error lines (aider). A failed model call is a failed attempt with the CLI's
//! own words, never a completion; a usage or rate limit parks the job, until the reset time
//! when the CLI says one. The result's text becomes the summary; the session id, cost and
//! tokens are kept on the job.

use std::time::Duration;

use serde_json::Value;

use super::Preset;
use crate::agent::AgentExit;
use devpilot_store::queue::{RetryAfter, Usage};

/// What a preset's run said about itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
    /// How the attempt ends (`None`: as its exit status says).
    pub exit: Option<AgentExit>,
    pub summary: Option<String>,
    pub usage: Usage,
    /// When a usage limit resets, if the CLI said.
    pub retry_after: Option<RetryAfter>,
}

/// What the CLI printed: the start of its output (where codex names its session) and the end
/// (where every CLI says how it ended).
pub struct Printed<'a> {
    pub head: &'a str,
    pub tail: &'a str,
}

impl Preset {
    /// Reads how this preset's run ended from what it printed and how it exited.
    pub fn report(self, printed: &Printed<'_>, exit: &AgentExit) -> RunReport {
        match self {
            Preset::Claude => claude(printed.tail),
            Preset::Codex => codex(printed),
            Preset::Gemini => gemini(printed.tail, exit),
            Preset::Aider => aider(printed.tail, exit),
        }
    }

    /// Whether a line the CLI printed says it is only retrying a model call it cannot make:
    /// the API watchdog ends an attempt that has printed nothing else for the preset's
    /// `api_timeout`. For codex only its endless "waiting for network" loop: its counted
    /// retries ("Reconnecting... 2/5") end on their own, in `turn.failed`.
    pub fn is_retry_line(self, line: &str) -> bool {
        let l = line.to_ascii_lowercase();
        match self {
            Preset::Codex => l.contains("waiting for network"),
            Preset::Aider => l.contains("retrying in") || l.contains("apiconnectionerror"),
            Preset::Gemini => l.contains("retrying") || l.contains("attempt") && l.contains("failed"),
            Preset::Claude => l.contains("retrying in") || l.contains("api_retry"),
        }
    }
}

/// claude's `--output-format stream-json` (or `json`): the last line that is its result
/// object.
fn claude(tail: &str) -> RunReport {
    let Some(r) = last_object(tail, |v| v.get("type").and_then(Value::as_str) == Some("result")) else {
        return RunReport::default();
    };
    let text = str_of(&r, "result");
    let u = &r["usage"];
    let tokens_in = ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .filter_map(|k| u.get(*k).and_then(Value::as_i64))
        .reduce(|a, b| a + b);
    let usage = Usage {
        session: str_of(&r, "session_id"),
        cost_usd: r.get("total_cost_usd").and_then(Value::as_f64),
        tokens_in,
        tokens_out: u.get("output_tokens").and_then(Value::as_i64),
    };
    let failed = r.get("is_error").and_then(Value::as_bool).unwrap_or(false)
        || str_of(&r, "subtype").is_some_and(|s| s.starts_with("error"));
    if !failed {
        return RunReport { exit: None, summary: text, usage, retry_after: None };
    }
    let msg = text.unwrap_or_else(|| format!("claude ended with {}", str_of(&r, "subtype").unwrap_or_default()));
    // Its `subtype` stays "success" on an API error: `is_error` and `api_error_status` say it.
    let msg = match r.get("api_error_status").and_then(Value::as_i64) {
        Some(429) if !msg.contains("429") => format!("{msg} (429)"),
        _ => msg,
    };
    ended_badly("claude", msg, usage)
}

/// codex's `--json` events: the session from `thread.started`, the last agent message, the
/// usage of every `turn.completed`, and a `turn.failed` or `error` that ended it.
fn codex(printed: &Printed<'_>) -> RunReport {
    let mut r = RunReport::default();
    let mut failure: Option<String> = None;
    let head = printed.head.lines();
    // The tail may repeat the head's last lines (a short log): events are counted once, by
    // reading the head only for its session.
    for v in head.filter_map(object_line) {
        if v["type"] == "thread.started" {
            r.usage.session = r.usage.session.or_else(|| str_of(&v, "thread_id"));
        }
    }
    for v in printed.tail.lines().filter_map(object_line) {
        match v["type"].as_str().unwrap_or_default() {
            "thread.started" => r.usage.session = r.usage.session.or_else(|| str_of(&v, "thread_id")),
            "item.completed" if v["item"]["type"] == "agent_message" => r.summary = str_of(&v["item"], "text"),
            "turn.completed" => {
                let u = &v["usage"];
                add(&mut r.usage.tokens_in, u.get("input_tokens").and_then(Value::as_i64));
                add(&mut r.usage.tokens_out, u.get("output_tokens").and_then(Value::as_i64));
                failure = None;
            }
            "turn.failed" => failure = str_of(&v["error"], "message").or(Some("the turn failed".into())),
            // "Reconnecting…" is a retry, not the end: the API watchdog judges those.
            "error" if !Preset::Codex.is_retry_line(&v.to_string()) => failure = str_of(&v, "message").or(failure),
            _ => {}
        }
    }
    match failure {
        Some(msg) => {
            let mut bad = ended_badly("codex", msg, r.usage);
            bad.summary = bad.summary.or(r.summary);
            bad
        }
        None => r,
    }
}

/// gemini's `-o stream-json` events: the session from `init`, the assistant's last words
/// (its `message` deltas since the last tool call), the tokens of the `result`, and an
/// error that ended it (the `result`'s, else an `error` event's). A log with no events is
/// read as `-o json`'s one object.
fn gemini(tail: &str, exit: &AgentExit) -> RunReport {
    let events: Vec<Value> = tail.lines().filter_map(object_line).filter(|v| v["type"].is_string()).collect();
    if events.is_empty() {
        return gemini_document(tail, exit);
    }
    let mut usage = Usage::default();
    let (mut words, mut failure) = (String::new(), None::<String>);
    for v in &events {
        match v["type"].as_str().unwrap_or_default() {
            "init" => usage.session = str_of(v, "session_id"),
            "message" if v["role"] == "assistant" => {
                if v["delta"] != true {
                    words.clear();
                }
                words.push_str(v["content"].as_str().unwrap_or_default());
            }
            "tool_use" => words.clear(),
            "error" if v["severity"] != "warning" => failure = str_of(v, "message").or(failure),
            "result" => {
                let st = &v["stats"];
                usage.tokens_in = st.get("input_tokens").and_then(Value::as_i64);
                usage.tokens_out = st.get("output_tokens").and_then(Value::as_i64);
                if v["status"] == "error" {
                    failure = str_of(&v["error"], "message").or(failure).or(Some("the run failed".into()));
                }
            }
            _ => {}
        }
    }
    let summary = Some(words.trim().to_string()).filter(|w| !w.is_empty());
    match failure {
        Some(msg) => ended_badly("gemini", msg, usage),
        // With no result (it was cut short), its exit status says how it ended.
        None => RunReport { exit: gemini_status(exit), summary, usage, retry_after: None },
    }
}

/// gemini's `-o json`: one (pretty-printed) object with `response`, `stats` and `error`.
fn gemini_document(tail: &str, exit: &AgentExit) -> RunReport {
    let Some(v) = last_document(tail) else {
        return match exit {
            AgentExit::Failed(_) => RunReport { exit: gemini_status(exit), ..Default::default() },
            _ => RunReport::default(),
        };
    };
    let mut usage =
        Usage { session: str_of(&v, "session_id").or_else(|| str_of(&v, "sessionId")), ..Default::default() };
    if let Some(models) = v["stats"]["models"].as_object() {
        for m in models.values() {
            let t = &m["tokens"];
            add(&mut usage.tokens_in, t.get("prompt").and_then(Value::as_i64));
            add(&mut usage.tokens_out, t.get("candidates").and_then(Value::as_i64));
        }
    }
    let summary = str_of(&v, "response");
    match v.get("error").filter(|e| !e.is_null()) {
        Some(e) => {
            let msg = str_of(e, "message").unwrap_or_else(|| e.to_string());
            let code = e.get("code").and_then(Value::as_i64);
            let msg = match code {
                Some(c) if !msg.contains(&c.to_string()) => format!("{msg} ({c})"),
                _ => msg,
            };
            ended_badly("gemini", msg, usage)
        }
        None => RunReport { exit: gemini_status(exit), summary, usage, retry_after: None },
    }
}

/// gemini exits with an HTTP status mod 256 (a 401 is 145): say which status it was.
fn gemini_status(exit: &AgentExit) -> Option<AgentExit> {
    let AgentExit::Failed(msg) = exit else { return None };
    let code: i64 = msg.strip_prefix("agent exited with status ")?.parse().ok()?;
    // Only 144..=255 can be a 4xx or 5xx status mod 256; gemini's own codes are lower.
    let http = Some(code + 256).filter(|s| (400..600).contains(s))?;
    let limit = http == 429;
    Some(if limit {
        AgentExit::TryLater
    } else {
        AgentExit::Failed(format!("gemini failed: exit status {code}, which gemini uses for HTTP {http}"))
    })
}

/// aider has no structured output, and exits 0 when its model call fails: its own closing
/// sentences about the API decide, read from its last lines only (the model's reply and the
/// diffs it printed above them may say anything), and only when nothing came after them
/// (an error it retried and got past is followed by more output).
fn aider(tail: &str, exit: &AgentExit) -> RunReport {
    const FAILED: [&str; 3] = [
        "The API provider is not able to authenticate you",
        "The API provider's servers are down or overloaded",
        "The API provider could not find the model",
    ];
    const LIMITED: &str = "The API provider has rate limited you";
    let lines: Vec<&str> = tail.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let last = &lines[lines.len().saturating_sub(4)..];
    let said = |needle: &str| {
        last.iter().rev().find(|l| l.starts_with(needle) || l.starts_with("litellm.") && l.contains(needle))
    };
    if let Some(line) = said(LIMITED) {
        return RunReport {
            exit: Some(AgentExit::TryLater),
            summary: Some(format!("aider: {line}")),
            retry_after: retry_after_in(line),
            ..Default::default()
        };
    }
    match FAILED.iter().find_map(|n| said(n)) {
        Some(line) => RunReport { exit: Some(AgentExit::Failed(format!("aider: {line}"))), ..Default::default() },
        None => RunReport { exit: None, ..Default::default() },
    }
    .with_exit_kept(exit)
}

impl RunReport {
    /// An aider run that failed on its own (a non-zero exit) keeps that failure.
    fn with_exit_kept(mut self, exit: &AgentExit) -> Self {
        if self.exit.is_none() && !matches!(exit, AgentExit::Success) {
            self.exit = Some(exit.clone());
        }
        self
    }
}

/// A run that ended on an error its CLI reported: parked when it names a usage or rate
/// limit (until its reset, when it says one), else failed with its words.
fn ended_badly(cli: &str, msg: String, usage: Usage) -> RunReport {
    let lower = msg.to_ascii_lowercase();
    let limited = ["usage limit", "rate limit", "rate_limit", "429", "quota", "too many requests"]
        .iter()
        .any(|n| lower.contains(n));
    let msg = crate::agent::clean_text(&msg).chars().take(1000).collect::<String>();
    if limited {
        let retry_after = reset_epoch(&msg).or_else(|| retry_after_in(&msg));
        return RunReport {
            exit: Some(AgentExit::TryLater),
            summary: Some(format!("{cli} hit a usage limit: {msg}")),
            usage,
            retry_after,
        };
    }
    RunReport { exit: Some(AgentExit::Failed(format!("{cli}: {msg}"))), summary: None, usage, retry_after: None }
}

/// A reset time given as epoch seconds after a `|` (claude's "usage limit reached|1767225600").
fn reset_epoch(msg: &str) -> Option<RetryAfter> {
    let secs: i64 = msg.rsplit('|').next()?.trim().parse().ok()?;
    (1_600_000_000..4_000_000_000).contains(&secs).then_some(RetryAfter::At(secs * 1000))
}

/// "retry after 30 seconds", "try again in 4 days 23 hours", "retry in 6m0s", "Please retry
/// in 3600s": that long from now, each number read with its unit (a bare number is seconds).
/// No readable duration: `None`, and the job's backoff applies.
fn retry_after_in(msg: &str) -> Option<RetryAfter> {
    let lower = msg.to_ascii_lowercase();
    let at = ["retry after", "try again in", "retry-after:", "retry in", "retrying in"]
        .iter()
        .find_map(|k| lower.find(k).map(|i| i + k.len()))?;
    let secs = duration_at(&lower[at..])?;
    (secs > 0.0).then(|| RetryAfter::In(Duration::from_secs_f64(secs.min(31.0 * 86_400.0))))
}

/// The duration that `text` starts with, in seconds: numbers each followed by a unit
/// (`ms`, `s`, `sec`, `m`, `min`, `h`, `hour`, `d`, `day`, plurals; none: seconds).
fn duration_at(text: &str) -> Option<f64> {
    let mut rest = text.trim_start();
    let mut total: Option<f64> = None;
    loop {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let Ok(n) = rest[..digits].parse::<f64>() else { break };
        rest = rest[digits..].trim_start();
        let unit_len = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" | "msec" | "milliseconds" | "millisecond" => 0.001,
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            _ => break,
        };
        total = Some(total.unwrap_or(0.0) + n * scale);
        rest = rest[unit_len..].trim_start_matches([',', ' ']).trim_start_matches("and ");
    }
    total.filter(|t| t.is_finite())
}

/// The last line of `text` that is a JSON object `keep` accepts.
fn last_object(text: &str, keep: impl Fn(&Value) -> bool) -> Option<Value> {
    text.lines().rev().filter_map(object_line).find(|v| keep(v))
}

/// A line that is one JSON object.
fn object_line(line: &str) -> Option<Value> {
    let l = line.trim();
    l.starts_with('{').then(|| serde_json::from_str::<Value>(l).ok()).flatten().filter(Value::is_object)
}

/// The last JSON object in `text` that starts at the beginning of a line and runs to the end
/// of the text (a pretty-printed document, with whatever the CLI wrote before it).
fn last_document(text: &str) -> Option<Value> {
    let starts = text.match_indices('{').map(|(i, _)| i).filter(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n');
    let starts: Vec<usize> = starts.collect();
    starts.into_iter().rev().find_map(|i| {
        let mut de = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
        match de.next() {
            Some(Ok(v)) if v.is_object() && text[i + de.byte_offset()..].trim().is_empty() => Some(v),
            _ => None,
        }
    })
}

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

fn add(total: &mut Option<i64>, n: Option<i64>) {
    if let Some(n) = n {
        *total = Some(total.unwrap_or(0) + n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(p: Preset, tail: &str, exit: AgentExit) -> RunReport {
        p.report(&Printed { head: tail, tail }, &exit)
    }

    /// claude's result object: its text is the summary and its usage is kept; `is_error`
    /// (with `subtype` still "success") fails the attempt with its words; a 429 parks it.
    #[test]
    fn claude_says_how_it_ended() {
        let ok = r#"{"type":"result","subtype":"success","is_error":false,"result":"done writing","session_id":"b5f7","total_cost_usd":0.099672,"usage":{"input_tokens":24693,"cache_creation_input_tokens":0,"cache_read_input_tokens":7,"output_tokens":45}}"#;
        let r = report(Preset::Claude, &format!("noise\n{ok}\n"), AgentExit::Success);
        assert_eq!((r.exit, r.summary.as_deref()), (None, Some("done writing")));
        assert_eq!(r.usage.session.as_deref(), Some("b5f7"));
        assert_eq!((r.usage.cost_usd, r.usage.tokens_in, r.usage.tokens_out), (Some(0.099672), Some(24700), Some(45)));
        let bad = r#"{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key · Fix external API key","api_error_status":401}"#;
        let r = report(Preset::Claude, bad, AgentExit::Failed("agent exited with status 1".into()));
        assert_eq!(r.exit, Some(AgentExit::Failed("claude: Invalid API key · Fix external API key".into())));
        let limited = r#"{"type":"result","is_error":true,"result":"API Error: Request rejected (429) · usage limit","api_error_status":429}"#;
        assert_eq!(report(Preset::Claude, limited, AgentExit::Success).exit, Some(AgentExit::TryLater));
        let reset = r#"{"type":"result","is_error":true,"result":"Claude AI usage limit reached|1796266907"}"#;
        assert_eq!(
            report(Preset::Claude, reset, AgentExit::Success).retry_after,
            Some(RetryAfter::At(1_796_266_907_000))
        );
        // No result object (a user's own --output-format text): the exit status decides.
        assert_eq!(report(Preset::Claude, "plain text\n", AgentExit::Success), RunReport::default());
    }

    /// codex's events: the thread id, the last agent message, the usage; a `turn.failed`
    /// fails the attempt with its message, a 429 in it parks.
    #[test]
    fn codex_says_how_it_ended() {
        let ok = [
            r#"{"type":"thread.started","thread_id":"01a2-b3"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"done writing"}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":31165,"cached_input_tokens":0,"output_tokens":105}}"#,
        ]
        .join("\n");
        let r = report(Preset::Codex, &ok, AgentExit::Success);
        assert_eq!(
            (r.exit, r.summary.as_deref(), r.usage.session.as_deref()),
            (None, Some("done writing"), Some("01a2-b3"))
        );
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (Some(31165), Some(105)));
        let failed = r#"{"type":"thread.started","thread_id":"t"}
{"type":"error","message":"unexpected status 401 Unauthorized: Incorrect API key provided"}
{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized: Incorrect API key provided"}}"#;
        let r = report(Preset::Codex, failed, AgentExit::Failed("agent exited with status 1".into()));
        assert_eq!(
            r.exit,
            Some(AgentExit::Failed("codex: unexpected status 401 Unauthorized: Incorrect API key provided".into()))
        );
        let limited =
            r#"{"type":"turn.failed","error":{"message":"exceeded retry limit, last status: 429 Too Many Requests"}}"#;
        assert_eq!(report(Preset::Codex, limited, AgentExit::Success).exit, Some(AgentExit::TryLater));
        assert!(Preset::Codex.is_retry_line(
            r#"{"type":"error","message":"Reconnecting... waiting for network (Connection failed: error sending request)"}"#
        ));
        assert!(!Preset::Codex.is_retry_line(r#"{"type":"turn.started"}"#));
    }

    /// gemini's pretty-printed JSON: the response and tokens; its error fails the attempt;
    /// with no JSON, an exit status that is an HTTP status mod 256 is named as one.
    #[test]
    fn gemini_says_how_it_ended() {
        let ok = "Loaded cached credentials.\n{\n  \"session_id\": \"g-1\",\n  \"response\": \"done\",\n  \"stats\": {\n    \"models\": {\"m\": {\"tokens\": {\"prompt\": 10, \"candidates\": 3}}}\n  }\n}\n";
        let r = report(Preset::Gemini, ok, AgentExit::Success);
        assert_eq!(
            (r.exit, r.summary.as_deref(), r.usage.tokens_in, r.usage.tokens_out),
            (None, Some("done"), Some(10), Some(3))
        );
        assert_eq!(r.usage.session.as_deref(), Some("g-1"));
        let err = "{\n  \"error\": {\"type\": \"FatalAuthenticationError\", \"message\": \"API key not valid\", \"code\": 401}\n}\n";
        let r = report(Preset::Gemini, err, AgentExit::Failed("agent exited with status 145".into()));
        assert_eq!(r.exit, Some(AgentExit::Failed("gemini: API key not valid (401)".into())));
        let r = report(Preset::Gemini, "boom\n", AgentExit::Failed("agent exited with status 145".into()));
        assert_eq!(
            r.exit,
            Some(AgentExit::Failed("gemini failed: exit status 145, which gemini uses for HTTP 401".into()))
        );
        let r = report(
            Preset::Gemini,
            "Quota exceeded. Please retry in 30s.\n",
            AgentExit::Failed("agent exited with status 173".into()),
        );
        assert_eq!(r.exit, Some(AgentExit::TryLater));
    }

    /// gemini's stream of events: the session, the assistant's words after its last tool
    /// call, the tokens; a result with an error fails the attempt, a quota parks it.
    #[test]
    fn gemini_streams_how_it_ended() {
        let ok = [
            r#"{"type":"init","timestamp":"t","session_id":"g-2","model":"gemini-2.5-pro"}"#,
            r#"{"type":"message","role":"user","content":"Fix it"}"#,
            r#"{"type":"message","role":"assistant","content":"Looking","delta":true}"#,
            r#"{"type":"tool_use","tool_name":"replace","tool_id":"t1","parameters":{"file_path":"a.rs"}}"#,
            r#"{"type":"tool_result","tool_id":"t1","status":"success","output":"ok"}"#,
            r#"{"type":"message","role":"assistant","content":"Fixed the ","delta":true}"#,
            r#"{"type":"message","role":"assistant","content":"login.","delta":true}"#,
            r#"{"type":"result","status":"success","stats":{"input_tokens":120,"output_tokens":7,"tool_calls":1}}"#,
        ]
        .join("\n");
        let r = report(Preset::Gemini, &ok, AgentExit::Success);
        assert_eq!(
            (r.exit, r.summary.as_deref(), r.usage.session.as_deref(), r.usage.tokens_in, r.usage.tokens_out),
            (None, Some("Fixed the login."), Some("g-2"), Some(120), Some(7))
        );
        let bad = r#"{"type":"result","status":"error","error":{"type":"FatalAuthenticationError","message":"API key not valid"},"stats":{}}"#;
        let r = report(Preset::Gemini, bad, AgentExit::Failed("agent exited with status 41".into()));
        assert_eq!(r.exit, Some(AgentExit::Failed("gemini: API key not valid".into())));
        let quota =
            r#"{"type":"error","severity":"error","message":"Quota exceeded for quota metric. Please retry in 30s."}"#;
        assert_eq!(report(Preset::Gemini, quota, AgentExit::Success).exit, Some(AgentExit::TryLater));
        let warned = r#"{"type":"error","severity":"warning","message":"loop detected"}"#;
        assert_eq!(report(Preset::Gemini, warned, AgentExit::Success).exit, None, "a warning is not the end");
    }

    /// aider exits 0 when its model call fails: its error lines fail the attempt, a rate
    /// limit parks it, and a clean run is left to its exit status.
    #[test]
    fn aider_says_how_it_ended() {
        let out = "Aider v0.86.2\nlitellm.AuthenticationError: AuthenticationError: OpenAIException - Incorrect API key\nThe API provider is not able to authenticate you. Check your API key.\n";
        let r = report(Preset::Aider, out, AgentExit::Success);
        assert_eq!(
            r.exit,
            Some(AgentExit::Failed(
                "aider: The API provider is not able to authenticate you. Check your API key.".into()
            ))
        );
        let limited = "litellm.RateLimitError: slow down\nThe API provider has rate limited you. Try again later or check your quotas.\n";
        let r = report(Preset::Aider, limited, AgentExit::Success);
        assert_eq!((r.exit, r.retry_after), (Some(AgentExit::TryLater), None));
        assert_eq!(report(Preset::Aider, "Applied edit to hello.txt\n", AgentExit::Success).exit, None);
        // A reply about rate limits, and an error aider retried and got past, are no failure.
        let worked = "except RateLimitError: # quota\nThe API provider's servers are down or overloaded.\n\
                      Retrying in 0.2 seconds...\nApplied edit to limits.py\nTokens: 2k sent, 30 received.\n\
                      Cost: $0.01 message\nDone.\n";
        assert_eq!(report(Preset::Aider, worked, AgentExit::Success).exit, None);
    }

    /// A reset time is read with its units; none readable leaves the backoff.
    #[test]
    fn reset_times_keep_their_units() {
        let secs = |m: &str| match retry_after_in(m) {
            Some(RetryAfter::In(d)) => Some(d.as_secs()),
            _ => None,
        };
        assert_eq!(secs("You've hit your usage limit. Try again in 4 days 23 hours."), Some(4 * 86_400 + 23 * 3600));
        assert_eq!(secs("Rate limit reached. Please try again in 6m0s."), Some(360));
        assert_eq!(secs("Please retry in 3600s."), Some(3600));
        assert_eq!(secs("retry-after: 30"), Some(30));
        assert_eq!(secs("Retry after 500ms"), Some(0));
        assert_eq!(secs("try again in a while"), None);
        assert_eq!(secs("no hint at all"), None);
    }
}
