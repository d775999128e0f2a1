//! Calls to etcd: one client per member, and the member calls go to. A call
//! goes to the member that answered last; one a member could not have
//! taken (it refused the connection, or has no leader) is made again with
//! the next member within the same `timeout`; one a member took and failed,
//! or did not answer in time, fails (etcd may have applied it) and sends the
//! next calls to the next member.

use std::future::Future;
use std::sync::atomic::Ordering;

use etcd_client::{Client, GetOptions, Txn};
use tokio::time::Instant;

use super::{Inner, STORE};
use crate::fence::store::StoreError;

impl Inner {
    /// The client of member `i`, connected if need be.
    pub(super) async fn member(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let member = &self.members[i];
        let mut client = member.client.lock().await;
        if let Some(client) = &*client {
            return Ok(client.clone());
        }
        let connected = Client::connect([member.url.as_str()], Some(self.options.clone())).await?;
        *client = Some(connected.clone());
        Ok(connected)
    }

    /// The client of the member calls go to now (the watch's).
    pub(super) async fn client(&self) -> Result<Client, StoreError> {
        let i = self.current.load(Ordering::Relaxed) % self.members.len();
        match tokio::time::timeout(self.timeout, self.member(i)).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => {
                self.current.store(i + 1, Ordering::Relaxed);
                Err(self.failed("connecting to etcd", &e))
            }
            Err(_) => Err(self.no_answer("connecting to etcd")),
        }
    }

    /// A call that failed with `e`: etcd is unreachable, unless it answered
    /// with an error of its own.
    pub(super) fn failed(&self, context: &'static str, e: &etcd_client::Error) -> StoreError {
        let error = StoreError::Failed { store: STORE, context, message: e.to_string() };
        self.note_answer(if answered(e) { Ok(()) } else { Err(&error) });
        error
    }

    pub(super) fn no_answer(&self, context: &'static str) -> StoreError {
        let error = StoreError::NoAnswer { store: STORE, context, after: self.timeout };
        self.note_answer(Err(&error));
        error
    }

    /// One etcd call, `call` made with a member's client, within `timeout`.
    /// A member that could not have taken it (it refused the connection, or
    /// has no leader) has it made again with the next member; one that took
    /// it and failed, or did not answer, sends the next calls to the next
    /// member, and this one fails (it may have been applied).
    pub(super) async fn call<T, F, Fut>(&self, context: &'static str, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let count = self.members.len();
        let first = self.current.load(Ordering::Relaxed) % count;
        let mut unsent = None;
        for i in (first..first + count).map(|i| i % count) {
            let client = match tokio::time::timeout_at(deadline, self.member(i)).await {
                Ok(Ok(client)) => client,
                // Connecting failed (authentication included): no call can
                // be made through this member.
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, member = %self.members[i].url, "connecting to an etcd member");
                    self.current.store(i + 1, Ordering::Relaxed);
                    unsent = Some(e);
                    continue;
                }
                Err(_) => break,
            };
            let sent = Instant::now();
            match tokio::time::timeout_at(deadline, call(client)).await {
                Ok(Ok(answer)) => {
                    self.calls.answered(sent.elapsed());
                    self.current.store(i, Ordering::Relaxed);
                    self.note_answer(Ok(()));
                    return Ok(answer);
                }
                Ok(Err(e)) if not_taken(&e) => {
                    tracing::debug!(error = %e, member = %self.members[i].url, "an etcd member cannot take calls; trying the next");
                    self.current.store(i + 1, Ordering::Relaxed);
                    unsent = Some(e);
                }
                Ok(Err(e)) => {
                    self.current.store(i + 1, Ordering::Relaxed);
                    return Err(self.failed(context, &e));
                }
                Err(_) => {
                    self.current.store(i + 1, Ordering::Relaxed);
                    return Err(self.no_answer(context));
                }
            }
        }
        // No member took the call: etcd is unreachable to this replica.
        Err(match unsent {
            Some(e) => {
                let error = StoreError::Failed { store: STORE, context, message: e.to_string() };
                self.note_answer(Err(&error));
                error
            }
            None => self.no_answer(context),
        })
    }
}

/// One member of the cluster, and its client once connected.
pub(super) struct Member {
    pub url: String,
    pub client: tokio::sync::Mutex<Option<Client>>,
}

/// Whether a call that failed with `e` never reached etcd's log: the member
/// refused the connection, or has no leader (`require_leader`). Such a call
/// may be made again with another member.
fn not_taken(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message();
            // gRPC UNAVAILABLE.
            // Not "request timed out, possibly due to connection lost": a
            // proposal that may still be applied.
            status.code() as i32 == 14
                && ["tcp connect error", "error trying to connect", "Connection refused", "etcdserver: no leader"]
                    .iter()
                    .any(|never_sent| message.contains(never_sent))
        }
        _ => false,
    }
}

/// Whether etcd itself answered a call with the error `e` (a lease it does
/// not know, a request it refuses): it is reachable.
fn answered(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            // UNKNOWN (a transport error), CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE.
            !matches!(status.code() as i32, 1 | 2 | 4 | 14)
        }
        etcd_client::Error::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// `txn` on `client`, for [`Inner::call`].
pub(super) fn c_txn(
    client: &mut Client,
    txn: &Txn,
) -> impl Future<Output = Result<etcd_client::TxnResponse, etcd_client::Error>> {
    let (mut client, txn) = (client.clone(), txn.clone());
    async move { client.txn(txn).await }
}

/// A range read on `client`, for [`Inner::call`].
pub(super) fn c_get(
    client: &mut Client,
    from: &str,
    options: &GetOptions,
) -> impl Future<Output = Result<etcd_client::GetResponse, etcd_client::Error>> {
    let (mut client, from, options) = (client.clone(), from.to_owned(), options.clone());
    async move { client.get(from, Some(options)).await }
}
