//! A hyper-util client behind a circuit breaker that reads LLM streams,
//! against a local hyper server that plays an LLM API.
//!
//! The server streams OpenAI-style answers (`data: [DONE]` at the end). Then
//! it gets overloaded the way Anthropic's API does: the answer starts as a
//! `200 OK` event stream and an `event: error` with `overloaded_error`
//! arrives in the middle. A breaker that decides on the response head would
//! count those as successes; this one reads the stream and opens. A `429`
//! with `Retry-After` passes through to the caller and is not counted.
//!
//! Run with `cargo run --example hyper_client`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, TripMode};

const HEALTHY: u8 = 0;
const OVERLOADED: u8 = 1;
const RATE_LIMITED: u8 = 2;

const ANSWER: &[&str] = &[
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\" world\"},\"fin",
    "ish_reason\":null}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

const OVERLOADED_ANSWER: &[&str] = &[
    "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hel\"}}\n\n",
    "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
];

struct Server {
    mode: AtomicU8,
    hits: AtomicUsize,
}

async fn spawn_server() -> (SocketAddr, Arc<Server>) {
    let server = Arc::new(Server {
        mode: AtomicU8::new(HEALTHY),
        hits: AtomicUsize::new(0),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let state = server.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let state = state.clone();
            let svc = hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                state.hits.fetch_add(1, Ordering::SeqCst);
                let res = match state.mode.load(Ordering::SeqCst) {
                    HEALTHY => event_stream(ANSWER),
                    OVERLOADED => event_stream(OVERLOADED_ANSWER),
                    _ => Response::builder()
                        .status(StatusCode::TOO_MANY_REQUESTS)
                        .header("retry-after", "7")
                        .body(body(&[r#"{"error":{"type":"rate_limit_error"}}"#]))
                        .expect("response"),
                };
                async move { Ok::<_, Infallible>(res) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, server)
}

type ChunkedBody =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A body sent as separate frames, split wherever `chunks` are.
fn body(chunks: &[&'static str]) -> ChunkedBody {
    let frames: Vec<_> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
        .collect();
    StreamBody::new(futures::stream::iter(frames))
}

fn event_stream(chunks: &[&'static str]) -> Response<ChunkedBody> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body(chunks))
        .expect("response")
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (addr, server) = spawn_server().await;
    println!("LLM-like server on {addr}");

    // All or nothing, to show the circuit opening: by default a call
    // without a fallback is graded instead (`TripMode::Graded`).
    let breaker = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .name("chat")
        .consecutive_failures(3)
        .open_duration(Duration::from_secs(1))
        .probes(2)
        .close_after(2)
        .build()?
        .with_classifier(LlmClassifier::new());
    let handle = breaker.breaker().clone();

    let hyper_client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut client = ServiceBuilder::new()
        .layer(breaker)
        .timeout(Duration::from_secs(10)) // attempt timeout, inside: a timeout is a failure
        .service(hyper_client);

    for call in 1..=14 {
        match call {
            3 => {
                println!("-- the server gets overloaded: 200 streams that end in `event: error`");
                server.mode.store(OVERLOADED, Ordering::SeqCst);
            }
            9 => {
                println!("-- the server recovers but rate-limits for a moment; waiting out the open period");
                server.mode.store(RATE_LIMITED, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1100)).await;
            }
            10 => server.mode.store(HEALTHY, Ordering::SeqCst),
            _ => {}
        }
        let req = Request::get(format!("http://{addr}/v1/chat/completions")).body(Empty::new())?;
        let line = match client.ready().await?.call(req).await {
            Ok(res) => {
                let status = res.status();
                let retry_after = res.headers().get("retry-after").cloned();
                let body = res.into_body().collect().await?.to_bytes();
                let text = String::from_utf8_lossy(&body);
                let what = if text.contains("overloaded_error") {
                    "stream carried an overloaded_error".to_string()
                } else if text.contains("[DONE]") {
                    "stream complete".to_string()
                } else {
                    let wait = retry_after.as_ref().and_then(|v| v.to_str().ok());
                    format!("retry-after {} s", wait.unwrap_or("?"))
                };
                format!("{status} {what}")
            }
            // `circuit 'chat' open; next probe in 976 ms`
            Err(err) => match err.circuit_open() {
                Some(open) => format!("rejected: {open}"),
                None => format!("error: {err}"),
            },
        };
        let snap = handle.snapshot();
        println!(
            "call {call:2}: {line:<60} state {:<9} server calls {:2}  ok/failed/rate-limited {}/{}/{}",
            snap.state.as_str(),
            server.hits.load(Ordering::SeqCst),
            snap.counters.successes,
            snap.counters.failures,
            snap.counters.rate_limited,
        );
    }
    Ok(())
}
