//! A breaker's metrics served for Prometheus to scrape: an upstream that
//! fails, the breaker in front of it, and `GET /metrics`.
//!
//! ```text
//! cargo run --example prometheus --features metrics            # scrapes itself once, prints it
//! cargo run --example prometheus --features metrics -- --serve # then: curl http://127.0.0.1:9898/metrics
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

    let serve = std::env::args().any(|a| a == "--serve");
    let default = if serve {
        "127.0.0.1:9898"
    } else {
        "127.0.0.1:0"
    };
    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| default.into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let url = format!("http://{}/metrics", listener.local_addr()?);
    let server = tokio::spawn(app::serve_metrics(listener, handle));
    if !serve {
        // What Prometheus would read, over a real connection.
        let scrape = app::scrape(&url).await?;
        for line in scrape.lines() {
            if line.starts_with("circuit_breaker_") && !line.contains("quantile") {
                println!("{line}");
            }
        }
        return Ok(());
    }
    println!("scrape {url} (Ctrl-C to stop)");
    tokio::select! {
        served = server => served??,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
