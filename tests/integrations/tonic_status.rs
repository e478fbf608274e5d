//! A real tonic client on a real Channel, with the breaker and
//! RejectionStatusLayer, against a hand-written tonic server on 127.0.0.1:0
//! (a string codec: no protoc needed).
//!
//! Time is paused; neither the channel nor the server here sets a timer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use bytes::Bytes;
use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tower::ServiceBuilder;
use tower_circuit_breaker::classify::GrpcClassifier;
use tower_circuit_breaker::tonic::{RejectionStatusLayer, RETRY_PUSHBACK_MS};
use tower_circuit_breaker::{
    Breaker, CircuitBreakerLayer, CircuitOpen, Outcome, ResponseBody, State,
};

// === a string codec ===

// The example's codec: messages are plain UTF-8 strings, no protoc needed.
#[allow(dead_code, unused_imports)]
#[path = "../../examples/tonic_status.rs"]
mod example;

use example::StringCodec;

// === the server ===

struct Server {
    addr: SocketAddr,
    /// Whether it serves; while false it accepts and drops every connection.
    up: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    /// Whether calls answer `UNAVAILABLE`.
    failing: Arc<AtomicBool>,
}

async fn server(up: bool) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server {
        addr: listener.local_addr().unwrap(),
        up: Arc::new(AtomicBool::new(up)),
        connections: Arc::new(AtomicUsize::new(0)),
        calls: Arc::new(AtomicUsize::new(0)),
        failing: Arc::new(AtomicBool::new(false)),
    };
    let (up, connections, calls, failing) = (
        server.up.clone(),
        server.connections.clone(),
        server.calls.clone(),
        server.failing.clone(),
    );
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            connections.fetch_add(1, Ordering::SeqCst);
            if !up.load(Ordering::SeqCst) {
                drop(stream);
                continue;
            }
            let (calls, failing) = (calls.clone(), failing.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let fail = failing.load(Ordering::SeqCst);
                    async move {
                        let say =
                            tower::service_fn(move |req: tonic::Request<String>| async move {
                                if fail {
                                    return Err(Status::unavailable("model overloaded"));
                                }
                                Ok(tonic::Response::new(format!("hello {}", req.into_inner())))
                            });
                        let res = tonic::server::Grpc::new(StringCodec).unary(say, req).await;
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    server
}

fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

async fn say<T>(grpc: &mut tonic::client::Grpc<T>, name: &str) -> Result<String, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tower_circuit_breaker::BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower_circuit_breaker::BoxError>,
{
    grpc.ready()
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let path = PathAndQuery::from_static("/echo.Echo/Say");
    grpc.unary(tonic::Request::new(name.to_owned()), path, StringCodec)
        .await
        .map(tonic::Response::into_inner)
}

fn layer() -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(2)
        .open_duration(Duration::from_secs(30))
        .probes(1)
        .close_after(1)
        .jitter(0.0)
        .build()
        .unwrap()
}

// === static guarantees ===

fn assert_send<T: Send>() {}
fn assert_default<T: Default>() {}
fn assert_body<B: http_body::Body<Data = Bytes, Error = Status>>() {}

#[test]
fn response_body_over_tonic_is_send_default_and_forwards_data_and_error() {
    // tonic's body is Send but not Sync; the wrapper is exactly as much.
    assert_send::<ResponseBody<tonic::body::Body>>();
    assert_default::<ResponseBody<tonic::body::Body>>();
    assert_body::<ResponseBody<tonic::body::Body>>();
}

// === a real channel ===

#[tokio::test(start_paused = true)]
async fn an_open_circuit_reaches_a_tonic_client_as_unavailable_and_heals_through_half_open() {
    let server = server(false).await;
    let layer = layer();
    let breaker = layer.breaker().clone();
    let svc = ServiceBuilder::new()
        .layer(RejectionStatusLayer::new())
        .layer(layer)
        .service(channel(server.addr));
    let mut grpc = tonic::client::Grpc::new(svc);

    // The server drops every connection: two transport failures open it.
    for _ in 0..2 {
        let status = say(&mut grpc, "world").await.unwrap_err();
        assert!(
            status.metadata().get(RETRY_PUSHBACK_MS).is_none(),
            "{status:?}"
        );
    }
    assert_eq!(breaker.state(), State::Open);
    let connections = server.connections.load(Ordering::SeqCst);
    assert!(connections >= 2);

    let status = say(&mut grpc, "world").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "circuit open; next probe in 30000 ms");
    assert_eq!(status.metadata().get(RETRY_PUSHBACK_MS).unwrap(), "30000");
    let source = std::error::Error::source(&status).expect("the rejection as source");
    assert_eq!(
        source.downcast_ref::<CircuitOpen>().unwrap().retry_after(),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        connections,
        "no connection while open"
    );

    server.up.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(say(&mut grpc, "probe").await.unwrap(), "hello probe");
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(say(&mut grpc, "world").await.unwrap(), "hello world");
    assert_eq!(server.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn without_the_status_layer_tonic_reports_a_rejection_as_unknown() {
    let server = server(true).await;
    let layer = layer();
    let breaker = layer.breaker().clone();
    let mut grpc = tonic::client::Grpc::new(
        ServiceBuilder::new()
            .layer(layer)
            .service(channel(server.addr)),
    );
    assert_eq!(say(&mut grpc, "world").await.unwrap(), "hello world");

    breaker.force_open();
    let status = say(&mut grpc, "world").await.unwrap_err();
    assert_eq!(status.code(), Code::Unknown);

    let mut grpc = tonic::client::Grpc::new(
        ServiceBuilder::new()
            .layer(RejectionStatusLayer::new())
            .layer(CircuitBreakerLayer::new(breaker))
            .service(channel(server.addr)),
    );
    let status = say(&mut grpc, "world").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "circuit open (forced open)");
    assert!(status.metadata().get(RETRY_PUSHBACK_MS).is_none());
    assert_eq!(server.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn with_the_grpc_classifier_unavailable_answers_trip_it_and_the_client_tells_them_apart() {
    let server = server(true).await;
    server.failing.store(true, Ordering::SeqCst);
    let layer = layer().with_classifier(GrpcClassifier);
    let breaker = layer.breaker().clone();
    let svc = ServiceBuilder::new()
        .layer(RejectionStatusLayer::new())
        .layer(layer)
        .service(channel(server.addr));
    let mut grpc = tonic::client::Grpc::new(svc);

    // The server's own UNAVAILABLE: no pushback, the server's message.
    for _ in 0..2 {
        let status = say(&mut grpc, "world").await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "model overloaded");
        assert!(status.metadata().get(RETRY_PUSHBACK_MS).is_none());
    }
    assert_eq!(breaker.state(), State::Open);

    // The breaker's: same code, with the wait and the rejection inside.
    let status = say(&mut grpc, "world").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.metadata().get(RETRY_PUSHBACK_MS).unwrap(), "30000");
    assert!(std::error::Error::source(&status)
        .and_then(|s| s.downcast_ref::<CircuitOpen>())
        .is_some());
    assert_eq!(server.calls.load(Ordering::SeqCst), 2);

    server.failing.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(say(&mut grpc, "probe").await.unwrap(), "hello probe");
    assert_eq!(breaker.state(), State::Closed);
}

// === the conversion ===

#[tokio::test(start_paused = true)]
async fn half_open_and_volume_guard_rejections_say_why() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_millis(1500))
        .probes(1)
        .close_after(1)
        .jitter(0.0)
        .build()
        .unwrap();
    breaker.admit().unwrap().record(Outcome::Failure);
    tokio::time::advance(Duration::from_millis(500)).await;
    let status = Status::from(breaker.admit().unwrap_err());
    assert_eq!(status.message(), "circuit open; next probe in 1000 ms");
    assert_eq!(status.metadata().get(RETRY_PUSHBACK_MS).unwrap(), "1000");

    tokio::time::advance(Duration::from_secs(1)).await;
    let _probe = breaker.admit().unwrap();
    let status = Status::from(breaker.admit().unwrap_err());
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "circuit open (half-open, probes in flight)"
    );
    assert!(status.metadata().get(RETRY_PUSHBACK_MS).is_none());

    let guarded = Breaker::builder()
        .trip_mode(TripMode::Open)
        .volume_guard(1, Duration::from_secs(10))
        .build()
        .unwrap();
    let _first = guarded.admit().unwrap();
    let status = Status::from(guarded.admit().unwrap_err());
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().starts_with("circuit open (volume limit)"),
        "{}",
        status.message()
    );
}

#[tokio::test(start_paused = true)]
async fn a_spent_budget_reaches_a_tonic_client_as_permission_denied() {
    use tower_circuit_breaker::spend::{Period, SpendGuard};
    use tower_circuit_breaker::Rejection;

    let server = server(true).await;
    // gRPC answers report no usage: each call is charged the guard's
    // amount for calls of unknown usage, and one spends the budget.
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .spend_guard(SpendGuard::tokens(100, Period::UtcDay).unknown_cost(100))
        .build()
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(
        ServiceBuilder::new()
            .layer(RejectionStatusLayer::new())
            .layer(layer)
            .service(channel(server.addr)),
    );
    assert_eq!(say(&mut grpc, "world").await.unwrap(), "hello world");

    let status = say(&mut grpc, "world").await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("circuit spend budget exceeded: 100 tokens of 100 tokens; next call in "),
        "{}",
        status.message()
    );
    assert!(status.metadata().get(RETRY_PUSHBACK_MS).is_none());
    let source = std::error::Error::source(&status).expect("the rejection as source");
    let open = source.downcast_ref::<CircuitOpen>().unwrap();
    assert_eq!(open.reason(), Rejection::SpendExceeded);
    assert_eq!(server.calls.load(Ordering::SeqCst), 1, "no call once spent");
}
