//! The OTLP exporter's HTTP client: hyper-util's, on a runtime of its own.
//!
//! The SDK's batch processor exports from a thread of its own and blocks
//! on each post; hyper's connections need a tokio runtime to run on. Each
//! post is handed to a one-thread runtime kept for it, so the collector's
//! pace never reaches a worker's event loop, and the batch thread waits on
//! it without a runtime of its own.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};
use tokio::runtime::{Handle, Runtime};

/// The largest answer read from the collector (OTLP's are a few bytes).
const MAX_ANSWER: usize = 64 * 1024;

/// The exporter's runtime: one thread, `fencegate-otlp`.
pub(super) struct ExportRuntime(Option<Runtime>);

impl ExportRuntime {
    pub(super) fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fencegate-otlp")
            .enable_all()
            .build()?;
        Ok(ExportRuntime(Some(runtime)))
    }

    fn handle(&self) -> Handle {
        self.0.as_ref().expect("taken only on drop").handle().clone()
    }
}

impl Drop for ExportRuntime {
    fn drop(&mut self) {
        // Dropped where blocking is allowed or not (a test's runtime): never wait.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Posts the exporter's requests through hyper-util on the [`ExportRuntime`].
#[derive(Debug)]
pub(super) struct ExportClient {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: Handle,
    timeout: Duration,
}

impl ExportClient {
    pub(super) fn new(runtime: &ExportRuntime, timeout: Duration) -> Self {
        let runtime = runtime.handle();
        let client = {
            let _in = runtime.enter();
            Client::builder(TokioExecutor::new()).build_http()
        };
        ExportClient { client, runtime, timeout }
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let post = async move {
            let response = client.request(request.map(Full::new)).await?;
            let (head, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(head, body))
        };
        // The timer is made on the runtime: the batch thread has none.
        let answer = self.runtime.spawn(async move { tokio::time::timeout(timeout, post).await }).await?;
        let answer = answer.map_err(|_| HttpError::from(format!("no answer within {timeout:?}"))).and_then(|a| a);
        match &answer {
            Ok(response) if !response.status().is_success() => {
                crate::telemetry::warn_limited!(status = %response.status(), "the OTLP endpoint refused spans");
            }
            Err(e) => crate::telemetry::warn_limited!(error = %e, "cannot send spans to the OTLP endpoint"),
            Ok(_) => {}
        }
        answer
    }
}
