//! The stack helper: its defaults, the pieces it refuses, and the order of
//! its layers as seen from the outside.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::stack::StackError;
use tower_circuit_breaker::{
    BoxError, Breaker, CircuitOpen, ConfigError, Outcome, Rejection, State,
};

fn counted(
    status: u16,
    calls: &Arc<AtomicU32>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + use<> {
    let calls = Arc::clone(calls);
    tower::service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::builder()
            .status(status)
            .body(String::new())
            .unwrap()))
    })
}

fn hanging(
    calls: &Arc<AtomicU32>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + use<> {
    let calls = Arc::clone(calls);
    tower::service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending()
    })
}

fn stack_error(result: Result<impl std::fmt::Debug, StackError>) -> &'static str {
    match result {
        Err(StackError::Misfit(why)) => why,
        other => panic!("expected a stack error, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn defaults_follow_the_design_numbers() {
    let layer = Stack::builder().build().unwrap();
    assert_eq!(layer.attempt_timeout(), Duration::from_secs(60));
    assert_eq!(layer.total_timeout(), None);
    let breaker = layer.breaker();

    // A window of 20 calls at 50 %: 19 calls never trip, the 20th does.
    for i in 0..19 {
        breaker.admit().unwrap().record(if i % 2 == 0 {
            Outcome::Failure
        } else {
            Outcome::Success
        });
    }
    assert_eq!(breaker.state(), State::Closed);
    breaker.admit().unwrap().record(Outcome::Success);
    // 10 failures in 20 calls fire the rule. Graded by default: with 10
    // accepts in 20 requests and K = 5, a call without a fallback is still
    // admitted; one with a fallback is rejected and opens the circuit.
    assert_eq!(breaker.state(), State::Closed, "graded, not open");
    let shed = breaker.snapshot().shed.expect("the rule fired: grading");
    assert_eq!(
        (shed.requests, shed.accepts, shed.probability),
        (20, 10, 0.0)
    );
    let rejected = breaker.admit_with_fallback().unwrap_err();
    assert_eq!(rejected.reason(), Rejection::Open);
    assert_eq!(breaker.state(), State::Open, "10 failures in 20 calls");

    // Open for 30 s (less up to 10 % jitter).
    let wait = breaker.admit().unwrap_err().retry_after().unwrap();
    assert!(
        wait <= Duration::from_secs(30) && wait >= Duration::from_secs(27),
        "{wait:?}"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;

    // Then 3 probes, of which 2 must succeed.
    let probes: Vec<_> = (0..3).map(|_| breaker.admit().unwrap()).collect();
    assert!(breaker.admit().is_err(), "a fourth probe is refused");
    let mut probes = probes.into_iter();
    probes.next().unwrap().record(Outcome::Success);
    assert_eq!(breaker.state(), State::HalfOpen);
    probes.next().unwrap().record(Outcome::Success);
    assert_eq!(breaker.state(), State::Closed);
}

#[test]
fn pieces_that_do_not_fit_are_refused() {
    let secs = Duration::from_secs;
    let attempt = |s| Stack::builder().attempt_timeout(secs(s));

    assert!(stack_error(attempt(0).build()).contains("zero"));
    assert!(stack_error(attempt(60).total_timeout(secs(59)).build()).contains("total timeout"));
    attempt(60).total_timeout(secs(60)).build().unwrap();

    // A time window must hold two attempt timeouts.
    let window = |span| {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .time_window(secs(span), 10)
            .min_calls(5)
    };
    assert!(stack_error(attempt(60).breaker(window(119)).build()).contains("two attempt timeouts"));
    attempt(60).breaker(window(120)).build().unwrap();

    // A slow-call threshold the attempt timeout never lets a call reach.
    let slow = |t| {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .slow_call(secs(t), 0.5)
    };
    assert!(stack_error(attempt(60).breaker(slow(60)).build()).contains("slow-call"));
    attempt(60).breaker(slow(59)).build().unwrap();

    // A probe lease that ends before the attempt timeout can judge the probe.
    let lease = |t| {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .probe_lease(secs(t))
    };
    assert!(stack_error(attempt(60).breaker(lease(60)).build()).contains("probe lease"));
    attempt(60).breaker(lease(61)).build().unwrap();

    // Backoff and Retry-After against the total timeout.
    let backoff = attempt(10).backoff(secs(5), secs(1)).build();
    assert!(stack_error(backoff).contains("backoff"));
    let cap = attempt(10)
        .total_timeout(secs(30))
        .retry_after_cap(secs(30))
        .build();
    assert!(stack_error(cap).contains("Retry-After"));
    attempt(10)
        .total_timeout(secs(30))
        .retry_after_cap(secs(29))
        .build()
        .unwrap();
    // Without retries there is nothing to wait out.
    attempt(10)
        .total_timeout(secs(15))
        .max_retries(0)
        .build()
        .unwrap();

    // The breaker's own errors come through unchanged.
    let err = Stack::builder()
        .breaker(
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .probes(2)
                .close_after(3),
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(err, StackError::Breaker(ConfigError::CloseAfter { .. })),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_ends_the_retry_loop() {
    let calls = Arc::new(AtomicU32::new(0));
    let layer = Stack::builder()
        .breaker(
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .consecutive_failures(2),
        )
        .max_retries(5)
        .seed(1)
        .build()
        .unwrap();
    let svc = layer.layer(counted(503, &calls));
    let err = svc.oneshot(Request::new(String::new())).await.unwrap_err();
    assert!(CircuitOpen::find(&*err).is_some(), "{err}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the third attempt never left"
    );
}

#[tokio::test(start_paused = true)]
async fn the_attempt_timeout_is_inside_the_breaker() {
    let calls = Arc::new(AtomicU32::new(0));
    let layer = Stack::builder()
        .attempt_timeout(Duration::from_secs(5))
        .max_retries(0)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let svc = layer.layer(hanging(&calls));
    let start = Instant::now();
    let err = svc.oneshot(Request::new(String::new())).await.unwrap_err();
    // The attempt timeout's error is the breaker's inner error.
    let inner = err
        .downcast_ref::<tower_circuit_breaker::Error>()
        .and_then(tower_circuit_breaker::Error::inner);
    assert!(
        inner.is_some_and(|e| e.is::<tower::timeout::error::Elapsed>()),
        "{err}"
    );
    assert_eq!(Instant::now() - start, Duration::from_secs(5));
    assert_eq!(
        breaker.snapshot().counters.failures,
        1,
        "a timeout is a recorded failure"
    );
}

#[tokio::test(start_paused = true)]
async fn the_total_timeout_bounds_the_retries() {
    let calls = Arc::new(AtomicU32::new(0));
    let layer = Stack::builder()
        .attempt_timeout(Duration::from_secs(5))
        .total_timeout(Duration::from_secs(12))
        .retry_after_cap(Duration::from_secs(1))
        .backoff(Duration::ZERO, Duration::ZERO)
        .max_retries(10)
        .build()
        .unwrap();
    let svc = layer.layer(hanging(&calls));
    let start = Instant::now();
    let err: BoxError = svc.oneshot(Request::new(String::new())).await.unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert_eq!(Instant::now() - start, Duration::from_secs(12));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "attempts at 0 s, 5 s and 10 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_probe_is_judged_by_its_attempt_timeout() {
    // Open 30 s, attempts of 60 s: with the lease left at the open duration
    // a hanging probe's timeout would be dropped. The stack lengthens the
    // lease, so the probe's timeout reopens the circuit.
    let calls = Arc::new(AtomicU32::new(0));
    let layer = Stack::builder()
        .breaker(
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .consecutive_failures(1)
                .jitter(0.0)
                .probes(1)
                .close_after(1),
        )
        .max_retries(0)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let svc = layer.layer(hanging(&calls));

    let first = svc.clone().oneshot(Request::new(String::new())).await;
    assert!(first.is_err());
    assert_eq!(breaker.state(), State::Open);
    tokio::time::sleep(Duration::from_secs(30)).await;

    let probe = tokio::spawn(svc.clone().oneshot(Request::new(String::new())));
    tokio::task::yield_now().await;
    assert_eq!(breaker.state(), State::HalfOpen);
    // Past the open duration, the probe still holds its slot.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let err = svc
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap_err();
    assert!(CircuitOpen::find(&*err).is_some());

    assert!(probe.await.unwrap().is_err());
    assert_eq!(
        breaker.state(),
        State::Open,
        "the probe's timeout reopened the circuit"
    );
    assert_eq!(breaker.snapshot().reopens, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn the_stack_takes_a_retry_policy_and_checks_it_against_its_timeouts() {
    use tower_circuit_breaker::retry::RetryPolicy;
    let secs = Duration::from_secs;
    // The policy's own settings reach the fit checks.
    let err = Stack::builder()
        .attempt_timeout(secs(10))
        .total_timeout(secs(30))
        .retry(RetryPolicy::new().retry_after_cap(secs(30)))
        .build()
        .unwrap_err();
    assert!(matches!(err, StackError::Misfit(why) if why.contains("Retry-After")));
    // Without retries there is nothing to wait out.
    Stack::builder()
        .attempt_timeout(secs(10))
        .total_timeout(secs(30))
        .retry(RetryPolicy::new().max_retries(0).retry_after_cap(secs(30)))
        .build()
        .unwrap();
    // The shorthands act on the same policy: the last word wins.
    let err = Stack::builder()
        .attempt_timeout(secs(10))
        .total_timeout(secs(30))
        .retry(RetryPolicy::new().max_retries(0))
        .max_retries(2)
        .retry_after_cap(secs(40))
        .build()
        .unwrap_err();
    assert!(matches!(err, StackError::Misfit(_)));
}
