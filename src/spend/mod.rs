//! A spend guard: a breaker rule that trips on money (or tokens).
//!
//! A [`SpendGuard`] is a budget per [`Period`] — $50 per rolling hour per
//! API key, $500 per UTC day per model — set on a breaker or on every key of
//! a keyed set with [`Builder::spend_guard`](crate::Builder::spend_guard).
//! Each call is charged what it cost as it completes; once the period's
//! calls cost the budget, calls are rejected at once with
//! [`Rejection::SpendExceeded`](crate::Rejection::SpendExceeded) (its
//! [`SpendExceeded`] says which budget, what was spent, when it resets)
//! until the budget resets. No layer of this crate retries that rejection:
//! [`RetryPolicy`](crate::RetryPolicy) never does and
//! [`Failover`](crate::Failover) returns it instead of trying the next
//! member; [`response::rejected`](crate::response::rejected) answers it as
//! a `402` with a JSON body the common SDKs do not retry, and tonic as
//! `PERMISSION_DENIED`.
//!
//! # What a call costs
//!
//! The [`Meter`] classifier wraps another (say
//! [`LlmClassifier`](crate::classify::LlmClassifier)) and reads the
//! [`Usage`] of each 2xx answer: the `usage` of an OpenAI (Chat
//! Completions, Responses) or Anthropic JSON answer, Gemini's
//! `usageMetadata`, or the usage events of a server-sent-event stream
//! (OpenAI's final chunk, Anthropic's `message_start` and `message_delta`,
//! Gemini's last chunk, the Responses API's `response.completed`). OpenAI
//! streams carry usage only when the request asks for it with
//! `"stream_options": {"include_usage": true}`; without it, the stream's
//! calls are charged as calls of unknown usage. [`Prices`] turn the usage
//! into millionths of a dollar (input, output and cached-input prices per
//! model, and a closure for anything else), or count its tokens.
//!
//! - An answer that is not a 2xx costs nothing (providers bill answers,
//!   not errors).
//! - A call whose usage never arrives — a hang, a reset, a cancelled call,
//!   a hedge loser, a body too long to read, a `usage` that does not parse
//!   — is charged its model's [`Price::unknown_cost`] when the model is
//!   known, else the guard's [`SpendGuard::unknown_cost`], by default the
//!   running average of the breaker's observed calls.
//! - [`Permit::charge`](crate::Permit::charge) charges a call by hand
//!   (with a bare [`Breaker`](crate::Breaker)).
//!
//! # Overshoot
//!
//! The guard decides at admission and charges at completion: calls in
//! flight when the budget runs out still complete and are charged, so a
//! period's spend stays below the budget plus the calls in flight at the
//! crossing times the largest cost of one call.
//!
//! With several replicas sharing state through Redis (feature `redis`, see
//! [`crate::redis`]), the replicas share one budget: each hands its charges
//! to Redis off the hot path at every exchange, and decides on the fleet's
//! sum. The spend of a period then stays below the budget plus (the calls
//! in flight when it runs out + the calls the fleet admits in one exchange
//! interval) times the largest cost of one call, across the fleet. While
//! Redis is away, each replica holds the budget on its own calls.
//!
//! # Health probes
//!
//! A [`HealthProbe`](crate::health::HealthProbe) classified by a [`Meter`]
//! is charged what its answer's usage reports (a one-token completion
//! costs its tokens), so the budget counts what the provider bills. A
//! probe is the breaker's own request, not a user's call: the guard never
//! turns it away, it is not counted in
//! [`Spend::observed_calls`](crate::spend::Spend::observed_calls) nor in
//! the running average, and a probe whose usage never comes (a timeout, an
//! answer without `usage`) costs nothing rather than the unknown cost of a
//! user's call.
//!
//! # Shadow mode and warnings
//!
//! [`SpendGuard::shadow`] rejects nothing and counts what it would have
//! rejected; [`SpendGuard::warn_at`] logs a warning (and, with the
//! `metrics` feature, counts one) once a period when the spend reaches a
//! share of the budget. [`Snapshot::spend`](crate::Snapshot::spend) shows
//! the budget and the period's spend.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::BodyExt;
//! use tower::{Layer, ServiceExt};
//! use tower_circuit_breaker::classify::LlmClassifier;
//! use tower_circuit_breaker::spend::{Meter, Period, Price, Prices, SpendGuard};
//! use tower_circuit_breaker::{CircuitBreakerLayer, Rejection};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     let body = r#"{"model":"gpt-4o","usage":{"prompt_tokens":100000,"completion_tokens":80000}}"#;
//!     Ok::<_, std::convert::Infallible>(http::Response::new(body.to_string()))
//! });
//! let prices = Prices::new().model("gpt-4o", Price::per_million(2.50, 10.00, 1.25));
//! let layer = CircuitBreakerLayer::builder()
//!     .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::Rolling(Duration::from_secs(3600))))
//!     .build()
//!     .unwrap()
//!     .with_classifier(Meter::new(LlmClassifier::new(), prices));
//! let breaker = layer.breaker().clone();
//! let service = layer.layer(upstream);
//! // $0.25 + $0.80 = $1.05: this call crosses the $1 budget, and completes.
//! let res = service.clone().oneshot(http::Request::new(String::new())).await.unwrap();
//! res.into_body().collect().await.unwrap();
//! assert_eq!(breaker.snapshot().spend.unwrap().spent, 1_050_000);
//! // The next is rejected at once.
//! let err = service.oneshot(http::Request::new(String::new())).await.unwrap_err();
//! assert_eq!(err.circuit_open().unwrap().reason(), Rejection::SpendExceeded);
//! # }
//! ```

use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, StatusCode};

use crate::classify::{Classify, ClassifyStream, ErrorRef, Outcome, SseScanner, Verdict};

mod price;
mod usage;

pub use self::price::{Price, Prices};
pub use self::usage::Usage;
pub use crate::breaker::spend::{Charge, Period, Spend, SpendExceeded, SpendGuard, Unit};

use self::usage::UsageReader;

/// How much of a JSON answer [`Meter`] reads for its usage by default.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// A classifier that also reads what each call cost (see the
/// [module docs](self)); it leaves the outcomes to the classifier it wraps.
///
/// A 2xx JSON answer, which most classifiers decide on its head, is held
/// until its body ends so that its `usage` can be read (the first
/// [`max_body`](Self::max_body) bytes of it; a longer body is charged as a
/// call of unknown usage).
///
/// ```
/// use tower_circuit_breaker::classify::LlmClassifier;
/// use tower_circuit_breaker::spend::{Meter, Prices};
///
/// let meter = Meter::new(LlmClassifier::new(), Prices::tokens()).max_body(64 * 1024);
/// # let _ = meter;
/// ```
#[derive(Debug, Clone)]
pub struct Meter<C> {
    inner: C,
    prices: Arc<Prices>,
    max_body: usize,
}

impl<C> Meter<C> {
    /// Meters the calls `inner` classifies, priced by `prices`.
    pub fn new(inner: C, prices: Prices) -> Self {
        Meter {
            inner,
            prices: Arc::new(prices),
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// Reads at most `max` bytes of a JSON answer for its usage.
    #[must_use]
    pub fn max_body(mut self, max: usize) -> Self {
        self.max_body = max;
        self
    }

    /// The wrapped classifier.
    pub fn get_ref(&self) -> &C {
        &self.inner
    }

    /// The price table.
    pub fn prices(&self) -> &Prices {
        &self.prices
    }
}

impl<C: Classify> Classify for Meter<C> {
    type Stream = Metered<C::Stream>;

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<Self::Stream> {
        let verdict = self.inner.classify_response(status, headers);
        let reader = if !status.is_success() {
            Reader::Free
        } else if is_event_stream(headers) {
            Reader::Sse(Box::new((SseScanner::new(), UsageReader::default())))
        } else {
            Reader::Json(Vec::new(), false)
        };
        let inner = match verdict {
            Verdict::Defer(stream) => Inner::Stream(stream),
            Verdict::Done(outcome) if !matches!(reader, Reader::Free) => Inner::Decided(outcome),
            Verdict::Done(outcome) => return Verdict::Done(outcome),
        };
        Verdict::Defer(Metered {
            inner,
            reader,
            prices: self.prices.clone(),
            max_body: self.max_body,
        })
    }

    fn classify_error(&self, error: ErrorRef<'_>) -> Outcome {
        self.inner.classify_error(error)
    }

    fn head_outcome(&self, status: StatusCode, headers: &HeaderMap) -> Outcome {
        self.inner.head_outcome(status, headers)
    }

    fn announced_wait(&self, headers: &HeaderMap) -> Option<std::time::Duration> {
        self.inner.announced_wait(headers)
    }

    fn pacing_wait(&self, headers: &HeaderMap) -> Option<std::time::Duration> {
        self.inner.pacing_wait(headers)
    }
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.as_bytes().get(..17))
        .is_some_and(|v| v.eq_ignore_ascii_case(b"text/event-stream"))
}

/// The stream classifier of [`Meter`]: the wrapped classifier's verdict,
/// and the usage the body reports.
#[derive(Debug)]
pub struct Metered<S> {
    inner: Inner<S>,
    reader: Reader,
    prices: Arc<Prices>,
    max_body: usize,
}

#[derive(Debug)]
enum Inner<S> {
    Stream(S),
    /// The wrapped classifier decided on the head.
    Decided(Outcome),
}

#[derive(Debug)]
enum Reader {
    /// Not a 2xx: nothing to charge.
    Free,
    /// Boxed: a scanner is large, and allocates its buffers anyway.
    Sse(Box<(SseScanner, UsageReader)>),
    /// The body so far, and whether it outgrew the limit.
    Json(Vec<u8>, bool),
}

impl<S: ClassifyStream> Metered<S> {
    fn read(&mut self, chunk: &[u8]) {
        match &mut self.reader {
            Reader::Free => {}
            Reader::Sse(sse) => {
                let (scanner, usage) = &mut **sse;
                scanner.feed(chunk, |event| {
                    usage.read(event.data());
                    None
                });
            }
            Reader::Json(buf, over) => {
                if *over {
                    return;
                }
                if buf.len().saturating_add(chunk.len()) > self.max_body {
                    *over = true;
                    *buf = Vec::new();
                } else {
                    buf.extend_from_slice(chunk);
                }
            }
        }
    }
}

impl<S: ClassifyStream> ClassifyStream for Metered<S> {
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        self.read(chunk);
        match &mut self.inner {
            Inner::Stream(s) => s.on_data(chunk),
            Inner::Decided(_) => None,
        }
    }

    fn on_trailers(&mut self, trailers: &HeaderMap) -> Option<Outcome> {
        match &mut self.inner {
            Inner::Stream(s) => s.on_trailers(trailers),
            Inner::Decided(_) => None,
        }
    }

    fn on_end(self) -> Outcome {
        match self.inner {
            Inner::Stream(s) => s.on_end(),
            Inner::Decided(o) => o,
        }
    }

    fn on_error(self) -> Outcome {
        match self.inner {
            Inner::Stream(s) => s.on_error(),
            Inner::Decided(_) => Outcome::Failure,
        }
    }

    fn announced_reset(&self) -> Option<std::time::Duration> {
        match &self.inner {
            Inner::Stream(s) => s.announced_reset(),
            Inner::Decided(_) => None,
        }
    }

    fn on_drop(self) -> Outcome {
        match self.inner {
            Inner::Stream(s) => s.on_drop(),
            Inner::Decided(o) => o,
        }
    }

    fn charge(&mut self) -> Charge {
        match &mut self.reader {
            Reader::Free => Charge::Free,
            Reader::Sse(sse) => {
                let (scanner, usage) = &mut **sse;
                // An event the stream ended inside of still counts.
                scanner.finish(|event| {
                    usage.read(event.data());
                    None
                });
                self.prices.charge(usage.usage().as_ref(), usage.model())
            }
            Reader::Json(_, true) => Charge::Unknown,
            Reader::Json(buf, false) => {
                let mut usage = UsageReader::default();
                usage.read(buf);
                self.prices.charge(usage.usage().as_ref(), usage.model())
            }
        }
    }
}

/// Reads the usage of a JSON answer and the events of a stream, for the
/// fuzz targets: never panics, whatever the bytes.
#[doc(hidden)]
#[must_use]
pub fn read_usage(json: &[u8], sse: &[u8]) -> (Option<Usage>, Option<Usage>) {
    let whole = Usage::from_json(json);
    let mut scanner = SseScanner::new();
    let mut usage = UsageReader::default();
    for chunk in sse.chunks(7) {
        scanner.feed(chunk, |event| {
            usage.read(event.data());
            None
        });
    }
    scanner.finish(|event| {
        usage.read(event.data());
        None
    });
    (whole, usage.usage())
}

#[cfg(test)]
mod tests;
