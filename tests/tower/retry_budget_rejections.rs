//! The retry budget counts first attempts that reached the upstream: an
//! open period, whose calls the breaker rejects, banks no retries for the
//! moment it ends.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::retry::{RetryBudget, RetryPolicy};
use tower_circuit_breaker::CircuitBreakerLayer;

#[tokio::test(start_paused = true)]
async fn rejected_first_attempts_bank_no_retries_for_after_the_open_period() {
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    let upstream = tower::service_fn(move |_req: Request<String>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::builder().status(503).body(String::new()).unwrap()) }
    });
    let layer = CircuitBreakerLayer::builder().build().unwrap();
    let breaker = layer.breaker().clone();
    let budget = RetryBudget::new(20.0).unwrap();
    let policy = RetryPolicy::new()
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .seed(1)
        .budget(budget.clone());
    let mut client = ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .layer(layer)
        .service(upstream);

    // An open period: 100 requests, each rejected on its first attempt.
    breaker.force_open();
    for _ in 0..100 {
        let err = client
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap_err();
        assert!(err.is_circuit_open());
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    // The circuit closes; the first request after it fails. One first
    // attempt reached the upstream: 20 % of it is no retry.
    breaker.reset();
    let res = client
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the rejected first attempts banked retries"
    );
    assert_eq!(budget.denied(), 1);
}
