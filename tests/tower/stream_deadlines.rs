//! Stream deadlines over a real connection: a hyper server on 127.0.0.1:0
//! streaming SSE tokens, a hyper-util client, paused time.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::deadline::StreamDeadlines;
use tower_circuit_breaker::error::{StreamDeadline, StreamElapsed};
use tower_circuit_breaker::failover::Failover;
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer};

type Chunks = futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>;

/// How a test server streams: `tokens` SSE events 100 ms apart, then
/// silence with the connection open.
#[derive(Clone, Copy)]
struct Streams {
    tokens: usize,
}

struct Upstream {
    addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
}

async fn upstream(how: Streams) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let h = h.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    h.fetch_add(1, Ordering::SeqCst);
                    let tokens = futures::stream::iter(0..how.tokens).then(|i| async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let event = format!(
                            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
                        );
                        Ok::<_, Infallible>(Frame::data(Bytes::from(event)))
                    });
                    let body: Chunks = tokens.chain(futures::stream::pending()).boxed();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(StreamBody::new(body))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Upstream { addr, hits }
}

fn request(addr: std::net::SocketAddr) -> Request<Empty<Bytes>> {
    Request::post(format!("http://{addr}/v1/chat/completions"))
        .body(Empty::new())
        .unwrap()
}

fn layer(
    deadlines: StreamDeadlines,
) -> CircuitBreakerLayer<LlmClassifier, tower_circuit_breaker::Breaker, StreamDeadlines> {
    CircuitBreakerLayer::builder()
        .consecutive_failures(5)
        .jitter(0.0)
        .build()
        .unwrap()
        .with_classifier(LlmClassifier::new())
        .stream_deadlines(deadlines)
        .unwrap()
}

fn elapsed(err: &BoxError) -> Option<StreamDeadline> {
    err.downcast_ref::<StreamElapsed>()
        .map(StreamElapsed::deadline)
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_stalls_after_three_tokens_ends_at_the_stall_deadline_as_a_failure() {
    let up = upstream(Streams { tokens: 3 }).await;
    let layer = layer(StreamDeadlines::new().stall(Duration::from_secs(5)));
    let breaker = layer.breaker().clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut svc = layer.layer(client);

    let outcome = tokio::time::timeout(Duration::from_secs(120), async {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request(up.addr))
            .await
            .unwrap();
        let mut body = res.into_body();
        let mut tokens = 0;
        let mut last = Instant::now();
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    assert!(frame.is_data());
                    tokens += 1;
                    last = Instant::now();
                }
                Some(Err(err)) => return (tokens, Some(err), last.elapsed()),
                None => return (tokens, None, last.elapsed()),
            }
        }
    })
    .await
    .expect("the stall deadline ends the stream");

    let (tokens, err, silence) = outcome;
    assert_eq!(tokens, 3);
    assert_eq!(
        elapsed(&err.expect("a typed error")),
        Some(StreamDeadline::Stall)
    );
    assert_eq!(silence, Duration::from_secs(5));
    let counters = breaker.snapshot().counters;
    assert_eq!((counters.failures, counters.successes), (1, 0));
    assert_eq!(up.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_first_token_that_never_comes_hits_the_first_token_deadline() {
    let up = upstream(Streams { tokens: 0 }).await;
    let layer = layer(StreamDeadlines::new().first_frame(Duration::from_secs(10)));
    let breaker = layer.breaker().clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut svc = layer.layer(client);

    let start = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(120), async {
        svc.ready().await.unwrap().call(request(up.addr)).await
    })
    .await
    .expect("the first-frame deadline ends the call")
    .expect_err("no first frame, no response");
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(elapsed(&err.into_box()), Some(StreamDeadline::FirstFrame));
    let counters = breaker.snapshot().counters;
    assert_eq!((counters.failures, counters.in_flight), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn failover_moves_on_before_the_first_byte_and_never_after() {
    let silent = upstream(Streams { tokens: 0 }).await;
    let stalls = upstream(Streams { tokens: 1 }).await;
    let fallback = upstream(Streams { tokens: 3 }).await;
    let deadlines = StreamDeadlines::new()
        .first_frame(Duration::from_secs(5))
        .stall(Duration::from_secs(5));
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let primary = layer(deadlines);
    let backup = layer(deadlines);
    let to = |addr: std::net::SocketAddr| {
        move |req: &mut Request<Empty<Bytes>>| {
            *req.uri_mut() = format!("http://{addr}/v1/chat/completions")
                .parse()
                .unwrap();
        }
    };
    let mut svc = Failover::new(primary.layer(client.clone()))
        .fallback_with(backup.layer(client), to(fallback.addr))
        .jitter(Duration::ZERO, Duration::ZERO);

    // No first byte from the primary by its deadline: the fallback answers.
    let start = Instant::now();
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request(silent.addr))
        .await
        .unwrap();
    // The primary's deadline, then the fallback's first token 100 ms later.
    assert_eq!(start.elapsed(), Duration::from_millis(5100));
    let body = res.into_body().collect().await;
    assert!(
        body.is_err(),
        "the fallback's stream stalls after three tokens too"
    );
    assert_eq!(fallback.hits.load(Ordering::SeqCst), 1);
    assert_eq!(primary.breaker().snapshot().counters.failures, 1);

    // A first byte came: the answer is the caller's, and its stall too.
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request(stalls.addr))
        .await
        .unwrap();
    let mut body = res.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(elapsed(&err), Some(StreamDeadline::Stall));
    assert_eq!(
        fallback.hits.load(Ordering::SeqCst),
        1,
        "no failover after the first byte"
    );
    assert_eq!(stalls.hits.load(Ordering::SeqCst), 1);
    assert_eq!(primary.breaker().snapshot().counters.failures, 2);
}

#[tokio::test(start_paused = true)]
async fn a_total_stream_deadline_ends_a_stream_that_keeps_trickling() {
    let up = upstream(Streams { tokens: 1000 }).await;
    let layer = layer(
        StreamDeadlines::new()
            .stall(Duration::from_secs(1))
            .total(Duration::from_secs(30)),
    );
    let breaker = layer.breaker().clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut svc = layer.layer(client);
    let start = Instant::now();
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request(up.addr))
        .await
        .unwrap();
    let err = res.into_body().collect().await.unwrap_err();
    assert_eq!(elapsed(&err), Some(StreamDeadline::Total));
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    assert_eq!(breaker.snapshot().counters.failures, 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_who_drops_the_stream_is_not_a_failure() {
    let up = upstream(Streams { tokens: 3 }).await;
    let layer = layer(StreamDeadlines::new().stall(Duration::from_secs(5)));
    let breaker = layer.breaker().clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut svc = layer.layer(client);
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request(up.addr))
        .await
        .unwrap();
    let mut body = res.into_body();
    assert!(body.frame().await.unwrap().is_ok());
    drop(body);
    let counters = breaker.snapshot().counters;
    assert_eq!((counters.failures, counters.ignored), (0, 1));
}
