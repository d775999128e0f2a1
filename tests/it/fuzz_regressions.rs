//! Inputs found or kept by the fuzz targets in `fuzz/`, replayed as plain tests.
//!
//! The checks are the fuzz targets' own (`fuzz/src/lib.rs`, included below), so
//! `cargo test` also exercises the harness oracles. Each input is the raw fuzzer
//! input; structured ones separate their fields with 0xFF (see that file). A new
//! crash found by `fuzz/run.sh` belongs here, marked `#[ignore = "bug: ..."]`
//! until the fix lands.

#[path = "../../fuzz/src/lib.rs"]
mod checks;

use checks::{
    check_canonical, check_config, check_journal, check_key_template, check_route_match, check_token, expected_size,
    expected_token, ref_host, ref_resolve, PATH_OPTIONS,
};
use fencegate::canonical::{canonical_host, canonical_path, PathOptions};
use fencegate::config::{parse_size, Config};
use fencegate::config::{KeyTemplate, PathPattern};
use fencegate::fence::token::{parse_token, TokenError};
use http::{HeaderMap, HeaderValue, Uri};

#[test]
fn tokens_are_plain_ascii_digits_up_to_u64_max() {
    let cases: [(&[u8], Result<u64, TokenError>); 14] = [
        (b"0", Ok(0)),
        (b"00000000000000000000000000000000000018446744073709551615", Ok(u64::MAX)),
        (b"18446744073709551615", Ok(u64::MAX)),
        (b"18446744073709551616", Err(TokenError::Overflow)),
        (b"184467440737095516150", Err(TokenError::Overflow)),
        // The digits overflow before the parser reaches the letter.
        (b"99999999999999999999x", Err(TokenError::Overflow)),
        (b"1844674407370955161x", Err(TokenError::NotDigits)),
        (b"", Err(TokenError::Empty)),
        (b"\xef\xbc\x91", Err(TokenError::NotDigits)), // fullwidth 1
        (b"\xd9\xa1", Err(TokenError::NotDigits)),     // Arabic-Indic 1
        (b"1\x00", Err(TokenError::NotDigits)),
        (b"5\xff", Err(TokenError::NotDigits)),
        (b"-0", Err(TokenError::NotDigits)),
        (b"0x1", Err(TokenError::NotDigits)),
    ];
    for (input, want) in cases {
        assert_eq!(parse_token(input), want, "{:?}", String::from_utf8_lossy(input));
        assert_eq!(expected_token(input), want, "the oracle on {:?}", String::from_utf8_lossy(input));
        check_token(input);
    }
}

#[test]
fn one_token_header_is_read_and_several_are_refused() {
    // No header, one, two (refused whatever their values), three, and
    // values a header cannot carry (skipped by the harness).
    for input in [
        &b"7"[..],
        b"\xff7",
        b"\xff18446744073709551616",
        b"\xff7\xff7",
        b"\xff1\xffx\xff3",
        b"\xff\x00\xff5",
        b"\xff\xff",
        b"\xff 5",
        // From the fuzzer's corpus.
        b"99909999999999999\xffx",
        b"1\xff15\xff32\xff6\xff\xfe\xff67\xff4\xff2\xff4",
        b"4\xff?37029\xff?551\xff$\xf5u616",
        b"4467440741309323108\xff",
        b"18446744077301655114",
        b"\xff\x08\x00\x00\x00\xff\x00\x00\x00\x00\x08\xff\x00\x00\x00\x08\x00\x00\x00",
    ] {
        check_token(input);
    }
}

#[test]
fn key_templates_with_unbalanced_braces_are_refused() {
    for template in
        ["{path", "path}", "{path}}", "}{path}", "{{path}", "{a{b}", "{}", "{path}{", "{header.}", "{query.}"]
    {
        assert!(KeyTemplate::parse(template, None).is_err(), "{template:?} was accepted");
        check_key_template(template.as_bytes());
    }
    // A '{' inside a placeholder is part of its name.
    let pat = PathPattern::parse("/{a}").unwrap();
    assert!(KeyTemplate::parse("{{a}", Some(&pat)).is_err());
}

fn render(template: &str, pattern: Option<&str>, uri: &str, headers: &[(&str, &str)]) -> Option<String> {
    let pat = pattern.map(|p| PathPattern::parse(p).unwrap());
    let t = KeyTemplate::parse(template, pat.as_ref()).unwrap();
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    t.render(&uri.parse::<Uri>().unwrap(), &h).ok()
}

#[test]
fn key_templates_read_headers_queries_hosts_and_paths_as_frameworks_do() {
    // Header names in templates are case-insensitive.
    assert_eq!(render("{header.X-Tenant}", None, "/a", &[("x-tenant", "acme")]).as_deref(), Some("acme"));
    // Query parameters are decoded as frameworks decode them (names too, '+'
    // a space); the first '=' splits.
    assert_eq!(render("{query.a}", None, "/p?a=b=c", &[]).as_deref(), Some("b=c"));
    assert_eq!(render("{query.a b}", None, "/p?a%20b=1", &[]).as_deref(), Some("1"));
    assert_eq!(render("{query.a b}", None, "/p?a+b=%31", &[]).as_deref(), Some("1"));
    assert_eq!(render("{query.a%20b}", None, "/p?a%20b=1", &[]), None);
    assert_eq!(render("{query.a}", None, "/p?a+b=1", &[]), None);
    // The host is the Host header's name (routing made it canonical and put an
    // absolute-form authority there), lowercased, without its port.
    assert_eq!(render("{host}", None, "/a", &[("host", "Example.COM:8080")]).as_deref(), Some("example.com"));
    assert_eq!(render("{host}", None, "http://example.com/a", &[]), None);
    // The path of an authority-form or asterisk-form URI.
    assert_eq!(render("{path}", None, "*", &[]).as_deref(), Some("*"));
    assert_eq!(render("{path}", None, "example.com:443", &[]).as_deref(), Some(""));

    for input in [
        // template, pattern, URI, headers...
        &b"{host}\xff\xff/a\xffhost:a.example\xffhost:b.example"[..],
        b"{host}\xff\xffhttp://user@Host.example:8080/p",
        b"{header.x-t}{path}\xff\xff/a\xffx-t:\x80\x81",
        b"{header.x-t}\xff\xff/a\xffx-t:one\xffx-t:two",
        b"{query.id}-{path}\xff\xff/a?id=1&id=2",
        b"{query.id}\xff\xff/a?&&id&",
        b"{a}\xff/{a*}\xff/",
        b"{a}\xff/{a*}\xff/x//",
        b"{b}\xff//{a}//{b*}\xff//1//2/3",
        b"{s9}\xff/{s0}/{s1}/{s2}/{s3}/{s4}/{s5}/{s6}/{s7}/{s8}/{s9}\xff/0/1/2/3/4/5/6/7/8/9",
        b"{s9}\xff/{s0}/{s1}/{s2}/{s3}/{s4}/{s5}/{s6}/{s7}/{s8}/{s9}\xff/0/1/2/3/4/5/6/7/8/",
        b"{path}\xff/x/{a}/{a}\xff/x/1/1",
        b"{path}\xff/{a*}/{b}\xff/x",
        b"{path}\xff/{}\xff/x",
        b"{path}\xff/{*}\xff/x",
        b"{path}\xff/{a}}\xff/x",
        b"{path}\xff\xff/a%2Fb?x#frag",
        b"{path}\xff\xffhttp://h",
        // From the fuzzer's corpus.
        b"{path\xff/{rest*}\xff/h\x89\xc5\x95\x87",
        b"{}\xff/bu1:+as/{bucket}/o/{oject*}\xff/bucx-1:t",
        b"\x8a\x8e:{bucket}/{object}\xff/buckets/{bucket}/obj/cts/{object*}\xff/ket",
        b"\x8a\x8e:{bucke}\xff/cke\x98ts/{bucket}/objects/{obet}/{pt*}\xff/cbje\xffc",
        b"{bu\xff/buckx-tenant:ets/{bucket}/objects/{objEct*}\xff/bu{ack}",
        b"{host}{path}\xff\x89\xffa\xffhost:\xd3!o4",
        b"{host}{host}\xff\x89\xffu\xff\xff\xffhost:or0",
        b"{host}{path}\xff\xff/a\xffho&t:St::8\xde0",
    ] {
        check_key_template(input);
    }
}

#[test]
fn a_pattern_with_forty_one_captures_matches_them_all() {
    let names: Vec<String> = (0..40).map(|i| format!("{{c{i}}}")).collect();
    let pattern = format!("/{}/{{tail*}}", names.join("/lit/"));
    let pat = PathPattern::parse(&pattern).unwrap();
    let path = format!("/{}/t/u", (0..40).map(|i| i.to_string()).collect::<Vec<_>>().join("/lit/"));
    let caps = pat.captures(&path).unwrap();
    assert_eq!(caps.len(), 41);
    assert_eq!(caps[40], "t/u");
    let mut input = b"{c39}:{tail}".to_vec();
    for field in [pattern.as_bytes(), path.as_bytes()] {
        input.push(0xFF);
        input.extend_from_slice(field);
    }
    check_key_template(&input);
}

#[test]
fn routes_and_upstreams_match_as_the_reference_says() {
    for input in [
        // prefixes..., path
        &b"/\xff/objects/\xff/objects/deep/\xff/objects/deep/x"[..],
        b"/objects/\xff/objects",
        // An empty prefix matches everything; duplicates resolve to the first.
        b"\xff/a\xff/a\xff/a\xff/ab",
        b"\xff",
        b"/\xc3\xa9\xff/\xc3\xa9t\xc3\xa9",
        // Fields that are upstreams too.
        b"http://10.0.0.5:9000/v1/\xff/v1/x",
        b"http://user@host:80\xffhttp://[::1]:8080/b//\xff/",
        b"http://h?\xffhttp://h/#f\xffhttps://h\xffhttp://:80\xffhttp:///x",
        // Found by the fuzzer: a '#fragment' in the request path, which the http
        // crate drops when it builds the upstream URI (a harness false positive).
        b"/\xff/#\x00\x00\x00/#\x000",
    ] {
        check_route_match(input);
    }
}

#[test]
fn sizes_take_decimal_and_binary_units_and_refuse_overflow() {
    for (text, want) in [
        ("16MiB", Some(16 << 20)),
        (" 10 MB ", Some(10_000_000)),
        ("10\u{3000}KB", Some(10_000)),
        ("0", Some(0)),
        ("18446744073709551615", Some(u64::MAX)),
        ("18446744073709551615B", Some(u64::MAX)),
        ("18446744073709551616", None),
        ("17179869184GiB", None),
        ("17179869183GiB", Some(17_179_869_183 << 30)),
        ("5BB", None),
        ("5 iB", None),
        ("KiB", None),
        ("+5", None),
        ("5\u{0661}", None),
    ] {
        assert_eq!(parse_size(text), want, "{text:?}");
        assert_eq!(expected_size(text), want, "the oracle on {text:?}");
    }
}

const MINIMAL: &str = "[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://127.0.0.1:9000\"\n";

#[test]
fn any_config_text_is_checked_without_panicking_and_duplicate_routes_are_refused() {
    assert!(Config::from_toml_str(MINIMAL).is_ok());
    check_config(MINIMAL.as_bytes());
    check_config(include_bytes!("../../config/fencegate.toml"));
    for extra in [
        "max_body = \"0\"",
        "max_body = \"18446744073709551615\"",
        "max_body = \"18446744073709551616\"",
        "key = \"{path\"",
        "pattern = \"/objects/{a*}\"\nkey = \"{a}\"",
        "pattern = \"/{a}\"",
        "fenced_methods = [\"PUT\"]",
        "safe_methods = [\"get\", \"GET\"]",
        "safe_methods = [\"GET\", \"GET\"]",
        "safe_methods = []",
        "timeout = \"0s\"",
        "settle = \"0s\"",
        "token_header = \"\"",
        "signing_key_file = \"\"",
        "max_token_jump = 18446744073709551615",
    ] {
        check_config(format!("{MINIMAL}{extra}\n").as_bytes());
    }
    let two = format!("{MINIMAL}{}", MINIMAL.replace("/objects/", "/"));
    assert!(Config::from_toml_str(&two).is_err(), "two routes named alike were accepted");
    check_config(two.as_bytes());
    let two = format!("{MINIMAL}{}", MINIMAL.replace("\"objects\"", "\"other\""));
    assert!(Config::from_toml_str(&two).is_err(), "two routes with one prefix were accepted");
    check_config(two.as_bytes());
    // From the fuzzer's corpus: upstreams the http crate half-accepts.
    for upstream in
        ["http://127.000", "http://#127.000", "http://:9000", "[server]126.0.0.1:9000", "htt/127.0.0.1:9000"]
    {
        check_config(MINIMAL.replace("http://127.0.0.1:9000", upstream).as_bytes());
    }
    for text in ["", "[[route]]", "route = 1", "[log]\nlevel = \"[{\"\n", "a = \"\\u0000\"", "\u{feff}[server]"] {
        check_config(text.as_bytes());
    }
    // Not UTF-8: skipped.
    check_config(b"\xff");
}

#[test]
fn a_cut_journal_keeps_its_whole_frames_and_damage_inside_is_reported() {
    // Structured: picks, then batches of records (token byte, key), 0x00 between records.
    let mut structured: Vec<Vec<u8>> = Vec::new();
    for picks in [[0u8, 0, 0, 0], [7, 0, 3, 0], [255, 255, 255, 255], [40, 0, 90, 0], [13, 1, 200, 0]] {
        let mut input = vec![0x80];
        input.extend_from_slice(&picks);
        for batch in [&b"\x05/a\x00\x09/b"[..], b"\x07/a", b"", b"\x02/c\x00\x01/a\x00\xfe\xd0\x96"] {
            input.push(0xFF);
            input.extend_from_slice(batch);
        }
        structured.push(input);
    }
    // One batch only, and none at all.
    structured.push(vec![0x80, 9, 0, 9, 0, 0xFF, 5, b'k']);
    structured.push(vec![0x80, 1, 2, 3, 4]);
    for input in &structured {
        check_journal(input);
    }
    // Raw bytes: headers, frames and lengths that lead nowhere.
    let raw: [&[u8]; 5] = [
        b"\x00",
        b"\x00FGJH",
        b"\x00FGJH\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        &[0u8; 5000],
        &[0x7F; 4200],
    ];
    for input in raw {
        check_journal(input);
    }
}

/// A `canonical` input from its fields: path, authority, respelling script,
/// query, parameter name, second path.
fn canonical_input(fields: &[&[u8]]) -> Vec<u8> {
    fields.join(&0xFF)
}

#[test]
fn the_spellings_from_the_issue_are_one_path() {
    let same = [
        "/objects/a",
        "/objects//a",
        "/objects/./a",
        "/objects/x/../a",
        "/objects/%61",
        "/objects/%2e/a",
        "/objects/x/%2E%2E/a",
        "/objects/.%2e/objects/a",
        "//objects///a",
    ];
    for options in [PathOptions::default(), PATH_OPTIONS[1]] {
        for p in same {
            assert_eq!(canonical_path(p, options).as_deref(), Ok("/objects/a"), "{p} {options:?}");
        }
    }
    // What the reference (nginx) serves for each, so the pairs below are real aliases.
    let a = ref_resolve(b"/objects/a", PathOptions::default());
    for p in same {
        assert_eq!(ref_resolve(p.as_bytes(), PathOptions::default()), a, "{p}");
    }
    for (i, p) in same.iter().enumerate() {
        let q = same[(i + 1) % same.len()];
        check_canonical(&canonical_input(&[
            p.as_bytes(),
            b"A.Example.:80",
            b"\x00\x03\x04\x01",
            b"i%64=7",
            b"id",
            q.as_bytes(),
        ]));
    }
    assert_eq!(canonical_path("/objects/../secure/doc", PathOptions::default()).as_deref(), Ok("/secure/doc"));
    for host in ["a.example.", "a.example:80", "A.Example.:80", "a.example:0080", "a.example:"] {
        assert_eq!(canonical_host(host, 80).as_deref(), Ok("a.example"), "{host}");
        assert_eq!(ref_host(host, 80).as_deref(), Some("a.example"), "{host}");
    }
}

#[test]
fn tricky_paths_canonicalize_as_the_reference_resolver_does() {
    for path in [
        &b""[..],
        b"/",
        b"*",
        b"//",
        b"//..",
        b"/..",
        b"/../a",
        b"/a/../../b",
        b"/a//../b",
        b"/a/..//b",
        b"/a/b//..",
        b"/..;/a",
        b"/.;x/a",
        b"/a/%2e%2e;/b",
        b"/a/..%3b/b",
        b"/a/...;/b",
        b"/%2e%2e%2f",
        b"/a%2Fb/..",
        b"/x/..%2F..%2Fsecure",
        b"/a%5c..%5cb",
        b"/a\\b",
        b"/a%00",
        b"/a\x00",
        b"/a%7f",
        b"/a%",
        b"/a%4",
        b"/a%G1",
        b"/a%+1",
        b"/a%%41",
        b"/%25",
        b"/%2541",
        b"/%252e%252e/",
        b"/%25%32%65",
        b"/a b?c#d[e]",
        b"/\xc3\xa9/%C3%A9/%c3%a9",
        b"/\xe2\x80\xae",
        b"/%ff%FE",
        b"/!$&'()*+,;=:@",
        b"/%21%24%26%27%28%29%2A%2B%2C%3B%3D%3A%40",
        b"/.../..../.a./",
        b"/a/.%20/b",
        b"/a/./../b/./../../c",
    ] {
        check_canonical(path);
        // The same path as the second one, beside a plain first.
        check_canonical(&canonical_input(&[b"/a", b"", b"", b"", b"", path]));
    }
}

#[test]
fn respelled_paths_canonicalize_to_one_form() {
    // Scripts of (op, pick) pairs: escape an unreserved character, flip hex
    // case, double a slash, insert "./" or "x/../", write an escape raw.
    let scripts: [&[u8]; 6] = [
        b"\x00\x00\x00\x01\x00\x02\x01\x00",
        b"\x02\x00\x02\x01\x02\x05",
        b"\x03\x00\x04\x01\x03\x02\x04\x00",
        b"\x04\x00\x00\x07\x00\x08\x01\x01",
        b"\x05\x00\x05\x01\x01\x00",
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28],
    ];
    for path in [&b"/objects/a"[..], b"/", b"/a%20b%3F/c%25/", b"/a//b", b"/x;y/%2F/z", b"not a path"] {
        for script in scripts {
            check_canonical(&canonical_input(&[path, b"", script]));
        }
    }
}

#[test]
fn host_spellings_canonicalize_as_the_reference_does() {
    for authority in [
        &b""[..],
        b"a.example",
        b"A.EXAMPLE.",
        b"a.example:0080",
        b"a.example:",
        b"a.example:08080",
        b"a.example:443",
        b"a.example..",
        b".",
        b":80",
        b"user@a.example",
        b"a%2Eexample",
        b"a example",
        b"\xc3\xa9.example",
        b"a:80:80",
        b"::1",
        b"[::1]",
        b"[::1]:0080",
        b"[0:0:0:0:0:0:0:1]:",
        b"[2001:DB8::A]:8080",
        b"[::ffff:1.2.3.4]",
        b"[fe80::1%25eth0]",
        b"[::1",
        b"[]",
        b"[::1]x",
        b"a.example:0",
        b"a.example:65536",
        b"a.example:000000000000000000000000080",
        b"a.example:99999999999999999999",
        b"a.example:+80",
    ] {
        check_canonical(&canonical_input(&[b"/", authority]));
    }
}

#[test]
fn query_parameters_are_decoded_as_frameworks_decode_them() {
    for (query, name) in [
        (&b"i%64=7&id=fresh"[..], &b"id"[..]),
        (b"id=%37", b"id"),
        (b"id=a+b%2Bc&x", b"id"),
        (b"a+b=1&a%20b=2", b"a b"),
        (b"&&id&", b"id"),
        (b"id=%ZZ&id%=1", b"id"),
        (b"%ff=1&%fe=2", b"\xef\xbf\xbd"),
        (b"=1&=2", b""),
        (b"id=1;id=2", b"id"),
        (b"%26=1", b"&"),
    ] {
        check_canonical(&canonical_input(&[b"/", b"h", b"", query, name]));
    }
}

#[test]
fn canonical_inputs_kept_from_the_fuzzer_still_pass() {
    // Kept from the corpus of two 300 s runs (no failure): one input for each
    // of several outcomes across the four switch combinations. Fields: path,
    // authority, respelling script, query, parameter name, second path.
    for input in [
        // '..' takes an empty segment only when slashes do not merge.
        &b"//.."[..],
        b"///..%2F",
        b"/e%2Fb//..;",
        b"//../\x9e\xcd%5c/.*@\xffu\xff:\xd4r0\xbfes&\x00\x00\x00",
        b"/.////../\x81dfa%2F/..;.%3B\xffiA",
        b"/./////////../\x81dfa%2F/@..;//.,;/.%3Bs..//%2Be",
        b"/objects/x//..a\xffampfres/%61",
        b"/a25%32%65\xffa.examp8080\xff\x05\x00\x05\x01\x01\x00\xffid=%FF\xffid\xff/a%:0b%3Fc%23d",
        b"/t\x5c%/a5\xff080\xff\xeb\xebb\xeb\xeb\xeb\xeb\xeb\x01%a.\xeb%m/%61",
        b"/hbjects/x/.%a\xffA.Example.:004\xff\x04s",
        b"/\x0a\x00\x09\x00\x80\x00e\xffib",
        b"/obje/b%6f%4e\xffa.exa\x00\xff\xfa\xfb\xf4\xffi\xffi\xff//\xbba\x89.,b",
        // Hosts: an IPv6 literal spelled with zeros, a port cut short, a lone ':'.
        b"/#.\xff[0:0::0]:8080",
        b"/./sec$\xff[0':0::1]:800\xff\x03/se%",
        b"/\xff[0::0]:\xff",
        b"/b%3f%7e\xffa.example:\xff\x00\x05\x04\x03\xffid=%37\xffid\xff//i%6\xff\xff\xff\xff:",
        b"/!$&*+,;=:@/%2B\x8b%3b\xffA..%3B6EXAMPLE..\xff\x02\x00\x02\x00\xff%26=1\xff&\xff/./../x",
        // Queries: empty names, '=' names, NUL bytes.
        b"?\xffAob\xff=\xff=&5\x00%3=\x00\x00A2\x00&=&",
    ] {
        check_canonical(input);
    }
}

/// `/objects/a+b` and `/objects/a%2Bb` are one file for nginx, Werkzeug and
/// Python's http.server (they decode the whole path), so they are one key:
/// escapes of every character a path may hold raw are decoded.
#[test]
fn escaped_reserved_characters_name_the_raw_ones() {
    for c in "!$&'()*+,;=:@".chars() {
        let raw = format!("/objects/a{c}b");
        let escaped = format!("/objects/a%{:02X}b", u32::from(c));
        assert_eq!(canonical_path(&raw, PathOptions::default()), canonical_path(&escaped, PathOptions::default()));
    }
}
