//! (w)'s killed phase: the machine that finished a job dies with its completion comment on
//! the wire, and the other machine delivers it once the delivery lease has run out.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, Statement};

use super::{epoch, Fleet, Sample, MACHINES, REPO};
use crate::common::log;

/// How long the phase waits for the other machine's delivery: past any lease (160 s).
const LIMIT: Duration = Duration::from_secs(420);

impl Fleet {
    /// One issue: labelled, its agent held at its end until the comment's gate is armed, then
    /// let go; when the completion comment reaches the gate, its machine is killed and the
    /// request dropped. Returns the sample (its exit is the agent's, its comment the one the
    /// other machine delivered), and starts the killed machine again.
    pub(super) async fn killed(&mut self) -> Sample {
        let hold = self.dir.join("hold");
        std::fs::write(&hold, "").unwrap();
        let number = self.open_issues(1)[0];
        let mut s = Sample { number, label: epoch(), ..Sample::default() };
        self.gh.set_labels(REPO, number, &["agent"]);
        // The agent has started and the claim's comment is on the issue: arm the gate.
        let t0 = Instant::now();
        let id = loop {
            let key = format!("github:{REPO}#{number}");
            let job = self.jobs().await.into_iter().find(|j| j.1 == key).map(|j| j.0);
            let started = job.is_some_and(|id| self.agent.records().iter().any(|r| r.job == id && r.kind == "start"));
            if started && !self.gh.comments(REPO, number).is_empty() {
                break job.unwrap();
            }
            assert!(t0.elapsed() < LIMIT, "(w) killed: the job never started");
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let gate = self.gh.gate("issues/create-comment");
        std::fs::write(self.dir.join(format!("go-{id}")), "").unwrap();
        while !gate.arrived() {
            assert!(t0.elapsed() < LIMIT, "(w) killed: the completion comment never came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The machine whose delivery the gate holds (either may take the row), which must be
        // the one that ran the agent: otherwise this is not the case measured.
        let holder = self.outbox_holder(id).await;
        let finisher =
            self.agent.records().iter().rev().find(|r| r.job == id && r.kind == "end").map(|r| r.machine.clone());
        assert_eq!(holder, finisher, "(w) killed: the held comment is not the finishing machine's delivery");
        let i = MACHINES.iter().position(|m| Some(*m) == holder.as_deref()).expect("the finishing machine");
        let mut dead = self.machines[i].take().unwrap();
        dead.child.kill().unwrap();
        dead.child.wait().unwrap();
        gate.drop_request();
        log(format!("(w) killed {} with job {id}'s comment on the wire", MACHINES[i]));
        std::fs::remove_file(&hold).unwrap();
        let t1 = Instant::now();
        while t1.elapsed() < LIMIT {
            self.observe(std::slice::from_mut(&mut s));
            if s.comment.is_some() && s.pr.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.fill(std::slice::from_mut(&mut s)).await;
        self.machines[i] = Some(self.spawn(i));
        s
    }

    /// The machine holding job `id`'s undelivered outbox row (the one at the gate).
    async fn outbox_holder(&self, id: i64) -> Option<String> {
        let db = &self.db;
        let sql = format!("SELECT claimed_by FROM outbox WHERE job_id = {id} AND done_at IS NULL ORDER BY id LIMIT 1");
        let row = db.query_one_raw(Statement::from_string(db.get_database_backend(), sql)).await.unwrap();
        row.and_then(|r| r.try_get::<Option<String>>("", "claimed_by").unwrap())
    }
}
