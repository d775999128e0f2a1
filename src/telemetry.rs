//! tracing output: human-readable lines by default, JSON lines on request,
//! with warnings held to a rate per call site (limit.rs).
//!
//! Lines (the access log among them) go to stdout through a thread of their
//! own: a request formats its line and queues it, and never waits on the
//! write. The thread writes through a 64 KiB buffer, flushed whenever the
//! queue runs dry (so a quiet proxy's lines appear at once) and whenever it
//! fills. When the queue is full (stdout slower than the lines, for
//! [`QUEUED_LINES`] lines) a line is dropped and counted in
//! `fencegate_log_dropped_total`, never waited for. [`LogGuard`] flushes what
//! is queued when dropped: `main` holds it until the end, so a clean
//! shutdown loses no line.

mod limit;

use std::io::BufWriter;
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
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

/// Lines queued for the writer thread before new ones are dropped.
pub const QUEUED_LINES: usize = 64 * 1024;

/// The writer thread's buffer.
const WRITE_BUFFER: usize = 64 * 1024;

/// Lines dropped because the queue was full, since the process started.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Lines dropped because the writer's queue was full (0 before [`init`]):
/// `fencegate_log_dropped_total`.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// Keeps the writer thread; dropping it writes out every queued line.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(#[allow(dead_code)] Option<WorkerGuard>);

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`.
pub fn init(format: LogFormat, level: &str) -> LogGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colour only for a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("fencegate-log")
        .finish(BufWriter::with_capacity(WRITE_BUFFER, std::io::stdout()));
    let dropped = writer.error_counter();
    let lines = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi);
    let lines = match format {
        LogFormat::Human => lines.boxed(),
        LogFormat::Json => lines.json().flatten_event(true).with_current_span(false).boxed(),
    };
    // The limit sits outside the filter: only what the filter lets through
    // counts against a call site's budget.
    match tracing_subscriber::registry().with(filter).with(lines).with(ForeignLimit::default()).try_init() {
        Ok(()) => {
            let _ = DROPPED.set(dropped);
            LogGuard(Some(guard))
        }
        // A subscriber is already set (tests that start several servers):
        // this writer was never installed.
        Err(_) => LogGuard(None),
    }
}
