//! Listeners, connections and graceful shutdown, in the order a connection
//! meets them: accepted within its listener's limit (guard.rs), dealt to a
//! worker thread (workers.rs, listener.rs; the admin listener in
//! admin_listener.rs serves on a thread of its own), served under the
//! slow-head and idle guards until it closes (connection/), and, at shutdown,
//! drained (guard.rs) in the order
//! [`Fencegate::run`] spells out. Every descriptor they may hold is counted
//! in one account, checked at start (descriptors.rs).

mod admin_listener;
mod calls;
pub(crate) mod certs;
pub(crate) mod connection;
mod descriptors;
mod guard;
mod listener;
mod penalty;
mod proxy_header;
mod reload;
mod signals;
mod watch;
mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::admin::AdminState;
use crate::config::TlsError;
use crate::config::{Config, StoreKind};
use crate::fence::store::{longest_write_lease, FenceStore, WriteBounds};
use crate::fence::store::{AnyStore, CacheBounds, EtcdStore, FileStore, MemoryStore, OpenError, RedisStore};
use crate::fence::KeyGate;
use crate::http::BufferBudget;
use crate::metrics::Metrics;
use crate::route::{LiveRoutes, Route, RouteTable};
use crate::stack::{ConnectionLimits, Shared};
use admin_listener::AdminListener;
use descriptors::{Account, Spare};
use guard::Connections;
use workers::Workers;

pub use certs::{CertsReloaded, ServerTls};
pub use connection::give_back_memory_with;
pub use reload::{Reloaded, Reloader};
pub use signals::shutdown_signal;
pub use workers::MAX_BLOCKING_THREADS;

/// Why fencegate could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] OpenError),
    #[error("[fences] (store = \"redis\"): {0}")]
    Redis(crate::fence::store::StoreError),
    #[error("[fences] (store = \"etcd\"): {0}")]
    Etcd(crate::fence::store::StoreError),
    #[error("route '{0}' names a signing key file that was never read: load the config with its secrets")]
    UnreadSigningKey(String),
    #[error("route '{0}' has an https upstream whose TLS files were never read: load the config with its secrets")]
    UnreadUpstreamTls(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// A bound, not yet running fencegate. Binding first lets callers (tests,
/// `main`) learn the real addresses when the config asks for port 0.
pub struct Fencegate {
    config: Config,
    proxy: TcpListener,
    admin: TcpListener,
    state: Arc<AdminState>,
    shared: Arc<Shared>,
    tls: Option<Arc<ServerTls>>,
    reloader: Arc<Reloader>,
    /// What reloads the config from its file, once
    /// [`reload_from`](Self::reload_from) has named it.
    reloads: Option<reload::Triggers>,
}

impl Fencegate {
    /// Builds the store, the route table and both listeners.
    pub async fn bind(config: Config) -> Result<Fencegate, StartError> {
        unread_secrets(&config)?;
        for route in &config.routes {
            if let Some(why) = route.upstream_tls.as_ref().and_then(|t| t.no_roots()) {
                warn!(
                    route = %route.name,
                    upstream = %route.upstream.authority,
                    "{why}: the route's https upstream cannot be verified and every request to it gets 502; \
                     set the route's ca_file, or install the system's CA certificates"
                );
            }
        }
        // Read before anything is opened: a certificate that does not load
        // stops fencegate here, naming its field.
        let tls = config.server.tls.as_ref().map(ServerTls::load).transpose()?.map(Arc::new);
        // Before anything is opened: the limit may need raising first.
        descriptors::check(Account::of(&config));
        // Listeners first: a port already in use must not leave a store
        // opened and never closed behind it.
        let proxy = bind("proxy", config.server.listen).await?;
        let admin = bind("admin", config.admin.listen).await?;
        let store = match &config.fences.store {
            StoreKind::Memory => {
                warn!(
                    "fence store is \"memory\": every fence is lost when fencegate stops, and a stale lock \
                     holder can write again after a restart. Use it for tests and demos only."
                );
                AnyStore::Memory(MemoryStore::default())
            }
            StoreKind::File { path, require_existing, cache_keys, cache_bytes } => {
                let cache = CacheBounds { keys: *cache_keys, bytes: *cache_bytes };
                AnyStore::File(FileStore::open_with(path, *require_existing, cache)?)
            }
            StoreKind::Redis(redis) => AnyStore::Redis(RedisStore::open(redis).map_err(StartError::Redis)?),
            StoreKind::Etcd(etcd) => AnyStore::Etcd(EtcdStore::open(etcd).map_err(StartError::Etcd)?),
        };
        store.set_write_lease(longest_write_lease(config.routes.iter().map(WriteBounds::from)));
        // A restart on fences a previous process left: it may have died with
        // writes in flight, so keys start closed for their settle period.
        let gate = match &store {
            AnyStore::File(file) if file.reopened() => {
                info!("fences recovered: fenced writes wait for their route's settle period before the first goes out");
                KeyGate::reopened()
            }
            _ => KeyGate::default(),
        };
        let metrics =
            Metrics::new(config.routes.iter().map(|r| &*r.name), store.stats()).with_store_calls(store.call_stats());
        metrics.certificates().upstreams(&config.routes);
        let routes = RouteTable::new(config.routes.iter().map(|r| Route::in_service(r, &metrics, None)));
        let shared = Arc::new(Shared {
            metrics: Arc::new(metrics),
            routes: Arc::new(LiveRoutes::new(routes)),
            buffers: BufferBudget::new(config.server.max_buffered_bytes),
            per_connection: ConnectionLimits {
                buffer_share: config.server.max_connection_buffered_bytes,
                max_headers: config.server.max_headers,
                header_rate: config.server.max_upstream_header_rate,
                header_start: config.server.max_header_bytes as u64,
                refusal_drain: config.server.refusal_drain,
            },
            store: Arc::new(store),
            gate: Arc::new(gate),
        });
        let auth_token = Arc::new(arc_swap::ArcSwapOption::from(config.admin.auth_token.clone().map(Arc::new)));
        let lease_tokens = Arc::new(arc_swap::ArcSwap::from_pointee(config.admin.lease_tokens.clone()));
        let in_force = Arc::new(arc_swap::ArcSwap::from_pointee(config.clone()));
        let reloader = Arc::new(Reloader::new(
            shared.clone(),
            auth_token.clone(),
            lease_tokens.clone(),
            in_force.clone(),
            config.clone(),
        ));
        let state = Arc::new(AdminState {
            store: shared.store.clone(),
            gate: shared.gate.clone(),
            metrics: shared.metrics.clone(),
            buffers: shared.buffers.clone(),
            draining: AtomicBool::new(false),
            auth_token,
            lease_tokens,
            in_force,
            max_key_bytes: config.fences.max_key_bytes,
        });
        Ok(Fencegate { config, proxy, admin, state, shared, tls, reloader, reloads: None })
    }

    /// Reloads the routes from `path` on SIGHUP and whenever the file's
    /// directory changes (see reload.rs), from now until fencegate stops.
    /// `path` should hold the config this fencegate was bound with: the
    /// first change is a change from its text now. Call it within the tokio
    /// runtime that runs fencegate.
    pub fn reload_from(self, path: impl Into<PathBuf>) -> Fencegate {
        let reloads = Some(reload::Triggers::start(self.reloader.clone(), path.into()));
        Fencegate { reloads, ..self }
    }

    /// Applies configs to this fencegate while it runs.
    pub fn reloader(&self) -> Arc<Reloader> {
        self.reloader.clone()
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
    /// to finish; the admin listener answers until the proxy has drained, and
    /// is then drained within the same grace.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let Fencegate { config, proxy, admin, state, shared, tls, reloader: _, reloads } = self;
        let server = &config.server;
        info!(proxy = %proxy.local_addr().map(|a| a.to_string()).unwrap_or_default(),
              admin = %admin.local_addr().map(|a| a.to_string()).unwrap_or_default(),
              routes = config.routes.len(), "fencegate listening");

        // Reloads while these live.
        let _reloads = reloads;
        // A rotated certificate is picked up while this watch lives.
        let _tls_watch = tls.as_ref().and_then(|tls| match tls.watch(shared.metrics.tls_reloads()) {
            Ok(watch) => Some(watch),
            Err(e) => {
                warn!(error = %e, "cannot watch the TLS files: a rotated certificate needs a restart");
                None
            }
        });
        let mut workers = Workers::start_or_inline(server.workers);
        info!(workers = workers.len(), "serving client connections");
        // Each listener has a limit of its own: a full proxy listener leaves
        // `/healthz`, `/readyz` and `/metrics` answering, and idle admin
        // connections cannot take the proxy's descriptors. One spare
        // descriptor lets either answer when the process runs out.
        let spare = Arc::new(Spare::new());
        let proxy_connections = Connections::new("proxy", server.max_connections, spare.clone())
            .counted(shared.metrics.connections("proxy"));
        let admin_connections =
            Connections::new("admin", config.admin.max_connections, spare).counted(shared.metrics.connections("admin"));

        // The admin listener answers throughout, on its own thread (`/readyz`
        // says 503 once draining).
        let admin = AdminListener::start(admin, admin_connections, state.clone(), server.clone());
        tokio::select! {
            never = listener::accept(&proxy, &proxy_connections, &mut workers, &shared, server, tls) => match never {},
            () = shutdown => {}
        }
        // 1. Not ready: load balancers stop sending.
        state.draining.store(true, Ordering::Release);
        // 2. The proxy listener closes: new connections are refused.
        drop(proxy);
        // 3. Every proxy connection finishes its request in flight and
        //    closes, until the grace runs out; then the rest are cut.
        let grace = server.shutdown_grace;
        info!(grace = %humantime::format_duration(grace), "shutting down: draining in-flight requests");
        let deadline = Instant::now() + grace;
        let proxy_drained = proxy_connections.drain(deadline).await;
        // 4. The admin listener closes and drains, within the same grace.
        let admin_drained = admin.stop(deadline).await;
        if proxy_drained && admin_drained {
            info!("all connections drained");
        } else {
            warn!("shutdown grace period elapsed; closing the remaining connections");
        }
        workers.stop().await;

        // 5. No connection is left to use the fence store: it closes here,
        //    and nowhere else while fencegate runs, writing what is queued
        //    and folding its journal before the process exits.
        shared.store.close().await;
        drop(state);
    }
}

/// A route of `config` whose secrets were never read (a config validated but
/// not loaded with its secrets): it would refuse every signature, or reach
/// its https upstream never. Checked at start and at each reload.
pub(crate) fn unread_secrets(config: &Config) -> Result<(), StartError> {
    for route in &config.routes {
        if route.signing_key.as_ref().is_some_and(|k| k.bytes().is_none()) {
            return Err(StartError::UnreadSigningKey(route.name.to_string()));
        }
        if route.upstream_tls.as_ref().is_some_and(|t| !t.is_read()) {
            return Err(StartError::UnreadUpstreamTls(route.name.to_string()));
        }
    }
    Ok(())
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).await.map_err(|source| StartError::Bind { what, addr, source })
}

/// Binds and serves `config` until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), StartError> {
    Fencegate::bind(config).await?.run(shutdown).await;
    Ok(())
}
