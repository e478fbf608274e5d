//! A breaker's metrics served for Prometheus to scrape: an upstream that
//! fails, the breaker in front of it, and `GET /metrics`.
//!
//! ```text
//! cargo run --example prometheus --features metrics
//! curl http://127.0.0.1:9898/metrics
//! ```
//!
//! `METRICS_ADDR` sets the address (default `127.0.0.1:9898`).

mod app;

use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The breaker may be built before the recorder is installed.
    let mut client =
        app::breaker_layer().layer(tower::service_fn(|_: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(503)
                    .body(String::new())
                    .unwrap(),
            )
        }));
    let handle = app::install_recorder();

    for _ in 0..5 {
        match client
            .ready()
            .await?
            .call(http::Request::new(String::new()))
            .await
        {
            Ok(res) => println!("upstream answered {}", res.status()),
            Err(err) => println!("{err}"),
        }
    }

    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "scrape http://{}/metrics (Ctrl-C to stop)",
        listener.local_addr()?
    );
    tokio::select! {
        served = app::serve_metrics(listener, handle) => served?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
