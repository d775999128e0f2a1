//! The canonical forms' rules, case by case.

use std::borrow::Cow;

use super::*;

const DEFAULT: PathOptions =
    PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Reject, non_utf8: NonUtf8::Reject };
const KEEP: PathOptions =
    PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Keep, non_utf8: NonUtf8::Reject };
const NO_MERGE: PathOptions =
    PathOptions { merge_slashes: false, escaped_slashes: EscapedSlashes::Reject, non_utf8: NonUtf8::Reject };
const RAW: PathOptions = PathOptions { non_utf8: NonUtf8::Raw, ..DEFAULT };

fn path(input: &str, options: PathOptions) -> Result<String, PathError> {
    canonical_path(input, options).map(Cow::into_owned)
}

#[test]
fn default_options_are_the_safe_ones() {
    assert_eq!(PathOptions::default(), DEFAULT);
    assert_eq!(EscapedSlashes::default(), EscapedSlashes::Reject);
    assert_eq!(NonUtf8::default(), NonUtf8::Reject);
}

/// Werkzeug and its kin decode a path's bytes to text, each invalid sequence
/// to U+FFFD: `/a%FF` and `/a%FE` would be one file under two keys. Every run
/// of bytes above 0x7F, escaped and raw together, must be UTF-8 by
/// `std::str::from_utf8`'s rules, or the path is refused; `non_utf8 = raw`
/// keeps the escapes as they are.
#[test]
fn escapes_must_decode_to_utf8() {
    for input in [
        "/%FF",
        "/a%fe",
        "/%80",
        "/%C3",
        "/%C3/%A9",
        "/%C3%25%A9",
        "/%C3a",
        "/%C3\u{e9}",
        "/\u{e9}%A9",
        "/%C0%AF",
        "/%E0%80%AF",
        "/%ED%A0%80",
        "/%F4%90%80%80",
        "/%F0%9F%98",
        "/ok/%E2%86%92%92",
    ] {
        assert_eq!(path(input, DEFAULT), Err(PathError::NotUtf8), "{input}");
        assert_eq!(path(input, NO_MERGE), Err(PathError::NotUtf8), "{input}");
        assert_eq!(check_path_utf8(input), Err(PathError::NotUtf8), "{input}");
        let kept = path(input, RAW).unwrap();
        assert_eq!(path(&kept, RAW).as_deref(), Ok(kept.as_str()), "{input}");
    }
    assert_eq!(path("/%ff%80", RAW).as_deref(), Ok("/%FF%80"));
    for (input, want) in [
        ("/%C3%A9", "/%C3%A9"),
        ("/%c3%a9", "/%C3%A9"),
        ("/\u{e9}%C3%A9", "/%C3%A9%C3%A9"),
        ("/%E2%86%92/%F0%9F%98%80", "/%E2%86%92/%F0%9F%98%80"),
        ("/%EF%BF%BD", "/%EF%BF%BD"),
        ("/%25FF", "/%25FF"),
        ("/a%", "/a%"),
    ] {
        match path(input, DEFAULT) {
            Ok(got) => assert_eq!(got, want, "{input}"),
            Err(e) => assert_eq!(e, PathError::BadEscape, "{input}"),
        }
    }
    // The fence API names the keys of a raw route: such escapes stay as typed.
    assert_eq!(admin_key("/objects/%FF").as_deref(), Ok("/objects/%FF"));
}

#[test]
fn the_spec_examples() {
    for input in
        ["/objects//a", "/objects/./a", "/objects/x/../a", "/objects/%61", "/objects/%2e/a", "/objects/x/%2E%2E/a"]
    {
        assert_eq!(path(input, DEFAULT).as_deref(), Ok("/objects/a"), "{input}");
    }
    assert_eq!(path("/objects/%7e", DEFAULT).as_deref(), Ok("/objects/~"));
    assert_eq!(path("/objects/a%3f", DEFAULT).as_deref(), Ok("/objects/a%3F"));
    assert_eq!(path("/objects/../secure/doc", DEFAULT).as_deref(), Ok("/secure/doc"));
}

#[test]
fn canonical_paths_are_borrowed() {
    for input in [
        "/",
        "/objects/a",
        "/objects/a/",
        "/a-b_c.d~e/f",
        "/a%20b",
        "/%C3%A9",
        "/a%25b",
        "/a%3Fb",
        "/!$&'()*+,;=:@",
        "/...",
        "/.a/..b/a./a..",
        "/.../..../",
        "/a;b/c;x=1",
    ] {
        let got = canonical_path(input, DEFAULT);
        assert!(matches!(got, Ok(Cow::Borrowed(p)) if p == input), "{input}: {got:?}");
    }
    // Not canonical: owned, and different.
    for input in ["//", "/a//b", "/./", "/a/..", "/%61", "/%3f", "/a b", "/é"] {
        let got = canonical_path(input, DEFAULT);
        assert!(matches!(&got, Ok(Cow::Owned(p)) if p != input), "{input}: {got:?}");
    }
}

/// The one-pass plain check never takes a path the full rules would change
/// or refuse under any options, and takes the common ones; over every short
/// spelling made of the characters that matter.
#[test]
fn the_plain_check_agrees_with_the_rules() {
    use super::path::canonical_path_by_the_rules;
    // The kept characters each class of byte has, and each that changes or
    // refuses a path.
    const ALPHABET: &[u8] = b"/a.%2F;_ \\\x00\xC3\xA9~!$&'()*+,=:@Z9\x7f?#";
    let every = [false, true].into_iter().flat_map(|merge_slashes| {
        [EscapedSlashes::Reject, EscapedSlashes::Keep].into_iter().flat_map(move |escaped_slashes| {
            [NonUtf8::Reject, NonUtf8::Raw].map(|non_utf8| PathOptions { merge_slashes, escaped_slashes, non_utf8 })
        })
    });
    let every: Vec<PathOptions> = every.collect();
    let mut taken = 0;
    for spelling in spellings(0x9e37_79b9_7f4a_7c15, ALPHABET, 12, 300_000) {
        let bytes: Vec<u8> = std::iter::once(b'/').chain(spelling).collect();
        let Ok(text) = std::str::from_utf8(&bytes) else { continue };
        if is_plain_path(text) {
            taken += 1;
            for options in &every {
                let by_the_rules = canonical_path_by_the_rules(text, *options);
                assert!(matches!(by_the_rules, Ok(Cow::Borrowed(p)) if p == text), "{text:?} {options:?}");
            }
        }
    }
    assert!(taken > 1000, "the plain check took only {taken}");
    for path in ["/", "/objects/a", "/objects/a/", "/a-b_c~d/!$&'()*+,;=:@/x..", "/a./b"] {
        assert!(is_plain_path(path), "{path}");
    }
    for path in ["", "a", "//", "/a//b", "/.", "/a/.", "/a/..", "/.a", "/%61", "/a b", "/\u{e9}", "/a\\b", "/a\x7f"] {
        assert!(!is_plain_path(path), "{path:?}");
    }
}

#[test]
fn escapes() {
    for (input, want) in [
        // Unreserved characters are decoded, in either hex case.
        ("/%41%5a%61%7A%30%39", "/AZaz09"),
        ("/%2D%2e%5F%7e", "/-._~"),
        // So are sub-delims, ':' and '@': a path may hold them raw, and
        // servers that decode the whole path read both spellings as one.
        ("/%2b+%3a:%40@%3b;%3d=", "/++::@@;;=="),
        ("/%21%24%26%27%28%29%2A%2C", "/!$&'()*,"),
        // Everything else stays encoded, hex upper-cased.
        ("/%3f%3F%23%5b%5d", "/%3F%3F%23%5B%5D"),
        ("/%c3%a9", "/%C3%A9"),
        ("/%e2%86%92", "/%E2%86%92"),
        ("/%20", "/%20"),
        // Never decoded twice: %25 stays, and what follows it is text.
        ("/%25", "/%25"),
        ("/%2541", "/%2541"),
        ("/%252e%252e/a", "/%252e%252e/a"),
        ("/%25%32%65", "/%252e"),
    ] {
        assert_eq!(path(input, DEFAULT).as_deref(), Ok(want), "{input}");
    }
}

#[test]
fn raw_bytes_a_path_cannot_hold_are_encoded() {
    for (input, want) in [
        ("/a b", "/a%20b"),
        ("/a\"b", "/a%22b"),
        ("/<>", "/%3C%3E"),
        ("/a?b#c", "/a%3Fb%23c"),
        ("/[::1]", "/%5B::1%5D"),
        ("/^`{|}", "/%5E%60%7B%7C%7D"),
        ("/é", "/%C3%A9"),
        ("/\u{1F600}", "/%F0%9F%98%80"),
        // Sub-delims, ':' and '@' are allowed raw and stay raw.
        ("/!$&'()*+,;=:@", "/!$&'()*+,;=:@"),
    ] {
        assert_eq!(path(input, DEFAULT).as_deref(), Ok(want), "{input}");
    }
}

#[test]
fn slashes_merge_before_dot_segments() {
    for (input, merged, unmerged) in [
        ("//", "/", "//"),
        ("//a", "/a", "//a"),
        ("/a//b", "/a/b", "/a//b"),
        ("/a///b//", "/a/b/", "/a///b//"),
        // nginx and posixpath.normpath: the empty segment is gone before '..' pops.
        ("/a//../b", "/b", "/a/b"),
        ("/a/b//..", "/a/", "/a/b/"),
        ("/a/..//b", "/b", "//b"),
        ("/a/.//b", "/a/b", "/a//b"),
        ("/a//./b", "/a/b", "/a//b"),
    ] {
        assert_eq!(path(input, DEFAULT).as_deref(), Ok(merged), "{input} merged");
        assert_eq!(path(input, NO_MERGE).as_deref(), Ok(unmerged), "{input} unmerged");
    }
    // Not merging, an empty segment is a segment '..' can take; merging, it
    // is not there, so the same '..' climbs above the root.
    assert_eq!(path("//..", NO_MERGE).as_deref(), Ok("/"));
    assert_eq!(path("//..", DEFAULT), Err(PathError::AboveRoot));
}

#[test]
fn dot_segments() {
    for (input, want) in [
        ("/.", "/"),
        ("/./", "/"),
        ("/a/.", "/a/"),
        ("/a/..", "/"),
        ("/a/../", "/"),
        ("/a/b/..", "/a/"),
        ("/a/b/../c", "/a/c"),
        ("/a/./b/./c/.", "/a/b/c/"),
        ("/a/b/c/../../d", "/a/d"),
        ("/a/%2e", "/a/"),
        ("/a/%2E%2e/b", "/b"),
        ("/a/.%2E/b", "/b"),
        ("/a/%2E./b", "/b"),
        // Not dot segments.
        ("/a/.../b", "/a/.../b"),
        ("/a/.b/c.", "/a/.b/c."),
        ("/a/..b/b..", "/a/..b/b.."),
        ("/a/.%20/b", "/a/.%20/b"),
        ("/a/%2E%2E%2E", "/a/..."),
    ] {
        assert_eq!(path(input, DEFAULT).as_deref(), Ok(want), "{input}");
    }
}

#[test]
fn escaped_slashes_refused_or_kept() {
    for input in ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5cb", "/%2F", "/..%2F..%2Fsecure"] {
        assert_eq!(path(input, DEFAULT), Err(PathError::EncodedSlash), "{input}");
    }
    for (input, want) in [
        ("/a%2Fb", "/a%2Fb"),
        ("/a%2fb", "/a%2Fb"),
        ("/a%5cb", "/a%5Cb"),
        // Kept inside its segment: not a separator, not a dot segment.
        ("/x/..%2F..%2Fsecure", "/x/..%2F..%2Fsecure"),
        ("/a/%2f/../b", "/a/b"),
    ] {
        assert_eq!(path(input, KEEP).as_deref(), Ok(want), "{input}");
    }
}

#[test]
fn refusals() {
    use PathError::*;
    let both = [DEFAULT, KEEP, NO_MERGE];
    for (input, error) in [
        ("", NotAbsolute),
        ("a/b", NotAbsolute),
        ("*", NotAbsolute),
        ("http://h/a", NotAbsolute),
        ("%2Fa", NotAbsolute),
        ("/a%", BadEscape),
        ("/a%4", BadEscape),
        ("/a%G1", BadEscape),
        ("/a%1G", BadEscape),
        ("/a%%41", BadEscape),
        ("/a%-1", BadEscape),
        ("/a%\u{e9}", BadEscape),
        ("/a\\b", Backslash),
        ("/a\\..\\b", Backslash),
        ("/a\0", ControlByte),
        ("/a\tb", ControlByte),
        ("/a\r\nb", ControlByte),
        ("/a\x7f", ControlByte),
        ("/a%00", ControlByte),
        ("/a%0a", ControlByte),
        ("/a%0D", ControlByte),
        ("/a%1f", ControlByte),
        ("/a%7F", ControlByte),
        ("/..", AboveRoot),
        ("/../a", AboveRoot),
        ("/a/../../b", AboveRoot),
        ("/a/../..", AboveRoot),
        ("/%2e%2e/a", AboveRoot),
        ("/./../a", AboveRoot),
        ("/..;/a", DotSegmentParameter),
        ("/.;x/a", DotSegmentParameter),
        ("/a/..;jsessionid=1/b", DotSegmentParameter),
        ("/a/.;", DotSegmentParameter),
        ("/a/%2e%2e;/b", DotSegmentParameter),
        ("/a/..%3b/b", DotSegmentParameter),
        ("/a/.%3Bx", DotSegmentParameter),
    ] {
        for options in both {
            assert_eq!(path(input, options), Err(error.clone()), "{input:?} with {options:?}");
        }
    }
    // Not refused: a ';' on a name, or a dot segment's look-alikes.
    for input in ["/a;b/..", "/a/...;/b", "/a/x.;/b", "/a/;/b"] {
        assert!(path(input, DEFAULT).is_ok(), "{input}");
    }
}

#[test]
fn errors_say_what_to_fix() {
    assert!(PathError::BadEscape.to_string().contains("%25"));
    assert!(PathError::EncodedSlash.to_string().contains("%2F"));
    assert!(PathError::DotSegmentParameter.to_string().contains("';'"));
    assert!(HostError::Userinfo.to_string().contains("host[:port]"));
    assert!(HostError::BadPort.to_string().contains("65535"));
}

#[test]
fn canonical_paths_are_fixed_points() {
    let inputs = [
        "/objects//a/./b/../c%2e%7E%3f x",
        "/a/%2E%2E/%2e/b//",
        "/%25%32%65%2e/..",
        "//a//b//..//",
        "/a%2f%5c/x",
        "/é/ü/%c3%bc",
    ];
    for options in [DEFAULT, KEEP, NO_MERGE] {
        for input in inputs {
            let Ok(once) = canonical_path(input, options) else { continue };
            let twice = canonical_path(&once, options);
            assert!(matches!(&twice, Ok(Cow::Borrowed(p)) if *p == once), "{input} {options:?}: {twice:?}");
        }
    }
}

#[test]
fn admin_keys() {
    for (input, want) in [
        ("/objects/a b", Ok("/objects/a%20b")),
        ("/objects/a+b", Ok("/objects/a+b")),
        ("/objects//./a", Ok("/objects/a")),
        ("/objects/%61", Ok("/objects/a")),
        ("/objects/é", Ok("/objects/%C3%A9")),
        ("/objects/100%", Err(PathError::BadEscape)),
        ("/objects/a%2Fb", Err(PathError::EncodedSlash)),
        ("/../a", Err(PathError::AboveRoot)),
        ("tenant:a b", Ok("tenant:a b")),
        ("", Ok("")),
        ("%2F", Ok("%2F")),
    ] {
        assert_eq!(admin_key(input).as_deref().map_err(Clone::clone), want, "{input}");
    }
    // The key a request gets: a request for `/objects/a%20b` is keyed `/objects/a%20b`.
    assert_eq!(admin_key("/objects/a b"), canonical_path("/objects/a%20b", DEFAULT));
    assert!(matches!(admin_key("/objects/a"), Ok(Cow::Borrowed(_))));
}

fn host(input: &str) -> Result<String, HostError> {
    canonical_host(input, 80).map(Cow::into_owned)
}

#[test]
fn host_spellings() {
    for input in
        ["a.example", "A.Example", "a.example.", "A.EXAMPLE.:80", "a.example:0080", "a.example:", "a.example.:"]
    {
        assert_eq!(host(input).as_deref(), Ok("a.example"), "{input}");
    }
    for (input, want) in [
        ("a.example:8080", "a.example:8080"),
        ("a.example:08080", "a.example:8080"),
        ("a.example:00443", "a.example:443"),
        ("a.example:65535", "a.example:65535"),
        ("a.example:0000000000000000000000080", "a.example"),
        ("localhost", "localhost"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("127.0.0.1:9000", "127.0.0.1:9000"),
        ("my_host-1.example", "my_host-1.example"),
        ("[::1]", "[::1]"),
        ("[::1]:80", "[::1]"),
        ("[::1]:", "[::1]"),
        ("[::1]:8080", "[::1]:8080"),
        ("[2001:DB8::A]", "[2001:db8::a]"),
        ("[0:0:0:0:0:0:0:1]:08080", "[::1]:8080"),
        ("[::FFFF:1.2.3.4]", "[::ffff:1.2.3.4]"),
    ] {
        assert_eq!(host(input).as_deref(), Ok(want), "{input}");
    }
    // The scheme's default port is the caller's.
    assert_eq!(canonical_host("a.example:443", 443).as_deref(), Ok("a.example"));
    assert_eq!(canonical_host("a.example:80", 443).as_deref(), Ok("a.example:80"));
}

/// The one-pass check never takes a host the full rules would change or
/// refuse, and takes the common ones; over every short spelling made of the
/// characters that matter.
#[test]
fn the_quick_check_agrees_with_the_rules() {
    use super::host::{already_canonical, canonical_host_by_the_rules};
    // Every digit, so default ports (80, 443) and port bounds come up.
    const ALPHABET: &[u8] = b"aZ0123456789.-_:[]@%";
    let mut taken = 0;
    for spelling in spellings(0x2545_f491_4f6c_dd1d, ALPHABET, 11, 300_000) {
        let text: String = spelling.into_iter().map(char::from).collect();
        for default_port in [80, 443, 9] {
            if already_canonical(&text, default_port) {
                taken += 1;
                let by_the_rules = canonical_host_by_the_rules(&text, default_port);
                assert!(matches!(by_the_rules, Ok(Cow::Borrowed(h)) if h == text), "{text:?} {default_port}");
            }
        }
    }
    assert!(taken > 1000, "the quick check took only {taken}");
    for host in ["a.example", "a.example:8080", "127.0.0.1", "127.0.0.1:65535", "x_y-z.b:1"] {
        assert!(already_canonical(host, 80), "{host}");
    }
    for host in ["a.example:80", "a.example:65536", "a.example:08080", "A.example", "a..b", ".a", "a.", "[::1]", ""] {
        assert!(!already_canonical(host, 80), "{host}");
    }
}

/// The router asks with the `Host` field's bytes, which need not be UTF-8
/// or visible: none of those is taken as canonical.
#[test]
fn the_quick_check_on_raw_bytes_leaves_the_rest_to_the_rules() {
    for (bytes, default_port) in [
        (&b"a.example\xff"[..], 80),
        (b"b\xc3\xbccher", 80),
        (b"a.example ", 80),
        (b"a\t", 80),
        (b"a.example:80", 80),
        (b"a.example:443", 443),
    ] {
        assert!(!host::is_canonical_host(bytes, default_port), "{bytes:?}");
    }
    assert!(host::is_canonical_host(b"a.example:8080", 80));
}

/// `count` pseudo-random spellings of at most `max_len - 1` bytes drawn from
/// `alphabet` (at most 32 bytes), the same for the same `seed`.
fn spellings(mut seed: u64, alphabet: &'static [u8], max_len: u64, count: usize) -> impl Iterator<Item = Vec<u8>> {
    assert!(alphabet.len() <= 32 && max_len <= 12, "five bits a byte, from one 64-bit draw");
    (0..count).map(move |_| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = seed % max_len;
        (0..len).map(|i| alphabet[((seed >> (4 + 5 * i)) % alphabet.len() as u64) as usize]).collect()
    })
}

#[test]
fn canonical_hosts_are_borrowed() {
    for input in ["a.example", "a.example:8080", "127.0.0.1", "[::1]", "[2001:db8::a]:81", "x"] {
        assert!(matches!(canonical_host(input, 80), Ok(Cow::Borrowed(h)) if h == input), "{input}");
    }
    for input in ["A.example", "a.example.", "a.example:80", "a.example:", "a.example:0081", "[::0001]"] {
        assert!(matches!(canonical_host(input, 80), Ok(Cow::Owned(h)) if h != input), "{input}");
    }
}

#[test]
fn malformed_hosts() {
    use HostError::*;
    for (input, error) in [
        ("", Empty),
        (":80", Empty),
        (".", Empty),
        (".:80", Empty),
        ("user@a.example", Userinfo),
        ("user:pw@a.example:80", Userinfo),
        ("a%2Eexample", PercentEscape),
        ("[fe80::1%25eth0]", PercentEscape),
        ("a example", BadCharacter),
        ("a.example ", BadCharacter),
        ("a/b", BadCharacter),
        ("a\\b", BadCharacter),
        ("a\0b", BadCharacter),
        ("é.example", BadCharacter),
        ("a,b", BadCharacter),
        ("::1", BadCharacter),
        ("a:80:80", BadCharacter),
        ("[::1]80", BadCharacter),
        ("[::1]]", BadCharacter),
        ("a.example..", EmptyLabel),
        ("a..example", EmptyLabel),
        (".a.example", EmptyLabel),
        ("..", EmptyLabel),
        ("[::1", BadIpv6),
        ("[]", BadIpv6),
        ("[a.example]", BadIpv6),
        ("[1.2.3.4]", BadIpv6),
        ("[v1.x]", BadIpv6),
        ("[::1:]", BadIpv6),
        ("a.example:0", BadPort),
        ("a.example:000", BadPort),
        ("a.example:65536", BadPort),
        ("a.example:99999999999999999999", BadPort),
        ("a.example:+80", BadPort),
        ("a.example:8o", BadPort),
        ("a.example: 80", BadPort),
        ("[::1]:0", BadPort),
    ] {
        assert_eq!(host(input), Err(error), "{input:?}");
    }
}

#[test]
fn query_params_are_form_decoded() {
    for (query, name, want) in [
        ("id=7", "id", Ok(Some("7"))),
        ("id=%37", "id", Ok(Some("7"))),
        ("i%64=7", "id", Ok(Some("7"))),
        ("id=a+b%2Bc", "id", Ok(Some("a b+c"))),
        ("a+b=1", "a b", Ok(Some("1"))),
        ("id", "id", Ok(Some(""))),
        ("id=", "id", Ok(Some(""))),
        ("id=b=c", "id", Ok(Some("b=c"))),
        ("&&id=1&", "id", Ok(Some("1"))),
        ("id=%ZZ", "id", Ok(Some("%ZZ"))),
        ("id=%FF", "id", Err(QueryError::ValueNotUtf8)),
        ("id=%EF%BF%BD", "id", Ok(Some("\u{FFFD}"))),
        ("id=%C3%A9", "id", Ok(Some("é"))),
        ("id=a%00", "id", Err(QueryError::ControlByte)),
        ("id=%1F", "id", Err(QueryError::ControlByte)),
        ("id=%7F", "id", Err(QueryError::ControlByte)),
        ("id=a+b%20c", "id", Ok(Some("a b c"))),
        ("x%FF=1&id=2", "id", Err(QueryError::NameNotUtf8)),
        ("x=%FF&id=2", "id", Ok(Some("2"))),
        ("x=%00&id=2", "id", Ok(Some("2"))),
        ("x=1", "id", Ok(None)),
        ("idx=1&xid=2", "id", Ok(None)),
        ("", "id", Ok(None)),
        ("ID=1", "id", Ok(None)),
        ("id=1&id=1", "id", Err(QueryError::Repeated)),
        ("i%64=7&id=fresh", "id", Err(QueryError::Repeated)),
        ("id&id=2", "id", Err(QueryError::Repeated)),
        ("%69%64=1&i%64=2", "id", Err(QueryError::Repeated)),
    ] {
        assert_eq!(query_param(query, name).map(|v| v.map(Cow::into_owned)), want.map(|v| v.map(String::from)));
    }
    // A value that needs no decoding is borrowed from the query.
    assert!(matches!(query_param("id=7", "id"), Ok(Some(Cow::Borrowed("7")))));
}
