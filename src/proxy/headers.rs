//! Header rewriting between client and upstream: hop-by-hop removal and
//! `X-Forwarded-*`.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::ClientAddr;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Headers that describe one connection, never the message (RFC 9110 §7.6.1).
fn hop_by_hop() -> [&'static HeaderName; 9] {
    [
        &header::CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &header::PROXY_AUTHENTICATE,
        &header::PROXY_AUTHORIZATION,
        &header::TE,
        &header::TRAILER,
        &header::TRANSFER_ENCODING,
        &header::UPGRADE,
    ]
}

/// Where `name` is in [`hop_by_hop`], if it is one: a match on the name's
/// text (its length first), not nine comparisons a field.
fn hop_index(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        _ => return None,
    })
}

/// Removes hop-by-hop headers, including every header `Connection` names, except
/// `keep` (the route's token header: the fence read it, so the upstream gets it
/// unchanged whatever `Connection` says). With `keep_upgrade`, `Upgrade` survives
/// and `Connection: upgrade` is set again, so a protocol switch can pass through.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool, keep: impl Fn(&HeaderName) -> bool) {
    // One pass over the fields present (a handful) instead of a lookup per
    // hop-by-hop name; most requests carry none, most responses only
    // `Connection: keep-alive`. The same pass tells whether `Connection`
    // names anything but `keep-alive` (every kept-alive upstream answer has
    // that one). `close` is not one of them: a field named `Close` goes too.
    let mut present = 0u16;
    let mut only_hops = true;
    for (name, value) in headers.iter() {
        if let Some(at) = hop_index(name) {
            present |= 1 << at;
            if at == 0 && !value.as_bytes().eq_ignore_ascii_case(b"keep-alive") {
                only_hops = false;
            }
        }
    }
    if present == 0 && !keep_upgrade {
        return;
    }
    let hops = hop_by_hop();
    let named: Vec<HeaderName> = if only_hops { Vec::new() } else { connection_named(headers, &hops) };
    for name in named {
        if !keep(&name) {
            headers.remove(&name);
        }
    }
    for (at, name) in hops.into_iter().enumerate() {
        if present & (1 << at) != 0 && !(keep_upgrade && *name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The names a `Connection` header lists, other than the hop-by-hop ones.
fn connection_named(headers: &HeaderMap, hops: &[&'static HeaderName]) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty() && !hops.iter().any(|hop| hop.as_str().eq_ignore_ascii_case(name)))
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect()
}

/// Whether a request asks to switch protocols (e.g. a websocket handshake).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Appends the client to `X-Forwarded-For` and sets `X-Forwarded-Proto` and
/// `X-Forwarded-Host` (the host the client asked for).
pub fn add_forwarded(headers: &mut HeaderMap, client: &ClientAddr, original_host: Option<HeaderValue>) {
    // One lookup for the read and the write.
    match headers.entry(&X_FORWARDED_FOR) {
        // The common case: the first hop. The IP was formatted once per connection.
        header::Entry::Vacant(first) => {
            first.insert(client.ip.clone());
        }
        header::Entry::Occupied(mut prior) => {
            // Several header lines are one comma-joined list (RFC 9110 §5.3): keep every hop.
            let mut xff = String::new();
            for prior in prior.iter().filter_map(|v| v.to_str().ok()) {
                let prior = prior.trim();
                if !prior.is_empty() {
                    xff.push_str(prior);
                    xff.push_str(", ");
                }
            }
            xff.push_str(client.ip.to_str().unwrap_or_default());
            if let Ok(value) = HeaderValue::try_from(xff) {
                prior.insert(value);
            }
        }
    }
    headers.insert(&X_FORWARDED_PROTO, client.proto.clone());
    if let Some(host) = original_host {
        headers.insert(&X_FORWARDED_HOST, host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// The names `h` has left, sorted.
    fn names(h: &HeaderMap) -> Vec<String> {
        let mut names: Vec<_> = h.keys().map(|k| k.as_str().to_string()).collect();
        names.sort();
        names
    }

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, x-session"),
            ("keep-alive", "timeout=5"),
            ("x-session", "abc"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("x-fencing-token", "7"),
            ("content-type", "text/plain"),
        ]);
        strip_hop_by_hop(&mut h, false, |_| false);
        assert_eq!(names(&h), ["content-type", "x-fencing-token"]);
    }

    /// The common `Connection` values: `keep-alive` names nothing else,
    /// whatever its case; `close` names a field `Close`, which goes too.
    #[test]
    fn keep_alive_or_close_alone_remove_the_hop_by_hop_headers_and_what_they_name() {
        for value in ["keep-alive", "Keep-Alive", "close", "CLOSE"] {
            let mut h = map(&[
                ("connection", value),
                ("keep-alive", "timeout=5"),
                ("close", "named"),
                ("content-type", "text/plain"),
            ]);
            strip_hop_by_hop(&mut h, false, |_| false);
            let expected: &[&str] =
                if value.eq_ignore_ascii_case("close") { &["content-type"] } else { &["close", "content-type"] };
            assert_eq!(names(&h), expected, "Connection: {value}");
        }
        // Two lines, one of them naming a header: that one goes too.
        let mut h = map(&[("connection", "close"), ("connection", "x-session"), ("x-session", "1"), ("te", "x")]);
        strip_hop_by_hop(&mut h, false, |_| false);
        assert!(h.is_empty(), "{h:?}");
    }

    /// Every `Connection` line counts: one that names a field after a lone
    /// `keep-alive` line still removes it, whichever line comes first.
    #[test]
    fn a_connection_line_after_keep_alive_still_names_fields() {
        for lines in [["keep-alive", "x-session"], ["x-session", "keep-alive"]] {
            let mut h = map(&[
                ("connection", lines[0]),
                ("connection", lines[1]),
                ("x-session", "abc"),
                ("content-type", "text/plain"),
            ]);
            strip_hop_by_hop(&mut h, false, |_| false);
            assert_eq!(names(&h), ["content-type"], "{lines:?}");
        }
    }

    #[test]
    fn the_token_header_survives_being_named_in_connection() {
        let token = HeaderName::from_static("x-fencing-token");
        let mut h = map(&[("connection", "x-fencing-token, x-other"), ("x-fencing-token", "7"), ("x-other", "1")]);
        strip_hop_by_hop(&mut h, false, |name| *name == token);
        assert_eq!(h["x-fencing-token"], "7");
        assert!(!h.contains_key("x-other"));
    }

    /// The match names exactly the hop-by-hop fields, in their order.
    #[test]
    fn every_hop_by_hop_name_is_found_where_it_is() {
        for (at, name) in hop_by_hop().into_iter().enumerate() {
            assert_eq!(hop_index(name), Some(at), "{name}");
        }
        for other in ["content-type", "connections", "te2", "x-upgrade", "host"] {
            assert_eq!(hop_index(&HeaderName::from_static(other)), None, "{other}");
        }
    }

    #[test]
    fn keeps_upgrade_when_asked() {
        let mut h = map(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(wants_upgrade(&h));
        strip_hop_by_hop(&mut h, true, |_| false);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert!(!wants_upgrade(&map(&[("upgrade", "websocket")])));
    }

    #[test]
    fn forwarded_headers_append_to_a_chain() {
        let client: SocketAddr = "10.1.2.3:5555".parse().unwrap();
        let mut h = map(&[("x-forwarded-for", "192.0.2.1"), ("x-forwarded-for", "192.0.2.9")]);
        add_forwarded(&mut h, &ClientAddr::new(client), Some(HeaderValue::from_static("store.example")));
        assert_eq!(h["x-forwarded-for"], "192.0.2.1, 192.0.2.9, 10.1.2.3");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "store.example");
        add_forwarded(&mut h, &ClientAddr::new(client).over_tls(), None);
        assert_eq!(h["x-forwarded-proto"], "https", "a client over TLS");

        // Prior values that are not text are no hops anyone can read: the
        // client alone.
        let mut h = HeaderMap::new();
        h.append(&X_FORWARDED_FOR, HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        add_forwarded(&mut h, &ClientAddr::new(client), None);
        assert_eq!(h.get_all(&X_FORWARDED_FOR).iter().collect::<Vec<_>>(), ["10.1.2.3"]);

        // The first hop: just the client.
        let v6: SocketAddr = "[2001:db8::7]:443".parse().unwrap();
        let mut h = map(&[]);
        add_forwarded(&mut h, &ClientAddr::new(v6), None);
        assert_eq!(h["x-forwarded-for"], "2001:db8::7");
        assert!(!h.contains_key("x-forwarded-host"));
    }
}
