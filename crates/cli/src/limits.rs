//! `devpilot limits`: the governor's limits as the fleet's database says them (each account
//! held or near its cap, the day's spend, the fleet's switch), what a person does about them
//! (end a hold early, keep a job from resuming by itself after a limit, flip the fleet's
//! switch with `pause --limits`), and `limits set`, which writes this machine's `[limits]`.

use devpilot_app::limits::{judged, limits_view, AccountView, LimitsView};
use devpilot_engine::config::Paths;
use devpilot_engine::governor::{clock_of, day_bounds, Account, LimitSettings, TimeZone};
use devpilot_engine::orchestrator::governed::account_for;
use devpilot_engine::settings::Settings;
use devpilot_store::db::PoolSettings;
use devpilot_store::error::Result;
use devpilot_store::queue::{HoldRow, Queue};

use crate::exit::{Code, Fail, Out};
use crate::jobs::who;
use crate::limits_set::SetArgs;
use crate::open::open_queue;
use crate::output::{account_label, json, shown, usd};

#[derive(clap::Subcommand, Debug)]
pub enum LimitsCmd {
    /// Set or turn off the caps in this machine's `[limits]` table (its config file). Each
    /// machine enforces the caps its own config names: set the same on every machine.
    Set(SetArgs),
    /// End an account's hold before its reset (`devpilot limits` lists the held ones): its
    /// machines claim again, and its jobs parked on the limit resume, at once.
    Release {
        /// The account, as `devpilot limits` names it (`claude:work`, or its label `claude · work`).
        #[arg(value_name = "ACCOUNT")]
        account: String,
    },
    /// Job JOB waits for a person after a usage limit, instead of resuming by itself when its
    /// account's hold ends.
    NoResume {
        #[arg(value_name = "JOB")]
        id: i64,
    },
    /// Job JOB resumes by itself when its account's hold ends (the default; undoes no-resume).
    AutoResume {
        #[arg(value_name = "JOB")]
        id: i64,
    },
}

/// This machine's settings, or the defaults when the file cannot be read (what only prints
/// still prints).
pub fn settings() -> Settings {
    Paths::for_app("devpilot").and_then(|p| p.load()).unwrap_or_default()
}

/// The account this machine's agent runs as, when its settings name a preset (`None`: a
/// plain command, no agent, or an account that cannot be told).
async fn this_account(queue: &Queue, orchestrator: &str, settings: &Settings) -> Option<Account> {
    let spec = settings.agent_spec().ok().flatten()?;
    match account_for(queue, orchestrator, &spec, &settings.machine_name()).await {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(error = %e, "this machine's account");
            None
        }
    }
}

/// The fleet's limits today, judged by this machine's `[limits]` (`status` shows them).
pub async fn view(queue: &Queue, orchestrator: &str, settings: &Settings) -> Result<LimitsView> {
    let this = this_account(queue, orchestrator, settings).await;
    limits_view(queue, orchestrator, &settings.limits, this.as_ref().map(Account::as_str)).await
}

/// The limits as `status` and `limits` print them; with `holds`, under each held account who
/// set its hold, for which job, and why.
pub fn print_block(v: &LimitsView, limits: &LimitSettings, holds: Option<(&[HoldRow], i64, &TimeZone)>) {
    println!("limits:");
    for a in &v.accounts {
        let here = if v.this_account.as_deref() == Some(a.account.as_str()) { " (this machine)" } else { "" };
        println!("  {}{here}: {}", shown(Some(&a.label)), shown(Some(&a.line)));
        if let Some((holds, now, tz)) = holds {
            print_hold(a, holds, now, tz);
        }
    }
    println!("  {}", v.day.line);
    if let Some(cap) = limits.account_day_usd {
        println!("  each account: at most {} a day", usd(cap));
    }
    if let Some(cap) = v.job_cap_usd {
        println!("  each job: at most {}", usd(cap));
    }
    if [limits.job_usd, limits.day_usd, limits.account_day_usd].iter().all(Option::is_none) {
        println!("  no caps set here (`devpilot limits set` sets them)");
    }
    if v.limits_paused {
        println!("  jobs parked on a usage limit wait for a person (`devpilot resume --limits` undoes it)");
    }
}

/// Who held account `a`, for which job, since when and why; and how to end it.
fn print_hold(a: &AccountView, holds: &[HoldRow], now: i64, tz: &TimeZone) {
    let Some(h) = holds.iter().find(|h| h.account == a.account) else { return };
    let job = h.job_id.map(|j| format!(" for #{j}")).unwrap_or_default();
    let why = h.reason.as_deref().map(|r| format!(": {}", shown(Some(r)))).unwrap_or_default();
    println!("      held by {}{job} since {}{why}", shown(Some(&h.machine)), clock_of(h.held_at, now, tz));
    println!("      `devpilot limits release {}` ends it now", shown(Some(&a.account)));
}

/// `devpilot limits [--json]`: the block, with each hold's machine, job and reason.
pub async fn list(orchestrator: &str, as_json: bool) -> Out {
    let settings = settings();
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let this = this_account(&queue, orchestrator, &settings).await;
    let tz = settings.limits.time_zone();
    let now = queue.now_ms().await?;
    let (start, _) = day_bounds(now, &tz);
    let g = queue.governor_view(orchestrator, start).await?;
    let v = judged(&g, &settings.limits, this.as_ref().map(Account::as_str), now, start);
    if as_json {
        let mut out = serde_json::to_value(&v).unwrap_or_default();
        out["orchestrator"] = orchestrator.into();
        out["holds"] = serde_json::to_value(&g.holds).unwrap_or_default();
        json(&out);
        return Ok(Code::Ok);
    }
    print_block(&v, &settings.limits, Some((&g.holds, now, &tz)));
    Ok(Code::Ok)
}

/// `devpilot limits release ACCOUNT`: exit 1, naming the held accounts, when it held nothing.
pub async fn release(orchestrator: &str, account: &str, as_json: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let now = queue.now_ms().await?;
    let held = queue.governor_view(orchestrator, now).await?.holds;
    let account = held
        .iter()
        .find(|h| h.account == account || account_label(&h.account) == account)
        .map_or(account.trim(), |h| h.account.as_str());
    if !queue.end_hold(orchestrator, account).await? {
        let names: Vec<String> =
            held.iter().map(|h| format!("{} ({})", h.account, account_label(&h.account))).collect();
        let listed = if names.is_empty() { "none".to_string() } else { names.join(", ") };
        return Err(Fail::new(Code::Error, format!("account '{}' is not held", shown(Some(account))))
            .fix(format!("the accounts held now in queue '{orchestrator}': {}", shown(Some(&listed)))));
    }
    if as_json {
        json(&serde_json::json!({"account": account, "released": true}));
    } else {
        println!(
            "ended the hold on {}: its machines claim again, and its jobs parked on the limit resume, now",
            shown(Some(&account_label(account)))
        );
    }
    Ok(Code::Ok)
}

/// `devpilot limits no-resume JOB` (`resume` false) and `auto-resume JOB` (true); exit 1
/// when the job is not live.
pub async fn resume_after(id: i64, resume: bool, as_json: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    let (job, _) = queue.job(id).await?.ok_or(Fail::not_found_job(id))?;
    if !queue.set_resume_after_limit(&job.orchestrator_id, id, resume).await? {
        return Err(Fail::new(
            Code::Error,
            format!("#{id} is {}: only a live job (queued, waiting to retry or running) can be told", job.state),
        ));
    }
    if as_json {
        json(&serde_json::json!({"id": id, "resume_after_limit": resume}));
    } else if resume {
        println!("#{id} resumes by itself when its account's hold ends");
    } else {
        println!(
            "#{id} now waits for a person after a usage limit (`devpilot requeue {id}` lets it go; \
             `devpilot limits auto-resume {id}` undoes this)"
        );
    }
    Ok(Code::Ok)
}

/// `devpilot pause --limits` (`paused` true) and `resume --limits`: the fleet's switch, in
/// the database; no running machine is needed. A resume when it is off is status 4.
pub async fn switch(orchestrator: &str, paused: bool, as_json: bool) -> Out {
    let (queue, _) = open_queue(PoolSettings::default()).await?;
    if !paused {
        let now = queue.now_ms().await?;
        if !queue.governor_view(orchestrator, now).await?.limits_paused {
            return Err(Fail::new(
                Code::Nothing,
                format!("jobs parked on a usage limit already resume by themselves in queue '{orchestrator}'"),
            ));
        }
    }
    queue.set_limits_paused(orchestrator, paused, &who()).await?;
    let text = if paused {
        "Jobs parked on a usage limit now wait for a person, on every machine (devpilot resume --limits to undo)."
    } else {
        "Jobs parked on a usage limit resume by themselves again when their account's hold ends, on every machine."
    };
    if as_json {
        json(&serde_json::json!({"orchestrator": orchestrator, "limits_paused": paused, "text": text}));
    } else {
        println!("{text}");
    }
    Ok(Code::Ok)
}
