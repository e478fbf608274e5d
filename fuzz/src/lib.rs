//! Pieces shared by the fuzz targets: header maps and response bodies built
//! from fuzz input, and a driver that pushes one response through the
//! breaker's tower service and checks what must hold for any input.
//!
//! A target for a new parser or stream classifier is one small file in
//! `fuzz_targets/` that calls [`headers`] or [`drive`] with it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame};
use tower_circuit_breaker::classify::Classify;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Outcome};
use tower_service::Service;

/// Header names the classifiers read, and some they don't.
pub const NAMES: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "grpc-status",
    "grpc-message",
    "content-type",
    "x-other",
    "grpc-retry-pushback-ms",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
];

/// One header line: a name picked from [`NAMES`] and raw value bytes.
#[derive(Debug, Clone, Arbitrary)]
pub struct RawHeader {
    pub name: u8,
    pub value: Vec<u8>,
}

/// The header map an HTTP stack could hand over for these lines: values
/// that `http` refuses (control characters) are left out, repeats kept.
pub fn headers(raw: &[RawHeader]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for h in raw {
        let name = HeaderName::from_static(NAMES[usize::from(h.name) % NAMES.len()]);
        if let Ok(value) = HeaderValue::from_bytes(&h.value) {
            map.append(name, value);
        }
    }
    map
}

/// `data` cut at the fuzz-chosen points `cuts` (each taken modulo the
/// length + 1, so any point can be picked); repeated points give empty
/// chunks, which a stream must take in its stride.
pub fn split<'a>(data: &'a [u8], cuts: &[u16]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) % (data.len() + 1))
        .collect();
    points.sort_unstable();
    let mut chunks = Vec::with_capacity(points.len() + 1);
    let mut start = 0;
    for p in points {
        chunks.push(&data[start..p]);
        start = p;
    }
    chunks.push(&data[start..]);
    chunks
}

/// The outcome a breaker's counters say its only call was recorded with
/// (without a `retry_after`, which counters do not keep).
pub fn recorded(breaker: &Breaker) -> Outcome {
    let c = breaker.snapshot().counters;
    match (
        c.successes,
        c.failures,
        c.ignored,
        c.rate_limited,
        c.quota_exhausted,
    ) {
        (1, 0, 0, 0, 0) => Outcome::Success,
        (0, 1, 0, 0, 0) => Outcome::Failure,
        (0, 0, 1, 0, 0) => Outcome::Ignored,
        (0, 0, 0, 1, 0) => Outcome::RateLimited { retry_after: None },
        (0, 0, 0, 0, 1) => Outcome::QuotaExhausted,
        _ => panic!("not recorded exactly once: {c:?}"),
    }
}

/// `outcome` without its `retry_after`, to compare with [`recorded`].
pub fn kind(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::RateLimited { .. } => Outcome::RateLimited { retry_after: None },
        other => other,
    }
}

/// What the upstream's body does on one poll.
#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    Data(Vec<u8>),
    Trailers(Vec<RawHeader>),
    Error,
    /// Not ready yet (wakes itself at once).
    Pending,
}

/// The body error of a [`Step::Error`].
#[derive(Debug)]
pub struct BodyError;

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("body broke")
    }
}

impl std::error::Error for BodyError {}

/// A body that plays its steps, one per poll; it reports its end as soon as
/// no step is left.
#[derive(Debug)]
pub struct ScriptBody {
    steps: VecDeque<Step>,
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Poll::Ready(match self.steps.pop_front() {
            None => None,
            Some(Step::Pending) => {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Some(Step::Data(d)) => Some(Ok(Frame::data(Bytes::from(d)))),
            Some(Step::Trailers(t)) => Some(Ok(Frame::trailers(headers(&t)))),
            Some(Step::Error) => Some(Err(BodyError)),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.steps.is_empty()
    }
}

/// One response, as fuzz input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Exchange {
    pub status: u16,
    pub headers: Vec<RawHeader>,
    pub steps: Vec<Step>,
    /// Drop the body after this many polls (before its end, if it has not
    /// ended by then).
    pub drop_after: Option<u8>,
}

impl Exchange {
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(100 + self.status % 500).expect("100..=599 is valid")
    }
}

/// A frame the caller saw.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Data(Vec<u8>),
    Trailers(HeaderMap),
    Error,
}

/// An upstream that answers once, at once.
struct Once(Option<Response<ScriptBody>>);

impl Service<()> for Once {
    type Response = Response<ScriptBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<ScriptBody>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        ready(Ok(self.0.take().expect("called once")))
    }
}

/// Sends `ex` through a [`CircuitBreaker`] classifying with `classifier`,
/// reads the body as `ex` says (dropping it early if asked) and checks that:
///
/// - frames, data and errors reach the caller unchanged and in order;
/// - the call's permit is recorded exactly once (never left unrecorded or
///   recorded twice), whatever the chunking and wherever the body is dropped.
///
/// Returns the breaker (for its counters) and the frames seen.
pub fn drive<C>(classifier: C, ex: &Exchange) -> (Breaker, Vec<Seen>)
where
    C: Classify + Clone,
{
    let breaker = Breaker::builder().counter_stripes(1).build().unwrap();
    let mut response = Response::new(ScriptBody {
        steps: ex.steps.iter().cloned().collect(),
    });
    *response.status_mut() = ex.status();
    *response.headers_mut() = headers(&ex.headers);

    let mut svc =
        CircuitBreaker::with_classifier(Once(Some(response)), breaker.clone(), classifier);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let response = match pin!(svc.call(())).poll(&mut cx) {
        Poll::Ready(r) => r.expect("the upstream answered and the circuit is closed"),
        Poll::Pending => unreachable!("the upstream answers at once"),
    };
    assert_eq!(response.status(), ex.status());

    let mut body = Box::pin(response.into_body());
    let mut seen = Vec::new();
    let mut polls = 0u32;
    let ended = loop {
        if ex.drop_after.is_some_and(|n| u32::from(n) == polls) {
            break false;
        }
        polls += 1;
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Pending => {}
            Poll::Ready(None) => break true,
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => seen.push(Seen::Data(data.to_vec())),
                Err(frame) => seen.push(Seen::Trailers(
                    frame.into_trailers().expect("a frame is data or trailers"),
                )),
            },
            Poll::Ready(Some(Err(BodyError))) => seen.push(Seen::Error),
        }
    };
    drop(body);

    let sent: Vec<Seen> = ex
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Data(d) => Some(Seen::Data(d.clone())),
            Step::Trailers(t) => Some(Seen::Trailers(headers(t))),
            Step::Error => Some(Seen::Error),
            Step::Pending => None,
        })
        .collect();
    if ended {
        assert_eq!(seen, sent, "the body changed the frames");
    } else {
        assert_eq!(seen[..], sent[..seen.len()], "the body changed the frames");
    }

    let c = breaker.snapshot().counters;
    assert_eq!(c.admitted, 1);
    assert_eq!(c.dropped, 0, "the permit was dropped unrecorded");
    assert_eq!(
        c.successes + c.failures + c.ignored + c.rate_limited + c.quota_exhausted,
        1,
        "recorded exactly once: {c:?}"
    );
    (breaker, seen)
}
