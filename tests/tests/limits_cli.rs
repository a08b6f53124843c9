//! The governor through the `devpilot` command line, as real processes on every backend: the
//! caps set in one line (`limits set`) are in this machine's config file and in `status
//! --json`, and a bad value leaves the file as it was; `pause --limits` and `resume --limits`
//! flip the fleet's switch in the database, with no machine running; a hold written by the
//! store shows in `devpilot limits` until `limits release` ends it; `limits no-resume` keeps a
//! job parked on a limit for a person and `auto-resume` undoes it; `requeue` lets a job
//! parked at its cap go; `show` gives each attempt's spend against the cap. Time passes by
//! choosing the parks' times, never by sleeping.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use devpilot_engine::governor::{clock_of, TimeZone};
use devpilot_store::queue::{Claim, GovernedPark, ParkedFor, Usage};
use devpilot_tests::{enqueue, run_cli, write_config, Backend, TestDb};
use serde_json::Value;

devpilot_tests::on_every_backend!(
    caps_set_in_one_line_are_in_the_file_and_in_status,
    a_bad_value_is_refused_and_the_file_is_left_as_it_was,
    pause_limits_flips_the_fleets_switch_in_the_database,
    a_hold_shows_until_when_and_release_ends_it,
    no_resume_keeps_a_limit_parked_job_for_a_person,
    requeue_lets_a_job_parked_at_its_cap_go_and_show_gives_its_spend,
    status_prints_the_rest_when_the_limits_cannot_be_read,
);

const HOUR: i64 = 3_600_000;
const WORK: &str = "claude:work";

/// `devpilot ARGS`, which must exit `want`: (stdout, stderr).
fn cli(home: &Path, url: &str, args: &[&str], want: i32) -> (String, String) {
    let (code, out, err) = run_cli(home, url, args, None);
    assert_eq!(code, want, "{args:?}:\n{out}\n{err}");
    (out, err)
}

fn parse(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn config_file(home: &Path) -> std::path::PathBuf {
    home.join("config/devpilot/config.toml")
}

/// The `[limits]` table of `home`'s config file.
fn limits_table(home: &Path) -> toml::Table {
    let text = std::fs::read_to_string(config_file(home)).unwrap();
    let t: toml::Table = text.parse().unwrap();
    t.get("limits").and_then(|l| l.as_table()).cloned().unwrap_or_default()
}

/// `status --json`'s `limits`, which must have been read.
fn status_limits(home: &Path, url: &str, orch: &str) -> Value {
    let v = parse(&cli(home, url, &["status", "--orchestrator", orch, "--json"], 0).0);
    assert!(v["limits_error"].is_null(), "{v:#}");
    v["limits"].clone()
}

/// Job `id`, claimed by `machine`, whose agent started as `account`.
async fn started(db: &TestDb, orch: &str, machine: &str, account: &str) -> Claim {
    let c = db.queue.claim_next(orch, machine, 1).await.unwrap().remove(0);
    assert!(db.queue.record_agent_start(&c.fence, "claude", None, Some(account)).await.unwrap());
    c
}

fn park<'a>(parked_for: ParkedFor, until_ms: i64, reason: &'a str, hold: Option<&'a str>) -> GovernedPark<'a> {
    GovernedPark { parked_for, until_ms, reason, hold, resume_branch: None }
}

/// The ids a machine claims now.
async fn claims(db: &TestDb, orch: &str, machine: &str) -> Vec<i64> {
    db.queue.claim_next(orch, machine, 10).await.unwrap().into_iter().map(|c| c.fence.job).collect()
}

/// `limits set` writes each cap, the zone and the warning share into `[limits]` of this
/// machine's config file (its other tables kept), says what it set, and `status --json`
/// reads them back; `--off` removes a cap from the file and from `status`.
async fn caps_set_in_one_line_are_in_the_file_and_in_status(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path().join("m"), db.raw_url.as_str(), db.orch("caps"));
    write_config(&home, "[repos.web]\npath = \"/srv/web\"\n");
    let args = [
        "limits",
        "set",
        "--job",
        "2",
        "--day",
        "$20",
        "--account-day",
        "10.5",
        "--time-zone",
        "Europe/Paris",
        "--warn-at",
        "0.9",
    ];
    let (out, _) = cli(&home, url, &args, 0);
    assert!(out.contains("the fleet's daily cap is now $20.00"), "{out}");
    assert!(out.contains("each machine enforces the caps in its own config: set the same on every machine"), "{out}");
    let t = limits_table(&home);
    assert_eq!(
        (t["job_usd"].as_float(), t["day_usd"].as_float(), t["account_day_usd"].as_float()),
        (Some(2.0), Some(20.0), Some(10.5)),
        "{t:?}"
    );
    assert_eq!((t["time_zone"].as_str(), t["warn_at"].as_float()), (Some("Europe/Paris"), Some(0.9)));
    let text = std::fs::read_to_string(config_file(&home)).unwrap();
    assert!(text.contains("[repos.web]") && text.contains("/srv/web"), "the other tables stay: {text}");

    let l = status_limits(&home, url, &orch);
    assert_eq!((l["job_cap_usd"].as_f64(), l["day"]["cap_usd"].as_f64()), (Some(2.0), Some(20.0)), "{l:#}");
    assert_eq!((l["day"]["time_zone"].as_str(), l["limits_paused"].as_bool()), (Some("Europe/Paris"), Some(false)));
    let (out, _) = cli(&home, url, &["status", "--orchestrator", &orch], 0);
    assert!(out.contains("limits:") && out.contains("of $20.00") && out.contains("each job: at most $2.00"), "{out}");

    let (out, _) = cli(&home, url, &["limits", "set", "--off", "day", "--off", "job"], 0);
    assert!(out.contains("the fleet has no daily cap now"), "{out}");
    let t = limits_table(&home);
    assert!(!t.contains_key("day_usd") && !t.contains_key("job_usd"), "{t:?}");
    assert_eq!(t["account_day_usd"].as_float(), Some(10.5), "what --off did not name stays");
    let l = status_limits(&home, url, &orch);
    assert!(l["day"]["cap_usd"].is_null() && l["job_cap_usd"].is_null(), "{l:#}");
}

/// A cap that is not a positive amount and a zone the machine does not know each exit 2
/// with a message that names the value, and the config file is byte for byte as it was; so
/// does a cap given and turned off at once.
async fn a_bad_value_is_refused_and_the_file_is_left_as_it_was(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url) = (db.dir.path().join("m"), db.raw_url.as_str());
    let before = "# my settings\n[limits]\nday_usd = 5.0\n";
    write_config(&home, before);
    for (args, named) in [
        (vec!["limits", "set", "--day", "-3"], "day_usd = -3"),
        (vec!["limits", "set", "--job", "0"], "job_usd = 0"),
        (vec!["limits", "set", "--time-zone", "Mars/Olympus"], "'Mars/Olympus'"),
        (vec!["limits", "set", "--warn-at", "1.5"], "warn_at"),
        (vec!["limits", "set", "--day", "lots"], "'lots'"),
        (vec!["limits", "set", "--day", "3", "--off", "day"], "--off day"),
        (vec!["limits", "set"], "nothing to set"),
    ] {
        let (_, err) = cli(&home, url, &args, 2);
        assert!(err.contains(named), "{args:?} names {named}: {err}");
        assert_eq!(std::fs::read_to_string(config_file(&home)).unwrap(), before, "{args:?} left the file");
    }
}

/// `pause --limits` sets the fleet's switch in the database with no machine running (two
/// homes, two "machines", both see it in `status --json`), `resume --limits` clears it, and
/// a second `resume --limits` has nothing to do (exit 4).
async fn pause_limits_flips_the_fleets_switch_in_the_database(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (laptop, desktop) = (db.dir.path().join("laptop"), db.dir.path().join("desktop"));
    let (url, orch) = (db.raw_url.as_str(), db.orch("switch"));
    let o = orch.as_str();
    assert_eq!(status_limits(&laptop, url, o)["limits_paused"].as_bool(), Some(false));
    let (out, _) = cli(&laptop, url, &["pause", "--limits", "--orchestrator", o], 0);
    assert_eq!(
        out.trim(),
        "Jobs parked on a usage limit now wait for a person, on every machine (devpilot resume --limits to undo)."
    );
    for home in [&laptop, &desktop] {
        assert_eq!(status_limits(home, url, o)["limits_paused"].as_bool(), Some(true), "{}", home.display());
    }
    let (out, _) = cli(&desktop, url, &["status", "--orchestrator", o], 0);
    assert!(out.contains("jobs parked on a usage limit wait for a person"), "{out}");
    let v = parse(&cli(&desktop, url, &["resume", "--limits", "--orchestrator", o, "--json"], 0).0);
    assert_eq!(v["limits_paused"].as_bool(), Some(false), "{v}");
    assert_eq!(status_limits(&laptop, url, o)["limits_paused"].as_bool(), Some(false));
    let (_, err) = cli(&laptop, url, &["resume", "--limits", "--orchestrator", o], 4);
    assert!(err.contains("already resume by themselves"), "{err}");
}

/// A usage limit's hold, written by the store with its park, shows in `devpilot limits` as
/// "limited until HH:MM" with who set it, for which job and why (and in `limits --json` and
/// `status --json`); `limits release ACCOUNT` ends it (exit 0), and a second release finds
/// none (exit 1).
async fn a_hold_shows_until_when_and_release_ends_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path().join("m"), db.raw_url.as_str(), db.orch("hold"));
    let o = orch.as_str();
    write_config(&home, "[limits]\ntime_zone = \"UTC\"\n");
    let id = enqueue(&home, &db, o, &["--title", "hits a limit"]);
    let c = started(&db, o, "laptop", WORK).await;
    let now = db.queue.now_ms().await.unwrap();
    let until = now + 2 * HOUR;
    let p = park(ParkedFor::Limit, until, "claude hit a usage limit", Some(WORK));
    assert!(db.queue.park_governed(&c.fence, "laptop", &p).await.unwrap().is_some());

    let (out, _) = cli(&home, url, &["limits", "--orchestrator", o], 0);
    let clock = clock_of(until, now, &TimeZone::get("UTC").unwrap());
    assert!(out.contains(&format!("claude · work: limited until {clock}")), "{out}");
    assert!(out.contains(&format!("held by laptop for #{id}")) && out.contains("claude hit a usage limit"), "{out}");
    assert!(out.contains("devpilot limits release claude:work"), "{out}");
    let v = parse(&cli(&home, url, &["limits", "--orchestrator", o, "--json"], 0).0);
    assert_eq!((v["holds"][0]["account"].as_str(), v["holds"][0]["job_id"].as_i64()), (Some(WORK), Some(id)), "{v}");
    assert_eq!(v["accounts"][0]["state"].as_str(), Some("limited"), "{v}");
    assert_eq!(status_limits(&home, url, o)["accounts"][0]["held_until"].as_i64(), Some(until));

    let (out, _) = cli(&home, url, &["limits", "release", WORK, "--orchestrator", o], 0);
    assert!(out.contains("ended the hold on claude · work"), "{out}");
    let (_, err) = cli(&home, url, &["limits", "release", WORK, "--orchestrator", o], 1);
    assert!(err.contains("is not held") && err.contains("none"), "{err}");
    let v = parse(&cli(&home, url, &["limits", "--orchestrator", o, "--json"], 0).0);
    assert_eq!(v["holds"].as_array().map(Vec::len), Some(0), "{v}");
}

/// `limits no-resume N` keeps job N, parked on a limit whose hold has passed, from every
/// claim (its flag is 0 in the row); `limits auto-resume N` makes it claimable again. A job
/// that is not live exits 1, a missing one 3; `enqueue --no-resume-after-limit` adds a job
/// with the flag off.
async fn no_resume_keeps_a_limit_parked_job_for_a_person(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path().join("m"), db.raw_url.as_str(), db.orch("noresume"));
    let o = orch.as_str();
    let id = enqueue(&home, &db, o, &["--title", "parked on a limit"]);
    let c = started(&db, o, "laptop", WORK).await;
    let now = db.queue.now_ms().await.unwrap();
    let p = park(ParkedFor::Limit, now, "claude hit a usage limit", None);
    assert!(db.queue.park_governed(&c.fence, "laptop", &p).await.unwrap().is_some());

    let (out, _) = cli(&home, url, &["limits", "no-resume", &id.to_string()], 0);
    assert!(out.contains("waits for a person"), "{out}");
    let flag = format!("SELECT CAST(resume_after_limit AS BIGINT) FROM dispatch_queue WHERE id = {id}");
    assert_eq!(db.scalar(&flag).await, Some(0));
    assert_eq!(claims(&db, o, "desktop").await, Vec::<i64>::new(), "it waits for a person");
    cli(&home, url, &["limits", "auto-resume", &id.to_string()], 0);
    assert_eq!(db.scalar(&flag).await, Some(1));
    assert_eq!(claims(&db, o, "desktop").await, vec![id], "it resumes by itself");

    let done = enqueue(&home, &db, o, &["--title", "cancelled"]);
    cli(&home, url, &["cancel", &done.to_string()], 0);
    let (_, err) = cli(&home, url, &["limits", "no-resume", &done.to_string()], 1);
    assert!(err.contains("is cancelled"), "{err}");
    cli(&home, url, &["limits", "no-resume", "999999"], 3);
    let flagged = enqueue(&home, &db, o, &["--title", "for a person", "--no-resume-after-limit"]);
    let flag = format!("SELECT CAST(resume_after_limit AS BIGINT) FROM dispatch_queue WHERE id = {flagged}");
    assert_eq!(db.scalar(&flag).await, Some(0));
}

/// A job parked at its own cap is claimed by no machine; `show` gives its attempt's spend
/// against the cap (text and `spend` in JSON); `requeue N` lets it go, and a machine claims
/// it at once.
async fn requeue_lets_a_job_parked_at_its_cap_go_and_show_gives_its_spend(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path().join("m"), db.raw_url.as_str(), db.orch("jobcap"));
    let o = orch.as_str();
    write_config(&home, "[limits]\njob_usd = 0.05\n");
    let id = enqueue(&home, &db, o, &["--title", "spends too much"]);
    let c = started(&db, o, "laptop", WORK).await;
    let usage = Usage { cost_usd: Some(0.04), ..Default::default() };
    assert!(db.queue.record_agent_usage(&c.fence, &usage).await.unwrap());
    let now = db.queue.now_ms().await.unwrap();
    let p = park(ParkedFor::JobCap, now, "its $0.05 cap was reached", None);
    assert!(db.queue.park_governed(&c.fence, "laptop", &p).await.unwrap().is_some());
    assert_eq!(claims(&db, o, "desktop").await, Vec::<i64>::new(), "a job cap waits for a person");

    let (out, _) = cli(&home, url, &["show", &id.to_string()], 0);
    assert!(out.contains("spend     $0.04 (attempt 1 on laptop, claude · work); cap $0.05"), "{out}");
    let v = parse(&cli(&home, url, &["show", &id.to_string(), "--json"], 0).0);
    let s = &v["spend"];
    assert_eq!((s["total_usd"].as_f64(), s["cap_usd"].as_f64()), (Some(0.04), Some(0.05)), "{v:#}");
    assert_eq!(s["attempts"][0]["machine"].as_str(), Some("laptop"), "{v:#}");

    let (out, _) = cli(&home, url, &["requeue", &id.to_string()], 0);
    assert!(out.contains(&format!("let #{id} go past its spend cap / hold; claimable now")), "{out}");
    assert_eq!(claims(&db, o, "desktop").await, vec![id], "claimable now");
}

/// When the limits cannot be read (here: a database whose holds table is gone), `status`
/// still prints the queue and exits 0, and says why the limits are missing, as text and as
/// `limits_error` beside a null `limits` in JSON.
async fn status_prints_the_rest_when_the_limits_cannot_be_read(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (home, url, orch) = (db.dir.path().join("m"), db.raw_url.as_str(), db.orch("nolimits"));
    let o = orch.as_str();
    let id = enqueue(&home, &db, o, &["--title", "still counted"]);
    db.exec("DROP TABLE account_holds").await;
    let (out, _) = cli(&home, url, &["status", "--orchestrator", o], 0);
    assert!(out.contains("queued 1") && out.contains("limits: cannot be read: "), "{out}");
    let v = parse(&cli(&home, url, &["status", "--orchestrator", o, "--json"], 0).0);
    assert_eq!((v["counts"]["queued"].as_i64(), v["recent"][0]["id"].as_i64()), (Some(1), Some(id)), "{v:#}");
    assert!(v["limits"].is_null() && v["limits_error"].as_str().is_some_and(|e| !e.is_empty()), "{v:#}");
}
