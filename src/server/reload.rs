//! Live configuration: SIGHUP, or a change in the config file's directory,
//! reads the config again and puts its routes in service.
//!
//! What a reload changes: the `[[route]]` tables, each with its policy
//! (prefix, upstream, key, methods, timeouts, body limits, signing key files,
//! read again). The directories of the secret files the config names at
//! start are watched too, so a rotated signing key or admin token is a
//! change. Requests route by the new table from the moment it is in
//! place; a request already routed keeps its route, and so the policy it
//! started with, to its end. A route that keeps its name, upstream and
//! connection cap keeps its upstream connections and their count; the fence
//! store, its marks and the keys' turns are not touched.
//!
//! The fence API's admin token (`auth_token`, its file, or the environment)
//! changes with it, and the admin `GET /config` shows the new config.
//!
//! What it does not change: `[server]` (listeners, limits, TLS files, the
//! PROXY protocol, trusted proxies),
//! the rest of `[admin]`, `[fences]`, `[log]` and `[tracing]`. A new config that changes any of them
//! is refused whole, nothing applied, with a log line naming the sections
//! that take a restart; so is a config that does not validate, with every
//! problem logged as `--check` prints them. The running config keeps serving
//! either way. Each attempt counts in `fencegate_config_reloads_total`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::{ArcSwap, ArcSwapOption};
use tracing::{info, warn};

use super::descriptors::{self, Account};
use crate::config::{secret_files, AdminConfig, Config, ConfigError, ConfigProblem, LeaseToken};
use crate::fence::store::{longest_write_lease, FenceStore, WriteBounds};
use crate::metrics::Reloads;
use crate::route::{Route, RouteTable};
use crate::server::watch::{watch_dirs_of, DirWatch};
use crate::stack::Shared;

/// What a reload did.
#[derive(Debug)]
pub enum Reloaded {
    /// The new routes serve every request routed from now on.
    Applied { routes: usize },
    /// The new config does not validate: nothing changed.
    Invalid(ConfigError),
    /// The new config changes what a reload cannot: nothing changed.
    RestartNeeded(Vec<&'static str>),
}

/// What a config file and the secret files it names held at an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Read {
    text: Option<String>,
    secrets: Vec<(PathBuf, Option<Vec<u8>>)>,
}

impl Read {
    fn of(path: &Path) -> Read {
        let text = std::fs::read_to_string(path).ok();
        let secrets = text
            .as_deref()
            .map(secret_files)
            .unwrap_or_default()
            .into_iter()
            .map(|file| {
                let bytes = std::fs::read(&file).ok();
                (file, bytes)
            })
            .collect();
        Read { text, secrets }
    }
}

/// Reloads the config of a running fencegate.
#[derive(Debug)]
pub struct Reloader {
    shared: Arc<Shared>,
    /// The fence API's bearer token: a reload may change it.
    admin_token: Arc<ArcSwapOption<String>>,
    /// The lease API's scoped tokens: a reload may change them too.
    lease_tokens: Arc<ArcSwap<Vec<LeaseToken>>>,
    /// What the admin `GET /config` shows: the config in service.
    in_force: Arc<ArcSwap<Config>>,
    /// The config in service: what the next one is compared with.
    running: Mutex<Config>,
    /// Held through each reload, so two never interleave (a SIGHUP and a
    /// change of the file at once), with what the last attempt read: a
    /// change event that leaves the file and its secrets as they were (another
    /// file of the directory changed) is no reload, nor one that would only
    /// refuse the same config again.
    last: Mutex<Option<Read>>,
    counts: Reloads,
}

impl Reloader {
    pub(super) fn new(
        shared: Arc<Shared>,
        admin_token: Arc<ArcSwapOption<String>>,
        lease_tokens: Arc<ArcSwap<Vec<LeaseToken>>>,
        in_force: Arc<ArcSwap<Config>>,
        running: Config,
    ) -> Reloader {
        let counts = shared.metrics.reloads();
        let (running, last) = (Mutex::new(running), Mutex::new(None));
        Reloader { shared, admin_token, lease_tokens, in_force, running, last, counts }
    }

    /// Puts `new`'s routes (and admin token) in service if nothing else in it
    /// differs from the running config; logs and counts what happened.
    pub fn apply(&self, new: Config) -> Reloaded {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let mut new = new;
        // The same check as at start: a route whose secrets were never read
        // would refuse every signature or never reach its https upstream.
        if let Err(e) = super::unread_secrets(&new) {
            let problem = ConfigProblem { field: "route".into(), message: e.to_string() };
            return self
                .refused(Reloaded::Invalid(ConfigError { source_name: "config".into(), problems: vec![problem] }));
        }
        let changed = restart_needed(&running, &mut new);
        if !changed.is_empty() {
            return self.refused(Reloaded::RestartNeeded(changed));
        }
        // More upstream connections may be allowed now: raise the open-file
        // limit if it needs it, or say it does not fit.
        descriptors::check(Account::of(&new));
        let serving = self.shared.routes.current();
        let metrics = &self.shared.metrics;
        let table = RouteTable::new(
            new.routes.iter().map(|route| Route::in_service(route, metrics, serving.named(&route.name).map(|r| &**r))),
        );
        self.shared.routes.replace(table);
        metrics.certificates().upstreams(&new.routes);
        // After a confirm of a shared store, writes are held as long as a
        // write of these routes may be in flight.
        self.shared.store.set_write_lease(longest_write_lease(new.routes.iter().map(WriteBounds::from)));
        if new.admin.auth_token != running.admin.auth_token {
            self.admin_token.store(new.admin.auth_token.clone().map(Arc::new));
            info!("config reload: the fence API's admin token changed");
        }
        if new.admin.lease_tokens != running.admin.lease_tokens {
            self.lease_tokens.store(Arc::new(new.admin.lease_tokens.clone()));
            info!("config reload: the lease API's tokens changed");
        }
        let routes = new.routes.len();
        self.in_force.store(Arc::new(new.clone()));
        *running = new;
        self.counts.applied.inc();
        info!(routes, "config reloaded: new requests use the new routes; requests in flight finish on theirs");
        Reloaded::Applied { routes }
    }

    /// Reads `path` (and the secrets it names) and applies it.
    pub fn reload(&self, path: &Path) -> Reloaded {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let read = Read::of(path);
        *last = Some(read.clone());
        self.load(path, read)
    }

    /// Like [`reload`](Self::reload), unless the file and its secrets hold
    /// what the last attempt read.
    fn reload_if_changed(&self, path: &Path) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let read = Read::of(path);
        if last.as_ref() == Some(&read) {
            return;
        }
        *last = Some(read.clone());
        self.load(path, read);
    }

    fn load(&self, path: &Path, read: Read) -> Reloaded {
        let loaded = match &read.text {
            Some(text) => Config::load_text(path, text),
            None => Config::load(path),
        };
        match loaded {
            Ok(config) => self.apply(config),
            Err(e) => self.refused(Reloaded::Invalid(e)),
        }
    }

    fn refused(&self, reloaded: Reloaded) -> Reloaded {
        match &reloaded {
            Reloaded::Invalid(e) => {
                self.counts.invalid.inc();
                warn!("config reload refused, the running config keeps serving: {e}");
            }
            Reloaded::RestartNeeded(changed) => {
                self.counts.restart_needed.inc();
                warn!(
                    changed = %changed.join(", "),
                    "config reload refused, the running config keeps serving: these change only with a restart \
                     (listeners, limits, TLS files, the fence store, logging); nothing was applied, routes included"
                );
            }
            Reloaded::Applied { .. } => {}
        }
        reloaded
    }
}

/// What in `new` differs from `running` that only a restart can change.
/// `new`'s derived per-connection buffer share becomes the running one when
/// its routes fit in it: an unset `max_connection_buffered_bytes` follows the
/// routes' `max_body`, and a smaller body needs no new share.
fn restart_needed(running: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let (was, is) = (&running.server, &mut new.server);
    if !was.max_connection_buffered_bytes_set && !is.max_connection_buffered_bytes_set {
        if is.max_connection_buffered_bytes > was.max_connection_buffered_bytes {
            changed.push("[server] max_connection_buffered_bytes, derived from a route's larger max_body");
        }
        is.max_connection_buffered_bytes = was.max_connection_buffered_bytes;
    }
    if *was != *is {
        changed.push("[server]");
    }
    // The admin token and the lease tokens are secrets a reload may change.
    let without_token =
        |admin: &AdminConfig| AdminConfig { auth_token: None, lease_tokens: Vec::new(), ..admin.clone() };
    if without_token(&running.admin) != without_token(&new.admin) {
        changed.push("[admin]");
    }
    if running.fences != new.fences {
        changed.push("[fences]");
    }
    if running.log != new.log {
        changed.push("[log]");
    }
    if running.tracing != new.tracing {
        changed.push("[tracing]");
    }
    changed
}

/// The reload triggers of a running fencegate: SIGHUP and the config file's
/// directory. They stop when this is dropped.
pub(super) struct Triggers {
    _watch: Option<DirWatch>,
    hangup: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Triggers {
    fn drop(&mut self) {
        if let Some(task) = &self.hangup {
            task.abort();
        }
    }
}

impl Triggers {
    /// Starts watching the directories of `path` and of the secret files it
    /// names now, and listening for SIGHUP.
    pub(super) fn start(reloader: Arc<Reloader>, path: PathBuf) -> Triggers {
        // What is in service is what the files hold as fencegate starts.
        let read = Read::of(&path);
        let secrets: Vec<PathBuf> = read.secrets.iter().map(|(file, _)| file.clone()).collect();
        *reloader.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(read);
        let watch = {
            let (reloader, file) = (reloader.clone(), path.clone());
            let watched = std::iter::once(path.as_path()).chain(secrets.iter().map(PathBuf::as_path));
            match watch_dirs_of(watched, move || reloader.reload_if_changed(&file)) {
                Ok(watch) => Some(watch),
                Err(e) => {
                    warn!(error = %e, "cannot watch the config file's directory: reload with SIGHUP");
                    None
                }
            }
        };
        Triggers { _watch: watch, hangup: hangup(reloader, path) }
    }
}

#[cfg(unix)]
fn hangup(reloader: Arc<Reloader>, path: PathBuf) -> Option<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGHUP: the config reloads when its file changes");
            return None;
        }
    };
    Some(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            info!(path = %path.display(), "SIGHUP: reloading the config");
            let (reloader, path) = (reloader.clone(), path.clone());
            // Reading files: off the thread that accepts connections.
            let _ = tokio::task::spawn_blocking(move || reloader.reload(&path)).await;
        }
    }))
}

#[cfg(not(unix))]
fn hangup(_: Arc<Reloader>, _: PathBuf) -> Option<tokio::task::JoinHandle<()>> {
    None
}
