//! A protocol switch: what the forward keeps of the client's side, and the
//! splice of the two connections once the upstream switched.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::proxy::Parking;

/// What the forward keeps of the client's request besides the request itself.
pub(super) struct Upgrade {
    /// The request asks to switch protocols, and may (it is not fenced).
    pub asked: bool,
    /// The client's side of the switch, when asked.
    pub client: Option<OnUpgrade>,
    /// Where the upstream connection comes from and goes back to.
    pub parking: Parking,
}

/// Copies bytes both ways between an upgraded client and upstream connection.
pub(super) async fn splice(client: OnUpgrade, upstream: OnUpgrade) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "protocol upgrade failed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!(error = %e, "upgraded connection ended with an error");
    }
}
