//! A legacy HTTP object store with no fencing, as a program of its own: the
//! store of `fencegate demo` (`fencegate::demo::Store`), the kind of upstream
//! fencegate protects.
//!
//! PUT or POST stores the request body at the path, GET (or HEAD) returns it,
//! DELETE removes it. The store never looks at tokens: it accepts every write it
//! receives, and prints each request with the `X-Fencing-Token` header it
//! carried, so you see exactly which writes landed.
//!
//! ```text
//! cargo run --release --example legacy_store               # 127.0.0.1:9000
//! cargo run --release --example legacy_store 127.0.0.1:9100
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;

use fencegate::demo::{Store, STORE_LISTEN};
use tokio::net::TcpListener;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let text = std::env::args().nth(1);
    let text = text.as_deref().unwrap_or(STORE_LISTEN);
    let addr: SocketAddr = match text.parse() {
        Ok(addr) => addr,
        Err(_) => {
            eprintln!("'{text}' is not an IP:port address (e.g. {STORE_LISTEN})");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("legacy store listening on http://{addr} (no fencing: every write lands)");
    Store::default().serve(listener).await;
    ExitCode::SUCCESS
}
