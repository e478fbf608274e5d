//! A local OpenAI-compatible server on 127.0.0.1:0 for the integration tests.
//!
//! It serves `POST /v1/chat/completions` (and `GET /v1/models`) in whatever
//! [`Mode`] the test sets, and counts the requests that reach it.

#![allow(dead_code)]

pub mod classify;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 with a chat completion as JSON.
    Json,
    /// 200 SSE: two chunks, then `data: [DONE]`, then the stream stays open
    /// (as some gateways do) until the client goes away.
    Stream,
    /// 200 SSE: one chunk, then `event: error` with an overloaded error, then
    /// the stream ends.
    StreamError,
    /// This status (500, 503, ...) with an OpenAI error body.
    ServerError(u16),
    /// 400 with code `content_policy_violation`.
    ContentFilter,
    /// 429 `rate_limit_exceeded` with `retry-after` in seconds.
    RateLimited { retry_after: u64 },
    /// Never answers.
    Hang,
}

pub const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"pong"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

pub const CHUNK: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"po"},"finish_reason":null}]}"#;
/// The stream's second and last chunk: with [`CHUNK`], "pong".
pub const CHUNK_END: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"ng"},"finish_reason":null}]}"#;

pub const OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

const MODELS: &str = r#"{"object":"list","data":[{"id":"gpt-test","object":"model","created":1700000000,"owned_by":"tests"}]}"#;

type Body = BoxBody<Bytes, Infallible>;

/// A running server.
#[derive(Clone)]
pub struct OpenAiServer {
    pub addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    hits: Arc<AtomicUsize>,
}

impl OpenAiServer {
    /// Binds 127.0.0.1:0 and serves in `mode` until the runtime ends.
    pub async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = OpenAiServer {
            addr: listener.local_addr().unwrap(),
            mode: Arc::new(Mutex::new(mode)),
            hits: Arc::new(AtomicUsize::new(0)),
        };
        let s = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(s.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        server
    }

    /// Answer in `mode` from now on.
    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Requests that reached the server.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The API base, as OpenAI clients take it.
    pub fn api_base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The chat completions URL.
    pub fn chat_url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.addr)
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        self.hits.fetch_add(1, Ordering::SeqCst);
        let path = req.uri().path().to_owned();
        // Read the request to its end, as a real server would.
        let _ = req.into_body().collect().await;
        let mode = *self.mode.lock().unwrap();
        if path == "/v1/models" && mode == Mode::Json {
            return json(StatusCode::OK, MODELS);
        }
        match mode {
            Mode::Hang => std::future::pending().await,
            Mode::Json => json(StatusCode::OK, COMPLETION),
            Mode::Stream => {
                let events = stream::iter([
                    format!("data: {CHUNK}\n\n"),
                    format!("data: {CHUNK_END}\n\n"),
                    String::from("data: [DONE]\n\n"),
                ])
                .map(|e| Ok(Frame::data(Bytes::from(e))))
                .chain(stream::pending());
                sse(BodyExt::boxed(StreamBody::new(events)))
            }
            Mode::StreamError => {
                let events = stream::iter([
                    format!("data: {CHUNK}\n\n"),
                    format!("event: error\ndata: {OVERLOADED}\n\n"),
                ])
                .map(|e| Ok(Frame::data(Bytes::from(e))));
                sse(BodyExt::boxed(StreamBody::new(events)))
            }
            Mode::ServerError(code) => json(
                StatusCode::from_u16(code).unwrap(),
                r#"{"error":{"message":"upstream is down","type":"server_error","param":null,"code":null}}"#,
            ),
            Mode::ContentFilter => json(
                StatusCode::BAD_REQUEST,
                r#"{"error":{"message":"Your request was rejected by the safety system.","type":"invalid_request_error","param":"messages","code":"content_policy_violation"}}"#,
            ),
            Mode::RateLimited { retry_after } => {
                let mut res = json(
                    StatusCode::TOO_MANY_REQUESTS,
                    r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
                );
                res.headers_mut()
                    .insert("retry-after", retry_after.to_string().parse().unwrap());
                res
            }
        }
    }
}

fn json(status: StatusCode, body: &'static str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())).boxed())
        .unwrap()
}

fn sse(body: Body) -> Response<Body> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(body)
        .unwrap()
}

/// A port on 127.0.0.1 that refuses connections.
pub fn closed_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}
