//! Tests of routing as a whole, and the helpers the tests of its parts
//! route requests with.

use http::{Request, Version};

use super::service::route_request;
use super::Routed;
use crate::canonical::{EscapedSlashes, PathError};
use crate::config::UpstreamUrl;
use crate::route::{test_route, Route, RouteTable};
use crate::stack::error::ProxyError;

pub(super) fn table() -> RouteTable {
    let mut keep = crate::config::test_route_config("keep", "/keep/");
    keep.path_options.escaped_slashes = EscapedSlashes::Keep;
    let mut unmerged = crate::config::test_route_config("unmerged", "/unmerged/");
    unmerged.path_options.merge_slashes = false;
    let mut folded = crate::config::test_route_config("folded", "/folded/");
    folded.fold_key_case = true;
    let mut elsewhere = crate::config::test_route_config("elsewhere", "/elsewhere/");
    elsewhere.upstream = UpstreamUrl::parse("http://127.0.0.1:2").unwrap();
    RouteTable::new([
        test_route("objects", "/objects/"),
        test_route("secure", "/secure/"),
        Route::detached(keep),
        Route::detached(unmerged),
        Route::detached(folded),
        Route::detached(elsewhere),
    ])
}

pub(super) fn route(method: &str, target: &str, headers: &[(&str, &str)]) -> Result<Routed<()>, ProxyError> {
    let mut request = Request::builder().method(method).uri(target);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    route_request(&table(), request.body(()).unwrap(), false).map(|(routed, _)| routed).map_err(|(e, _)| e)
}

#[test]
fn an_origin_form_target_over_tls_has_port_443_by_default() {
    let host = |over_tls: bool, value: &str| {
        let request = Request::put("/objects/a").header("host", value).body(()).unwrap();
        let (routed, _) = route_request(&table(), request, over_tls).map_err(|(e, _)| e).unwrap();
        routed.request.headers()["host"].to_str().unwrap().to_string()
    };
    assert_eq!(host(true, "a.example:443"), "a.example");
    assert_eq!(host(true, "a.example:80"), "a.example:80");
    assert_eq!(host(false, "a.example:443"), "a.example:443");
    assert_eq!(host(false, "a.example:80"), "a.example");
}

fn target(method: &str, target: &str) -> (String, String) {
    let routed = route(method, target, &[("host", "a.example")]).unwrap();
    (routed.route.name.to_string(), routed.request.uri().to_string())
}

#[test]
fn every_spelling_of_a_path_is_routed_and_forwarded_as_one() {
    for spelling in
        ["/objects/a", "/objects//a", "/objects/./a", "/objects/x/../a", "/objects/%61", "/objects/x/%2E%2e/a"]
    {
        assert_eq!(target("PUT", spelling), ("objects".into(), "/objects/a".into()), "{spelling}");
    }
    assert_eq!(target("PUT", "/objects/a%3f?x=%41"), ("objects".into(), "/objects/a%3F?x=%41".into()));
    // The route the canonical path names, not the one the raw text starts with.
    assert_eq!(target("PUT", "/objects/../secure/doc"), ("secure".into(), "/secure/doc".into()));
    assert_eq!(target("PUT", "http://a.example/objects/%61"), ("objects".into(), "/objects/a".into()));
}

#[test]
fn what_stays_ambiguous_is_refused() {
    for (raw, want) in [
        ("/objects/a%2Fb", PathError::EncodedSlash),
        ("/objects/a%5cb", PathError::EncodedSlash),
        ("/../objects/a", PathError::AboveRoot),
        ("/objects/..;/secure/doc", PathError::DotSegmentParameter),
    ] {
        match route("PUT", raw, &[]) {
            Err(ProxyError::BadPath(e)) => assert_eq!(e, want, "{raw}"),
            other => panic!("{raw}: {other:?}"),
        }
    }
    // A route that keeps escaped slashes takes them as they are.
    assert_eq!(target("PUT", "/keep/a%2fb"), ("keep".into(), "/keep/a%2Fb".into()));
    assert!(matches!(route("PUT", "/nowhere/a", &[]), Err(ProxyError::NoRoute { path }) if path == "/nowhere/a"));
}

#[test]
fn route_switches_apply_to_their_routes() {
    assert_eq!(target("PUT", "/unmerged//a/./b"), ("unmerged".into(), "/unmerged//a/b".into()));
    // Fold: the prefix matches in any case, the path is forwarded as sent,
    // and every case of it is one key.
    assert_eq!(target("PUT", "/FOLDED/A"), ("folded".into(), "/FOLDED/A".into()));
    let key = |target: &str| {
        let routed = route("PUT", target, &[]).unwrap();
        routed.route.key_for(routed.request.uri().path(), None, routed.request.headers()).unwrap().to_string()
    };
    assert_eq!(key("/FOLDED/A"), "/folded/a");
    assert_eq!(key("/Folded/a"), "/folded/a");
    assert_eq!(key("/objects/A"), "/objects/A", "a route that does not fold keeps the case");
    // Unmerged: routed by the merged form, then made canonical by the
    // route's own rules, the path must still fall under that route, else
    // 404: merged, /a//../unmerged/b is /unmerged/b; unmerged, /a/unmerged/b.
    assert_eq!(target("PUT", "/x/../unmerged/b"), ("unmerged".into(), "/unmerged/b".into()));
    assert!(
        matches!(route("PUT", "/a//../unmerged/b", &[]), Err(ProxyError::NoRoute { path }) if path == "/a/unmerged/b")
    );
}

#[test]
fn http2_header_values_must_not_be_padded() {
    for value in [" acme", "acme\t", " "] {
        let request =
            Request::builder().version(Version::HTTP_2).uri("http://a.example/objects/a").header("x-tenant", value);
        let refused = route_request(&table(), request.body(()).unwrap(), false).map(|_| ()).map_err(|(e, _)| e);
        assert!(matches!(refused, Err(ProxyError::BadHeader(_))), "{value:?}");
    }
}

/// Routing's pass over the fields reads the route's token field, so the head
/// check needs no lookup by name; with a `_` name among the fields (dropped
/// or refused by a later step) the head check looks the token up itself.
#[test]
fn the_token_field_is_read_in_routings_one_pass() {
    use crate::fence::token::TokenError;
    let token = |headers: &[(&str, &str)]| route("PUT", "/objects/a", headers).unwrap().token;
    assert_eq!(token(&[]), Some(Ok(None)));
    assert_eq!(token(&[("x-fencing-token", "7")]), Some(Ok(Some(7))));
    assert_eq!(token(&[("X-Fencing-Token", "0007"), ("content-length", "1")]), Some(Ok(Some(7))));
    assert_eq!(token(&[("x-fencing-token", "7"), ("x-fencing-token", "8")]), Some(Err(TokenError::Repeated)));
    assert_eq!(token(&[("x-fencing-token", "7x")]), Some(Err(TokenError::NotDigits)));
    assert_eq!(token(&[("x-fencing-token", "")]), Some(Err(TokenError::Empty)));
    // Another field's name with `_` sends the head check to the fields as
    // they are after the step that drops them.
    assert_eq!(token(&[("x-fencing-token", "7"), ("x_tenant", "a")]), None);
}
