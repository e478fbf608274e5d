//! Quota gating and pacing per key, over a real connection: a hyper server
//! on 127.0.0.1:0 that answers per API key, a hyper-util client, paused time.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::keyed::{self, KeyedBreakers};
use tower_circuit_breaker::{CircuitBreakerLayer, Reason, Rejection, State};

/// Requests seen, per API key.
#[derive(Clone, Default)]
struct Hits {
    spent: Arc<AtomicUsize>,
    ok: Arc<AtomicUsize>,
    busy: Arc<AtomicUsize>,
}

/// `spent`: OpenAI's `insufficient_quota` 429, always. `ok`: 200. `busy`: a
/// 429 with `Retry-After: 5` the first time, then 200.
async fn upstream() -> (std::net::SocketAddr, Hits) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Hits::default();
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let h = h.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let key = req.headers()["x-api-key"].to_str().unwrap().to_owned();
                    let res = match key.as_str() {
                        "spent" => {
                            h.spent.fetch_add(1, Ordering::SeqCst);
                            Response::builder().status(429).body(Full::new(Bytes::from_static(
                                br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
                            )))
                        }
                        "busy" if h.busy.fetch_add(1, Ordering::SeqCst) == 0 => Response::builder()
                            .status(429)
                            .header("retry-after", "5")
                            .header("x-ratelimit-remaining-requests", "0")
                            .header("x-ratelimit-reset-requests", "1m0s")
                            .body(Full::new(Bytes::from_static(
                                br#"{"error":{"type":"requests","code":"rate_limit_exceeded"}}"#,
                            ))),
                        _ => {
                            if key == "ok" {
                                h.ok.fetch_add(1, Ordering::SeqCst);
                            }
                            Response::builder().body(Full::new(Bytes::from_static(b"{}")))
                        }
                    };
                    async move { Ok::<_, Infallible>(res.unwrap()) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, hits)
}

fn request(addr: std::net::SocketAddr, key: &str) -> Request<Empty<Bytes>> {
    Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("x-api-key", key)
        .body(Empty::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn one_key_that_exhausts_its_quota_is_gated_while_another_keeps_working() {
    let (addr, hits) = upstream().await;
    let breakers = KeyedBreakers::builder()
        .consecutive_failures(3)
        .quota_gate(Duration::from_secs(60))
        .jitter(0.0)
        .build()
        .unwrap();
    let layer = CircuitBreakerLayer::keyed(breakers.clone(), keyed::header("x-api-key"))
        .with_classifier(LlmClassifier::new());
    let mut svc = layer.layer(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());

    // The quota answer: passed through, and the key's circuit opens.
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request(addr, "spent"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    res.into_body().collect().await.unwrap();
    let spent = breakers.get("spent").unwrap();
    assert_eq!(spent.state(), State::Open);
    let snapshot = spent.snapshot();
    assert_eq!(snapshot.reason, Some(Reason::QuotaExhausted));
    assert_eq!(snapshot.counters.failures, 0, "a quota is no failure");

    for _ in 0..10 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(request(addr, "spent"))
            .await
            .unwrap_err();
        let open = err.circuit_open().unwrap();
        assert_eq!(open.reason(), Rejection::Quota);
        assert_eq!(open.key(), Some("spent"));
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request(addr, "ok"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(
        hits.spent.load(Ordering::SeqCst),
        1,
        "no call spent to hear it again"
    );
    assert_eq!(hits.ok.load(Ordering::SeqCst), 10);
    assert_eq!(breakers.get("ok").unwrap().state(), State::Closed);
    assert_eq!(spent.snapshot().counters.quota_rejected, 10);

    // No reset announced: after the configured 60 s, half-open as usual.
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(spent.state(), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn retry_after_5_makes_the_next_5_s_on_that_key_local_rate_limited_rejections() {
    let (addr, hits) = upstream().await;
    let breakers = KeyedBreakers::builder()
        .consecutive_failures(3)
        .pace_rate_limits(true)
        .build()
        .unwrap();
    let layer = CircuitBreakerLayer::keyed(breakers.clone(), keyed::header("x-api-key"))
        .with_classifier(LlmClassifier::new());
    let mut svc = layer.layer(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());

    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request(addr, "busy"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    res.into_body().collect().await.unwrap();
    assert_eq!(hits.busy.load(Ordering::SeqCst), 1);

    // Retry-After: 5 wins over the one-minute full reset.
    for _ in 0..10 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(request(addr, "busy"))
            .await
            .unwrap_err();
        let open = err.circuit_open().unwrap();
        assert_eq!(open.reason(), Rejection::RateLimited);
        assert_eq!(open.state(), State::Closed);
        assert!(open.retry_after().unwrap() <= Duration::from_secs(5));
        // Other keys are not paced.
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request(addr, "ok"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
        tokio::time::advance(Duration::from_millis(499)).await;
    }
    assert_eq!(
        hits.busy.load(Ordering::SeqCst),
        1,
        "zero upstream calls while paced"
    );
    let busy = breakers.get("busy").unwrap();
    let snapshot = busy.snapshot();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(snapshot.counters.paced, 10);
    assert_eq!((snapshot.counters.failures, snapshot.window.calls), (0, 0));

    tokio::time::advance(Duration::from_millis(10)).await;
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request(addr, "busy"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(hits.busy.load(Ordering::SeqCst), 2);
}
