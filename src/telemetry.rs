//! tracing output: human-readable lines by default, JSON lines on request,
//! with warnings held to a rate per call site (limit.rs).

mod limit;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

pub use crate::{error_limited, warn_limited};
pub(crate) use limit::suppressed_counter;
pub use limit::{CallSiteLimit, ForeignLimit, BURST, INTERVAL};
/// The macros' path to tracing, so they expand in any crate.
#[doc(hidden)]
pub use tracing as __tracing;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colour only for a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stdout).with_ansi(ansi);
    let lines = match format {
        LogFormat::Human => lines.boxed(),
        LogFormat::Json => lines.json().flatten_event(true).with_current_span(false).boxed(),
    };
    // The limit sits outside the filter: only what the filter lets through
    // counts against a call site's budget.
    let result = tracing_subscriber::registry().with(filter).with(lines).with(ForeignLimit::default()).try_init();
    // A subscriber may already be set (tests that start several servers).
    let _ = result;
}
