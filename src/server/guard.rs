//! A listener's connections, from accept to drain: at most `max_connections`
//! open at once, each one tracked, so that shutdown can ask them all to close,
//! wait for them, and cut the ones that outlast the grace. The proxy and the
//! admin listener each have one, so a full proxy never locks operators out.
//!
//! The drain is tokio-util's `TaskTracker` and `CancellationToken`: both work
//! across the worker runtimes, and the cut after the grace is one more token.
//!
//! Out of file descriptors, accept does not spin: the spare descriptor
//! (descriptors.rs) takes the waiting connection, which gets a 503 and is
//! closed; without a spare, accepting waits until one of the listener's
//! connections closes, or a short backoff.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::descriptors::{out_of_descriptors, refuse, Spare};
use crate::metrics::{ConnectionCount, OpenConnection};

/// One listener's open connections.
#[derive(Debug, Clone)]
pub(crate) struct Connections {
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    tasks: TaskTracker,
    /// Shutdown began: close gracefully.
    closing: CancellationToken,
    /// The shutdown grace ran out: close at once.
    cut: CancellationToken,
    /// The process's spare descriptor, for answering when out of them.
    spare: Arc<Spare>,
    /// Which listener, for the log.
    name: &'static str,
    /// One of this listener's connections closed: a descriptor was freed.
    freed: Arc<Notify>,
    /// `fencegate_open_connections` of this listener.
    open: ConnectionCount,
}

/// What an accepted connection holds until it ends: a slot of its listener's
/// limit, and an ear for shutdown.
#[derive(Debug)]
pub(crate) struct Admission {
    _slot: OwnedSemaphorePermit,
    closing: CancellationToken,
    cut: CancellationToken,
    freed: Arc<Notify>,
    _open: OpenConnection,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.freed.notify_waiters();
    }
}

impl Connections {
    /// At most `max` connections open at once on the listener `name`.
    pub(crate) fn new(name: &'static str, max: usize, spare: Arc<Spare>) -> Connections {
        Connections {
            slots: Arc::new(Semaphore::new(max.clamp(1, Semaphore::MAX_PERMITS))),
            tasks: TaskTracker::new(),
            closing: CancellationToken::new(),
            cut: CancellationToken::new(),
            spare,
            name,
            freed: Arc::new(Notify::new()),
            open: ConnectionCount::default(),
        }
    }

    /// These connections counted in `open` (a listener's
    /// `fencegate_open_connections`) while they are open.
    pub(crate) fn counted(self, open: ConnectionCount) -> Connections {
        Connections { open, ..self }
    }

    /// Waits for a free slot, then accepts the next connection on `listener`.
    /// At the limit, accepting pauses and new connections wait in the kernel's
    /// listen backlog, to be served in order as slots free.
    pub(crate) async fn accept(&self, listener: &TcpListener) -> (TcpStream, SocketAddr, Admission) {
        let Ok(slot) = self.slots.clone().acquire_owned().await else {
            // The semaphore is never closed; were it, there would be nothing to accept for.
            return std::future::pending().await;
        };
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    self.spare.note_accept();
                    let admission = Admission {
                        _slot: slot,
                        closing: self.closing.clone(),
                        cut: self.cut.clone(),
                        freed: self.freed.clone(),
                        _open: self.open.opened(),
                    };
                    return (stream, peer, admission);
                }
                Err(e) if out_of_descriptors(&e) => self.refuse_one(listener).await,
                Err(e) => {
                    // A failure of the one connection (it was reset while
                    // waiting, say): back off a little instead of spinning.
                    crate::telemetry::warn_limited!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Out of descriptors with a connection waiting: takes it on the spare
    /// descriptor, answers it 503 and closes it (within a fraction of a
    /// second, so one refusal at a time). Without the spare (the other
    /// listener holds it, or it could not be taken back), waits until one of
    /// this listener's connections closes, or a short backoff.
    async fn refuse_one(&self, listener: &TcpListener) {
        let freed = self.freed.notified();
        if self.spare.release() {
            // The connection is waiting, so this does not block; the bound is
            // for the descriptor being taken by another thread first.
            if let Ok(Ok((stream, _))) = tokio::time::timeout(Duration::from_millis(100), listener.accept()).await {
                self.spare.note_refusal(self.name);
                refuse(stream).await;
            }
            self.spare.restore();
            return;
        }
        self.spare.note_exhausted(self.name);
        let _ = tokio::time::timeout(Duration::from_millis(50), freed).await;
        self.spare.restore();
    }

    /// Runs a connection's task on `runtime` (this one if `None`), tracked so
    /// that [`drain`](Self::drain) waits for it.
    pub(crate) fn spawn<F>(&self, task: F, runtime: Option<&Handle>)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match runtime {
            Some(runtime) => drop(self.tasks.spawn_on(task, runtime)),
            None => drop(self.tasks.spawn(task)),
        }
    }

    /// Asks every connection to close gracefully (each finishes its request in
    /// flight first) and waits for them until `deadline`; those still open
    /// then are cut. Returns whether all of them closed in time. Accepting
    /// must have stopped.
    pub(crate) async fn drain(&self, deadline: Instant) -> bool {
        self.tasks.close();
        self.closing.cancel();
        if tokio::time::timeout_at(deadline, self.tasks.wait()).await.is_ok() {
            return true;
        }
        self.cut.cancel();
        self.tasks.wait().await;
        false
    }
}

impl Admission {
    /// Resolves once shutdown asks the connection to close gracefully.
    pub(crate) async fn closing(&self) {
        self.closing.cancelled().await;
    }

    /// Resolves once the shutdown grace has run out: the connection closes at
    /// once, request in flight or not.
    pub(crate) async fn cut(&self) {
        self.cut.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn listener() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_limit_the_next_connection_waits_for_a_slot() {
        let (listener, addr) = listener().await;
        let connections = Connections::new("test", 1, Arc::new(Spare::new()));
        let _first = TcpStream::connect(addr).await.unwrap();
        let (_, _, held) = connections.accept(&listener).await;
        let _second = TcpStream::connect(addr).await.unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(60), connections.accept(&listener)).await;
        assert!(waited.is_err(), "accepted past the limit");
        drop(held);
        connections.accept(&listener).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_waits_for_graceful_closes() {
        let connections = Connections::new("test", 4, Arc::new(Spare::new()));
        let (listener, addr) = listener().await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let (_, _, admission) = connections.accept(&listener).await;
        // A connection that takes a second to close once asked.
        connections.spawn(
            async move {
                admission.closing().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            },
            None,
        );
        let started = Instant::now();
        assert!(connections.drain(started + Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_cuts_what_outlasts_the_grace() {
        let connections = Connections::new("test", 4, Arc::new(Spare::new()));
        let (listener, addr) = listener().await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let (_, _, admission) = connections.accept(&listener).await;
        // A request in flight that would take ten minutes.
        connections.spawn(
            async move {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(600)) => {}
                    () = admission.cut() => {}
                }
            },
            None,
        );
        let started = Instant::now();
        assert!(!connections.drain(started + Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
