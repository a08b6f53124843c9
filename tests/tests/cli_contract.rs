//! The `devpilot` command line's contract, through the real binary: every `--json` output
//! (the governor's `limits` verbs and `pause`/`resume --limits` too) has the fields the
//! documentation names (a table below: removing a field fails a test), every documented
//! exit code (0 to 7) is produced, the queue is chosen by `--orchestrator`,
//! then `DEVPILOT_ORCHESTRATOR`, then the config, then `personal` (with a note), and the
//! shell completions complete job ids, source names, repos and presets through the hidden
//! `devpilot __complete`, which never creates a database. Every test runs on PostgreSQL and
//! on SQLite.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use devpilot_store::job::JobState;
use devpilot_store::queue::{GovernedPark, ParkedFor};
use devpilot_tests::{
    devpilot, devpilot_bin, enqueue, fast_flags, run_cli, spawn_runner, wait_for, write_config, Backend, GitRemote,
    LinearStandIn, RecordingAgent, SecretService, TestDb,
};
use serde_json::Value;

devpilot_tests::on_both_backends!(
    every_json_output_has_its_documented_fields,
    every_exit_code_is_produced,
    the_queue_is_the_flag_then_the_environment_then_the_config_then_personal,
    completions_complete_ids_and_names_and_never_create_a_database,
);

/// How long a test waits for a machine to do something.
const WAIT: Duration = Duration::from_secs(60);

/// The fields of a job object (each element of `jobs --json`, `show --json`'s `job`, `watch
/// --json`'s): the job's row, as docs/cli.md lists it.
const JOB: &[&str] = &[
    "id",
    "orchestrator_id",
    "title",
    "state",
    "attempts",
    "max_attempts",
    "priority",
    "unique_key",
    "repo",
    "requires",
    "claimed_by",
    "claim_token",
    "created_at",
    "run_at",
    "claimed_at",
    "heartbeat_at",
    "started_at",
    "completed_at",
    "finished_at",
    "last_error",
    "summary",
    "url",
    "issue",
    "issue_url",
    "source",
    "resume_branch",
    "resumed_from",
    "worktree",
    "pushed_remote",
    "commits",
    "follow_ups",
    "cancel_requested_by",
    "release_requested_by",
    "agent/agent",
    "agent/agent_session",
    "agent/cost_usd",
    "agent/tokens_in",
    "agent/tokens_out",
    "agent/session_from",
    "now",
];

/// Each command with `--json`: its name, where its job objects are (`[]`: each element; a
/// field name: that field), and the fields it documents. A path `a/b` is field `b` of field
/// `a`; `[]` is every element of an array, which must have at least one. A field whose value
/// is null is present; a field that is left out is missing.
const CONTRACT: &[(&str, Option<&str>, &[&str])] = &[
    ("enqueue", None, &["id", "added", "state"]),
    ("jobs", Some("[]"), &[]),
    (
        "show",
        Some("job"),
        &[
            "branch",
            "issue",
            "pull_request",
            "history",
            "deliveries",
            "review_loop",
            "log/from",
            "log/tail",
            "unroutable",
            "spend",
        ],
    ),
    // The job as it ended (one document; JSON lines or an array of them are taken too).
    ("watch", Some("[]"), &[]),
    (
        "status",
        None,
        &[
            "orchestrator",
            "counts/queued",
            "counts/running",
            "counts/failed",
            "counts/completed",
            "counts/dead",
            "counts/cancelled",
            "running",
            "waiting",
            "recent",
            "unroutable",
            "machines/[]/machine",
            "machines/[]/status",
            "limits/day/line",
            "limits/limits_paused",
            "limits_error",
        ],
    ),
    ("pause", None, &["machine", "state", "paused", "paused_until_unix_ms"]),
    ("resume", None, &["machine", "state", "paused", "paused_until_unix_ms"]),
    ("pause --limits", None, &["orchestrator", "limits_paused", "text"]),
    ("resume --limits", None, &["orchestrator", "limits_paused", "text"]),
    (
        "limits",
        None,
        &[
            "orchestrator",
            "this_account",
            "accounts/[]/account",
            "accounts/[]/label",
            "accounts/[]/state",
            "accounts/[]/held_until",
            "accounts/[]/spent_today_usd",
            "accounts/[]/cap_usd",
            "accounts/[]/line",
            "day/start_ms",
            "day/time_zone",
            "day/spent_usd",
            "day/cap_usd",
            "day/share",
            "day/line",
            "job_cap_usd",
            "limits_paused",
            "holds/[]/account",
            "holds/[]/until_at",
            "holds/[]/reason",
            "holds/[]/machine",
            "holds/[]/job_id",
            "holds/[]/held_at",
        ],
    ),
    ("limits set", None, &["file", "job_usd", "day_usd", "account_day_usd", "time_zone", "warn_at", "text"]),
    ("limits release", None, &["account", "released"]),
    ("limits no-resume", None, &["id", "resume_after_limit"]),
    (
        "handoff",
        None,
        &[
            "machine",
            "jobs/[]/id",
            "jobs/[]/title",
            "jobs/[]/branch",
            "jobs/[]/pushed",
            "jobs/[]/stayed",
            "safe",
            "paused",
            "text",
        ],
    ),
    (
        "doctor",
        None,
        &["ok", "problems", "warnings", "checks/[]/name", "checks/[]/status", "checks/[]/detail", "checks/[]/fix"],
    ),
    ("cancel", None, &["id", "outcome", "holder"]),
    ("requeue", None, &["id", "requeued", "let_go"]),
    ("release", None, &["machine", "handed_off", "released"]),
    ("sweep", None, &["released", "dead"]),
    ("prune", None, &["jobs", "machines", "files"]),
    ("worktrees", None, &["[]/id", "[]/path", "[]/state", "[]/kept", "[]/why"]),
    (
        "sources",
        None,
        &["orchestrator", "sources", "configured_here", "key_from", "github_token_from", "github_tokens_from_by_host"],
    ),
    ("sources add", None, &["name", "kind"]),
    ("sources remove", None, &["name", "kind"]),
    // Documented as JSON, with no fields named yet: they must parse.
    ("sources poll", None, &[]),
    ("logout", None, &[]),
];

/// What is missing at `path` in `v` (see [`CONTRACT`]), if anything.
fn missing(v: &Value, path: &[&str]) -> Option<String> {
    let (first, rest) = path.split_first()?;
    if *first == "[]" {
        return match v.as_array() {
            Some(items) if !items.is_empty() => items.iter().find_map(|item| missing(item, rest)),
            Some(_) => Some("an empty array: no element to check".into()),
            None => Some(format!("not an array: {v}")),
        };
    }
    match v.get(*first) {
        Some(inner) => missing(inner, rest),
        None => Some(format!("no field `{first}` in {v}")),
    }
}

fn parse(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// `watch --json`'s documents, as an array: one JSON document (or an array of them), or
/// JSON lines.
fn documents(out: &str) -> Value {
    match serde_json::from_str::<Value>(out) {
        Ok(v @ Value::Array(_)) => v,
        Ok(v) => Value::Array(vec![v]),
        Err(_) => Value::Array(out.lines().filter(|l| !l.trim().is_empty()).map(parse).collect()),
    }
}

/// The commands of [`CONTRACT`] checked so far.
#[derive(Default)]
struct Contract {
    checked: BTreeSet<&'static str>,
}

impl Contract {
    /// Runs `devpilot ARGS` (which ask for JSON) in `home` and checks what `name` printed
    /// against its row of [`CONTRACT`]; it must exit with one of `codes`. The JSON.
    fn run(&mut self, name: &'static str, home: &Path, url: &str, args: &[&str], codes: &[i32]) -> Value {
        let (code, out, err) = run_cli(home, url, args, None);
        assert!(codes.contains(&code), "{args:?} exited {code}:\n{out}\n{err}");
        self.check(name, &out)
    }

    fn check(&mut self, name: &'static str, out: &str) -> Value {
        let (_, jobs_at, fields) =
            CONTRACT.iter().find(|(n, ..)| *n == name).unwrap_or_else(|| panic!("{name} is not in the table"));
        let v = if name == "watch" { documents(out) } else { parse(out) };
        let mut paths: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        if let Some(at) = jobs_at {
            paths.extend(JOB.iter().map(|f| format!("{at}/{f}")));
        }
        for p in &paths {
            if let Some(why) = missing(&v, &p.split('/').collect::<Vec<_>>()) {
                panic!("`{name} --json` lacks {p}: {why}\n{v:#}");
            }
        }
        self.checked.insert(name);
        v
    }
}

async fn state_is(db: &TestDb, id: i64, state: JobState) -> bool {
    db.queue.job(id).await.unwrap().is_some_and(|(j, _)| j.state == state)
}

fn started(agent: &RecordingAgent, id: i64) -> bool {
    agent.records().iter().any(|r| r.kind == "start" && r.job == id)
}

/// `devpilot ARGS` in `home` with `env` set as well: (exit code, stdout, stderr).
fn run_env(home: &Path, url: &str, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut c = devpilot(home, url);
    let out = c.envs(env.iter().copied()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!e.contains("panicked") && !e.contains("RUST_BACKTRACE"), "no panic: {e}");
    (out.status.code().unwrap_or(-1), o, e)
}

const KEY: &str = "lin_api_TESTSECRET_contract_0a9b8c7d";

/// Every command of [`CONTRACT`] is run for real and its JSON has each field of its row: a
/// machine with a repo keeps a job's dirty worktree and runs a held job that is paused
/// around, handed off, cancelled and requeued; the maintenance commands run on that queue;
/// a Linear source (on the stand-in) is added, listed, polled and removed; `logout` runs on a
/// keychain of the test's own.
async fn every_json_output_has_its_documented_fields(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (root, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("json"));
    let remote = GitRemote::new(root);
    let clone = remote.clone_to(&root.join("src/web"));
    let home = root.join("m1");
    let repos = format!("[repos.web]\npath = \"{}\"\n", clone.display());
    write_config(&home, &repos);
    let agent = RecordingAgent::new(
        root,
        r#"case "$payload" in
  *hold*) sleep 60 & wait;;
  *dirty*) echo wip > notes.txt;;
esac
echo ok"#,
    );
    let mut c = Contract::default();
    let o = orch.as_str();

    let dirty = ["enqueue", "--orchestrator", o, "--title", "dirty work", "--repo", "web"];
    let args: Vec<&str> = dirty.into_iter().chain(["--payload", r#"{"do":"dirty"}"#, "--json"]).collect();
    let v = c.run("enqueue", &home, url, &args, &[0]);
    assert_eq!((v["added"].as_bool(), v["state"].as_str()), (Some(true), Some("queued")), "{v}");
    let dirty = v["id"].as_i64().unwrap();
    let _m = spawn_runner(&home, url, o, "laptop", &fast_flags(), &agent.script, &[]);
    assert!(wait_for(WAIT, || async { state_is(&db, dirty, JobState::Completed).await }).await);
    let held = enqueue(&home, &db, o, &["--title", "held work", "--payload", r#"{"do":"hold"}"#]);
    assert!(wait_for(WAIT, || async { started(&agent, held) }).await, "the held job runs");

    let v = c.run("jobs", &home, url, &["jobs", "--orchestrator", o, "--json"], &[0]);
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
    let v = c.run("show", &home, url, &["show", &dirty.to_string(), "--json"], &[0]);
    assert_eq!(v["job"]["id"].as_i64(), Some(dirty));
    c.run("status", &home, url, &["status", "--orchestrator", o, "--json"], &[0]);
    let v = c.run("watch", &home, url, &["watch", &dirty.to_string(), "--json"], &[0]);
    let last = v.as_array().and_then(|a| a.last()).cloned().unwrap_or_default();
    assert_eq!((last["id"].as_i64(), last["state"].as_str()), (Some(dirty), Some("completed")), "{v}");

    let sock = home.join("data/devpilot/control").join(format!("{o}.sock"));
    assert!(wait_for(WAIT, || async { sock.exists() }).await, "the machine listens on {}", sock.display());
    let v = c.run("pause", &home, url, &["pause", "--orchestrator", o, "--for", "30m", "--json"], &[0]);
    assert_eq!(v["paused"].as_bool(), Some(true), "{v}");
    let v = c.run("resume", &home, url, &["resume", "--orchestrator", o, "--json"], &[0]);
    assert_eq!((v["paused"].as_bool(), v["paused_until_unix_ms"].as_i64()), (Some(false), None), "{v}");
    let v = c.run("handoff", &home, url, &["handoff", "--orchestrator", o, "--json"], &[0]);
    assert_eq!(v["jobs"][0]["id"].as_i64(), Some(held), "{v}");
    assert_eq!((v["safe"].as_bool(), v["paused"].as_bool()), (Some(true), Some(true)), "{v}");
    assert!(state_is(&db, held, JobState::Queued).await);

    let v = c.run("worktrees", &home, url, &["worktrees", "--orchestrator", o, "--json"], &[0]);
    let kept = v.as_array().unwrap().iter().find(|w| w["id"].as_i64() == Some(dirty));
    assert_eq!(kept.map(|w| w["kept"].as_bool()), Some(Some(true)), "the dirty worktree is kept: {v}");
    let v = c.run("cancel", &home, url, &["cancel", &held.to_string(), "--json"], &[0]);
    assert_eq!((v["id"].as_i64(), v["outcome"].as_str()), (Some(held), Some("cancelled")), "{v}");
    let v = c.run("requeue", &home, url, &["requeue", &held.to_string(), "--json"], &[0]);
    assert_eq!((v["id"].as_i64(), v["requeued"].as_bool()), (Some(held), Some(true)), "{v}");
    // The laptop holds nothing now (it handed off): nothing to do, 0 or 4, and still JSON.
    let args = ["release", "--orchestrator", o, "--machine", "laptop", "--wait", "2s", "--json"];
    let v = c.run("release", &home, url, &args, &[0, 4]);
    assert_eq!(v["machine"].as_str(), Some("laptop"), "{v}");
    c.run("sweep", &home, url, &["sweep", "--orchestrator", o, "--json"], &[0]);
    c.run("prune", &home, url, &["prune", "--orchestrator", o, "--json"], &[0]);
    let v = c.run("doctor", &home, url, &["doctor", "--json"], &[0, 1]);
    assert!(v["ok"].is_boolean(), "{v}");

    sources_and_logout(&mut c, root, url, o, &repos);
    limits(&mut c, &db, &root.join("limits"), url).await;

    let all: BTreeSet<&str> = CONTRACT.iter().map(|(n, ..)| *n).collect();
    assert_eq!(c.checked, all, "every command of the table was run and checked");
}

/// The JSON of `sources add`, `sources`, `sources poll`, `sources remove` (a Linear source on
/// the stand-in, in a home of its own where no machine runs) and `logout`.
fn sources_and_logout(c: &mut Contract, root: &std::path::Path, url: &str, o: &str, repos: &str) {
    // A Linear source, in a home of its own (no machine runs there).
    let linear = LinearStandIn::start(KEY);
    let tracker = root.join("tracker");
    write_config(&tracker, repos);
    let lurl = linear.url();
    let add = [
        "sources",
        "add",
        "linear",
        "--team",
        "ENG",
        "--label",
        "agent",
        "--name",
        "eng",
        "--maps-to",
        "web",
        "--api-url",
        lurl.as_str(),
        "--no-test",
        "--orchestrator",
        o,
        "--json",
    ];
    let v = c.run("sources add", &tracker, url, &add, &[0]);
    assert_eq!((v["name"].as_str(), v["kind"].as_str()), (Some("eng"), Some("linear")), "{v}");
    let v = c.run("sources", &tracker, url, &["sources", "--orchestrator", o, "--json"], &[0]);
    assert!(v["configured_here"].to_string().contains("eng"), "{v}");
    let (code, out, err) =
        run_env(&tracker, url, &[("LINEAR_API_KEY", KEY)], &["sources", "poll", "--orchestrator", o, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    c.check("sources poll", &out);
    let v = c.run("sources remove", &tracker, url, &["sources", "remove", "eng", "--orchestrator", o, "--json"], &[0]);
    assert_eq!((v["name"].as_str(), v["kind"].as_str()), (Some("eng"), Some("linear")), "{v}");

    // `logout` in a keychain of the test's own, with nothing stored: exit 4, and its JSON.
    let keys = SecretService::start(&root.join("keychain"));
    let mut cmd = devpilot(&tracker, url);
    keys.apply(&mut cmd).args(["logout", "--linear", "--json"]);
    let out = cmd.output().unwrap();
    let (said, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "nothing stored: {said}{err}");
    c.check("logout", &said);
}

/// The JSON of `limits set`, `limits` (with an account held by the store, as a usage limit's
/// park holds it), `limits no-resume`, `limits release`, `pause --limits` and `resume
/// --limits`, in a home and a queue of their own (no machine runs there).
async fn limits(c: &mut Contract, db: &TestDb, home: &Path, url: &str) {
    let orch = db.orch("limits");
    let o = orch.as_str();
    let v = c.run("limits set", home, url, &["limits", "set", "--day", "20", "--time-zone", "UTC", "--json"], &[0]);
    assert_eq!((v["day_usd"].as_f64(), v["time_zone"].as_str()), (Some(20.0), Some("UTC")), "{v}");
    let id = enqueue(home, db, o, &["--title", "hits a limit"]);
    let claim = db.queue.claim_next(o, "laptop", 1).await.unwrap().remove(0);
    assert!(db.queue.record_agent_start(&claim.fence, "claude", None, Some("claude:work")).await.unwrap());
    let until = db.queue.now_ms().await.unwrap() + 3_600_000;
    let park = GovernedPark {
        parked_for: ParkedFor::Limit,
        until_ms: until,
        reason: "claude hit a usage limit",
        hold: Some("claude:work"),
        resume_branch: None,
    };
    assert!(db.queue.park_governed(&claim.fence, "laptop", &park).await.unwrap().is_some());
    let v = c.run("limits", home, url, &["limits", "--orchestrator", o, "--json"], &[0]);
    assert_eq!((v["holds"][0]["job_id"].as_i64(), v["accounts"][0]["held_until"].as_i64()), (Some(id), Some(until)));
    let v = c.run("limits no-resume", home, url, &["limits", "no-resume", &id.to_string(), "--json"], &[0]);
    assert_eq!(v["resume_after_limit"].as_bool(), Some(false), "{v}");
    let args = ["limits", "release", "claude:work", "--orchestrator", o, "--json"];
    let v = c.run("limits release", home, url, &args, &[0]);
    assert_eq!(v["released"].as_bool(), Some(true), "{v}");
    let v = c.run("pause --limits", home, url, &["pause", "--limits", "--orchestrator", o, "--json"], &[0]);
    assert_eq!(v["limits_paused"].as_bool(), Some(true), "{v}");
    let v = c.run("resume --limits", home, url, &["resume", "--limits", "--orchestrator", o, "--json"], &[0]);
    assert_eq!(v["limits_paused"].as_bool(), Some(false), "{v}");
}

/// Runs `devpilot ARGS` with `url`, which must exit `want`; an error (1, 3 and 5) says so on
/// a line starting `error: `. Records the code in `seen`. (stdout, stderr).
fn expect(seen: &mut BTreeSet<i32>, home: &Path, url: &str, args: &[&str], want: i32) -> (String, String) {
    let (code, out, err) = run_cli(home, url, args, None);
    assert_eq!(code, want, "{args:?}:\n{out}\n{err}");
    if matches!(want, 1 | 3 | 5) {
        assert!(err.lines().any(|l| l.starts_with("error: ")), "{args:?}: an `error: ` line:\n{err}");
    }
    seen.insert(code);
    (out, err)
}

/// Each documented exit code comes out where the documentation says: 0 success, 1 an
/// unreachable database, 2 an unknown flag, 3 no such job (show, watch, logs, cancel,
/// requeue; `open` of a job with neither pull request nor issue), 4 nothing to do (`enqueue
/// --key` finding the live job, whose id it still prints; cancel of a finished job; requeue
/// of a queued one), 5 no running machine here (pause, resume, handoff), 6 `watch` of a dead
/// job, 7 `watch` of a cancelled one.
async fn every_exit_code_is_produced(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("codes"));
    let o = orch.as_str();
    let mut seen = BTreeSet::new();

    expect(&mut seen, home, url, &["jobs", "--orchestrator", o, "--json"], 0);
    let (_, err) = expect(&mut seen, home, "postgres://nobody@127.0.0.1:1/x", &["jobs", "--orchestrator", o], 1);
    assert!(err.contains("127.0.0.1:1"), "names the database: {err}");
    let (_, err) = expect(&mut seen, home, url, &["jobs", "--bogus"], 2);
    assert!(err.contains("--bogus"), "{err}");

    for args in [
        vec!["show", "999999"],
        vec!["watch", "999999"],
        vec!["logs", "999999"],
        vec!["cancel", "999999"],
        vec!["requeue", "999999"],
    ] {
        let (_, err) = expect(&mut seen, home, url, &args, 3);
        assert!(err.contains("999999"), "{args:?}: {err}");
    }
    let plain = enqueue(home, &db, o, &["--title", "nothing to open"]);
    expect(&mut seen, home, url, &["open", &plain.to_string(), "--print"], 3);

    let keyed = ["enqueue", "--orchestrator", o, "--key", "linear:ENG-7", "--title", "ENG-7"];
    let (out, _) = expect(&mut seen, home, url, &[&keyed[..], &["--json"][..]].concat(), 0);
    let first = parse(&out);
    assert_eq!(first["added"].as_bool(), Some(true), "{first}");
    let id = first["id"].as_i64().unwrap();
    let (out, _) = expect(&mut seen, home, url, &[&keyed[..], &["--json"][..]].concat(), 4);
    let again = parse(&out);
    assert_eq!(
        (again["id"].as_i64(), again["added"].as_bool(), again["state"].as_str()),
        (Some(id), Some(false), Some("queued")),
        "the live job: {again}"
    );
    let (out, _) = expect(&mut seen, home, url, &keyed, 4);
    assert_eq!(out.trim(), id.to_string(), "the id still printed on stdout");
    assert_eq!(db.queue.counts(o).await.unwrap().queued, 2, "nothing was added");
    expect(&mut seen, home, url, &["requeue", &id.to_string()], 4);
    expect(&mut seen, home, url, &["cancel", &id.to_string()], 0);
    expect(&mut seen, home, url, &["cancel", &id.to_string()], 4);

    for verb in ["pause", "resume", "handoff"] {
        expect(&mut seen, home, url, &[verb, "--orchestrator", o], 5);
    }

    // A dead job: its one attempt failed.
    let dead_orch = db.orch("dead");
    let dead = enqueue(home, &db, &dead_orch, &["--title", "dies", "--max-attempts", "1"]);
    let claims = db.queue.claim_next(&dead_orch, "m", 1).await.unwrap();
    assert_eq!(claims.len(), 1);
    db.queue.fail(&claims[0].fence, "m", "exit 1").await.unwrap();
    assert!(state_is(&db, dead, JobState::Dead).await);
    expect(&mut seen, home, url, &["watch", &dead.to_string()], 6);
    expect(&mut seen, home, url, &["watch", &id.to_string()], 7);

    assert_eq!(seen, (0..=7).collect::<BTreeSet<i32>>(), "every documented exit code");
}

/// The note `devpilot` prints when no queue is set anywhere.
const NOTE: &str = "note: using the default queue 'personal' (set orchestrator_id in the config, \
                    DEVPILOT_ORCHESTRATOR or --orchestrator)";

/// With no --orchestrator, no DEVPILOT_ORCHESTRATOR and no config, a command uses the queue
/// `personal` and says so in one note on stderr; `orchestrator_id = "team"` in the config is
/// used with no note; DEVPILOT_ORCHESTRATOR beats the config and the global --orchestrator
/// (before or after the verb) beats both.
async fn the_queue_is_the_flag_then_the_environment_then_the_config_then_personal(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (root, url) = (db.dir.path(), db.raw_url.as_str());
    let queue_of = |id: i64| {
        let q = db.queue.clone();
        async move { q.job(id).await.unwrap().unwrap().0.orchestrator_id }
    };
    let id_of = |code: i32, out: &str, err: &str| -> i64 {
        assert_eq!(code, 0, "{out}{err}");
        out.trim().parse().unwrap_or_else(|_| panic!("an id: {out}"))
    };
    let notes = |err: &str| err.lines().filter(|l| l.contains("using the default queue")).count();

    let bare = root.join("bare");
    let (code, out, err) = run_cli(&bare, url, &["enqueue", "--title", "where does it go"], None);
    let id = id_of(code, &out, &err);
    assert_eq!(queue_of(id).await, "personal");
    assert_eq!(notes(&err), 1, "one note: {err}");
    assert!(err.lines().any(|l| l == NOTE), "the note says how to choose: {err}");
    let (code, out, err) = run_cli(&bare, url, &["jobs", "--json"], None);
    assert_eq!(code, 0, "{err}");
    assert!(parse(&out).to_string().contains(&format!("\"id\":{id}")), "`jobs` lists personal's job: {out}");
    assert_eq!(notes(&err), 1, "{err}");

    let flagged = db.orch("flagged");
    for args in [
        vec!["--orchestrator", flagged.as_str(), "enqueue", "--title", "before"],
        vec!["enqueue", "--title", "after", "--orchestrator", flagged.as_str()],
    ] {
        let (code, out, err) = run_cli(&bare, url, &args, None);
        let id = id_of(code, &out, &err);
        assert_eq!(queue_of(id).await, flagged, "{args:?}");
        assert_eq!(notes(&err), 0, "{args:?}: {err}");
    }
    let from_env = db.orch("env");
    let env = [("DEVPILOT_ORCHESTRATOR", from_env.as_str())];
    let (code, out, err) = run_env(&bare, url, &env, &["enqueue", "--title", "from the environment"]);
    let id = id_of(code, &out, &err);
    assert_eq!((queue_of(id).await, notes(&err)), (from_env.clone(), 0), "{err}");

    let team = root.join("team");
    write_config(&team, "orchestrator_id = \"team\"\n");
    let (code, out, err) = run_cli(&team, url, &["enqueue", "--title", "for the team"], None);
    let id = id_of(code, &out, &err);
    assert_eq!((queue_of(id).await, notes(&err)), ("team".to_string(), 0), "{err}");
    assert!(!err.contains("note:"), "{err}");
    let (code, out, err) = run_env(&team, url, &env, &["enqueue", "--title", "the environment wins"]);
    let id = id_of(code, &out, &err);
    assert_eq!(queue_of(id).await, from_env, "DEVPILOT_ORCHESTRATOR beats the config");
    let (code, out, err) =
        run_env(&team, url, &env, &["--orchestrator", flagged.as_str(), "enqueue", "--title", "the flag wins"]);
    let id = id_of(code, &out, &err);
    assert_eq!(queue_of(id).await, flagged, "--orchestrator beats both");
}

/// Plays bash's completion of `words` (the last one is the word being completed) with the
/// `script` that `devpilot completions bash` printed, `devpilot` first on PATH, in `home`'s
/// environment: what bash offers.
fn bash_complete(home: &Path, url: &str, script: &Path, words: &[&str]) -> Vec<String> {
    const DRIVER: &str = r#"
source "$1" || exit 90
spec=$(complete -p devpilot) || exit 91
fn=${spec##*-F }
fn=${fn%% *}
shift
COMP_WORDS=("$@")
COMP_CWORD=$(( $# - 1 ))
COMP_LINE="$*"
COMP_POINT=${#COMP_LINE}
COMP_TYPE=9
COMP_KEY=9
"$fn" devpilot "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    // The environment `devpilot` gets in `home` (config, data, database), for bash and the
    // `devpilot` its completion runs.
    let template = devpilot(home, url);
    let mut c = Command::new("bash");
    for (k, v) in template.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let bin = devpilot_bin().parent().unwrap().to_path_buf();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::iter::once(bin).chain(std::env::split_paths(&path)).collect();
    c.env("PATH", std::env::join_paths(dirs).unwrap());
    c.args(["--norc", "--noprofile", "-c", DRIVER, "bash"]).arg(script).args(words).stdin(Stdio::null());
    let out = c.output().expect("run bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bash completing {words:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// Every file under `dir` whose name says it is a database.
fn databases_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n.to_string_lossy().contains("sqlite")) {
                found.push(p);
            }
        }
    }
    found
}

/// `devpilot completions bash`, sourced in bash, completes `show`'s and `logs`' argument to
/// the ids of the queue's jobs, `sources remove`'s to the configured sources, `jobs --repo`'s
/// to the configured repos and `run --agent`'s to the presets, all through `devpilot
/// __complete jobs|sources|repos|presets` (one value a line). On a data dir with no database,
/// `__complete` prints nothing to complete and creates no database file.
async fn completions_complete_ids_and_names_and_never_create_a_database(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (root, url, orch) = (db.dir.path(), db.raw_url.as_str(), db.orch("complete"));
    let home = root.join("shell");
    write_config(
        &home,
        &format!(
            "orchestrator_id = \"{orch}\"\n\
             [repos.web]\npath = \"{}\"\n\
             [sources.eng]\nkind = \"linear\"\nteams = [\"ENG\"]\nlabel = \"agent\"\nno_repo = true\n\
             [sources.webapp]\nkind = \"github\"\nrepo = \"acme/webapp\"\nlabel = \"agent\"\n",
            root.join("src/web").display()
        ),
    );
    let ids: BTreeSet<String> =
        ["first", "second"].iter().map(|t| enqueue(&home, &db, &orch, &["--title", t]).to_string()).collect();

    let complete = |what: &str| {
        let (code, out, err) = run_cli(&home, url, &["__complete", what], None);
        assert_eq!(code, 0, "__complete {what}: {err}");
        out.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect::<BTreeSet<String>>()
    };
    assert!(complete("jobs").is_superset(&ids), "{:?}", complete("jobs"));
    assert_eq!(complete("sources"), BTreeSet::from(["eng".to_string(), "webapp".to_string()]));
    assert_eq!(complete("repos"), BTreeSet::from(["web".to_string()]));
    let presets = complete("presets");
    for p in ["claude", "codex", "aider", "gemini"] {
        assert!(presets.contains(p), "{p}: {presets:?}");
    }

    let (code, script, err) = run_cli(&home, url, &["completions", "bash"], None);
    assert_eq!(code, 0, "{err}");
    let script_file = root.join("devpilot.bash");
    std::fs::write(&script_file, script).unwrap();
    let offered = |words: &[&str]| bash_complete(&home, url, &script_file, words).into_iter().collect::<BTreeSet<_>>();
    for verb in ["show", "logs"] {
        let got = offered(&["devpilot", verb, ""]);
        assert!(got.is_superset(&ids), "`devpilot {verb} <TAB>` offers the job ids {ids:?}: {got:?}");
    }
    let got = offered(&["devpilot", "sources", "remove", ""]);
    assert!(got.contains("eng") && got.contains("webapp"), "{got:?}");
    let got = offered(&["devpilot", "jobs", "--repo", ""]);
    assert!(got.contains("web"), "{got:?}");
    let got = offered(&["devpilot", "run", "--agent", ""]);
    assert!(got.contains("claude") && got.contains("gemini"), "{got:?}");

    // No database anywhere: the embedded default is not created to complete a word.
    let fresh = root.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    for what in ["jobs", "sources", "repos", "presets"] {
        let mut c = devpilot(&fresh, url);
        c.env_remove("DEVPILOT_DATABASE_URL").args(["__complete", what]);
        let out = c.output().unwrap();
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "__complete {what} with no database: {o}{e}");
        assert!(!e.contains("panicked"), "{e}");
        if what != "presets" {
            assert!(o.trim().is_empty(), "nothing to complete: {o}");
        }
    }
    assert!(!fresh.join("data/devpilot/devpilot.sqlite").exists(), "the default database was not created");
    assert_eq!(databases_under(&fresh), Vec::<PathBuf>::new(), "no database file at all");
}
