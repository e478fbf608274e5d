//! Pacing in half-open, over a real connection: an upstream answering
//! `429 Retry-After: 60` hears at most the probe budget until the reset.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Outcome, Rejection, State};

/// A server that answers `429 Retry-After: 60` to every request it sees,
/// counting them.
async fn rate_limited() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
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
                    async {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(429)
                                .header("retry-after", "60")
                                .body(Full::new(Bytes::from_static(b"slow down")))
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
    (addr, hits)
}

#[tokio::test(start_paused = true)]
async fn half_open_probes_honour_a_known_rate_limit_until_its_reset() {
    const BUDGET: usize = 3;
    let (addr, hits) = rate_limited().await;
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(5))
        .probes(BUDGET as u32)
        .close_after(2)
        .pace_rate_limits(true)
        .jitter(0.0)
        .build()
        .unwrap();
    let svc = CircuitBreakerLayer::new(breaker.clone())
        .with_classifier(HttpClassifier)
        .layer(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());
    breaker.admit().unwrap().record(Outcome::Failure);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(breaker.state(), State::HalfOpen);

    // 1,000 calls in half-open, ten at a time, within the minute.
    let mut paced = 0;
    for _ in 0..100 {
        let calls: Vec<_> = (0..10)
            .map(|_| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let req = Request::get(format!("http://{addr}/v1/chat/completions"))
                        .body(Empty::new())
                        .unwrap();
                    match svc.oneshot(req).await {
                        Ok(res) => {
                            res.into_body().collect().await.unwrap();
                            None
                        }
                        Err(e) => e.circuit_open().map(|o| o.reason()),
                    }
                })
            })
            .collect();
        for c in calls {
            if c.await.unwrap() == Some(Rejection::RateLimited) {
                paced += 1;
            }
        }
        tokio::time::advance(Duration::from_millis(500)).await;
    }
    let reached = hits.load(Ordering::SeqCst);
    println!(
        "half-open calls 1000, reached the rate-limited upstream {reached} \
         (budget {BUDGET}), paced locally {paced}"
    );
    assert!(reached >= 1, "the first probe heard the 429");
    assert!(reached <= BUDGET, "{reached} calls reached it");
    // The first ten race for the slots; every call after them is paced.
    assert!(paced >= 1_000 - 10, "{paced} paced");
    assert_eq!(breaker.state(), State::HalfOpen, "a 429 is no verdict");
    assert!(breaker.snapshot().paced_for.is_some());

    // After the reset (60 s after the 429), probes go out again.
    tokio::time::advance(Duration::from_secs(11)).await;
    let req = Request::get(format!("http://{addr}/v1/chat/completions"))
        .body(Empty::new())
        .unwrap();
    let res = svc.clone().oneshot(req).await.unwrap();
    res.into_body().collect().await.unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), reached + 1);
}
