//! Listeners, connections and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use crate::admin::{self, AdminState};
use crate::body::BufferBudget;
use crate::config::{Config, ServerConfig, StoreKind};
use crate::connection::{Activity, ActivityIo, Expiry};
use crate::fence::store::FenceStore;
use crate::fence::store::{AnyStore, FileStore, MemoryStore, OpenError};
use crate::fence::KeyGate;
use crate::metrics::Metrics;
use crate::proxy::Forward;
use crate::route::RouteTable;
use crate::stack::{proxy_service, Shared};

/// Blocking threads per worker runtime (tokio's default is 512).
pub const MAX_BLOCKING_THREADS: usize = 32;

/// Why fencegate could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] OpenError),
}

/// A bound, not yet running fencegate. Binding first lets callers (tests,
/// `main`) learn the real addresses when the config asks for port 0.
pub struct Fencegate {
    config: Config,
    proxy: TcpListener,
    admin: TcpListener,
    state: Arc<AdminState>,
}

impl Fencegate {
    /// Builds the store, the route table and both listeners.
    pub async fn bind(config: Config) -> Result<Fencegate, StartError> {
        let store = match &config.fences.store {
            StoreKind::Memory => {
                warn!(
                    "fence store is \"memory\": every fence is lost when fencegate stops, and a stale lock \
                     holder can write again after a restart. Use it for tests and demos only."
                );
                AnyStore::Memory(MemoryStore::default())
            }
            StoreKind::File { path, require_existing, cache_keys } => {
                AnyStore::File(FileStore::open(path, *require_existing, *cache_keys)?)
            }
        };
        // A restart on fences a previous process left: it may have died with
        // writes in flight, so keys start closed for their settle period.
        let gate = match &store {
            AnyStore::File(file) if file.reopened() => {
                info!("fences recovered: fenced writes wait for their route's settle period before the first goes out");
                KeyGate::reopened()
            }
            _ => KeyGate::default(),
        };
        let routes = RouteTable::new(config.routes.iter().cloned());
        let names = routes.names();
        let shared = Arc::new(Shared {
            metrics: Arc::new(Metrics::new(names.iter().map(|n| &**n), store.stats())),
            routes: Arc::new(routes),
            buffers: BufferBudget::new(config.server.max_buffered_bytes),
            store: Arc::new(store),
            gate: Arc::new(gate),
        });
        let proxy = bind("proxy", config.server.listen).await?;
        let admin = bind("admin", config.admin.listen).await?;
        let state = Arc::new(AdminState {
            shared,
            draining: AtomicBool::new(false),
            auth_token: config.admin.auth_token.clone(),
        });
        Ok(Fencegate { config, proxy, admin, state })
    }

    /// The proxy listener's address.
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy.local_addr().expect("bound listener has an address")
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr().expect("bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then drains: readiness turns 503, the
    /// proxy listener closes, and in-flight requests get `server.shutdown_grace`
    /// to finish.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let Fencegate { config, proxy, admin, state } = self;
        info!(proxy = %proxy.local_addr().map(|a| a.to_string()).unwrap_or_default(),
              admin = %admin.local_addr().map(|a| a.to_string()).unwrap_or_default(),
              routes = config.routes.len(), "fencegate listening");

        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin_task = tokio::spawn(serve_admin(admin, state.clone(), admin_stopped));

        let server = &config.server;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            // Our own guards (connection.rs) time request heads and idleness:
            // hyper's head timer would also close idle keep-alive connections.
            .header_read_timeout(None)
            // A head larger than this gets 431.
            .max_buf_size(server.max_header_bytes);
        builder.http2().timer(TokioTimer::new()).max_header_list_size(server.max_header_bytes as u32);
        let builder = Arc::new(builder);

        let workers = match Workers::start(server.workers) {
            Ok(workers) => workers,
            Err(e) => {
                // Serve from this runtime rather than not at all.
                warn!(error = %e, "cannot start the worker threads; serving connections on the main runtime");
                Workers::inline()
            }
        };
        info!(workers = workers.len(), "serving client connections");

        // One permit per open client connection: at the limit, accepting pauses
        // and new connections wait in the listen backlog. At shutdown, taking
        // every permit back means every connection has finished.
        let max_connections = u32::try_from(server.max_connections).unwrap_or(u32::MAX);
        let connections = Arc::new(Semaphore::new(max_connections as usize));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut next = 0usize;
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                _ = &mut shutdown => break,
            };
            tokio::select! {
                accepted = proxy.accept() => match accepted {
                    Ok((stream, peer)) => {
                        // Round robin: every worker gets an equal share of connections.
                        let worker = workers.get(next);
                        next = next.wrapping_add(1);
                        let accepted = Accepted { stream, peer, permit, stop: stop_rx.clone() };
                        if let Err(e) = worker.serve(accepted, &state.shared, &builder, server) {
                            debug!(%peer, error = %e, "cannot hand a connection to its worker");
                        }
                    }
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = &mut shutdown => break,
            }
        }

        state.draining.store(true, Ordering::Release);
        drop(proxy);
        let grace = config.server.shutdown_grace;
        info!(grace = %humantime::format_duration(grace), "shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
        match tokio::time::timeout(grace, connections.acquire_many(max_connections)).await {
            Ok(_) => info!("all connections drained"),
            Err(_) => warn!("shutdown grace period elapsed; closing the remaining connections"),
        }
        let _ = admin_stop.send(());
        let _ = admin_task.await;
        workers.stop().await;
        state.shared.store.close().await;
    }
}

/// A client connection on its way to a worker.
struct Accepted {
    stream: TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    stop: tokio::sync::watch::Receiver<bool>,
}

/// The threads that serve client connections: each runs a single-threaded
/// runtime, and a client connection's upstream connections live on the same
/// thread, so a request, its upstream exchange and its response all happen on
/// one thread, with no hand-offs between threads. Only the fence map and the
/// key turns are shared.
struct Workers {
    workers: Vec<Worker>,
}

struct Worker {
    /// `None`: serve on the runtime that accepts (the fallback).
    runtime: Option<tokio::runtime::Handle>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Workers {
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
                // runtime then closes whatever connections are left.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
            workers.push(Worker { runtime: Some(handle), stop: Some(stop), thread: Some(thread) });
        }
        Ok(Workers { workers })
    }

    fn inline() -> Workers {
        Workers { workers: vec![Worker { runtime: None, stop: None, thread: None }] }
    }

    fn len(&self) -> usize {
        self.workers.len()
    }

    fn get(&self, n: usize) -> &Worker {
        &self.workers[n % self.workers.len()]
    }

    /// Stops every worker thread and waits for it to end.
    async fn stop(self) {
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

impl Worker {
    /// Moves `accepted` onto this worker's runtime and serves it there.
    fn serve(
        &self,
        accepted: Accepted,
        shared: &Arc<Shared>,
        builder: &Arc<auto::Builder<TokioExecutor>>,
        server: &ServerConfig,
    ) -> std::io::Result<()> {
        let Accepted { stream, peer, permit, stop } = accepted;
        let (shared, builder, forward) = (shared.clone(), builder.clone(), Forward::new(peer));
        let (header_read_timeout, idle_timeout) = (server.header_read_timeout, server.idle_timeout);
        let serve = move |stream: TcpStream| async move {
            let _ = stream.set_nodelay(true);
            let activity = Activity::new(header_read_timeout, idle_timeout);
            let io = TokioIo::new(ActivityIo::new(stream, activity.clone()));
            let service = TowerToHyperService::new(proxy_service(&shared, &forward, activity.clone()));
            let conn = builder.serve_connection_with_upgrades(io, service).into_owned();
            serve_connection(conn, activity, stop, permit, peer).await;
        };
        match &self.runtime {
            None => {
                tokio::spawn(serve(stream));
            }
            Some(runtime) => {
                // The socket moves to the worker's event loop.
                let stream = stream.into_std()?;
                runtime.spawn(async move {
                    match TcpStream::from_std(stream) {
                        Ok(stream) => serve(stream).await,
                        Err(e) => debug!(%peer, error = %e, "cannot register a connection with its worker"),
                    }
                });
            }
        }
        Ok(())
    }
}

/// Serves one client connection until it ends, closing it when a guard trips
/// (a stuck request head at once, an idle connection gracefully) or when
/// shutdown begins (gracefully: the request in flight finishes first). A
/// graceful close the client does not let happen (an HTTP/2 client that never
/// answers the closing PING) becomes an abrupt one once the connection has no
/// request in flight and its close grace has passed; requests in flight are
/// never cut here (at shutdown, `shutdown_grace` bounds them).
async fn serve_connection<C, E>(
    conn: C,
    activity: Arc<Activity>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    permit: OwnedSemaphorePermit,
    peer: SocketAddr,
) where
    C: Future<Output = Result<(), E>> + GracefulClose,
    E: std::fmt::Display,
{
    tokio::pin!(conn);
    // When the graceful close began.
    let mut closing: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            // The connection first: it is what wakes this task on every request.
            biased;
            result = conn.as_mut() => {
                if let Err(e) = result {
                    debug!(%peer, error = %e, "client connection ended with an error");
                }
                break;
            }
            expiry = activity.expired(), if closing.is_none() => match expiry {
                Expiry::SlowHead => {
                    debug!(%peer, "closing a connection whose request head did not arrive in time");
                    break;
                }
                Expiry::Idle => {
                    conn.as_mut().close_gracefully();
                    closing = Some(tokio::time::Instant::now());
                }
            },
            _ = stop.wait_for(|stopping| *stopping), if closing.is_none() => {
                conn.as_mut().close_gracefully();
                closing = Some(tokio::time::Instant::now());
            }
            _ = activity.overstayed(closing.unwrap_or_else(tokio::time::Instant::now)), if closing.is_some() => {
                debug!(%peer, "closing a connection whose client did not let it close gracefully");
                break;
            }
        }
    }
    drop(permit);
}

/// A connection that can finish its request in flight and then close.
trait GracefulClose {
    fn close_gracefully(self: std::pin::Pin<&mut Self>);
}

impl<I, S, E, B> GracefulClose for auto::UpgradeableConnection<'_, I, S, E>
where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: 'static,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn close_gracefully(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).await.map_err(|source| StartError::Bind { what, addr, source })
}

async fn serve_admin(listener: TcpListener, state: Arc<AdminState>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let state = state.clone();
                let service = hyper::service::service_fn(move |req| admin::handle(state.clone(), peer, req));
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = &mut stop => return,
        }
    }
}

/// Binds and serves `config` until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), StartError> {
    Fencegate::bind(config).await?.run(shutdown).await;
    Ok(())
}
