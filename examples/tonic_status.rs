//! A tonic client on a Channel guarded by the breaker: an open circuit
//! reaches it as `UNAVAILABLE` with the time until the next probe, not as
//! `UNKNOWN`. The local server uses a string codec (no protoc needed).
//!
//! ```text
//! cargo run --example tonic_status --features tonic
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut};
use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Endpoint;
use tonic::Status;
use tower::ServiceBuilder;
use tower_circuit_breaker::tonic::{RejectionStatusLayer, RETRY_PUSHBACK_MS};
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, TripMode};

/// Messages are plain UTF-8 strings, so no protoc is needed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StringCodec;

impl Codec for StringCodec {
    type Encode = String;
    type Decode = String;
    type Encoder = StringCodec;
    type Decoder = StringCodec;

    fn encoder(&mut self) -> Self::Encoder {
        StringCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        StringCodec
    }
}

impl Encoder for StringCodec {
    type Item = String;
    type Error = Status;

    fn encode(&mut self, item: String, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }
}

impl Decoder for StringCodec {
    type Item = String;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<String>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // A gRPC server that drops every connection until `up` is set.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let up = Arc::new(AtomicBool::new(false));
    let serving = up.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            if !serving.load(Ordering::SeqCst) {
                continue; // the stream is dropped: the client sees a broken connection
            }
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                    let say = tower::service_fn(|req: tonic::Request<String>| async move {
                        Ok::<_, Status>(tonic::Response::new(format!("hello {}", req.into_inner())))
                    });
                    Ok::<_, Infallible>(tonic::server::Grpc::new(StringCodec).unary(say, req).await)
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });

    // Transitions are printed after the line of the call that caused them.
    let transitions = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = transitions.clone();
    let channel = Endpoint::from_shared(format!("http://{addr}"))?.connect_lazy();
    // All or nothing, to show the circuit opening: by default a call
    // without a fallback is graded instead (`TripMode::Graded`).
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(2)
        .open_duration(Duration::from_millis(300))
        .probes(1)
        .close_after(1)
        .on_transition(move |t| {
            let line = format!("  breaker: {} -> {} ({})", t.from, t.to, t.reason);
            log.lock().unwrap().push(line);
        })
        .build()?;
    let channel = ServiceBuilder::new()
        .layer(RejectionStatusLayer::new())
        .layer(layer)
        .service(channel);
    let mut grpc = tonic::client::Grpc::new(channel);
    let path = PathAndQuery::from_static("/echo.Echo/Say");
    let flush = || {
        for line in transitions.lock().unwrap().drain(..) {
            println!("{line}");
        }
    };

    let mut pushback = Duration::ZERO;
    for i in 1..=3 {
        grpc.ready().await.map_err(Status::from_error)?;
        let request = tonic::Request::new(String::from("world"));
        match grpc.unary(request, path.clone(), StringCodec).await {
            Ok(res) => println!("call {i}: {}", res.into_inner()),
            Err(status) => {
                if let Some(ms) = status.metadata().get(RETRY_PUSHBACK_MS) {
                    pushback = Duration::from_millis(ms.to_str()?.parse()?);
                }
                println!("call {i}: {:?}: {}", status.code(), status.message());
            }
        }
        flush();
    }

    println!(
        "server up; waiting {} ms (the status's {RETRY_PUSHBACK_MS}) for the next probe",
        pushback.as_millis()
    );
    up.store(true, Ordering::SeqCst);
    tokio::time::sleep(pushback).await;
    grpc.ready().await.map_err(Status::from_error)?;
    let res = grpc
        .unary(
            tonic::Request::new(String::from("again")),
            path,
            StringCodec,
        )
        .await?;
    println!("call 4: {}", res.into_inner());
    flush();
    Ok(())
}
