//! `devpilot`: the headless command line. See [`devpilot::cli`].

fn main() -> std::process::ExitCode {
    devpilot::cli::main()
}
