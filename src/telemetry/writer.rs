//! The log's writer: lines are appended to a buffer of the thread that makes
//! them, and a thread of its own (`fencegate-log`) writes whole buffers to
//! stdout, as nginx's `access_log ... buffer=64k flush=1s` does.
//!
//! - **Access lines** stay in their thread's buffer until it holds
//!   [`CHUNK`] bytes, then the buffer goes to the writer's queue as one
//!   message; the writer also takes every partial buffer once a second
//!   ([`FLUSH_EVERY`]). A request never waits on stdout or wakes a thread:
//!   at tens of thousands of requests a second, the writer wakes a few
//!   times a second, not once per line.
//! - **Every other line** (warnings, audit lines, start-up and shutdown
//!   messages) goes out at once, with the access lines its thread made before
//!   it, so one thread's lines keep their order.
//! - The queue holds [`QUEUED_CHUNKS`] buffers. A buffer that finds it full
//!   (stdout slower than the lines: a blocked pipe, a full disk) is dropped
//!   and its lines are counted in `fencegate_log_dropped_total`; so are lines
//!   a failed write lost.
//! - [`Writer::stop`] (on a clean shutdown) takes the partial buffers, writes
//!   out everything queued and returns once it is written.
//!
//! Lines of different threads are not in time order within a second (each
//! buffer is written whole), as with nginx's buffered access log.

use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tracing::Metadata;
use tracing_subscriber::fmt::MakeWriter;

/// Bytes a thread's buffer holds before it is queued whole.
pub const CHUNK: usize = 64 * 1024;
/// Buffers queued for the writer before new ones are dropped (4 MiB of lines).
pub const QUEUED_CHUNKS: usize = 64;
/// How long an access line may wait in its thread's buffer.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Buffers threads share, by a number each thread takes on its first line.
const SHARDS: usize = 16;
/// How long a clean shutdown waits for the writer to write out what is queued.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// One thread's lines, not yet queued.
#[derive(Default)]
struct Lines {
    bytes: Vec<u8>,
    count: u64,
}

enum Message {
    Lines(Lines),
    /// Write out everything, then say so.
    Stop(mpsc::Sender<()>),
}

/// A buffer on a cache line of its own: threads on different buffers never
/// share one.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<Lines>);

struct Shared {
    shards: [Shard; SHARDS],
    queue: SyncSender<Message>,
    dropped: AtomicU64,
    stopped: AtomicBool,
}

/// The writer: cheap to clone, shared by every thread that logs.
#[derive(Clone)]
pub struct Writer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("dropped", &self.dropped_lines()).finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the writer thread, writing to `out`.
    pub fn start(out: impl Write + Send + 'static) -> std::io::Result<Self> {
        let (queue, messages) = mpsc::sync_channel(QUEUED_CHUNKS);
        let shared = Arc::new(Shared {
            shards: Default::default(),
            queue,
            dropped: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        let writer = Self { shared };
        let thread = writer.clone();
        std::thread::Builder::new().name("fencegate-log".into()).spawn(move || thread.run(messages, out))?;
        Ok(writer)
    }

    /// Lines dropped since the start: the queue was full, or a write failed.
    pub fn dropped_lines(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Appends one line made by `format` to this thread's buffer; queues the
    /// buffer when it is full, or at once when `urgent`.
    pub fn line(&self, urgent: bool, format: impl FnOnce(&mut Vec<u8>)) {
        if self.shared.stopped.load(Ordering::Relaxed) {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut lines = self.shard();
        if lines.bytes.capacity() == 0 {
            lines.bytes.reserve_exact(CHUNK + CHUNK / 16);
        }
        format(&mut lines.bytes);
        lines.count += 1;
        if urgent || lines.bytes.len() >= CHUNK {
            let full = std::mem::take(&mut *lines);
            drop(lines);
            self.queue(full);
        }
    }

    /// Writes out every line made so far and waits (a bounded time) until it
    /// is written. Lines made after it are dropped and counted.
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        self.take_partial();
        let (done, written) = mpsc::channel();
        let deadline = Instant::now() + STOP_WAIT;
        let mut stop = Message::Stop(done);
        // The queue may be full behind a slow stdout: wait for room, bounded.
        loop {
            match self.shared.queue.try_send(stop) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    stop = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let _ = written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }

    /// This thread's buffer.
    fn shard(&self) -> MutexGuard<'_, Lines> {
        let index = thread_number() % SHARDS;
        // A thread that panicked while appending left at worst a torn line.
        self.shared.shards[index].0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self, lines: Lines) {
        if lines.count == 0 {
            return;
        }
        if let Err(TrySendError::Full(Message::Lines(lost)) | TrySendError::Disconnected(Message::Lines(lost))) =
            self.shared.queue.try_send(Message::Lines(lines))
        {
            self.shared.dropped.fetch_add(lost.count, Ordering::Relaxed);
        }
    }

    /// Queues every thread's partial buffer.
    fn take_partial(&self) {
        for shard in &self.shared.shards {
            let lines = std::mem::take(&mut *shard.0.lock().unwrap_or_else(PoisonError::into_inner));
            self.queue(lines);
        }
    }

    /// The writer thread.
    fn run(self, messages: Receiver<Message>, mut out: impl Write) {
        let mut swept = Instant::now();
        loop {
            match messages.recv_timeout(FLUSH_EVERY.saturating_sub(swept.elapsed())) {
                Ok(Message::Lines(lines)) => self.write(&mut out, &lines),
                Ok(Message::Stop(done)) => {
                    // Everything queued before the stop is ahead of it; what
                    // threads made since is in their buffers.
                    self.take_partial();
                    while let Ok(Message::Lines(lines)) = messages.try_recv() {
                        self.write(&mut out, &lines);
                    }
                    // Later lines find the queue gone and are counted.
                    drop(messages);
                    let _ = done.send(());
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if swept.elapsed() >= FLUSH_EVERY {
                self.take_partial();
                swept = Instant::now();
            }
        }
    }

    fn write(&self, out: &mut impl Write, lines: &Lines) {
        if out.write_all(&lines.bytes).and_then(|()| out.flush()).is_err() {
            self.shared.dropped.fetch_add(lines.count, Ordering::Relaxed);
        }
    }
}

/// tracing's lines (all but the access log's fast path): each event is
/// formatted whole and written in one call, so one call is one line.
pub struct EventWriter<'a> {
    writer: &'a Writer,
    urgent: bool,
}

impl Write for EventWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.line(self.urgent, |bytes| bytes.extend_from_slice(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Writer {
    type Writer = EventWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        EventWriter { writer: self, urgent: true }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        EventWriter { writer: self, urgent: meta.target() != super::ACCESS_TARGET }
    }
}

/// This thread's number, given out in turn at its first call: what spreads
/// the threads that write (the workers, one per core) over shards of their
/// own, here and in the metrics, so none shares a lock or a cache line with
/// another.
pub fn thread_number() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    NUMBER.with(|number| {
        if number.get() == usize::MAX {
            number.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        number.get()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::telemetry::testing::Captured as Sink;

    /// What `sink` holds once something was written to it, or after `wait`.
    fn written_within(sink: &Sink, wait: Duration) -> String {
        let deadline = Instant::now() + wait;
        while sink.text().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        sink.text()
    }

    fn line(writer: &Writer, urgent: bool, text: &str) {
        writer.line(urgent, |b| {
            b.extend_from_slice(text.as_bytes());
            b.push(b'\n');
        });
    }

    #[test]
    fn an_urgent_line_goes_out_at_once_with_the_lines_its_thread_made_before() {
        let sink = Sink::default();
        let writer = Writer::start(sink.clone()).unwrap();
        line(&writer, false, "access 1");
        line(&writer, false, "access 2");
        line(&writer, true, "warning");
        assert_eq!(written_within(&sink, Duration::from_millis(500)), "access 1\naccess 2\nwarning\n");
        writer.stop();
    }

    #[test]
    fn a_partial_buffer_is_written_within_a_flush_interval() {
        let sink = Sink::default();
        let writer = Writer::start(sink.clone()).unwrap();
        line(&writer, false, "alone");
        std::thread::sleep(FLUSH_EVERY / 2);
        assert_eq!(written_within(&sink, FLUSH_EVERY * 2), "alone\n");
        writer.stop();
    }

    #[test]
    fn stop_writes_out_every_line_of_every_thread() {
        let sink = Sink::default();
        let writer = Writer::start(sink.clone()).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..5_000 {
                        line(&writer, false, &format!("thread {t} line {i}"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        writer.stop();
        let text = sink.text();
        assert_eq!(text.lines().count(), 40_000);
        assert_eq!(writer.dropped_lines(), 0);
        // One thread's lines stay in their order.
        for t in 0..8 {
            let mine: Vec<_> = text.lines().filter(|l| l.starts_with(&format!("thread {t} "))).collect();
            let expected: Vec<_> = (0..5_000).map(|i| format!("thread {t} line {i}")).collect();
            assert_eq!(mine, expected);
        }
        // After the stop, lines are dropped and counted, never waited for.
        line(&writer, true, "late");
        assert_eq!(writer.dropped_lines(), 1);
    }

    /// An output that blocks until told, as a pipe nobody reads.
    struct Stalled(Arc<(Mutex<bool>, std::sync::Condvar)>, Sink);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (open, turn) = &*self.0;
            let mut open = open.lock().unwrap();
            while !*open {
                open = turn.wait(open).unwrap();
            }
            self.1.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_output_drops_and_counts_lines_and_never_blocks_the_caller() {
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let sink = Sink::default();
        let writer = Writer::start(Stalled(gate.clone(), sink.clone())).unwrap();
        let line_text = "x".repeat(1023);
        // Far more than the queue holds: the writer is stuck on its first write.
        let lines = (QUEUED_CHUNKS + 8) * CHUNK / 1024;
        let started = Instant::now();
        for _ in 0..lines {
            line(&writer, false, &line_text);
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the caller waited on the output");
        let dropped = writer.dropped_lines();
        assert!(dropped > 0, "nothing was dropped behind a stalled output");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        writer.stop();
        let written = sink.text().lines().count() as u64;
        assert_eq!(written + writer.dropped_lines(), lines as u64, "every line is written or counted");
    }
}
