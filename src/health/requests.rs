//! Ready-made health probe requests: OpenAI-compatible APIs, Anthropic's
//! Messages API and gRPC health.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, StatusCode};

use crate::breaker::{Breaker, Outcome};
use crate::classify::{Classify, ClassifyStream, ErrorRef, Verdict};

/// A one-token chat completion for an OpenAI-compatible API at `base` (for
/// example `https://api.openai.com/v1`): the faithful probe, at the price of
/// one output token. The key goes into the `Authorization` header only.
///
/// # Errors
///
/// An [`http::Error`] when `base` (joined with the path) is not a valid URI or
/// a header value (the API key, say) is not a valid header value.
///
/// ```
/// use tower_circuit_breaker::health::openai_completion_request;
///
/// let req: http::Request<bytes::Bytes> =
///     openai_completion_request("http://127.0.0.1:8080/v1", "sk-test", "gpt-4o-mini").unwrap();
/// assert_eq!(req.uri().path(), "/v1/chat/completions");
/// assert!(std::str::from_utf8(req.body()).unwrap().contains("\"max_tokens\":1"));
/// ```
pub fn openai_completion_request<B: From<Bytes>>(
    base: &str,
    api_key: &str,
    model: &str,
) -> Result<Request<B>, http::Error> {
    Request::post(format!("{}/chat/completions", base.trim_end_matches('/')))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::AUTHORIZATION, bearer(api_key)?)
        .body(B::from(one_token_body(model)))
}

/// A one-token message for Anthropic's Messages API at `base` (for example
/// `https://api.anthropic.com/v1`): `POST {base}/messages` with
/// `max_tokens: 1`, at the price of one output token. The key goes into the
/// `x-api-key` header only (marked sensitive), beside
/// `anthropic-version: 2023-06-01`.
///
/// # Errors
///
/// An [`http::Error`] when `base` (joined with the path) is not a valid URI or
/// a header value (the API key, say) is not a valid header value.
///
/// ```
/// use tower_circuit_breaker::health::anthropic_messages_request;
///
/// let req: http::Request<bytes::Bytes> =
///     anthropic_messages_request("http://127.0.0.1:8080/v1", "sk-ant-test", "claude-3-5-haiku-latest")
///         .unwrap();
/// assert_eq!(req.uri().path(), "/v1/messages");
/// assert_eq!(req.headers()["anthropic-version"], "2023-06-01");
/// assert!(req.headers()["x-api-key"].is_sensitive());
/// let body = std::str::from_utf8(req.body()).unwrap();
/// assert!(body.contains("\"model\":\"claude-3-5-haiku-latest\"") && body.contains("\"max_tokens\":1"));
/// ```
pub fn anthropic_messages_request<B: From<Bytes>>(
    base: &str,
    api_key: &str,
    model: &str,
) -> Result<Request<B>, http::Error> {
    let mut key = HeaderValue::try_from(api_key)?;
    key.set_sensitive(true);
    Request::post(format!("{}/messages", base.trim_end_matches('/')))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .body(B::from(one_token_body(model)))
}

/// `{"model":…,"max_tokens":1,"messages":[…"ping"]}`, which OpenAI's chat
/// completions and Anthropic's messages both take.
fn one_token_body(model: &str) -> Bytes {
    let mut body = String::from("{\"model\":\"");
    for c in model.chars() {
        match c {
            '"' => body.push_str("\\\""),
            '\\' => body.push_str("\\\\"),
            c if c.is_control() => {}
            c => body.push(c),
        }
    }
    body.push_str("\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"ping\"}]}");
    Bytes::from(body)
}

/// The health request a [`Stack`](crate::stack::Stack) sends: one request
/// (any of the ready-made ones, built once) sent as it is for every probe,
/// or a function of the breaker probed (whose
/// [`name`](crate::Breaker::name) is the key in a keyed stack), to probe
/// each key's own model.
///
/// ```
/// use bytes::Bytes;
/// use tower_circuit_breaker::health::{openai_completion_request, MakeHealthRequest};
/// use tower_circuit_breaker::Breaker;
///
/// let breaker = Breaker::builder().name("gpt-4o").build().unwrap();
/// // One request for every probe:
/// let one: http::Request<Bytes> = openai_completion_request("http://127.0.0.1:9/v1", "sk-test", "gpt-4o")?;
/// assert_eq!(one.make(&breaker).uri().path(), "/v1/chat/completions");
/// // Or one per key, the model named by the key:
/// let per_key = |b: &Breaker| {
///     openai_completion_request("http://127.0.0.1:9/v1", "sk-test", b.name().unwrap_or("")).unwrap()
/// };
/// let req: http::Request<Bytes> = per_key.make(&breaker);
/// assert!(std::str::from_utf8(req.body()).unwrap().contains("gpt-4o"));
/// # Ok::<_, http::Error>(())
/// ```
pub trait MakeHealthRequest: Send + Sync + 'static {
    /// The request that probes `breaker`'s upstream.
    fn make(&self, breaker: &Breaker) -> Request<Bytes>;
}

impl MakeHealthRequest for Request<Bytes> {
    fn make(&self, _: &Breaker) -> Request<Bytes> {
        let mut req = Request::new(self.body().clone());
        *req.method_mut() = self.method().clone();
        *req.uri_mut() = self.uri().clone();
        *req.version_mut() = self.version();
        *req.headers_mut() = self.headers().clone();
        req
    }
}

impl<F> MakeHealthRequest for F
where
    F: Fn(&Breaker) -> Request<Bytes> + Send + Sync + 'static,
{
    fn make(&self, breaker: &Breaker) -> Request<Bytes> {
        self(breaker)
    }
}

/// `GET {base}/models` for an OpenAI-compatible API: free, but it can stay
/// 200 while completions fail (see the [module docs](crate::health)).
///
/// # Errors
///
/// An [`http::Error`] when `base` (joined with the path) is not a valid URI or
/// a header value (the API key, say) is not a valid header value.
///
/// ```
/// use tower_circuit_breaker::health::openai_models_request;
///
/// let req: http::Request<bytes::Bytes> = openai_models_request("http://127.0.0.1:8080/v1/", "sk-test").unwrap();
/// assert_eq!(req.uri().path(), "/v1/models");
/// ```
pub fn openai_models_request<B: From<Bytes>>(
    base: &str,
    api_key: &str,
) -> Result<Request<B>, http::Error> {
    Request::get(format!("{}/models", base.trim_end_matches('/')))
        .header(http::header::AUTHORIZATION, bearer(api_key)?)
        .body(B::from(Bytes::new()))
}

fn bearer(api_key: &str) -> Result<HeaderValue, http::Error> {
    let mut value = HeaderValue::try_from(format!("Bearer {api_key}"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// `grpc.health.v1.Health/Check` for `service` (empty: the whole server) at
/// `base` (for example `http://127.0.0.1:50051`), to be classified by
/// [`GrpcHealthClassifier`].
///
/// # Errors
///
/// An [`http::Error`] when `base` (joined with the path) is not a valid URI.
///
/// ```
/// use tower_circuit_breaker::health::grpc_health_request;
///
/// let req: http::Request<bytes::Bytes> = grpc_health_request("http://127.0.0.1:50051", "").unwrap();
/// assert_eq!(req.uri().path(), "/grpc.health.v1.Health/Check");
/// assert_eq!(&req.body()[..], &[0, 0, 0, 0, 0]);
/// ```
pub fn grpc_health_request<B: From<Bytes>>(
    base: &str,
    service: &str,
) -> Result<Request<B>, http::Error> {
    // HealthCheckRequest { string service = 1; } in one uncompressed frame.
    let mut message = BytesMut::new();
    if !service.is_empty() {
        message.put_u8(0x0a);
        let mut n = service.len();
        while n >= 0x80 {
            message.put_u8(u8::try_from(n & 0x7f).unwrap_or(0) | 0x80);
            n >>= 7;
        }
        message.put_u8(u8::try_from(n).unwrap_or(0x7f));
        message.put_slice(service.as_bytes());
    }
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    frame.put_slice(&message);
    Request::post(format!(
        "{}/grpc.health.v1.Health/Check",
        base.trim_end_matches('/')
    ))
    .header(http::header::CONTENT_TYPE, "application/grpc")
    .header(http::header::TE, "trailers")
    .body(B::from(frame.freeze()))
}

/// Judges a `grpc.health.v1.Health/Check` answer: a success only when the
/// call ended with `grpc-status: 0` *and* its message says `SERVING`
/// (`NOT_SERVING` and `UNKNOWN` come with status 0 too).
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_circuit_breaker::classify::{Classify, ClassifyStream, Verdict};
/// use tower_circuit_breaker::health::GrpcHealthClassifier;
/// use tower_circuit_breaker::Outcome;
///
/// let Verdict::Defer(mut stream) = GrpcHealthClassifier.classify_response(StatusCode::OK, &HeaderMap::new()) else {
///     unreachable!()
/// };
/// stream.on_data(&[0, 0, 0, 0, 2, 0x08, 0x02]); // NOT_SERVING
/// let mut trailers = HeaderMap::new();
/// trailers.insert("grpc-status", "0".parse().unwrap());
/// assert_eq!(stream.on_trailers(&trailers), Some(Outcome::Failure));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcHealthClassifier;

/// The end-of-stream half of [`GrpcHealthClassifier`].
#[derive(Debug, Default)]
pub struct GrpcHealthStream {
    /// The first bytes of the body: the frame header and the status field.
    head: [u8; 7],
    len: usize,
}

impl GrpcHealthStream {
    fn serving(&self) -> bool {
        // Uncompressed, field 1 (varint) = 1 (SERVING).
        self.len == self.head.len()
            && self.head[0] == 0
            && self.head[5] == 0x08
            && self.head[6] == 1
    }
}

impl Classify for GrpcHealthClassifier {
    type Stream = GrpcHealthStream;

    fn classify_response(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Verdict<GrpcHealthStream> {
        if status != StatusCode::OK || headers.contains_key("grpc-status") {
            // An HTTP error, or a trailers-only answer: no message, so no
            // SERVING whatever its status.
            return Verdict::Done(Outcome::Failure);
        }
        Verdict::Defer(GrpcHealthStream::default())
    }

    fn classify_error(&self, _: ErrorRef<'_>) -> Outcome {
        Outcome::Failure
    }
}

impl ClassifyStream for GrpcHealthStream {
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        let take = (self.head.len() - self.len).min(chunk.len());
        self.head[self.len..self.len + take].copy_from_slice(&chunk[..take]);
        self.len += take;
        None
    }

    fn on_trailers(&mut self, trailers: &HeaderMap) -> Option<Outcome> {
        let ok = trailers.get("grpc-status").is_some_and(|s| s == "0");
        Some(if ok && self.serving() {
            Outcome::Success
        } else {
            Outcome::Failure
        })
    }

    fn on_end(self) -> Outcome {
        // A gRPC answer without trailers is broken.
        Outcome::Failure
    }
}
