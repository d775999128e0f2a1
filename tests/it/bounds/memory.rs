//! Bounds: memory. Fenced bodies are held whole before they are forwarded;
//! one h2c connection opening many fenced PUTs without a length and pushing
//! data into each without ending them must hold no more than its share
//! (`max_connection_buffered_bytes`), all connections together no more than
//! `max_buffered_bytes`, and the memory must go back to the system once the
//! attack ends. The attack runs against the release binary as a child, so
//! the process's resident memory (VmRSS) is what is measured.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use tokio::net::TcpStream;

use crate::common::process::{config_text, Running, MEMORY_STORE};
use crate::common::{get, put, RecordingUpstream};

const MIB: u64 = 1024 * 1024;
/// Generous: only matters when a test fails.
const DEADLINE: Duration = Duration::from_secs(30);
/// What the process may use beyond the bodies it holds while attacked: the
/// streams' and connections' own state, hyper's and h2's buffers (one
/// connection window of unread data each), the allocator's free lists, and
/// the load of the other tests running beside this one.
const OVERHEAD: u64 = 24 * MIB;
/// What may stay resident once the attack is over, beyond the baseline.
const LEFT_OVER: u64 = 8 * MIB;

const BUDGET: u64 = 48 * MIB;
const SHARE: u64 = 16 * MIB;
const BODY: u64 = MIB;
const STREAMS: usize = 40;
const ATTACKERS: usize = 2;

/// VmRSS of `pid`, in bytes.
fn rss(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("a running child has a status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

/// The value of an unlabelled metric of the child.
async fn metric(fencegate: &Running, name: &str) -> f64 {
    let text = get(&fencegate.admin_url("/metrics")).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// One h2c connection with `STREAMS` fenced PUTs open, each pushed `BODY`
/// bytes and never ended. The statuses of the ones answered (refused) land
/// in `answered`.
struct Attacker {
    _streams: Vec<h2::SendStream<Bytes>>,
    connection: tokio::task::JoinHandle<()>,
}

async fn attack(addr: SocketAddr, n: usize, answered: Arc<Mutex<Vec<u16>>>) -> Attacker {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut streams = Vec::new();
    for i in 0..STREAMS {
        let mut client = client.clone().ready().await.unwrap();
        let request =
            Request::put(format!("http://{addr}/objects/a{n}-{i}")).header("x-fencing-token", "1").body(()).unwrap();
        let (response, mut stream) = client.send_request(request, false).unwrap();
        let answered = answered.clone();
        tokio::spawn(async move {
            if let Ok(response) = response.await {
                answered.lock().unwrap().push(response.status().as_u16());
            }
        });
        // The body, in 16 KiB pieces; h2 sends them as the windows allow.
        for _ in 0..BODY / (16 * 1024) {
            let _ = stream.send_data(Bytes::from(vec![b'x'; 16 * 1024]), false);
        }
        streams.push(stream);
    }
    Attacker { _streams: streams, connection }
}

#[tokio::test]
async fn one_h2c_connection_holds_at_most_its_share_and_the_memory_goes_back() {
    let up = RecordingUpstream::start().await;
    let server = format!(
        "max_buffered_bytes = {BUDGET}\nmax_connection_buffered_bytes = {SHARE}\nmax_concurrent_streams = {STREAMS}\n"
    );
    let route = format!(
        "[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{}\"\nmax_body = {BODY}\ntimeout = \"60s\"\n",
        up.url()
    );
    let config = config_text("", MEMORY_STORE, &route).replacen("[server]\n", &format!("[server]\n{server}"), 1);
    let fencegate = Running::start(&config).await;
    let pid = fencegate.pid();
    // Warm: the normal client's path has run once, so its buffers are not
    // counted as the attack's.
    assert_eq!(put(&fencegate.url("/objects/warm"), 1, "warm").await.status, 200);
    let baseline = rss(&pid);

    let answered = Arc::new(Mutex::new(Vec::new()));
    let mut attackers = Vec::new();
    for n in 0..ATTACKERS {
        attackers.push(attack(fencegate.proxy, n, answered.clone()).await);
    }
    // A connection's share holds SHARE / BODY whole bodies: every other
    // stream is refused, and keeps being refused however long it pushes.
    let must_refuse = ATTACKERS * (STREAMS - (SHARE / BODY) as usize);
    let start = Instant::now();
    let mut peak = 0;
    let mut held_peak = 0f64;
    while answered.lock().unwrap().len() < must_refuse {
        assert!(start.elapsed() < DEADLINE, "only {:?} refused", answered.lock().unwrap());
        peak = peak.max(rss(&pid));
        held_peak = held_peak.max(metric(&fencegate, "fencegate_buffered_bytes").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Whatever is still arriving for the streams held arrives now.
    for _ in 0..50 {
        peak = peak.max(rss(&pid));
        held_peak = held_peak.max(metric(&fencegate, "fencegate_buffered_bytes").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let statuses = answered.lock().unwrap().clone();
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    assert!(held_peak <= (ATTACKERS as u64 * SHARE) as f64, "held {held_peak} bytes");
    assert!(held_peak > 0.0);

    // A normal client beside the attack: its fenced write is served.
    let reply = put(&fencegate.url("/objects/normal"), 1, "a normal write").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Nothing of the attack reached the upstream, and no mark moved.
    assert!(up.seen().iter().all(|(_, path, _)| !path.contains("/objects/a")), "{:?}", up.seen());
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "baseline {} KiB, peak {} KiB (+{} KiB), held at most {} KiB",
        baseline / 1024,
        peak / 1024,
        growth / 1024,
        held_peak as u64 / 1024
    );
    assert!(
        growth <= ATTACKERS as u64 * SHARE + OVERHEAD,
        "RSS grew {} KiB, past the shares ({} KiB) and the overhead",
        growth / 1024,
        ATTACKERS as u64 * SHARE / 1024
    );

    // The attack ends: its connections close, its bodies are dropped, and
    // the memory they took goes back to the system.
    for attacker in attackers {
        attacker.connection.abort();
    }
    let start = Instant::now();
    while metric(&fencegate, "fencegate_buffered_bytes").await != 0.0 {
        assert!(start.elapsed() < DEADLINE, "bodies still held after the attack");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    loop {
        let now = rss(&pid);
        if now <= baseline + LEFT_OVER {
            eprintln!("after the attack: {} KiB (+{} KiB)", now / 1024, now.saturating_sub(baseline) / 1024);
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "RSS stayed at {} KiB, {} KiB above the baseline, after the attack",
            now / 1024,
            (now - baseline) / 1024
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reply = put(&fencegate.url("/objects/normal"), 2, "after").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}
