//! A tonic client behind a circuit breaker, against a tonic server it starts
//! on 127.0.0.1.
//!
//! The breaker wraps the `tonic::transport::Channel` and reads each call's
//! `grpc-status`, whether it comes in the trailers after streamed messages
//! or alone in a trailers-only answer. The server streams tokens, then goes
//! down (`UNAVAILABLE` after two tokens): the breaker opens, and calls fail
//! at once with `UNAVAILABLE` without reaching it. When the server is back
//! and the open period is over, two probes close the circuit again.
//!
//! No protoc needed: the messages derive `prost::Message` by hand, and the
//! service and client are written against tonic's `server::Grpc` and
//! `client::Grpc` with `tonic_prost::ProstCodec`, as generated code would be.
//!
//! Run with `cargo run --example tonic_client`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;
use http::uri::PathAndQuery;
use tonic::body::Body;
use tonic::server::{NamedService, ServerStreamingService, UnaryService};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower::{Service, ServiceBuilder};
use tower_circuit_breaker::classify::GrpcClassifier;
use tower_circuit_breaker::response::grpc_unavailable;
use tower_circuit_breaker::{BoxError, Breaker, CircuitBreakerLayer, TripMode};

/// The messages, as `prost-build` would generate them from:
///
/// ```proto
/// package demo;
/// message Prompt { string text = 1; uint32 max_tokens = 2; }
/// message Token { string text = 1; }
/// service Llm {
///   rpc Complete(Prompt) returns (Token);
///   rpc Generate(Prompt) returns (stream Token);
/// }
/// ```
pub mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Prompt {
        #[prost(string, tag = "1")]
        pub text: String,
        #[prost(uint32, tag = "2")]
        pub max_tokens: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Token {
        #[prost(string, tag = "1")]
        pub text: String,
    }
}

// === the server ===

/// What the demo server does, switchable while it runs.
#[derive(Debug, Default)]
pub struct Upstream {
    /// Calls that reached the server.
    pub hits: AtomicUsize,
    /// The gRPC code to fail with (0: healthy).
    fail_with: AtomicI32,
    /// How many tokens a failing stream sends before its error.
    fail_after: AtomicU32,
}

impl Upstream {
    /// Answers normally.
    pub fn heal(&self) {
        self.fail_with.store(0, Ordering::SeqCst);
    }

    /// Fails every call with `code`, a stream after `after` tokens (with
    /// `after == 0`, before any: a trailers-only answer).
    pub fn fail(&self, code: Code, after: u32) {
        self.fail_after.store(after, Ordering::SeqCst);
        self.fail_with.store(code as i32, Ordering::SeqCst);
    }

    fn failure(&self) -> Option<(Status, u32)> {
        match Code::from_i32(self.fail_with.load(Ordering::SeqCst)) {
            Code::Ok => None,
            code => Some((
                Status::new(code, format!("demo server: {code:?}")),
                self.fail_after.load(Ordering::SeqCst),
            )),
        }
    }
}

/// The `demo.Llm` service, routed by hand as generated code would.
#[derive(Clone)]
pub struct LlmServer(pub Arc<Upstream>);

impl NamedService for LlmServer {
    const NAME: &'static str = "demo.Llm";
}

impl Service<http::Request<Body>> for LlmServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let upstream = self.0.clone();
        Box::pin(async move {
            upstream.hits.fetch_add(1, Ordering::SeqCst);
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<pb::Token, pb::Prompt>::default());
            Ok(match req.uri().path() {
                "/demo.Llm/Complete" => grpc.unary(Complete(upstream), req).await,
                "/demo.Llm/Generate" => grpc.server_streaming(Generate(upstream), req).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

struct Complete(Arc<Upstream>);

impl UnaryService<pb::Prompt> for Complete {
    type Response = pb::Token;
    type Future = BoxFuture<'static, Result<tonic::Response<pb::Token>, Status>>;

    fn call(&mut self, req: tonic::Request<pb::Prompt>) -> Self::Future {
        let failure = self.0.failure();
        Box::pin(async move {
            if let Some((status, _)) = failure {
                return Err(status);
            }
            let text = format!("echo: {}", req.into_inner().text);
            Ok(tonic::Response::new(pb::Token { text }))
        })
    }
}

struct Generate(Arc<Upstream>);

type TokenStream = BoxStream<'static, Result<pb::Token, Status>>;

impl ServerStreamingService<pb::Prompt> for Generate {
    type Response = pb::Token;
    type ResponseStream = TokenStream;
    type Future = BoxFuture<'static, Result<tonic::Response<TokenStream>, Status>>;

    fn call(&mut self, req: tonic::Request<pb::Prompt>) -> Self::Future {
        let failure = self.0.failure();
        Box::pin(async move {
            let prompt = req.into_inner();
            let token = |i: u32| {
                Ok(pb::Token {
                    text: format!("tok{i} "),
                })
            };
            let stream: TokenStream = match failure {
                // Fails before the first message: trailers only.
                Some((status, 0)) => return Err(status),
                // Fails after some messages: the status is in the trailers.
                Some((status, after)) => futures::stream::iter((0..after).map(token))
                    .chain(futures::stream::once(async move { Err(status) }))
                    .boxed(),
                None => futures::stream::iter((0..prompt.max_tokens).map(token)).boxed(),
            };
            Ok(tonic::Response::new(stream))
        })
    }
}

/// Starts the server on 127.0.0.1:0.
pub async fn spawn_server() -> (SocketAddr, Arc<Upstream>) {
    let upstream = Arc::new(Upstream::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let server = tonic::transport::Server::builder()
        .add_service(LlmServer(upstream.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(async move { server.await.expect("server") });
    (addr, upstream)
}

// === the client ===

/// A hand-written `demo.Llm` client over any gRPC service, such as a
/// channel with a breaker around it.
pub struct LlmClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T> LlmClient<T>
where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    pub fn new(inner: T) -> Self {
        LlmClient {
            inner: tonic::client::Grpc::new(inner),
        }
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unknown(format!("service not ready: {}", e.into())))
    }

    pub async fn complete(&mut self, prompt: pb::Prompt) -> Result<pb::Token, Status> {
        self.ready().await?;
        let path = PathAndQuery::from_static("/demo.Llm/Complete");
        let codec = ProstCodec::<pb::Prompt, pb::Token>::default();
        Ok(self
            .inner
            .unary(tonic::Request::new(prompt), path, codec)
            .await?
            .into_inner())
    }

    pub async fn generate(
        &mut self,
        prompt: pb::Prompt,
    ) -> Result<tonic::Streaming<pb::Token>, Status> {
        self.ready().await?;
        let path = PathAndQuery::from_static("/demo.Llm/Generate");
        let codec = ProstCodec::<pb::Prompt, pb::Token>::default();
        Ok(self
            .inner
            .server_streaming(tonic::Request::new(prompt), path, codec)
            .await?
            .into_inner())
    }
}

/// Turns a rejection into the trailers-only `UNAVAILABLE` answer a gRPC
/// client understands (otherwise tonic reports it as `UNKNOWN`, with the
/// `CircuitOpen` as the status' source).
pub fn open_as_unavailable<B: Default>(
    result: Result<http::Response<B>, tower_circuit_breaker::Error>,
) -> Result<http::Response<B>, tower_circuit_breaker::Error> {
    match result {
        Err(err) => match err.circuit_open() {
            Some(open) => Ok(grpc_unavailable(open)),
            None => Err(err),
        },
        ok => ok,
    }
}

/// A channel to `addr` with a breaker around it: the service the client
/// calls, and the breaker's handle.
pub async fn breaker_channel(
    addr: SocketAddr,
    layer: CircuitBreakerLayer<GrpcClassifier>,
) -> Result<
    (
        impl tonic::client::GrpcService<
                Body,
                ResponseBody = impl http_body::Body<Data = bytes::Bytes, Error = Status>
                                   + Send
                                   + 'static,
                Error = tower_circuit_breaker::Error,
            > + Clone,
        Breaker,
    ),
    BoxError,
> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let breaker = layer.breaker().clone();
    let svc = ServiceBuilder::new()
        .map_result(open_as_unavailable)
        .layer(layer)
        .service(channel);
    Ok((svc, breaker))
}

/// Receives a whole stream of tokens.
pub async fn collect(mut stream: tonic::Streaming<pb::Token>) -> (String, Result<(), Status>) {
    let mut text = String::new();
    loop {
        match stream.message().await {
            Ok(Some(token)) => text.push_str(&token.text),
            Ok(None) => return (text, Ok(())),
            Err(status) => return (text, Err(status)),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (addr, upstream) = spawn_server().await;
    println!("tonic server on {addr}");

    // All or nothing, to show the circuit opening: by default a call
    // without a fallback is graded instead (`TripMode::Graded`).
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .name("demo.Llm")
        .consecutive_failures(3)
        .open_duration(Duration::from_secs(1))
        .probes(2)
        .close_after(2)
        .build()?
        .with_classifier(GrpcClassifier);
    let (channel, breaker) = breaker_channel(addr, layer).await?;
    let mut client = LlmClient::new(channel);
    let prompt = |max_tokens| pb::Prompt {
        text: "hello".into(),
        max_tokens,
    };

    for round in 1..=12 {
        match round {
            3 => {
                println!("-- the server starts failing: UNAVAILABLE after 2 streamed tokens");
                upstream.fail(Code::Unavailable, 2);
            }
            9 => {
                println!("-- the server is back; waiting out the open period");
                upstream.heal();
                tokio::time::sleep(Duration::from_millis(1100)).await;
            }
            _ => {}
        }
        let outcome = match client.generate(prompt(4)).await {
            Ok(stream) => match collect(stream).await {
                (text, Ok(())) => format!("ok: {text:?}"),
                (text, Err(status)) => format!("stream failed after {text:?}: {:?}", status.code()),
            },
            Err(status) => format!("{:?}: {}", status.code(), status.message()),
        };
        let hits = upstream.hits.load(Ordering::SeqCst);
        println!(
            "call {round:2}: {outcome:<50} circuit {}, server calls {hits}",
            breaker.state()
        );
    }

    let unary = client.complete(prompt(0)).await?;
    println!("unary: {:?}", unary.text);
    Ok(())
}
