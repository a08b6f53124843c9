//! The tray's log: a daily-rotated file under the platform log dir, and stderr.

use devpilot_app::config::Paths;

/// Log to a daily-rotated file under the platform log dir (7 kept), and to stderr.
pub fn init(paths: &Paths) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    use tracing_subscriber::prelude::*;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("DEVPILOT_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,devpilot=info,devpilot_tray=info"))
    };
    let file = tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("devpilot-tray")
        .filename_suffix("log")
        .max_log_files(7)
        .build(&paths.log_dir);
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter());
    match file {
        Ok(appender) => {
            let (w, guard) = tracing_appender::non_blocking(appender);
            let layer = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(w).with_filter(filter());
            let _ = tracing_subscriber::registry().with(stderr).with(layer).try_init();
            Some(guard)
        }
        Err(e) => {
            let _ = tracing_subscriber::registry().with(stderr).try_init();
            tracing::warn!(error = %e, dir = %paths.log_dir.display(), "cannot open the log file; logging to stderr only");
            None
        }
    }
}
