//! `Failover`: order, skipping open upstreams, the pause before a fallback,
//! what is returned when nothing answers, and recovery.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::failover::Failover;
use tower_circuit_breaker::{BoxError, Breaker, CircuitBreaker, CircuitOpen, State};

/// Calls the upstreams saw: when, which upstream, which body.
type Calls = Arc<Mutex<Vec<(Instant, &'static str, String)>>>;

/// An upstream named `name` that answers with the status in `status` (0:
/// a connection error).
fn upstream(
    name: &'static str,
    status: &Arc<AtomicU16>,
    calls: &Calls,
) -> impl Service<Request<String>, Response = Response<String>, Error = BoxError, Future: Send>
       + Clone
       + use<> {
    let status = Arc::clone(status);
    let calls = Arc::clone(calls);
    tower::service_fn(move |req: Request<String>| {
        let status = status.load(Ordering::SeqCst);
        calls
            .lock()
            .unwrap()
            .push((Instant::now(), name, req.body().clone()));
        async move {
            if status == 0 {
                return Err::<Response<String>, BoxError>("connection reset".into());
            }
            Ok(Response::builder()
                .status(status)
                .header("x-upstream", name)
                .body(String::new())
                .unwrap())
        }
    })
}

fn breaker(name: &'static str) -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .name(name)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(10))
        .jitter(0.0)
        .probes(1)
        .close_after(1)
        .build()
        .unwrap()
}

fn status(code: u16) -> Arc<AtomicU16> {
    Arc::new(AtomicU16::new(code))
}

fn names(calls: &Calls) -> Vec<&'static str> {
    calls.lock().unwrap().iter().map(|(_, n, _)| *n).collect()
}

/// Which upstream answered.
fn who<B>(res: &Response<B>) -> String {
    res.headers()["x-upstream"].to_str().unwrap().to_owned()
}

fn request() -> Request<String> {
    Request::new(r#"{"model":"big"}"#.to_owned())
}

#[tokio::test(start_paused = true)]
async fn tries_upstreams_in_order_until_one_answers() {
    let calls = Calls::default();
    let (a, b, c) = (status(503), status(0), status(200));
    let svc = Failover::new(CircuitBreaker::new(upstream("a", &a, &calls), breaker("a")))
        .fallback(CircuitBreaker::new(upstream("b", &b, &calls), breaker("b")))
        .fallback(CircuitBreaker::new(upstream("c", &c, &calls), breaker("c")))
        .jitter(Duration::ZERO, Duration::ZERO);
    assert_eq!(svc.len(), 3);
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(who(&res), "c");
    assert_eq!(names(&calls), ["a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn pauses_between_50_and_200_ms_before_a_fallback() {
    let calls = Calls::default();
    let (a, b) = (status(503), status(200));
    // A breaker that stays closed, so every call fails over.
    let lenient = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1000)
        .build()
        .unwrap();
    let svc = Failover::new(CircuitBreaker::new(upstream("a", &a, &calls), lenient))
        .fallback(CircuitBreaker::new(upstream("b", &b, &calls), breaker("b")))
        .seed(4);
    let mut pauses = Vec::new();
    for _ in 0..20 {
        assert_eq!(who(&svc.clone().oneshot(request()).await.unwrap()), "b");
        let calls_now = std::mem::take(&mut *calls.lock().unwrap());
        assert_eq!(calls_now.len(), 2);
        pauses.push(calls_now[1].0 - calls_now[0].0);
    }
    for p in &pauses {
        assert!(
            (Duration::from_millis(50)..=Duration::from_millis(200)).contains(p),
            "{p:?}"
        );
    }
    let distinct: std::collections::BTreeSet<_> = pauses.iter().collect();
    assert!(distinct.len() > 10, "the pause is random: {pauses:?}");
}

#[tokio::test(start_paused = true)]
async fn skips_open_upstreams_without_calling_them_or_pausing() {
    let calls = Calls::default();
    let (a, b) = (status(200), status(200));
    let primary = breaker("a");
    primary.force_open();
    let svc = Failover::new(CircuitBreaker::new(
        upstream("a", &a, &calls),
        primary.clone(),
    ))
    .fallback(CircuitBreaker::new(upstream("b", &b, &calls), breaker("b")));
    let start = Instant::now();
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(who(&res), "b");
    assert_eq!(names(&calls), ["b"]);
    assert_eq!(Instant::now(), start, "no pause after a rejection");
    assert_eq!(primary.snapshot().counters.rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn circuit_open_only_when_every_upstream_is_open() {
    let calls = Calls::default();
    let (a, b) = (status(200), status(200));
    let (ba, bb) = (breaker("a"), breaker("b"));
    ba.force_open();
    bb.force_open();
    let svc = Failover::new(CircuitBreaker::new(upstream("a", &a, &calls), ba))
        .fallback(CircuitBreaker::new(upstream("b", &b, &calls), bb));
    let err = svc.oneshot(request()).await.unwrap_err();
    let open = err.circuit_open().expect("a rejection");
    assert_eq!(open.key(), Some("b"));
    let boxed: BoxError = err.into();
    assert!(CircuitOpen::find(&*boxed).is_some());
    assert!(names(&calls).is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_last_real_failure_wins_over_a_rejection() {
    let calls = Calls::default();
    let (a, b) = (status(503), status(200));
    let bb = breaker("b");
    bb.force_open();
    let svc = Failover::new(CircuitBreaker::new(upstream("a", &a, &calls), breaker("a")))
        .fallback(CircuitBreaker::new(upstream("b", &b, &calls), bb));
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(who(&res), "a");

    // With every upstream failing, the last one's answer comes back.
    let calls = Calls::default();
    let (a, b) = (status(503), status(0));
    let svc = Failover::new(CircuitBreaker::new(upstream("a", &a, &calls), breaker("a")))
        .fallback(CircuitBreaker::new(upstream("b", &b, &calls), breaker("b")));
    let err = svc.oneshot(request()).await.unwrap_err();
    assert_eq!(err.inner().unwrap().to_string(), "connection reset");
    assert_eq!(names(&calls), ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn caller_errors_are_returned_and_rate_limits_fail_over() {
    let calls = Calls::default();
    let (a, b) = (status(400), status(200));
    let svc = Failover::new(CircuitBreaker::new(upstream("a", &a, &calls), breaker("a")))
        .fallback(CircuitBreaker::new(upstream("b", &b, &calls), breaker("b")));
    let res = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::BAD_REQUEST,
        "a bad request is no reason to fail over"
    );
    assert_eq!(names(&calls), ["a"]);

    a.store(429, Ordering::SeqCst);
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(who(&res), "b");
    assert_eq!(names(&calls), ["a", "a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn recovers_to_the_primary_once_its_circuit_closes() {
    let calls = Calls::default();
    let (a, b) = (status(503), status(200));
    let primary = breaker("a");
    let svc = Failover::new(CircuitBreaker::new(
        upstream("a", &a, &calls),
        primary.clone(),
    ))
    .fallback(CircuitBreaker::new(upstream("b", &b, &calls), breaker("b")))
    .jitter(Duration::ZERO, Duration::ZERO);

    // The primary fails and opens; the fallback answers.
    assert_eq!(who(&svc.clone().oneshot(request()).await.unwrap()), "b");
    assert_eq!(primary.state(), State::Open);
    // While open, the primary is skipped.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(who(&svc.clone().oneshot(request()).await.unwrap()), "b");
    assert_eq!(names(&calls), ["a", "b", "b"]);

    // The primary recovers; after the open duration a probe reaches it and
    // closes the circuit, and traffic returns to it.
    a.store(200, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(who(&svc.clone().oneshot(request()).await.unwrap()), "a");
    assert_eq!(primary.state(), State::Closed);
    // Traffic returns over the ramp after half-open (10 s by default): at
    // its start the next call goes to the fallback, once it is over to the
    // primary.
    assert_eq!(who(&svc.clone().oneshot(request()).await.unwrap()), "b");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(who(&svc.oneshot(request()).await.unwrap()), "a");
    assert_eq!(names(&calls), ["a", "b", "b", "a", "b", "a"]);
}

#[tokio::test(start_paused = true)]
async fn same_client_other_model_is_one_rewrite() {
    let calls = Calls::default();
    // One client that fails for the big model only.
    let seen = Arc::clone(&calls);
    let client = tower::service_fn(move |req: Request<String>| {
        seen.lock()
            .unwrap()
            .push((Instant::now(), "client", req.body().clone()));
        let status = if req.body().contains("\"big\"") {
            503
        } else {
            200
        };
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let svc = Failover::new(CircuitBreaker::new(client.clone(), breaker("big"))).fallback_with(
        CircuitBreaker::new(client, breaker("small")),
        |req: &mut Request<String>| *req.body_mut() = req.body().replace("\"big\"", "\"small\""),
    );
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let bodies: Vec<String> = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, b)| b.clone())
        .collect();
    assert_eq!(bodies, [r#"{"model":"big"}"#, r#"{"model":"small"}"#]);
}

#[tokio::test(start_paused = true)]
async fn plain_services_fail_over_naively() {
    let calls = Calls::default();
    let (a, b) = (status(503), status(200));
    let svc = Failover::new(upstream("a", &a, &calls))
        .fallback(upstream("b", &b, &calls))
        .jitter(Duration::ZERO, Duration::ZERO);
    for _ in 0..3 {
        assert_eq!(who(&svc.clone().oneshot(request()).await.unwrap()), "b");
    }
    // Without breakers the broken primary is tried every time.
    assert_eq!(names(&calls), ["a", "b", "a", "b", "a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn quota_and_deferred_rate_limits_fail_over() {
    use tower_circuit_breaker::classify::LlmClassifier;

    let calls = Calls::default();
    let (a, b) = (status(402), status(200));
    let llm = |name, code: &Arc<AtomicU16>| {
        CircuitBreaker::with_classifier(
            upstream(name, code, &calls),
            breaker(name),
            LlmClassifier::new(),
        )
    };
    let svc = Failover::new(llm("a", &a))
        .fallback(llm("b", &b))
        .with_classifier(LlmClassifier::new())
        .jitter(Duration::ZERO, Duration::ZERO);
    // A 402: this account's quota ran out here, maybe not with the fallback.
    assert_eq!(who(&svc.clone().oneshot(request()).await.unwrap()), "b");
    // A 429, whose verdict LlmClassifier defers to the body.
    a.store(429, Ordering::SeqCst);
    assert_eq!(who(&svc.oneshot(request()).await.unwrap()), "b");
    assert_eq!(names(&calls), ["a", "b", "a", "b"]);
}

// === nested breakers ===

/// An upstream behind two breakers: `inner` (a library's own, say) inside
/// `outer`.
fn nested(
    name: &'static str,
    code: u16,
    calls: &Calls,
    inner: &Breaker,
    outer: &Breaker,
) -> CircuitBreaker<
    CircuitBreaker<
        impl Service<Request<String>, Response = Response<String>, Error = BoxError, Future: Send>
            + Clone,
    >,
> {
    CircuitBreaker::new(
        CircuitBreaker::new(upstream(name, &status(code), calls), inner.clone()),
        outer.clone(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_nested_breakers_rejection_is_skipped_without_a_pause() {
    let calls = Calls::default();
    let (inner_a, outer_a) = (breaker("inner-a"), breaker("outer-a"));
    let (inner_b, outer_b) = (breaker("inner-b"), breaker("outer-b"));
    inner_a.force_open();
    let svc = Failover::new(nested("a", 200, &calls, &inner_a, &outer_a))
        .fallback(nested("b", 200, &calls, &inner_b, &outer_b));
    let start = Instant::now();
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(who(&res), "b");
    assert_eq!(names(&calls), ["b"]);
    assert_eq!(Instant::now(), start, "no pause after a rejection");
    // The outer breaker of `a` did not count the rejection as a failure.
    assert_eq!(outer_a.state(), State::Closed);
    assert_eq!(outer_a.snapshot().counters.failures, 0);
}

#[tokio::test(start_paused = true)]
async fn nested_rejections_everywhere_are_a_circuit_open() {
    let calls = Calls::default();
    let (inner_a, outer_a) = (breaker("inner-a"), breaker("outer-a"));
    let (inner_b, outer_b) = (breaker("inner-b"), breaker("outer-b"));
    inner_a.force_open();
    inner_b.force_open();
    let svc = Failover::new(nested("a", 200, &calls, &inner_a, &outer_a))
        .fallback(nested("b", 200, &calls, &inner_b, &outer_b));
    let err = svc.oneshot(request()).await.unwrap_err();
    let open = err.circuit_open().expect("a rejection");
    assert_eq!(open.key(), Some("inner-b"));
    assert!(names(&calls).is_empty());
    assert_eq!(outer_b.state(), State::Closed);
}
