//! `fencegate demo`: the fence on its own, with nothing but the binary.
//!
//! It starts a small in-process store with no fencing of its own (store.rs),
//! puts fencegate in front of it with an embedded config (fences in memory,
//! one route `/objects/` to the store), and plays the story of the README
//! through the real proxy (story.rs): holder 33 writes, holder 34 writes,
//! holder 33's late write is refused, and the store is unchanged by it. Then
//! it keeps serving for the reader's own `curl` commands until Ctrl-C,
//! printing every request that reaches the store.
//!
//! The demo sits on the top floor: it uses the server as the binary does.

mod store;
mod story;

use std::net::SocketAddr;
use std::process::ExitCode;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::config::LogFormat;
use crate::{telemetry, Config, Fencegate};
pub use store::Store;
use story::OBJECT;

/// fencegate's proxy listener unless `--listen` names another.
pub const LISTEN: &str = "127.0.0.1:8080";
/// fencegate's admin listener unless `--admin-listen` names another.
pub const ADMIN_LISTEN: &str = "127.0.0.1:9901";
/// The store's listener unless `--store-listen` names another.
pub const STORE_LISTEN: &str = "127.0.0.1:9000";
/// The admin bearer token of the demo's fencegate, for the fence API.
pub const ADMIN_TOKEN: &str = "demo-secret";

/// Where the demo listens; port 0 takes a free port (the demo prints it).
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// fencegate's proxy listener ([`LISTEN`] by default).
    pub listen: SocketAddr,
    /// fencegate's admin listener ([`ADMIN_LISTEN`] by default); its bearer
    /// token, [`ADMIN_TOKEN`], is no secret: keep it on loopback.
    pub admin_listen: SocketAddr,
    /// The demo store's listener ([`STORE_LISTEN`] by default).
    pub store_listen: SocketAddr,
}

/// Runs the demo until SIGINT or SIGTERM: 0 then, 1 if it could not start
/// or the story did not go as told.
pub fn run(options: DemoOptions) -> ExitCode {
    // Its bearer token is printed for all to read: the admin listener, which
    // raises and deletes fences with it, stays on this host.
    if !options.admin_listen.ip().is_loopback() {
        eprintln!(
            "demo: --admin-listen {}: the demo's admin token ({ADMIN_TOKEN}) is no secret, so its admin listener \
             must be a loopback address (127.0.0.1 or ::1)",
            options.admin_listen
        );
        return ExitCode::from(2);
    }
    // Errors only: access lines would drown the story (RUST_LOG overrides).
    let _log = telemetry::init(LogFormat::Human, "error", &Default::default());
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The embedded config: fences in memory, one route to the store at `store`.
fn config_text(listen: SocketAddr, admin_listen: SocketAddr, store: SocketAddr) -> String {
    format!(
        r#"[server]
listen = "{listen}"
shutdown_grace = "1s"
workers = 1

[admin]
listen = "{admin_listen}"
auth_token = "{ADMIN_TOKEN}"

[fences]
store = "memory"

[[route]]
name = "objects"
prefix = "/objects/"
upstream = "http://{store}"
"#
    )
}

async fn serve(options: DemoOptions) -> Result<(), String> {
    let listener = TcpListener::bind(options.store_listen).await.map_err(|e| {
        format!("the store cannot listen on {}: {e} (choose another address with --store-listen)", options.store_listen)
    })?;
    let store_addr = listener.local_addr().map_err(|e| e.to_string())?;
    let store = Store::default();
    tokio::spawn(store.clone().serve(listener));

    let text = config_text(options.listen, options.admin_listen, store_addr);
    let config = Config::from_toml_str(&text)
        .and_then(|validated| validated.read_secrets_with(None))
        .map_err(|e| format!("the embedded config does not validate: {e}"))?;
    let server = Fencegate::bind(config)
        .await
        .map_err(|e| format!("{e} (choose other addresses with --listen and --admin-listen)"))?;
    let (proxy, admin) = (server.proxy_addr(), server.admin_addr());
    let signal = crate::shutdown_signal().map_err(|e| format!("cannot install signal handlers: {e}"))?;

    println!("fencegate demo: the fence on its own, in front of a store that has none.");
    println!();
    println!("  store      http://{store_addr}  keeps objects in memory, accepts every write, prints what reaches it");
    println!("  fencegate  http://{proxy}  sends /objects/ to the store, refuses stale fencing tokens");
    println!("  admin      http://{admin}  /healthz, /metrics, the fence API (bearer token {ADMIN_TOKEN})");
    println!("  Fences are kept in memory for the demo: they are gone when it stops.");
    println!();

    // A story that goes wrong stops the server, so the demo exits non-zero.
    let (failed, failure) = oneshot::channel::<String>();
    let story = async move {
        match story::play(&store, proxy).await {
            Ok(()) => try_it(proxy, admin),
            Err(e) => {
                let _ = failed.send(e);
            }
        }
    };
    let mut told = None;
    let shutdown = async {
        tokio::select! {
            () = signal => {}
            Ok(why) = failure => told = Some(why),
        }
    };
    tokio::join!(server.run(shutdown), story);
    match told {
        Some(why) => Err(format!("the story did not go as told: {why}")),
        None => Ok(()),
    }
}

/// The commands a reader can paste next.
fn try_it(proxy: SocketAddr, admin: SocketAddr) {
    let object = format!("http://{proxy}{OBJECT}");
    let key = OBJECT.replace('/', "%2F");
    println!();
    println!("fencegate keeps serving until Ctrl-C. Try it (the store prints what reaches it):");
    println!();
    println!("  curl -i {object}");
    println!("  curl -i -X PUT -H 'X-Fencing-Token: 35' --data 'v3 from holder 35' {object}");
    println!("  curl -i -X PUT -H 'X-Fencing-Token: 34' --data 'late write from holder 34' {object}");
    println!("  curl -i -X PUT --data 'a write without a token' {object}");
    println!("  curl -s 'http://{admin}/fences?key={key}'");
    println!();
}
