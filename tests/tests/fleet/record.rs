//! The fleet's agent and its record: one line when an execution starts, one when it ends
//! (`end`) or is stopped (`term`), read back into one [`Execution`] per claim.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One execution of a job by an agent: from the agent's own records.
#[derive(Debug, Clone)]
pub struct Execution {
    pub job: i64,
    pub token: i64,
    pub machine: String,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
    pub ended: Option<String>,
}

/// The agents' own records: one line when an execution starts, one when it ends (`end`)
/// or is stopped (`term`).
pub fn read_executions(record: &std::path::Path) -> HashMap<(i64, i64), Execution> {
    let text = std::fs::read_to_string(record).unwrap_or_default();
    let mut execs: HashMap<(i64, i64), Execution> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = (f.len() == 5).then(|| (f[1].parse::<i64>(), f[2].parse::<i64>(), f[4].parse::<i64>()));
        let Some((Ok(job), Ok(token), Ok(at))) = parsed else { continue };
        let e = execs.entry((job, token)).or_insert_with(|| Execution {
            job,
            token,
            machine: f[3].to_string(),
            start_ms: at,
            end_ms: None,
            ended: None,
        });
        match f[0] {
            "start" => e.start_ms = at,
            kind => {
                e.end_ms = Some(at);
                e.ended = Some(kind.to_string());
            }
        }
    }
    execs
}

/// How many `start` lines the agents wrote for each (job, claim), counted from the raw
/// record: [`read_executions`] folds lines into one entry per claim, so a claim whose agent
/// started twice would look like one execution there.
pub fn count_starts(record: &std::path::Path) -> HashMap<(i64, i64), usize> {
    let text = std::fs::read_to_string(record).unwrap_or_default();
    let mut starts: HashMap<(i64, i64), usize> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 5 && f[0] == "start" {
            if let (Ok(job), Ok(token)) = (f[1].parse::<i64>(), f[2].parse::<i64>()) {
                *starts.entry((job, token)).or_default() += 1;
            }
        }
    }
    starts
}

/// Writes the fleet's agent into `home`: (its record, its script).
pub fn write_agent(home: &Path) -> (PathBuf, PathBuf) {
    // The agent: one append when it starts, one when it ends, "term" if stopped. One job in
    // ten works for 1.5 s, so faults land mid-execution.
    let record = home.join("executions.log");
    let agent = home.join("agent.sh");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/bash\n\
             rec={rec}\n\
             t() {{ local e=${{EPOCHREALTIME/./}}; echo ${{e:0:13}}; }}\n\
             echo \"start $DEVPILOT_JOB_ID $DEVPILOT_CLAIM_TOKEN $DEVPILOT_MACHINE $(t)\" >> $rec\n\
             trap 'echo \"term $DEVPILOT_JOB_ID $DEVPILOT_CLAIM_TOKEN $DEVPILOT_MACHINE $(t)\" >> $rec; exit 143' TERM\n\
             if (( DEVPILOT_JOB_ID % 10 == 0 )); then sleep 1.5; fi\n\
             echo \"end $DEVPILOT_JOB_ID $DEVPILOT_CLAIM_TOKEN $DEVPILOT_MACHINE $(t)\" >> $rec\n",
            rec = record.display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&agent).status().unwrap();
    (record, agent)
}
