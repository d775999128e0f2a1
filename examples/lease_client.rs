//! A worker you can copy: it takes a lease from fencegate's lease API,
//! renews it in the background, and writes through the proxy with the
//! lease's token. Its job here: add 1 to a counter kept at KEY in the store
//! behind fencegate, WRITES times.
//!
//! What every worker of a fenced store must get right, each marked below:
//!
//! 1. The token comes from the lease: acquiring it raised the fence, so an
//!    older holder's late writes are refused from then on.
//! 2. A renewal that fails means the lease may be gone: stop writing at once,
//!    then take a new lease.
//! 3. A write refused with 409 means a newer holder has the key. Never send
//!    it again as it was: what it was computed from may have changed. Take a
//!    new lease, read the data again, and compute again.
//!
//! ```text
//! cargo run --release -- demo &      # fencegate on :8080, admin on :9901
//! FENCEGATE_ADMIN_TOKEN=demo-secret \
//!   cargo run --release --example lease_client -- /objects/counter worker-1 10
//! ```
//!
//! Environment: `FENCEGATE_PROXY` (default `http://127.0.0.1:8080`),
//! `FENCEGATE_ADMIN_URL` (default `http://127.0.0.1:9901`),
//! `FENCEGATE_ADMIN_TOKEN` (a bearer token that covers KEY: the admin token
//! or one of `[[admin.lease_tokens]]`), `LEASE_TTL` (default `5s`), `WORK`
//! (how long each step's work takes before its write, default none).
//! It prints one line per write, `TOKEN VALUE`, and exits 0 once WRITES
//! writes have landed.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

type Http = Client<HttpConnector, Full<Bytes>>;

/// What the worker talks to.
struct Worker {
    http: Http,
    proxy: String,
    admin: String,
    bearer: String,
    key: String,
    holder: String,
    ttl: Duration,
    work: Duration,
}

/// An answer: its status and body.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl Worker {
    async fn send(&self, method: Method, url: &str, headers: &[(&str, String)], body: Bytes) -> Result<Answer, String> {
        let mut req = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let resp = self.http.request(req).await.map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Answer { status, body })
    }

    /// A call of the lease API with a JSON body.
    async fn lease_call(&self, method: Method, body: Value) -> Result<Answer, String> {
        // Percent-encoded; a space as %20 (the lease API reads `+` as a plus sign).
        let key: String = form_urlencoded::byte_serialize(self.key.as_bytes()).collect();
        let url = format!("{}/leases?key={}", self.admin, key.replace('+', "%20"));
        let auth = ("authorization", self.bearer.clone());
        self.send(method, &url, &[auth], Bytes::from(body.to_string())).await
    }

    /// (1) The lease and its token, waiting while another holds it.
    async fn acquire(&self) -> Result<u64, String> {
        loop {
            let ttl = format!("{}ms", self.ttl.as_millis());
            let answer =
                self.lease_call(Method::POST, json!({ "holder": self.holder, "ttl": ttl, "wait": "10s" })).await?;
            match answer.status {
                StatusCode::OK => return answer.json()["token"].as_u64().ok_or("a lease without a token".to_owned()),
                // Held by another for the whole wait: ask again.
                StatusCode::LOCKED => continue,
                status => return Err(format!("acquire: {status}: {}", answer.json()["detail"])),
            }
        }
    }

    /// (2) Renews the lease every third of its time until told to stop; on a
    /// renewal that fails (refused, or no answer in time), sets `lost` and
    /// ends.
    fn renew_in_background(self: &Arc<Self>, token: u64, lost: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
        let worker = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(worker.ttl / 3).await;
                let ttl = format!("{}ms", worker.ttl.as_millis());
                let renewed = tokio::time::timeout(
                    worker.ttl / 3,
                    worker.lease_call(Method::PUT, json!({ "token": token, "ttl": ttl })),
                );
                match renewed.await {
                    Ok(Ok(answer)) if answer.status == StatusCode::OK => {}
                    _ => {
                        lost.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            }
        })
    }

    /// The counter as the store has it now (0 when it has none).
    async fn read(&self) -> Result<u64, String> {
        let answer = self.send(Method::GET, &format!("{}{}", self.proxy, self.key), &[], Bytes::new()).await?;
        match answer.status {
            StatusCode::NOT_FOUND => Ok(0),
            StatusCode::OK => {
                String::from_utf8_lossy(&answer.body).trim().parse().map_err(|e| format!("the counter: {e}"))
            }
            status => Err(format!("read: {status}")),
        }
    }

    /// One write with the lease's token; `Ok(false)`: refused as stale (3).
    async fn write(&self, token: u64, value: u64) -> Result<bool, String> {
        let url = format!("{}{}", self.proxy, self.key);
        let headers = [("x-fencing-token", token.to_string())];
        let answer = self.send(Method::PUT, &url, &headers, Bytes::from(value.to_string())).await?;
        match answer.status {
            s if s.is_success() => Ok(true),
            StatusCode::CONFLICT => Ok(false),
            status => Err(format!("write: {status}: {}", String::from_utf8_lossy(&answer.body))),
        }
    }

    /// Adds 1 to the counter `writes` times, each under a lease.
    async fn run(self: Arc<Self>, writes: u64) -> Result<(), String> {
        let mut landed = 0;
        while landed < writes {
            let token = self.acquire().await?;
            let lost = Arc::new(AtomicBool::new(false));
            let renewer = self.renew_in_background(token, lost.clone());
            while landed < writes {
                if lost.load(Ordering::SeqCst) {
                    eprintln!("renewal failed: stop writing with token {token}, take a new lease");
                    break;
                }
                // Read, then compute from what was read (and work on it).
                let value = self.read().await? + 1;
                tokio::time::sleep(self.work).await;
                if !self.write(token, value).await? {
                    // (3) A newer holder: no retry of this write, ever.
                    eprintln!("write with token {token} refused as stale: take a new lease and read again");
                    break;
                }
                println!("{token} {value}");
                landed += 1;
            }
            renewer.abort();
            // Done or lost: give the lease back (refused when it is gone: fine).
            let _ = self.lease_call(Method::DELETE, json!({ "token": token })).await;
        }
        Ok(())
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [key, holder, writes] = &args[..] else {
        eprintln!("usage: lease_client KEY HOLDER WRITES (e.g. /objects/counter worker-1 10)");
        return ExitCode::from(2);
    };
    let Ok(writes) = writes.parse::<u64>() else {
        eprintln!("WRITES must be a whole number, not '{writes}'");
        return ExitCode::from(2);
    };
    let Ok(token) = std::env::var("FENCEGATE_ADMIN_TOKEN") else {
        eprintln!("FENCEGATE_ADMIN_TOKEN must hold a bearer token that covers {key}");
        return ExitCode::from(2);
    };
    let ttl = match humantime::parse_duration(&env_or("LEASE_TTL", "5s")) {
        Ok(ttl) => ttl,
        Err(e) => {
            eprintln!("LEASE_TTL: {e}");
            return ExitCode::from(2);
        }
    };
    let work = match humantime::parse_duration(&env_or("WORK", "0s")) {
        Ok(work) => work,
        Err(e) => {
            eprintln!("WORK: {e}");
            return ExitCode::from(2);
        }
    };
    let worker = Arc::new(Worker {
        http: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        proxy: env_or("FENCEGATE_PROXY", "http://127.0.0.1:8080"),
        admin: env_or("FENCEGATE_ADMIN_URL", "http://127.0.0.1:9901"),
        bearer: format!("Bearer {}", token.trim()),
        key: key.clone(),
        holder: holder.clone(),
        ttl,
        work,
    });
    match worker.run(writes).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
