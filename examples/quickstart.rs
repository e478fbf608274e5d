//! The breaker in front of a hyper-util client, against a local upstream that
//! fails, then heals.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::{Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, CircuitOpen};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // An upstream that answers 503 until `healthy` is set.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let healthy = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(AtomicUsize::new(0));
    let (ok, h) = (healthy.clone(), hits.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (ok, h) = (ok.clone(), h.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_: Request<Incoming>| {
                    h.fetch_add(1, Ordering::Relaxed);
                    let code = if ok.load(Ordering::Relaxed) { 200 } else { 503 };
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(code)
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

    let layer = CircuitBreakerLayer::builder()
        .name("upstream")
        .count_window(10)
        .min_calls(5)
        .failure_rate(0.5)
        .open_duration(Duration::from_millis(500))
        .probes(3)
        .close_after(2)
        .on_transition(|t| println!("  -> circuit {} ({})", t.to, t.reason))
        .build()?;
    let breaker = layer.breaker().clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(60))
        .service(client);
    let uri = format!("http://{addr}/");

    for i in 0..40 {
        if i == 20 {
            println!("upstream heals");
            healthy.store(true, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        let req = Request::get(uri.as_str()).body(Empty::new())?;
        match svc.ready().await?.call(req).await {
            Ok(res) => println!("call {i:>2}: {}", res.status()),
            Err(err) => {
                let err: BoxError = err.into();
                match CircuitOpen::find(&*err) {
                    Some(open) => println!(
                        "call {i:>2}: rejected, next probe in {:?}",
                        open.retry_after()
                    ),
                    None => println!("call {i:>2}: error {err}"),
                }
            }
        }
    }
    let snap = breaker.snapshot();
    println!(
        "upstream saw {} calls of 40; state {}; counters {:?}",
        hits.load(Ordering::Relaxed),
        snap.state,
        snap.counters
    );
    let _ = svc.ready().await?;
    Ok(())
}
