//! One pass over a request's header fields, finding what routing's checks
//! and the token check read. Each check would otherwise look its field up by
//! name (a hash of the name and a probe each), and most requests carry none
//! of those fields but `Host` and the token.

use http::header::{HeaderMap, HeaderName, HeaderValue, HOST, UPGRADE};

use super::method::may_be_override;

/// The request's `Host` fields.
#[derive(Debug, Clone, Copy)]
pub(super) enum Hosts<'a> {
    None,
    One(&'a HeaderValue),
    /// More than one (refused).
    Repeated,
}

/// Which fields the checks after the host's may find. `false` is sure: no
/// such field; `true` sends the check to look.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Present {
    /// A name spelled with `_`.
    pub underscored: bool,
    /// An `Upgrade` field.
    pub upgrade: bool,
    /// A name as long as one of the method-override headers (in any
    /// spelling, `_` or `-`).
    pub overrides: bool,
    /// A `Destination` field.
    pub destination: bool,
}

/// The route's token fields: none, one, or more than one (refused).
#[derive(Debug, Clone, Copy)]
pub(super) enum Tokens<'a> {
    None,
    One(&'a HeaderValue),
    Repeated,
}

/// What one pass over the fields found.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fields<'a> {
    pub hosts: Hosts<'a>,
    pub present: Present,
    /// The fields named `token` (`None` when no name was given).
    pub tokens: Tokens<'a>,
}

/// [`DESTINATION`](super::DESTINATION)'s text: the name compared as a `&str`, without making
/// (and dropping) a `HeaderName` each time.
const DESTINATION_NAME: &str = "destination";

/// Every field of `headers`, once, in order; the fields named `token` too,
/// when it is given.
pub(super) fn scan<'a>(headers: &'a HeaderMap, token: Option<&HeaderName>) -> Fields<'a> {
    let mut hosts = Hosts::None;
    let mut present = Present::default();
    let mut tokens = Tokens::None;
    for (name, value) in headers {
        // A standard name never equals a custom one: one comparison of tags.
        // The field is looked at below as well (a token name may hold a `_`).
        if token.is_some_and(|token| token == name) {
            tokens = match tokens {
                Tokens::None => Tokens::One(value),
                _ => Tokens::Repeated,
            };
        }
        // Standard names compare as integers; neither holds a `_`.
        if *name == HOST {
            hosts = match hosts {
                Hosts::None => Hosts::One(value),
                _ => Hosts::Repeated,
            };
            continue;
        }
        if *name == UPGRADE {
            present.upgrade = true;
            continue;
        }
        let text = name.as_str();
        present.underscored |= has_underscore(text.as_bytes());
        present.overrides |= may_be_override(text.len());
        present.destination |= text == DESTINATION_NAME;
    }
    Fields { hosts, present, tokens }
}

/// Whether `name` holds a `_`, eight bytes at a step (names are short, and
/// a call to `memchr` costs more than the search).
fn has_underscore(name: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const UNDERSCORES: u64 = u64::from_ne_bytes([b'_'; 8]);
    // A byte of `x` is zero where the name has `_`; the classic test for a
    // zero byte, exact for "is there one".
    let any = |at: usize| {
        let x = u64::from_ne_bytes(name[at..at + 8].try_into().expect("eight bytes")) ^ UNDERSCORES;
        x.wrapping_sub(ONES) & !x & HIGHS != 0
    };
    let len = name.len();
    if len < 8 {
        return name.contains(&b'_');
    }
    let mut at = 0;
    while at + 8 < len {
        if any(at) {
            return true;
        }
        at += 8;
    }
    // The last eight bytes, some of them seen already.
    any(len - 8)
}

#[cfg(test)]
mod tests {
    use super::super::DESTINATION;
    use super::*;
    use http::HeaderName;

    #[test]
    fn underscores_are_found_wherever_they_are() {
        for len in 0..40 {
            let plain = vec![b'a'; len];
            assert!(!has_underscore(&plain), "{len}");
            for at in 0..len {
                let mut name = plain.clone();
                name[at] = b'_';
                assert!(has_underscore(&name), "{len} {at}");
            }
        }
        // Bytes one off `_`, and high bytes, are no `_`.
        assert!(!has_underscore(b"^`^`^`^`^`^`^`^`\x7f\xdf\xff"));
    }

    #[test]
    fn the_destination_name_is_the_header_s() {
        assert_eq!(DESTINATION.as_str(), DESTINATION_NAME);
    }

    #[test]
    fn the_fields_of_the_token_are_found_and_still_looked_at() {
        let token = HeaderName::from_static("x_token");
        let mut headers = HeaderMap::new();
        assert!(matches!(scan(&headers, Some(&token)).tokens, Tokens::None));
        headers.append(HOST, HeaderValue::from_static("a.example"));
        headers.append(token.clone(), HeaderValue::from_static("7"));
        let fields = scan(&headers, Some(&token));
        assert!(matches!(fields.tokens, Tokens::One(v) if v == "7"));
        // A token name with `_` is still an underscored name.
        assert!(fields.present.underscored);
        assert!(matches!(fields.hosts, Hosts::One(_)));
        assert!(matches!(scan(&headers, None).tokens, Tokens::None), "no name, no search");
        headers.append(token.clone(), HeaderValue::from_static("8"));
        assert!(matches!(scan(&headers, Some(&token)).tokens, Tokens::Repeated));
    }

    #[test]
    fn one_pass_finds_what_the_checks_read() {
        let mut headers = HeaderMap::new();
        let fields = scan(&headers, None);
        assert!(matches!(fields.hosts, Hosts::None));
        assert!(!fields.present.underscored && !fields.present.upgrade);
        assert!(!fields.present.overrides && !fields.present.destination);
        headers.append(HOST, HeaderValue::from_static("a.example"));
        headers.append(HeaderName::from_static("x-fencing-token"), HeaderValue::from_static("7"));
        headers.append(http::header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        let fields = scan(&headers, None);
        assert!(matches!(fields.hosts, Hosts::One(h) if h == "a.example"));
        assert!(!fields.present.underscored && !fields.present.upgrade);
        assert!(!fields.present.overrides && !fields.present.destination);
        headers.append(HOST, HeaderValue::from_static("b.example"));
        headers.append(UPGRADE, HeaderValue::from_static("websocket"));
        headers.append(HeaderName::from_static("x_tenant"), HeaderValue::from_static("a"));
        headers.append(HeaderName::from_static("x-http-method"), HeaderValue::from_static("PUT"));
        headers.append(DESTINATION, HeaderValue::from_static("/objects/b"));
        let fields = scan(&headers, None);
        assert!(matches!(fields.hosts, Hosts::Repeated));
        assert!(fields.present.underscored && fields.present.upgrade);
        assert!(fields.present.overrides && fields.present.destination);
    }
}
