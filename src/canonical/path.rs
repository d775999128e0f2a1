//! Canonical request paths, and fence keys typed into the admin API.

use std::borrow::Cow;

use super::NonUtf8;

/// How a route treats `%2F` and `%5C` (an encoded `/` or `\`) in a path.
///
/// Servers disagree on them: nginx decodes `%2F` and then resolves the path with
/// it as a separator, others keep it inside one segment. A fence cannot key
/// both readings at once, so the safe default refuses such paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// A path with `%2F` or `%5C` (any case) is refused ([`PathError::EncodedSlash`]).
    #[default]
    Reject,
    /// `%2F` and `%5C` stay encoded (hex upper-cased) inside their segment: for
    /// upstreams that never decode them, such as object stores whose keys hold `/`.
    Keep,
}

/// The per-route switches of [`canonical_path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathOptions {
    /// Runs of `/` become one `/` (before dot segments are removed), as nginx
    /// and most file-serving upstreams read them. `false` keeps empty segments,
    /// for upstreams where `/a//b` and `/a/b` are different resources.
    pub merge_slashes: bool,
    /// What `%2F` and `%5C` do.
    pub escaped_slashes: EscapedSlashes,
    /// What escapes of bytes above 0x7F that are not UTF-8 text do
    /// (refused by default, [`PathError::NotUtf8`]).
    pub non_utf8: NonUtf8,
}

impl Default for PathOptions {
    /// `merge_slashes: true`, `escaped_slashes: Reject`, `non_utf8: Reject`:
    /// the safe choice for an upstream that resolves paths like nginx does and
    /// decodes them to text like Werkzeug does.
    fn default() -> Self {
        PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Reject, non_utf8: NonUtf8::Reject }
    }
}

/// Why a path has no canonical form (the request gets a 400 `bad-path`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with '/'")]
    NotAbsolute,
    #[error(
        "the path has a malformed percent escape: '%' must be followed by two hex digits (send a literal '%' as %25)"
    )]
    BadEscape,
    #[error(
        "the path contains an encoded slash or backslash (%2F or %5C), which this route refuses because servers \
         disagree on whether it separates segments"
    )]
    EncodedSlash,
    #[error("the path contains a backslash, which some servers read as '/'; separate segments with '/'")]
    Backslash,
    #[error("the path contains a control character (a byte below 0x20 or 0x7F, raw or percent-encoded)")]
    ControlByte,
    #[error(
        "the path has bytes above 0x7F (percent-escaped or raw) that are not UTF-8 text, such as %FF or a lone %C3, \
         which servers decode in different ways; send the path's text as UTF-8, percent-encoded"
    )]
    NotUtf8,
    #[error("the path climbs above the root with '..'")]
    AboveRoot,
    #[error(
        "the path has a '.' or '..' segment with a ';' parameter (such as '/..;/'), which some servers resolve as a \
         dot segment"
    )]
    DotSegmentParameter,
}

/// The canonical form of a request path (without its query string).
///
/// The result is the one spelling of the resource the upstream will see:
/// - escapes of characters a path may hold raw are decoded: unreserved
///   characters (`A-Z a-z 0-9 - . _ ~`), sub-delims (`!$&'()*+,;=`), `:` and
///   `@` (`%61` → `a`, `%2B` → `+`); every other escape stays, its hex
///   upper-cased (`%3f` → `%3F`); `%25` stays `%25`, so nothing is ever decoded
///   twice; escapes of bytes above 0x7F stay encoded, and each run of such
///   bytes (escaped and raw together) must be UTF-8 text unless
///   `options.non_utf8` is [`NonUtf8::Raw`] ([`check_path_utf8`]);
/// - raw bytes that a path cannot hold (anything but unreserved characters,
///   sub-delims `!$&'()*+,;=`, `:`, `@` and `/`: a space, `"`, `<`, `?`,
///   non-ASCII text, ...) are percent-encoded, hex upper-case;
/// - runs of `/` become one `/` when `options.merge_slashes` is set, and then
///   `.` and `..` segments (encoded ones too: `%2E`) are removed as RFC 3986
///   §5.2.4 does; a trailing slash stays.
///
/// So the result starts with `/`, is ASCII, and has no `.` or `..` segment, no
/// lower-case escape hex, no escape of an unreserved character, and no control
/// byte, backslash, or (when merging) `//`. It is its own canonical form.
///
/// Refused, rather than guessed at: a path that does not start with `/`; a bad
/// escape (`%G1`, a trailing `%`); a control byte or NUL, raw or encoded; a raw
/// backslash; `%2F` or `%5C` unless `options.escaped_slashes` keeps them; a
/// `..` above the root; a `.` or `..` segment with a `;` parameter (Tomcat reads
/// `/..;/` as `/../`); bytes above 0x7F that are not UTF-8 text (`%FF`,
/// `%C3` before a raw character, an overlong `%C0%AF`, a surrogate
/// `%ED%A0%80`), unless `options.non_utf8` keeps them.
///
/// Borrowed when `path` is already canonical: one scan, no allocation.
///
/// ```
/// use std::borrow::Cow;
/// use fencegate::canonical::{canonical_path, PathError, PathOptions};
///
/// let options = PathOptions::default();
/// for spelling in ["/objects//a", "/objects/./a", "/objects/x/../a", "/objects/%61", "/objects/x/%2E%2E/a"] {
///     assert_eq!(canonical_path(spelling, options).unwrap(), "/objects/a");
/// }
/// assert!(matches!(canonical_path("/objects/a", options), Ok(Cow::Borrowed(_))));
/// assert_eq!(canonical_path("/objects/a%3f b", options).unwrap(), "/objects/a%3F%20b");
/// assert_eq!(canonical_path("/objects/../secure/doc", options).unwrap(), "/secure/doc");
/// assert_eq!(canonical_path("/../secure/doc", options), Err(PathError::AboveRoot));
/// assert_eq!(canonical_path("/objects/a%2Fb", options), Err(PathError::EncodedSlash));
/// assert_eq!(canonical_path("/objects/%C3%A9", options).unwrap(), "/objects/%C3%A9");
/// assert_eq!(canonical_path("/objects/%FF", options), Err(PathError::NotUtf8));
/// ```
pub fn canonical_path(path: &str, options: PathOptions) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    // Nearly every request's path: nothing to decode, encode, merge or resolve.
    if is_plain_path(path) {
        return Ok(Cow::Borrowed(path));
    }
    canonical_path_by_the_rules(path, options)
}

/// [`canonical_path`] by its full rules, for paths not plain already.
pub(super) fn canonical_path_by_the_rules(path: &str, options: PathOptions) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut out = Output::new(path);
    out.keep(1);
    loop {
        // The output ends with '/', and the next segment starts here in both.
        let segment = out.len();
        while let Some(&b) = bytes.get(out.pos) {
            match RAW[usize::from(b)] {
                Raw::Keep => {
                    // A run of bytes kept as they are, in one step: a long
                    // segment is copied (or passed over) whole, not byte by byte.
                    let run = bytes[out.pos..].iter().take_while(|&&b| RAW[usize::from(b)] == Raw::Keep).count();
                    out.keep(run);
                }
                Raw::Slash => break,
                Raw::Percent => out.escape(options)?,
                Raw::Encode => out.replace_with_escape(1, b),
                Raw::Backslash => return Err(PathError::Backslash),
                Raw::Control => return Err(PathError::ControlByte),
            }
        }
        let last = out.pos == bytes.len();
        // Dot segments are judged after decoding, so `%2E%2E` counts as `..`.
        match dot_segment(&out.as_str()[segment..])? {
            Some(dots) => {
                // The dot segment and the '/' after it leave no trace; `..`
                // also takes the segment before it.
                out.truncate(segment);
                if dots == Dots::Two {
                    let parent = out.as_str()[..segment - 1].rfind('/').ok_or(PathError::AboveRoot)?;
                    out.truncate(parent + 1);
                }
                if last {
                    break;
                }
                out.skip(1);
            }
            None if last => break,
            // An empty segment followed by '/': the second slash of a run.
            // Merged here, before the segments after it are resolved, so the
            // stack of segments that `..` pops never holds an empty one.
            None if options.merge_slashes && out.len() == segment => out.skip(1),
            None => out.keep(1),
        }
    }
    let path = out.finish();
    if options.non_utf8 == NonUtf8::Reject {
        check_path_utf8(&path)?;
    }
    Ok(path)
}

/// Whether `path` is canonical under every [`PathOptions`] as it is, told in
/// one pass over its bytes: it starts with `/` and holds only characters a
/// path keeps raw and `/`, with no escape (so nothing above 0x7F either), no
/// empty segment but a trailing one, and no segment that starts with `.`.
/// `false` says nothing: [`canonical_path`] decides by its full rules.
///
/// ```
/// use fencegate::canonical::is_plain_path;
///
/// assert!(is_plain_path("/objects/a-b_c~d/"));
/// for path in ["/objects//a", "/objects/.a", "/objects/%61", "/objects/a b", "objects/a"] {
///     assert!(!is_plain_path(path), "{path}");
/// }
/// ```
pub fn is_plain_path(path: &str) -> bool {
    let Some((&b'/', rest)) = path.as_bytes().split_first() else { return false };
    let mut after_slash = true;
    for &b in rest {
        match PLAIN[usize::from(b)] {
            Plain::Char => after_slash = false,
            Plain::Dot if !after_slash => {}
            Plain::Slash if !after_slash => after_slash = true,
            _ => return false,
        }
    }
    true
}

/// What a byte is to [`is_plain_path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plain {
    /// Kept as it is ([`Raw::Keep`]), but not `.`.
    Char,
    Dot,
    Slash,
    /// Anything else: the full rules decide.
    Other,
}

/// The [`Plain`] class of every byte, from [`RAW`]'s.
static PLAIN: [Plain; 256] = {
    let mut table = [Plain::Other; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match (b as u8, raw_class(b as u8)) {
            (b'.', _) => Plain::Dot,
            (_, Raw::Keep) => Plain::Char,
            (_, Raw::Slash) => Plain::Slash,
            _ => Plain::Other,
        };
        b += 1;
    }
    table
};

/// Whether every run of bytes above 0x7F in `path`, percent-escaped or raw
/// (`%C3` then a raw `é` is one run), is UTF-8 text by the rules of
/// `std::str::from_utf8` (no overlong forms, no surrogates, nothing cut
/// short). Anything else (an ASCII character, an escape of one) ends a run.
///
/// Routing calls it for routes that refuse such paths: the path is made
/// canonical before the route is known.
///
/// ```
/// use fencegate::canonical::{check_path_utf8, PathError};
///
/// assert_eq!(check_path_utf8("/a/%C3%A9"), Ok(()));
/// assert_eq!(check_path_utf8("/a/%C3\u{e9}"), Err(PathError::NotUtf8));
/// assert_eq!(check_path_utf8("/a/%C0%AF"), Err(PathError::NotUtf8));
/// ```
pub fn check_path_utf8(path: &str) -> Result<(), PathError> {
    // A `&str` without escapes is UTF-8 already: the common case, one scan.
    if !path.contains('%') {
        return Ok(());
    }
    let bytes = path.as_bytes();
    let mut run = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let high = match bytes[i] {
            b'%' => match (bytes.get(i + 1), bytes.get(i + 2)) {
                (Some(&hi), Some(&lo)) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
                    Some((hex_value(hi) << 4 | hex_value(lo), 3)).filter(|&(b, _)| b >= 0x80)
                }
                _ => None,
            },
            b if b >= 0x80 => Some((b, 1)),
            _ => None,
        };
        match high {
            Some((b, len)) => {
                run.push(b);
                i += len;
            }
            None => {
                if std::str::from_utf8(&run).is_err() {
                    return Err(PathError::NotUtf8);
                }
                run.clear();
                i += 1;
            }
        }
    }
    std::str::from_utf8(&run).map(|_| ()).map_err(|_| PathError::NotUtf8)
}

/// A fence key typed into the admin API, already percent-decoded once (the
/// `?key=` value; `+` is not a space there).
///
/// A key that starts with `/` is read as a request path and given its
/// [`canonical_path`] under the default [`PathOptions`] (except that escapes
/// that are not UTF-8 stay as typed, so the keys of a `non_utf8 = "raw"`
/// route can be named), so it is the key a
/// request for that resource gets: raw characters a path cannot hold are
/// encoded (`/objects/a b` → `/objects/a%20b`), escapes still in the decoded
/// text are read as escapes (`/objects/%61` → `/objects/a`; a literal `%` is
/// typed as `%2525` in the query), and refusals are the same as for requests.
/// Any other key (a `{header.x}` or `{query.x}` key, say) is returned unchanged.
///
/// ```
/// use fencegate::canonical::admin_key;
///
/// assert_eq!(admin_key("/objects/a b").unwrap(), "/objects/a%20b");
/// assert_eq!(admin_key("/objects/./a+b").unwrap(), "/objects/a+b");
/// assert_eq!(admin_key("tenant a").unwrap(), "tenant a");
/// ```
pub fn admin_key(decoded: &str) -> Result<Cow<'_, str>, PathError> {
    if decoded.starts_with('/') {
        canonical_path(decoded, PathOptions { non_utf8: NonUtf8::Raw, ..PathOptions::default() })
    } else {
        Ok(Cow::Borrowed(decoded))
    }
}

/// What a raw byte of a path becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Raw {
    /// An unreserved character, a sub-delim, `:` or `@`: kept as it is.
    Keep,
    Slash,
    /// The start of an escape.
    Percent,
    /// Not allowed raw in a path: percent-encoded.
    Encode,
    Backslash,
    Control,
}

const fn raw_class(b: u8) -> Raw {
    match b {
        b'/' => Raw::Slash,
        b'%' => Raw::Percent,
        b'\\' => Raw::Backslash,
        0x00..=0x1F | 0x7F => Raw::Control,
        b':' | b'@' => Raw::Keep,
        _ if is_unreserved(b) || is_sub_delim(b) => Raw::Keep,
        _ => Raw::Encode,
    }
}

/// [`raw_class`] of every byte, so the scan is one load per byte.
static RAW: [Raw; 256] = {
    let mut table = [Raw::Encode; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = raw_class(i as u8);
        i += 1;
    }
    table
};

/// RFC 3986 unreserved: `ALPHA / DIGIT / "-" / "." / "_" / "~"`.
const fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// RFC 3986 sub-delims: `"!" / "$" / "&" / "'" / "(" / ")" / "*" / "+" / "," / ";" / "="`.
const fn is_sub_delim(b: u8) -> bool {
    matches!(b, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dots {
    One,
    Two,
}

/// Whether a decoded segment is `.` or `..`; a dot segment with a `;`
/// parameter (raw, or the `%3B` a server may decode before splitting) is an
/// error, because Tomcat and its kin strip the parameter and then resolve it.
fn dot_segment(segment: &str) -> Result<Option<Dots>, PathError> {
    let (dots, rest) = match segment.strip_prefix("..") {
        Some(rest) => (Dots::Two, rest),
        None => match segment.strip_prefix('.') {
            Some(rest) => (Dots::One, rest),
            None => return Ok(None),
        },
    };
    if rest.is_empty() {
        Ok(Some(dots))
    } else if rest.starts_with(';') || rest.starts_with("%3B") {
        Err(PathError::DotSegmentParameter)
    } else {
        Ok(None)
    }
}

/// The canonical path being written: borrowed from the input (its first `pos`
/// bytes) for as long as it equals the input read so far, owned from the first
/// difference on.
struct Output<'a> {
    input: &'a str,
    /// Input bytes read.
    pos: usize,
    owned: Option<String>,
}

impl<'a> Output<'a> {
    fn new(input: &'a str) -> Self {
        Output { input, pos: 0, owned: None }
    }

    fn as_str(&self) -> &str {
        match &self.owned {
            Some(s) => s,
            None => &self.input[..self.pos],
        }
    }

    fn len(&self) -> usize {
        self.as_str().len()
    }

    /// The output from here on differs from the input.
    fn owned(&mut self) -> &mut String {
        let (input, pos) = (self.input, self.pos);
        self.owned.get_or_insert_with(|| {
            let mut s = String::with_capacity(input.len() + 8);
            s.push_str(&input[..pos]);
            s
        })
    }

    /// The next `n` input bytes, unchanged.
    fn keep(&mut self, n: usize) {
        if let Some(s) = &mut self.owned {
            s.push_str(&self.input[self.pos..self.pos + n]);
        }
        self.pos += n;
    }

    /// The next `n` input bytes, dropped.
    fn skip(&mut self, n: usize) {
        self.owned();
        self.pos += n;
    }

    /// The next `n` input bytes, replaced by the ASCII byte `b`.
    fn replace_with_byte(&mut self, n: usize, b: u8) {
        self.owned().push(char::from(b));
        self.pos += n;
    }

    /// The next `n` input bytes, replaced by the escape of `b`.
    fn replace_with_escape(&mut self, n: usize, b: u8) {
        let s = self.owned();
        s.push('%');
        s.push(char::from(HEX_UPPER[usize::from(b >> 4)]));
        s.push(char::from(HEX_UPPER[usize::from(b & 0xF)]));
        self.pos += n;
    }

    fn truncate(&mut self, len: usize) {
        self.owned().truncate(len);
    }

    /// The escape at `pos`: decoded when it is of a character a path may hold
    /// raw, else kept with its hex upper-cased, or refused.
    fn escape(&mut self, options: PathOptions) -> Result<(), PathError> {
        let bytes = self.input.as_bytes();
        let (hi, lo) = match (bytes.get(self.pos + 1), bytes.get(self.pos + 2)) {
            (Some(&hi), Some(&lo)) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => (hi, lo),
            _ => return Err(PathError::BadEscape),
        };
        let value = hex_value(hi) << 4 | hex_value(lo);
        match value {
            0x00..=0x1F | 0x7F => return Err(PathError::ControlByte),
            b'/' | b'\\' if options.escaped_slashes == EscapedSlashes::Reject => return Err(PathError::EncodedSlash),
            // Every character a path may hold raw is decoded: servers that
            // read files or routes (nginx, Werkzeug, Python's http.server)
            // decode the whole path, so `%2B` and `+` are one resource there.
            _ if is_unreserved(value) || is_sub_delim(value) || matches!(value, b':' | b'@') => {
                self.replace_with_byte(3, value)
            }
            _ if hi.is_ascii_lowercase() || lo.is_ascii_lowercase() => self.replace_with_escape(3, value),
            _ => self.keep(3),
        }
        Ok(())
    }

    fn finish(self) -> Cow<'a, str> {
        match self.owned {
            Some(s) => Cow::Owned(s),
            None => Cow::Borrowed(&self.input[..self.pos]),
        }
    }
}

/// The value of an ASCII hex digit (the caller checked it is one).
fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        _ => (digit | 0x20) - b'a' + 10,
    }
}
