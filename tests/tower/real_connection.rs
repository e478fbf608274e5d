//! A hyper-util client -> breaker -> hyper server on 127.0.0.1:0.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::{CircuitBreakerLayer, State};

struct Upstream {
    addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
    healthy: Arc<AtomicBool>,
}

/// A server that answers 503 until it is told it is healthy.
async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let healthy = Arc::new(AtomicBool::new(false));
    let (h, ok) = (hits.clone(), healthy.clone());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (h, ok) = (h.clone(), ok.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    h.fetch_add(1, Ordering::SeqCst);
                    let code = if ok.load(Ordering::SeqCst) { 200 } else { 503 };
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(code)
                                .body(Full::new(Bytes::from_static(b"{}")))
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
    Upstream {
        addr,
        hits,
        healthy,
    }
}

#[tokio::test(start_paused = true)]
async fn hyper_client_trips_on_503s_skips_the_upstream_while_open_and_heals_through_half_open() {
    let up = upstream().await;
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .count_window(10)
        .min_calls(5)
        .failure_rate(0.5)
        .open_duration(Duration::from_secs(30))
        .probes(3)
        .close_after(2)
        .jitter(0.0)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut svc = ServiceBuilder::new().layer(layer).service(client);
    let uri = format!("http://{}/v1/chat/completions", up.addr);
    let request = || {
        Request::get(uri.as_str())
            .body(Empty::<Bytes>::new())
            .unwrap()
    };

    // 503s until the breaker opens.
    let mut answered = 0;
    while breaker.state() == State::Closed {
        let res = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        res.into_body().collect().await.unwrap();
        answered += 1;
        assert!(answered <= 5, "should have opened by min_calls");
    }
    assert_eq!(answered, 5);
    assert_eq!(up.hits.load(Ordering::SeqCst), 5);

    // While open the upstream sees nothing.
    for _ in 0..20 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap_err();
        assert!(err.is_circuit_open());
    }
    assert_eq!(up.hits.load(Ordering::SeqCst), 5);

    // The upstream heals; after the open duration, probes close the circuit.
    up.healthy.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(30)).await;
    for _ in 0..2 {
        let res = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(breaker.state(), State::Closed);
    let res = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(up.hits.load(Ordering::SeqCst), 8);
}
