//! The descriptor account: every file descriptor fencegate may hold, counted
//! from the config (client connections of both listeners, each route's
//! upstream connections, the store's files, and a reserve for the runtime's
//! own), checked against `RLIMIT_NOFILE` at start; and the spare descriptor
//! that lets a listener still answer when the process has run out.
//!
//! At start the soft limit is raised toward the hard one if the account
//! needs it. If it still does not fit, fencegate starts anyway and warns with
//! the numbers and the fields to lower (as nginx does with
//! `worker_connections`): an ordinary machine's default limit must not stop a
//! demo config. At the limit, a new connection gets a 503 problem written on
//! the spare descriptor and is closed, and accepting waits for a descriptor to
//! be freed instead of spinning.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::config::{Config, StoreKind};
use crate::http::problem::{Problem, ProblemType};

/// Descriptors the file store keeps open (the B-tree file, two journal
/// files) and opens for a moment (directories it syncs, a fold).
const FILE_STORE_DESCRIPTORS: u64 = 8;
/// Descriptors fencegate holds whatever the config: standard streams, both
/// listeners, the spare, and the name lookups of connects in flight.
const FIXED_RESERVE: u64 = 16;
/// Each event loop (the main one, the admin listener's, each worker's) holds
/// a poller and a waker.
const PER_EVENT_LOOP: u64 = 2;
/// A directory watch (the config file's, the TLS files'): its inotify
/// instance, the poller and waker of its thread, and a file it reads again.
const PER_WATCH: u64 = 4;

/// Every descriptor fencegate may hold at once under `config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Account {
    /// `[server] max_connections`.
    pub proxy: u64,
    /// `[admin] max_connections`.
    pub admin: u64,
    /// The sum of the routes' `max_upstream_connections`.
    pub upstream: u64,
    /// The fence store's files.
    pub files: u64,
    /// The runtime's own and the watches': see [`FIXED_RESERVE`],
    /// [`PER_EVENT_LOOP`] and [`PER_WATCH`].
    pub reserve: u64,
}

impl Account {
    pub(crate) fn of(config: &Config) -> Account {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Account {
            proxy: count(config.server.max_connections),
            admin: count(config.admin.max_connections),
            upstream: config.routes.iter().fold(0u64, |sum, r| sum.saturating_add(count(r.max_upstream_connections))),
            files: match config.fences.store {
                StoreKind::File { .. } => FILE_STORE_DESCRIPTORS,
                StoreKind::Memory => 0,
                // One multiplexed connection, and one more while it reconnects.
                StoreKind::Redis(_) => 2,
                // A connection per endpoint (the client balances over them).
                StoreKind::Etcd(ref etcd) => count(etcd.endpoints.len()).saturating_add(1),
            },
            reserve: FIXED_RESERVE
                + PER_EVENT_LOOP * (count(config.server.workers) + 2)
                + PER_WATCH * (1 + u64::from(config.server.tls.is_some())),
        }
    }

    pub(crate) fn total(&self) -> u64 {
        [self.proxy, self.admin, self.upstream, self.files, self.reserve].into_iter().fold(0, u64::saturating_add)
    }
}

/// Reads `RLIMIT_NOFILE`, raises the soft limit toward the hard one if the
/// account needs it, and says whether it fits: a warning with the numbers
/// and the fields to lower when it does not.
pub(crate) fn check(account: Account) {
    let total = account.total();
    let (soft, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            warn!(error = %e, needed = total, "cannot read the open-file limit (RLIMIT_NOFILE); the descriptor account is unchecked");
            return;
        }
    };
    let mut limit = soft;
    if total > soft && hard > soft {
        let wanted = total.min(hard);
        match rlimit::setrlimit(rlimit::Resource::NOFILE, wanted, hard) {
            Ok(()) => {
                info!(
                    from = soft,
                    to = wanted,
                    "raised the open-file limit (RLIMIT_NOFILE) toward the descriptor account"
                );
                limit = wanted;
            }
            Err(e) => warn!(error = %e, soft, hard, "cannot raise the open-file limit (RLIMIT_NOFILE)"),
        }
    }
    if total > limit {
        warn!(
            needed = total,
            limit,
            hard,
            proxy_connections = account.proxy,
            admin_connections = account.admin,
            upstream_connections = account.upstream,
            files = account.files,
            reserve = account.reserve,
            "the descriptor account does not fit the open-file limit: lower [server] max_connections, \
             [admin] max_connections or the routes' max_upstream_connections, or raise the limit \
             (ulimit -n, LimitNOFILE=); at the limit new connections get 503 and are closed"
        );
    } else {
        info!(needed = total, limit, "descriptor account fits the open-file limit");
    }
}

/// A descriptor held back so that a listener out of descriptors can still
/// take one connection, answer it and close it. Shared by both listeners.
#[derive(Debug)]
pub(crate) struct Spare {
    file: Mutex<Option<File>>,
    /// Set while the process is out of descriptors: only the first refusal of
    /// a spell is logged, with the count of the spell's refusals when it ends.
    exhausted: AtomicBool,
    refused: AtomicU64,
}

impl Spare {
    pub(crate) fn new() -> Spare {
        let file = File::open("/dev/null")
            .inspect_err(|e| warn!(error = %e, "cannot hold a spare descriptor; out of descriptors, new connections will wait unanswered"))
            .ok();
        Spare { file: Mutex::new(file), exhausted: AtomicBool::new(false), refused: AtomicU64::new(0) }
    }

    /// Gives the spare descriptor back to the process; false if it is not held.
    pub(crate) fn release(&self) -> bool {
        self.file.lock().unwrap_or_else(PoisonError::into_inner).take().is_some()
    }

    /// Takes the spare descriptor again, if one is free.
    pub(crate) fn restore(&self) {
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if file.is_none() {
            *file = File::open("/dev/null").ok();
        }
    }

    /// A connection was refused for want of descriptors.
    pub(crate) fn note_refusal(&self, listener: &'static str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.note_exhausted(listener);
    }

    /// Accept failed for want of descriptors.
    pub(crate) fn note_exhausted(&self, listener: &'static str) {
        if !self.exhausted.swap(true, Ordering::Relaxed) {
            warn!(listener, "out of file descriptors: new connections get 503 and are closed until some are freed");
        }
    }

    /// A connection was accepted: if a spell of exhaustion was on, it ended.
    pub(crate) fn note_accept(&self) {
        if self.exhausted.load(Ordering::Relaxed) && self.exhausted.swap(false, Ordering::Relaxed) {
            let refused = self.refused.swap(0, Ordering::Relaxed);
            info!(refused, "file descriptors are available again");
        }
    }
}

/// Whether accept failed for want of descriptors (the process's or the
/// system's), rather than for a reason of the one connection.
pub(crate) fn out_of_descriptors(e: &io::Error) -> bool {
    // EMFILE and ENFILE, which std has no ErrorKind for.
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// How long a refusal waits for the client's request to arrive, and then
/// for its answer to be written: the spare is not held longer than this.
const REFUSAL_PATIENCE: Duration = Duration::from_millis(100);

/// Answers a connection taken on the spare descriptor with a 503 problem and
/// closes it. The client's first bytes are read first, so that the close does
/// not reset the answer away; every wait is bounded by [`REFUSAL_PATIENCE`].
/// An HTTP/2 client with prior knowledge sees a closed connection instead.
pub(crate) async fn refuse(mut stream: TcpStream) {
    let mut head = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSAL_PATIENCE, stream.read(&mut head)).await;
    let problem = Problem::new(
        ProblemType::DESCRIPTORS_EXHAUSTED,
        "fencegate has no file descriptor free for this connection; try again shortly",
    )
    .retry_soon();
    let answer = problem.into_http1_bytes();
    let _ = tokio::time::timeout(REFUSAL_PATIENCE, async {
        stream.write_all(&answer).await?;
        stream.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_counts_both_listeners_every_route_and_the_store() {
        let text = "[server]\nmax_connections = 100\nworkers = 2\n[admin]\nmax_connections = 5\n\
                    [[route]]\nname = \"a\"\nprefix = \"/a/\"\nupstream = \"http://127.0.0.1:1\"\nmax_upstream_connections = 7\n\
                    [[route]]\nname = \"b\"\nprefix = \"/b/\"\nupstream = \"http://127.0.0.1:1\"\nmax_upstream_connections = 3\n";
        let config = Config::from_toml_str(text).unwrap().read_secrets_with(None).unwrap();
        let account = Account::of(&config);
        assert_eq!(
            account,
            Account {
                proxy: 100,
                admin: 5,
                upstream: 10,
                files: FILE_STORE_DESCRIPTORS,
                reserve: FIXED_RESERVE + 8 + PER_WATCH
            }
        );
        assert_eq!(account.total(), 100 + 5 + 10 + FILE_STORE_DESCRIPTORS + FIXED_RESERVE + 8 + PER_WATCH);
        // With TLS, the certificate's directory is watched too.
        let tls = format!("[server.tls]\ncert = 'c'\nkey = 'k'\n{text}");
        let config = Config::from_toml_str(&tls).unwrap().read_secrets_with(None).unwrap();
        assert_eq!(Account::of(&config).reserve, FIXED_RESERVE + 8 + 2 * PER_WATCH);
    }

    #[test]
    fn the_spare_is_given_back_and_taken_again() {
        let spare = Spare::new();
        assert!(spare.release());
        assert!(!spare.release(), "released twice");
        spare.restore();
        assert!(spare.release());
    }
}
