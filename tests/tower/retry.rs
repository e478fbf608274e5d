//! `RetryPolicy`: what is retried, how long it waits, and how an open
//! circuit ends the wait.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::retry::Retry;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::retry::RetryPolicy;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Error, State};

/// Calls the upstream saw: when, and with which body.
type Calls = Arc<Mutex<Vec<(Instant, String)>>>;

/// An upstream that answers by the request body: `fail` → 503, `busy:N` →
/// 429 with `Retry-After: N`, `bad` → 400, `flaky` → 503 on the first call
/// and 200 after, anything else → 200.
fn upstream(
    calls: &Calls,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + use<> {
    let calls = Arc::clone(calls);
    tower::service_fn(move |req: Request<String>| {
        let calls = Arc::clone(&calls);
        async move {
            let body = req.into_body();
            let seen = {
                let mut calls = calls.lock().unwrap();
                calls.push((Instant::now(), body.clone()));
                calls.iter().filter(|(_, b)| *b == body).count()
            };
            let mut res = Response::builder();
            res = match body.as_str() {
                "fail" => res.status(503),
                "bad" => res.status(400),
                "flaky" if seen == 1 => res.status(503),
                b if b.starts_with("busy:") => res.status(429).header("retry-after", &b[5..]),
                _ => res.status(200),
            };
            Ok(res.body(body).unwrap())
        }
    })
}

fn breaker(consecutive: u32) -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(consecutive)
        .open_duration(Duration::from_secs(30))
        .jitter(0.0)
        .build()
        .unwrap()
}

fn request(body: &str) -> Request<String> {
    Request::new(body.to_owned())
}

fn bodies(calls: &Calls) -> Vec<String> {
    calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, b)| b.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn retry_ends_at_once_when_the_circuit_opens_mid_backoff() {
    let calls = Calls::default();
    let breaker = breaker(2);
    let policy = RetryPolicy::new()
        .max_retries(3)
        .backoff(Duration::from_secs(20), Duration::from_secs(20))
        .seed(1)
        .watch_breaker(breaker.clone());
    let svc = Retry::new(
        policy,
        CircuitBreaker::new(upstream(&calls), breaker.clone()),
    );
    let start = Instant::now();

    // A fails once and goes to sleep for up to 20 s.
    let a = tokio::spawn(svc.clone().oneshot(request("fail")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(bodies(&calls), ["fail"], "A is still in its backoff");
    assert!(!a.is_finished());

    // B's failure is the second in a row: the circuit opens.
    let b = svc.clone().oneshot(request("fail")).await.unwrap_err();
    assert!(b.is_circuit_open());
    assert_eq!(breaker.state(), State::Open);
    let opened = Instant::now();

    // A wakes at once and meets the rejection; its retry never reaches the
    // upstream, and it did not sleep out its backoff.
    let a: Result<_, Error> = a.await.unwrap();
    let open = a.unwrap_err();
    assert!(open.is_circuit_open(), "{open:?}");
    assert_eq!(Instant::now(), opened);
    assert_eq!(opened - start, Duration::from_millis(100));
    assert_eq!(bodies(&calls), ["fail", "fail"]);
}

#[tokio::test(start_paused = true)]
async fn without_watching_the_breaker_the_retry_sleeps_out_its_backoff() {
    let calls = Calls::default();
    let breaker = breaker(2);
    let policy = RetryPolicy::new()
        .max_retries(3)
        .backoff(Duration::from_secs(20), Duration::from_secs(20))
        .seed(1);
    let svc = Retry::new(
        policy,
        CircuitBreaker::new(upstream(&calls), breaker.clone()),
    );
    let start = Instant::now();

    let a = tokio::spawn(svc.clone().oneshot(request("fail")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _b = tokio::spawn(svc.clone().oneshot(request("fail")));
    tokio::task::yield_now().await;
    assert_eq!(breaker.state(), State::Open);
    let opened = Instant::now();
    assert_eq!(opened - start, Duration::from_millis(100));

    let open = a.await.unwrap().unwrap_err();
    assert!(open.is_circuit_open());
    // The same seeded backoff as above, slept out in full after the circuit
    // had opened.
    assert!(Instant::now() > opened);
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_is_never_retried_and_never_waited_for() {
    let calls = Calls::default();
    let breaker = breaker(5);
    breaker.force_open();
    let policy = RetryPolicy::new()
        .max_retries(3)
        .watch_breaker(breaker.clone());
    let svc = Retry::new(
        policy,
        CircuitBreaker::new(upstream(&calls), breaker.clone()),
    );
    let start = Instant::now();
    let err = svc.oneshot(request("ok")).await.unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(Instant::now(), start);
    assert!(bodies(&calls).is_empty());
    assert_eq!(breaker.snapshot().counters.rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_waited_out_exactly() {
    let calls = Calls::default();
    let breaker = breaker(5);
    let policy = RetryPolicy::new()
        .max_retries(1)
        .retry_after_cap(Duration::from_secs(5));
    let svc = Retry::new(
        policy,
        CircuitBreaker::new(upstream(&calls), breaker.clone()),
    );
    let start = Instant::now();
    let res = svc.oneshot(request("busy:3")).await.unwrap();
    // Retried once, 3 s later, and the upstream's second answer is returned.
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let times: Vec<Duration> = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| *t - start)
        .collect();
    assert_eq!(times, [Duration::ZERO, Duration::from_secs(3)]);
    // A 429 is not a failure.
    assert_eq!(breaker.snapshot().counters.failures, 0);
    assert_eq!(breaker.snapshot().counters.rate_limited, 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_over_the_cap_goes_to_the_caller_at_once() {
    let calls = Calls::default();
    let policy = RetryPolicy::new()
        .max_retries(3)
        .retry_after_cap(Duration::from_secs(5));
    let svc = Retry::new(policy, CircuitBreaker::new(upstream(&calls), breaker(5)));
    let start = Instant::now();
    let res = svc.oneshot(request("busy:60")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "60");
    assert_eq!(Instant::now(), start);
    assert_eq!(bodies(&calls).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn failures_are_retried_up_to_the_cap_with_growing_backoff() {
    let run = |seed| async move {
        let calls = Calls::default();
        let policy = RetryPolicy::new()
            .max_retries(4)
            .backoff(Duration::from_secs(1), Duration::from_secs(100))
            .seed(seed);
        let svc = Retry::new(policy, CircuitBreaker::new(upstream(&calls), breaker(100)));
        let res = svc.oneshot(request("fail")).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "the last answer is returned"
        );
        let times: Vec<Instant> = calls.lock().unwrap().iter().map(|(t, _)| *t).collect();
        assert_eq!(times.len(), 5, "one attempt and four retries");
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        for (n, gap) in gaps.iter().enumerate() {
            // Full jitter below base × 2^n.
            assert!(
                *gap < Duration::from_secs(1 << n),
                "retry {n} waited {gap:?}"
            );
        }
        gaps
    };
    assert_eq!(run(9).await, run(9).await, "a seed repeats");
    assert_ne!(run(9).await, run(10).await);
}

#[tokio::test(start_paused = true)]
async fn ignored_answers_and_successes_are_not_retried() {
    let calls = Calls::default();
    let policy = RetryPolicy::new().max_retries(3);
    let svc = Retry::new(policy, CircuitBreaker::new(upstream(&calls), breaker(5)));
    let res = svc.clone().oneshot(request("bad")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let res = svc.oneshot(request("ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(bodies(&calls), ["bad", "ok"]);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeouts_are_failures_and_are_retried() {
    let attempts = Arc::new(Mutex::new(0u32));
    let counter = Arc::clone(&attempts);
    let hanging = tower::service_fn(move |_req: Request<String>| {
        *counter.lock().unwrap() += 1;
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    let breaker = breaker(100);
    let policy = RetryPolicy::new()
        .max_retries(2)
        .backoff(Duration::ZERO, Duration::ZERO);
    let inner = tower::timeout::Timeout::new(hanging, Duration::from_secs(5));
    let svc = Retry::new(policy, CircuitBreaker::new(inner, breaker.clone()));
    let start = Instant::now();
    let err = svc.oneshot(request("x")).await.unwrap_err();
    assert!(err.inner().unwrap().is::<tower::timeout::error::Elapsed>());
    assert_eq!(*attempts.lock().unwrap(), 3);
    assert_eq!(Instant::now() - start, Duration::from_secs(15));
    assert_eq!(breaker.snapshot().counters.failures, 3);
}

#[tokio::test(start_paused = true)]
async fn requests_with_cloneable_bodies_are_retried_intact() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let echo = tower::service_fn(move |req: Request<Full<Bytes>>| {
        let log = Arc::clone(&log);
        async move {
            let (parts, body) = req.into_parts();
            let bytes = http_body_util::BodyExt::collect(body)
                .await
                .unwrap()
                .to_bytes();
            let first = {
                let mut log = log.lock().unwrap();
                log.push((parts.headers["x-model"].clone(), bytes));
                log.len() == 1
            };
            let status = if first { 502 } else { 200 };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let policy = RetryPolicy::new().max_retries(1).seed(3);
    let svc = Retry::new(policy, CircuitBreaker::new(echo, breaker(5)));
    let req = Request::builder()
        .header("x-model", "gpt")
        .body(Full::new(Bytes::from_static(b"{\"prompt\":\"hi\"}")))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[1].1, Bytes::from_static(b"{\"prompt\":\"hi\"}"));
}

#[tokio::test(start_paused = true)]
async fn a_flaky_upstream_is_retried_to_success() {
    let calls = Calls::default();
    let policy = RetryPolicy::new().max_retries(2).seed(5);
    let svc = Retry::new(policy, CircuitBreaker::new(upstream(&calls), breaker(5)));
    let res = svc.oneshot(request("flaky")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(bodies(&calls), ["flaky", "flaky"]);
}

#[tokio::test(start_paused = true)]
async fn a_deferring_classifier_still_gets_retry_after_honoured() {
    use tower_circuit_breaker::classify::LlmClassifier;

    // LlmClassifier reads a 429's body to tell a quota from a rate limit;
    // the policy decides on the head meanwhile.
    let calls = Calls::default();
    let breaker = breaker(5);
    let policy = RetryPolicy::new()
        .max_retries(1)
        .with_classifier(LlmClassifier::new());
    let inner = CircuitBreaker::with_classifier(upstream(&calls), breaker, LlmClassifier::new());
    let svc = Retry::new(policy, inner);
    let start = Instant::now();
    let res = svc.oneshot(request("busy:2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let times: Vec<Duration> = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| *t - start)
        .collect();
    assert_eq!(times, [Duration::ZERO, Duration::from_secs(2)]);
}

// === nested breakers ===

#[tokio::test(start_paused = true)]
async fn a_nested_breakers_rejection_ends_the_retry_at_once() {
    let calls = Calls::default();
    // The outer breaker would take five failures to open: only the rule
    // about nested rejections can stop the loop after one attempt.
    let (outer, inner) = (breaker(5), breaker(5));
    inner.force_open();
    let policy = RetryPolicy::new()
        .max_retries(3)
        .backoff(Duration::from_millis(100), Duration::from_secs(2))
        .seed(7);
    let svc = Retry::new(
        policy,
        CircuitBreaker::new(
            CircuitBreaker::new(upstream(&calls), inner.clone()),
            outer.clone(),
        ),
    );
    let start = Instant::now();
    let err = svc.oneshot(request("ok")).await.unwrap_err();
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(Instant::now(), start, "no backoff before giving up");
    assert!(bodies(&calls).is_empty());
    assert_eq!(inner.snapshot().counters.rejected, 1);
    let counters = outer.snapshot().counters;
    assert_eq!((counters.failures, counters.ignored), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_nested_rejection_boxed_by_towers_timeout_ends_the_retry_too() {
    let calls = Calls::default();
    let (outer, inner) = (breaker(5), breaker(5));
    inner.force_open();
    let svc = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(
            RetryPolicy::new().max_retries(3).seed(7),
        ))
        .timeout(Duration::from_secs(60))
        .layer(tower_circuit_breaker::CircuitBreakerLayer::new(
            outer.clone(),
        ))
        .service(CircuitBreaker::new(upstream(&calls), inner.clone()));
    let start = Instant::now();
    let err: tower_circuit_breaker::BoxError = svc.oneshot(request("ok")).await.unwrap_err();
    assert!(tower_circuit_breaker::CircuitOpen::find(&*err).is_some());
    assert_eq!(Instant::now(), start);
    assert_eq!(inner.snapshot().counters.rejected, 1);
    assert_eq!(outer.snapshot().counters.failures, 0);
}
