//! What the guards' unit tests share: a connection task that waits on its
//! guard, and HTTP/2 frames built by hand.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::activity::{Activity, Expiry};
use super::frames::Frames;

pub(super) const DATA: u8 = 0x0;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PING: u8 = 0x6;
pub(super) const WINDOW_UPDATE: u8 = 0x8;

/// The defaults' shape: a 10 s `header_read_timeout`, a 60 s `idle_timeout`.
pub(super) fn activity() -> Arc<Activity> {
    Activity::new(Duration::from_secs(10), Duration::from_secs(60))
}

/// The connection task's side: waits for a guard to trip.
pub(super) fn guard(a: &Arc<Activity>) -> tokio::task::JoinHandle<Expiry> {
    let a = a.clone();
    tokio::spawn(async move { a.expired_past_rest().await })
}

/// `waiting` trips with `expiry` exactly `after` from now.
pub(super) async fn trips(waiting: tokio::task::JoinHandle<Expiry>, expiry: Expiry, after: Duration) {
    let now = Instant::now();
    assert_eq!(waiting.await.unwrap(), expiry);
    assert_eq!(now.elapsed(), after);
}

/// An HTTP/2 frame: its 9-byte header and a zeroed payload of `len` bytes.
pub(super) fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
    let len_bytes = (len as u32).to_be_bytes();
    let mut out = vec![len_bytes[1], len_bytes[2], len_bytes[3], kind, flags, 0, 0, 0, 1];
    out.resize(Frames::HEADER_LEN + len, 0);
    out
}
