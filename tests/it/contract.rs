//! The status-code and header contract of DESIGN.md, end to end over real sockets.
//!
//! A write that must still be at the upstream while something else happens is
//! held there by the recording upstream and released afterwards, not slowed down.

use crate::common;

use common::*;

async fn setup() -> (RecordingUpstream, Proxy) {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, "")).await;
    (up, proxy)
}

#[tokio::test]
async fn accepted_tokens_raise_the_fence_and_stale_ones_get_409_with_the_current_token() {
    let (up, proxy) = setup().await;
    let url = proxy.url("/objects/a");

    assert_eq!(put(&url, 5, "v5").await.status, 200);
    // Equal tokens pass: one owner writes many times.
    assert_eq!(put(&url, 5, "v5b").await.status, 200);
    assert_eq!(put(&url, 7, "v7").await.status, 200);

    let stale = put(&url, 6, "v6").await;
    let p = stale.problem(409);
    assert_eq!(stale.header("x-fencing-token-current"), Some("7"));
    assert_eq!(p["key"], "/objects/a");
    assert_eq!(p["token"], 6);
    assert_eq!(p["current"], 7);
    assert_eq!(p["type"], "urn:fencegate:problem:stale-token");

    // The upstream saw exactly the accepted writes, tokens unchanged, and kept the last.
    let tokens: Vec<_> = up.applied_for("/objects/a").into_iter().map(|a| a.token.unwrap()).collect();
    assert_eq!(tokens, ["5", "5", "7"]);
    assert_eq!(up.object("/objects/a").unwrap(), "v7");

    // Keys are independent: a low token is fine on another key.
    assert_eq!(put(&proxy.url("/objects/b"), 1, "b1").await.status, 200);
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="objects",outcome="stale"}"#).await, Some(1.0));
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="objects",outcome="forwarded"}"#).await, Some(4.0));
    assert_eq!(proxy.metric("fencegate_tracked_keys").await, Some(2.0));
    // A read passes unfenced, counted under its route too.
    assert_eq!(get(&url).await.status, 200);
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="objects",outcome="unfenced"}"#).await, Some(1.0));
}

#[tokio::test]
async fn zero_and_the_largest_u64_are_valid_tokens() {
    let (_up, proxy) = setup().await;
    assert_eq!(put(&proxy.url("/objects/z"), 0, "").await.status, 200);
    let max = u64::MAX;
    assert_eq!(put(&proxy.url("/objects/z"), max, "").await.status, 200);
    let r = put(&proxy.url("/objects/z"), max - 1, "").await;
    r.problem(409);
    assert_eq!(r.header("x-fencing-token-current"), Some("18446744073709551615"));
}

#[tokio::test]
async fn malformed_tokens_get_400_and_reach_nothing() {
    let (up, proxy) = setup().await;
    let url = proxy.url("/objects/m");
    // The last three end in a byte just past '9' or before '0', inside the first
    // or the second eight-digit group (the parser reads eight digits at a time).
    for bad in [
        "",
        "abc",
        "-1",
        "+1",
        "1.5",
        "0x1f",
        "1 2",
        "18446744073709551616",
        "1,2",
        "٣",
        "1234567:",
        "12345678901234;",
        "123456789/",
    ] {
        let r = send("PUT", &url, &[("x-fencing-token", bad)], "x").await;
        let p = r.problem(400);
        assert_eq!(p["type"], "urn:fencegate:problem:malformed-token", "{bad:?}");
        assert_eq!(p["key"], "/objects/m");
    }
    // Two token headers, even equal ones, are refused.
    let r = send("PUT", &url, &[("x-fencing-token", "3"), ("x-fencing-token", "3")], "x").await;
    r.problem(400);
    assert!(r.json()["detail"].as_str().unwrap().contains("more than once"));
    assert!(up.applied().is_empty(), "a malformed write reached the upstream");
    assert_eq!(proxy.metric("fencegate_tracked_keys").await, Some(0.0));
}

#[tokio::test]
async fn missing_token_gets_428_unless_the_route_allows_it() {
    let up = RecordingUpstream::start().await;
    let routes = format!(
        "{}{}",
        route("strict", "/strict/", &up, ""),
        route("lenient", "/lenient/", &up, "missing_token = \"allow\"")
    );
    let proxy = Proxy::start(&routes).await;

    for method in ["PUT", "POST", "PATCH", "DELETE"] {
        let r = send(method, &proxy.url("/strict/x"), &[], "x").await;
        let p = r.problem(428);
        assert_eq!(p["type"], "urn:fencegate:problem:missing-token");
        assert_eq!(p["key"], "/strict/x");
    }
    assert!(up.applied().is_empty());

    assert_eq!(send("PUT", &proxy.url("/lenient/x"), &[], "x").await.status, 200);
    // A token that is present is still enforced on an `allow` route.
    assert_eq!(put(&proxy.url("/lenient/x"), 9, "x").await.status, 200);
    put(&proxy.url("/lenient/x"), 8, "x").await.problem(409);
}

#[tokio::test]
async fn unfenced_methods_pass_untouched_whatever_their_token() {
    let (up, proxy) = setup().await;
    assert_eq!(put(&proxy.url("/objects/r"), 10, "data").await.status, 200);
    // GET is not fenced: a stale, malformed or missing token changes nothing.
    let r = send("GET", &proxy.url("/objects/r"), &[("x-fencing-token", "1")], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "data");
    assert_eq!(send("GET", &proxy.url("/objects/r"), &[("x-fencing-token", "junk")], "").await.status, 200);
    assert_eq!(send("HEAD", &proxy.url("/objects/r"), &[], "").await.status, 200);
    // The mark did not move.
    put(&proxy.url("/objects/r"), 9, "").await.problem(409);
    assert_eq!(up.applied_for("/objects/r").len(), 1);
}

#[tokio::test]
async fn safe_methods_are_configurable_and_every_other_method_is_fenced() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("o", "/o/", &up, "safe_methods = [\"GET\", \"PUT\"]")).await;
    assert_eq!(send("PUT", &proxy.url("/o/a"), &[], "").await.status, 200);
    // Compared exactly as sent: `put` is not `PUT`, and every method not
    // listed is fenced, WebDAV and unknown extensions included.
    for method in ["put", "POST", "DELETE", "MKCOL", "PROPPATCH", "FROB"] {
        let reply = send(method, &proxy.url("/o/a"), &[], "").await;
        assert_eq!(reply.problem(428)["type"], "urn:fencegate:problem:missing-token", "{method}");
    }
    assert_eq!(up.applied().len(), 1);
}

#[tokio::test]
async fn a_path_no_route_matches_is_404_problem() {
    let (_up, proxy) = setup().await;
    let r = send("PUT", &proxy.url("/elsewhere"), &[("x-fencing-token", "1")], "").await;
    let p = r.problem(404);
    assert_eq!(p["type"], "urn:fencegate:problem:no-route");
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="none",outcome="no_route"}"#).await, Some(1.0));
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_problem_and_the_fence_stays_raised() {
    // A port that was just free: nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let proxy =
        Proxy::start(&format!("[[route]]\nname = \"dead\"\nprefix = \"/\"\nupstream = \"http://{dead}\"\n")).await;
    let r = put(&proxy.url("/k"), 3, "x").await;
    let p = r.problem(502);
    assert_eq!(p["type"], "urn:fencegate:problem:upstream-error");
    assert_eq!(p["key"], "/k");
    assert_eq!(p["token"], 3);
    assert_eq!(
        send("GET", &proxy.url("/k"), &[], "").await.problem(502)["type"],
        "urn:fencegate:problem:upstream-error"
    );
    // The fence was raised before forwarding and stays raised (fail safe).
    put(&proxy.url("/k"), 2, "x").await.problem(409);
}

#[tokio::test]
async fn an_upstream_past_its_timeout_is_504_problem_and_the_key_is_free_afterwards() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("o", "/o/", &up, "timeout = \"200ms\"")).await;
    // The upstream holds the marked write until the test lets it go: it can only time out.
    let gate = up.hold_where(1, "the write that times out", |_, _, headers| headers.contains_key("x-hold"));
    let r = send("PUT", &proxy.url("/o/slow"), &[("x-fencing-token", "1"), ("x-hold", "1")], "x").await;
    let p = r.problem(504);
    assert_eq!(p["type"], "urn:fencegate:problem:upstream-timeout");
    assert_eq!(p["token"], 1);
    // The turn was passed on when the forward failed (after the settle period),
    // even though the upstream still holds the write that timed out.
    assert_eq!(put(&proxy.url("/o/slow"), 1, "y").await.status, 200);
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="o",outcome="upstream_timeout"}"#).await, Some(1.0));
    gate.release();
}

#[tokio::test]
async fn waiting_past_queue_timeout_is_503_with_retry_after() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("o", "/o/", &up, "queue_timeout = \"100ms\"")).await;
    let url = proxy.url("/o/busy");
    // The first write holds the key's turn for as long as the upstream holds it.
    let gate = up.hold("/o/busy");
    let first = tokio::spawn({
        let url = url.clone();
        async move { put(&url, 1, "x").await }
    });
    gate.wait_arrived().await;
    let r = put(&url, 2, "y").await;
    let p = r.problem(503);
    assert_eq!(p["type"], "urn:fencegate:problem:queue-timeout");
    assert!(r.header("retry-after").is_some());
    gate.release();
    assert_eq!(first.await.unwrap().status, 200);
    // Only the first write was applied.
    assert_eq!(up.applied_for("/o/busy").len(), 1);
}

#[tokio::test]
async fn the_token_header_is_configurable_and_forwarded_unchanged() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("o", "/o/", &up, "token_header = \"X-Lock-Epoch\"")).await;
    send("PUT", &proxy.url("/o/a"), &[("x-fencing-token", "5")], "").await.problem(428);
    assert_eq!(send("PUT", &proxy.url("/o/a"), &[("x-lock-epoch", "0005")], "").await.status, 200);
    send("PUT", &proxy.url("/o/a"), &[("x-lock-epoch", "4")], "").await.problem(409);
    let (_, _, headers) = up.seen().into_iter().find(|(m, _, _)| m == "PUT").unwrap();
    assert_eq!(headers["x-lock-epoch"], "0005", "the token header must reach the upstream byte for byte");
}

#[tokio::test]
async fn key_templates_choose_what_is_fenced_together() {
    let up = RecordingUpstream::start().await;
    let routes = format!(
        "{}{}",
        route("buckets", "/buckets/", &up, "pattern = \"/buckets/{bucket}/objects/{object*}\"\nkey = \"{bucket}\""),
        route("tenants", "/t/", &up, "key = \"{header.x-tenant}\"")
    );
    let proxy = Proxy::start(&routes).await;
    // Two objects in one bucket share the bucket's fence.
    assert_eq!(put(&proxy.url("/buckets/b1/objects/x"), 5, "").await.status, 200);
    let p = put(&proxy.url("/buckets/b1/objects/y/z"), 4, "").await.problem(409);
    assert_eq!(p["key"], "b1");
    assert_eq!(put(&proxy.url("/buckets/b2/objects/y"), 4, "").await.status, 200);
    // A path outside the pattern cannot be keyed: 400, nothing forwarded.
    let p = put(&proxy.url("/buckets/b1/other"), 9, "").await.problem(400);
    assert_eq!(p["type"], "urn:fencegate:problem:bad-key");

    let r = send("PUT", &proxy.url("/t/anything"), &[("x-fencing-token", "3"), ("x-tenant", "acme")], "").await;
    assert_eq!(r.status, 200);
    let p =
        send("PUT", &proxy.url("/t/else"), &[("x-fencing-token", "2"), ("x-tenant", "acme")], "").await.problem(409);
    assert_eq!(p["key"], "acme");
    send("PUT", &proxy.url("/t/else"), &[("x-fencing-token", "2")], "").await.problem(400);
    // A missing token is a 428 even when the key cannot be made either.
    send("PUT", &proxy.url("/t/else"), &[], "").await.problem(428);
    // A `Connection` that names the key's header does not strip it on the way
    // upstream: the write lands under the tenant that was fenced, not under
    // whatever the upstream assumes without one.
    let headers = [("x-fencing-token", "1"), ("x-tenant", "nobody"), ("connection", "x-tenant")];
    assert_eq!(send("PUT", &proxy.url("/t/else"), &headers, "").await.status, 200);
    let (_, _, seen) = up.seen().pop().unwrap();
    assert_eq!(seen.get("x-tenant").map(|v| v.to_str().unwrap()), Some("nobody"));
    assert_eq!(up.applied().len(), 4);
}

#[tokio::test]
async fn admin_serves_health_readiness_and_metrics_that_count_each_request() {
    let (up, proxy) = setup().await;
    assert_eq!(get(&proxy.admin_url("/healthz")).await.status, 200);
    assert_eq!(get(&proxy.admin_url("/readyz")).await.status, 200);
    let m = get(&proxy.admin_url("/metrics")).await;
    assert_eq!(m.status, 200);
    let text = m.text();
    for name in [
        "fencegate_requests_total",
        "fencegate_request_duration_seconds",
        "fencegate_tracked_keys",
        "fencegate_waiting_requests",
        "fencegate_active_keys",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }

    // Every series a request moves, and the value it should hold now.
    let requests = |outcome: &str| format!(r#"fencegate_requests_total{{route="objects",outcome="{outcome}"}}"#);
    let timed = r#"fencegate_request_duration_seconds_count{route="objects"}"#;
    let timed_all = r#"fencegate_request_duration_seconds_bucket{le="+Inf",route="objects"}"#;
    let expect = |forwarded: f64, stale: f64, unfenced: f64, tracked: f64| {
        let proxy = &proxy;
        let requests = &requests;
        async move {
            let seen = [
                proxy.metric(&requests("forwarded")).await,
                proxy.metric(&requests("stale")).await,
                proxy.metric(&requests("unfenced")).await,
                proxy.metric(timed).await,
                proxy.metric(timed_all).await,
                proxy.metric("fencegate_tracked_keys").await,
            ];
            let total = forwarded + stale + unfenced;
            let want = [forwarded, stale, unfenced, total, total, tracked].map(Some);
            assert_eq!(seen, want, "[forwarded, stale, unfenced, timed, timed le=+Inf, tracked keys]");
        }
    };
    expect(0.0, 0.0, 0.0, 0.0).await;

    assert_eq!(put(&proxy.url("/objects/a"), 5, "v5").await.status, 200);
    expect(1.0, 0.0, 0.0, 1.0).await;
    put(&proxy.url("/objects/a"), 4, "v4").await.problem(409);
    expect(1.0, 1.0, 0.0, 1.0).await;
    assert_eq!(get(&proxy.url("/objects/a")).await.status, 200);
    expect(1.0, 1.0, 1.0, 1.0).await;
    let sum = proxy.metric(r#"fencegate_request_duration_seconds_sum{route="objects"}"#).await.unwrap();
    assert!(sum > 0.0, "three requests timed, yet the duration sum is {sum}");

    // While a write is held at the upstream, its key is active; a second write
    // for it waits. Both gauges fall back to zero once the key is free.
    assert_eq!(proxy.metric("fencegate_active_keys").await, Some(0.0));
    assert_eq!(proxy.metric("fencegate_waiting_requests").await, Some(0.0));
    let gate = up.hold("/objects/a");
    let held = tokio::spawn({
        let url = proxy.url("/objects/a");
        async move { put(&url, 6, "v6").await }
    });
    gate.wait_arrived().await;
    assert_eq!(proxy.metric("fencegate_active_keys").await, Some(1.0));
    assert_eq!(proxy.metric("fencegate_waiting_requests").await, Some(0.0));
    let queued = tokio::spawn({
        let url = proxy.url("/objects/a");
        async move { put(&url, 7, "v7").await }
    });
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    assert_eq!(proxy.metric("fencegate_active_keys").await, Some(1.0));
    gate.release();
    assert_eq!(held.await.unwrap().status, 200);
    assert_eq!(queued.await.unwrap().status, 200);
    proxy.wait_metric("fencegate_active_keys", 0.0).await;
    proxy.wait_metric("fencegate_waiting_requests", 0.0).await;
    expect(3.0, 1.0, 1.0, 1.0).await;

    get(&proxy.admin_url("/nope")).await.problem(404);
    send("POST", &proxy.admin_url("/healthz"), &[], "").await.problem(405);
}

/// `strict = true`: one write per token. A token equal to the key's mark is
/// refused with 409 like a lower one (nothing forwarded, the mark unchanged),
/// a higher one is forwarded; without `strict` the holder of the mark may
/// write again.
#[tokio::test]
async fn a_strict_route_refuses_a_token_equal_to_the_mark() {
    let up = RecordingUpstream::start().await;
    let routes = format!("{}{}", route("once", "/once/", &up, "strict = true"), route("again", "/again/", &up, ""));
    let proxy = Proxy::start(&routes).await;

    assert_eq!(put(&proxy.url("/once/x"), 5, "first").await.status, 200);
    let r = put(&proxy.url("/once/x"), 5, "second").await;
    let p = r.problem(409);
    assert_eq!(p["type"], "urn:fencegate:problem:stale-token");
    assert_eq!((p["token"].as_u64(), p["current"].as_u64()), (Some(5), Some(5)));
    assert_eq!(r.header("x-fencing-token-current"), Some("5"));
    assert!(p["detail"].as_str().unwrap().contains("strict"), "{p}");
    put(&proxy.url("/once/x"), 4, "lower").await.problem(409);
    assert_eq!(put(&proxy.url("/once/x"), 6, "third").await.status, 200);
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="once",outcome="stale"}"#).await, Some(2.0));

    assert_eq!(put(&proxy.url("/again/x"), 5, "first").await.status, 200);
    assert_eq!(put(&proxy.url("/again/x"), 5, "second").await.status, 200);

    let applied: Vec<(String, Option<String>)> = up.applied().into_iter().map(|w| (w.key, w.token)).collect();
    let want = [("/once/x", "5"), ("/once/x", "6"), ("/again/x", "5"), ("/again/x", "5")];
    assert_eq!(applied, want.map(|(k, t)| (k.to_string(), Some(t.to_string()))));
}
