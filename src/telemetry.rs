//! tracing output: human-readable lines by default, JSON lines on request,
//! with warnings held to a rate per call site (limit.rs).
//!
//! Lines (the access log among them) go to stdout through a thread of their
//! own (writer.rs): a request appends its line to its thread's buffer and
//! never waits on the write. Access lines are written when a buffer fills
//! (64 KiB) and at least once a second; every other line at once. A line
//! that finds the writer's queue full (stdout slower than the lines) is
//! dropped and counted in `fencegate_log_dropped_total`, never waited for.
//! [`LogGuard`] writes out every line when dropped: `main` holds it until the
//! end, so a clean shutdown loses no line.
//!
//! The access log's line is formatted by fencegate itself (stack/access_log),
//! byte for byte as tracing's formatter would, for a tenth of the
//! instructions (docs/perf-log.md).

mod limit;
pub mod traces;
mod writer;

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, TracingConfig};

pub use crate::{error_limited, warn_limited};
pub(crate) use limit::suppressed_counter;
pub use limit::{CallSiteLimit, ForeignLimit, BURST, INTERVAL};
/// The macros' path to tracing, so they expand in any crate.
#[doc(hidden)]
pub use tracing as __tracing;

pub use writer::{thread_number, Writer, CHUNK, FLUSH_EVERY, QUEUED_CHUNKS};

/// The access log's target: its filter directive (`fencegate::access=off`)
/// and its lines' `target` field.
pub const ACCESS_TARGET: &str = "fencegate::access";

/// Where the access log writes its own lines, once [`init`] installed the
/// writer.
#[derive(Debug)]
pub struct AccessSink {
    pub writer: Writer,
    pub format: LogFormat,
}

/// The installed writer, when [`init`] installed it (not in tests that set
/// a subscriber of their own, and not on a terminal, where tracing colours
/// the lines).
static SINK: OnceLock<AccessSink> = OnceLock::new();

/// The writer the access log formats its own lines into, if any.
pub fn access_sink() -> Option<&'static AccessSink> {
    SINK.get()
}

/// Lines dropped because the writer's queue was full or stdout failed (0
/// before [`init`]): `fencegate_log_dropped_total`.
pub fn dropped_lines() -> u64 {
    SINK.get().map_or(0, |s| s.writer.dropped_lines())
}

/// Keeps the writer thread and the traces' exporter; dropping it sends the
/// spans still batched, then writes out every line made so far.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(Option<Writer>, Option<traces::Traces>);

impl Drop for LogGuard {
    fn drop(&mut self) {
        // First: the flush may log that the endpoint could not be reached.
        drop(self.1.take());
        if let Some(writer) = &self.0 {
            writer.stop();
        }
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`.
/// With `tracing.otlp_endpoint` set, spans go there too ([`traces`]).
pub fn init(format: LogFormat, level: &str, tracing: &TracingConfig) -> LogGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // The traces' child spans are never the log's (traces/mod.rs).
    let filter = filter.add_directive(format!("{}=off", traces::SPAN_TARGET).parse().expect("a valid directive"));
    // Colour only for a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let writer = match Writer::start(std::io::stdout()) {
        Ok(writer) => writer,
        Err(e) => {
            eprintln!("cannot start the log writer thread: {e}");
            std::process::exit(1);
        }
    };
    let traces = match traces::layer(tracing) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    // The limit sits outside the filter: only what the filter lets through
    // counts against a call site's budget. With traces on, the filter is the
    // lines' own, so the OpenTelemetry layer sees spans the log does not;
    // off, it stays global, where a span no layer wants costs least.
    let (installed, traces) = match traces {
        None => {
            let lines = lines(&writer, ansi, format);
            (tracing_subscriber::registry().with(filter).with(lines).with(ForeignLimit::default()).try_init(), None)
        }
        Some((otel, traces)) => {
            let lines = lines(&writer, ansi, format).and_then(ForeignLimit::default()).with_filter(filter);
            (tracing_subscriber::registry().with(lines).with(otel).try_init(), Some(traces))
        }
    };
    match installed {
        Ok(()) => {
            // On a terminal, access lines go through tracing, which colours them.
            let sink = if ansi { None } else { Some(AccessSink { writer: writer.clone(), format }) };
            // `init` installs once, or returns above.
            let _ = sink.map(|s| SINK.set(s));
            LogGuard(Some(writer), traces)
        }
        // A subscriber is already set (tests that start several servers):
        // this writer was never installed.
        Err(_) => {
            writer.stop();
            LogGuard(None, None)
        }
    }
}

/// The log's layer: its lines, human or JSON, through `writer`.
fn lines<S>(writer: &Writer, ansi: bool, format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let lines = tracing_subscriber::fmt::layer().with_writer(writer.clone()).with_ansi(ansi);
    match format {
        LogFormat::Human => lines.boxed(),
        LogFormat::Json => lines.json().flatten_event(true).with_current_span(false).boxed(),
    }
}

/// An in-memory output for tests of the log's writing.
#[cfg(test)]
pub(crate) mod testing {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    /// Everything written to it, shared by its clones.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }
}
