//! Real servers on 127.0.0.1:0 and a real hyper-util client, shared by the
//! integration tests.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::{CircuitBreaker, CircuitBreakerLayer};

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The stack under test: a breaker with the LLM classifier around a
/// hyper-util client.
pub type LlmClient = CircuitBreaker<HttpClient, LlmClassifier>;

pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn http2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// A breaker that opens after `failures` failures in a row and stays open
/// for an hour, so no test depends on the clock.
pub fn llm_client(failures: u32) -> LlmClient {
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(failures)
        .open_duration(Duration::from_secs(3600))
        .max_open_duration(Duration::from_secs(3600))
        .jitter(0.0)
        .build()
        .expect("valid breaker")
        .with_classifier(LlmClassifier::new());
    tower::Layer::layer(&layer, http_client())
}

pub fn get_req(addr: SocketAddr, path: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .body(Empty::new())
        .unwrap()
}

/// Counts the requests a server sees.
#[derive(Clone, Default)]
pub struct Hits(Arc<AtomicUsize>);

impl Hits {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Serves `app` on 127.0.0.1:0 until the runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A server that answers every request with the same raw bytes and then
/// closes the connection: the way to cut a response short.
pub async fn serve_raw(response: Vec<u8>) -> (SocketAddr, Hits) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Hits::default();
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let response = response.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                // Read the request head so that closing does not reset it.
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                counter.hit();
                let _ = stream.write_all(&response).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, hits)
}

/// A `text/event-stream` response whose body arrives in exactly these chunks.
pub fn sse(chunks: Vec<Bytes>) -> Response<Body> {
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, Infallible>));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// An event stream that sends `chunks` and then never ends.
pub fn sse_then_hang(chunks: Vec<Bytes>) -> Response<Body> {
    use futures::StreamExt;
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, Infallible>))
        .chain(futures::stream::pending());
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Splits `text` into chunks of `n` bytes, cutting lines and characters.
pub fn chunks_of(text: &str, n: usize) -> Vec<Bytes> {
    text.as_bytes()
        .chunks(n)
        .map(Bytes::copy_from_slice)
        .collect()
}

pub const OPENAI_OK: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Bonjour, \u{e7}a va ? \u{1f980}\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n";

pub const ANTHROPIC_OVERLOADED: &str = "event: message_start\r\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\r\n\r\n\
event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n\
event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello, an error\"}}\r\n\r\n\
event: error\r\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\r\n\r\n";

pub const OPENAI_FILTERED: &str = "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"I\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\n\
data: [DONE]\n\n";

pub const AZURE_FILTER_400: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;

pub const RATE_LIMIT_429: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 3, Used 3.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;

pub const QUOTA_429: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;

/// The local LLM upstream every HTTP test talks to.
pub fn llm_upstream(hits: Hits) -> Router {
    Router::new()
        .route("/ok", get(|| async { sse(chunks_of(OPENAI_OK, 37)) }))
        .route("/overloaded", get(|| async { sse(chunks_of(ANTHROPIC_OVERLOADED, 29)) }))
        .route("/filtered", get(|| async { sse(chunks_of(OPENAI_FILTERED, 50)) }))
        .route(
            "/done-then-hang",
            get(|| async { sse_then_hang(chunks_of(OPENAI_OK, 64)) }),
        )
        .route(
            "/hang-before-done",
            get(|| async { sse_then_hang(chunks_of(&OPENAI_OK[..OPENAI_OK.len() - 16], 64)) }),
        )
        .route(
            "/filter-400",
            get(|| async { json(StatusCode::BAD_REQUEST, &[], AZURE_FILTER_400) }),
        )
        .route(
            "/rate-limited",
            get(|| async {
                json(
                    StatusCode::TOO_MANY_REQUESTS,
                    &[("retry-after", "7"), ("x-ratelimit-reset-requests", "6m0s")],
                    RATE_LIMIT_429,
                )
            }),
        )
        .route(
            "/quota",
            get(|| async { json(StatusCode::TOO_MANY_REQUESTS, &[], QUOTA_429) }),
        )
        .route(
            "/truncated",
            get(|| async {
                sse(vec![Bytes::from_static(
                    b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hel",
                )])
            }),
        )
        .route(
            "/no-newline",
            get(|| async {
                let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                sse(vec![chunk; 160]) // 10 MiB, not one line ending
            }),
        )
        .route(
            "/garbage-headers",
            get(|| async {
                json(
                    StatusCode::TOO_MANY_REQUESTS,
                    &[
                        ("retry-after", "soon"),
                        ("retry-after-ms", "-5"),
                        ("x-ratelimit-reset-tokens", "whenever"),
                    ],
                    "{\"error\":",
                )
            }),
        )
        .route(
            "/server-error",
            get(|| async { json(StatusCode::INTERNAL_SERVER_ERROR, &[], r#"{"error":{"type":"server_error"}}"#) }),
        )
        .layer(tower::util::MapRequestLayer::new(move |req| {
            hits.hit();
            req
        }))
}

pub fn json(
    status: StatusCode,
    headers: &[(&'static str, &'static str)],
    body: &'static str,
) -> Response<Body> {
    let mut res = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    for (k, v) in headers {
        res = res.header(*k, *v);
    }
    res.body(Body::from(body)).unwrap()
}

/// Reads a whole body, keeping its error.
pub async fn read_all<B>(body: B) -> Result<Bytes, B::Error>
where
    B: http_body::Body,
{
    Ok(body.collect().await?.to_bytes())
}
