//! tracing output: human-readable lines by default, JSON lines on request.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colour only for a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stdout).with_ansi(ansi);
    let result = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    // A subscriber may already be set (tests that start several servers).
    let _ = result;
}
