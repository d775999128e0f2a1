//! The `[server]` section: limits, timeouts, the abuse penalty, the drain of
//! refused bodies, the buffer budget and each connection's share of it, and
//! `[server.tls]`'s files (named here, read when fencegate starts).

use std::path::PathBuf;

use crate::config::defaults::*;
use crate::config::file::{ServerSection, TlsSection};
use crate::config::model::{ProxyProtocol, RefusalDrain, ServerConfig, TlsFiles};
use crate::config::problems::Problems;
use crate::config::route::RouteConfig;

pub(super) fn server(s: &ServerSection, p: &mut Problems) -> ServerConfig {
    ServerConfig {
        listen: p.addr("server.listen", s.listen.as_deref(), DEFAULT_LISTEN),
        shutdown_grace: p.duration("server.shutdown_grace", s.shutdown_grace.as_deref(), DEFAULT_SHUTDOWN_GRACE),
        header_read_timeout: p.duration(
            "server.header_read_timeout",
            s.header_read_timeout.as_deref(),
            DEFAULT_HEADER_READ_TIMEOUT,
        ),
        max_header_bytes: match p.size("server.max_header_bytes", s.max_header_bytes.as_ref(), DEFAULT_MAX_HEADER_BYTES)
        {
            n if n < MIN_HEADER_BYTES => {
                p.add("server.max_header_bytes", format!("must be at least {MIN_HEADER_BYTES} bytes (8KiB)"));
                DEFAULT_MAX_HEADER_BYTES as usize
            }
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
        max_connections: match s.max_connections {
            None => DEFAULT_MAX_CONNECTIONS,
            Some(0) => {
                p.add("server.max_connections", "must be at least 1");
                DEFAULT_MAX_CONNECTIONS
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        },
        idle_timeout: p.duration("server.idle_timeout", s.idle_timeout.as_deref(), DEFAULT_IDLE_TIMEOUT),
        workers: match s.workers {
            None => default_workers(),
            Some(n @ 1..=MAX_WORKERS) => n as usize,
            Some(_) => {
                p.add("server.workers", format!("must be between 1 and {MAX_WORKERS}"));
                default_workers()
            }
        },
        max_buffered_bytes: p.size(
            "server.max_buffered_bytes",
            s.max_buffered_bytes.as_ref(),
            DEFAULT_MAX_BUFFERED_BYTES,
        ),
        // Set once the routes are known: see `connection_share`.
        max_connection_buffered_bytes: 0,
        max_connection_buffered_bytes_set: s.max_connection_buffered_bytes.is_some(),
        max_concurrent_streams: match s.max_concurrent_streams.unwrap_or(DEFAULT_MAX_CONCURRENT_STREAMS) {
            n @ 1..=MAX_CONCURRENT_STREAMS => n as u32,
            _ => {
                p.add("server.max_concurrent_streams", format!("must be between 1 and {MAX_CONCURRENT_STREAMS}"));
                DEFAULT_MAX_CONCURRENT_STREAMS as u32
            }
        },
        max_headers: match s.max_headers.unwrap_or(DEFAULT_MAX_HEADERS) {
            n @ MIN_HEADERS..=MAX_HEADERS => n as usize,
            _ => {
                p.add("server.max_headers", format!("must be between {MIN_HEADERS} and {MAX_HEADERS}"));
                DEFAULT_MAX_HEADERS as usize
            }
        },
        max_upstream_header_rate: p.size(
            "server.max_upstream_header_rate",
            s.max_upstream_header_rate.as_ref(),
            DEFAULT_MAX_UPSTREAM_HEADER_RATE,
        ),
        abuse_penalty: match p.duration_from(
            "server.abuse_penalty",
            s.abuse_penalty.as_deref(),
            DEFAULT_ABUSE_PENALTY,
            true,
        ) {
            d if d > MAX_ABUSE_PENALTY => {
                p.add(
                    "server.abuse_penalty",
                    format!("must be at most {}", humantime::format_duration(MAX_ABUSE_PENALTY)),
                );
                DEFAULT_ABUSE_PENALTY
            }
            d => d,
        },
        underscores_in_headers: s.underscores_in_headers.unwrap_or(false),
        refusal_drain: refusal_drain(s, p),
        proxy_protocol: proxy_protocol(s.proxy_protocol.as_deref(), p),
        trusted_proxies: trusted_proxies(s.trusted_proxies.as_deref().unwrap_or_default(), p),
        tls: s.tls.as_ref().and_then(|t| tls(t, p)),
    }
}

fn proxy_protocol(value: Option<&str>, p: &mut Problems) -> ProxyProtocol {
    match value {
        None | Some("off") => ProxyProtocol::Off,
        Some("v1") => ProxyProtocol::V1,
        Some("v2") => ProxyProtocol::V2,
        Some("any") => ProxyProtocol::Any,
        Some(other) => {
            p.add("server.proxy_protocol", format!("'{other}' is not \"off\", \"v1\", \"v2\" or \"any\""));
            ProxyProtocol::Off
        }
    }
}

/// `[server] trusted_proxies`: CIDRs, or single addresses (a /32 or /128),
/// each once. Host bits are dropped: `10.1.2.3/8` is `10.0.0.0/8`.
fn trusted_proxies(list: &[String], p: &mut Problems) -> Vec<ipnet::IpNet> {
    let mut nets: Vec<ipnet::IpNet> = Vec::with_capacity(list.len());
    for text in list {
        let net = match text.trim().parse::<ipnet::IpNet>() {
            Ok(net) => net.trunc(),
            Err(_) => match text.trim().parse::<std::net::IpAddr>() {
                Ok(ip) => ipnet::IpNet::from(ip),
                Err(_) => {
                    p.add(
                        "server.trusted_proxies",
                        format!("'{text}' is not a CIDR like \"10.0.0.0/8\" or an address like \"10.0.0.5\""),
                    );
                    continue;
                }
            },
        };
        if nets.contains(&net) {
            p.add("server.trusted_proxies", format!("'{text}' is listed twice"));
        } else {
            nets.push(net);
        }
    }
    nets
}

/// `[server] refusal_drain_*`: every bound above zero, and the silence
/// within the whole time (a longer one could never be reached).
fn refusal_drain(s: &ServerSection, p: &mut Problems) -> RefusalDrain {
    let bytes = p.size("server.refusal_drain_bytes", s.refusal_drain_bytes.as_ref(), DEFAULT_REFUSAL_DRAIN_BYTES);
    let time = p.duration("server.refusal_drain_time", s.refusal_drain_time.as_deref(), DEFAULT_REFUSAL_DRAIN_TIME);
    let silence =
        p.duration("server.refusal_drain_silence", s.refusal_drain_silence.as_deref(), DEFAULT_REFUSAL_DRAIN_SILENCE);
    if silence > time {
        p.add(
            "server.refusal_drain_silence",
            format!(
                "{} is longer than server.refusal_drain_time ({}), the whole drain",
                humantime::format_duration(silence),
                humantime::format_duration(time)
            ),
        );
    }
    RefusalDrain { bytes, time, silence: silence.min(time) }
}

/// `[server.tls]`: both files named, none empty. They are read when fencegate
/// starts (and by `--check`), not here.
fn tls(t: &TlsSection, p: &mut Problems) -> Option<TlsFiles> {
    let mut path = |field: &str, value: &Option<String>, required: bool| match value.as_deref() {
        Some("") => {
            p.add(format!("server.tls.{field}"), "must not be empty");
            None
        }
        Some(path) => Some(PathBuf::from(path)),
        None => {
            if required {
                p.add(format!("server.tls.{field}"), "is required when [server.tls] is set (a PEM file)");
            }
            None
        }
    };
    let cert = path("cert", &t.cert, true);
    let key = path("key", &t.key, true);
    let client_ca = path("client_ca", &t.client_ca, false);
    Some(TlsFiles { cert: cert?, key: key?, client_ca })
}

/// `[server] max_connection_buffered_bytes`: at least the largest body a
/// route reads whole (else that body could never be held), at most the
/// whole budget. Unset, a quarter of `max_buffered_bytes`, raised to that
/// largest body, so every config valid without the field stays valid.
pub(super) fn connection_share(
    s: &ServerSection,
    server: &ServerConfig,
    routes: &[RouteConfig],
    p: &mut Problems,
) -> u64 {
    let largest = routes.iter().filter(|r| !r.stream_body).map(|r| r.max_body).max().unwrap_or(0);
    let budget = server.max_buffered_bytes;
    let Some(size) = &s.max_connection_buffered_bytes else {
        return (budget / DEFAULT_CONNECTION_BUFFER_SHARE).max(largest).min(budget);
    };
    let field = "server.max_connection_buffered_bytes";
    match p.size(field, Some(size), budget) {
        n if n > budget => {
            p.add(field, format!("{n} bytes is more than server.max_buffered_bytes ({budget}), the whole budget"));
            budget
        }
        n if n < largest => {
            p.add(
                field,
                format!(
                    "{n} bytes is less than the largest max_body of a route that reads bodies whole ({largest}): \
                     such a body could never be held"
                ),
            );
            largest
        }
        n => n,
    }
}

/// `[server] max_upstream_header_rate`: at least one largest head a second.
pub(super) fn header_rate(server: &ServerConfig, p: &mut Problems) {
    if server.max_upstream_header_rate < server.max_header_bytes as u64 {
        p.add(
            "server.max_upstream_header_rate",
            format!(
                "{} bytes a second is less than server.max_header_bytes ({}): a head that large could never be sent",
                server.max_upstream_header_rate, server.max_header_bytes
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::tests::{fields, problems, MINIMAL};
    use crate::config::Config;

    #[test]
    fn sizes_are_integers_or_strings_and_bad_ones_name_their_field() {
        let text =
            format!("[server]\nmax_header_bytes = 16384\nmax_buffered_bytes = \"1GB\"\n{MINIMAL}max_body = 1048576\n");
        let c = Config::from_toml_str(&text).unwrap();
        assert_eq!(c.server.max_header_bytes, 16_384);
        assert_eq!(c.server.max_buffered_bytes, 1_000_000_000);
        assert_eq!(c.routes[0].max_body, 1 << 20);

        let text = format!(
            "[server]\nmax_header_bytes = \"1KiB\"\nidle_timeout = \"x\"\nmax_connections = 0\nworkers = 0\n{MINIMAL}max_body = \"lots\"\n"
        );
        assert_eq!(
            fields(&text),
            [
                "server.max_header_bytes",
                "server.max_connections",
                "server.idle_timeout",
                "server.workers",
                "route[0] 'objects'.max_body"
            ]
        );
        let p = problems(&format!("[server]\nmax_buffered_bytes = -1\n{MINIMAL}max_body = 0\n"));
        let f: Vec<_> = p.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(f, ["server.max_buffered_bytes", "route[0] 'objects'.max_body"]);
        assert!(p[0].message.contains("-1 is negative"), "{}", p[0].message);
        assert_eq!(p[1].message, "must be greater than zero");
        assert_eq!(fields("[server]\nmax_header_bytes = 8191\n"), ["server.max_header_bytes", "route"]);
    }

    #[test]
    fn the_connection_share_defaults_within_the_budget_and_is_checked_against_routes() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.server.max_connection_buffered_bytes, 64 << 20, "a quarter of 256MiB");
        assert_eq!((c.server.max_concurrent_streams, c.server.max_headers), (100, 100));
        assert_eq!(c.server.max_upstream_header_rate, 32 << 20);
        // Unset, never below the largest body read whole: old configs stay valid.
        let text = format!("[server]\nmax_buffered_bytes = \"1MiB\"\n{MINIMAL}max_body = \"1MiB\"\n");
        assert_eq!(Config::from_toml_str(&text).unwrap().server.max_connection_buffered_bytes, 1 << 20);
        let set = |v: &str| {
            format!("[server]\nmax_buffered_bytes = \"1MiB\"\nmax_connection_buffered_bytes = {v}\n{MINIMAL}max_body = \"64KiB\"\n")
        };
        assert_eq!(Config::from_toml_str(&set("\"128KiB\"")).unwrap().server.max_connection_buffered_bytes, 128 << 10);
        assert_eq!(fields(&set("\"2MiB\"")), ["server.max_connection_buffered_bytes"]);
        assert_eq!(fields(&set("\"32KiB\"")), ["server.max_connection_buffered_bytes"]);
        let text = format!(
            "[server]\nmax_concurrent_streams = 0\nmax_headers = 2\nmax_upstream_header_rate = \"x\"\n{MINIMAL}"
        );
        assert_eq!(
            fields(&text),
            ["server.max_concurrent_streams", "server.max_headers", "server.max_upstream_header_rate"]
        );
    }

    #[test]
    fn server_tls_names_both_files_and_a_missing_or_empty_one_names_its_field() {
        assert_eq!(Config::from_toml_str(MINIMAL).unwrap().server.tls, None);
        let set = |tls: &str| format!("[server.tls]\n{tls}\n{MINIMAL}");
        let c = Config::from_toml_str(&set("cert = 'c.pem'\nkey = 'k.pem'\nclient_ca = 'ca.pem'")).unwrap();
        assert_eq!(
            c.server.tls,
            Some(crate::config::TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into())
            })
        );
        assert_eq!(fields(&set("cert = 'c.pem'")), ["server.tls.key"]);
        assert_eq!(fields(&set("key = 'k.pem'\nclient_ca = ''")), ["server.tls.cert", "server.tls.client_ca"]);
        let typo = problems(&set("cert = 'c.pem'\nkey = 'k.pem'\nca = 'x'"))[0].message.clone();
        assert!(typo.contains("unknown field `ca`"), "{typo}");
    }

    #[test]
    fn the_abuse_penalty_has_a_default_may_be_off_and_a_bad_one_names_its_field() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.server.abuse_penalty, crate::config::defaults::DEFAULT_ABUSE_PENALTY);
        let set = |v: &str| format!("[server]\nabuse_penalty = {v}\n{MINIMAL}");
        assert_eq!(Config::from_toml_str(&set("\"0s\"")).unwrap().server.abuse_penalty, Duration::ZERO);
        assert_eq!(Config::from_toml_str(&set("\"30s\"")).unwrap().server.abuse_penalty, Duration::from_secs(30));
        assert_eq!(fields(&set("\"soon\"")), ["server.abuse_penalty"]);
        assert_eq!(fields(&set("\"61s\"")), ["server.abuse_penalty"]);
    }

    #[test]
    fn the_refusal_drain_has_bounds_by_default_and_a_bad_one_names_its_field() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        let drain = c.server.refusal_drain;
        assert_eq!(
            (drain.bytes, drain.time, drain.silence),
            (64 << 20, Duration::from_secs(30), Duration::from_secs(5))
        );
        let set = |lines: &str| format!("[server]\n{lines}\n{MINIMAL}");
        let c = Config::from_toml_str(&set(
            "refusal_drain_bytes = \"1MiB\"\nrefusal_drain_time = \"2s\"\nrefusal_drain_silence = \"500ms\"",
        ))
        .unwrap();
        let drain = c.server.refusal_drain;
        assert_eq!(
            (drain.bytes, drain.time, drain.silence),
            (1 << 20, Duration::from_secs(2), Duration::from_millis(500))
        );
        assert_eq!(
            fields(&set("refusal_drain_bytes = 0\nrefusal_drain_time = \"0s\"\nrefusal_drain_silence = \"x\"")),
            ["server.refusal_drain_bytes", "server.refusal_drain_time", "server.refusal_drain_silence"]
        );
        // A silence longer than the whole drain could never be reached.
        assert_eq!(
            fields(&set("refusal_drain_time = \"1s\"\nrefusal_drain_silence = \"2s\"")),
            ["server.refusal_drain_silence"]
        );
    }
}
