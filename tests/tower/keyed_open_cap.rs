//! The cap on open keys in a keyed stack, over a real connection: an
//! upstream failing for every model at once never has more models' circuits
//! open than the cap allows, and the models beyond it keep being tried.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::keyed::{self, KeyedBreakers};
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::{CircuitOpen, State};

/// A hyper server on 127.0.0.1:0 that answers every request 503.
async fn down() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let h = h.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_: Request<Incoming>| {
                    h.fetch_add(1, Ordering::SeqCst);
                    async {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(503)
                                .body(Full::new(Bytes::new()))
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
async fn a_provider_wide_outage_opens_no_more_models_than_the_cap() {
    let (addr, hits) = down().await;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let layer = Stack::keyed(
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(2)
            .open_duration(Duration::from_secs(60))
            .jitter(0.0)
            .max_open_share(0.2),
        keyed::header("x-model"),
    )
    .max_retries(0)
    .attempt_timeout(Duration::from_secs(10))
    .build()
    .unwrap();
    let mut svc = layer.layer(client);
    let set = svc.breakers().clone();
    let models: Vec<String> = (0..50).map(|i| format!("model-{i}")).collect();
    let (mut rejected, mut answered) = (0, 0);
    for round in 0..6 {
        for model in &models {
            let req = Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("x-model", model.as_str())
                .body(Full::new(Bytes::new()))
                .unwrap();
            match svc.ready().await.unwrap().call(req).await {
                Ok(res) => {
                    assert_eq!(res.status(), 503);
                    answered += 1;
                }
                Err(err) => {
                    assert!(CircuitOpen::find(&*err).is_some(), "{err}");
                    rejected += 1;
                }
            }
            let open = set
                .breakers()
                .iter()
                .filter(|b| b.state() == State::Open)
                .count();
            assert!(
                open <= 10,
                "round {round}: {open} of 50 models open, cap 10"
            );
        }
    }
    assert_eq!(set.max_open(), Some(10));
    assert_eq!(hits.load(Ordering::SeqCst), answered);
    assert!(rejected > 0, "the cap's keys are open and reject");
    assert!(
        answered > 100,
        "models beyond the cap keep being tried: {answered}"
    );
}
