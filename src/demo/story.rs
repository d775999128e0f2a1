//! The story the demo plays through the real proxy, over real sockets: two
//! lock holders write one object, the first one's late write is refused, and
//! the store is read back to show it never saw that write.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::store::Store;

/// The object both holders write.
pub(super) const OBJECT: &str = "/objects/report.txt";

/// One step: what happens in the story, then the write it makes.
struct Step {
    tells: &'static str,
    token: u64,
    body: &'static str,
    expect: StatusCode,
}

const STEPS: [Step; 3] = [
    Step { tells: "Holder 33 has the lock and writes.", token: 33, body: "v1 from holder 33", expect: StatusCode::OK },
    Step {
        tells: "Holder 33 pauses (a long GC pause); its lease expires. Holder 34 takes the lock and writes.",
        token: 34,
        body: "v2 from holder 34",
        expect: StatusCode::OK,
    },
    Step {
        tells: "Holder 33 wakes up and writes with its old token.",
        token: 33,
        body: "late write from holder 33",
        expect: StatusCode::CONFLICT,
    },
];

/// Plays the story against fencegate at `proxy`, in front of `store`, and
/// prints each step. `Err` says what did not go as told.
pub(super) async fn play(store: &Store, proxy: SocketAddr) -> Result<(), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut last_landed = None;
    for (n, step) in STEPS.iter().enumerate() {
        println!("{}. {}", n + 1, step.tells);
        println!("   client -> PUT {OBJECT}  X-Fencing-Token: {}  {:?}", step.token, step.body);
        let before = store.received();
        let (status, body) = put(&client, proxy, step.token, step.body).await?;
        println!("   client <- {}{}", status_line(status), problem_summary(&body));
        if store.received() == before {
            println!("   store  received nothing");
        }
        if status != step.expect {
            return Err(format!("step {} was answered {status}, not {}", n + 1, step.expect));
        }
        if status.is_success() {
            last_landed = Some(step.body);
        } else if store.received() != before {
            return Err(format!("step {}'s refused write reached the store", n + 1));
        }
    }
    let held = store.object(OBJECT);
    let held_text = held.as_deref().map(String::from_utf8_lossy);
    println!("4. The store, read directly, still holds holder 34's write:");
    println!("   {OBJECT} = {:?}", held_text.as_deref().unwrap_or("(nothing)"));
    if held_text.as_deref() != last_landed {
        return Err(format!("the store holds {held_text:?}, not the last accepted write {last_landed:?}"));
    }
    println!();
    println!("The late write never reached the store. Without fencegate in front, it would have");
    println!("overwritten holder 34's data.");
    Ok(())
}

/// `PUT`s `body` to the object through the proxy with `token`.
async fn put(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: SocketAddr,
    token: u64,
    body: &'static str,
) -> Result<(StatusCode, Bytes), String> {
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("http://{proxy}{OBJECT}"))
        .header("x-fencing-token", token)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| format!("cannot reach fencegate at {proxy}: {e}"))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| format!("fencegate's answer broke off: {e}"))?;
    Ok((status, body.to_bytes()))
}

/// `200 OK`, `409 Conflict`.
fn status_line(status: StatusCode) -> String {
    format!("{} {}", status.as_u16(), status.canonical_reason().unwrap_or(""))
}

/// `  stale-token: <detail>` for a problem+json body, nothing for another.
fn problem_summary(body: &[u8]) -> String {
    let Ok(problem) = serde_json::from_slice::<Value>(body) else { return String::new() };
    let kind = problem["type"].as_str().unwrap_or_default();
    let kind = kind.strip_prefix("urn:fencegate:problem:").unwrap_or(kind);
    match problem["detail"].as_str() {
        Some(detail) => format!("  {kind}: {detail}"),
        None => String::new(),
    }
}
