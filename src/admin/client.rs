//! `fencegate fence get|set|list|delete|confirm-store` and `fencegate lease
//! acquire|renew|release|show`: a small client of the admin fence and lease
//! APIs, for scripts and on-call humans. It talks to the admin URL
//! it is given ([`AdminUrl`]), with the bearer token it is given; `main`
//! decides where both come from (flags, environment, or the config).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// How long the client waits for a TCP connection to the admin listener.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the admin API is: plain `http://host:port`, optionally under a path
/// (a reverse proxy in front of the admin listener).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminUrl {
    authority: Authority,
    /// Empty, or a path starting with `/` and not ending with one.
    base: String,
}

/// Why an admin URL is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdminUrlError {
    #[error("'{0}' is not a URL like http://127.0.0.1:9901 ({1})")]
    Invalid(String, String),
    #[error(
        "'{0}': the admin listener speaks plain HTTP only (it has no TLS); reach a remote one through a tunnel \
         (ssh -L, kubectl port-forward) and give http://127.0.0.1:PORT"
    )]
    Https(String),
    #[error("'{0}': the admin URL must start with http://")]
    Scheme(String),
    /// The URL is not repeated: it holds a password.
    #[error("the admin URL has an `@` in it (a user or password?): put the admin token in --token-file or FENCEGATE_ADMIN_TOKEN, not in the URL")]
    Userinfo,
    #[error("'{0}': an admin URL has no query or fragment; the command adds its own")]
    Query(String),
}

impl AdminUrl {
    /// Parses `http://host[:port][/path]`; a bare `host:port` means http.
    pub fn parse(text: &str) -> Result<AdminUrl, AdminUrlError> {
        let owned = text.trim().to_string();
        // Any `@` is refused before anything else, and the text never echoed:
        // it may hold a password, in whatever part a parser would put it
        // (`https://u:p@h`, `http://u:p#s@h`, `http://h:1/x@y`).
        if owned.contains('@') {
            return Err(AdminUrlError::Userinfo);
        }
        let full = if owned.contains("://") { owned.clone() } else { format!("http://{owned}") };
        let uri: Uri =
            full.parse().map_err(|e: http::uri::InvalidUri| AdminUrlError::Invalid(owned.clone(), e.to_string()))?;
        match uri.scheme() {
            Some(s) if *s == Scheme::HTTP => {}
            Some(s) if *s == Scheme::HTTPS => return Err(AdminUrlError::Https(owned)),
            _ => return Err(AdminUrlError::Scheme(owned)),
        }
        let Some(authority) = uri.authority().cloned() else {
            return Err(AdminUrlError::Invalid(owned, "no host".into()));
        };
        if authority.host().is_empty() {
            return Err(AdminUrlError::Invalid(owned, "no host".into()));
        }
        let port = authority.as_str().strip_prefix(authority.host()).unwrap_or_default();
        if !port.is_empty() && authority.port_u16().is_none_or(|p| p == 0) {
            return Err(AdminUrlError::Invalid(owned, "the port is not a number from 1 to 65535".into()));
        }
        if uri.query().is_some() || full.contains('#') {
            return Err(AdminUrlError::Query(owned));
        }
        let base = uri.path().trim_end_matches('/').to_string();
        Ok(AdminUrl { authority, base })
    }

    /// The admin listener at `listen`, as configured; a wildcard address
    /// means this host.
    pub fn from_listen(listen: SocketAddr) -> AdminUrl {
        let mut addr = listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let authority = addr.to_string().parse().expect("a socket address is an authority");
        AdminUrl { authority, base: String::new() }
    }

    fn at(&self, target: &str) -> String {
        format!("http://{}{}{target}", self.authority, self.base)
    }
}

impl fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.base)
    }
}

/// What went wrong talking to the admin API; `main` prints it and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(
        "cannot reach the admin API at {url}: {detail}; is fencegate running, and is this the address of its \
         admin listener ([admin] listen)?"
    )]
    Unreachable { url: AdminUrl, detail: String },
    #[error("the admin API at {url} did not answer within {}", humantime::format_duration(*after))]
    TimedOut { url: AdminUrl, after: Duration },
    #[error(
        "the admin API refused the change (401 Unauthorized): {}; it needs the server's admin token ([admin] \
         auth_token, or the contents of its auth_token_file): give it with --token-file FILE or the \
         FENCEGATE_ADMIN_TOKEN environment variable",
        if *sent { "the admin token given is not the server's" } else { "no admin token was given" }
    )]
    Unauthorized { sent: bool },
    #[error("{detail}: fence changes are disabled until the server has an [admin] auth_token (or auth_token_file)")]
    ChangesDisabled { detail: String },
    #[error("{0}")]
    Refused(String),
    /// The token holds a byte no header value may (a line break inside it).
    #[error(
        "the admin token cannot be sent: it holds a character an HTTP header may not (a line break or other \
         control character inside it?)"
    )]
    BadToken,
    /// The answer could not be written out (a full disk, or a reader that
    /// went away: `fencegate fence list | head`).
    #[error("cannot write to stdout: {0}")]
    Output(#[from] std::io::Error),
}

/// The admin API of one fencegate.
pub struct AdminClient {
    url: AdminUrl,
    token: Option<String>,
    timeout: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// The answer to `fence set`.
#[derive(Debug, PartialEq, Eq)]
pub enum SetOutcome {
    Raised { previous: Option<u64> },
    Refused { current: u64 },
}

/// `error` and its sources, outermost first: hyper's own says only
/// "client error (Connect)", its source says what happened.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        next = e.source();
    }
    text
}

impl AdminClient {
    /// A client of the admin API at `url`, sending `token` as the bearer
    /// token, waiting at most `timeout` for each answer.
    pub fn new(url: AdminUrl, token: Option<String>, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT.min(timeout)));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        AdminClient { url, token, timeout, client }
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
        let unreachable = |detail: String| CliError::Unreachable { url: self.url.clone(), detail };
        let mut req = Request::builder().method(method).uri(self.url.at(target));
        if let Some(token) = &self.token {
            let value = http::HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| CliError::BadToken)?;
            req = req.header(http::header::AUTHORIZATION, value);
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = req.body(Full::new(body)).map_err(|e| unreachable(chain(&e)))?;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| unreachable(chain(&e)))?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await.map_err(|e| unreachable(chain(&e)))?.to_bytes();
            Ok::<_, CliError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| CliError::TimedOut { url: self.url.clone(), after: self.timeout })??;
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match status {
            StatusCode::UNAUTHORIZED => Err(CliError::Unauthorized { sent: self.token.is_some() }),
            StatusCode::FORBIDDEN if target.starts_with("/fences") => Err(CliError::ChangesDisabled {
                detail: value["detail"].as_str().unwrap_or("403 Forbidden").to_string(),
            }),
            StatusCode::FORBIDDEN => Err(CliError::Refused(format!(
                "the admin API answered 403 Forbidden: {}",
                value["detail"].as_str().unwrap_or("no detail")
            ))),
            _ => Ok((status, value)),
        }
    }

    /// An answer other than the one expected: the problem's detail, with a
    /// hint when the answer looks like one of the proxy listener's (a route's
    /// 404, 428, 502 or 504), or has no detail at all.
    fn refused(&self, status: StatusCode, body: &Value) -> CliError {
        let hint = format!(
            "is {} the address of fencegate's admin listener ([admin] listen), not its proxy listener?",
            self.url
        );
        let proxy_like = [
            StatusCode::NOT_FOUND,
            StatusCode::PRECONDITION_REQUIRED,
            StatusCode::BAD_GATEWAY,
            StatusCode::GATEWAY_TIMEOUT,
        ]
        .contains(&status);
        CliError::Refused(match body["detail"].as_str() {
            Some(detail) if proxy_like => format!("the admin API answered {status}: {detail}; {hint}"),
            Some(detail) => format!("the admin API answered {status}: {detail}"),
            None => format!("{} answered {status} without a problem detail; {hint}", self.url),
        })
    }

    /// The mark of `key`, or `None`.
    pub async fn get(&self, key: &str) -> Result<Option<u64>, CliError> {
        let (status, body) = self.call(Method::GET, &encode(&[("key", key)]), None).await?;
        if status != StatusCode::OK {
            return Err(self.refused(status, &body));
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
                None => Err(self.refused(status, &body)),
            },
            _ => Err(self.refused(status, &body)),
        }
    }

    /// Confirms the shared fence store as it is now (after this replica's
    /// remembered marks are raised back into it); returns the answer's JSON.
    pub async fn confirm_store(&self) -> Result<Value, CliError> {
        let (status, body) = self.call_at(Method::POST, "/fences/store/confirm", None).await?;
        if status != StatusCode::OK {
            return Err(self.refused(status, &body));
        }
        Ok(body)
    }

    /// Deletes the mark of `key`; returns how many were deleted (0 or 1) and
    /// the mark it had.
    pub async fn delete_key(&self, key: &str) -> Result<(u64, Option<u64>), CliError> {
        let (status, body) = self.call(Method::DELETE, &encode(&[("key", key)]), None).await?;
        if status != StatusCode::OK {
            return Err(self.refused(status, &body));
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
            return Err(self.refused(status, &body));
        }
        Ok(body["deleted"].as_u64().unwrap_or(0))
    }

    /// `GET /leases?key=K`: the lease held now (JSON) or `Null`, and the mark.
    pub async fn lease_show(&self, key: &str) -> Result<(Value, Option<u64>), CliError> {
        let (status, body) = self.lease_call(Method::GET, key, None).await?;
        if status != StatusCode::OK {
            return Err(self.refused(status, &body));
        }
        Ok((body["lease"].clone(), body["mark"].as_u64()))
    }

    /// `POST /leases?key=K`: the lease granted, or the problem of one held
    /// (423).
    pub async fn lease_acquire(
        &self,
        key: &str,
        holder: &str,
        (ttl, wait): (Duration, Option<Duration>),
        strict: bool,
    ) -> Result<Result<Value, Value>, CliError> {
        let mut body = serde_json::json!({ "holder": holder, "ttl": show(ttl), "strict": strict });
        if let Some(wait) = wait {
            body["wait"] = show(wait).into();
        }
        self.lease_change(Method::POST, key, body, StatusCode::LOCKED).await
    }

    /// `PUT /leases?key=K`: the lease renewed, or the problem of one lost (409).
    pub async fn lease_renew(&self, key: &str, token: u64, ttl: Duration) -> Result<Result<Value, Value>, CliError> {
        let body = serde_json::json!({ "token": token, "ttl": show(ttl) });
        self.lease_change(Method::PUT, key, body, StatusCode::CONFLICT).await
    }

    /// `DELETE /leases?key=K`: released, or the problem of one lost (409).
    pub async fn lease_release(&self, key: &str, token: u64) -> Result<Result<Value, Value>, CliError> {
        self.lease_change(Method::DELETE, key, serde_json::json!({ "token": token }), StatusCode::CONFLICT).await
    }

    async fn lease_change(
        &self,
        method: Method,
        key: &str,
        body: Value,
        refusal: StatusCode,
    ) -> Result<Result<Value, Value>, CliError> {
        let (status, body) = self.lease_call(method, key, Some(body)).await?;
        match status {
            StatusCode::OK => Ok(Ok(body)),
            s if s == refusal => Ok(Err(body)),
            _ => Err(self.refused(status, &body)),
        }
    }

    async fn lease_call(
        &self,
        method: Method,
        key: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), CliError> {
        self.call_at(method, &format!("/leases?{}", encode(&[("key", key)])), body).await
    }

    /// Every mark whose key starts with `prefix`, in key order, page by page.
    /// `each` may stop the listing with an error.
    pub async fn list(
        &self,
        prefix: &str,
        mut each: impl FnMut(&str, u64) -> Result<(), CliError>,
    ) -> Result<(), CliError> {
        let mut after: Option<String> = None;
        loop {
            let mut params = vec![("prefix", prefix), ("limit", "1000")];
            if let Some(a) = &after {
                params.push(("after", a));
            }
            let (status, body) = self.call(Method::GET, &encode(&params), None).await?;
            if status != StatusCode::OK {
                return Err(self.refused(status, &body));
            }
            for fence in body["fences"].as_array().into_iter().flatten() {
                if let (Some(key), Some(token)) = (fence["key"].as_str(), fence["token"].as_u64()) {
                    each(key, token)?;
                }
            }
            match body["next"].as_str() {
                Some(next) => after = Some(next.to_string()),
                None => return Ok(()),
            }
        }
    }
}

/// A duration as the lease API reads it (`"1500ms"`).
fn show(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn encode(params: &[(&str, &str)]) -> String {
    // The fence API decodes `+` as a plus sign, not a space (keys are decoded
    // like request paths): spaces go as %20. The serializer already writes a
    // literal `+` as %2B, so every `+` it leaves is a space.
    form_urlencoded::Serializer::new(String::new()).extend_pairs(params).finish().replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls_are_plain_http_with_an_optional_base_path() {
        let ok = |text: &str| AdminUrl::parse(text).unwrap().to_string();
        assert_eq!(ok("http://127.0.0.1:9901"), "http://127.0.0.1:9901");
        assert_eq!(ok("http://127.0.0.1:9901/"), "http://127.0.0.1:9901");
        assert_eq!(ok("127.0.0.1:9901"), "http://127.0.0.1:9901");
        assert_eq!(ok(" http://admin.fencegate.svc:9901/gate/ "), "http://admin.fencegate.svc:9901/gate");
        assert_eq!(ok("http://[::1]:9901"), "http://[::1]:9901");
        assert_eq!(AdminUrl::parse("http://h:1/base").unwrap().at("/fences?key=a"), "http://h:1/base/fences?key=a");
        let err = |text: &str| AdminUrl::parse(text).unwrap_err();
        assert!(matches!(err("https://127.0.0.1:9901"), AdminUrlError::Https(_)));
        assert!(matches!(err("ftp://127.0.0.1:9901"), AdminUrlError::Scheme(_)));
        // A password is never echoed, wherever a parser would put it.
        for with_secret in [
            "http://user:s3cret@127.0.0.1:9901",
            "https://user:s3cret@127.0.0.1:9901",
            "ftp://user:s3cret@h:1",
            "http://user:p#s3cret@h:1",
            "http://user:1234/s3cret@h",
            "http://user:s3 cret@h:1",
        ] {
            let e = err(with_secret);
            assert_eq!(e, AdminUrlError::Userinfo, "{with_secret}");
            assert!(!e.to_string().contains("s3"), "{e}");
        }
        assert!(matches!(err("http://127.0.0.1:9901/?key=a"), AdminUrlError::Query(_)));
        assert!(matches!(err("http://127.0.0.1:9901/#top"), AdminUrlError::Query(_)));
        for bad in ["", "http://", "http://a b:1", "http://127.0.0.1:99999", "http://h:", "http://h:0", "[::1]:x"] {
            assert!(matches!(err(bad), AdminUrlError::Invalid(..)), "{bad}: {:?}", AdminUrl::parse(bad));
        }
    }

    #[test]
    fn a_wildcard_listen_address_is_reached_on_loopback() {
        let url = |listen: &str| AdminUrl::from_listen(listen.parse().unwrap()).to_string();
        assert_eq!(url("0.0.0.0:9901"), "http://127.0.0.1:9901");
        assert_eq!(url("[::]:9901"), "http://[::1]:9901");
        assert_eq!(url("10.0.0.5:9901"), "http://10.0.0.5:9901");
    }
}
