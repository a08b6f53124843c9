//! The window's only way into the app: Tauri commands. Errors are the engine's
//! [`devpilot_app::Error`], which reaches the page as `{kind, message}`.
//!
//! Nothing here touches SQL: the engine's [`devpilot_app::Engine`] does.

use std::sync::atomic::Ordering;
use std::time::Duration;

use devpilot_app::config::SetAside;
use devpilot_app::guide::Tested;
use devpilot_app::job::JobState;
use devpilot_app::orchestrator::StopMode;
use devpilot_app::queue::{CancelOutcome, Counts, Enqueued, JobRow};
use devpilot_app::settings::Settings;
use devpilot_app::{
    DbForm, Fleet, HandOffVerdict, JobDetail, NewJob, RepoSwitches, RepoView, SourceForm, SourcesView, Status,
};
use devpilot_app::{Error, Result};
use serde::{Deserialize, Serialize};
use tauri::{AppHandle, Runtime, State};

use crate::autostart::set_autostart;
use crate::notify::Sent;
use crate::state::AppState;

/// The command table, for the real app and for tests.
pub fn handler<R: Runtime>() -> impl Fn(tauri::ipc::Invoke<R>) -> bool + Send + Sync + 'static {
    tauri::generate_handler![
        get_status,
        set_dispatch,
        set_claiming,
        pause,
        resume,
        hand_off,
        last_hand_off,
        enqueue_demo,
        enqueue_job,
        list_repos,
        add_repo,
        set_repo,
        remove_repo,
        check_repo,
        list_jobs,
        fleet,
        job_detail,
        requeue,
        cancel,
        get_settings,
        save_settings,
        forget_password,
        quit,
        recent_notifications,
        open_logs,
        set_aside_config,
        dismiss_set_aside,
        tray_host,
        close_window,
        guide_state,
        skip_guide,
        test_connection,
        set_up_database,
        check_agent,
        agent_health,
        get_sources,
        test_source,
        save_source,
        remove_source,
        import_gh_token,
        open_link,
        open_worktree,
        open_job_log,
        ask_hand_off,
        crate::commands_limits::limits,
        crate::commands_limits::set_resume_after_limits,
        crate::commands_limits::set_resume_after_limit,
        crate::commands_limits::let_go,
        crate::commands_limits::release_account,
    ]
}

#[tauri::command]
pub fn get_status(state: State<'_, AppState>) -> Status {
    state.engine.status()
}

#[tauri::command]
pub async fn set_dispatch(state: State<'_, AppState>, enabled: bool) -> Result<Status> {
    state.engine.set_dispatch(enabled).await?;
    Ok(state.engine.status())
}

/// The one claiming control: on, paused (for `minutes`, or until resumed) or off.
#[tauri::command]
pub async fn set_claiming(state: State<'_, AppState>, claiming: devpilot_app::Claiming) -> Result<Status> {
    state.engine.set_claiming(claiming).await?;
    Ok(state.engine.status())
}

/// Pauses claiming for `minutes` (or until resumed when absent). Running jobs finish.
#[tauri::command]
pub fn pause(state: State<'_, AppState>, minutes: Option<u64>) -> Result<()> {
    state.engine.pause(minutes.map(|m| Duration::from_secs(m.saturating_mul(60))))
}

#[tauri::command]
pub fn resume(state: State<'_, AppState>) -> Result<()> {
    state.engine.resume()
}

/// Releases this machine's claims now; with `pause`, claims nothing new afterwards.
#[tauri::command]
pub async fn hand_off(state: State<'_, AppState>, pause: Option<bool>) -> Result<HandOffVerdict> {
    state.engine.hand_off(pause.unwrap_or(true)).await
}

/// The last hand-off's verdict, until claiming resumes (the window's notice at its load).
#[tauri::command]
pub fn last_hand_off(state: State<'_, AppState>) -> Option<HandOffVerdict> {
    state.engine.last_hand_off()
}

/// Enqueues a demo job, with an optional dedupe key (see [`Enqueued`] for a key that is live).
#[tauri::command]
pub async fn enqueue_demo(state: State<'_, AppState>, key: Option<String>) -> Result<Enqueued> {
    state.engine.enqueue_demo_keyed(key.as_deref()).await
}

/// Enqueues a job from the New job form: title, prompt, repo, labels, priority and key.
#[tauri::command]
pub async fn enqueue_job(state: State<'_, AppState>, job: NewJob) -> Result<Enqueued> {
    state.engine.enqueue_job(job).await
}

/// This machine's repos with their switches and health, as the New job form and Settings
/// list them.
#[tauri::command]
pub async fn list_repos(state: State<'_, AppState>) -> Result<Vec<RepoView>> {
    Ok(state.engine.repo_views().await)
}

/// Adds a repo (a git clone on this machine) to the settings; jobs of it can then run here.
/// It pushes on completion and opens a draft pull request until its switches say otherwise.
#[tauri::command]
pub async fn add_repo(state: State<'_, AppState>, name: String, path: String) -> Result<Vec<RepoView>> {
    state.engine.add_repo(&name, &path).await?;
    list_repos(state).await
}

/// A repo row's switches: push on completion, and the pull request it opens.
#[tauri::command]
pub async fn set_repo(state: State<'_, AppState>, name: String, switches: RepoSwitches) -> Result<Vec<RepoView>> {
    state.engine.set_repo(&name, switches).await?;
    list_repos(state).await
}

/// Removes a repo from this machine's settings (never its clone).
#[tauri::command]
pub async fn remove_repo(state: State<'_, AppState>, name: String) -> Result<Vec<RepoView>> {
    state.engine.remove_repo(&name).await?;
    list_repos(state).await
}

/// Whether the repo's remote takes a push from this machine now.
#[tauri::command]
pub async fn check_repo(state: State<'_, AppState>, name: String) -> Result<String> {
    state.engine.check_repo(&name).await
}

#[derive(Serialize)]
pub struct JobList {
    pub jobs: Vec<JobRow>,
    pub counts: Counts,
    /// Queued jobs that no online machine can take, with why.
    pub unroutable: std::collections::BTreeMap<i64, String>,
}

#[tauri::command]
pub async fn list_jobs(state: State<'_, AppState>, job_state: Option<String>, limit: Option<u32>) -> Result<JobList> {
    // "" and "all" are the window's "every state".
    let filter = match job_state.as_deref().filter(|s| !s.is_empty() && *s != "all") {
        None => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| Error::Invalid(format!("unknown job state '{s}'")))?),
    };
    let (jobs, counts) = state.engine.jobs(filter, limit.unwrap_or(100)).await?;
    let unroutable = state.engine.unroutable(&jobs).await?;
    Ok(JobList { jobs, counts, unroutable })
}

#[tauri::command]
pub async fn fleet(state: State<'_, AppState>) -> Result<Fleet> {
    state.engine.fleet().await
}

#[tauri::command]
pub async fn job_detail(state: State<'_, AppState>, id: i64) -> Result<JobDetail> {
    state.engine.job_detail(id).await
}

/// Puts a dead (or failed) job back in the queue.
#[tauri::command]
pub async fn requeue(state: State<'_, AppState>, id: i64) -> Result<bool> {
    state.engine.requeue(id).await
}

/// Cancels a job wherever it is: a waiting one at once, a running one through its holder.
/// `null`: it was finished already.
#[tauri::command]
pub async fn cancel(state: State<'_, AppState>, id: i64) -> Result<Option<CancelOutcome>> {
    state.engine.cancel(id).await
}

/// What the settings form shows. There is no password in it, only whether one is stored.
#[derive(Serialize, Deserialize, Debug)]
pub struct SettingsView {
    pub settings: Settings,
    pub db: DbForm,
    pub password_stored: bool,
    /// Why the keychain could not be asked, if it could not.
    pub keychain_error: Option<String>,
    pub overrides: Vec<String>,
    pub config_file: String,
    pub log_dir: String,
}

#[tauri::command]
pub async fn get_settings(state: State<'_, AppState>) -> Result<SettingsView> {
    let e = &state.engine;
    let settings = e.file_settings()?;
    let (password_stored, keychain_error) = match e.password_stored().await {
        Ok(b) => (b, None),
        Err(err) => (false, Some(err.to_string())),
    };
    Ok(SettingsView {
        db: DbForm::of(settings.database_url.as_deref()),
        settings,
        password_stored,
        keychain_error,
        overrides: e.overrides().active().iter().map(|s| s.to_string()).collect(),
        config_file: e.paths().config_file().display().to_string(),
        log_dir: e.paths().log_dir.display().to_string(),
    })
}

#[derive(Deserialize)]
pub struct SettingsInput {
    pub settings: Settings,
    pub db: DbForm,
    /// A new password, straight to the keychain. Empty or absent: keep the stored one.
    pub password: Option<String>,
}

impl Drop for SettingsInput {
    fn drop(&mut self) {
        wipe(&mut self.password);
    }
}

/// Best effort: do not leave a password lying around in freed memory longer than needed.
fn wipe(password: &mut Option<String>) {
    if let Some(p) = password.take() {
        let mut bytes = p.into_bytes();
        bytes.iter_mut().for_each(|b| *b = 0);
    }
}

/// Validates, verifies the connection, stores the password in the keychain, saves, restarts.
#[tauri::command]
pub async fn save_settings<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    mut input: SettingsInput,
) -> Result<SettingsView> {
    let password = input.password.take();
    let autostart = input.settings.autostart;
    state.engine.apply_settings(input.settings.clone(), &input.db, password).await?;
    set_autostart(&app, autostart);
    get_settings(state).await
}

#[tauri::command]
pub async fn forget_password(state: State<'_, AppState>) -> Result<()> {
    state.engine.forget_password().await
}

/// How to quit, as the window asks: in JSON "check", "hand_off" or "drain".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuitMode {
    /// Quit only if nothing runs; otherwise answer the running job ids for the window to ask about.
    Check,
    /// Release running jobs now, then quit.
    HandOff,
    /// Let running jobs finish (up to 10 minutes), hand off the rest, then quit.
    Drain,
    /// A mode this version does not know, kept as sent so [`quit`] refuses it by name.
    #[serde(untagged)]
    Unknown(String),
}

/// Quits as `mode` says (see [`QuitMode`]); answers the running job ids when it did not quit.
#[tauri::command]
pub async fn quit<R: Runtime>(app: AppHandle<R>, state: State<'_, AppState>, mode: QuitMode) -> Result<Vec<i64>> {
    let running: Vec<i64> = state.engine.status().running.iter().map(|r| r.job.id).collect();
    let stop = match mode {
        QuitMode::Check if !running.is_empty() => return Ok(running),
        QuitMode::Check | QuitMode::HandOff => StopMode::HandOff,
        QuitMode::Drain => StopMode::Drain { grace: Duration::from_secs(600) },
        QuitMode::Unknown(other) => return Err(Error::Invalid(format!("unknown quit mode '{other}'"))),
    };
    tracing::info!(?stop, running = running.len(), "quitting");
    state.quitting.store(true, Ordering::SeqCst);
    state.engine.stop(stop).await;
    app.exit(0);
    Ok(vec![])
}

/// The first-run guide: whether it shows, and what its first steps offer.
#[tauri::command]
pub fn guide_state(state: State<'_, AppState>) -> devpilot_app::guide::GuideState {
    state.engine.guide()
}

/// The guide skipped: default settings are written, so it never comes back.
#[tauri::command]
pub fn skip_guide(state: State<'_, AppState>) -> Result<()> {
    state.engine.skip_guide()
}

#[derive(Deserialize)]
pub struct ConnectionInput {
    pub db: DbForm,
    pub password: Option<String>,
}

/// Never the password, whoever formats it.
impl std::fmt::Debug for ConnectionInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionInput").field("db", &self.db).field("password", &redacted(&self.password)).finish()
    }
}

impl std::fmt::Debug for SettingsInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettingsInput")
            .field("settings", &self.settings)
            .field("db", &self.db)
            .field("password", &redacted(&self.password))
            .finish()
    }
}

fn redacted(p: &Option<String>) -> Option<&'static str> {
    p.as_ref().map(|_| "***")
}

impl Drop for ConnectionInput {
    fn drop(&mut self) {
        wipe(&mut self.password);
    }
}

/// The guide's (and Settings') "Test connection": connects as saving would, saves nothing.
#[tauri::command]
pub async fn test_connection(state: State<'_, AppState>, mut input: ConnectionInput) -> Result<Tested> {
    let password = input.password.take();
    state.engine.test_connection(&input.db, password).await
}

/// The guide's "Set up DevPilot's tables here" on a new PostgreSQL (`devpilot migrate`).
#[tauri::command]
pub async fn set_up_database(state: State<'_, AppState>, mut input: ConnectionInput) -> Result<Tested> {
    let password = input.password.take();
    state.engine.set_up_database(&input.db, password).await
}

/// Where the agent's program was found on PATH, or why it was not.
#[tauri::command]
pub fn check_agent(line: String) -> Result<String> {
    devpilot_app::guide::find_agent(&line)
}

/// Settings' line for the agent `line` (else the configured one): found, version, logged in.
#[tauri::command]
pub async fn agent_health(
    state: State<'_, AppState>,
    line: Option<String>,
) -> Result<devpilot_app::agent_health::AgentHealth> {
    let line = line.or_else(|| state.engine.settings().agent).unwrap_or_default();
    if line.trim().is_empty() {
        let demo =
            "no agent: a job added here runs the demo agent on the embedded database; choose a preset or a command";
        return Ok(devpilot_app::agent_health::AgentHealth { ok: true, line: demo.into() });
    }
    Ok(devpilot_app::agent_health::agent_health(&line).await)
}

/// Settings → Sources: each tracker source with its health here and its row in the database,
/// and where this machine's Linear key and GitHub token come from (never a key).
#[tauri::command]
pub async fn get_sources(state: State<'_, AppState>) -> Result<SourcesView> {
    state.engine.sources_view().await
}

/// "Test connection": the form's source with the form's key (else the stored one); the
/// "Connected as …" line, or what is wrong. Nothing is saved.
#[tauri::command]
pub async fn test_source(state: State<'_, AppState>, source: SourceForm) -> Result<String> {
    state.engine.test_source(source).await
}

/// "Save source": its key (if typed) to the keychain, the source to the settings, applied at once.
#[tauri::command]
pub async fn save_source(state: State<'_, AppState>, source: SourceForm) -> Result<SourcesView> {
    state.engine.save_source(source).await
}

#[tauri::command]
pub async fn remove_source(state: State<'_, AppState>, name: String) -> Result<SourcesView> {
    state.engine.remove_source(&name).await
}

/// "Import from gh": the GitHub CLI's token (`gh auth token`) into the keychain as this
/// machine's GitHub token; says which token is used now, or that gh is missing or logged out.
#[tauri::command]
pub async fn import_gh_token(state: State<'_, AppState>) -> Result<String> {
    state.engine.import_gh_token().await
}

/// Opens an http(s) link (a job's tracker issue) in the user's browser; any other scheme is
/// refused. The window itself never navigates away.
#[tauri::command]
pub fn open_link(url: String) -> Result<()> {
    crate::window::open_url(&url)
}

/// Whether a tray host shows the icon (without one the window says so, and closing asks).
#[tauri::command]
pub fn tray_host(state: State<'_, AppState>) -> bool {
    state.tray_host.present()
}

/// "Keep running in the background": the window goes, the app stays.
#[tauri::command]
pub fn close_window<R: Runtime>(app: AppHandle<R>) {
    crate::window::close(&app);
}

/// The notifications sent so far (newest last), for the window and for tests.
#[tauri::command]
pub fn recent_notifications(state: State<'_, AppState>) -> Vec<Sent> {
    state.notifier.recent()
}

/// The config file that could not be parsed at start and was kept aside, if one was: the
/// window shows it until dismissed.
#[tauri::command]
pub fn set_aside_config(state: State<'_, AppState>) -> Option<SetAside> {
    state.engine.set_aside_config()
}

#[tauri::command]
pub fn dismiss_set_aside(state: State<'_, AppState>) {
    state.engine.dismiss_set_aside()
}

/// Opens job `id`'s worktree on this machine in the file manager.
#[tauri::command]
pub fn open_worktree(state: State<'_, AppState>, id: i64) -> Result<String> {
    let dir = state
        .engine
        .worktree_path(id)
        .ok_or_else(|| devpilot_app::Error::Invalid(format!("job #{id} has no worktree on this machine")))?;
    crate::window::reveal(&dir)?;
    Ok(dir.display().to_string())
}

/// Opens this machine's full log of job `id` (its folder, with the file in it).
#[tauri::command]
pub fn open_job_log(state: State<'_, AppState>, id: i64) -> Result<String> {
    let file = state.engine.job_log(id);
    if !file.exists() {
        return Err(devpilot_app::Error::Invalid(format!("this machine has no log of job #{id}")));
    }
    let dir = file.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    crate::window::reveal(&dir)?;
    Ok(file.display().to_string())
}

/// Asks machine `machine` to hand off its jobs (Fleet, and a job running elsewhere).
#[tauri::command]
pub async fn ask_hand_off(state: State<'_, AppState>, machine: String) -> Result<String> {
    state.engine.ask_hand_off(&machine).await
}

/// Opens the log folder in the file manager.
#[tauri::command]
pub fn open_logs(state: State<'_, AppState>) -> Result<String> {
    let dir = state.engine.paths().log_dir.clone();
    crate::window::reveal(&dir)?;
    Ok(dir.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use devpilot_app::config::Paths;
    use devpilot_app::{Engine, Overrides};
    use serde_json::{json, Value};
    use tauri::test::{get_ipc_response, mock_builder, mock_context, noop_assets, MockRuntime, INVOKE_KEY};
    use tauri::webview::InvokeRequest;
    use tauri::WebviewWindow;

    fn app(dir: &std::path::Path, overrides: Overrides) -> (tauri::App<MockRuntime>, WebviewWindow<MockRuntime>) {
        let paths = Paths {
            config_dir: dir.join("config"),
            data_dir: dir.join("data"),
            log_dir: dir.join("data").join("logs"),
        };
        let s = Settings {
            orchestrator_id: "cmd-test".into(),
            poll_interval: devpilot_app::span::Span::parse("200ms").unwrap(),
            max_poll_interval: devpilot_app::span::Span::parse("1s").unwrap(),
            ..Settings::default()
        };
        paths.save(&s).unwrap();
        let engine = Engine::with_demo_duration(paths, "devpilot-test", overrides, Duration::from_millis(200));
        let app = mock_builder()
            .manage(AppState::new(engine.clone()))
            .invoke_handler(handler())
            .build(mock_context(noop_assets()))
            .unwrap();
        tauri::async_runtime::block_on(engine.start());
        let w = tauri::WebviewWindowBuilder::new(&app, "main", Default::default()).build().unwrap();
        (app, w)
    }

    fn call(w: &WebviewWindow<MockRuntime>, cmd: &str, args: Value) -> std::result::Result<Value, Value> {
        get_ipc_response(
            w,
            InvokeRequest {
                cmd: cmd.into(),
                callback: tauri::ipc::CallbackFn(0),
                error: tauri::ipc::CallbackFn(1),
                url: "tauri://localhost".parse().unwrap(),
                body: tauri::ipc::InvokeBody::Json(args),
                headers: Default::default(),
                invoke_key: INVOKE_KEY.to_string(),
            },
        )
        .map(|b| b.deserialize::<Value>().unwrap())
    }

    fn wait_status(w: &WebviewWindow<MockRuntime>, state: &str) -> Value {
        for _ in 0..100 {
            let s = call(w, "get_status", json!({})).unwrap();
            if s["state"] == state {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("state never became {state}: {:?}", call(w, "get_status", json!({})));
    }

    /// The demo loop through the commands the window uses: enqueue, list, detail with log tail.
    #[test]
    fn enqueue_list_and_detail() {
        let dir = tempfile::tempdir().unwrap();
        let (_app, w) = app(dir.path(), Overrides::default());
        let st = wait_status(&w, "idle");
        assert_eq!(st["agent"], "demo");
        let id = call(&w, "enqueue_demo", json!({})).unwrap()["id"].as_i64().unwrap();
        let mut done = false;
        for _ in 0..100 {
            let list = call(&w, "list_jobs", json!({"jobState": "completed"})).unwrap();
            if list["jobs"].as_array().unwrap().iter().any(|j| j["id"] == id) {
                assert_eq!(list["counts"]["completed"], 1);
                done = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(done, "the demo job did not complete");
        let d = call(&w, "job_detail", json!({"id": id})).unwrap();
        assert_eq!(d["payload"]["source"], "devpilot-tray");
        assert!(d["log_tail"].as_str().unwrap().contains("demo agent"));
        let kinds: Vec<&str> = d["history"].as_array().unwrap().iter().map(|h| h["kind"].as_str().unwrap()).collect();
        assert!(kinds.contains(&"claimed") && kinds.contains(&"completed"), "{kinds:?}");
        let fleet = call(&w, "fleet", json!({})).unwrap();
        assert!(!fleet["machines"].as_array().unwrap().is_empty());
        let e = call(&w, "list_jobs", json!({"jobState": "bogus"})).unwrap_err();
        assert_eq!(e["kind"], "invalid");
    }

    /// The one claiming control: off stops claiming, a pause switches dispatch back on and
    /// pauses it, and "on" ends the pause.
    #[test]
    fn one_claiming_control() {
        let dir = tempfile::tempdir().unwrap();
        let (_app, w) = app(dir.path(), Overrides::default());
        wait_status(&w, "idle");
        let st = call(&w, "set_claiming", json!({"claiming": {"mode": "off"}})).unwrap();
        assert_eq!(st["dispatch_enabled"], false);
        wait_status(&w, "off");
        call(&w, "set_claiming", json!({"claiming": {"mode": "paused", "minutes": 30}})).unwrap();
        let st = wait_status(&w, "paused");
        assert!(st["dispatch_enabled"] == true && st["paused_until_unix_ms"].is_u64(), "{st}");
        call(&w, "set_claiming", json!({"claiming": {"mode": "on"}})).unwrap();
        let st = wait_status(&w, "idle");
        assert_eq!((st["paused"].clone(), st["dispatch_enabled"].clone()), (json!(false), json!(true)));
        assert!(call(&w, "set_claiming", json!({"claiming": {"mode": "sometimes"}})).is_err(), "refused");
    }

    /// Dispatch off, then cancel a queued job; requeue refuses a job that is not dead; a
    /// demo job's key dedupes while its job is live.
    #[test]
    fn dispatch_cancel_requeue() {
        let dir = tempfile::tempdir().unwrap();
        let (_app, w) = app(dir.path(), Overrides::default());
        wait_status(&w, "idle");
        let st = call(&w, "set_dispatch", json!({"enabled": false})).unwrap();
        assert_eq!(st["dispatch_enabled"], false);
        wait_status(&w, "off");
        let id = call(&w, "enqueue_demo", json!({})).unwrap()["id"].as_i64().unwrap();
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(call(&w, "job_detail", json!({"id": id})).unwrap()["job"]["state"], "queued");
        assert_eq!(call(&w, "requeue", json!({"id": id})).unwrap(), false);
        assert_eq!(call(&w, "cancel", json!({"id": id})).unwrap(), json!({"outcome": "cancelled"}));
        assert_eq!(call(&w, "job_detail", json!({"id": id})).unwrap()["job"]["state"], "cancelled");
        assert_eq!(call(&w, "cancel", json!({"id": id})).unwrap(), json!(null), "finished: nothing to cancel");
        // A key dedupes while its job is live, and is free again once that job is finished.
        let first = call(&w, "enqueue_demo", json!({"key": "ENG-7"})).unwrap();
        assert_eq!(first["existing"], json!(null));
        let again = call(&w, "enqueue_demo", json!({"key": "ENG-7"})).unwrap();
        assert_eq!((again["id"].clone(), again["existing"].clone()), (first["id"].clone(), json!("queued")));
        call(&w, "cancel", json!({"id": first["id"]})).unwrap();
        let after = call(&w, "enqueue_demo", json!({"key": "ENG-7"})).unwrap();
        assert_ne!(after["id"], first["id"]);
        let s = call(&w, "get_settings", json!({})).unwrap();
        assert_eq!(s["settings"]["dispatch_enabled"], false);
    }

    /// The Limits commands on a new queue: nothing held or spent and no cap; the fleet's
    /// switch is set and read back; a live job takes its own switch, and one not parked is
    /// not let go; an account held by nothing is not released.
    #[test]
    fn limits_commands() {
        let dir = tempfile::tempdir().unwrap();
        let (_app, w) = app(dir.path(), Overrides::default());
        wait_status(&w, "idle");
        let v = call(&w, "limits", json!({})).unwrap();
        assert_eq!(
            (&v["accounts"], &v["day"]["spent_usd"], &v["limits_paused"]),
            (&json!([]), &json!(0.0), &json!(false))
        );
        assert_eq!(call(&w, "set_resume_after_limits", json!({"resume": false})).unwrap()["limits_paused"], true);
        assert_eq!(call(&w, "limits", json!({})).unwrap()["limits_paused"], true);
        assert_eq!(call(&w, "set_resume_after_limits", json!({"resume": true})).unwrap()["limits_paused"], false);
        call(&w, "set_dispatch", json!({"enabled": false})).unwrap();
        let id = call(&w, "enqueue_demo", json!({})).unwrap()["id"].as_i64().unwrap();
        assert_eq!(call(&w, "set_resume_after_limit", json!({"id": id, "resume": false})).unwrap(), true);
        assert_eq!(call(&w, "let_go", json!({"id": id})).unwrap(), false);
        assert_eq!(call(&w, "release_account", json!({"account": "claude:work"})).unwrap(), false);
    }

    /// Bad settings come back as a clear error and nothing is saved; the view never carries a
    /// password field.
    #[test]
    fn settings_errors_and_no_password_echo() {
        let dir = tempfile::tempdir().unwrap();
        let (_app, w) = app(dir.path(), Overrides::default());
        let view = call(&w, "get_settings", json!({})).unwrap();
        assert_eq!(view["db"]["mode"], "embedded");
        assert!(!view.to_string().to_lowercase().contains("\"password\""));
        let mut settings = view["settings"].clone();
        settings["orchestrator_id"] = json!("");
        let e = call(&w, "save_settings", json!({"input": {"settings": settings, "db": view["db"]}})).unwrap_err();
        assert_eq!(e["kind"], "invalid");
        assert!(e["message"].as_str().unwrap().contains("orchestrator id"), "{e}");
        let settings = view["settings"].clone();
        let db = json!({"mode": "postgres", "host": "127.0.0.1", "port": 1, "database": "x", "user": "u"});
        let e =
            call(&w, "save_settings", json!({"input": {"settings": settings, "db": db, "password": "hunter2-test"}}))
                .unwrap_err();
        assert_eq!(e["kind"], "unreachable", "{e}");
        assert!(!e.to_string().contains("hunter2-test"));
        let after = call(&w, "get_settings", json!({})).unwrap();
        assert_eq!(after["settings"]["orchestrator_id"], "cmd-test");
        assert_eq!(after["db"]["mode"], "embedded");
        // A valid change is saved and applied.
        let mut settings = view["settings"].clone();
        settings["orchestrator_id"] = json!("renamed");
        call(&w, "save_settings", json!({"input": {"settings": settings, "db": view["db"]}})).unwrap();
        let st = wait_status(&w, "idle");
        assert_eq!(st["orchestrator_id"], "renamed");
    }

    /// Settings → Sources through the commands: a bad form is refused by name, a source is
    /// saved and listed, a test against an address nobody answers says so without the key,
    /// and a link that is not http(s) is never opened.
    #[test]
    fn sources_commands() {
        let dir = tempfile::tempdir().unwrap();
        let (_app, w) = app(dir.path(), Overrides::default());
        wait_status(&w, "idle");
        assert_eq!(call(&w, "get_sources", json!({})).unwrap()["sources"], json!([]));
        let form = json!({"teams": "ENG", "label": "agent", "states": ["unstarted", "started"], "interval": "10s"});
        let e = call(&w, "save_source", json!({"source": form})).unwrap_err();
        assert_eq!(e["kind"], "invalid");
        assert!(e["message"].as_str().unwrap().contains("minimum of 15s"), "{e}");
        let form = json!({"teams": "ENG", "label": "agent", "states": ["unstarted"], "interval": "60s",
                          "api_url": "http://127.0.0.1:1/graphql", "key": "lin_api_never_shown"});
        let e = call(&w, "test_source", json!({"source": form})).unwrap_err();
        assert!(e["message"].as_str().unwrap().contains("cannot reach Linear at http://127.0.0.1:1/graphql"), "{e}");
        assert!(!e.to_string().contains("lin_api_never_shown"));
        let github = json!({"kind": "github", "repo": "acme/webapp", "label": "agent", "interval": "60s",
                            "api_url": "http://127.0.0.1:1", "key": "ghp_never_shown"});
        let e = call(&w, "test_source", json!({"source": github})).unwrap_err();
        assert!(e["message"].as_str().unwrap().contains("cannot reach GitHub at http://127.0.0.1:1"), "{e}");
        assert!(!e.to_string().contains("ghp_never_shown"));
        let mut keyless = form.clone();
        keyless["key"] = json!(null);
        let view = call(&w, "save_source", json!({"source": keyless})).unwrap();
        assert_eq!(view["sources"][0]["name"], "eng");
        assert_eq!(view["sources"][0]["form"]["api_url"], "http://127.0.0.1:1/graphql");
        assert!(view["sources"][0]["form"].get("key").is_none());
        let view = call(&w, "remove_source", json!({"name": "eng"})).unwrap();
        assert_eq!(view["sources"], json!([]));
        for url in ["javascript:alert(1)", "file:///etc/passwd"] {
            let e = call(&w, "open_link", json!({"url": url})).unwrap_err();
            assert!(e["message"].as_str().unwrap().contains("only http(s) links are opened"), "{e}");
        }
    }

    /// The quit modes keep the names the window sends; another name is kept, to be refused.
    #[test]
    fn quit_modes_keep_their_json_names() {
        for (mode, name) in [(QuitMode::Check, "check"), (QuitMode::HandOff, "hand_off"), (QuitMode::Drain, "drain")] {
            assert_eq!(serde_json::to_value(&mode).unwrap(), name);
            assert_eq!(serde_json::from_value::<QuitMode>(json!(name)).unwrap(), mode);
        }
        assert_eq!(serde_json::from_value::<QuitMode>(json!("later")).unwrap(), QuitMode::Unknown("later".into()));
    }

    /// Quit with nothing running reports no jobs to ask about; unknown modes are refused.
    #[test]
    fn quit_modes() {
        let dir = tempfile::tempdir().unwrap();
        let (_app, w) = app(dir.path(), Overrides { agent: Some("sleep 30".into()), ..Overrides::default() });
        wait_status(&w, "idle");
        call(&w, "enqueue_demo", json!({})).unwrap();
        let st = wait_status(&w, "working");
        let id = st["running"][0]["job"]["id"].as_i64().unwrap();
        // With a job running, "check" does not quit: it names the job so the window can ask.
        assert_eq!(call(&w, "quit", json!({"mode": "check"})).unwrap(), json!([id]));
        assert_eq!(call(&w, "quit", json!({"mode": "later"})).unwrap_err()["kind"], "invalid");
        // Hand off & pause releases the claim at once.
        let verdict = call(&w, "hand_off", json!({"pause": true})).unwrap();
        assert_eq!(
            verdict["jobs"][0]["id"],
            json!(id),
            "hand_off answers, once everything is released, with what it handed off: {verdict}"
        );
        assert_eq!(verdict["jobs"].as_array().map(Vec::len), Some(1), "{verdict}");
        assert_eq!(verdict["safe"], json!(true), "{verdict}");
        let d = call(&w, "job_detail", json!({"id": id})).unwrap();
        assert_ne!(d["job"]["state"], "running", "{d}");
        assert!(d["history"].as_array().unwrap().iter().any(|h| h["kind"] == "handed_off"), "{d}");
        wait_status(&w, "paused");
    }
}
