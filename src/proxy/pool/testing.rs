//! Upstreams for the pool's unit tests, and requests through its checkout.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::{Parking, Upstreams};
use crate::http::RequestBody;
use crate::proxy::{UpstreamError, UpstreamSlots};

/// An upstream that answers every request 200 "ok", keeping connections alive.
pub(super) async fn upstream() -> Authority {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                TokioIo::new(stream),
                hyper::service::service_fn(|_| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
                }),
            ));
        }
    });
    authority
}

/// A GET through `upstreams` as an HTTP/2 client's: on its own connections.
pub(super) async fn get(
    upstreams: &Upstreams,
    authority: &Authority,
    slots: &UpstreamSlots,
) -> Result<(), UpstreamError> {
    get_parking(upstreams, authority, slots, Parking::Client).await
}

/// A GET through `upstreams`, its connection parked where `parking` says.
pub(super) async fn get_parking(
    upstreams: &Upstreams,
    authority: &Authority,
    slots: &UpstreamSlots,
    parking: Parking,
) -> Result<(), UpstreamError> {
    let checkout = upstreams.checkout(authority, slots, Duration::from_secs(5), parking).await?;
    let request = Request::get("/").body(RequestBody::empty()).unwrap();
    let response = upstreams.send(authority, None, slots, checkout, request, None).await?;
    response.into_body().collect().await.unwrap();
    Ok(())
}

/// An upstream that answers every request 200 with a two-byte body whose
/// bytes it sends only once `release` is notified, one response each.
pub(super) async fn holding_upstream(release: Arc<Semaphore>) -> Authority {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let release = release.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0; 1024];
                loop {
                    let Ok(n @ 1..) = stream.read(&mut buf).await else { return };
                    head.extend_from_slice(&buf[..n]);
                    if !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        continue;
                    }
                    head.clear();
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                    release.acquire().await.unwrap().forget();
                    if stream.write_all(b"ok").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    authority
}

pub(super) fn request() -> Request<RequestBody> {
    Request::get("/").body(RequestBody::empty()).unwrap()
}
