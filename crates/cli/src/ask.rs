//! `pause`, `resume` and `handoff`: asked of the tray or `devpilot run` that serves the queue
//! on this computer, through its control socket ([`devpilot_engine::control`]), as the
//! tray's own menu asks: no PID is guessed and no signal is sent.

use std::time::Duration;

use devpilot_engine::config::Paths;
use devpilot_engine::control::{self, AskError, MachineView, Reply, Request};
use devpilot_engine::orchestrator::Carried;

use crate::exit::{Code, Fail, Out};
use crate::output::json;

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
    m.as_ref().and_then(|m| serde_json::to_value(m).ok()).unwrap_or_else(|| serde_json::json!({}))
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
        let code = if reply.nothing { Code::Nothing } else { Code::Error };
        return Err(Fail::new(code, format!("the machine said: {why}")));
    }
    if as_json {
        json(&view_json(&reply.machine));
    } else if let Some(m) = &reply.machine {
        println!("{}", say(m));
    }
    Ok(Code::Ok)
}

/// `devpilot handoff`: the running machine hands its jobs off and pauses; its verdict (the
/// words the tray shows) says whether it is safe to close the lid.
pub async fn handoff(orchestrator: &str, as_json: bool) -> Out {
    let reply = ask(orchestrator, Request::HandOff).await?;
    let verdict = match reply.verdict {
        Some(v) if reply.ok => v,
        _ => {
            return Err(Fail::new(
                Code::Error,
                format!("the hand-off did not finish: {}", reply.error.unwrap_or_default()),
            )
            .fix("`devpilot status` shows what is still held; `devpilot handoff` again retries"))
        }
    };
    if as_json {
        let rows: Vec<_> = verdict
            .jobs
            .iter()
            .map(|j| {
                let branch = match &j.carried {
                    Some(Carried::Pushed { branch }) => Some(branch.clone()),
                    _ => None,
                };
                let stayed = match &j.carried {
                    Some(Carried::Stayed { why }) => Some(why.clone()),
                    None if j.ended.is_none() => Some("its claim was gone before the hand-off".to_string()),
                    _ => None,
                };
                serde_json::json!({
                    "id": j.id, "title": j.title, "branch": branch, "pushed": branch.is_some(),
                    "stayed": stayed, "ended": j.ended,
                })
            })
            .collect();
        let machine = reply.machine.as_ref().map(|m| m.name.clone());
        json(&serde_json::json!({
            "machine": machine, "jobs": rows, "safe": verdict.safe, "paused": verdict.paused, "text": verdict.text,
        }));
    } else {
        println!("{}", crate::output::inert(&verdict.text));
    }
    Ok(Code::Ok)
}
