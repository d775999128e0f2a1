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

/// What one pass over a head's fields found for its rewrite: which
/// hop-by-hop fields it has, whether `Connection` names any field but
/// `keep-alive`, and how many `Host` fields it has.
#[derive(Debug, Clone, Copy)]
pub struct HopFields {
    /// Bit `i` set: the field at `i` in [`hop_by_hop`] is present.
    present: u16,
    /// Every `Connection` field is `keep-alive` (any case), or there is none.
    only_hops: bool,
    hosts: usize,
}

const UPGRADE_AT: usize = 8;

impl HopFields {
    /// One pass over the names present (a handful) instead of a lookup per
    /// hop-by-hop name. For a request's head, which seldom has `Connection`:
    /// its values are looked up only when it is there.
    pub fn find(headers: &HeaderMap) -> HopFields {
        let mut found = HopFields { present: 0, only_hops: true, hosts: 0 };
        // The names, each once: a plain walk over the entries, no values.
        for name in headers.keys() {
            if let Some(at) = hop_index(name) {
                found.present |= 1 << at;
            } else if *name == header::HOST {
                found.hosts = 1;
            }
        }
        // Only when some name has more than one value can `Host` have.
        if found.hosts == 1 && headers.len() != headers.keys_len() {
            found.hosts = headers.get_all(header::HOST).iter().count();
        }
        if found.present & 1 != 0 {
            found.only_hops = headers.get_all(header::CONNECTION).iter().all(is_keep_alive);
        }
        found
    }

    /// [`find`](Self::find) in one pass over every field with its value:
    /// for a response's head, which nearly always has `Connection:
    /// keep-alive`, so reading each value on the way costs less than a lookup.
    /// `close` is not one of them: a field named `Close` goes too.
    fn find_by_fields(headers: &HeaderMap) -> HopFields {
        let mut found = HopFields { present: 0, only_hops: true, hosts: 0 };
        for (name, value) in headers {
            if let Some(at) = hop_index(name) {
                found.present |= 1 << at;
                if at == 0 && !is_keep_alive(value) {
                    found.only_hops = false;
                }
            } else if *name == header::HOST {
                found.hosts += 1;
            }
        }
        found
    }

    /// Whether a `Connection` field names a field other than the hop-by-hop
    /// ones (`keep-alive` aside), which [`strip_found`] then removes too.
    pub fn connection_names_fields(&self) -> bool {
        !self.only_hops
    }

    /// How many `Host` fields there are.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// [`wants_upgrade`], without a lookup when there is no `Upgrade`.
    pub fn wants_upgrade(&self, headers: &HeaderMap) -> bool {
        self.present & (1 << UPGRADE_AT) != 0 && wants_upgrade(headers)
    }
}

/// Whether a `Connection` value is `keep-alive`, in any case (sent as is
/// nearly always: the exact bytes are compared before any case).
fn is_keep_alive(value: &HeaderValue) -> bool {
    let value = value.as_bytes();
    value == b"keep-alive" || value.eq_ignore_ascii_case(b"keep-alive")
}

/// Removes hop-by-hop headers, including every header `Connection` names, except
/// `keep` (the route's token header: the fence read it, so the upstream gets it
/// unchanged whatever `Connection` says). With `keep_upgrade`, `Upgrade` survives
/// and `Connection: upgrade` is set again, so a protocol switch can pass through.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool, keep: impl Fn(&HeaderName) -> bool) {
    let found = HopFields::find_by_fields(headers);
    strip_found(headers, found, keep_upgrade, keep);
}

/// [`strip_hop_by_hop`] with the fields `headers` has, as [`HopFields::find`]
/// found them (and nothing changed since).
pub fn strip_found(headers: &mut HeaderMap, found: HopFields, keep_upgrade: bool, keep: impl Fn(&HeaderName) -> bool) {
    let HopFields { present, only_hops, .. } = found;
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
    // Bytes, not text: a line with a byte that is not UTF-8 still has its
    // other names removed.
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|name| !name.is_empty() && !hops.iter().any(|hop| hop.as_str().as_bytes().eq_ignore_ascii_case(name)))
        .filter_map(|name| HeaderName::from_bytes(name).ok())
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
/// `X-Forwarded-Host` (the host the client asked for; a request that named no
/// host has the client's own `X-Forwarded-Host` removed, never passed on).
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
    match original_host {
        Some(host) => {
            headers.insert(&X_FORWARDED_HOST, host);
        }
        None => {
            headers.remove(&X_FORWARDED_HOST);
        }
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

    /// What the one pass finds: `Host` fields counted (several lines too),
    /// and whether `Connection` names a field.
    #[test]
    fn the_one_pass_counts_hosts_and_reads_connection() {
        let found = |pairs: &[(&str, &str)]| {
            let (by_names, by_fields) = (HopFields::find(&map(pairs)), HopFields::find_by_fields(&map(pairs)));
            assert_eq!(by_names.present, by_fields.present, "{pairs:?}");
            assert_eq!(by_names.only_hops, by_fields.only_hops, "{pairs:?}");
            assert_eq!(by_names.hosts, by_fields.hosts, "{pairs:?}");
            by_names
        };
        assert_eq!(found(&[]).hosts(), 0);
        assert_eq!(found(&[("host", "a"), ("accept", "x"), ("accept", "y")]).hosts(), 1);
        assert_eq!(found(&[("host", "a"), ("x-a", "1"), ("host", "b")]).hosts(), 2);
        for (value, names) in [("keep-alive", false), ("Keep-Alive", false), ("close", true), ("x-a", true)] {
            let f = found(&[("connection", value), ("connection", "keep-alive")]);
            assert_eq!(f.connection_names_fields(), names, "{value}");
        }
        assert!(!found(&[("host", "a")]).connection_names_fields());
        let upgrade = map(&[("connection", "upgrade"), ("upgrade", "websocket")]);
        assert!(HopFields::find(&upgrade).wants_upgrade(&upgrade));
        let no_upgrade = map(&[("connection", "upgrade")]);
        assert!(!HopFields::find(&no_upgrade).wants_upgrade(&no_upgrade));
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

    /// A `Connection` line with a byte that is not UTF-8 still has the names
    /// it lists removed, on requests and responses alike.
    #[test]
    fn connection_names_are_read_as_bytes() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_bytes(b"x-internal, \x80, Keep-Alive").unwrap());
        h.append("x-internal", HeaderValue::from_static("secret"));
        h.append("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false, |_| false);
        assert_eq!(names(&h), ["x-kept"]);
    }

    /// The fields removed and set here are the ones config refuses to read
    /// a key or token from.
    #[test]
    fn the_fields_rewritten_here_are_the_ones_config_guards() {
        let hops: Vec<&str> = hop_by_hop().iter().map(|n| n.as_str()).collect();
        assert_eq!(hops, crate::config::HOP_BY_HOP);
        for (at, name) in crate::config::HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_index(&HeaderName::from_static(name)), Some(at));
        }
        let forwarded = [&X_FORWARDED_FOR, &X_FORWARDED_PROTO, &X_FORWARDED_HOST].map(HeaderName::as_str);
        assert_eq!(forwarded, crate::config::FORWARDED);
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
        // No host asked for: the client's own X-Forwarded-Host is not passed on.
        let mut h = map(&[("x-forwarded-host", "evil.example"), ("x-forwarded-host", "b.example")]);
        add_forwarded(&mut h, &ClientAddr::new(client), None);
        assert!(!h.contains_key("x-forwarded-host"));

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
