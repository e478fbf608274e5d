//! The pieces of the Prometheus example, shared with its test.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tokio::net::TcpListener;
use tower_circuit_breaker::{CircuitBreakerLayer, TripMode};

/// Installs the Prometheus recorder as the global one. Series not updated
/// for 20 minutes are dropped: longer than the keyed sets' idle timeout
/// (10 minutes by default), so an evicted key's series go too. The time to
/// first byte is a histogram with the crate's buckets for LLM answers
/// (without them the exporter makes it a summary).
pub fn install_recorder() -> PrometheusHandle {
    use tower_circuit_breaker::metrics::{TIME_TO_FIRST_BYTE, TIME_TO_FIRST_BYTE_BUCKETS};
    let handle = PrometheusBuilder::new()
        .idle_timeout(MetricKindMask::ALL, Some(Duration::from_secs(1200)))
        .set_buckets_for_metric(
            Matcher::Full(TIME_TO_FIRST_BYTE.to_string()),
            TIME_TO_FIRST_BYTE_BUCKETS,
        )
        .expect("buckets are not empty")
        .install_recorder()
        .expect("no other recorder is installed");
    tower_circuit_breaker::metrics::describe();
    handle
}

/// A breaker named `gpt-4o` that reports metrics.
pub fn breaker_layer() -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder()
        .name("gpt-4o")
        // All or nothing, so a scrape shows the circuit open after three
        // failures; the default grades instead.
        .trip_mode(TripMode::Open)
        .consecutive_failures(3)
        .open_duration(Duration::from_secs(30))
        .metrics(true)
        .build()
        .expect("a valid configuration")
}

/// `GET url`, as Prometheus scrapes it.
#[allow(dead_code)] // the test scrapes with its own client
pub async fn scrape(url: &str) -> Result<String, tower_circuit_breaker::BoxError> {
    use http_body_util::{BodyExt, Empty};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let res = client.get(url.parse()?).await?;
    let body = res.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(body.to_vec())?)
}

/// Serves `GET /metrics` in Prometheus' text format.
pub async fn serve_metrics(listener: TcpListener, handle: PrometheusHandle) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    );
    axum::serve(listener, app).await
}
