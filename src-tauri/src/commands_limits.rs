//! The window's commands about the fleet's limits and budgets (issue 42): the Limits card's
//! lines and switch, and a job's own switch and "Let it go on". Registered with the others in
//! [`crate::commands::handler`]. What changes the tray's Limits part has it read again.

use devpilot_app::limits::LimitsView;
use devpilot_app::Result;
use tauri::{AppHandle, Runtime, State};

use crate::state::AppState;
use crate::tray::reread_limits;

/// The fleet's limits today: each account (held until when, near or past its cap, this
/// machine's first), the day's spend against its cap, the job cap and the fleet's switch.
#[tauri::command]
pub async fn limits(state: State<'_, AppState>) -> Result<LimitsView> {
    state.engine.limits().await
}

/// The fleet's switch: `resume` false, jobs parked on a usage limit wait for a person
/// (`devpilot pause --limits`); true, they resume by themselves when the hold ends. Answers
/// the limits as they are now.
#[tauri::command]
pub async fn set_resume_after_limits<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    resume: bool,
) -> Result<LimitsView> {
    state.engine.set_limits_paused(!resume).await?;
    reread_limits(&app);
    state.engine.limits().await
}

/// Job `id`'s own switch (`devpilot limits no-resume`): false, after a usage limit it waits
/// for a person. `false` when the job is not live.
#[tauri::command]
pub async fn set_resume_after_limit(state: State<'_, AppState>, id: i64, resume: bool) -> Result<bool> {
    state.engine.set_resume_after_limit(id, resume).await
}

/// "Let it go on": job `id`, parked at a spend cap or on a usage limit, is claimable now (its
/// own cap counted again from what it has spent). `false` when it is not so parked.
#[tauri::command]
pub async fn let_go(state: State<'_, AppState>, id: i64) -> Result<bool> {
    state.engine.let_go(id).await
}

/// Ends the hold on `account` before its reset (`devpilot limits release`). `false` when it
/// held nothing.
#[tauri::command]
pub async fn release_account<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    account: String,
) -> Result<bool> {
    let ended = state.engine.end_hold(&account).await?;
    reread_limits(&app);
    Ok(ended)
}
