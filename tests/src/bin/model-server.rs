//! `model-server`: the tests' scripted model server as a process, for hand experiments with
//! the real agent CLIs.
//!
//! ```text
//! MODEL_SERVER_LOG=requests.jsonl model-server SCRIPT.json
//! ```
//!
//! `SCRIPT.json` is a JSON array of turns, each `{"text": "…"}`, `{"tool": NAME, "input":
//! {…}}`, `{"error": STATUS, "headers": {NAME: VALUE}, "body": …}` or `{"wait_ms": N}` (the
//! next turn is answered N ms late). Prints the base URL
//! (`http://127.0.0.1:PORT`) as stdout's first line, then appends every request it gets as
//! one JSON line to the file `MODEL_SERVER_LOG` names (if set), until killed.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use devpilot_tests::model_server::Recorded;
use devpilot_tests::{ModelServer, Turn};
use serde_json::{json, Value};

/// One turn of the script file.
fn parse_turn(turn: &Value) -> Result<Turn, String> {
    if let Some(text) = turn.get("text") {
        return Ok(Turn::Text(text.as_str().ok_or("\"text\" must be a string")?.to_string()));
    }
    if let Some(name) = turn.get("tool") {
        let name = name.as_str().ok_or("\"tool\" must be a string")?.to_string();
        return Ok(Turn::Tool { name, input: turn.get("input").cloned().unwrap_or(json!({})) });
    }
    if let Some(ms) = turn.get("wait_ms") {
        let ms = ms.as_u64().ok_or("\"wait_ms\" must be a number of milliseconds")?;
        return Ok(Turn::Wait(Duration::from_millis(ms)));
    }
    if let Some(status) = turn.get("error") {
        let status = status.as_u64().and_then(|s| u16::try_from(s).ok()).ok_or("\"error\" must be a status")?;
        let headers = turn.get("headers").and_then(Value::as_object).cloned().unwrap_or_default();
        let headers = headers.into_iter().map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_string)));
        let body = turn.get("body").cloned().unwrap_or(Value::Null);
        return Ok(Turn::Error { status, headers: headers.collect(), body });
    }
    Err(format!("a turn must have \"text\", \"tool\", \"error\" or \"wait_ms\": {turn}"))
}

/// The script file's turns.
fn read_script(path: &str) -> Result<Vec<Turn>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    value.as_array().ok_or(format!("{path}: not a JSON array"))?.iter().map(parse_turn).collect()
}

/// A recorded request as one JSON object.
fn to_json(r: &Recorded) -> Value {
    let headers: serde_json::Map<String, Value> = r.headers.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    json!({
        "provider": format!("{:?}", r.provider), "method": r.method, "path": r.path,
        "main": r.main, "headers": headers, "body": r.body,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [script] = args.as_slice() else {
        eprintln!("usage: MODEL_SERVER_LOG=requests.jsonl model-server SCRIPT.json");
        return ExitCode::from(2);
    };
    let turns = match read_script(script) {
        Ok(turns) => turns,
        Err(why) => {
            eprintln!("model-server: {why}");
            return ExitCode::from(2);
        }
    };
    let server = match ModelServer::start() {
        Ok(server) => server,
        Err(e) => {
            eprintln!("model-server: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    server.script(turns);
    println!("{}", server.url());
    let _ = std::io::stdout().flush();
    let log = std::env::var("MODEL_SERVER_LOG").ok().filter(|l| !l.is_empty());
    let mut written = 0;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let requests = server.requests();
        if let Some(log) = &log {
            let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(log) else { continue };
            for r in &requests[written..] {
                let _ = writeln!(file, "{}", to_json(r));
            }
        }
        written = requests.len();
    }
}
