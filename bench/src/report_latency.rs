//! The report's section (w): what a user feels, from the label to the agent and from the
//! agent to the comment and the pull request, with its targets.

use std::fmt::Write as _;

use serde_json::Value;

/// The spans, as the table names them.
const SPANS: [(&str, &str); 5] = [
    ("label_to_created", "label → job written (intake turn)"),
    ("label_to_claimed", "label → claimed"),
    ("label_to_started", "label → agent started"),
    ("exit_to_comment", "agent exit → comment"),
    ("exit_to_pr", "agent exit → PR opened"),
];
const PHASES: [(&str, &str); 3] = [
    ("asleep", "one of two machines stopped"),
    ("awake", "both machines up"),
    ("killed", "the finishing machine killed"),
];

fn secs(v: &Value) -> String {
    v.as_f64().filter(|x| x.is_finite()).map_or("–".into(), |x| format!("{x:.1} s"))
}

pub fn section(m: &mut String, j: &Value) {
    let w = &j["user_latency"];
    if !w.is_object() {
        return;
    }
    let interval = w["interval_s"].as_f64().unwrap_or(60.0);
    let lease = w["delivery_lease_s"].as_f64().unwrap_or(160.0);
    let _ = writeln!(
        m,
        "## What a user feels (w): from the label to the agent, from the agent to the issue\n\n\
         Two `devpilot run` processes (a laptop and a desktop, each with its own clone, the default poll intervals and \
         the sandbox on) take issues labelled on the harness's GitHub stand-in, run a shell agent that changes a file, \
         push the branch to a real bare repository, open the pull request and comment. The source polls every {interval:.0} s \
         ({}); issues are labelled over three intervals (one with both machines up), one at a random moment of each equal \
         slice, so each waits for the next intake turn as a user's would. *Stopped*: the laptop is SIGSTOPped, as a closed lid. *Killed*: the finishing machine \
         gets SIGKILL the moment its completion comment is on the wire (the stand-in drops that request), and the \
         other machine delivers it when the delivery lease ({lease:.0} s) has run out. Measured {} with \
         `devpilot-bench latency` (or `scripts/bench.sh`).\n",
        if interval == 60.0 { "its default" } else { "a quick run: the default is 60 s" },
        measured_when(w)
    );
    let _ = writeln!(m, "| backend | phase | issues | span | p50 | p95 | max |");
    let _ = writeln!(m, "|---|---|---:|---|---:|---:|---:|");
    for b in w["backends"].as_array().into_iter().flatten() {
        for (key, phase) in PHASES {
            for (span, name) in SPANS {
                let s = &b[key][span];
                let _ = writeln!(
                    m,
                    "| {} | {phase} | {} | {name} | {} | {} | {} |",
                    b["backend"].as_str().unwrap_or("?"),
                    s["n"],
                    secs(&s["p50"]),
                    secs(&s["p95"]),
                    secs(&s["max"])
                );
            }
        }
    }
    targets(m, w, interval, lease);
}

/// The three targets, per backend.
fn targets(m: &mut String, w: &Value, interval: f64, lease: f64) {
    let _ = writeln!(m, "\n| target | backend | measured | verdict |\n|---|---|---:|---|");
    let rules = [
        ("asleep", "label_to_started", "p50", interval / 2.0 + 2.0, "label → agent started p50, one machine stopped"),
        ("awake", "exit_to_comment", "p50", 2.0, "agent exit → comment p50, both up"),
        ("killed", "exit_to_comment", "max", lease + 5.0, "agent exit → comment, finishing machine killed"),
    ];
    for b in w["backends"].as_array().into_iter().flatten() {
        for (phase, span, stat, limit, name) in rules {
            let v = b[phase][span][stat].as_f64().filter(|x| x.is_finite());
            let verdict = match v {
                Some(x) if x <= limit => "met",
                Some(_) => "**missed**",
                None => "**not measured**",
            };
            let _ = writeln!(
                m,
                "| {name} ≤ {limit:.0} s | {} | {} | {verdict} |",
                b["backend"].as_str().unwrap_or("?"),
                secs(&b[phase][span][stat])
            );
        }
    }
    let _ = writeln!(m);
}

/// When each backend was measured ("sqlite 2026-12-07 08:28 UTC, postgres …"), or the
/// section's date for a report written before backends carried their own.
fn measured_when(w: &Value) -> String {
    let each: Vec<String> = w["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| Some(format!("{} {}", b["backend"].as_str()?, b["date"].as_str()?)))
        .collect();
    if each.is_empty() {
        w["date"].as_str().unwrap_or("?").to_string()
    } else {
        each.join(", ")
    }
}
