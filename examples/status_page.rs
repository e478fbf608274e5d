//! The status page of a keyed set, mounted in axum next to the service's
//! own routes: one model failing, one healthy.
//!
//! ```text
//! cargo run --example status_page --features status            # fetches its own JSON once, prints it
//! cargo run --example status_page --features status -- --serve # then open http://127.0.0.1:9899/ops/breakers
//! ```
//!
//! `STATUS_ADDR` sets the address. In a real service, mount the page behind
//! the service's own authentication: it shows which upstreams fail and which
//! keys exist.

use std::time::Duration;

use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::status::StatusPage;
use tower_circuit_breaker::{BoxError, Outcome, TripMode};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let page = StatusPage::new().refresh(Duration::from_secs(1));
    // All or nothing, to show the circuit opening: by default a call
    // without a fallback is graded instead (`TripMode::Graded`).
    let models = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .name("models")
        .consecutive_failures(3)
        .open_duration(Duration::from_secs(10))
        .probes(1)
        .close_after(1)
        .on_transition(page.listener())
        .build()?;
    let page = page.keyed("models", &models);

    // Traffic: gpt-4o fails for 30 s, then heals; claude is healthy.
    let traffic = models.clone();
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        loop {
            let healed = start.elapsed() > Duration::from_secs(30);
            if let Ok(permit) = traffic.admit("gpt-4o") {
                permit.record(if healed {
                    Outcome::Success
                } else {
                    Outcome::Failure
                });
            }
            if let Ok(permit) = traffic.admit("claude") {
                permit.record(Outcome::Success);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });

    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::get(|| async { "the service's own routes" }),
        )
        .nest_service("/ops/breakers", page);
    let serve = std::env::args().any(|a| a == "--serve");
    let default = if serve {
        "127.0.0.1:9899"
    } else {
        "127.0.0.1:0"
    };
    let addr = std::env::var("STATUS_ADDR").unwrap_or_else(|_| default.into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let url = format!("http://{}/ops/breakers", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    if !serve {
        // Three failures open gpt-4o within 1.5 s; then read what the page
        // polls, over a real connection.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let res = client.get(format!("{url}?format=json").parse()?).await?;
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await?
            .to_bytes();
        println!("{}", String::from_utf8_lossy(&body));
        return Ok(());
    }
    println!("status page: {url} (Ctrl-C to stop)");
    tokio::select! {
        served = server => served??,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
