//! Listeners, connections and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::admin::{self, AdminState};
use crate::config::{Config, StoreKind};
use crate::fence::store::FenceStore;
use crate::fence::store::{AnyStore, FileStore, MemoryStore, OpenError};
use crate::fence::KeyGate;
use crate::metrics::Metrics;
use crate::proxy::Forward;
use crate::route::RouteTable;
use crate::stack::{proxy_service, Shared};

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
        let routes = RouteTable::new(config.routes.iter().cloned());
        let names = routes.names();
        let shared = Arc::new(Shared {
            metrics: Arc::new(Metrics::new(names.iter().map(|n| &**n), store.stats())),
            routes,
            store: Arc::new(store),
            gate: Arc::new(KeyGate::default()),
            forward: Forward::new(),
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

        let graceful = GracefulShutdown::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new());
        builder.http2().timer(TokioTimer::new());
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = proxy.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let service = TowerToHyperService::new(proxy_service(&state.shared, peer));
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
                        let conn = graceful.watch(conn);
                        tokio::spawn(async move {
                            if let Err(e) = conn.await {
                                debug!(%peer, error = %e, "client connection ended with an error");
                            }
                        });
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
        match tokio::time::timeout(grace, graceful.shutdown()).await {
            Ok(()) => info!("all connections drained"),
            Err(_) => warn!("shutdown grace period elapsed; closing the remaining connections"),
        }
        let _ = admin_stop.send(());
        let _ = admin_task.await;
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
