//! `linear-standin`: the tests' Linear stand-in as a process, for the Python desktop
//! end-to-end test, which cannot link the Rust harness.
//!
//! ```text
//! LINEAR_STANDIN_KEY=KEY linear-standin [--port N]
//! linear-standin --key KEY [--port N]
//! ```
//!
//! Prefer the environment variable: a key in argv is visible to every process on the machine.
//! When both are given, the environment variable wins. Prints exactly one line,
//! `listening on http://127.0.0.1:PORT/graphql`, then serves `/graphql` and the `/_admin/`
//! endpoints (see `devpilot_tests::linear`) until killed.

use std::io::Write;
use std::process::ExitCode;

use devpilot_tests::linear::{LinearStandIn, Options};

/// How to call it.
const USAGE: &str =
    "usage: LINEAR_STANDIN_KEY=KEY linear-standin [--port N]\n       linear-standin --key KEY [--port N]";

/// The key and the port from the environment and the arguments.
fn parse_args() -> Result<(String, u16), String> {
    let (mut key, mut port) = (None, 0u16);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--key" => key = Some(args.next().ok_or("--key needs a value")?),
            "--port" => {
                port = args.next().ok_or("--port needs a value")?.parse().map_err(|_| "--port needs a number")?
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let from_env = std::env::var("LINEAR_STANDIN_KEY").ok().filter(|k| !k.is_empty());
    let key = from_env.or(key).ok_or("no key: set LINEAR_STANDIN_KEY (or pass --key)")?;
    Ok((key, port))
}

fn main() -> ExitCode {
    let (key, port) = match parse_args() {
        Ok(parsed) => parsed,
        Err(problem) => {
            if !problem.is_empty() {
                eprintln!("linear-standin: {problem}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let standin = match LinearStandIn::start_with(&key, Options { port, admin: true }) {
        Ok(standin) => standin,
        Err(e) => {
            eprintln!("linear-standin: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "listening on {}", standin.url());
    let _ = stdout.flush();
    loop {
        std::thread::park();
    }
}
