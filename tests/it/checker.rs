//! A stale-write checker, in the spirit of Jepsen's lock checkers.
//!
//! Lock holders (writer tasks) take tokens from a per-key counter (the lock
//! service), pause at random so that some come back with a token that has been
//! overtaken, and write through the real `fencegate` binary on the durable file
//! store. They write as buggy legacy clients do: the method in any case (`put`,
//! `Post`, `dElEtE`: every one a write to the upstream), the path in any
//! spelling (`/k//3`, `/k/./3`, `/k/%33`), and now and then over a raw
//! connection that hangs up as soon as the request is sent, or halfway
//! through its body. The upstream is randomly slow (now and then past the route's
//! timeout), sometimes answers 500, and sometimes hangs up after reading a
//! request, having applied it, not applied it, or about to apply it a moment
//! later (within the route's settle period): it records what it received and
//! what it applied, in order. fencegate is killed with SIGKILL and started
//! again on the same store in the middle of the run.
//!
//! One acquisition in ten takes its token from fencegate's lease API
//! (`POST /leases`, a 300 ms lease, no wait) instead of the counter, through
//! a replica at random; a lease held already is no lock this time.
//!
//! Then the history is checked:
//! - per key, the upstream received and applied tokens in non-decreasing order
//!   (no stale write), and never had writes of two different tokens to one
//!   key in flight together (a holder's own writes may overlap: several
//!   writers share each token now and then);
//! - nothing fencegate refused reached the upstream, nothing reached it twice,
//!   no body cut short reached it at all, and every 200 a client saw was applied;
//! - every 409 was really stale: its `X-Fencing-Token-Current` is above the
//!   token sent and is a token some request carried past the fence (or raised
//!   through the fence API) before the 409 came back;
//! - a fence never goes back: a request that got past the fence carried a token
//!   at least as high as every token known to be fenced before it was sent;
//! - nothing accepted is lost in a crash: after each restart, for each key, the
//!   highest token the upstream applied minus one is refused with 409;
//! - a lease's token is above every token known raised before it was asked
//!   for, and no token is granted twice, whichever replica granted it (an
//!   acquisition left without an answer may have raised the mark to a token
//!   nobody saw: a 409 citing such a mark is explained by it).
//!
//! Two replicas (`two_replicas_on_redis`): the same, with two fencegate
//! processes sharing their fences on one durable Redis the test starts
//! (`appendfsync always`), in front of the same upstream. Every request, the
//! fence API's raises included, goes through one of the two at random (a
//! holder's writes in flight together too), and the replicas are killed with
//! SIGKILL in turn and started again while the other serves on. Every check
//! above holds across replicas: per key, tokens that went through different
//! replicas never overlap at the upstream nor land out of order. A killed
//! replica's writes may still be in flight at the upstream when it is started
//! again: the records Redis keeps of them (until the route's timeout and
//! settle period plus a second have passed) must hold back every raise of
//! their keys, through either replica; a raise that waits for them past the
//! route's short `queue_timeout` gets 503, which counts as a refusal (nothing
//! may reach the upstream). After each restart the probe of every key goes
//! through each replica, and the fence API of each must report the mark; at
//! the end both replicas must report the same marks. A replica that answers
//! 503 store-unavailable where a 409 or a mark is due (Redis never goes away
//! in this run) is a violation of its own, "store unavailable".
//!
//! Two replicas on etcd (`two_replicas_on_etcd`): the same two replicas and
//! every check above, on a 3-member etcd cluster the test starts, whose
//! leader is killed with SIGKILL once too (between the two replicas'
//! restarts) and started again a few seconds later. The two members left
//! keep the quorum: after the election the run must go on (writes answered
//! 200 while the member is down); a write answered 503 meanwhile (no leader
//! yet) is a refusal, and must not reach the upstream. Once the member has
//! rejoined, every key is probed through each replica as after a restart
//! (nothing acknowledged lost with the leader). The probes wait until both
//! replicas report their store writable: a 503 store-unavailable there, or
//! at the end, is a violation as on Redis.
//!
//! The runs take turns (each wants the machine to itself). Each default run
//! makes at least 10,000 answered requests and restarts twice (on etcd,
//! the leader's kill comes between the two restarts). A longer soak
//! runs for a given time, restarting every 10 to 30 seconds:
//!
//! ```text
//! cargo test --profile ci --test it checker:: -- --nocapture        # every run
//! cargo test --profile ci --test it checker::two_replicas_on_redis -- --nocapture
//! cargo test --profile ci --test it checker::two_replicas_on_etcd -- --nocapture
//! FENCEGATE_SOAK_SECS=600 cargo test --profile ci --test it checker::two_replicas -- --nocapture
//! ```
//!
//! In a soak on etcd, every third fault is the etcd leader's instead of a
//! replica's.
//!
//! Each run logs its seed; `FENCEGATE_TEST_SEED=<seed>` replays the same
//! random choices (what the interleaving of tasks does with them still
//! varies).

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::net::TcpListener;

use common::etcd::{etcd_store, EtcdCluster};
use common::process::*;
use common::redis::{redis_store, Redis};
use common::*;

const KEYS: usize = 8;
const WRITERS: usize = 24;
/// Requests fencegate answered, in the default run.
const TARGET_OPS: usize = 10_500;
/// Restarts in the default run.
const KILLS: usize = 2;
const ADMIN_TOKEN: &str = "checker";
/// The route's timeout: a few answers come later than this (504), and a few
/// within it but after the settle period.
const ROUTE_TIMEOUT: Duration = Duration::from_millis(400);
/// The route's settle period: longer than any write the upstream applies after
/// fencegate gave up on it (30 ms after hanging up, 40 ms after the timeout).
const SETTLE: &str = "200ms";
/// Longest wait for anything that should happen soon.
const PATIENCE: Duration = Duration::from_secs(60);

fn key_path(key: usize) -> String {
    format!("/k/{key}")
}

// ------------------------------------------------------------ the upstream

/// What the upstream did with a request after reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Applied, answered 200.
    Ok,
    /// Answered 500, having applied the write or not.
    Error { applied: bool },
    /// Closed the connection without an answer, and applied the write or not.
    HungUp { applied: Applied },
    /// Applied and answered 200, after the route's timeout: fencegate has
    /// answered 504 by then.
    TooSlow,
    /// Applied and answered 200 within the route's timeout, but after longer
    /// than its settle period: a client that hung up meanwhile must not let
    /// the next write go first.
    Slow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    Never,
    BeforeHangingUp,
    /// Shortly after hanging up (well within the settle period).
    AfterHangingUp,
}

impl Fate {
    /// Applied before answering (or hanging up).
    fn applied_at_once(self) -> bool {
        match self {
            Fate::Ok | Fate::TooSlow | Fate::Slow | Fate::HungUp { applied: Applied::BeforeHangingUp } => true,
            Fate::Error { applied } => applied,
            Fate::HungUp { .. } => false,
        }
    }

    fn pick(rng: &mut impl RngExt) -> Fate {
        match rng.random_range(0..100) {
            0..=3 => Fate::Error { applied: rng.random_bool(0.5) },
            4..=9 => Fate::HungUp {
                applied: [Applied::Never, Applied::BeforeHangingUp, Applied::AfterHangingUp][rng.random_range(0..3)],
            },
            10 => Fate::TooSlow,
            11..=13 => Fate::Slow,
            _ => Fate::Ok,
        }
    }
}

/// One write as the upstream saw it.
#[derive(Debug, Clone, Copy)]
struct Write {
    key: usize,
    token: u64,
    op: u64,
}

#[derive(Default)]
struct History {
    /// In the order the upstream read them.
    received: Vec<Write>,
    /// In the order the upstream applied them.
    applied: Vec<Write>,
    fates: HashMap<u64, Fate>,
    /// Per key, the writes in flight.
    in_flight: [Vec<Write>; KEYS],
    /// Writes that arrived while others with another token were in flight, and those.
    overlaps: Vec<(Write, Vec<Write>)>,
    /// Writes that arrived while others with their token were in flight.
    shared: usize,
    malformed: Vec<String>,
    /// Requests whose body ended early, by op id.
    cut_short: Vec<u64>,
    open_connections: usize,
}

impl History {
    /// `write` has ended at the upstream.
    fn end(&mut self, write: Write) {
        let writes = &mut self.in_flight[write.key];
        if let Some(i) = writes.iter().position(|w| w.op == write.op) {
            writes.swap_remove(i);
        }
    }
}

/// The witness: an HTTP store on `/k/{key}` that records every write it read
/// and applied. Once it has read a request it finishes it, applies it or not,
/// whatever happens to the connection, as a real server would.
#[derive(Clone)]
struct HistoryUpstream {
    addr: SocketAddr,
    history: Arc<Mutex<History>>,
    /// The fates it deals, drawn from the run's seed.
    rng: Arc<Mutex<StdRng>>,
}

impl HistoryUpstream {
    async fn start(seed: u64) -> HistoryUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = HistoryUpstream {
            addr: listener.local_addr().unwrap(),
            history: Arc::default(),
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
        };
        let serving = up.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let up = serving.clone();
                up.history.lock().unwrap().open_connections += 1;
                tokio::spawn(async move {
                    let handler = up.clone();
                    let service = hyper::service::service_fn(move |req| handler.clone().handle(req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    up.history.lock().unwrap().open_connections -= 1;
                });
            }
        });
        up
    }

    /// Nothing in flight and no connection open: whatever a killed fencegate
    /// sent has been finished.
    fn idle(&self) -> bool {
        let h = self.history.lock().unwrap();
        h.open_connections == 0 && h.in_flight.iter().all(Vec::is_empty)
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let key = req.uri().path().strip_prefix("/k/").and_then(|k| k.parse::<usize>().ok()).filter(|k| *k < KEYS);
        let (Some(key), Some(token), Some(op)) = (key, header("x-fencing-token"), header("x-op-id")) else {
            let what = format!("{} {} {:?}", req.method(), req.uri(), req.headers());
            self.history.lock().unwrap().malformed.push(what);
            return Ok(answer(StatusCode::BAD_REQUEST));
        };
        // A request cut short was never read whole: it does not count as
        // received, but that it came at all is a violation (see `check`).
        if req.into_body().collect().await.is_err() {
            self.history.lock().unwrap().cut_short.push(op);
            return Ok(answer(StatusCode::BAD_REQUEST));
        }
        let write = Write { key, token, op };
        {
            let mut h = self.history.lock().unwrap();
            h.received.push(write);
            // The holder's own writes may be in flight together; a write
            // with another token must wait for every one of them.
            let others: Vec<Write> = h.in_flight[key].iter().copied().filter(|w| w.token != token).collect();
            if !others.is_empty() {
                h.overlaps.push((write, others));
            }
            if h.in_flight[key].iter().any(|w| w.token == token) {
                h.shared += 1;
            }
            h.in_flight[key].push(write);
        }
        // Finished in a task of its own, so a client hanging up changes nothing.
        let history = self.history.clone();
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
        let rng = self.rng.clone();
        tokio::spawn(async move {
            let (fate, delay, late) = {
                let mut rng = rng.lock().unwrap();
                let rng = &mut *rng;
                let fate = Fate::pick(rng);
                let delay = match fate {
                    Fate::TooSlow => ROUTE_TIMEOUT + Duration::from_millis(rng.random_range(20..=40)),
                    Fate::Slow => Duration::from_millis(rng.random_range(250..=350)),
                    _ => Duration::from_millis(rng.random_range(0..=20)),
                };
                (fate, delay, Duration::from_millis(rng.random_range(0..=30)))
            };
            tokio::time::sleep(delay).await;
            let applies_late = fate == Fate::HungUp { applied: Applied::AfterHangingUp };
            {
                let mut h = history.lock().unwrap();
                if fate.applied_at_once() {
                    h.applied.push(write);
                }
                h.fates.insert(op, fate);
                if !applies_late {
                    h.end(write);
                }
            }
            let _ = answer_tx.send(fate);
            if applies_late {
                tokio::time::sleep(late).await;
                let mut h = history.lock().unwrap();
                h.applied.push(write);
                h.end(write);
            }
        });
        match answer_rx.await {
            Ok(Fate::Ok | Fate::TooSlow | Fate::Slow) => Ok(answer(StatusCode::OK)),
            Ok(Fate::Error { .. }) => Ok(answer(StatusCode::INTERNAL_SERVER_ERROR)),
            // An error from the service makes hyper close the connection unanswered.
            Ok(Fate::HungUp { .. }) | Err(_) => Err(std::io::Error::other("hanging up")),
        }
    }
}

fn answer(status: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

// ------------------------------------------------------------- the clients

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A fenced `PUT` through the proxy.
    Write,
    /// A raise through the fence API (pre-fencing at lock acquisition).
    Fence,
    /// A lease taken through the lease API (`POST /leases`): its token,
    /// from the answer, is the mark once it is answered 200; an acquisition
    /// with no answer may have raised the mark to a token nobody saw.
    Lease,
    /// The checker's own write with a token that must be refused.
    Probe,
    /// A write whose client hangs up once the request is sent, answer unread.
    HangUp,
    /// A write whose client hangs up halfway through its body.
    HalfBody,
}

#[derive(Debug, Clone)]
enum Answer {
    Status {
        code: u16,
        /// `X-Fencing-Token-Current`.
        current: Option<u64>,
        /// The problem `type`, when fencegate answered itself.
        problem: Option<String>,
        /// The problem's `waiting` member: a 409 because a higher token
        /// waits for the key.
        waiting: Option<u64>,
    },
    /// No answer: connection refused or broken (fencegate was killed), or too slow.
    Failed(String),
}

/// One request a client made, with when it was sent and when its answer was in.
#[derive(Debug, Clone)]
struct Op {
    id: u64,
    kind: Kind,
    key: usize,
    token: u64,
    /// The replica it went through (an index into the run's fencegates).
    via: usize,
    sent: Instant,
    done: Instant,
    answer: Answer,
}

impl Op {
    fn code(&self) -> Option<u16> {
        match self.answer {
            Answer::Status { code, .. } => Some(code),
            Answer::Failed(_) => None,
        }
    }

    fn problem(&self) -> Option<&str> {
        match &self.answer {
            Answer::Status { problem, .. } => problem.as_deref(),
            Answer::Failed(_) => None,
        }
    }

    /// Refused by fencegate before any mark moved: stale, or gave up waiting
    /// for the key's turn (the mark is checked and raised only with the turn).
    fn refused(&self) -> bool {
        self.code() == Some(409) || self.problem() == Some("urn:fencegate:problem:queue-timeout")
    }

    /// Answered by fencegate itself without forwarding anything: refused, or
    /// any 503 (the queue timeout, and also a fence store that did not answer
    /// in time, which may have raised the mark all the same).
    fn turned_away(&self) -> bool {
        self.refused() || self.code() == Some(503)
    }

    /// Known to have raised the mark to its token: answered by the upstream,
    /// failed at the upstream after the fence let it pass, or raised through the API.
    fn raised(&self) -> bool {
        match (self.kind, self.code()) {
            (Kind::Fence | Kind::Lease, Some(code)) => code == 200,
            (_, Some(200 | 500 | 502 | 504)) => true,
            _ => false,
        }
    }
}

/// Where a replica listens now; it changes with every restart.
#[derive(Debug, Clone, Copy)]
struct Target {
    proxy: SocketAddr,
    admin: SocketAddr,
}

impl Target {
    fn of(fg: &Running) -> Target {
        Target { proxy: fg.proxy, admin: fg.admin }
    }
}

struct Shared {
    /// Per replica.
    targets: RwLock<Vec<Target>>,
    /// The lock service: per key, the last token handed out.
    lock_service: Vec<AtomicU64>,
    next_op: AtomicU64,
    answered: AtomicUsize,
    stop: AtomicBool,
}

impl Shared {
    fn target(&self, via: usize) -> Target {
        self.targets.read().unwrap()[via]
    }

    /// A replica picked at random (no draw when there is one: a seed replays
    /// the single-replica run as before).
    fn pick(&self, rng: &mut impl RngExt) -> usize {
        match self.targets.read().unwrap().len() {
            1 => 0,
            n => rng.random_range(0..n),
        }
    }
}

/// Sends one request and waits for its whole answer.
async fn request(client: &Client<HttpConnector, Full<Bytes>>, req: Request<Full<Bytes>>) -> Result<Answer, String> {
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| format!("reading the body: {e}"))?.to_bytes();
        let current = parts.headers.get("x-fencing-token-current").map(|v| {
            v.to_str().ok().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX) // u64::MAX: malformed, flagged later
        });
        let is_problem = parts.headers.get("content-type").is_some_and(|v| v == "application/problem+json");
        let problem = is_problem.then(|| serde_json::from_slice::<serde_json::Value>(&body).ok()).flatten();
        Ok(Answer::Status {
            code: parts.status.as_u16(),
            current,
            waiting: problem.as_ref().and_then(|p| p.get("waiting")).map(|w| w.as_u64().unwrap_or(u64::MAX)),
            problem: problem.map(|p| p["type"].as_str().unwrap_or("(no type)").to_string()),
        })
    };
    tokio::time::timeout(Duration::from_secs(20), exchange).await.map_err(|_| "no answer in 20 s".to_string())?
}

/// Spellings of a write's method: the upstream, like Werkzeug, takes each as a write.
const METHODS: [&str; 8] = ["PUT", "put", "Put", "pUT", "POST", "post", "PATCH", "dElEtE"];

/// The path of `key` in one of the spellings a server resolves to it.
fn spelled_path(key: usize, rng: &mut impl RngExt) -> String {
    match rng.random_range(0..6) {
        0 => format!("/k//{key}"),
        1 => format!("/k/./{key}"),
        2 => format!("/k/x/../{key}"),
        3 => format!("/k/%{:02X}", b'0' + key as u8),
        _ => key_path(key),
    }
}

/// A fenced write (or probe) of `key` with `token` through replica `via`.
async fn write(
    client: &Client<HttpConnector, Full<Bytes>>,
    shared: &Shared,
    rng: &mut StdRng,
    (kind, via): (Kind, usize),
    key: usize,
    token: u64,
) -> Op {
    let id = shared.next_op.fetch_add(1, Ordering::Relaxed);
    let (method, path) = (METHODS[rng.random_range(0..METHODS.len())], spelled_path(key, rng));
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", shared.target(via).proxy))
        .header("x-fencing-token", token)
        .header("x-op-id", id)
        .body(Full::new(Bytes::from(format!("op {id} token {token}"))))
        .unwrap();
    let sent = Instant::now();
    let result = request(client, req).await;
    finish(
        shared,
        Op { id, kind, key, token, via, sent, done: Instant::now(), answer: Answer::Failed(String::new()) },
        result,
    )
}

/// A write over a raw connection whose client hangs up without reading the
/// answer: once the whole request is sent (`HangUp`), or halfway through its
/// body (`HalfBody`). Its outcome is unknown to the client, as after a crash.
async fn hang_up(shared: &Shared, rng: &mut StdRng, (kind, via): (Kind, usize), key: usize, token: u64) -> Op {
    use tokio::io::AsyncWriteExt;
    let id = shared.next_op.fetch_add(1, Ordering::Relaxed);
    let body = format!("op {id} token {token}");
    let (method, path, linger) =
        (METHODS[rng.random_range(0..METHODS.len())], spelled_path(key, rng), rng.random_range(0..5));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: checker\r\nx-fencing-token: {token}\r\nx-op-id: {id}\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    let sent_body = match kind {
        Kind::HalfBody => &body[..body.len() / 2],
        _ => &body[..],
    };
    let sent = Instant::now();
    let result = match tokio::net::TcpStream::connect(shared.target(via).proxy).await {
        Ok(mut stream) => {
            let wrote = stream.write_all(format!("{head}{sent_body}").as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(linger)).await;
            drop(stream);
            Err(match wrote {
                Ok(()) => "hung up".to_string(),
                Err(e) => format!("hung up, the request not sent whole: {e}"),
            })
        }
        Err(e) => Err(format!("connect: {e}")),
    };
    finish(
        shared,
        Op { id, kind, key, token, via, sent, done: Instant::now(), answer: Answer::Failed(String::new()) },
        result,
    )
}

/// Raises the fence of `key` to `token` through the admin API of replica `via`.
async fn prefence(
    client: &Client<HttpConnector, Full<Bytes>>,
    shared: &Shared,
    via: usize,
    key: usize,
    token: u64,
) -> Op {
    let id = shared.next_op.fetch_add(1, Ordering::Relaxed);
    let query = form_urlencoded::Serializer::new(String::new()).append_pair("key", &key_path(key)).finish();
    let req = Request::put(format!("http://{}/fences?{query}", shared.target(via).admin))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Full::new(Bytes::from(format!("{{\"token\": {token}}}"))))
        .unwrap();
    let sent = Instant::now();
    let result = request(client, req).await;
    let done = Instant::now();
    let op = Op { id, kind: Kind::Fence, key, token, via, sent, done, answer: Answer::Failed(String::new()) };
    finish(shared, op, result)
}

/// Takes the lease of `key` through the lease API of replica `via`: a short
/// one (it runs out on its own), no wait. The op's token is the one granted
/// (0 when none was).
async fn lease(client: &Client<HttpConnector, Full<Bytes>>, shared: &Shared, via: usize, key: usize) -> Op {
    let id = shared.next_op.fetch_add(1, Ordering::Relaxed);
    let query = form_urlencoded::Serializer::new(String::new()).append_pair("key", &key_path(key)).finish();
    let req = Request::post(format!("http://{}/leases?{query}", shared.target(via).admin))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Full::new(Bytes::from(format!("{{\"holder\": \"w{id}\", \"ttl\": \"300ms\"}}"))))
        .unwrap();
    let sent = Instant::now();
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| format!("reading the body: {e}"))?.to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        Ok::<_, String>((code, body["token"].as_u64(), body["type"].as_str().map(str::to_owned)))
    };
    let answer =
        tokio::time::timeout(Duration::from_secs(20), exchange).await.map_err(|_| "no answer in 20 s".to_string());
    let (token, result) = match answer.and_then(|a| a) {
        Ok((code, token, problem)) => (
            token.filter(|_| code == 200).unwrap_or(0),
            Ok(Answer::Status { code, current: None, problem, waiting: None }),
        ),
        Err(e) => (0, Err(e)),
    };
    let op = Op {
        id,
        kind: Kind::Lease,
        key,
        token,
        via,
        sent,
        done: Instant::now(),
        answer: Answer::Failed(String::new()),
    };
    finish(shared, op, result)
}

fn finish(shared: &Shared, mut op: Op, result: Result<Answer, String>) -> Op {
    op.answer = match result {
        Ok(answer) => {
            shared.answered.fetch_add(1, Ordering::Relaxed);
            answer
        }
        Err(e) => Answer::Failed(e),
    };
    op
}

/// A lock holder: mostly takes the lock anew (the next token of a random key),
/// sometimes keeps writing with the token it holds, which may have been
/// overtaken while it paused.
async fn writer(shared: Arc<Shared>, mut rng: StdRng) -> Vec<Op> {
    let client = client();
    let mut ops = Vec::new();
    let mut held: Option<(usize, u64)> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let (key, token, acquired, pause, fence_first, rude) = {
            let (key, token, acquired) = match held {
                Some((key, token)) if rng.random_bool(0.6) => (key, token, false),
                // Now and then the lock comes from fencegate's lease API:
                // its token is the mark already (no pre-fencing needed).
                _ if rng.random_bool(0.1) => {
                    let key = rng.random_range(0..KEYS);
                    let op = lease(&client, &shared, shared.pick(&mut rng), key).await;
                    let granted = (op.code() == Some(200)).then_some(op.token);
                    ops.push(op);
                    let Some(token) = granted else {
                        // Held, or no answer: no lock this time.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    // The lock service's tokens go on above the lease's.
                    shared.lock_service[key].fetch_max(token, Ordering::SeqCst);
                    (key, token, false)
                }
                _ => {
                    let key = rng.random_range(0..KEYS);
                    (key, shared.lock_service[key].fetch_add(1, Ordering::SeqCst) + 1, true)
                }
            };
            // Now and then a long pause (a GC, a network hiccup): the lease runs out.
            let pause = if rng.random_bool(0.03) { rng.random_range(20..100) } else { rng.random_range(0..4) };
            // Now and then a client that hangs up: after sending, or mid-body.
            let rude = match rng.random_range(0..100) {
                0..=3 => Some(Kind::HangUp),
                4..=5 => Some(Kind::HalfBody),
                _ => None,
            };
            (key, token, acquired, Duration::from_millis(pause), acquired && rng.random_bool(0.05), rude)
        };
        held = Some((key, token));
        if acquired {
            tokio::time::sleep(pause).await;
        }
        let burst = if fence_first {
            let via = shared.pick(&mut rng);
            vec![prefence(&client, &shared, via, key, token).await]
        } else {
            if !acquired {
                tokio::time::sleep(pause).await;
            }
            match rude {
                Some(kind) => {
                    let via = shared.pick(&mut rng);
                    vec![hang_up(&shared, &mut rng, (kind, via), key, token).await]
                }
                // Now and then the holder writes from several tasks at once.
                None if rng.random_bool(0.25) => together(&client, &shared, &mut rng, key, token).await,
                None => {
                    let via = shared.pick(&mut rng);
                    vec![write(&client, &shared, &mut rng, (Kind::Write, via), key, token).await]
                }
            }
        };
        for op in burst {
            match op.answer {
                // Fenced out: this holder has lost the lock.
                Answer::Status { code: 409, .. } => held = None,
                // fencegate is down; try again shortly.
                Answer::Failed(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                _ => {}
            }
            ops.push(op);
        }
    }
    ops
}

/// Two to four writes of one holder, of `key` with `token`, in flight
/// together (each through a replica of its own choosing).
async fn together(
    client: &Client<HttpConnector, Full<Bytes>>,
    shared: &Arc<Shared>,
    rng: &mut StdRng,
    key: usize,
    token: u64,
) -> Vec<Op> {
    let tasks: Vec<_> = (0..rng.random_range(2..=4))
        .map(|_| {
            let (client, shared, mut rng) = (client.clone(), shared.clone(), StdRng::seed_from_u64(rng.random()));
            tokio::spawn(async move {
                let via = shared.pick(&mut rng);
                write(&client, &shared, &mut rng, (Kind::Write, via), key, token).await
            })
        })
        .collect();
    let mut ops = Vec::with_capacity(tasks.len());
    for task in tasks {
        ops.push(task.await.expect("a writer task panicked"));
    }
    ops
}

// -------------------------------------------------------------- the run

/// What the checker runs: how many fencegates, on which store.
#[derive(Debug, Clone, Copy)]
struct Mode {
    /// fencegate processes in front of the one upstream, sharing their fences.
    replicas: usize,
    /// Where the fences are kept.
    store: Store,
    /// The route's `queue_timeout`.
    queue_timeout: &'static str,
}

/// Where a run's replicas keep their fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    /// The durable file store (one replica).
    File,
    /// A durable Redis the test starts (`appendfsync always`).
    Redis,
    /// A 3-member etcd cluster the test starts.
    Etcd,
}

/// What the checker does to the run besides the writers' own trouble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// A replica (each in turn) killed with SIGKILL and started again.
    Replica,
    /// The etcd leader killed with SIGKILL, and started again a while later.
    EtcdLeader,
}

impl Mode {
    /// The default run's faults, in order: the `k`th of `n` comes once the
    /// answered requests reach `k / (n + 1)` of [`TARGET_OPS`].
    fn faults(self) -> Vec<Fault> {
        let mut faults = vec![Fault::Replica; KILLS];
        if self.store == Store::Etcd {
            // Between the replicas' restarts.
            faults.insert(KILLS / 2, Fault::EtcdLeader);
        }
        faults
    }

    /// The soak's `n`th fault (from 0): on etcd every third is the leader's.
    fn soak_fault(self, n: usize) -> Fault {
        match self.store {
            Store::Etcd if n % 3 == 1 => Fault::EtcdLeader,
            _ => Fault::Replica,
        }
    }
}

/// One fencegate on the durable file store.
const ONE_ON_FILE: Mode = Mode { replicas: 1, store: Store::File, queue_timeout: "10s" };

/// Two fencegates sharing their fences on one durable Redis. A replica
/// killed mid-write leaves records of its writes in flight that every raise
/// of their keys waits for, until they expire (the route's timeout and settle
/// period plus a second: 1.6 s); a queue timeout shorter than that turns some
/// of those waits into 503s, which the checks count as refusals.
const TWO_ON_REDIS: Mode = Mode { replicas: 2, store: Store::Redis, queue_timeout: "1s" };

/// Two fencegates sharing their fences on a 3-member etcd cluster. A killed
/// replica's records stand until its etcd lease ends: the TTL covers a
/// write's lease (twice the queue timeout, the route's timeout and settle
/// period: 3 s) rounded up, plus a second, so 4 s, and a new leader
/// renews every lease in full. As on Redis, raises that wait for them past
/// the short queue timeout get 503, counted as refusals.
const TWO_ON_ETCD: Mode = Mode { replicas: 2, store: Store::Etcd, queue_timeout: "1s" };

/// The replicas' one config, and their store: the file store in `dir`, a
/// Redis of the run's own (with an append-only file fsynced on every write),
/// or an etcd cluster of its own (3 members).
struct Site {
    dir: TempDir,
    config: PathBuf,
    _redis: Option<Redis>,
    etcd: Option<EtcdCluster>,
}

impl Site {
    async fn new(mode: Mode, upstream: SocketAddr) -> Site {
        let dir = TempDir::new();
        let routes = format!(
            "[[route]]\nname = \"k\"\nprefix = \"/k/\"\nupstream = \"http://{upstream}\"\n\
             timeout = \"{}ms\"\nqueue_timeout = \"{}\"\nsettle = \"{SETTLE}\"\n",
            ROUTE_TIMEOUT.as_millis(),
            mode.queue_timeout
        );
        let (mut redis, mut etcd) = (None, None);
        let store = match mode.store {
            Store::File => file_store(&dir.path().join("store"), ""),
            Store::Redis => redis_store(redis.insert(Redis::start_durable()), "key_prefix = \"checker:\""),
            Store::Etcd => etcd_store(etcd.insert(EtcdCluster::start(3).await), "key_prefix = \"checker/\""),
        };
        // One line per request would pile up in the test's memory: access and audit logs off.
        let fences = format!("{store}[log]\nlevel = \"info,fencegate::access=warn,fencegate::audit=warn\"\n");
        let config =
            dir.write("fencegate.toml", &config_text(&format!("auth_token = \"{ADMIN_TOKEN}\""), &fences, &routes));
        Site { dir, config, _redis: redis, etcd }
    }

    /// One replica; started again after a kill, on the same store.
    async fn start(&self) -> Running {
        Running::start_in(self.dir.path(), &self.config).await
    }
}

/// Per key, the highest token the upstream applied.
fn highest_applied(up: &HistoryUpstream) -> [Option<u64>; KEYS] {
    let mut highest = [None; KEYS];
    for w in &up.history.lock().unwrap().applied {
        highest[w.key] = highest[w.key].max(Some(w.token));
    }
    highest
}

/// The fence of `key` as the admin API of `fg` reports it, or its answer
/// when it does not.
async fn fence_of(fg: &Running, key: usize) -> Result<Option<u64>, String> {
    let query = form_urlencoded::Serializer::new(String::new()).append_pair("key", &key_path(key)).finish();
    let r = get(&fg.admin_url(&format!("/fences?{query}"))).await;
    match r.status {
        StatusCode::OK => Ok(r.json()["token"].as_u64()),
        status => Err(format!("{status} {}", r.text())),
    }
}

/// One run: the upstream, the replicas on their store, and what the checker
/// itself does and finds besides the writers.
struct Run {
    site: Site,
    up: HistoryUpstream,
    fg: Vec<Running>,
    shared: Arc<Shared>,
    /// The checker's own random choices: the soak's pace, the probes'.
    rng: StdRng,
    probes: Vec<Op>,
    violations: Vec<String>,
    /// Replicas killed and started again.
    kills: usize,
    /// The etcd leader's outages: from the election of another leader to
    /// the killed member's restart (the cluster ran on two members).
    outages: Vec<(Instant, Instant)>,
}

impl Run {
    async fn fault(&mut self, fault: Fault) {
        match fault {
            Fault::Replica => self.crash_and_restart().await,
            Fault::EtcdLeader => self.kill_the_etcd_leader().await,
        }
    }

    /// SIGKILL of a replica (each in turn), then a start on the same store;
    /// checks through every replica that every token the upstream applied is
    /// still fenced.
    async fn crash_and_restart(&mut self) {
        let victim = self.kills % self.fg.len();
        self.fg[victim].kill();
        self.kills += 1;
        if self.fg.len() == 1 {
            // A restarted fencegate holds keys for the settle period, which
            // covers a write still in flight from before the crash
            // (`faults`, after_a_crash_a_write_still_in_flight_is_not_overtaken).
            // The checker still lets the upstream finish everything the dead
            // process sent before starting the next one, so each history
            // stays easy to judge.
            let start = Instant::now();
            while !self.up.idle() {
                assert!(start.elapsed() < PATIENCE, "the upstream never finished the killed proxy's requests");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        } else {
            // The other replica serves on meanwhile, and the dead one's writes
            // still in flight at the upstream are the point: the store keeps
            // their records until their leases end, and a raise of their key
            // through either replica must wait for them (the overlap check).
            let down = Duration::from_millis(self.rng.random_range(0..500));
            tokio::time::sleep(down).await;
        }
        self.fg[victim] = self.site.start().await;
        self.shared.targets.write().unwrap()[victim] = Target::of(&self.fg[victim]);
        self.probe_every_key("after a restart").await;
    }

    /// SIGKILL of the etcd leader while the writers go on: the two members
    /// left elect another and keep the quorum. A few seconds (and at least
    /// a few hundred answers) later the member is started again on its data;
    /// once it has rejoined, every token the upstream applied must still be
    /// fenced, through every replica.
    async fn kill_the_etcd_leader(&mut self) {
        let down = Duration::from_millis(self.rng.random_range(2000..5000));
        let cluster = self.site.etcd.as_mut().expect("the etcd leader is killed in a run on etcd");
        let leader = cluster.leader().await;
        cluster.kill(leader);
        let killed = Instant::now();
        let answered = self.shared.answered.load(Ordering::Relaxed);
        let new = cluster.wait_leader(Some(leader), PATIENCE).await;
        let elected = Instant::now();
        eprintln!(
            "checker: etcd member {new} leads {:?} after member {leader}, the leader, was killed",
            elected - killed
        );
        while killed.elapsed() < down || self.shared.answered.load(Ordering::Relaxed) < answered + TARGET_OPS / 20 {
            assert!(
                killed.elapsed() < PATIENCE,
                "with etcd member {leader} down, the run made only {} answers in {PATIENCE:?}",
                self.shared.answered.load(Ordering::Relaxed) - answered
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cluster.restart(leader).await;
        self.outages.push((elected, Instant::now()));
        cluster.wait_rejoined(leader).await;
        eprintln!("checker: etcd member {leader} rejoined {:?} after it was killed", killed.elapsed());
        for fg in &self.fg {
            fg.wait_writable(true, PATIENCE).await;
        }
        self.probe_every_key("after the etcd leader was killed and started again").await;
    }

    /// Probes every key the upstream applied a write to through every
    /// replica, `after` a fault: the highest token applied minus one must be
    /// refused (409), and the fence API must report at least that token.
    async fn probe_every_key(&mut self, after: &str) {
        let client = client();
        let applied = highest_applied(&self.up);
        for (via, fg) in self.fg.iter().enumerate() {
            for (key, applied) in applied.iter().enumerate() {
                let Some(applied) = *applied else { continue };
                let token = applied.saturating_sub(1);
                let probe = write(&client, &self.shared, &mut self.rng, (Kind::Probe, via), key, token).await;
                match probe.answer {
                    Answer::Status { code: 409, current: Some(current), .. } if current >= applied => {}
                    // A higher token was waiting for the key: the API check
                    // below still says whether the fence was kept.
                    Answer::Status { code: 409, current: None, waiting: Some(waiting), .. } if waiting >= applied => {}
                    // Refused, but not as stale: the store did not answer (or
                    // is not trusted), so the probe says nothing of the fence.
                    _ if probe.problem() == Some("urn:fencegate:problem:store-unavailable") => {
                        self.violations.push(format!(
                            "store unavailable: {after}, replica {via} answered the probe of key {key} \
                             (the upstream applied {applied}) with 503 store-unavailable: {probe:?}"
                        ))
                    }
                    _ => self.violations.push(format!(
                        "lost fence: {after}, key {key} (the upstream applied {applied}) answered {probe:?}"
                    )),
                }
                self.probes.push(probe);
                match fence_of(fg, key).await {
                    Ok(mark) if mark < Some(applied) => self.violations.push(format!(
                        "lost fence: {after}, the API of replica {via} says key {key} is at {mark:?}, below {applied}"
                    )),
                    Ok(_) => {}
                    Err(answer) => self.violations.push(format!(
                        "store unavailable: {after}, the API of replica {via} answered {answer} for key {key}"
                    )),
                }
            }
        }
    }
}

/// Waits until the writers' requests answered reach `goal`.
async fn wait_for_ops(shared: &Shared, writers: &[tokio::task::JoinHandle<Vec<Op>>], goal: usize) {
    let start = Instant::now();
    while shared.answered.load(Ordering::Relaxed) < goal {
        assert!(writers.iter().all(|w| !w.is_finished()), "a writer stopped early");
        assert!(
            start.elapsed() < 5 * PATIENCE,
            "stuck at {} answered requests",
            shared.answered.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One run at a time: its timings are tight for a loaded machine, and cargo
/// runs a file's tests in parallel.
static ONE_RUN_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_write_survives_slow_failing_upstreams_and_kill_9() {
    check_a_run(ONE_ON_FILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_redis() {
    check_a_run(TWO_ON_REDIS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_etcd() {
    check_a_run(TWO_ON_ETCD).await;
}

async fn check_a_run(mode: Mode) {
    let _alone = ONE_RUN_AT_A_TIME.lock().await;
    let soak = std::env::var("FENCEGATE_SOAK_SECS").ok().map(|s| {
        Duration::from_secs(s.parse().unwrap_or_else(|_| panic!("FENCEGATE_SOAK_SECS={s} is not a number of seconds")))
    });
    let seed = test_seed();
    // Independent streams from the one seed: the upstream's, each writer's, the soak's.
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();
    let up = HistoryUpstream::start(rng.random()).await;
    let site = Site::new(mode, up.addr).await;
    let mut fg = Vec::with_capacity(mode.replicas);
    for _ in 0..mode.replicas {
        fg.push(site.start().await);
    }
    let shared = Arc::new(Shared {
        targets: RwLock::new(fg.iter().map(Target::of).collect()),
        lock_service: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        next_op: AtomicU64::new(0),
        answered: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    });
    let writers: Vec<_> =
        (0..WRITERS).map(|_| tokio::spawn(writer(shared.clone(), StdRng::seed_from_u64(rng.random())))).collect();
    let mut run =
        Run { site, up, fg, shared, rng, probes: Vec::new(), violations: Vec::new(), kills: 0, outages: Vec::new() };

    match soak {
        None => {
            let faults = mode.faults();
            for (k, fault) in faults.iter().enumerate() {
                wait_for_ops(&run.shared, &writers, TARGET_OPS * (k + 1) / (faults.len() + 1)).await;
                run.fault(*fault).await;
            }
            wait_for_ops(&run.shared, &writers, TARGET_OPS).await;
        }
        Some(soak) => {
            for n in 0.. {
                let next = Duration::from_millis(run.rng.random_range(10_000..30_000));
                if began.elapsed() + next >= soak {
                    tokio::time::sleep(soak.saturating_sub(began.elapsed())).await;
                    break;
                }
                tokio::time::sleep(next).await;
                assert!(writers.iter().all(|w| !w.is_finished()), "a writer stopped early");
                run.fault(mode.soak_fault(n)).await;
                eprintln!(
                    "checker: {:?}: {} answered requests, {} restarts, {} etcd leaders killed",
                    began.elapsed(),
                    run.shared.answered.load(Ordering::Relaxed),
                    run.kills,
                    run.outages.len()
                );
            }
        }
    }
    run.shared.stop.store(true, Ordering::Relaxed);
    let mut ops = std::mem::take(&mut run.probes);
    for w in writers {
        ops.extend(w.await.unwrap());
    }
    let start = Instant::now();
    while run.up.history.lock().unwrap().in_flight.iter().any(|t| !t.is_empty()) {
        assert!(start.elapsed() < PATIENCE, "writes stayed in flight at the upstream");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The final marks, read through every replica: one store, one answer
    // (`None`: no replica could read it, a violation of its own).
    let mut marks = [None; KEYS];
    for (key, mark) in marks.iter_mut().enumerate() {
        let mut read = Vec::new();
        for fg in &run.fg {
            read.push(fence_of(fg, key).await);
        }
        match read.iter().find_map(|r| r.as_ref().ok()) {
            Some(first) => *mark = Some(*first),
            None => run.violations.push(format!("store unavailable: no replica read the final mark of key {key}")),
        }
        for (via, r) in read.iter().enumerate() {
            match r {
                Ok(m) if Some(m) != mark.as_ref() => run.violations.push(format!(
                    "final mark: key {key} is at {:?} through one replica, {m:?} through replica {via}",
                    mark.flatten()
                )),
                Ok(_) => {}
                Err(answer) => run.violations.push(format!(
                    "store unavailable: at the end, the API of replica {via} answered {answer} for key {key}"
                )),
            }
        }
    }
    let history = std::mem::take(&mut *run.up.history.lock().unwrap());

    let mut violations = std::mem::take(&mut run.violations);
    violations.extend(check(&ops, &history, &marks));
    let report = summary(&ops, &history, mode, (run.kills, run.outages.len()), began.elapsed());
    eprintln!("{report}");
    assert!(violations.is_empty(), "{}\n{report}", by_kind(&violations));

    // The run exercised what it is meant to.
    let count = |f: &dyn Fn(&Op) -> bool| ops.iter().filter(|o| f(o)).count();
    if soak.is_none() {
        assert!(run.shared.answered.load(Ordering::Relaxed) >= TARGET_OPS);
        assert_eq!(run.kills, KILLS);
        assert_eq!(run.outages.len(), mode.faults().iter().filter(|f| **f == Fault::EtcdLeader).count());
    }
    // With one etcd member of three down, the quorum stays: writes go on.
    for (from, to) in &run.outages {
        let ok = count(&|o| o.kind == Kind::Write && o.code() == Some(200) && o.sent >= *from && o.sent < *to);
        assert!(
            ok > 0,
            "no write succeeded in the {:?} an etcd member was down after the election: {report}",
            *to - *from
        );
    }
    assert!(count(&|o| o.code() == Some(200)) > 0, "{report}");
    assert!(count(&|o| o.code() == Some(409) && o.kind == Kind::Write) > 0, "no stale writer: {report}");
    assert!(count(&|o| o.code() == Some(500)) > 0, "{report}");
    assert!(count(&|o| o.code() == Some(502)) > 0, "no hang-up: {report}");
    assert!(count(&|o| o.code() == Some(504)) > 0, "no timeout: {report}");
    assert!(count(&|o| o.kind == Kind::Fence && o.code() == Some(200)) > 0, "{report}");
    assert!(count(&|o| o.kind == Kind::Lease && o.code() == Some(200)) > 0, "no lease was granted: {report}");
    assert!(history.shared > 0, "a holder's writes were never in flight together: {report}");
    if mode.replicas > 1 {
        assert!(handoffs(&ops, &history) > 0, "no key went from one token to another across replicas: {report}");
    }
    let fates: Vec<Fate> = history.fates.values().copied().collect();
    for fate in [
        Fate::HungUp { applied: Applied::Never },
        Fate::HungUp { applied: Applied::BeforeHangingUp },
        Fate::HungUp { applied: Applied::AfterHangingUp },
        Fate::TooSlow,
    ] {
        assert!(fates.contains(&fate), "no {fate:?} in the run: {report}");
    }
}

// ------------------------------------------------------------- the checks

/// Every violation of the invariants the history shows.
fn check(ops: &[Op], history: &History, marks: &[Option<Option<u64>>; KEYS]) -> Vec<String> {
    let mut violations = Vec::new();
    let by_id: HashMap<u64, &Op> = ops.iter().map(|o| (o.id, o)).collect();
    // What became of a write the upstream saw, for the messages.
    let story = |w: &Write| match by_id.get(&w.op) {
        Some(op) => format!("op {} via replica {}: {:?}, {:?}", w.op, op.via, history.fates.get(&w.op), op.answer),
        None => format!("op {}: sent by no client", w.op),
    };
    for (write, others) in &history.overlaps {
        let others: Vec<String> = others.iter().map(|o| format!("{o:?} ({})", story(o))).collect();
        // A raise through the fence API takes no turn: the writes of its token
        // that follow must still wait for the old holder's.
        let prefenced = ops
            .iter()
            .filter(|o| {
                matches!(o.kind, Kind::Fence | Kind::Lease)
                    && o.key == write.key
                    && o.token == write.token
                    && o.raised()
            })
            .map(|o| {
                format!(", its token raised through the {:?} API of replica {} first (op {})", o.kind, o.via, o.id)
            })
            .next()
            .unwrap_or_default();
        violations.push(format!(
            "overlap: {write:?} ({}{prefenced}) arrived while writes of other tokens were in flight: {}",
            story(write),
            others.join("; ")
        ));
    }
    violations.extend(
        history
            .malformed
            .iter()
            .map(|m| format!("malformed request: the upstream got one without key, token or op id: {m}")),
    );

    // No stale write: per key, tokens reached the upstream, and were applied,
    // in non-decreasing order.
    for (what, writes) in [("received", &history.received), ("applied", &history.applied)] {
        let mut last: [Option<Write>; KEYS] = [None; KEYS];
        for w in writes {
            if let Some(prev) = last[w.key] {
                if w.token < prev.token {
                    violations.push(format!(
                        "stale write: the upstream {what} {w:?} ({}) after {prev:?} ({})",
                        story(w),
                        story(&prev)
                    ));
                }
            }
            last[w.key] = Some(*w);
        }
    }

    // A fenced body is forwarded whole or not at all.
    for op in &history.cut_short {
        violations.push(format!("half a body forwarded: op {op} reached the upstream with its body cut short"));
    }
    // Each request reached the upstream at most once, and only if fencegate let it through.
    let mut received = HashSet::new();
    for w in &history.received {
        if !received.insert(w.op) {
            violations.push(format!("sent twice: {w:?} reached the upstream again"));
        }
        match by_id.get(&w.op) {
            Some(op) if op.turned_away() || matches!(op.kind, Kind::Fence | Kind::Lease) => {
                violations.push(format!("refused yet forwarded: {op:?} reached the upstream"))
            }
            Some(op) if op.kind == Kind::HalfBody => {
                violations.push(format!("half a body forwarded: {op:?} reached the upstream"))
            }
            Some(op) if op.key != w.key || op.token != w.token => {
                violations.push(format!("mismatch: the upstream got {w:?} for {op:?}"))
            }
            Some(_) => {}
            None => violations.push(format!("unknown request: the upstream got {w:?}, which no client sent")),
        }
    }
    for op in ops {
        // Only the upstream answers a write with 200 or 500.
        let fate = history.fates.get(&op.id);
        match (op.kind, op.code(), fate) {
            (Kind::Fence | Kind::Lease, ..)
            | (_, Some(200), Some(Fate::Ok | Fate::TooSlow | Fate::Slow))
            | (_, Some(500), Some(Fate::Error { .. })) => {}
            (_, Some(200 | 500), _) => {
                violations.push(format!("wrong answer: the client saw {op:?}, the upstream's fate was {fate:?}"))
            }
            _ => {}
        }
        if op.kind == Kind::Probe && op.code() != Some(409) {
            violations.push(format!("stale probe not refused: {op:?}"));
        }
    }

    // Every 409 was really stale, and cites a mark some request set before the 409 came back.
    // A request that fencegate did not refuse may have raised the mark; one it refused did not.
    let mut may_have_raised: HashMap<(usize, u64), Instant> = HashMap::new();
    for op in ops.iter().filter(|o| !o.refused()) {
        let first = may_have_raised.entry((op.key, op.token)).or_insert(op.sent);
        *first = (*first).min(op.sent);
    }
    // A 409 for a token below one waiting for the key's turn cites that
    // token instead: some client sent it before the 409 came back.
    let mut first_sent: HashMap<(usize, u64), Instant> = HashMap::new();
    for op in ops {
        let first = first_sent.entry((op.key, op.token)).or_insert(op.sent);
        *first = (*first).min(op.sent);
    }
    // A lease taken with no answer (fencegate killed, the store failing) may
    // have raised the mark to a token no client saw.
    let unseen_lease = |key: usize, before: Instant| {
        ops.iter()
            .any(|o| o.kind == Kind::Lease && o.key == key && o.sent < before && !matches!(o.code(), Some(200 | 423)))
    };
    for op in ops.iter().filter(|o| o.code() == Some(409)) {
        let Answer::Status { current, waiting, .. } = op.answer else { unreachable!() };
        if let (None, Some(waiting)) = (current, waiting) {
            if waiting <= op.token {
                violations.push(format!("unexplained 409: the token is not below the one it says waits: {op:?}"));
            }
            // A lease taken meanwhile waits for the key's turn with a token
            // the checker learns only from its answer, if at all.
            let leasing =
                ops.iter().any(|o| o.kind == Kind::Lease && o.key == op.key && o.sent < op.done && o.done > op.sent);
            if !leasing && first_sent.get(&(op.key, waiting)).is_none_or(|sent| *sent >= op.done) {
                violations.push(format!("unexplained 409: no request with token {waiting} was sent before it: {op:?}"));
            }
            continue;
        }
        let Some(current) = current else {
            violations.push(format!("unexplained 409: no X-Fencing-Token-Current: {op:?}"));
            continue;
        };
        if current <= op.token {
            violations.push(format!("unexplained 409: the token is not below the mark it cites: {op:?}"));
        }
        match may_have_raised.get(&(op.key, current)) {
            Some(sent) if *sent < op.done => {}
            Some(_) => violations
                .push(format!("unexplained 409: mark {current} was sent only after the 409 came back: {op:?}")),
            None if unseen_lease(op.key, op.done) => {}
            None => {
                // What became of the requests that carried it, if any did.
                let carried: Vec<String> = ops
                    .iter()
                    .filter(|o| o.key == op.key && o.token == current)
                    .map(|o| format!("op {} {:?} via replica {}: {:?}", o.id, o.kind, o.via, o.answer))
                    .collect();
                violations.push(format!(
                    "unexplained 409: no request that may have passed the fence carried mark {current}: {op:?}; \
                     the requests with token {current}: {carried:?}"
                ))
            }
        }
    }

    // A lease's token is above every token known raised before it was asked
    // for, a lease's included: on any replica, none is granted twice.
    let mut granted: HashMap<(usize, u64), &Op> = HashMap::new();
    for lease in ops.iter().filter(|o| o.kind == Kind::Lease && o.code() == Some(200)) {
        if let Some(other) = granted.insert((lease.key, lease.token), lease) {
            violations.push(format!("lease token granted twice: {other:?} and {lease:?}"));
        }
        let before =
            ops.iter().filter(|o| o.key == lease.key && o.raised() && o.done < lease.sent).max_by_key(|o| o.token);
        if let Some(higher) = before.filter(|o| o.token >= lease.token) {
            violations.push(format!("lease token not above a raised one: {lease:?} after {higher:?}"));
        }
    }

    // A fence never goes back: a request that passed the fence carried a token
    // at least as high as every mark known to be set before it was sent.
    let passed: HashSet<u64> = history.received.iter().map(|w| w.op).collect();
    for (key, final_mark) in marks.iter().copied().enumerate() {
        // (when it became known, the mark it proves, the request that proved it)
        let mut known: Vec<(Instant, u64, &Op)> = ops
            .iter()
            .filter(|o| o.key == key)
            .filter_map(|o| match o.answer {
                Answer::Status { code: 409, current: Some(current), .. } => Some((o.done, current, o)),
                _ if o.raised() => Some((o.done, o.token, o)),
                _ => None,
            })
            .collect();
        known.sort_by_key(|k| k.0);
        let mut passing: Vec<&Op> = ops
            .iter()
            .filter(|o| {
                o.key == key && !matches!(o.kind, Kind::Fence | Kind::Lease) && (passed.contains(&o.id) || o.raised())
            })
            .collect();
        passing.sort_by_key(|o| o.sent);
        let (mut i, mut mark, mut proof) = (0, 0, None);
        for op in passing {
            while i < known.len() && known[i].0 < op.sent {
                if known[i].1 > mark {
                    (mark, proof) = (known[i].1, Some(known[i].2));
                }
                i += 1;
            }
            if op.token < mark {
                let proof = proof.map(|p| format!("{p:?}, answered {:?} before", op.sent - p.done));
                violations.push(format!(
                    "fence went back: {op:?} (at the upstream: {:?}) passed the fence after mark {mark} was known \
                     from {}",
                    history.fates.get(&op.id),
                    proof.unwrap_or_default()
                ));
            }
        }

        // The final mark: at least every token known to be raised, at most the
        // highest token that may have been.
        let Some(final_mark) = final_mark else { continue };
        let raised = ops.iter().filter(|o| o.key == key && o.raised()).map(|o| o.token).max();
        let possible = ops.iter().filter(|o| o.key == key && !o.refused()).map(|o| o.token).max();
        let unbounded = unseen_lease(key, Instant::now());
        if final_mark < raised || (final_mark > possible && !unbounded) {
            violations.push(format!(
                "final mark: key {key} is at {final_mark:?}, but tokens raised reach {raised:?} and tokens sent \
                 {possible:?}"
            ));
        }
    }
    violations
}

/// Violations grouped by kind (the text before the first colon): a count and
/// the first few of each.
fn by_kind(violations: &[String]) -> String {
    let mut kinds: Vec<(&str, Vec<&String>)> = Vec::new();
    for v in violations {
        let kind = v.split(':').next().unwrap_or("");
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, list)) => list.push(v),
            None => kinds.push((kind, vec![v])),
        }
    }
    let mut text = format!("{} violations", violations.len());
    for (kind, list) in kinds {
        text.push_str(&format!("\n{kind}: {}, the first ones:", list.len()));
        for v in list.iter().take(3) {
            text.push_str(&format!("\n  {v}"));
        }
    }
    text
}

/// Per key, how often the upstream received a token other than the one
/// before it through another replica than the one before it.
fn handoffs(ops: &[Op], history: &History) -> usize {
    let via: HashMap<u64, usize> = ops.iter().map(|o| (o.id, o.via)).collect();
    let mut last: [Option<(u64, Option<&usize>)>; KEYS] = [None; KEYS];
    let mut count = 0;
    for w in &history.received {
        let now = (w.token, via.get(&w.op));
        if last[w.key].is_some_and(|(token, via)| token != now.0 && via != now.1) {
            count += 1;
        }
        last[w.key] = Some(now);
    }
    count
}

fn summary(ops: &[Op], history: &History, mode: Mode, (kills, leaders): (usize, usize), elapsed: Duration) -> String {
    let mut statuses: HashMap<String, usize> = HashMap::new();
    for op in ops {
        let mut what = match (&op.answer, op.kind) {
            (Answer::Status { code, .. }, Kind::Write) => code.to_string(),
            (Answer::Status { code, .. }, kind) => format!("{kind:?} {code}"),
            (Answer::Failed(_), kind) => format!("{kind:?} no answer"),
        };
        // fencegate's own 503s say why.
        if let (Some(503), Some(problem)) = (op.code(), op.problem()) {
            what = format!("{what} {}", problem.trim_start_matches("urn:fencegate:problem:"));
        }
        *statuses.entry(what).or_default() += 1;
    }
    let mut statuses: Vec<_> = statuses.into_iter().collect();
    statuses.sort();
    let failure = ops.iter().find_map(|o| match &o.answer {
        Answer::Failed(why) => Some(why.as_str()),
        Answer::Status { .. } => None,
    });
    let mut fates: HashMap<String, usize> = HashMap::new();
    for fate in history.fates.values() {
        *fates.entry(format!("{fate:?}")).or_default() += 1;
    }
    let mut fates: Vec<_> = fates.into_iter().collect();
    fates.sort();
    let per_replica: Vec<usize> =
        (0..mode.replicas).map(|r| ops.iter().filter(|o| o.via == r && o.code().is_some()).count()).collect();
    format!(
        "checker: {mode:?}: {} requests ({} answered, per replica {per_replica:?}) in {elapsed:.1?}, {kills} restarts, \
         {leaders} etcd leaders killed; \
         statuses {statuses:?}; upstream received {}, applied {}, {} while the holder's others were in flight, \
         {} tokens handed over across replicas; fates {fates:?}; a request without answer: {failure:?}",
        ops.len(),
        ops.iter().filter(|o| o.code().is_some()).count(),
        history.received.len(),
        history.applied.len(),
        history.shared,
        handoffs(ops, history),
    )
}
