//! The floor under fencegate's speed: the leanest HTTP/1.1 reverse proxy hyper
//! makes, for the load benchmark (`benches/load/run.sh`, contender
//! `hyper-floor`) to measure beside nginx and fencegate.
//!
//! It is built the way the fastest hyper proxies are: one single-threaded
//! runtime per worker thread, and each client connection with its own upstream
//! connection, opened once and kept. It does nothing else: no routing, no
//! fencing, no header rewrite, no timeouts, no logs, no metrics, no HTTP/2. So
//! what fencegate costs beyond it is fencegate's, and what it costs beyond nginx
//! is hyper's.
//!
//! With `fence` (the load benchmark's `fenced-floor` contender), it adds the
//! least a fencing proxy must do per request, the leanest way, and nothing
//! else: the body read whole, the `X-Fencing-Token` parsed and compared with
//! the path's mark and the path's writes in flight counted (one entry of one
//! sharded map, taken twice), a latency histogram, and one access-log line
//! through fencegate's log writer. No routing, no
//! canonical paths, no waiting turns (a raise while writes are in flight gets
//! 409), no durability. What fencegate costs beyond it is the rest of the
//! contract.
//!
//! ```text
//! cargo run --release --example hyper_floor -- LISTEN UPSTREAM [WORKERS [fence]]
//! cargo run --release --example hyper_floor -- 127.0.0.1:18100 127.0.0.1:18080 2
//! ```

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use dashmap::DashMap;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokio::net::{TcpListener, TcpStream};
// What fencegate ships with (src/main.rs).
#[path = "../src/allocator.rs"]
mod allocator;

#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() {
    if let Err(e) = run() {
        eprintln!("hyper_floor: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hyper_floor LISTEN UPSTREAM [WORKERS [fence]]";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let upstream: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let workers: usize = args.next().map(|w| w.parse()).transpose()?.unwrap_or(2).max(1);
    let fences = match args.next().as_deref() {
        None => None,
        Some("fence") => Some(Arc::new(Fences::new())),
        Some(_) => return Err(usage.into()),
    };
    // The log writer fencegate ships (src/telemetry/writer.rs): per-thread
    // buffers written by a thread of its own. RUST_LOG, when set, overrides `info`.
    let _log = fences
        .as_ref()
        .map(|_| fencegate::telemetry::init(fencegate::config::LogFormat::Human, "info", &Default::default()));

    // Every worker accepts on the same listening socket, on its own runtime.
    let listener = StdListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    eprintln!("hyper_floor: {listen} -> {upstream}, {workers} workers");
    let threads = (0..workers)
        .map(|_| {
            let listener = listener.try_clone()?;
            let fences = fences.clone();
            Ok(std::thread::spawn(move || worker(listener, upstream, fences)))
        })
        .collect::<Result<Vec<_>, std::io::Error>>()?;
    for thread in threads {
        thread.join().map_err(|_| "a worker thread panicked")??;
    }
    Ok(())
}

fn worker(listener: StdListener, upstream: SocketAddr, fences: Option<Arc<Fences>>) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = TcpListener::from_std(listener)?;
        loop {
            let (client, _) = listener.accept().await?;
            let fences = fences.clone();
            tokio::task::spawn_local(async move {
                let served = match fences {
                    None => serve(client, upstream, forward).await,
                    Some(fences) => serve(client, upstream, move |s, r| fence(fences.clone(), s, r)).await,
                };
                if let Err(e) = served {
                    eprintln!("hyper_floor: connection ended: {e}");
                }
            });
        }
    })
}

type Sender<B> = Rc<RefCell<SendRequest<B>>>;

/// Serves one client connection through its own upstream connection, each
/// request by `handle`.
async fn serve<B, F, R, RB>(client: TcpStream, upstream: SocketAddr, handle: F) -> Result<(), Error>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Error>,
    F: Fn(Sender<B>, Request<Incoming>) -> R + 'static,
    R: Future<Output = Result<Response<RB>, hyper::Error>> + 'static,
    RB: hyper::body::Body + 'static,
    RB::Error: Into<Error>,
{
    client.set_nodelay(true)?;
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake::<_, B>(TokioIo::new(stream)).await?;
    tokio::task::spawn_local(connection);
    // HTTP/1.1 serves one request at a time, so the sender is never shared.
    let sender = Rc::new(RefCell::new(sender));
    let service = service_fn(move |req: Request<Incoming>| handle(sender.clone(), req));
    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(client), service).await?;
    Ok(())
}

async fn forward<B: hyper::body::Body + 'static>(
    sender: Sender<B>,
    req: Request<B>,
) -> Result<Response<Incoming>, hyper::Error> {
    poll_fn(|cx| sender.borrow_mut().poll_ready(cx)).await?;
    let response = sender.borrow_mut().send_request(req);
    response.await
}

/// Each path's mark and its writes in flight.
struct Fences {
    marks: DashMap<Box<str>, Mark, ahash::RandomState>,
    latency: Histogram,
}

#[derive(Default)]
struct Mark {
    token: u64,
    in_flight: u32,
}

impl Fences {
    fn new() -> Self {
        Self { marks: DashMap::default(), latency: Histogram::new(exponential_buckets(0.0001, 2.0, 20)) }
    }

    /// Takes a turn on `key` for `token`: the token becomes the mark, unless
    /// it is below it, or above it while writes of the mark are in flight.
    fn enter(&self, key: &str, token: u64) -> bool {
        let mut mark = match self.marks.get_mut(key) {
            Some(mark) => mark,
            None => self.marks.entry(key.into()).or_default(),
        };
        if token < mark.token || (token > mark.token && mark.in_flight > 0) {
            return false;
        }
        mark.token = token;
        mark.in_flight += 1;
        true
    }

    fn leave(&self, key: &str) {
        if let Some(mut mark) = self.marks.get_mut(key) {
            mark.in_flight -= 1;
        }
    }
}

type FencedBody = Either<Incoming, Full<Bytes>>;

/// The least a fencing proxy does per request (see the top of the file).
async fn fence(
    fences: Arc<Fences>,
    sender: Sender<Full<Bytes>>,
    req: Request<Incoming>,
) -> Result<Response<FencedBody>, hyper::Error> {
    let start = Instant::now();
    let fenced = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let token = req.headers().get("x-fencing-token").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let key: Box<str> = req.uri().path().into();
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let entered = match token {
        Some(token) if fenced => fences.enter(&key, token),
        _ => !fenced,
    };
    let (response, decision) = if entered {
        let response = forward(sender, Request::from_parts(parts, Full::new(body))).await;
        if fenced {
            fences.leave(&key);
        }
        (response?.map(Either::Left), "forwarded")
    } else {
        let refusal = Response::builder().status(StatusCode::CONFLICT).body(Either::Right(Full::default()));
        (refusal.expect("a valid response"), "stale")
    };
    let latency = start.elapsed();
    fences.latency.observe(latency.as_secs_f64());
    if let Some(sink) = fencegate::telemetry::access_sink() {
        if tracing::enabled!(target: "fencegate::access", tracing::Level::INFO) {
            let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            sink.writer.line(false, |out| {
                use std::io::Write;
                let _ = writeln!(
                    out,
                    "{}.{:06} route=\"objects\" key={key:?} token={token:?} decision={decision:?} status={} latency_us={}",
                    at.as_secs(),
                    at.subsec_micros(),
                    response.status().as_u16(),
                    latency.as_micros()
                );
            });
        }
    }
    Ok(response)
}
