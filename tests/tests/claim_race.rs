//! The article's five-way race on one row, between separate OS processes: five `devpilot
//! claim` commands, each with its own connection already open, are released at once. On
//! PostgreSQL, SQLite and PostgreSQL through PgBouncer.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use devpilot_tests::{devpilot, Backend, TestDb};
use serde_json::json;

devpilot_tests::on_every_backend!(five_processes_race_for_one_row_and_one_wins);

const CLAIMERS: usize = 5;
const ROUNDS: usize = 20;

/// One `devpilot claim --wait-stdin` process, past its `ready` line.
struct Claimer {
    machine: String,
    child: Child,
    stdout: BufReader<ChildStdout>,
}

/// What a claimer said and how it exited.
#[derive(Debug)]
struct Answer {
    machine: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Starts a claimer of job `id` and waits (on its own pipe) for its `ready`: its queue, and
/// so its connection, is open.
fn ready_claimer(db: &TestDb, orch: &str, machine: &str, id: i64) -> Claimer {
    let mut child = devpilot(db.dir.path(), &db.raw_url)
        .args(["claim", "--orchestrator", orch, "--machine", machine, "--wait-stdin", &id.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn devpilot claim");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read ready");
    if line.trim() != "ready" {
        let _ = child.kill();
        let mut err = String::new();
        let _ = child.stderr.take().expect("stderr").read_to_string(&mut err);
        panic!("{machine} did not get ready: stdout {line:?}, stderr {err}");
    }
    Claimer { machine: machine.to_string(), child, stdout }
}

fn answer(mut c: Claimer) -> Answer {
    let mut stdout = String::new();
    c.stdout.read_to_string(&mut stdout).expect("read stdout");
    let mut stderr = String::new();
    c.child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
    let code = c.child.wait().expect("wait").code();
    Answer { machine: c.machine, code, stdout, stderr }
}

/// When a claimer's statement was sent and when its answer came: its `statement START END`
/// line on stderr (ns since the epoch).
fn span(a: &Answer) -> (u128, u128) {
    let line = a.stderr.lines().find_map(|l| l.strip_prefix("statement ")).unwrap_or_else(|| panic!("no span: {a:#?}"));
    let mut f = line.split_whitespace().map(|n| n.parse::<u128>().unwrap_or_else(|_| panic!("bad span: {a:#?}")));
    let (start, end) = (f.next().unwrap(), f.next().unwrap());
    assert!(start <= end, "{a:#?}");
    (start, end)
}

/// Whether the five statements were all in flight at one instant: the last to be sent went
/// out before the first answer came back.
fn all_in_flight_together(answers: &[Answer]) -> bool {
    let spans: Vec<(u128, u128)> = answers.iter().map(span).collect();
    spans.iter().map(|s| s.0).max() < spans.iter().map(|s| s.1).min()
}

/// Whether the winner's statement was in flight together with a loser's: the row was
/// really contended, not claimed and then merely found taken.
fn winner_met_a_loser(winner: &Answer, losers: &[&Answer]) -> bool {
    let w = span(winner);
    losers.iter().map(|a| span(a)).any(|l| l.0 < w.1 && w.0 < l.1)
}

/// Twenty rounds: a new job, five `devpilot claim` processes that all said `ready`, released
/// back to back; exactly one prints `claimed ID 1` (exit 0), four print `lost ID` (exit 3),
/// none errs, and the job's history holds exactly one `claimed` event, the winner's. By the
/// claimers' own clocks, the winner's statement met a loser's in most rounds, and in some all
/// five were in flight at once: the one winner is the database's doing, not the order the
/// processes happened to run in.
async fn five_processes_race_for_one_row_and_one_wins(backend: Backend) {
    let db = TestDb::new(backend).await;
    let orch = db.orch("procrace");
    let started = Instant::now();
    let (mut raced, mut together) = (0, 0);
    for round in 0..ROUNDS {
        let id = db.queue.enqueue(&orch, &json!({"round": round})).await.unwrap();
        let answers = {
            let (db, orch) = (&db, orch.as_str());
            std::thread::scope(|s| {
                let handles: Vec<_> =
                    (0..CLAIMERS).map(|i| s.spawn(move || ready_claimer(db, orch, &format!("m{i}"), id))).collect();
                let mut claimers: Vec<Claimer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
                // All five are waiting with their connection open: release them together, at
                // one instant a little ahead (each sleeps until it), not one pipe write apart.
                let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_millis(50);
                let release = format!("{}\n", at.as_nanos());
                for c in &mut claimers {
                    let stdin = c.child.stdin.as_mut().expect("stdin");
                    stdin.write_all(release.as_bytes()).expect("release");
                    stdin.flush().expect("flush");
                }
                claimers.into_iter().map(answer).collect::<Vec<_>>()
            })
        };
        let won: Vec<&Answer> = answers.iter().filter(|a| a.code == Some(0)).collect();
        let lost: Vec<&Answer> = answers.iter().filter(|a| a.code == Some(3)).collect();
        assert_eq!(
            (won.len(), lost.len()),
            (1, CLAIMERS - 1),
            "round {round}: one winner, the rest lost: {answers:#?}"
        );
        assert_eq!(won[0].stdout.trim(), format!("claimed {id} 1"), "round {round}: {answers:#?}");
        for a in &lost {
            assert_eq!(a.stdout.trim(), format!("lost {id}"), "round {round}: {answers:#?}");
        }
        for a in &answers {
            assert!(!a.stderr.lines().any(|l| l.starts_with("error:")) && !a.stderr.contains("panicked"), "{a:#?}");
        }
        let claimed: Vec<_> = db.queue.history(id).await.unwrap().into_iter().filter(|e| e.kind == "claimed").collect();
        assert_eq!(claimed.len(), 1, "round {round}: one claimed event: {claimed:#?}");
        assert_eq!(claimed[0].machine.as_deref(), Some(won[0].machine.as_str()), "round {round}");
        assert_eq!(claimed[0].claim_token, Some(1), "round {round}");
        raced += usize::from(winner_met_a_loser(won[0], &lost));
        together += usize::from(all_in_flight_together(&answers));
    }
    eprintln!(
        "{backend:?}: {ROUNDS} rounds of {CLAIMERS} processes in {:?}; the winner met a loser in {raced}, \
         all five in flight at once in {together}",
        started.elapsed()
    );
    assert!(raced * 2 > ROUNDS, "the winner met a loser in only {raced} of {ROUNDS} rounds: no race was run");
    assert!(together >= 1, "the five claims were never in flight at once");
}
