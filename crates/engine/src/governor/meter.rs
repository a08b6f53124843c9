//! What a running agent has spent so far, read from its output as it streams into the job's
//! log, so a cap can stop it mid-run rather than after. Each CLI says it its own way:
//! - claude (`--output-format stream-json`): the usage of every assistant message, priced
//!   by its model, until its closing `result` gives the cost it reports itself;
//! - codex (`exec --json`): the usage of every `turn.completed`, priced by the configured
//!   model (its events name none);
//! - gemini (`-o stream-json`): its `result`'s stats, per model where it gives them, so
//!   nothing is known before the run ends;
//! - aider: its "Tokens: … Cost: $x message, $y session." lines, whose session figure is
//!   the cost it reports.
//!
//! The reported cost is the CLI's; the priced one is an estimate from [`super::price`].

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use serde_json::Value;

use super::price::{price_of, Price, Tokens};
use crate::preset::Preset;

/// Where a [`Spent`]'s dollars come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The CLI said what the run cost.
    Reported,
    /// Every call's tokens were priced with a known price.
    Priced,
    /// Some tokens (or all, or none seen yet) have no known price: `usd` is what could be
    /// priced, a floor.
    Unknown,
}

/// What a run has spent so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spent {
    pub usd: f64,
    /// Everything sent to the model, cached or not.
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub source: Source,
}

/// A running agent's spend, fed its output line by line.
#[derive(Clone, Debug)]
pub struct Meter {
    preset: Preset,
    /// The model the settings run it with, for calls whose output names none.
    model: Option<String>,
    /// The model the CLI said it runs (gemini's `init`), which beats the settings'.
    said_model: Option<String>,
    prices: BTreeMap<String, Price>,
    /// Tokens by call (claude's message id, a codex turn, a gemini model, an aider report),
    /// with the call's model where the output names it.
    calls: BTreeMap<String, (Option<String>, Tokens)>,
    /// The CLI's own figure of the run's cost.
    reported: Option<f64>,
}

impl Meter {
    /// A meter for `preset` run with `model` (its settings' `--model`, if any), priced with
    /// the vendored table under the `prices` overrides.
    pub fn new(preset: Preset, model: Option<String>, prices: BTreeMap<String, Price>) -> Self {
        let model = model.map(|m| m.trim().to_string()).filter(|m| !m.is_empty());
        Self { preset, model, said_model: None, prices, calls: BTreeMap::new(), reported: None }
    }

    /// Reads one line the CLI printed; lines that say nothing of usage are passed over.
    pub fn feed(&mut self, line: &str) {
        let line = line.trim();
        // Only lines that may carry usage are parsed: the rest (tool output, file contents)
        // can be long.
        let parse = match self.preset {
            Preset::Aider => return self.aider(line),
            Preset::Claude => line.contains("\"usage\"") || line.contains("\"total_cost_usd\""),
            Preset::Codex => line.contains("turn.completed"),
            Preset::Gemini => line.contains("\"init\"") || line.contains("\"result\""),
        };
        let Some(v) = parse.then(|| object(line)).flatten() else { return };
        match self.preset {
            Preset::Claude => self.claude(&v),
            Preset::Codex => self.codex(&v),
            Preset::Gemini => self.gemini(&v),
            Preset::Aider => {}
        }
    }

    /// What the run has spent so far.
    pub fn spent(&self) -> Spent {
        // Summed by model first, so each model is priced once.
        let mut by_model: BTreeMap<Option<&str>, Tokens> = BTreeMap::new();
        for (model, t) in self.calls.values() {
            let model = model.as_deref().or(self.said_model.as_deref()).or(self.model.as_deref());
            by_model.entry(model).or_default().add(t);
        }
        let (mut usd, mut all_priced, mut total) = (0.0, !by_model.is_empty(), Tokens::default());
        for (model, t) in &by_model {
            total.add(t);
            match model.and_then(|m| price_of(m, &self.prices)) {
                Some(p) => usd += p.cost(t),
                None => all_priced = false,
            }
        }
        let (usd, source) = match self.reported {
            Some(r) => (r, Source::Reported),
            None if all_priced => (usd, Source::Priced),
            None => (usd, Source::Unknown),
        };
        Spent { usd, tokens_in: total.sent(), tokens_out: total.output, source }
    }

    /// An assistant message's usage, once per message id (its content blocks come on lines
    /// of their own, each with the usage so far): the last one kept. The `result` line's
    /// `total_cost_usd` is the run's cost.
    fn claude(&mut self, v: &Value) {
        match v["type"].as_str() {
            Some("assistant") => {
                let m = &v["message"];
                let u = &m["usage"];
                let t = Tokens {
                    input: int(u, "input_tokens"),
                    output: int(u, "output_tokens"),
                    cache_write: int(u, "cache_creation_input_tokens"),
                    cache_read: int(u, "cache_read_input_tokens"),
                };
                let key = match m["id"].as_str() {
                    Some(id) => format!("message {id}"),
                    None => format!("line {}", self.calls.len()),
                };
                self.record(key, text(m, "model"), t);
            }
            Some("result") => {
                if let Some(usd) = v["total_cost_usd"].as_f64().filter(|c| c.is_finite() && *c >= 0.0) {
                    self.reported = Some(usd);
                }
            }
            _ => {}
        }
    }

    /// A turn's usage: its input counts its cached input, which is priced as a cache read.
    fn codex(&mut self, v: &Value) {
        if v["type"] != "turn.completed" {
            return;
        }
        let u = &v["usage"];
        let cached = int(u, "cached_input_tokens");
        let t = Tokens {
            input: (int(u, "input_tokens") - cached).max(0),
            output: int(u, "output_tokens"),
            cache_write: 0,
            cache_read: cached,
        };
        self.record(format!("turn {}", self.calls.len()), None, t);
    }

    /// The model of `init`; the `result`'s stats, per model where given (each model's input
    /// counts its `cached` part), else its totals.
    fn gemini(&mut self, v: &Value) {
        match v["type"].as_str() {
            Some("init") => self.said_model = text(v, "model").or(self.said_model.take()),
            Some("result") => {
                let st = &v["stats"];
                let tokens = |s: &Value| {
                    let cached = int(s, "cached");
                    Tokens {
                        input: (int(s, "input_tokens") - cached).max(0),
                        output: int(s, "output_tokens"),
                        cache_write: 0,
                        cache_read: cached,
                    }
                };
                match st["models"].as_object().filter(|m| !m.is_empty()) {
                    Some(models) => {
                        self.calls.retain(|k, _| !k.starts_with("gemini "));
                        for (name, s) in models {
                            self.record(format!("gemini {name}"), Some(name.clone()), tokens(s));
                        }
                    }
                    None => self.record("gemini".into(), None, tokens(st)),
                }
            }
            _ => {}
        }
    }

    /// "Tokens: 2.3k sent, 1.0k cache write, 4.1k cache hit, 120 received." (each report is
    /// one call's) and "Cost: $0.01 message, $0.05 session." (on the same line or the
    /// next). The session figure only grows, so a smaller one (a reply that quotes such a
    /// line) is not taken.
    fn aider(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("Tokens:") {
            let counts = rest.split("Cost:").next().unwrap_or_default();
            let (mut sent, mut t) = (0, Tokens::default());
            for part in counts.split(',') {
                let part = part.trim().trim_end_matches('.');
                let (n, what) = part.split_once(' ').unwrap_or((part, ""));
                let n = tokens_of(n);
                match what.trim() {
                    "sent" => sent = n,
                    "cache write" => t.cache_write = n,
                    "cache hit" => t.cache_read = n,
                    "received" => t.output = n,
                    _ => {}
                }
            }
            // aider's "sent" counts the cache writes (not the hits).
            t.input = (sent - t.cache_write).max(0);
            self.record(format!("report {}", self.calls.len()), None, t);
        }
        let Some(at) = line.find("Cost: $") else { return };
        let session = line[at..].split(", $").nth(1).and_then(|s| s.strip_suffix(" session.").or(Some(s)));
        let usd = session.and_then(|s| s.split_whitespace().next()).and_then(|s| s.parse::<f64>().ok());
        if let Some(usd) = usd.filter(|c| c.is_finite() && *c >= 0.0) {
            self.reported = Some(self.reported.map_or(usd, |r| r.max(usd)));
        }
    }

    fn record(&mut self, key: String, model: Option<String>, t: Tokens) {
        // A call with no tokens (claude's "<synthetic>" error messages) costs nothing and
        // names no model to price.
        if t.is_zero() {
            self.calls.remove(&key);
            return;
        }
        self.calls.insert(key, (model, t));
    }
}

/// A JSON object on one line.
fn object(line: &str) -> Option<Value> {
    line.starts_with('{').then(|| serde_json::from_str::<Value>(line).ok()).flatten().filter(Value::is_object)
}

fn int(v: &Value, key: &str) -> i64 {
    v.get(key).and_then(Value::as_i64).unwrap_or(0).max(0)
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

/// aider's token counts: "120", "2.3k", "12k" (and "1.2M").
fn tokens_of(n: &str) -> i64 {
    let (digits, scale) = match n.as_bytes().last() {
        Some(b'k') => (&n[..n.len() - 1], 1e3),
        Some(b'M') => (&n[..n.len() - 1], 1e6),
        _ => (n, 1.0),
    };
    digits.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).map_or(0, |x| (x * scale).round() as i64)
}

/// The longest line fed to a meter; a longer one (a tool's whole output) is passed over.
const LINE_MAX: usize = 16 << 20;

/// Follows a job's log as the agent appends to it, from `offset` (the agent's first byte:
/// the log has a header, and earlier attempts, before), feeding complete lines to a meter.
/// Blocking I/O: call it off the async runtime.
pub struct Tail {
    pub path: PathBuf,
    /// The next byte to read.
    pub offset: u64,
    /// The start of a line not yet ended. Bytes, not text, so a character cut between two
    /// reads stays whole.
    partial: Vec<u8>,
    /// Inside a line over [`LINE_MAX`], passed over up to its end.
    skipping: bool,
}

/// Shows where it is, never the agent's text (which may hold anything it printed).
impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("path", &self.path)
            .field("offset", &self.offset)
            .field("partial_len", &self.partial.len())
            .finish()
    }
}

impl Tail {
    pub fn new(path: PathBuf, offset: u64) -> Self {
        Self { path, offset, partial: vec![], skipping: false }
    }

    /// Feeds `meter` every line completed since the last call. The log is opened as
    /// [`crate::safe_fs::open_regular`] does (no link followed, no FIFO waited on): nothing
    /// there, or something else, is nothing new.
    pub fn read_new(&mut self, meter: &mut Meter) -> std::io::Result<()> {
        let Some(mut f) = crate::safe_fs::open_regular(&self.path)? else { return Ok(()) };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.offset += n as u64;
            self.take(&buf[..n], meter);
        }
    }

    /// Feeds `meter` the log's last line when it has no newline (the agent stopped mid-line,
    /// or its CLI ended without one): call it once the agent has ended.
    pub fn finish(&mut self, meter: &mut Meter) {
        if !self.skipping && !self.partial.is_empty() {
            meter.feed(&String::from_utf8_lossy(&self.partial));
        }
        self.partial.clear();
        self.skipping = false;
    }

    /// Splits `bytes` into lines, the first continuing the last read's partial line.
    fn take(&mut self, bytes: &[u8], meter: &mut Meter) {
        let mut pieces = bytes.split(|b| *b == b'\n').peekable();
        while let Some(piece) = pieces.next() {
            let ended = pieces.peek().is_some();
            if !self.skipping {
                self.partial.extend_from_slice(piece);
            }
            if ended {
                if !self.skipping {
                    meter.feed(&String::from_utf8_lossy(&self.partial));
                }
                self.partial.clear();
                self.skipping = false;
            } else if self.partial.len() > LINE_MAX {
                self.partial.clear();
                self.skipping = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter(preset: Preset, model: Option<&str>, lines: &[&str]) -> Meter {
        let mut m = Meter::new(preset, model.map(str::to_string), BTreeMap::new());
        for l in lines {
            m.feed(l);
        }
        m
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    const CLAUDE: [&str; 6] = [
        r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s1","tools":["Bash","Edit"],"model":"claude-sonnet-4-5-20250929","permissionMode":"acceptEdits"}"#,
        r#"{"type":"assistant","message":{"id":"msg_01A","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Looking at the login."}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":5000,"cache_read_input_tokens":12000,"cache_creation":{"ephemeral_5m_input_tokens":5000,"ephemeral_1h_input_tokens":0},"output_tokens":2,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"s1"}"#,
        r#"{"type":"assistant","message":{"id":"msg_01A","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"tool_use","id":"toolu_1","name":"Edit","input":{"file_path":"a.rs"}}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":5000,"cache_read_input_tokens":12000,"output_tokens":150,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"s1"}"#,
        r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"{\"type\":\"result\",\"total_cost_usd\":0.0001,\"usage\":{}}"}]},"parent_tool_use_id":null,"session_id":"s1"}"#,
        r#"{"type":"assistant","message":{"id":"msg_01B","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Fixed."}],"usage":{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":17000,"output_tokens":80}},"parent_tool_use_id":null,"session_id":"s1"}"#,
        r#"{"type":"assistant","message":{"id":"msg_01C","model":"<synthetic>","content":[{"type":"text","text":"API Error"}],"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}"#,
    ];

    /// claude: each message counted once with its last usage, every kind of token at its
    /// model's price; a tool's output that quotes a result line is not the result; the real
    /// `result` replaces the estimate.
    #[test]
    fn claude_is_priced_then_reported() {
        let mut m = meter(Preset::Claude, None, &CLAUDE);
        let s = m.spent();
        // msg_01A: 3×3 + 5000×3.75 + 12000×0.3 + 150×15; msg_01B: 10×3 + 200×3.75 + 17000×0.3 + 80×15.
        assert!(close(s.usd, (24_609.0 + 7_080.0) / 1e6), "{s:?}");
        assert_eq!((s.tokens_in, s.tokens_out, s.source), (34_213, 230, Source::Priced));
        m.feed(r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":9000,"num_turns":2,"result":"Fixed.","session_id":"s1","total_cost_usd":0.0412,"usage":{"input_tokens":13,"cache_creation_input_tokens":5200,"cache_read_input_tokens":29000,"output_tokens":230}}"#);
        let s = m.spent();
        assert_eq!((s.usd, s.tokens_in, s.source), (0.0412, 34_213, Source::Reported));
        let unknown = meter(Preset::Claude, None, &[&CLAUDE[1].replace("claude-sonnet-4-5-20250929", "claude-next")]);
        assert_eq!((unknown.spent().source, unknown.spent().tokens_in), (Source::Unknown, 17_003));
    }

    /// codex: its turns summed, cached input priced as a cache read, at the configured
    /// model's price; with no model, the tokens are counted and the cost unknown.
    #[test]
    fn codex_turns_are_summed() {
        let lines = [
            r#"{"type":"thread.started","thread_id":"01a2-b3"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"turn.completed soon"}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":31165,"cached_input_tokens":20000,"output_tokens":105}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":40000,"cached_input_tokens":30000,"output_tokens":500}}"#,
        ];
        let s = meter(Preset::Codex, Some("gpt-5-codex"), &lines).spent();
        // 11165×1.25 + 20000×0.125 + 105×10, then 10000×1.25 + 30000×0.125 + 500×10.
        assert!(close(s.usd, (17_506.25 + 21_250.0) / 1e6), "{s:?}");
        assert_eq!((s.tokens_in, s.tokens_out, s.source), (71_165, 605, Source::Priced));
        let s = meter(Preset::Codex, None, &lines).spent();
        assert_eq!((s.usd, s.tokens_in, s.tokens_out, s.source), (0.0, 71_165, 605, Source::Unknown));
        assert_eq!(meter(Preset::Codex, Some("gpt-5"), &lines[..3]).spent().source, Source::Unknown, "nothing yet");
    }

    /// gemini: its result's per-model stats, each at its own price with cached input as a
    /// cache read; an older result with totals only is priced as the model `init` named.
    #[test]
    fn gemini_result_is_priced_per_model() {
        let init =
            r#"{"type":"init","timestamp":"2026-12-06T10:00:00.000Z","session_id":"g-2","model":"gemini-2.5-pro"}"#;
        let result = r#"{"type":"result","timestamp":"2026-12-06T10:01:00.000Z","status":"success","stats":{"total_tokens":13350,"input_tokens":13000,"output_tokens":350,"cached":8000,"input":5000,"duration_ms":60000,"tool_calls":1,"models":{"gemini-2.5-pro":{"total_tokens":12300,"input_tokens":12000,"output_tokens":300,"cached":8000,"input":4000},"gemini-2.5-flash":{"total_tokens":1050,"input_tokens":1000,"output_tokens":50,"cached":0,"input":1000}}}}"#;
        let message = r#"{"type":"message","role":"assistant","content":"the result is in","delta":true}"#;
        let s = meter(Preset::Gemini, Some("gemini-2.5-flash"), &[init, message, result]).spent();
        // pro: 4000×1.25 + 8000×0.125 + 300×10; flash: 1000×0.3 + 50×2.5.
        assert!(close(s.usd, (9_000.0 + 425.0) / 1e6), "{s:?}");
        assert_eq!((s.tokens_in, s.tokens_out, s.source), (13_000, 350, Source::Priced));
        let old =
            r#"{"type":"result","status":"success","stats":{"input_tokens":120,"output_tokens":7,"tool_calls":1}}"#;
        let s = meter(Preset::Gemini, Some("gemini-2.5-flash"), &[init, old]).spent();
        assert!(close(s.usd, (120.0 * 1.25 + 7.0 * 10.0) / 1e6), "init's model, not the settings': {s:?}");
    }

    /// aider: its token reports summed ("k" read as thousands, cache writes inside "sent"),
    /// its session cost reported, and a smaller session figure (a quoted line) not taken.
    #[test]
    fn aider_reports_its_session() {
        let lines = [
            "Aider v0.86.2",
            "Tokens: 2.3k sent, 120 received. Cost: $0.01 message, $0.05 session.",
            "Applied edit to hello.txt",
            "Tokens: 12k sent, 3.0k cache write, 8.1k cache hit, 1.2k received.",
            "Cost: $0.0031 message, $0.07 session.",
            "Cost: $0.00 message, $0.00 session.",
        ];
        let s = meter(Preset::Aider, None, &lines).spent();
        assert_eq!((s.usd, s.tokens_in, s.tokens_out, s.source), (0.07, 22_400, 1_320, Source::Reported));
        let s = meter(Preset::Aider, None, &["Tokens: 950 sent, 30 received."]).spent();
        assert_eq!((s.tokens_in, s.source), (950, Source::Unknown), "a model aider has no price for");
    }

    /// The tail reads only what was appended since the agent started, feeds a line only
    /// once it is complete (a character cut between reads stays whole), and follows no link.
    #[test]
    fn the_tail_feeds_complete_lines() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("job-1.log");
        let header = "=== job 1 attempt 1 (claim 7) on laptop ===\nTokens: 1M sent, 1M received.\n";
        std::fs::write(&log, header).unwrap();
        let mut m = Meter::new(Preset::Aider, None, BTreeMap::new());
        let mut tail = Tail::new(log.clone(), header.len() as u64);
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all("Tokens: 2.3k sent, 120 rece".as_bytes()).unwrap();
        tail.read_new(&mut m).unwrap();
        assert_eq!(m.spent().tokens_in, 0, "half a line is not read");
        f.write_all(b"ived. Cost: $0.01 message, $0.05 session.\n").unwrap();
        tail.read_new(&mut m).unwrap();
        assert_eq!((m.spent().tokens_in, m.spent().usd), (2_300, 0.05));
        let mut bytes = "Cost: $0.01 message, $0.06 session. é\n".as_bytes().to_vec();
        let cut = bytes.len() - 2;
        let end = bytes.split_off(cut);
        tail.take(&bytes, &mut m);
        tail.take(&end, &mut m);
        assert_eq!(m.spent().usd, 0.06);
        assert!(tail.partial.is_empty());
        let link = dir.path().join("job-2.log");
        std::os::unix::fs::symlink(&log, &link).unwrap();
        let mut other = Meter::new(Preset::Aider, None, BTreeMap::new());
        Tail::new(link, 0).read_new(&mut other).unwrap();
        assert_eq!(other.spent().tokens_in, 0, "a link is not followed");
        Tail::new(dir.path().join("none.log"), 0).read_new(&mut other).unwrap();
    }
}
