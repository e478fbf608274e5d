//! An axum app whose `/chat` route calls an LLM upstream through a circuit
//! breaker, and answers `503 Service Unavailable` with `Retry-After` itself
//! while the upstream is known to be down, without calling it.
//!
//! The route is a proxy (a hyper-util client) wrapped in the breaker, with
//! axum's `HandleErrorLayer` turning the breaker's error into a response:
//! `CircuitOpen` becomes a 503 through
//! `tower_circuit_breaker::response::rejected` (a 402 for a spent spend
//! budget, were the breaker given one), any other error (the upstream cannot
//! be reached) a 502. The upstream, a second local axum
//! server, streams answers until it is switched to failing.
//!
//! Run with `cargo run --example axum_app`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http::{Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::response::rejected;
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, TripMode};

// === the upstream ===

/// A stand-in for an LLM API that can be switched down.
#[derive(Clone, Default)]
pub struct Upstream {
    /// Requests it received.
    pub hits: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
}

impl Upstream {
    /// From now on, answer `503` (or recover, with `false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

const ANSWER: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi!\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

/// Starts the upstream on 127.0.0.1:0.
pub async fn spawn_upstream() -> (SocketAddr, Upstream) {
    let upstream = Upstream::default();
    let state = upstream.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let state = state.clone();
            async move {
                state.hits.fetch_add(1, Ordering::SeqCst);
                if state.down.load(Ordering::SeqCst) {
                    let error = r#"{"error":{"type":"server_error","message":"upstream is down"}}"#;
                    (StatusCode::SERVICE_UNAVAILABLE, error).into_response()
                } else {
                    ([("content-type", "text/event-stream")], ANSWER).into_response()
                }
            }
        }),
    );
    (serve(app).await, upstream)
}

// === the app ===

/// The breaker this app uses: the LLM classifier, open after three
/// failures in a row.
pub fn breaker(open_for: Duration) -> CircuitBreakerLayer<LlmClassifier> {
    CircuitBreakerLayer::builder()
        .name("chat-upstream")
        // All or nothing: once the upstream fails, the app answers its own
        // 503 with `Retry-After` at once. Left at the default, the breaker
        // grades instead, shedding only what the upstream cannot serve.
        .trip_mode(TripMode::Open)
        .consecutive_failures(3)
        .open_duration(open_for)
        .max_open_duration(open_for * 8)
        .jitter(0.0)
        .build()
        .expect("valid breaker")
        .with_classifier(LlmClassifier::new())
}

/// The app: `POST /chat` is forwarded to the upstream's
/// `/v1/chat/completions` through `breaker`.
pub fn app(upstream: SocketAddr, breaker: CircuitBreakerLayer<LlmClassifier>) -> Router {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let target: Uri = format!("http://{upstream}/v1/chat/completions")
        .parse()
        .expect("uri");
    let proxy = tower::service_fn(move |mut req: Request<Body>| {
        *req.uri_mut() = target.clone();
        client.request(req)
    });
    Router::new().route_service(
        "/chat",
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(on_error))
            .layer(breaker)
            .timeout(Duration::from_secs(60)) // attempt timeout: a timeout is a failure
            .service(proxy),
    )
}

/// The breaker's error as a response.
async fn on_error(err: tower_circuit_breaker::Error) -> Response {
    match err.circuit_open() {
        Some(open) => rejected(open),
        None => (StatusCode::BAD_GATEWAY, format!("upstream failed: {err}")).into_response(),
    }
}

/// Serves `app` on 127.0.0.1:0.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (upstream_addr, upstream) = spawn_upstream().await;
    let breaker = breaker(Duration::from_secs(1));
    let handle = breaker.breaker().clone();
    let addr = serve(app(upstream_addr, breaker)).await;
    println!("app on {addr}, upstream on {upstream_addr}");

    let client = Client::builder(TokioExecutor::new()).build_http::<String>();
    for call in 1..=12 {
        match call {
            3 => {
                println!("-- the upstream goes down");
                upstream.set_down(true);
            }
            9 => {
                println!("-- the upstream is back; waiting out the open period");
                upstream.set_down(false);
                tokio::time::sleep(Duration::from_millis(1100)).await;
            }
            _ => {}
        }
        let req = Request::post(format!("http://{addr}/chat"))
            .body(r#"{"model":"demo","stream":true}"#.to_string())?;
        let res = client.request(req).await?;
        let answer = match res.headers().get("retry-after") {
            Some(v) => format!(
                "{}, retry-after: {}",
                res.status(),
                v.to_str().unwrap_or("?")
            ),
            None => res.status().to_string(),
        };
        http_body_util::BodyExt::collect(res.into_body()).await?;
        println!(
            "call {call:2}: app answered {answer:<40} upstream calls {:2}, circuit {}",
            upstream.hits(),
            handle.state()
        );
    }
    Ok(())
}
