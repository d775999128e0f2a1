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
//! ```text
//! cargo run --release --example hyper_floor -- LISTEN UPSTREAM [WORKERS]
//! cargo run --release --example hyper_floor -- 127.0.0.1:18100 127.0.0.1:18080 2
//! ```

use std::future::poll_fn;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
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
    let usage = "usage: hyper_floor LISTEN UPSTREAM [WORKERS]";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let upstream: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let workers: usize = args.next().map(|w| w.parse()).transpose()?.unwrap_or(2).max(1);

    // Every worker accepts on the same listening socket, on its own runtime.
    let listener = StdListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    eprintln!("hyper_floor: {listen} -> {upstream}, {workers} workers");
    let threads = (0..workers)
        .map(|_| {
            let listener = listener.try_clone()?;
            Ok(std::thread::spawn(move || worker(listener, upstream)))
        })
        .collect::<Result<Vec<_>, std::io::Error>>()?;
    for thread in threads {
        thread.join().map_err(|_| "a worker thread panicked")??;
    }
    Ok(())
}

fn worker(listener: StdListener, upstream: SocketAddr) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = TcpListener::from_std(listener)?;
        loop {
            let (client, _) = listener.accept().await?;
            tokio::task::spawn_local(async move {
                if let Err(e) = serve(client, upstream).await {
                    eprintln!("hyper_floor: connection ended: {e}");
                }
            });
        }
    })
}

/// Serves one client connection through its own upstream connection.
async fn serve(client: TcpStream, upstream: SocketAddr) -> Result<(), Error> {
    client.set_nodelay(true)?;
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(stream)).await?;
    tokio::task::spawn_local(connection);
    // HTTP/1.1 serves one request at a time, so the sender is never shared.
    let sender = Rc::new(std::cell::RefCell::new(sender));
    let service = service_fn(move |req: Request<Incoming>| forward(sender.clone(), req));
    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(client), service).await?;
    Ok(())
}

async fn forward(
    sender: Rc<std::cell::RefCell<SendRequest<Incoming>>>,
    req: Request<Incoming>,
) -> Result<Response<Incoming>, hyper::Error> {
    poll_fn(|cx| sender.borrow_mut().poll_ready(cx)).await?;
    let response = sender.borrow_mut().send_request(req);
    response.await
}
