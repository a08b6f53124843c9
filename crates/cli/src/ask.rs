//! `pause`, `resume` and `handoff`: asked of the tray or `devpilot run` that serves the queue
//! on this computer, through its control socket ([`devpilot_engine::control`]), as the
//! tray's own menu asks: no PID is guessed and no signal is sent.

use std::time::Duration;

use devpilot_engine::config::Paths;
use devpilot_engine::control::{self, AskError, MachineView, Reply, Request};
use devpilot_store::db::PoolSettings;
use devpilot_store::job::{event, JobState};
use devpilot_store::queue::Queue;

use crate::exit::{Code, Fail, Out};
use crate::open::open_queue;
use crate::output::{fmt_ids, json, shown};

async fn ask(orchestrator: &str, req: Request) -> Result<Reply, Fail> {
    let paths = Paths::for_app("devpilot")?;
    match control::ask(&control::socket_path(&paths.data_dir, orchestrator), &req).await {
        Ok(r) => Ok(r),
        Err(AskError::NotRunning) => Err(Fail::new(
            Code::NotRunning,
            format!("no DevPilot is running for queue '{orchestrator}' on this computer"),
        )
        .fix("start the tray app (devpilot-tray) or `devpilot run`; `devpilot release --machine NAME` asks another machine")),
        Err(e) => Err(Fail::new(Code::Error, e.to_string())),
    }
}

fn view_json(m: &Option<MachineView>) -> serde_json::Value {
    match m {
        Some(m) => serde_json::json!({
            "machine": m.name, "state": m.state, "paused": m.paused,
            "paused_until_unix_ms": m.paused_until_unix_ms, "running": m.running,
        }),
        None => serde_json::json!({}),
    }
}

/// `devpilot pause [--for D]`.
pub async fn pause(orchestrator: &str, for_: Option<Duration>, as_json: bool) -> Out {
    if for_.is_some_and(|d| d.as_secs() > control::MAX_PAUSE_SECS || d.as_secs() == 0) {
        return Err(Fail::new(Code::Usage, "--for must be between a second and a year")
            .fix("leave --for out to pause until `devpilot resume`"));
    }
    let reply = ask(orchestrator, Request::Pause { for_secs: for_.map(|d| d.as_secs()) }).await?;
    answered(reply, as_json, |m| match (for_, m.paused_until_unix_ms) {
        (Some(d), _) => {
            format!("{} is paused for {}: it claims nothing new; running jobs go on", m.name, crate::output::human(d))
        }
        _ => format!("{} is paused until `devpilot resume`: it claims nothing new; running jobs go on", m.name),
    })
}

/// `devpilot resume`.
pub async fn resume(orchestrator: &str, as_json: bool) -> Out {
    let reply = ask(orchestrator, Request::Resume).await?;
    answered(reply, as_json, |m| format!("{} claims again", m.name))
}

/// Prints a pause's or a resume's answer; a refusal ("not paused") is status 4.
fn answered(reply: Reply, as_json: bool, say: impl Fn(&MachineView) -> String) -> Out {
    if !reply.ok {
        let why = reply.error.unwrap_or_default();
        let code = if why == "not paused" { Code::Nothing } else { Code::Error };
        return Err(Fail::new(code, format!("the machine said: {why}")));
    }
    if as_json {
        json(&view_json(&reply.machine));
    } else if let Some(m) = &reply.machine {
        println!("{}", say(m));
    }
    Ok(Code::Ok)
}

/// `devpilot handoff`: the running machine hands its jobs off and pauses; the verdict says
/// whether it is safe to close the lid.
pub async fn handoff(orchestrator: &str, as_json: bool) -> Out {
    let reply = ask(orchestrator, Request::HandOff).await?;
    if !reply.ok {
        return Err(Fail::new(
            Code::Error,
            format!("the hand-off did not finish: {}", reply.error.unwrap_or_default()),
        )
        .fix("`devpilot status` shows what is still held; `devpilot handoff` again retries"));
    }
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let mut jobs = vec![];
    for id in &reply.handed_off {
        jobs.push(carried(&queue, *id).await?);
    }
    let safe = jobs.iter().all(|j| j.stayed.is_none());
    if as_json {
        let rows: Vec<_> = jobs
            .iter()
            .map(|j| serde_json::json!({"id": j.id, "state": j.state, "branch": j.branch, "pushed": j.branch.is_some(), "stayed": j.stayed}))
            .collect();
        let machine = reply.machine.as_ref().map(|m| m.name.clone());
        json(&serde_json::json!({"machine": machine, "jobs": rows, "safe": safe, "paused": true}));
    } else {
        println!("{}", verdict(&jobs));
    }
    Ok(Code::Ok)
}

/// What a hand-off did with one job, from the queue.
struct Carried {
    id: i64,
    state: JobState,
    /// The branch its work in progress was pushed to.
    branch: Option<String>,
    /// Why its work stayed on this machine, if it did.
    stayed: Option<String>,
}

async fn carried(queue: &Queue, id: i64) -> Result<Carried, Fail> {
    let (job, _) = queue.job(id).await?.ok_or(Fail::not_found_job(id))?;
    let history = queue.history(id).await?;
    let detail = history.iter().rev().find(|e| e.kind == event::HANDED_OFF).and_then(|e| e.detail.clone());
    let stayed = detail.filter(|d| d.contains("stayed on"));
    Ok(Carried { id, state: job.state, branch: job.resume_branch.filter(|_| stayed.is_none()), stayed })
}

/// "Handed off #3 (pushed devpilot/3-fix-login) and #5. Claiming is paused. Safe to close
/// the lid.", or which job's work stayed here and why.
fn verdict(jobs: &[Carried]) -> String {
    let handed: Vec<String> = jobs
        .iter()
        .filter(|j| j.stayed.is_none())
        .map(|j| match &j.branch {
            Some(b) => format!("#{} (pushed {})", j.id, shown(Some(b))),
            None => format!("#{}", j.id),
        })
        .collect();
    let mut text = match handed.len() {
        0 if jobs.is_empty() => "Nothing was running here. ".to_string(),
        0 => String::new(),
        1 => format!("Handed off {}. ", handed[0]),
        n => format!("Handed off {} and {}. ", handed[..n - 1].join(", "), handed[n - 1]),
    };
    let stayed: Vec<&Carried> = jobs.iter().filter(|j| j.stayed.is_some()).collect();
    for j in &stayed {
        text.push_str(&format!("#{}: {}. ", j.id, shown(j.stayed.as_deref())));
    }
    text.push_str("Claiming is paused. ");
    if stayed.is_empty() {
        text.push_str("Safe to close the lid.");
    } else {
        let ids: Vec<i64> = stayed.iter().map(|j| j.id).collect();
        text.push_str(&format!(
            "Work stayed on this machine{}: keep it open and online until it is pushed (DevPilot retries on its own).",
            fmt_ids(&ids)
        ));
    }
    text
}
