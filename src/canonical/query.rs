//! One query parameter, form-decoded, as a fence key reads it.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::NonUtf8;

/// Why a query parameter cannot be read (the request gets a 400 `bad-key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the query parameter appears more than once (after decoding its name)")]
    Repeated,
    #[error(
        "a query parameter's name has percent escapes that are not UTF-8 text (such as %FF), which frameworks decode \
         in different ways"
    )]
    NameNotUtf8,
    #[error(
        "the query parameter's value has percent escapes that are not UTF-8 text (such as %FF), which frameworks \
         decode in different ways; send its text as UTF-8, percent-encoded"
    )]
    ValueNotUtf8,
    #[error("the query parameter's value contains a control character (a byte below 0x20 or 0x7F, raw or escaped)")]
    ControlByte,
}

/// The value of the query parameter `name`, decoded the way web frameworks
/// decode it (`application/x-www-form-urlencoded`: pairs separated by `&`,
/// name and value split at the first `=`, `+` is a space, `%XX` is a byte, a
/// `%` not followed by two hex digits is itself), so the key sees what the
/// upstream's handler sees. Same as [`query_param_with`] and
/// [`NonUtf8::Reject`].
///
/// `query` is the query string without its `?`. Names are decoded before they
/// are compared with `name` (which is taken as already decoded): `i%64=7`
/// is a parameter `id`. `Ok(None)` when no parameter has that name; a name
/// without `=` has the value `""`. Refused:
/// - [`QueryError::Repeated`] when the decoded name occurs more than once,
///   whatever the values, because frameworks differ on which one they use;
/// - [`QueryError::NameNotUtf8`] when any parameter's name does not decode to
///   UTF-8: frameworks make it U+FFFD, and such a name could be the one read;
/// - [`QueryError::ValueNotUtf8`] when the value does not decode to UTF-8
///   (`%FF` and `%FE` are both U+FFFD to Werkzeug, and would be two keys);
/// - [`QueryError::ControlByte`] when the value holds a control byte (below
///   0x20, or 0x7F), which a path may not hold either.
///
/// ```
/// use fencegate::canonical::{query_param, QueryError};
///
/// assert_eq!(query_param("id=%37&x=1", "id").unwrap().as_deref(), Some("7"));
/// assert_eq!(query_param("id=a+b", "id").unwrap().as_deref(), Some("a b"));
/// assert_eq!(query_param("i%64=7&id=fresh", "id"), Err(QueryError::Repeated));
/// assert_eq!(query_param("idx=1", "id"), Ok(None));
/// assert_eq!(query_param("id=%FF", "id"), Err(QueryError::ValueNotUtf8));
/// assert_eq!(query_param("id=a%00", "id"), Err(QueryError::ControlByte));
/// ```
pub fn query_param<'q>(query: &'q str, name: &str) -> Result<Option<Cow<'q, str>>, QueryError> {
    query_param_with(query, name, NonUtf8::Reject)
}

/// [`query_param`], with the route's choice for bytes that are not UTF-8.
///
/// With [`NonUtf8::Raw`] the value is keyed byte for byte: text stays as it
/// is, and each `%` and each byte that is not part of UTF-8 text becomes
/// `%XX` (hex upper-case), so two different byte strings never give one key.
/// Names are compared byte for byte; a name that is not UTF-8 but would read
/// as `name` once decoded with U+FFFD is refused ([`QueryError::NameNotUtf8`]),
/// since a framework would read it as the parameter. Control bytes are
/// refused in both modes.
///
/// ```
/// use fencegate::canonical::{query_param_with, NonUtf8, QueryError};
///
/// assert_eq!(query_param_with("id=%FF%25", "id", NonUtf8::Raw).unwrap().as_deref(), Some("%FF%25"));
/// assert_eq!(query_param_with("id=%C3%A9", "id", NonUtf8::Raw).unwrap().as_deref(), Some("é"));
/// assert_eq!(query_param_with("id=%FF", "id", NonUtf8::Reject), Err(QueryError::ValueNotUtf8));
/// ```
pub fn query_param_with<'q>(query: &'q str, name: &str, non_utf8: NonUtf8) -> Result<Option<Cow<'q, str>>, QueryError> {
    let mut found = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (n, value) = pair.split_once('=').unwrap_or((pair, ""));
        let n = form_decode(n);
        let is_name = match std::str::from_utf8(&n) {
            Ok(text) => text == name,
            Err(_) if non_utf8 == NonUtf8::Raw && String::from_utf8_lossy(&n) != name => false,
            Err(_) => return Err(QueryError::NameNotUtf8),
        };
        if is_name && found.replace(value).is_some() {
            return Err(QueryError::Repeated);
        }
    }
    let Some(value) = found else { return Ok(None) };
    let decoded = form_decode(value);
    if decoded.iter().any(|&b| b < 0x20 || b == 0x7F) {
        return Err(QueryError::ControlByte);
    }
    match (decoded, non_utf8) {
        // Nothing to decode: the value is a slice of the query, text already.
        // In raw mode a `%` in it would still need its escape, but a value
        // with a `%` in it is never borrowed.
        (Cow::Borrowed(_), _) => Ok(Some(Cow::Borrowed(value))),
        (Cow::Owned(bytes), NonUtf8::Reject) => match String::from_utf8(bytes) {
            Ok(text) => Ok(Some(Cow::Owned(text))),
            Err(_) => Err(QueryError::ValueNotUtf8),
        },
        (Cow::Owned(bytes), NonUtf8::Raw) => Ok(Some(Cow::Owned(raw_text(&bytes)))),
    }
}

/// Checks that every name and value in `query` decodes to UTF-8 text, for
/// callers that decode a whole query with a lossy decoder (the fence API):
/// a `key=%FF` must be refused, not read as the key of U+FFFD.
///
/// ```
/// use fencegate::canonical::{check_query_utf8, QueryError};
///
/// assert_eq!(check_query_utf8("key=/a/%C3%A9&limit=2"), Ok(()));
/// assert_eq!(check_query_utf8("key=/a/%FF"), Err(QueryError::ValueNotUtf8));
/// assert_eq!(check_query_utf8("k%FFy=1"), Err(QueryError::NameNotUtf8));
/// ```
pub fn check_query_utf8(query: &str) -> Result<(), QueryError> {
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if std::str::from_utf8(&form_decode(name)).is_err() {
            return Err(QueryError::NameNotUtf8);
        }
        if std::str::from_utf8(&form_decode(value)).is_err() {
            return Err(QueryError::ValueNotUtf8);
        }
    }
    Ok(())
}

/// Form decoding of one name or value into bytes: `+` is a space, `%XX` a
/// byte, anything else itself (as `form_urlencoded` and Python's `unquote`
/// read it). Borrowed when there is nothing to decode.
fn form_decode(text: &str) -> Cow<'_, [u8]> {
    let bytes = text.as_bytes();
    if !bytes.iter().any(|&b| b == b'+' || b == b'%') {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (bytes.get(i + 1).and_then(hex), bytes.get(i + 2).and_then(hex)) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

fn hex(digit: &u8) -> Option<u8> {
    char::from(*digit).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Bytes as key text, one to one: UTF-8 text as it is, each `%` as `%25`,
/// each byte that is not part of UTF-8 text as `%XX`.
fn raw_text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for (i, part) in chunk.valid().split('%').enumerate() {
            if i > 0 {
                out.push_str("%25");
            }
            out.push_str(part);
        }
        for b in chunk.invalid() {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
