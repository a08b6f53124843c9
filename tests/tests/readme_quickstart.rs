//! The README's quick start runs as written: its five `sh` blocks, taken from README.md
//! itself, run in order in a fresh HOME on the embedded default, with the real `claude` CLI
//! against the scripted model server, GitHub's loopback stand-in, a private keychain and a
//! browser that records what it was asked to open. The labelled issue becomes job 1, claude
//! edits the repository, `watch 1` exits 0 and `open 1` opens the draft pull request that
//! closes the issue.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use devpilot_tests::github::IssueSeed;
use devpilot_tests::{devpilot_bin, git, GitHubStandIn, GitRemote, ModelServer, SecretService, Turn};
use serde_json::json;

const TOKEN: &str = "ghp_TESTSECRET_quickstart0a1b2c";
const REPO: &str = "acme/webapp";
const GITHUB_URL: &str = "https://github.com/acme/webapp.git";

/// The `sh` blocks of the README's quick start (up to its Linear subsection).
fn quickstart_blocks() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let start = readme.find("\n## Quick start").expect("a quick start section");
    let section = &readme[start..];
    let end = section.find("\n### From Linear").or_else(|| section[1..].find("\n## ")).unwrap();
    let mut blocks = vec![];
    let mut rest = &section[..end];
    while let Some(at) = rest.find("```sh\n") {
        let body = &rest[at + 6..];
        let close = body.find("\n```").unwrap();
        blocks.push(body[..close].to_string());
        rest = &body[close + 4..];
    }
    blocks
}

/// Where the pinned agent CLIs are (`scripts/agent_clis.sh`).
fn clis() -> PathBuf {
    let dir = std::env::var("DEVPILOT_AGENT_CLIS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/devpilot-agent-clis"));
    assert!(dir.join("bin/claude").exists(), "claude is not installed: run scripts/agent_clis.sh");
    dir.join("bin")
}

/// A new user's machine: a HOME, the built CLI where `run.sh` leaves it, a clone, a browser.
struct Desk {
    home: PathBuf,
    env: Vec<(String, String)>,
    opened: PathBuf,
}

impl Desk {
    fn new(root: &Path, remote: &GitRemote, model: &ModelServer, gh: &GitHubStandIn, keys: &SecretService) -> Desk {
        let home = root.join("home");
        let release = home.join(".cache/devpilot-target/release");
        std::fs::create_dir_all(&release).unwrap();
        std::os::unix::fs::symlink(devpilot_bin(), release.join("devpilot")).unwrap();
        // The user's clone says github.com; their git (here, its global config) sends that
        // URL to a real bare repository, so pushes land and DevPilot sees a GitHub remote.
        let clone = remote.clone_to(&home.join("src/webapp"));
        git(&clone, &["remote", "set-url", "origin", GITHUB_URL]);
        let gitconfig = format!(
            "[user]\n\tname = Dev\n\temail = dev@example.com\n[url \"{}\"]\n\tinsteadOf = {GITHUB_URL}\n",
            remote.bare.display()
        );
        std::fs::write(home.join(".gitconfig"), gitconfig).unwrap();
        // The browser: `xdg-open URL` writes the URL down.
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let opened = root.join("opened.txt");
        let browser = bin.join("xdg-open");
        std::fs::write(&browser, format!("#!/bin/sh\nprintf '%s\\n' \"$1\" >> '{}'\n", opened.display())).unwrap();
        std::fs::set_permissions(&browser, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:{}:/usr/local/bin:/usr/bin:/bin", bin.display(), clis().display());
        let env = [
            ("HOME", home.display().to_string()),
            ("PATH", path),
            ("DBUS_SESSION_BUS_ADDRESS", keys.address.clone()),
            ("DEVPILOT_GITHUB_API_URL", gh.url()),
            ("ANTHROPIC_BASE_URL", model.url()),
            ("ANTHROPIC_API_KEY", "sk-ant-test-key".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ];
        Desk { home, env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(), opened }
    }

    /// `bash -c script` as this user, with nothing of the test's environment but the above.
    fn shell(&self, script: &str) -> Command {
        let mut c = Command::new("bash");
        c.args(["-euo", "pipefail", "-c", script]).env_clear().envs(self.env.iter().map(|(k, v)| (k, v)));
        c.current_dir(&self.home);
        c
    }

    /// Runs `script` to its end, with `stdin`: (status, stdout, stderr).
    fn run(&self, script: &str, stdin: &str) -> (i32, String, String) {
        use std::io::Write;
        let mut child =
            self.shell(script).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }
}

/// A machine started by step 4, stopped (handing off) at the end of the test.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the child this test started.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Following the quick start alone takes a new user from a labelled GitHub issue to its
/// draft pull request: every command in it runs as written and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_runs_as_written() {
    let blocks = quickstart_blocks();
    assert_eq!(blocks.len(), 5, "five steps, one block each: {blocks:#?}");
    let root = tempfile::Builder::new().prefix("devpilot-quickstart-").tempdir_in("/var/tmp").unwrap();
    let remote = GitRemote::new(root.path());
    let gh = GitHubStandIn::start(TOKEN);
    gh.add_repo_with_git(REPO, &remote.bare);
    gh.open_issue(REPO, IssueSeed::new("Fix the login", &["agent"]));
    let model = ModelServer::start().unwrap();
    let keys = SecretService::start(&root.path().join("keyring"));
    let desk = Desk::new(root.path(), &remote, &model, &gh, &keys);
    let worktree = desk.home.join(".local/share/devpilot/worktrees/personal/1");
    model.script([
        Turn::Tool {
            name: "Write".into(),
            input: json!({"file_path": worktree.join("login.js").display().to_string(), "content": "// fixed\n"}),
        },
        Turn::Text("Fixed the login redirect.".into()),
    ]);

    // Steps 1 to 3 in one terminal: PATH, the config, the token (typed at the prompt).
    let first = format!("{}\n{}\n{}", blocks[0], blocks[1], blocks[2]);
    let (code, out, err) = desk.run(&first, &format!("{TOKEN}\n"));
    assert_eq!(code, 0, "steps 1-3: {out}\n{err}");
    assert!(out.contains("devpilot "), "--version: {out}");
    assert!(out.contains("saved to"), "the source is saved: {out}\n{err}");
    assert_eq!(keys.lookup("devpilot", "github-token").as_deref(), Some(TOKEN), "the token is in the keychain");

    // Step 4 in its own terminal, left running.
    let log = std::fs::File::create(root.path().join("run.log")).unwrap();
    let mut run = desk.shell(&format!("{}\n{}", blocks[0], blocks[3]));
    run.stdout(log.try_clone().unwrap()).stderr(log).stdin(Stdio::null());
    let _machine = Running(run.spawn().unwrap());
    let ran = || std::fs::read_to_string(root.path().join("run.log")).unwrap_or_default();

    // "Within a poll it becomes job 1."
    let exists = || async { desk.run(&format!("{}\ndevpilot show 1 >/dev/null", blocks[0]), "").0 == 0 };
    assert!(devpilot_tests::wait_for(Duration::from_secs(60), exists).await, "job 1 appears: {}", ran());

    // Step 5 in another terminal.
    let (code, out, err) = desk.run(&format!("{}\n{}", blocks[0], blocks[4]), "");
    assert_eq!(code, 0, "step 5: {out}\n{err}\nthe machine: {}", ran());
    assert!(out.contains("Fix the login"), "jobs lists it: {out}");
    let pulls = gh.pulls(REPO);
    let job = || desk.run(&format!("{}\ndevpilot show 1", blocks[0]), "").1;
    assert_eq!(pulls.len(), 1, "one pull request: {pulls:?}\n{}\n{}", ran(), job());
    let pr = &pulls[0];
    assert_eq!(pr.head, "devpilot/1-gh-1-fix-the-login");
    assert!(pr.draft && pr.body.as_deref().unwrap_or_default().contains("Closes #1"), "{pr:?}");
    assert_eq!(remote.show(&pr.head, "login.js").as_deref(), Some("// fixed\n"), "claude's edit is on the branch");
    let opened = std::fs::read_to_string(&desk.opened).unwrap_or_default();
    assert_eq!(opened.trim(), pr.html_url, "open 1 opened the pull request");
    assert!(gh.rejected().is_empty(), "{:?}", gh.rejected());
}
