//! Live configuration: SIGHUP, or a change in the config file's directory,
//! reads the config again and puts its routes in service.
//!
//! What a reload changes: the `[[route]]` tables, each with its policy
//! (prefix, upstream, key, methods, timeouts, body limits, signing key files,
//! read again). Requests route by the new table from the moment it is in
//! place; a request already routed keeps its route, and so the policy it
//! started with, to its end. A route that keeps its name, upstream and
//! connection cap keeps its upstream connections and their count; the fence
//! store, its marks and the keys' turns are not touched.
//!
//! What it does not change: `[server]` (listeners, limits, TLS files),
//! `[admin]`, `[fences]` and `[log]`. A new config that changes any of them
//! is refused whole, nothing applied, with a log line naming the sections
//! that take a restart; so is a config that does not validate, with every
//! problem logged as `--check` prints them. The running config keeps serving
//! either way. Each attempt counts in `fencegate_config_reloads_total`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tracing::{info, warn};

use crate::config::{Config, ConfigError};
use crate::metrics::Reloads;
use crate::route::RouteTable;
use crate::stack::Shared;
use crate::watch::{watch_dirs_of, DirWatch};

/// What a reload did.
#[derive(Debug)]
pub enum Reloaded {
    /// The new routes serve every request routed from now on.
    Applied { routes: usize },
    /// The new config does not validate: nothing changed.
    Invalid(ConfigError),
    /// The new config changes sections a reload cannot: nothing changed.
    RestartNeeded(Vec<&'static str>),
}

/// Reloads the config of a running fencegate.
#[derive(Debug)]
pub struct Reloader {
    shared: Arc<Shared>,
    /// The config in service: what the next one is compared with.
    running: Mutex<Config>,
    /// The file's text at the last attempt: a change event that leaves it
    /// as it was (another file of the directory changed) is no reload.
    last_text: Mutex<Option<String>>,
    counts: Reloads,
}

impl Reloader {
    pub(super) fn new(shared: Arc<Shared>, running: Config) -> Reloader {
        let counts = shared.metrics.reloads();
        Reloader { shared, running: Mutex::new(running), last_text: Mutex::new(None), counts }
    }

    /// Puts `new`'s routes in service if nothing else in it differs from the
    /// running config; logs and counts what happened.
    pub fn apply(&self, new: Config) -> Reloaded {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let changed: Vec<&'static str> = [
            ("[server]", running.server != new.server),
            ("[admin]", running.admin != new.admin),
            ("[fences]", running.fences != new.fences),
            ("[log]", running.log != new.log),
        ]
        .into_iter()
        .filter_map(|(section, changed)| changed.then_some(section))
        .collect();
        if !changed.is_empty() {
            return self.refused(Reloaded::RestartNeeded(changed));
        }
        let serving = self.shared.routes.current();
        let metrics = &self.shared.metrics;
        let table = RouteTable::new(
            new.routes.iter().map(|route| route.in_service(metrics, serving.named(&route.name).map(|r| &**r))),
        );
        self.shared.routes.replace(table);
        let routes = new.routes.len();
        *running = new;
        self.counts.applied.inc();
        info!(routes, "config reloaded: new requests use the new routes; requests in flight finish on theirs");
        Reloaded::Applied { routes }
    }

    /// Reads `path` (and the secrets it names) and applies it.
    pub fn reload(&self, path: &Path) -> Reloaded {
        *self.last_text.lock().unwrap_or_else(PoisonError::into_inner) = std::fs::read_to_string(path).ok();
        match Config::load(path) {
            Ok(config) => self.apply(config),
            Err(e) => self.refused(Reloaded::Invalid(e)),
        }
    }

    /// Like [`reload`](Self::reload), unless the file's text is what the
    /// last attempt read.
    fn reload_if_changed(&self, path: &Path) {
        let text = std::fs::read_to_string(path).ok();
        if text.is_some() && *self.last_text.lock().unwrap_or_else(PoisonError::into_inner) == text {
            return;
        }
        self.reload(path);
    }

    fn refused(&self, reloaded: Reloaded) -> Reloaded {
        match &reloaded {
            Reloaded::Invalid(e) => {
                self.counts.invalid.inc();
                warn!("config reload refused, the running config keeps serving: {e}");
            }
            Reloaded::RestartNeeded(sections) => {
                self.counts.restart_needed.inc();
                warn!(
                    changed = %sections.join(", "),
                    "config reload refused, the running config keeps serving: these sections change only with a \
                     restart (listeners, limits, TLS files, the admin token, the fence store, logging); nothing \
                     was applied, routes included"
                );
            }
            Reloaded::Applied { .. } => {}
        }
        reloaded
    }
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
    /// Starts watching `path`'s directory and listening for SIGHUP.
    pub(super) fn start(reloader: Arc<Reloader>, path: PathBuf) -> Triggers {
        // The text in service is the file's as fencegate started.
        *reloader.last_text.lock().unwrap_or_else(PoisonError::into_inner) = std::fs::read_to_string(&path).ok();
        let watch = {
            let (reloader, file) = (reloader.clone(), path.clone());
            match watch_dirs_of([path.as_path()], move || reloader.reload_if_changed(&file)) {
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
