//! The threads that serve client connections: each runs a single-threaded
//! runtime, and the upstream connections its clients use live on the same
//! thread (shared by its HTTP/1.1 clients), so a request, its upstream
//! exchange and its response all happen on one thread, with no hand-offs
//! between threads. Only the fence map and the key turns are shared between
//! threads.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::guard::Connections;

/// Blocking threads per worker runtime (tokio's default is 512).
pub const MAX_BLOCKING_THREADS: usize = 32;

/// Every worker, in the order connections are dealt to them.
pub(super) struct Workers {
    workers: Vec<Worker>,
    /// Where the next connection goes: round robin gives every worker an
    /// equal share.
    next: usize,
}

struct Worker {
    /// `None`: serve on the runtime that accepts (the fallback).
    runtime: Option<tokio::runtime::Handle>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// `count` worker threads; if they cannot be started, connections are
    /// served on the caller's runtime rather than not at all.
    pub(super) fn start_or_inline(count: usize) -> Workers {
        match Workers::start(count) {
            Ok(workers) => workers,
            Err(e) => {
                warn!(error = %e, "cannot start the worker threads; serving connections on the main runtime");
                Workers { workers: vec![Worker { runtime: None, stop: None, thread: None }], next: 0 }
            }
        }
    }

    fn start(count: usize) -> std::io::Result<Workers> {
        let mut workers = Vec::with_capacity(count);
        for i in 0..count.max(1) {
            // Blocking threads serve the file store's cache misses (a few at
            // a time, see FileStore) and name lookups; idle ones linger for
            // seconds, so an unbounded pool keeps hundreds after a burst.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(MAX_BLOCKING_THREADS)
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::Builder::new().name(format!("fencegate-worker-{i}")).spawn(move || {
                // Serves what is spawned on it until told to stop; dropping the
                // runtime then drops whatever is left on it.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
            workers.push(Worker { runtime: Some(handle), stop: Some(stop), thread: Some(thread) });
        }
        Ok(Workers { workers, next: 0 })
    }

    pub(super) fn len(&self) -> usize {
        self.workers.len()
    }

    /// Serves `stream` with `serve` on the next worker's runtime, as one of
    /// `connections`.
    pub(super) fn serve<F, Fut>(&mut self, stream: TcpStream, peer: SocketAddr, connections: &Connections, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let worker = &self.workers[self.next % self.workers.len()];
        self.next = self.next.wrapping_add(1);
        let Some(runtime) = &worker.runtime else {
            connections.spawn(serve(stream), None);
            return;
        };
        // The socket moves to the worker's event loop.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                debug!(%peer, error = %e, "cannot hand a connection to its worker");
                return;
            }
        };
        let task = async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => debug!(%peer, error = %e, "cannot register a connection with its worker"),
            }
        };
        connections.spawn(task, Some(runtime));
    }

    /// Stops every worker thread and waits for it to end. Whatever is still
    /// running on them (an upgraded connection's tunnel) is dropped.
    pub(super) async fn stop(self) {
        let mut threads = Vec::new();
        for mut worker in self.workers {
            if let Some(stop) = worker.stop.take() {
                let _ = stop.send(());
            }
            threads.extend(worker.thread.take());
        }
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}
