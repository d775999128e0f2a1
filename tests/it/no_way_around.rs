//! No way around the fence (issue 11, invariant 5): one resource, one key, and
//! every method that may write is fenced.
//!
//! Each test puts fencegate in front of `tests/upstreams/store.py`, a legacy store
//! that resolves requests the way Werkzeug, nginx and `http.server` do: it
//! upper-cases methods, honours method overrides, resolves dot segments and
//! escapes, picks virtual hosts, strips header values, reads a GET's body as the
//! next request and applies COPY/MOVE to `Destination`. The new holder writes with
//! token 34 first; then the test tries every spelling of the class it knows with
//! the old holder's 33, with no token, or (on the signed route) with an unsigned
//! `u64::MAX`. The verdict comes from the store's own log of applied writes: only
//! the writes the test meant to land may be there. Each attempt must also get the
//! right answer (status and problem `type`); all wrong answers are listed together
//! at the end, next to any write that should not have landed.
//!
//! The last test does the same against a real nginx with WebDAV for the classes
//! nginx itself resolves (methods, paths, hosts, COPY/MOVE): the files it wrote are
//! the witness there. It needs an `nginx` binary and fails without one.
//!
//! Class 10 of the issue (slow and silent connections) is tested elsewhere.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use common::process::{config_text, start_in_process, toml_string, TempDir, MEMORY_STORE};
use common::raw::{Conn, RawReply, RawRequest};
use common::realistic::{LegacyStore, Nginx, Write, H2};
use common::{enc, send, Proxy, Reply};
use fencegate::fence::signature::sign;

const SECRET: &str = "no-way-around-signing-secret-0123";
const ADMIN_SECRET: &str = "no-way-around-admin-secret";
/// The new holder's token: its writes must land.
const FRESH: u64 = 34;
/// The old holder's token: its writes must never land once 34 wrote.
const STALE: u64 = 33;
/// A token nobody signed: on a signed route it must never land.
const UNSIGNED: u64 = u64::MAX;
/// The virtual host the store picks when fencegate sends it the upstream's own
/// authority (routes without `preserve_host`).
const UPSTREAM_VHOST: &str = "127.0.0.1";

/// The answer an attempt must get: a status and the problem `type`s accepted
/// (none: any body, for answers without one).
#[derive(Debug, Clone, Copy)]
struct Want(u16, &'static [&'static str]);

const STALE_409: Want = Want(409, &["urn:fencegate:problem:stale-token"]);
const MISSING_428: Want = Want(428, &["urn:fencegate:problem:missing-token"]);
const UNSIGNED_403: Want = Want(403, &["urn:fencegate:problem:bad-signature"]);
const MALFORMED_400: Want = Want(400, &["urn:fencegate:problem:malformed-token"]);
const BAD_PATH: Want = Want(400, &["urn:fencegate:problem:bad-path"]);
const BAD_HOST: Want = Want(400, &["urn:fencegate:problem:bad-host"]);
const BAD_HEADER: Want = Want(400, &["urn:fencegate:problem:bad-header"]);
const BAD_KEY: Want = Want(400, &["urn:fencegate:problem:bad-key"]);
const OVERRIDES_400: Want = Want(400, &["urn:fencegate:problem:method-override"]);
const BODY_400: Want = Want(400, &["urn:fencegate:problem:body-not-allowed"]);
/// A Destination that is not canonical is refused as a bad destination or, as
/// its path, a bad path.
const BAD_DESTINATION: Want = Want(400, &["urn:fencegate:problem:bad-destination", "urn:fencegate:problem:bad-path"]);
const NO_ROUTE_404: Want = Want(404, &["urn:fencegate:problem:no-route"]);
const JUMP_403: Want = Want(403, &["urn:fencegate:problem:token-jump"]);
/// Refused before anything else: a 400 whose body a HEAD response cannot carry.
const PLAIN_400: Want = Want(400, &[]);

// ---------------------------------------------------------------- the rig

/// An upstream a route can point at.
trait Upstream {
    fn url(&self) -> String;
}

impl Upstream for LegacyStore {
    fn url(&self) -> String {
        LegacyStore::url(self)
    }
}

impl Upstream for Nginx {
    fn url(&self) -> String {
        Nginx::url(self)
    }
}

/// A `[[route]]` to `store` with short timeouts: `settle = "200ms"`,
/// `timeout = "10s"` and, unless `extra` sets its own, `queue_timeout = "2s"`.
fn route(name: &str, prefix: &str, store: &impl Upstream, extra: &str) -> String {
    let queue = if extra.contains("queue_timeout") { "" } else { "queue_timeout = \"2s\"\n" };
    format!(
        "[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstream = \"{}\"\n\
         settle = \"200ms\"\ntimeout = \"10s\"\n{queue}{extra}\n",
        store.url()
    )
}

/// `signing_key_file = ...` for a key file in `dir` holding [`SECRET`].
fn signing(dir: &TempDir) -> String {
    let file = dir.write("fence.key", &format!("{SECRET}\n"));
    format!("signing_key_file = {}", toml_string(&file.display().to_string()))
}

/// fencegate in-process on the memory store, with the admin token [`ADMIN_SECRET`].
async fn start(routes: &str) -> Proxy {
    let admin = format!("auth_token = {}", toml_string(ADMIN_SECRET));
    start_in_process(&config_text(&admin, MEMORY_STORE, routes)).await
}

/// The routes most classes use: "objects" (`/objects/`, unsigned, `extra` added)
/// and "secure" (`/secure/`, signed), both to `store`.
fn objects_and_secure(store: &LegacyStore, dir: &TempDir, extra: &str) -> String {
    [route("objects", "/objects/", store, extra), route("secure", "/secure/", store, &signing(dir))].concat()
}

fn sig(key: &str, token: u64) -> String {
    sign(SECRET.as_bytes(), key, token)
}

/// Sends a write that must land (2xx); returns the reply.
async fn landed(proxy: &Proxy, req: RawRequest) -> RawReply {
    let what = req.describe();
    let reply = req.send(proxy.addr).await;
    assert!((200..300).contains(&reply.status), "{what} should have landed: {reply:?}");
    reply
}

/// The new holder's `PUT path` with `token`, body `fresh-<token>`.
async fn fresh(proxy: &Proxy, path: &str, token: u64) {
    landed(proxy, RawRequest::new("PUT", path).token(token).body(format!("fresh-{token}"))).await;
}

/// The same on a signed route, signed for the fence key `path`.
async fn fresh_signed(proxy: &Proxy, path: &str, token: u64) {
    let req = RawRequest::new("PUT", path)
        .token(token)
        .header("X-Fencing-Signature", &sig(path, token))
        .body(format!("fresh-{token}"));
    landed(proxy, req).await;
}

/// What most classes start from: a store, fencegate in front of it with
/// [`objects_and_secure`], and the new holder's writes to `/objects/a` and
/// `/secure/doc` with [`FRESH`]. The dir holds the signing key: keep it as long
/// as the proxy.
async fn fresh_objects_and_secure() -> (TempDir, LegacyStore, Proxy) {
    let dir = TempDir::new();
    let store = LegacyStore::start();
    let proxy = start(&objects_and_secure(&store, &dir, "")).await;
    fresh(&proxy, "/objects/a", FRESH).await;
    fresh_signed(&proxy, "/secure/doc", FRESH).await;
    (dir, store, proxy)
}

/// The mark of `key` from the fence API (`null` when none).
async fn mark(proxy: &Proxy, key: &str) -> Value {
    let r = common::get(&proxy.admin_url(&format!("/fences?key={}", enc(key)))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["token"].clone()
}

/// What came back for one attempt.
struct Got {
    status: u16,
    problem: Option<Value>,
    text: String,
}

impl From<RawReply> for Got {
    fn from(r: RawReply) -> Got {
        Got { status: r.status, problem: r.problem(), text: r.text() }
    }
}

impl From<Reply> for Got {
    fn from(r: Reply) -> Got {
        let problem = (r.header("content-type") == Some("application/problem+json"))
            .then(|| serde_json::from_slice(&r.body).ok())
            .flatten();
        Got { status: r.status.as_u16(), problem, text: r.text() }
    }
}

/// Every attempt's answer, and the wrong ones.
#[derive(Default)]
struct Verdicts {
    tried: usize,
    wrong: Vec<String>,
}

impl Verdicts {
    /// Records whether `got` is `want` (and names `key`, when given).
    fn judge(&mut self, what: &str, got: Result<Got, String>, want: Want, key: Option<&str>) {
        self.judge_any(what, got, &[want], key);
    }

    /// Records whether `got` is one of `wants`.
    fn judge_any(&mut self, what: &str, got: Result<Got, String>, wants: &[Want], key: Option<&str>) {
        self.tried += 1;
        let got = match got {
            Ok(got) => got,
            Err(e) => return self.wrong.push(format!("{what}: wanted {wants:?}, got no answer: {e}")),
        };
        let ty = got.problem.as_ref().and_then(|p| p["type"].as_str()).unwrap_or("");
        let key_ok = key.is_none_or(|k| got.problem.as_ref().is_some_and(|p| p["key"] == k));
        let matches = |want: &Want| got.status == want.0 && (want.1.is_empty() || want.1.contains(&ty));
        if !wants.iter().any(matches) || !key_ok {
            let key_note = key.map(|k| format!(" with key {k:?}")).unwrap_or_default();
            let text: String = got.text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(300).collect();
            self.wrong.push(format!("{what}: wanted {wants:?}{key_note}, got {} {text}", got.status));
        }
    }

    /// Sends `req` over HTTP/1.1 on a fresh connection and judges the answer.
    async fn raw(&mut self, proxy: &Proxy, req: RawRequest, want: Want) {
        self.raw_keyed(proxy, req, want, None).await;
    }

    /// Like [`raw`](Self::raw), for a request that may be refused in either way.
    async fn raw_any(&mut self, proxy: &Proxy, req: RawRequest, wants: &[Want]) {
        let what = format!("HTTP/1.1 {}", req.describe());
        let got = req.try_send(proxy.addr).await.map(Got::from);
        self.judge_any(&what, got, wants, None);
    }

    /// Like [`raw`](Self::raw); the problem must also name `key`.
    async fn raw_keyed(&mut self, proxy: &Proxy, req: RawRequest, want: Want, key: Option<&str>) {
        let what = format!("HTTP/1.1 {}", req.describe());
        let got = req.try_send(proxy.addr).await.map(Got::from);
        self.judge(&what, got, want, key);
    }

    /// Records a check of the positive side (what must work) with the rest.
    fn expect_eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        self.tried += 1;
        if got != want {
            self.wrong.push(format!("{what}: wanted {want:?}, got {got:?}"));
        }
    }

    /// Sends a write that must land (2xx) and records it if it does not.
    async fn lands(&mut self, proxy: &Proxy, req: RawRequest) {
        self.tried += 1;
        let what = req.describe();
        match req.try_send(proxy.addr).await {
            Ok(r) if (200..300).contains(&r.status) => {}
            Ok(r) => self.wrong.push(format!("{what} should have landed, got {} {}", r.status, r.text().trim())),
            Err(e) => self.wrong.push(format!("{what} should have landed, got no answer: {e}")),
        }
    }

    /// Sends `req` over h2c and judges the answer.
    async fn h2(&mut self, conn: &H2, req: Request<Full<Bytes>>, want: Want) {
        let what = format!("HTTP/2 {} {} {:?}", req.method(), req.uri(), req.headers());
        let got = conn.send(req).await.map(Got::from);
        self.judge(&what, got, want, None);
    }
}

/// An object the store must hold at the end: (vhost, tenant, resource, body).
type Kept<'a> = (&'a str, &'a str, &'a str, &'a str);

/// The verdict: once the store is idle, every write it applied carries one of
/// the `allowed` tokens (the ones the test meant to land), it holds the `kept`
/// objects, and every attempt got the answer it should have.
async fn assert_no_way_around(store: &LegacyStore, mut verdicts: Verdicts, allowed: &[u64], kept: &[Kept<'_>]) {
    store.wait_idle().await;
    for (vhost, tenant, resource, body) in kept {
        let stored = store.object_of(vhost, tenant, resource).await;
        verdicts.expect_eq(&format!("the object at {vhost} {tenant} {resource}"), stored.as_deref(), Some(*body));
    }
    let allowed: Vec<String> = allowed.iter().map(u64::to_string).collect();
    let landed: Vec<Write> =
        store.log().await.into_iter().filter(|w| !w.token.as_ref().is_some_and(|t| allowed.contains(t))).collect();
    // Enough of each list to see the pattern; the counts say how many in all.
    const SHOWN: usize = 60;
    let landed_lines: Vec<String> = landed
        .iter()
        .take(SHOWN)
        .map(|w| {
            format!(
                "  {} {}{} (sent as {} {}) token {:?}, body {:?}",
                w.method, w.vhost, w.resource, w.sent_method, w.target, w.token, w.body
            )
        })
        .collect();
    assert!(
        landed.is_empty() && verdicts.wrong.is_empty(),
        "{} writes the store should never have applied:\n{}\n{} of {} attempts got the wrong answer:\n  {}",
        landed.len(),
        landed_lines.join("\n"),
        verdicts.wrong.len(),
        verdicts.tried,
        verdicts.wrong.iter().take(SHOWN).cloned().collect::<Vec<_>>().join("\n  ")
    );
}

/// An h2c request to `path` on `conn` with `headers` (values sent byte for byte).
fn h2_req(
    conn: &H2,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    conn.request(method, None, path, headers, body)
}

const STALE_H: (&str, &[u8]) = ("x-fencing-token", b"33");
const UNSIGNED_H: (&str, &[u8]) = ("x-fencing-token", b"18446744073709551615");

// ------------------------------------------------- 1. method spelling

/// Werkzeug and Django upper-case the method and run their PUT handler for `put`;
/// WebDAV and extension methods write too. Only the route's safe methods, exactly
/// as spelled, pass unfenced.
#[tokio::test]
async fn every_method_spelling_but_the_safe_ones_is_fenced() {
    let (_dir, store, proxy) = fresh_objects_and_secure().await;

    let mut v = Verdicts::default();
    let methods = [
        "put",
        "Put",
        "pUT",
        "PuT",
        "post",
        "pOST",
        "patch",
        "Patch",
        "delete",
        "dELETE",
        "PROPPATCH",
        "proppatch",
        "MKCOL",
        "mkcol",
        "LOCK",
        "UNLOCK",
        "FOO",
        "BREW",
        "get",
        "Get",
        "options",
        "head",
    ];
    for m in methods {
        let req = RawRequest::new(m, "/objects/a").body("stale-33");
        v.raw(&proxy, req.clone().token(STALE), STALE_409).await;
        v.raw(&proxy, req, MISSING_428).await;
        let unsigned = RawRequest::new(m, "/secure/doc").token(UNSIGNED).body("unsigned");
        v.raw(&proxy, unsigned, UNSIGNED_403).await;
    }

    let h2 = H2::connect(proxy.addr).await;
    for m in ["put", "Put", "pUT", "post", "delete", "PROPPATCH", "MKCOL", "FOO", "get"] {
        v.h2(&h2, h2_req(&h2, m, "/objects/a", &[STALE_H], "stale-33"), STALE_409).await;
        v.h2(&h2, h2_req(&h2, m, "/objects/a", &[], "no-token"), MISSING_428).await;
        v.h2(&h2, h2_req(&h2, m, "/secure/doc", &[UNSIGNED_H], "unsigned"), UNSIGNED_403).await;
    }

    // The new holder's own writes, in any spelling, still land and raise the mark.
    v.lands(&proxy, RawRequest::new("Put", "/objects/b").token(FRESH).body("fresh-b")).await;
    let fresh_h2 = h2_req(&h2, "pUT", "/objects/c", &[("x-fencing-token", b"34")], "fresh-c");
    v.h2(&h2, fresh_h2, Want(200, &[])).await;
    v.expect_eq("the mark of /objects/b", mark(&proxy, "/objects/b").await, json!(FRESH));
    v.expect_eq("the mark of /objects/c", mark(&proxy, "/objects/c").await, json!(FRESH));

    let kept = [
        (UPSTREAM_VHOST, "", "/objects/a", "fresh-34"),
        (UPSTREAM_VHOST, "", "/secure/doc", "fresh-34"),
        (UPSTREAM_VHOST, "", "/objects/b", "fresh-b"),
        (UPSTREAM_VHOST, "", "/objects/c", "fresh-c"),
    ];
    assert_no_way_around(&store, v, &[FRESH], &kept).await;
}

/// `fenced_methods` is gone: an old config says what replaced it, and a route's
/// `safe_methods` are compared exactly as sent.
#[tokio::test]
async fn safe_methods_replace_fenced_methods_and_are_compared_as_sent() {
    let store = LegacyStore::start();
    let old = config_text("", MEMORY_STORE, &route("objects", "/objects/", &store, "fenced_methods = [\"PUT\"]"));
    let err = fencegate::Config::from_toml_str(&old).expect_err("a config with fenced_methods must fail");
    let message = err.to_string();
    assert!(message.contains("fenced_methods") && message.contains("safe_methods"), "{message}");

    let routes = route("objects", "/objects/", &store, "safe_methods = [\"GET\", \"HEAD\", \"OPTIONS\", \"PROPFIND\"]");
    let proxy = start(&routes).await;
    fresh(&proxy, "/objects/a", FRESH).await;
    let mut v = Verdicts::default();
    // PROPFIND is listed: it passes unfenced (the store answers 207).
    v.raw(&proxy, RawRequest::new("PROPFIND", "/objects/a"), Want(207, &[])).await;
    // `propfind` is not PROPFIND.
    v.raw(&proxy, RawRequest::new("propfind", "/objects/a").token(STALE).body("<propfind/>"), STALE_409).await;
    v.raw(&proxy, RawRequest::new("PROPPATCH", "/objects/a").body("<props/>"), MISSING_428).await;
    assert_no_way_around(&store, v, &[FRESH], &[(UPSTREAM_VHOST, "", "/objects/a", "fresh-34")]).await;
}

// ------------------------------------------------- 2. method overrides

/// Middleware runs a GET or POST carrying `X-HTTP-Method-Override: PUT` (or
/// `X-HTTP-Method`, `X-Method-Override`) as a PUT: such a request is fenced as the
/// method it names, and two different overrides are refused.
#[tokio::test]
async fn a_method_override_is_fenced_as_the_method_it_names() {
    let (_dir, store, proxy) = fresh_objects_and_secure().await;

    let mut v = Verdicts::default();
    let names = ["X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "x-http-method-override"];
    for name in names {
        for (base, value) in [("GET", "PUT"), ("GET", "put"), ("GET", "DELETE"), ("POST", "PUT"), ("GET", "PATCH")] {
            let req = RawRequest::new(base, "/objects/a").header(name, value).body("overridden");
            v.raw(&proxy, req.clone().token(STALE), STALE_409).await;
            v.raw(&proxy, req, MISSING_428).await;
            let req = RawRequest::new(base, "/secure/doc").header(name, value).token(UNSIGNED).body("unsigned");
            v.raw(&proxy, req, UNSIGNED_403).await;
        }
        // An override without a body (DELETE) and on other safe methods.
        v.raw(&proxy, RawRequest::new("GET", "/objects/a").header(name, "DELETE").token(STALE), STALE_409).await;
        v.raw(&proxy, RawRequest::new("OPTIONS", "/objects/a").header(name, "PUT").token(STALE).body("x"), STALE_409)
            .await;
        v.raw(&proxy, RawRequest::new("GET", "/objects/a").header(name, "MKCOL").token(STALE), STALE_409).await;
    }
    // Several override headers that agree (case aside) are one override.
    let agreeing =
        RawRequest::new("GET", "/objects/a").header("X-HTTP-Method-Override", "PUT").header("X-Method-Override", "put");
    v.raw(&proxy, agreeing.token(STALE).body("stale"), STALE_409).await;
    // Overrides that disagree: which one runs depends on the middleware. Refused.
    let conflicts: [&[(&str, &str)]; 4] = [
        &[("X-HTTP-Method-Override", "PUT"), ("X-HTTP-Method", "DELETE")],
        &[("X-HTTP-Method-Override", "GET"), ("X-Method-Override", "PUT")],
        &[("X-HTTP-Method-Override", "PUT"), ("X-HTTP-Method-Override", "GET")],
        &[("X-HTTP-Method", "GET"), ("X-HTTP-Method", "PATCH")],
    ];
    for headers in conflicts {
        let mut req = RawRequest::new("GET", "/objects/a");
        for (k, val) in headers {
            req = req.header(k, val);
        }
        v.raw(&proxy, req.clone().token(STALE).body("stale"), OVERRIDES_400).await;
        v.raw(&proxy, req.token(FRESH + 10).body("fresh-but-ambiguous"), OVERRIDES_400).await;
    }
    // Over HTTP/2 too.
    let h2 = H2::connect(proxy.addr).await;
    let over = ("x-http-method-override", b"PUT".as_slice());
    v.h2(&h2, h2_req(&h2, "GET", "/objects/a", &[over, STALE_H], "stale"), STALE_409).await;
    v.h2(&h2, h2_req(&h2, "POST", "/objects/a", &[("x-method-override", b"delete"), STALE_H], ""), STALE_409).await;

    // A safe override of a safe method stays a read; the holder's override lands.
    let read = RawRequest::new("GET", "/objects/a").header("X-HTTP-Method-Override", "GET").send(proxy.addr).await;
    v.expect_eq("GET with a GET override", (read.status, read.text()), (200, "fresh-34".to_string()));
    let write = RawRequest::new("GET", "/objects/a").header("X-HTTP-Method-Override", "PUT");
    v.lands(&proxy, write.token(FRESH + 1).body("fresh-35")).await;
    v.expect_eq("the mark of /objects/a", mark(&proxy, "/objects/a").await, json!(FRESH + 1));

    let kept = [(UPSTREAM_VHOST, "", "/objects/a", "fresh-35"), (UPSTREAM_VHOST, "", "/secure/doc", "fresh-34")];
    assert_no_way_around(&store, v, &[FRESH, FRESH + 1], &kept).await;
}

// ------------------------------------------------- 3. paths

/// nginx maps many spellings onto one file; fencegate keys, routes, signs and
/// forwards the one canonical form, and refuses what it cannot make canonical.
#[tokio::test]
async fn every_spelling_of_a_path_is_one_resource_with_one_key() {
    let (_dir, store, proxy) = fresh_objects_and_secure().await;

    let mut v = Verdicts::default();
    let aliases = [
        "/objects//a",
        "/objects///a",
        "//objects/a",
        "/objects/./a",
        "/objects/.//a",
        "/objects/x/../a",
        "/objects/x/..//a",
        "/objects/x/y/../../a",
        "/objects/./x/.././a",
        "/objects/%61",
        "/%6Fbjects/a",
        "/%6f%62jects/%61",
        "/objects/%2e/a",
        "/objects/%2E/a",
        "/objects/x/%2E%2E/a",
        "/objects/x/%2e%2E/a",
        "/objects/x/.%2e/a",
        "/objects/x/%2e./a",
        "/objects/%2e%2e/objects/a",
        "/objects/a?version=2",
        "/objects//x/%2E%2E//%61",
        "http://a.example/objects/./a",
        "http://a.example/objects//x/../%61",
    ];
    for target in aliases {
        let req = RawRequest::new("PUT", target).body("stale-33");
        v.raw_keyed(&proxy, req.clone().token(STALE), STALE_409, Some("/objects/a")).await;
        v.raw(&proxy, req, MISSING_428).await;
    }
    // Spellings that leave the /objects/ route for the signed /secure/ one are
    // signed there, so an unsigned token never reaches /secure/doc.
    for target in [
        "/objects/../secure/doc",
        "/objects/%2e%2e/secure/doc",
        "/objects/%2E%2E/secure/doc",
        "/objects/x/../../secure/doc",
        "/objects/.%2E/secure/./doc",
        "//secure//doc",
        "/secure/./doc",
        "/%73ecure/doc",
        "/secure/%64oc",
        "http://a.example/objects/../secure/doc",
    ] {
        v.raw(&proxy, RawRequest::new("PUT", target).token(UNSIGNED).body("unsigned"), UNSIGNED_403).await;
        // Not even with a signature made for the spelling instead of the key.
        let spelled = sig(target, UNSIGNED);
        let req = RawRequest::new("PUT", target).token(UNSIGNED).header("X-Fencing-Signature", &spelled);
        v.raw(&proxy, req.body("unsigned"), UNSIGNED_403).await;
    }
    // What stays ambiguous (the store maps each of these onto /objects/a or the
    // signed /secure/doc) is refused.
    for target in [
        "/objects/x/..;/a",
        "/objects/x/..;jsessionid=1/a",
        "/objects/.;x/a",
        "/objects/..;/secure/doc",
        "/objects/x%2F..%2Fa",
        "/objects/x%2f..%2fa",
        "/objects/x%5C..%5Ca",
        "/objects/x%5c..%5ca",
        "/objects/x\\..\\a",
        "/objects\\a",
        "/objects/..%2Fsecure/doc",
        "/objects/..%5Csecure/doc",
        "/../objects/a",
        "/objects/../../objects/a",
        "/objects/%2e%2e/%2e%2e/objects/a",
        "/%2E%2E/objects/a",
        "/objects/a%00",
        "/objects/a%0a",
        "/objects/a%0D%0A",
        "/objects/a%7F",
        "/objects/a%1f",
        "/objects/%G1",
        "/objects/a%",
        "/objects/a%2",
    ] {
        let req = RawRequest::new("PUT", target).body("stale-33");
        v.raw(&proxy, req.clone().token(STALE), BAD_PATH).await;
        v.raw(&proxy, req.token(UNSIGNED), BAD_PATH).await;
    }
    // An escaped slash that hides the route's prefix: no route matches, so no
    // route's switches say how to read it. Refused either way.
    for target in ["/objects%2Fa", "/objects%2fx/..%2Fa", "/objects%5Ca"] {
        let req = RawRequest::new("PUT", target).body("stale-33");
        v.raw_any(&proxy, req.clone().token(STALE), &[BAD_PATH, NO_ROUTE_404]).await;
        v.raw_any(&proxy, req.token(UNSIGNED), &[BAD_PATH, NO_ROUTE_404]).await;
    }
    let h2 = H2::connect(proxy.addr).await;
    for path in ["/objects//a", "/objects/%61", "/objects/x/%2E%2E/a", "/objects/./a"] {
        v.h2(&h2, h2_req(&h2, "PUT", path, &[STALE_H], "stale-33"), STALE_409).await;
    }
    for path in ["/objects/../secure/doc", "/objects/%2e%2e/secure/doc"] {
        v.h2(&h2, h2_req(&h2, "PUT", path, &[UNSIGNED_H], "unsigned"), UNSIGNED_403).await;
    }
    for path in ["/objects/x%2F..%2Fa", "/objects/x/..;/a", "/../objects/a"] {
        v.h2(&h2, h2_req(&h2, "PUT", path, &[STALE_H], "stale-33"), BAD_PATH).await;
    }

    // The holder's writes in odd spellings land at the canonical resource, and
    // what the store received is exactly the canonical form that was keyed.
    let canonical = [
        ("/objects/./b", "/objects/b"),
        ("/objects//x/%2E%2E/c", "/objects/c"),
        ("/%6Fbjects/%64", "/objects/d"),
        ("/objects/%7e", "/objects/~"),
        ("/objects/a%3f", "/objects/a%3F"),
        ("/objects/%e2%82%ac", "/objects/%E2%82%AC"),
        ("/objects/sp%20ace", "/objects/sp%20ace"),
    ];
    for (sent, forwarded) in canonical {
        v.lands(&proxy, RawRequest::new("PUT", sent).token(FRESH).body(format!("canonical {forwarded}"))).await;
        v.expect_eq(&format!("the mark of {forwarded} after PUT {sent}"), mark(&proxy, forwarded).await, json!(FRESH));
        let last = store.log().await.pop().map(|w| w.target);
        v.expect_eq(&format!("the target forwarded for {sent}"), last.as_deref(), Some(forwarded));
    }
    let req = RawRequest::new("PUT", "/objects/../secure/doc2").token(FRESH);
    let req = req.header("X-Fencing-Signature", &sig("/secure/doc2", FRESH)).body("signed-doc2");
    v.lands(&proxy, req).await;
    let last = store.log().await.pop().map(|w| w.target);
    v.expect_eq("the target forwarded for /objects/../secure/doc2", last.as_deref(), Some("/secure/doc2"));
    v.expect_eq("the mark of /secure/doc2", mark(&proxy, "/secure/doc2").await, json!(FRESH));

    let kept = [(UPSTREAM_VHOST, "", "/objects/a", "fresh-34"), (UPSTREAM_VHOST, "", "/secure/doc", "fresh-34")];
    assert_no_way_around(&store, v, &[FRESH], &kept).await;
}

// ------------------------------------------------- 4. query keys

/// With `key = "item:{query.id}"`, the key is the `id` a framework reads: names and
/// values form-decoded, and a name repeated in any spelling refused.
#[tokio::test]
async fn a_query_key_is_the_parameter_the_framework_reads() {
    let store = LegacyStore::start();
    let proxy = start(&route("items", "/items", &store, "key = \"item:{query.id}\"")).await;
    landed(&proxy, RawRequest::new("PUT", "/items?id=7").token(FRESH).body("fresh-34")).await;

    let mut v = Verdicts::default();
    for target in [
        "/items?id=%37",
        "/items?%69d=7",
        "/items?i%64=7",
        "/items?%69%64=%37",
        "/items?%49d=7&id=7&ID=x",
        "/items?id=7&v=%31",
        "/items?id=7&",
        "/items?&id=7",
        "/items?x=%2F&id=%37",
    ] {
        let req = RawRequest::new("PUT", target).body("stale-33");
        v.raw_keyed(&proxy, req.clone().token(STALE), STALE_409, Some("item:7")).await;
        v.raw(&proxy, req, MISSING_428).await;
    }
    for target in [
        "/items?i%64=7&id=x",
        "/items?id=x&i%64=7",
        "/items?id=7&id=7",
        "/items?%69%64=%37&id=7",
        "/items?id=x&%69d=7",
        "/items?id=7&id",
        // "id " is not "id": no id at all, and the store then writes /items itself.
        "/items?id+=7",
        "/items?id%20=7",
        "/items?ID=7",
        "/items",
    ] {
        v.raw(&proxy, RawRequest::new("PUT", target).token(STALE).body("stale-33"), BAD_KEY).await;
    }

    v.lands(&proxy, RawRequest::new("PUT", "/items?id=%38").token(FRESH).body("fresh-8")).await;
    v.expect_eq("the mark of item:8", mark(&proxy, "item:8").await, json!(FRESH));

    let kept = [(UPSTREAM_VHOST, "", "/items?id=7", "fresh-34"), (UPSTREAM_VHOST, "", "/items?id=8", "fresh-8")];
    assert_no_way_around(&store, v, &[FRESH], &kept).await;
}

// ------------------------------------------------- 5. WebDAV COPY/MOVE

/// COPY and MOVE write the resource their `Destination` names: it is fenced like
/// the source, on the same host and upstream, and both marks must pass.
#[tokio::test]
async fn a_webdav_destination_is_fenced_like_the_source() {
    let dir = TempDir::new();
    let store = LegacyStore::start();
    let elsewhere = LegacyStore::start();
    let routes = [objects_and_secure(&store, &dir, ""), route("elsewhere", "/elsewhere/", &elsewhere, "")].concat();
    let proxy = start(&routes).await;
    // The source is an old holder's (10); the destination the new holder's (34).
    fresh(&proxy, "/objects/src", 10).await;
    fresh(&proxy, "/objects/dst", FRESH).await;
    fresh_signed(&proxy, "/secure/doc", FRESH).await;

    let mut v = Verdicts::default();
    let to_dst = [
        "/objects/dst",
        "http://a.example/objects/dst",
        "http://A.Example.:80/objects/dst",
        "http://a.example:0080/objects/./dst",
        "/objects//dst",
        "/objects/./dst",
        "/objects/x/../dst",
        "/objects/%64st",
        "/objects/x/%2E%2E/dst",
        "http://a.example/objects/%2e/dst",
        "/%6Fbjects/dst",
    ];
    for method in ["COPY", "MOVE", "copy", "Move"] {
        for dest in to_dst {
            let req = RawRequest::new(method, "/objects/src").header("Destination", dest);
            v.raw(&proxy, req.clone().token(STALE), STALE_409).await;
            v.raw(&proxy, req, MISSING_428).await;
        }
        // Somewhere fencegate cannot fence: another host, no route, another upstream,
        // a path that is not canonical, not a path at all.
        for dest in [
            "http://b.example/objects/dst",
            "http://a.example:8080/objects/dst",
            "/unrouted/dst",
            "http://a.example/unrouted/dst",
            "/elsewhere/dst",
            "/objects/x%2F..%2Fdst",
            "/objects/../../dst",
            "/objects/x/..;/dst",
            "/objects/..;/secure/doc",
            "objects/dst",
            "dst",
            "",
        ] {
            let req = RawRequest::new(method, "/objects/src").header("Destination", dest);
            v.raw(&proxy, req.token(FRESH + 5), BAD_DESTINATION).await;
        }
        // Onto the signed route: the destination needs its own signature.
        for dest in ["/secure/doc", "/objects/../secure/doc", "http://a.example/secure/./doc", "/secure/new"] {
            let req = RawRequest::new(method, "/objects/src").header("Destination", dest);
            v.raw(&proxy, req.clone().token(FRESH + 5), UNSIGNED_403).await;
            v.raw(&proxy, req.token(UNSIGNED), UNSIGNED_403).await;
        }
    }
    // A move of the fresh resource by the old holder: the source is fenced too.
    let req = RawRequest::new("MOVE", "/objects/dst").header("Destination", "/objects/new").token(STALE);
    v.raw(&proxy, req, STALE_409).await;

    // The new holder copies and moves: both marks rise, the Destination the store
    // receives is the canonical one.
    let (copied, moved, signed) = (FRESH + 10, FRESH + 11, FRESH + 12);
    let copy = RawRequest::new("COPY", "/objects/src").header("Destination", "http://a.example/objects/./dst2");
    v.lands(&proxy, copy.token(copied)).await;
    v.expect_eq("the mark of /objects/src after COPY", mark(&proxy, "/objects/src").await, json!(copied));
    v.expect_eq("the mark of /objects/dst2 after COPY", mark(&proxy, "/objects/dst2").await, json!(copied));
    let forwarded = store.log().await.pop().and_then(|w| w.destination);
    v.expect_eq("the Destination forwarded", forwarded, Some(format!("http://{}/objects/dst2", store.addr)));
    let mv = RawRequest::new("MOVE", "/objects/dst2").header("Destination", "/objects/%64st3");
    v.lands(&proxy, mv.token(moved)).await;
    v.expect_eq("the mark of /objects/dst3 after MOVE", mark(&proxy, "/objects/dst3").await, json!(moved));
    // With the destination's signature, the signed route takes it.
    let copy = RawRequest::new("COPY", "/objects/src").header("Destination", "/objects/../secure/copy");
    let copy = copy.header("X-Fencing-Destination-Signature", &sig("/secure/copy", signed));
    v.lands(&proxy, copy.token(signed)).await;
    v.expect_eq("the mark of /secure/copy", mark(&proxy, "/secure/copy").await, json!(signed));
    let elsewhere_log: Vec<String> = elsewhere.log().await.into_iter().map(|w| w.target).collect();
    v.expect_eq("writes that reached the other upstream", elsewhere_log, vec![]);

    let kept = [
        (UPSTREAM_VHOST, "", "/objects/dst", "fresh-34"),
        (UPSTREAM_VHOST, "", "/secure/doc", "fresh-34"),
        (UPSTREAM_VHOST, "", "/objects/dst3", "fresh-10"),
        (UPSTREAM_VHOST, "", "/secure/copy", "fresh-10"),
    ];
    assert_no_way_around(&store, v, &[10, FRESH, copied, moved, signed], &kept).await;
}

// ------------------------------------------------- 6. bodies where none is expected

/// `http.server` never reads a GET's body, so on a kept-alive connection the body
/// is the next request: a whole stale PUT smuggled past the fence. A safe method
/// with a body is refused.
#[tokio::test]
async fn a_safe_request_with_a_body_is_refused() {
    let store = LegacyStore::start();
    let proxy = start(&route("objects", "/objects/", &store, "")).await;
    fresh(&proxy, "/objects/a", FRESH).await;

    let smuggled = |token: Option<u64>| {
        let mut inner = format!("PUT /objects/a HTTP/1.1\r\nHost: {}\r\n", store.addr);
        if let Some(t) = token {
            inner.push_str(&format!("X-Fencing-Token: {t}\r\n"));
        }
        inner.push_str("Content-Length: 8\r\n\r\nsmuggled");
        inner
    };
    let mut v = Verdicts::default();
    for inner in [smuggled(Some(1)), smuggled(Some(STALE)), smuggled(None)] {
        for method in ["GET", "OPTIONS"] {
            let req = RawRequest::new(method, "/objects/a").keep_alive().body(&inner);
            v.raw(&proxy, req.clone(), BODY_400).await;
            v.raw(&proxy, req.chunked(), BODY_400).await;
            let overridden = RawRequest::new(method, "/objects/a").header("X-HTTP-Method-Override", "GET");
            v.raw(&proxy, overridden.keep_alive().body(&inner), BODY_400).await;
        }
        // A HEAD response has no body to carry the problem: the status says it.
        v.raw(&proxy, RawRequest::new("HEAD", "/objects/a").keep_alive().body(&inner), PLAIN_400).await;
    }
    let h2 = H2::connect(proxy.addr).await;
    v.h2(&h2, h2_req(&h2, "GET", "/objects/a", &[], smuggled(Some(1))), BODY_400).await;

    // A GET with an empty body (Content-Length: 0) is an ordinary GET.
    let empty = RawRequest::new("GET", "/objects/a").declare_len(0).send(proxy.addr).await;
    v.expect_eq("GET with Content-Length: 0", (empty.status, empty.text()), (200, "fresh-34".to_string()));

    assert_no_way_around(&store, v, &[FRESH], &[(UPSTREAM_VHOST, "", "/objects/a", "fresh-34")]).await;
}

// ------------------------------------------------- 7. a client that gives up

/// Holder 33 sends its whole PUT to a slow upstream and hangs up; holder 34 then
/// writes. 33's write runs to its end at the upstream before 34's is forwarded, so
/// 34's is the one the store keeps. Over HTTP/1.1 (closed socket) and HTTP/2
/// (reset stream).
#[tokio::test]
async fn a_write_whose_client_hung_up_ends_at_the_upstream_before_the_next() {
    let store = LegacyStore::start();
    // The next holder may wait for the whole slow write: a long queue_timeout.
    let proxy = start(&route("objects", "/objects/", &store, "queue_timeout = \"20s\"")).await;

    // HTTP/1.1: the socket closes once the store has the whole request.
    let mut conn = Conn::open(proxy.addr).await;
    let old = RawRequest::new("PUT", "/objects/k").token(STALE).header("X-Slow-Ms", "3000").body("holder-33");
    conn.send(&old.bytes()).await;
    store.wait_pending("/objects/k").await;
    drop(conn);
    landed(&proxy, RawRequest::new("PUT", "/objects/k").token(FRESH).body("holder-34")).await;

    // HTTP/2: the stream is reset once the store has the whole request.
    let h2 = H2::connect(proxy.addr).await;
    let slow = h2_req(&h2, "PUT", "/objects/h2", &[STALE_H, ("x-slow-ms", b"3000")], "holder-33");
    let pending = tokio::spawn(h2.start(slow));
    store.wait_pending("/objects/h2").await;
    pending.abort();
    let next = h2_req(&h2, "PUT", "/objects/h2", &[("x-fencing-token", b"34")], "holder-34");
    let reply = h2.send(next).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());

    for resource in ["/objects/k", "/objects/h2"] {
        let writes = store.wait_writes(UPSTREAM_VHOST, resource, 2).await;
        let order: Vec<_> = writes.iter().map(|w| w.token.clone().unwrap_or_default()).collect();
        assert_eq!(order, ["33", "34"], "{resource}: the writes landed out of token order");
        assert_eq!(store.object(UPSTREAM_VHOST, resource).await.as_deref(), Some("holder-34"), "{resource}");
    }
}

// ------------------------------------------------- 8. half a body

/// A body with an HTTP/2 stream that sends `first`, then waits forever.
struct HeldBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            // The sender gone: the body is never finished, it just stops.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// An h2c connection whose request bodies are fed by the test; the driver task is
/// returned so the test can drop the whole connection.
async fn h2_held(
    addr: SocketAddr,
) -> (hyper::client::conn::http2::SendRequest<HeldBody>, tokio::task::JoinHandle<Result<(), hyper::Error>>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(TokioExecutor::new()).handshake(TokioIo::new(stream)).await.unwrap();
    (sender, tokio::spawn(conn))
}

/// Gives the store a moment to see a request begin (a bounded wait for what a
/// streaming proxy would already have forwarded; nothing asserts on it).
async fn let_the_store_see_it(store: &LegacyStore) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1000) && store.state().await.active == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that dies half-way through its body: nothing is applied, because a
/// fenced body is received whole before it is forwarded.
#[tokio::test]
async fn a_body_cut_off_half_way_is_never_applied() {
    let store = LegacyStore::start();
    let proxy = start(&route("objects", "/objects/", &store, "")).await;
    let half = vec![b'h'; 500];

    // Content-Length: 1000, 500 bytes, then the socket closes.
    let mut conn = Conn::open(proxy.addr).await;
    let req = RawRequest::new("PUT", "/objects/h").token(FRESH).declare_len(1000).keep_alive();
    conn.send(&req.head()).await;
    conn.send(&half).await;
    let_the_store_see_it(&store).await;
    conn.stream.shutdown().await.unwrap();
    drop(conn);

    // Chunked: one chunk, then the socket closes without the last chunk.
    let mut conn = Conn::open(proxy.addr).await;
    let req = RawRequest::new("PUT", "/objects/h").token(FRESH).chunked().keep_alive();
    conn.send(&req.head()).await;
    conn.send(format!("{:X}\r\n", half.len()).as_bytes()).await;
    conn.send(&half).await;
    conn.send(b"\r\n").await;
    let_the_store_see_it(&store).await;
    drop(conn);

    // HTTP/2, with and without a content-length: 500 bytes, then the connection drops.
    for declared in [Some("1000"), None] {
        let (mut sender, driver) = h2_held(proxy.addr).await;
        let (tx, rx) = mpsc::channel(1);
        let mut req = Request::put(format!("http://{}/objects/h", proxy.addr)).header("x-fencing-token", "34");
        if let Some(len) = declared {
            req = req.header("content-length", len);
        }
        let pending = tokio::spawn(sender.send_request(req.body(HeldBody { rx }).unwrap()));
        tx.send(Bytes::from(half.clone())).await.unwrap();
        let_the_store_see_it(&store).await;
        driver.abort();
        pending.abort();
    }

    // The holder's whole write, after whatever the cut ones left behind.
    landed(&proxy, RawRequest::new("PUT", "/objects/h").token(FRESH).body("whole")).await;
    store.wait_idle().await;
    let writes = store.writes_to(UPSTREAM_VHOST, "/objects/h").await;
    let bodies: Vec<_> = writes.iter().map(|w| (w.body_len, w.target.clone())).collect();
    assert!(
        writes.len() == 1 && writes[0].body == "whole",
        "a cut-off body was applied: (length, target) of each write: {bodies:?}"
    );
    assert_eq!(store.object(UPSTREAM_VHOST, "/objects/h").await.as_deref(), Some("whole"));
}

// ------------------------------------------------- 9. decide from the head

/// Sends only `req`'s head (plus `first`, the start of a body that never
/// finishes) and waits for an answer without finishing the body.
async fn answer_to_head(addr: SocketAddr, req: RawRequest, first: &'static [u8]) -> Result<RawReply, String> {
    let mut conn = Conn::open(addr).await;
    conn.send(&req.head()).await;
    conn.send(first).await;
    // The body is held open: an answer can only come from the head.
    conn.try_response_within("PUT", Duration::from_secs(5)).await
}

/// A request the head already condemns is answered at once, while the client
/// still holds its body open.
#[tokio::test]
async fn a_request_the_head_condemns_is_answered_before_its_body() {
    let dir = TempDir::new();
    let store = LegacyStore::start();
    let routes = [
        objects_and_secure(&store, &dir, ""),
        route("items", "/items", &store, "key = \"item:{query.id}\""),
        route("jumpy", "/jumpy/", &store, "max_token_jump = 5"),
    ]
    .concat();
    let proxy = start(&routes).await;
    fresh(&proxy, "/objects/a", FRESH).await;
    fresh_signed(&proxy, "/secure/doc", FRESH).await;
    fresh(&proxy, "/jumpy/a", FRESH).await;

    let put = |path: &str| RawRequest::new("PUT", path).keep_alive();
    let cases: Vec<(&str, RawRequest, Want)> = vec![
        ("stale", put("/objects/a").token(STALE), STALE_409),
        ("no token", put("/objects/a"), MISSING_428),
        ("malformed token", put("/objects/a").header("X-Fencing-Token", "3x"), MALFORMED_400),
        ("unsigned", put("/secure/doc").token(UNSIGNED), UNSIGNED_403),
        ("no route", put("/nowhere/a").token(FRESH + 1), NO_ROUTE_404),
        ("bad path", put("/objects/x%2F..%2Fa").token(FRESH + 1), BAD_PATH),
        ("bad key", put("/items?i%64=7&id=x").token(FRESH + 1), BAD_KEY),
        ("token jump", put("/jumpy/a").token(1000), JUMP_403),
    ];
    let mut waits = Vec::new();
    for (what, req, want) in cases {
        for (framing, req, first) in [
            ("chunked, no chunk yet", req.clone().chunked(), b"".as_slice()),
            ("chunked, one chunk", req.clone().chunked(), b"5\r\nstale\r\n".as_slice()),
            ("Content-Length 1000, 5 bytes", req.clone().declare_len(1000), b"stale".as_slice()),
        ] {
            let label = format!("{what} ({framing}): {}", req.describe());
            waits.push((label, want, tokio::spawn(answer_to_head(proxy.addr, req, first))));
        }
    }
    let mut v = Verdicts::default();
    for (label, want, wait) in waits {
        let got = wait.await.unwrap().map(Got::from);
        v.judge(&label, got, want, None);
    }

    // HTTP/2: HEADERS without END_STREAM, then nothing.
    let (mut sender, _driver) = h2_held(proxy.addr).await;
    for (what, path, token, want) in [
        ("stale", "/objects/a", Some("33"), STALE_409),
        ("no token", "/objects/a", None, MISSING_428),
        ("unsigned", "/secure/doc", Some("18446744073709551615"), UNSIGNED_403),
    ] {
        let (_tx, rx) = mpsc::channel(1);
        let mut req = Request::put(format!("http://{}{path}", proxy.addr));
        if let Some(t) = token {
            req = req.header("x-fencing-token", t);
        }
        sender.ready().await.unwrap();
        let answer =
            tokio::time::timeout(Duration::from_secs(5), sender.send_request(req.body(HeldBody { rx }).unwrap()));
        let got = match answer.await {
            Ok(Ok(resp)) => {
                let status = resp.status().as_u16();
                let is_problem = resp.headers().get("content-type").is_some_and(|c| c == "application/problem+json");
                let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let problem = if is_problem { serde_json::from_slice(&body).ok() } else { None };
                Ok(Got { status, problem, text: String::from_utf8_lossy(&body).into_owned() })
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no response within 5s".to_string()),
        };
        v.judge(&format!("HTTP/2 {what}: PUT {path}, body held open"), got, want, None);
    }

    assert_no_way_around(&store, v, &[FRESH], &[(UPSTREAM_VHOST, "", "/objects/a", "fresh-34")]).await;
}

// ------------------------------------------------- 11. host spellings

/// nginx serves `a.example.`, `A.Example:80` and `a.example:0080` from the one
/// `a.example` virtual host: with `{host}` in the key they are one fence.
#[tokio::test]
async fn every_spelling_of_a_host_is_one_virtual_host_with_one_key() {
    let store = LegacyStore::start();
    let proxy = start(&route("objects", "/objects/", &store, "key = \"{host}{path}\"\npreserve_host = true")).await;
    landed(&proxy, RawRequest::new("PUT", "/objects/a").host("a.example").token(FRESH).body("fresh-34")).await;
    assert_eq!(store.writes_to("a.example", "/objects/a").await.len(), 1, "the store picks a.example");

    let mut v = Verdicts::default();
    let key = Some("a.example/objects/a");
    for host in [
        "a.example.",
        "A.Example",
        "A.EXAMPLE.",
        "a.example:80",
        "A.Example.:80",
        "a.example:0080",
        "a.example:00080",
        "a.example:",
        "a.example.:",
        "a.example.:080",
    ] {
        let req = RawRequest::new("PUT", "/objects/a").host(host).body("stale-33");
        v.raw_keyed(&proxy, req.clone().token(STALE), STALE_409, key).await;
        v.raw(&proxy, req, MISSING_428).await;
    }
    // Absolute-form targets: their authority is the host.
    for (target, host) in [
        ("http://A.Example.:80/objects/a", "a.example"),
        ("http://a.example:0080/objects/a", "A.EXAMPLE."),
        ("http://a.example./objects/a", "a.example:80"),
    ] {
        let req = RawRequest::new("PUT", target).host(host).token(STALE).body("stale-33");
        v.raw_keyed(&proxy, req, STALE_409, key).await;
    }
    // Malformed, or a target and a Host that disagree.
    for host in [
        "a.example..",
        "a.example:99999",
        "a.example:65536",
        "a.example:0",
        "a.example:8o",
        "a.example:-80",
        "user@a.example",
        "user:pw@a.example",
        "a%2eexample",
        "a.ex%61mple",
        "a.example,b.example",
        "a.example/x",
        "",
        ".",
        ":80",
    ] {
        v.raw(&proxy, RawRequest::new("PUT", "/objects/a").host(host).token(STALE).body("stale-33"), BAD_HOST).await;
    }
    for (target, host) in [
        ("http://b.example/objects/a", "a.example"),
        ("http://a.example/objects/a", "b.example"),
        ("http://a.example:8080/objects/a", "a.example"),
    ] {
        let req = RawRequest::new("PUT", target).host(host).token(STALE).body("stale-33");
        v.raw(&proxy, req, BAD_HOST).await;
    }
    // HTTP/2 :authority.
    let h2 = H2::connect(proxy.addr).await;
    for authority in ["A.Example.:80", "a.example:0080", "a.example.", "A.EXAMPLE"] {
        let req = h2.request("PUT", Some(authority), "/objects/a", &[STALE_H], "stale-33");
        v.h2(&h2, req, STALE_409).await;
    }

    // The holder's odd spelling lands on the one vhost, forwarded canonical.
    let req = RawRequest::new("PUT", "/objects/a").host("A.Example.:0080").token(FRESH + 1).body("fresh-35");
    v.lands(&proxy, req).await;
    let last = store.log().await.pop().and_then(|w| w.host);
    v.expect_eq("the Host forwarded for A.Example.:0080", last.as_deref(), Some("a.example"));
    v.expect_eq("the mark of a.example/objects/a", mark(&proxy, "a.example/objects/a").await, json!(FRESH + 1));

    assert_no_way_around(&store, v, &[FRESH, FRESH + 1], &[("a.example", "", "/objects/a", "fresh-35")]).await;
}

// ------------------------------------------------- 12. header values over HTTP/2

/// Werkzeug and nginx strip a header value's surrounding whitespace; HTTP/1.1's
/// parser does too. Over HTTP/2 such a value is malformed (RFC 9113 §8.2.1) and
/// refused, so `{header.NAME}` keys see values as the servers read them.
#[tokio::test]
async fn http2_header_values_with_surrounding_whitespace_are_refused() {
    let store = LegacyStore::start();
    let proxy = start(&route("tenants", "/objects/", &store, "key = \"{header.x-tenant}{path}\"")).await;
    let h2 = H2::connect(proxy.addr).await;
    let first = h2_req(&h2, "PUT", "/objects/a", &[("x-tenant", b"acme"), ("x-fencing-token", b"34")], "fresh-34");
    let reply = h2.send(first).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());

    let mut v = Verdicts::default();
    for tenant in [b"acme ".as_slice(), b" acme", b"acme\t", b"\tacme", b" acme ", b"acme  \t"] {
        let req = h2_req(&h2, "PUT", "/objects/a", &[("x-tenant", tenant), STALE_H], "stale-33");
        v.h2(&h2, req, BAD_HEADER).await;
        let req = h2_req(&h2, "PUT", "/objects/a", &[("x-tenant", tenant)], "no-token");
        v.h2(&h2, req, BAD_HEADER).await;
    }
    // Any header, not only the key's: one the upstream reads, or the token (a
    // token with spaces is malformed anyway: either refusal will do).
    for (name, value) in [("x-http-method-override", b"PUT ".as_slice()), ("x-other", b"value\t")] {
        let req = h2_req(&h2, "PUT", "/objects/a", &[("x-tenant", b"acme"), (name, value)], "stale-33");
        v.h2(&h2, req, BAD_HEADER).await;
    }
    let bad_token = Want(400, &["urn:fencegate:problem:bad-header", "urn:fencegate:problem:malformed-token"]);
    for value in [b"33 ".as_slice(), b" 34", b"34\t"] {
        let req = h2_req(&h2, "PUT", "/objects/a", &[("x-tenant", b"acme"), ("x-fencing-token", value)], "stale");
        v.h2(&h2, req, bad_token).await;
    }
    // Over HTTP/1.1 the parser trims: the same tenant, the same fence.
    for spelled in ["acme ", "acme\t", "  acme"] {
        let req = RawRequest::new("PUT", "/objects/a").header("X-Tenant", spelled).token(STALE).body("stale-33");
        v.raw_keyed(&proxy, req, STALE_409, Some("acme/objects/a")).await;
    }

    let req = h2_req(&h2, "PUT", "/objects/a", &[("x-tenant", b"acme"), ("x-fencing-token", b"35")], "fresh-35");
    v.h2(&h2, req, Want(200, &[])).await;

    assert_no_way_around(&store, v, &[FRESH, FRESH + 1], &[(UPSTREAM_VHOST, "acme", "/objects/a", "fresh-35")]).await;
}

// ------------------------------------------------- 13. admin API keys

/// `PUT /fences` with `{"token": N}` and the admin bearer token.
async fn raise(proxy: &Proxy, query_key: &str, body: &str) -> Reply {
    let auth = format!("Bearer {ADMIN_SECRET}");
    let url = proxy.admin_url(&format!("/fences?key={query_key}"));
    send("PUT", &url, &[("authorization", &auth), ("content-type", "application/json")], body.to_string()).await
}

/// A key typed into the admin API names the resource a request path names: it is
/// percent-decoded (`+` stays `+`) and canonicalized like a request path, and the
/// body must be an object with a `token`.
#[tokio::test]
async fn an_admin_pre_fence_covers_the_resource_its_key_names() {
    let store = LegacyStore::start();
    let proxy = start(&route("objects", "/objects/", &store, "")).await;
    let pre_fence = json!({ "token": 50 }).to_string();
    const OLD: u64 = 49;

    let mut v = Verdicts::default();
    // (key as typed in the query, the request path it must fence)
    for (typed, path) in [
        ("/objects/a+b", "/objects/a+b"),
        ("/objects/a%2Bb", "/objects/a+b"),
        ("/objects/%61%62", "/objects/ab"),
        ("/objects/x/../c", "/objects/c"),
        ("/objects/x/%2E%2E/d", "/objects/d"),
        ("/objects//e", "/objects/e"),
        ("/objects/./f", "/objects/f"),
        ("/objects/%257e", "/objects/~"),
        ("/objects/g%20h", "/objects/g%20h"),
    ] {
        let r = raise(&proxy, typed, &pre_fence).await;
        if r.status != 200 {
            v.wrong.push(format!("PUT /fences?key={typed}: wanted 200, got {} {}", r.status, r.text()));
            continue;
        }
        v.judge(
            &format!("PUT {path} after a pre-fence typed as {typed}"),
            RawRequest::new("PUT", path).token(OLD).body("stale-49").try_send(proxy.addr).await.map(Got::from),
            STALE_409,
            None,
        );
    }
    // Keys that no request path can be: refused, nothing raised.
    for typed in ["/objects/x%252Fy", "/../a", "/objects/a%2500", "/objects/%255C"] {
        let r = raise(&proxy, typed, &pre_fence).await;
        v.judge(&format!("PUT /fences?key={typed}"), Ok(Got::from(r)), BAD_PATH, None);
    }
    // The body is an object with a token, nothing else.
    for body in ["[45]", "45", "\"45\"", "{}", "{\"tokens\": 45}", "null"] {
        let r = raise(&proxy, "/objects/z", body).await;
        v.judge(&format!("PUT /fences?key=/objects/z body {body}"), Ok(Got::from(r)), Want(400, &[]), None);
    }
    v.expect_eq("the mark of /objects/z after refused bodies", mark(&proxy, "/objects/z").await, Value::Null);

    assert_no_way_around(&store, v, &[], &[]).await;
}

// ------------------------------------------------- the same against nginx

/// nginx with WebDAV merges slashes, resolves dot segments and escapes, picks the
/// `a.example` server for every spelling of it and copies onto `Destination`: the
/// old holder's writes must leave no file behind, and the files nginx holds at the
/// end are exactly the new holder's.
#[tokio::test]
async fn nginx_with_webdav_keeps_only_the_holders_files() {
    let dir = TempDir::new();
    let nginx = Nginx::start();
    let routes = [
        route("objects", "/objects/", &nginx, "key = \"{host}{path}\"\npreserve_host = true"),
        route("secure", "/secure/", &nginx, &format!("preserve_host = true\n{}", signing(&dir))),
    ]
    .concat();
    let proxy = start(&routes).await;
    fresh(&proxy, "/objects/a", FRESH).await;
    fresh(&proxy, "/objects/src", 10).await;
    fresh(&proxy, "/objects/dst", FRESH).await;
    fresh_signed(&proxy, "/secure/doc", FRESH).await;

    let mut v = Verdicts::default();
    let key = Some("a.example/objects/a");
    for m in ["PUT", "put", "Put", "POST", "DELETE", "delete", "MKCOL", "PROPPATCH", "LOCK", "FOO"] {
        v.raw(&proxy, RawRequest::new(m, "/objects/a").token(STALE).body("stale-33"), STALE_409).await;
        v.raw(&proxy, RawRequest::new(m, "/objects/a").body("no-token"), MISSING_428).await;
        v.raw(&proxy, RawRequest::new(m, "/secure/doc").token(UNSIGNED).body("unsigned"), UNSIGNED_403).await;
    }
    for target in [
        "/objects//a",
        "//objects/a",
        "/objects/./a",
        "/objects/x/../a",
        "/objects/%61",
        "/%6Fbjects/a",
        "/objects/%2e/a",
        "/objects/x/%2E%2E/a",
        "/objects//x/%2e%2e//%61",
        "http://a.example/objects/./a",
    ] {
        v.raw_keyed(&proxy, RawRequest::new("PUT", target).token(STALE).body("stale-33"), STALE_409, key).await;
    }
    for target in ["/objects/x%2F..%2Fa", "/objects/x%5C..%5Ca", "/objects/x/..;/a", "/../objects/a", "/objects/a%00"] {
        v.raw(&proxy, RawRequest::new("PUT", target).token(STALE).body("stale-33"), BAD_PATH).await;
    }
    for target in ["/objects/../secure/doc", "/objects/%2e%2e/secure/doc", "//secure//doc", "/secure/./doc"] {
        v.raw(&proxy, RawRequest::new("PUT", target).token(UNSIGNED).body("unsigned"), UNSIGNED_403).await;
    }
    for host in ["A.Example", "a.example.", "A.Example.:80", "a.example:0080", "a.example:", "A.EXAMPLE.:080"] {
        let req = RawRequest::new("PUT", "/objects/a").host(host).token(STALE).body("stale-33");
        v.raw_keyed(&proxy, req, STALE_409, key).await;
    }
    for method in ["COPY", "MOVE"] {
        for dest in
            ["/objects/dst", "/objects/./dst", "/objects//dst", "/objects/%64st", "http://a.example/objects/dst"]
        {
            let req = RawRequest::new(method, "/objects/src").header("Destination", dest);
            v.raw(&proxy, req.clone().token(STALE), STALE_409).await;
            v.raw(&proxy, req, MISSING_428).await;
        }
        // nginx takes any Destination that starts with its own host name.
        for dest in ["http://a.example:8080/objects/dst", "http://a.example.evil/objects/dst", "/unrouted/dst"] {
            let req = RawRequest::new(method, "/objects/src").header("Destination", dest);
            v.raw(&proxy, req.token(FRESH + 5), BAD_DESTINATION).await;
        }
        for dest in ["/secure/doc", "/objects/../secure/doc"] {
            let req = RawRequest::new(method, "/objects/src").header("Destination", dest);
            v.raw(&proxy, req.token(FRESH + 5), UNSIGNED_403).await;
        }
    }
    let smuggled = "PUT /objects/a HTTP/1.1\r\nHost: a.example\r\nContent-Length: 8\r\n\r\nsmuggled";
    v.raw(&proxy, RawRequest::new("GET", "/objects/a").keep_alive().body(smuggled), BODY_400).await;

    // The holder's own writes in odd spellings land where nginx puts them.
    v.lands(&proxy, RawRequest::new("PUT", "/objects/./b").host("A.Example.:80").token(FRESH).body("fresh-b")).await;
    let copy = RawRequest::new("COPY", "/objects/src").header("Destination", "http://a.example/objects/./dst2");
    v.lands(&proxy, copy.token(FRESH + 10)).await;

    let mut files = nginx.files();
    let kept = [
        ("a/objects/a", "fresh-34"),
        ("a/objects/b", "fresh-b"),
        ("a/objects/dst", "fresh-34"),
        ("a/objects/dst2", "fresh-10"),
        ("a/objects/src", "fresh-10"),
        ("a/secure/doc", "fresh-34"),
    ];
    let kept: Vec<(String, String)> = kept.iter().map(|(p, b)| (p.to_string(), b.to_string())).collect();
    files.retain(|f| !kept.contains(f));
    let missing: Vec<_> = kept.iter().filter(|k| nginx.file(&k.0).as_deref() != Some(k.1.as_str())).collect();
    assert!(
        files.is_empty() && missing.is_empty() && v.wrong.is_empty(),
        "files nginx holds that it should not: {files:?}\nthe holder's files nginx lost or changed: {missing:?}\n\
         {} of {} checks failed:\n  {}\nthe end of nginx's error log:\n{}",
        v.wrong.len(),
        v.tried,
        v.wrong.iter().take(60).cloned().collect::<Vec<_>>().join("\n  "),
        nginx.error_log().lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
}
