//! `github-standin`: the tests' GitHub stand-in as a process, for the Python desktop
//! end-to-end test, which cannot link the Rust harness.
//!
//! ```text
//! GITHUB_STANDIN_TOKEN=TOKEN github-standin [--port N]
//! ```
//!
//! The token comes only from the environment (a token in argv is visible to every process on
//! the machine). Prints exactly one line, `listening on http://127.0.0.1:PORT`, then serves the
//! REST API and the `/_admin/` endpoints (see `devpilot_tests::github`) until killed.

use std::io::Write;
use std::process::ExitCode;

use devpilot_tests::github::{GitHubStandIn, Options};

/// How to call it.
const USAGE: &str = "usage: GITHUB_STANDIN_TOKEN=TOKEN github-standin [--port N]";

/// The token from the environment and the port from the arguments.
fn parse_args() -> Result<(String, u16), String> {
    let mut port = 0u16;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                port = args.next().ok_or("--port needs a value")?.parse().map_err(|_| "--port needs a number")?
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let token = std::env::var("GITHUB_STANDIN_TOKEN").ok().filter(|k| !k.is_empty());
    Ok((token.ok_or("no token: set GITHUB_STANDIN_TOKEN")?, port))
}

fn main() -> ExitCode {
    let (token, port) = match parse_args() {
        Ok(parsed) => parsed,
        Err(problem) => {
            if !problem.is_empty() {
                eprintln!("github-standin: {problem}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let standin = match GitHubStandIn::start_with(&token, Options { port, admin: true }) {
        Ok(standin) => standin,
        Err(e) => {
            eprintln!("github-standin: cannot listen on 127.0.0.1:{port}: {e}");
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
