//! Traces through the fence (`[tracing]`, docs/operations.md "Traces"): the
//! spans of requests through a real fencegate, received on a local OTLP/HTTP
//! endpoint, and the trace context the upstream gets.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;

use crate::common::process::{config_text, Running, MEMORY_STORE};
use crate::common::{route, send, Proxy, RecordingUpstream};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const STALE_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// An OTLP/HTTP receiver: every span posted to `/v1/traces`, in order.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let export = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                        let spans = export.resource_spans.into_iter().flat_map(|r| r.scope_spans);
                        kept.lock().unwrap().extend(spans.flat_map(|s| s.spans));
                        let answer = Response::builder().header("content-type", "application/x-protobuf");
                        Ok::<_, Infallible>(answer.body(Full::new(Bytes::new())).unwrap())
                    }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        Collector { addr, spans }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The span's attribute `name`, as text.
fn attribute(span: &Span, name: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == name)?.value.as_ref()?.value.as_ref()?;
    Some(match value {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        other => format!("{other:?}"),
    })
}

/// The request span of trace `trace`, and its children by name.
fn request_of<'a>(spans: &'a [Span], trace: &str) -> (&'a Span, Vec<&'a Span>) {
    let in_trace: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == trace).collect();
    let names: Vec<&str> = in_trace.iter().map(|s| s.name.as_str()).collect();
    let request =
        in_trace.iter().copied().find(|s| s.name == "request").unwrap_or_else(|| panic!("no request span: {names:?}"));
    let children = in_trace.iter().filter(|s| s.parent_span_id == request.span_id).copied().collect();
    (request, children)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_continue_the_clients_trace_and_the_upstream_continues_fencegates() {
    let collector = Collector::start().await;
    let up = RecordingUpstream::start().await;
    let traces = format!("[tracing]\notlp_endpoint = \"http://{}\"\nsample_ratio = 1.0\n", collector.addr);
    let config = format!("{}\n{traces}", config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, "")));
    let mut fg = Running::start(&config).await;

    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let headers = [("x-fencing-token", "5"), ("traceparent", traceparent.as_str()), ("tracestate", "vendor=x")];
    let reply = send("PUT", &fg.url("/objects/a"), &headers, "five").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let stale_parent = format!("00-{STALE_TRACE}-{CLIENT_SPAN}-01");
    let headers = [("x-fencing-token", "3"), ("traceparent", stale_parent.as_str())];
    assert_eq!(send("PUT", &fg.url("/objects/a"), &headers, "three").await.status, 409);
    // A graceful stop sends the spans still batched.
    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));

    let spans = collector.spans();
    let (request, children) = request_of(&spans, TRACE);
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN, "the request span's parent is the client's span");
    assert_eq!(attribute(request, "decision").as_deref(), Some("forwarded"));
    assert_eq!(attribute(request, "route").as_deref(), Some("objects"));
    assert_eq!(attribute(request, "key").as_deref(), Some("/objects/a"));
    assert_eq!(attribute(request, "token").as_deref(), Some("5"));
    let mut names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["head", "store", "turn", "upstream"], "the request span's children");

    // The upstream continues the exchange's span, in the client's trace.
    let seen = up.seen();
    let (_, _, sent) =
        seen.iter().find(|(m, p, _)| m == "PUT" && p == "/objects/a").expect("the PUT reached the upstream");
    let passed = sent.get("traceparent").expect("a traceparent upstream").to_str().unwrap().to_string();
    let parts: Vec<&str> = passed.split('-').collect();
    assert_eq!(parts[1], TRACE, "{passed}");
    let upstream = children.iter().find(|s| s.name == "upstream").unwrap();
    assert_eq!(parts[2], hex(&upstream.span_id), "the upstream's parent is fencegate's upstream span: {passed}");
    assert_eq!(sent.get("tracestate").map(|v| v.to_str().unwrap()), Some("vendor=x"));

    let (stale, _) = request_of(&spans, STALE_TRACE);
    assert_eq!(attribute(stale, "decision").as_deref(), Some("stale"));
    assert_eq!(attribute(stale, "token").as_deref(), Some("3"));
}

#[tokio::test]
async fn with_traces_off_the_clients_trace_context_passes_through_untouched() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, "")).await;
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let headers = [("x-fencing-token", "5"), ("traceparent", traceparent.as_str()), ("tracestate", "vendor=x")];
    assert_eq!(send("PUT", &proxy.url("/objects/a"), &headers, "five").await.status, 200);
    let seen = up.seen();
    let (_, _, sent) = seen.iter().find(|(m, _, _)| m == "PUT").expect("the PUT reached the upstream");
    assert_eq!(sent.get("traceparent").map(|v| v.to_str().unwrap()), Some(traceparent.as_str()));
    assert_eq!(sent.get("tracestate").map(|v| v.to_str().unwrap()), Some("vendor=x"));
}

/// A collector that is down (nothing listens) or hangs (takes the connection
/// and never answers) costs no request: every fenced write still goes
/// through, more than a batch of spans' worth so an export is under way
/// meanwhile, and fencegate still stops cleanly, its last flush given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_or_never_answers_costs_no_request() {
    let down = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_addr = hung.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = hung.accept().await {
            held.push(stream);
        }
    });
    for (collector, what) in [(down, "down"), (hung_addr, "hung")] {
        let up = RecordingUpstream::start().await;
        let traces = format!("[tracing]\notlp_endpoint = \"http://{collector}\"\n");
        let config = format!("{}\n{traces}", config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, "")));
        let mut fg = Running::start(&config).await;
        // Five spans each: past the 512 that start an export before its timer.
        for token in 1..=120u32 {
            let token = token.to_string();
            let reply = send("PUT", &fg.url("/objects/a"), &[("x-fencing-token", &token)], "body").await;
            assert_eq!(reply.status, 200, "collector {what}, token {token}: {}", reply.text());
        }
        fg.signal("TERM");
        assert_eq!(fg.wait_exit().await.code(), Some(0), "collector {what}:\n{}", fg.output());
        if what == "down" {
            assert!(fg.output().contains("cannot send spans to the OTLP endpoint"), "{}", fg.output());
        }
    }
}
