//! `fencegate fence get|set|list|delete`: a small client of the admin fence API, for
//! scripts and on-call humans. It reads the admin address and bearer token from
//! the same config (and `FENCEGATE_ADMIN_TOKEN`) as the server.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// What went wrong talking to the admin API; `main` prints it and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the admin API at {addr}: {detail}")]
    Unreachable { addr: SocketAddr, detail: String },
    #[error("{0}")]
    Refused(String),
}

/// The admin API of one fencegate.
pub struct AdminClient {
    addr: SocketAddr,
    token: Option<String>,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

/// The answer to `fence set`.
#[derive(Debug, PartialEq, Eq)]
pub enum SetOutcome {
    Raised { previous: Option<u64> },
    Refused { current: u64 },
}

impl AdminClient {
    /// A client for the admin listener at `listen`; a wildcard address means this host.
    pub fn new(listen: SocketAddr, token: Option<String>) -> Self {
        let mut addr = listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let client = Client::builder(TokioExecutor::new()).build_http();
        AdminClient { addr, token, client }
    }

    async fn call(&self, method: Method, query: &str, body: Option<Value>) -> Result<(StatusCode, Value), CliError> {
        self.call_at(method, &format!("/fences?{query}"), body).await
    }

    async fn call_at(
        &self,
        method: Method,
        target: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), CliError> {
        let unreachable = |detail: String| CliError::Unreachable { addr: self.addr, detail };
        let mut req = Request::builder().method(method).uri(format!("http://{}{target}", self.addr));
        if let Some(token) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = req.body(Full::new(body)).map_err(|e| unreachable(e.to_string()))?;
        let resp = self.client.request(req).await.map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| unreachable(e.to_string()))?.to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, value))
    }

    fn refused(status: StatusCode, body: &Value) -> CliError {
        let detail = body["detail"].as_str().unwrap_or("no detail");
        CliError::Refused(format!("admin API answered {status}: {detail}"))
    }

    /// The mark of `key`, or `None`.
    pub async fn get(&self, key: &str) -> Result<Option<u64>, CliError> {
        let (status, body) = self.call(Method::GET, &encode(&[("key", key)]), None).await?;
        if status != StatusCode::OK {
            return Err(Self::refused(status, &body));
        }
        Ok(body["token"].as_u64())
    }

    /// Raises the mark of `key` to `token`.
    pub async fn set(&self, key: &str, token: u64) -> Result<SetOutcome, CliError> {
        let body = serde_json::json!({ "token": token });
        let (status, body) = self.call(Method::PUT, &encode(&[("key", key)]), Some(body)).await?;
        match status {
            StatusCode::OK => Ok(SetOutcome::Raised { previous: body["previous"].as_u64() }),
            StatusCode::CONFLICT => match body["current"].as_u64() {
                Some(current) => Ok(SetOutcome::Refused { current }),
                None => Err(Self::refused(status, &body)),
            },
            _ => Err(Self::refused(status, &body)),
        }
    }

    /// Confirms the shared fence store as it is now (after this replica's
    /// remembered marks are raised back into it); returns the answer's JSON.
    pub async fn confirm_store(&self) -> Result<Value, CliError> {
        let (status, body) = self.call_at(Method::POST, "/fences/store/confirm", None).await?;
        if status != StatusCode::OK {
            return Err(Self::refused(status, &body));
        }
        Ok(body)
    }

    /// Deletes the mark of `key`; returns how many were deleted (0 or 1) and
    /// the mark it had.
    pub async fn delete_key(&self, key: &str) -> Result<(u64, Option<u64>), CliError> {
        let (status, body) = self.call(Method::DELETE, &encode(&[("key", key)]), None).await?;
        if status != StatusCode::OK {
            return Err(Self::refused(status, &body));
        }
        Ok((body["deleted"].as_u64().unwrap_or(0), body["token"].as_u64()))
    }

    /// Deletes every mark whose key starts with `prefix`; `all` must be set
    /// when the prefix matches every key. Returns how many were deleted.
    pub async fn delete_prefix(&self, prefix: &str, all: bool) -> Result<u64, CliError> {
        let mut params = vec![("prefix", prefix)];
        if all {
            params.push(("all", "true"));
        }
        let (status, body) = self.call(Method::DELETE, &encode(&params), None).await?;
        if status != StatusCode::OK {
            return Err(Self::refused(status, &body));
        }
        Ok(body["deleted"].as_u64().unwrap_or(0))
    }

    /// Every mark whose key starts with `prefix`, in key order, page by page.
    pub async fn list(&self, prefix: &str, mut each: impl FnMut(&str, u64)) -> Result<(), CliError> {
        let mut after: Option<String> = None;
        loop {
            let mut params = vec![("prefix", prefix), ("limit", "1000")];
            if let Some(a) = &after {
                params.push(("after", a));
            }
            let (status, body) = self.call(Method::GET, &encode(&params), None).await?;
            if status != StatusCode::OK {
                return Err(Self::refused(status, &body));
            }
            for fence in body["fences"].as_array().into_iter().flatten() {
                if let (Some(key), Some(token)) = (fence["key"].as_str(), fence["token"].as_u64()) {
                    each(key, token);
                }
            }
            match body["next"].as_str() {
                Some(next) => after = Some(next.to_string()),
                None => return Ok(()),
            }
        }
    }
}

fn encode(params: &[(&str, &str)]) -> String {
    // The fence API decodes `+` as a plus sign, not a space (keys are decoded
    // like request paths): spaces go as %20. The serializer already writes a
    // literal `+` as %2B, so every `+` it leaves is a space.
    form_urlencoded::Serializer::new(String::new()).extend_pairs(params).finish().replace('+', "%20")
}
