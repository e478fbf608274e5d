//! Dropping the response future or the response body at every poll point.
//!
//! The inner future and the body return `Pending` several times before each
//! step; a call is dropped after `k` polls, for every `k` from 0 to the
//! number of polls a full read takes. No permit may leak: the lifetime
//! counters balance and a half-open probe slot comes back.
//!
//! The memory test is ignored in the normal run (it measures RSS over a
//! million cycles); run it with
//! `cargo test --release --test cancellation -- --ignored --nocapture`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame};
use tower::Service;
use tower_circuit_breaker::classify::{
    Classify, ClassifyStream, ErrorRef, HttpClassifier, Verdict,
};
use tower_circuit_breaker::{Breaker, CircuitBreaker, Outcome, ResponseBody, State};

/// Pending polls before the head and before each frame.
const PENDING: usize = 3;
const FRAMES: usize = 3;

// === an upstream that makes the caller wait at every step ===

/// Ready after `PENDING` pending polls.
struct Slow<T> {
    left: usize,
    value: Option<T>,
}

impl<T: Unpin> Future for Slow<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if self.left > 0 {
            self.left -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.value.take().expect("polled after completion"))
    }
}

/// `FRAMES` data frames, each after `PENDING` pending polls.
struct SlowBody {
    frames: VecDeque<Bytes>,
    wait: usize,
}

impl Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.frames.is_empty() {
            return Poll::Ready(None);
        }
        if self.wait > 0 {
            self.wait -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.wait = PENDING;
        Poll::Ready(self.frames.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

#[derive(Clone)]
struct Upstream {
    status: StatusCode,
}

impl Service<()> for Upstream {
    type Response = Response<SlowBody>;
    type Error = Infallible;
    type Future = Slow<Result<Response<SlowBody>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        let body = SlowBody {
            frames: (0..FRAMES)
                .map(|i| Bytes::from(vec![b'a' + i as u8; 8]))
                .collect(),
            wait: PENDING,
        };
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        Slow {
            left: PENDING,
            value: Some(Ok(response)),
        }
    }
}

/// Decides at the end of the body: the permit lives in the body.
#[derive(Clone, Copy)]
struct AtEnd;

struct EndStream(StatusCode);

impl Classify for AtEnd {
    type Stream = EndStream;

    fn classify_response(&self, status: StatusCode, _: &HeaderMap) -> Verdict<EndStream> {
        Verdict::Defer(EndStream(status))
    }

    fn classify_error(&self, _: ErrorRef<'_>) -> Outcome {
        Outcome::Failure
    }
}

impl ClassifyStream for EndStream {
    fn on_end(self) -> Outcome {
        if self.0.is_server_error() {
            Outcome::Failure
        } else {
            Outcome::Success
        }
    }
}

// === driving one call ===

/// Polls of a full call: the head, then every frame and the end.
const FULL: usize = (PENDING + 1) + FRAMES * (PENDING + 1) + 1;

enum Stage<F, B> {
    Future(Pin<Box<F>>),
    Body(Pin<Box<B>>),
    Done,
}

/// Makes one call and drops it after `k` polls (or at its end, if that
/// comes first). Returns the polls it took, or `None` if it was rejected.
fn call_and_drop<C>(svc: &mut CircuitBreaker<Upstream, C>, k: usize) -> Option<usize>
where
    C: Classify + Clone,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut stage: Stage<_, ResponseBody<SlowBody, C::Stream>> =
        Stage::Future(Box::pin(svc.call(())));
    let mut polls = 0;
    while polls < k {
        polls += 1;
        stage = match stage {
            Stage::Future(mut f) => match f.as_mut().poll(&mut cx) {
                Poll::Pending => Stage::Future(f),
                Poll::Ready(Ok(r)) => Stage::Body(Box::pin(r.into_body())),
                Poll::Ready(Err(e)) => {
                    assert!(e.is_circuit_open(), "{e}");
                    return None;
                }
            },
            Stage::Body(mut b) => match b.as_mut().poll_frame(&mut cx) {
                Poll::Pending => Stage::Body(b),
                Poll::Ready(Some(_)) => Stage::Body(b),
                Poll::Ready(None) => Stage::Done,
            },
            Stage::Done => unreachable!(),
        };
        if matches!(stage, Stage::Done) {
            break;
        }
    }
    drop(stage);
    Some(polls)
}

fn assert_balanced(b: &Breaker) {
    let c = b.snapshot().counters;
    assert_eq!(
        c.admitted,
        c.successes + c.failures + c.ignored + c.rate_limited + c.dropped,
        "a permit leaked: {c:?}"
    );
}

fn closed() -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .counter_stripes(1)
        .build()
        .unwrap()
}

/// Half-open with one probe slot: the circuit opened on one failure and
/// stays open for 1ns.
fn half_open() -> Breaker {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_nanos(1))
        .max_open_duration(Duration::from_nanos(1))
        .probe_timeout(Duration::from_secs(3600))
        .probes(1)
        .close_after(1)
        .jitter(0.0)
        .counter_stripes(1)
        .build()
        .unwrap();
    b.admit().unwrap().record(Outcome::Failure);
    b
}

fn every_drop_point<C: Classify + Clone>(classifier: C) {
    let ok = Upstream {
        status: StatusCode::OK,
    };
    for k in 0..=FULL {
        // Closed: every permit is recorded or released.
        let b = closed();
        let mut svc = CircuitBreaker::with_classifier(ok.clone(), b.clone(), classifier.clone());
        let polls = call_and_drop(&mut svc, k).expect("closed circuits admit");
        assert!(polls <= k);
        assert_balanced(&b);
        let c = b.snapshot().counters;
        assert_eq!(c.admitted, 1);

        // Half-open: a probe dropped before its verdict gives its one slot
        // back; one that got its verdict closed the circuit.
        let b = half_open();
        let mut svc = CircuitBreaker::with_classifier(ok.clone(), b.clone(), classifier.clone());
        call_and_drop(&mut svc, k).expect("the probe slot is free");
        assert_balanced(&b);
        let c = b.snapshot().counters;
        match b.state() {
            State::Closed => assert_eq!(c.successes, 1, "k = {k}: {c:?}"),
            State::HalfOpen => {
                assert_eq!(c.successes, 0, "k = {k}: {c:?}");
                let again = b.admit().expect("the dropped probe's slot came back");
                assert!(again.is_probe());
            }
            s => panic!("k = {k}: {s:?}"),
        }
    }
}

#[test]
fn dropping_a_call_decided_on_its_head_at_any_poll_leaks_no_permit() {
    every_drop_point(HttpClassifier);
}

#[test]
fn dropping_a_call_decided_at_the_end_of_its_body_at_any_poll_leaks_no_permit() {
    every_drop_point(AtEnd);
}

#[test]
fn a_body_dropped_before_its_end_keeps_its_probe_only_until_the_drop() {
    // The permit lives in the body while the classifier waits for the end.
    let b = half_open();
    let mut svc = CircuitBreaker::with_classifier(
        Upstream {
            status: StatusCode::OK,
        },
        b.clone(),
        AtEnd,
    );
    let mut cx = Context::from_waker(Waker::noop());
    let mut fut = Box::pin(svc.call(()));
    let body = loop {
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            break r.unwrap().into_body();
        }
    };
    assert!(body.is_pending());
    assert!(b.admit().is_err(), "the one slot is held by the body");
    drop(body);
    assert!(b.admit().unwrap().is_probe());
    assert_eq!(b.state(), State::HalfOpen);
}

// === memory over a million cycles ===

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

#[test]
#[ignore = "measures RSS over a million cycles; run in release with --ignored --nocapture"]
fn memory_stays_flat_over_a_million_cancelled_calls_and_transitions() {
    const CYCLES: usize = 1_000_000;
    let b = half_open();
    let mut ok = CircuitBreaker::with_classifier(
        Upstream {
            status: StatusCode::OK,
        },
        b.clone(),
        AtEnd,
    );
    let mut bad = CircuitBreaker::with_classifier(
        Upstream {
            status: StatusCode::SERVICE_UNAVAILABLE,
        },
        b.clone(),
        AtEnd,
    );
    // Cycle the circuit through closed, open and half-open while dropping
    // calls at every point: a failure every 7th call trips it (it reopens
    // after 1ns), a success closes it again.
    let mut run = |n: usize| {
        for i in 0..n {
            let svc = if i % 7 == 0 { &mut bad } else { &mut ok };
            let _ = call_and_drop(svc, i % (FULL + 1));
        }
    };
    run(100_000); // warm up allocator pools
    let before = rss_kib();
    let c0 = b.snapshot().counters;
    run(CYCLES);
    let after = rss_kib();
    let c = b.snapshot().counters;
    assert_balanced(&b);
    eprintln!(
        "{CYCLES} cycles: VmRSS {before} KiB -> {after} KiB ({:+} KiB); \
         admitted {}, rejected {}, dropped {}, successes {}, failures {}",
        after as i64 - before as i64,
        c.admitted - c0.admitted,
        c.rejected - c0.rejected,
        c.dropped - c0.dropped,
        c.successes - c0.successes,
        c.failures - c0.failures,
    );
    assert!(
        after < before + 4 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
}
