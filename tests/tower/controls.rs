//! Traffic controls beyond open and closed: shadow and disabled modes for
//! the new rejections, the every-upstream-open policy of a failover, the
//! retry budget, header pacing and the stack's checks of stream deadlines.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response};
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::deadline::{DeadlineError, StreamDeadlines};
use tower_circuit_breaker::failover::{AllOpen, Failover};
use tower_circuit_breaker::retry::{RetryBudget, RetryPolicy};
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::stack::StackError;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Outcome, Reason, Rejection, State};

fn wait(secs: u64) -> Outcome {
    Outcome::RateLimited {
        retry_after: Some(Duration::from_secs(secs)),
    }
}

#[tokio::test(start_paused = true)]
async fn metrics_only_counts_quota_and_pacing_rejections_it_would_make_but_admits() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .quota_gate(Duration::from_secs(60))
        .pace_rate_limits(true)
        .metrics_only(true)
        .build()
        .unwrap();
    b.admit().unwrap().record(wait(5));
    assert!(b.admit().is_ok());
    // A call admitted only in shadow records nothing, as for an open
    // circuit: wait for the pacing to end.
    tokio::time::advance(Duration::from_secs(5)).await;
    b.admit().unwrap().record(Outcome::QuotaExhausted);
    assert_eq!(
        b.state(),
        State::Open,
        "the transition it would make is made"
    );
    assert!(b.admit().is_ok());
    let c = b.snapshot().counters;
    assert_eq!((c.rejected, c.would_reject), (0, 2));
    assert_eq!((c.paced, c.quota_rejected), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn disabled_admits_and_records_no_quota_and_no_pacing() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .quota_gate(Duration::from_secs(60))
        .pace_rate_limits(true)
        .build()
        .unwrap();
    b.disable();
    b.admit().unwrap().record(wait(5));
    b.admit().unwrap().record(Outcome::QuotaExhausted);
    assert!(b.admit().is_ok());
    assert_eq!(b.state(), State::Disabled);
    b.reset();
    assert!(b.admit().is_ok(), "nothing was recorded while disabled");
}

#[tokio::test(start_paused = true)]
async fn without_the_settings_quota_and_rate_limits_stay_neutral() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .build()
        .unwrap();
    b.admit().unwrap().record(wait(5));
    b.admit().unwrap().record(Outcome::QuotaExhausted);
    assert!(b.admit().is_ok());
    assert_eq!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_quota_reset_the_answer_announces_wins_over_the_configured_time() {
    let upstream = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .status(402)
                .header("retry-after", "7")
                .body(String::new())
                .unwrap(),
        )
    });
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .quota_gate(Duration::from_secs(600))
        .jitter(0.0)
        .build()
        .unwrap();
    let mut svc = CircuitBreaker::with_classifier(upstream, b.clone(), LlmClassifier::new());
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 402);
    let open = b.admit().unwrap_err();
    assert_eq!(open.reason(), Rejection::Quota);
    assert_eq!(open.retry_after(), Some(Duration::from_secs(7)));
    tokio::time::advance(Duration::from_secs(7)).await;
    assert_eq!(b.state(), State::HalfOpen);
    assert_eq!(
        b.snapshot().reopens,
        0,
        "a quota does not advance the backoff"
    );
}

#[tokio::test(start_paused = true)]
async fn a_remaining_count_of_zero_paces_until_its_reset() {
    let upstream = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .header("x-ratelimit-remaining-requests", "0")
                .header("x-ratelimit-reset-requests", "2s")
                .header("x-ratelimit-remaining-tokens", "900")
                .header("x-ratelimit-reset-tokens", "1m0s")
                .body(String::new())
                .unwrap(),
        )
    });
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .pace_rate_limits(true)
        .build()
        .unwrap();
    let mut svc = CircuitBreaker::new(upstream, b.clone());
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap_err();
    assert_eq!(err.circuit_open().unwrap().reason(), Rejection::RateLimited);
    assert_eq!(b.snapshot().paced_for, Some(Duration::from_secs(2)));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .is_ok());
}

fn opened(after: Duration) -> Breaker {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(30))
        .jitter(0.0)
        .build()
        .unwrap();
    b.admit().unwrap().record(Outcome::Failure);
    let _ = after;
    b
}

fn counting(
    hits: Arc<AtomicUsize>,
    status: u16,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future = impl Send>
       + Clone {
    tower::service_fn(move |_req: Request<String>| {
        hits.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    })
}

#[tokio::test(start_paused = true)]
async fn every_upstream_open_fails_fast_with_the_soonest_retry_time() {
    let a = opened(Duration::ZERO);
    tokio::time::advance(Duration::from_secs(10)).await;
    let b = opened(Duration::ZERO);
    let hits = Arc::new(AtomicUsize::new(0));
    // `b` is tried last, but `a` admits a call sooner.
    let mut svc = Failover::new(CircuitBreaker::new(counting(hits.clone(), 200), a.clone()))
        .fallback(CircuitBreaker::new(counting(hits.clone(), 200), b.clone()));
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap_err();
    let open = err.circuit_open().unwrap();
    assert_eq!(open.retry_after(), Some(Duration::from_secs(20)));
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn every_upstream_open_lets_one_call_per_open_period_through_to_the_oldest_open() {
    let a = opened(Duration::ZERO);
    tokio::time::advance(Duration::from_secs(10)).await;
    let b = opened(Duration::ZERO);
    let (ha, hb) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut svc = Failover::new(CircuitBreaker::new(counting(hb.clone(), 503), b.clone()))
        .fallback(CircuitBreaker::new(counting(ha.clone(), 503), a.clone()))
        .when_all_open(AllOpen::last_resort([b.clone(), a.clone()]))
        .jitter(Duration::ZERO, Duration::ZERO);

    // `a` opened longest ago: it gets the one call; a failure changes nothing.
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        (ha.load(Ordering::SeqCst), hb.load(Ordering::SeqCst)),
        (1, 0)
    );
    assert_eq!(a.state(), State::Open);
    assert_eq!(a.snapshot().reopens, 0);

    // Then `b`'s one call; then no more in these open periods.
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        (ha.load(Ordering::SeqCst), hb.load(Ordering::SeqCst)),
        (1, 1)
    );
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(
        (ha.load(Ordering::SeqCst), hb.load(Ordering::SeqCst)),
        (1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_last_resort_success_ends_that_open_period() {
    let a = opened(Duration::ZERO);
    let hits = Arc::new(AtomicUsize::new(0));
    let mut svc = Failover::new(CircuitBreaker::new(counting(hits.clone(), 200), a.clone()))
        .when_all_open(AllOpen::last_resort([a.clone()]));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(a.state(), State::HalfOpen);
    assert_eq!(a.snapshot().reason, Some(Reason::LastResort));
}

#[tokio::test(start_paused = true)]
async fn a_retry_budget_of_20_percent_caps_attempts_at_1_2_times_the_requests() {
    let hits = Arc::new(AtomicUsize::new(0));
    let budget = RetryBudget::new(20.0).unwrap();
    let policy = RetryPolicy::new()
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .seed(1)
        .budget(budget.clone());
    let mut client = ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .service(counting(hits.clone(), 503));
    for _ in 0..100 {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(res.status(), 503, "over budget, the original answer");
    }
    let attempts = hits.load(Ordering::SeqCst);
    assert!(attempts <= 120, "{attempts} attempts for 100 requests");
    assert!(attempts >= 115, "the budget is spent: {attempts}");
    assert!(budget.denied() > 0);
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_leaves_the_budget_ten_seconds_after_its_slot_began() {
    let budget = RetryBudget::new(50.0).unwrap();
    for _ in 0..4 {
        budget.deposit();
    }
    tokio::time::advance(Duration::from_millis(9_999)).await;
    assert!(
        budget.withdraw(),
        "the four first attempts are in the window"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    // Their slot ended 10 s after it began: only the retry is left.
    assert!(!budget.withdraw());
}

#[tokio::test(start_paused = true)]
async fn a_retry_budget_refills_as_the_window_slides() {
    let budget = RetryBudget::new(50.0).unwrap();
    budget.deposit();
    budget.deposit();
    assert!(budget.withdraw());
    assert!(!budget.withdraw());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(!budget.withdraw(), "the first attempts left the window");
    budget.deposit();
    budget.deposit();
    assert!(budget.withdraw());
    assert!(matches!(
        RetryBudget::new(1001.0),
        Err(tower_circuit_breaker::retry::RetryBudgetError::Percent(_))
    ));
}

#[test]
fn the_stack_refuses_stream_deadlines_that_cannot_work() {
    let stack = || {
        Stack::builder()
            .attempt_timeout(Duration::from_secs(30))
            .total_timeout(Duration::from_secs(60))
    };
    let stall = |s| StreamDeadlines::new().stall(Duration::from_secs(s));
    assert!(matches!(
        stack().stream_deadlines(stall(61)).build(),
        Err(StackError::Misfit(_))
    ));
    assert!(stack().stream_deadlines(stall(60)).build().is_ok());
    assert!(matches!(
        stack()
            .stream_deadlines(StreamDeadlines::new().first_frame(Duration::from_secs(90)))
            .build(),
        Err(StackError::Misfit(_))
    ));
    assert!(matches!(
        stack().stream_deadlines(stall(0)).build(),
        Err(StackError::Deadline(DeadlineError::Zero("stall")))
    ));
    assert!(matches!(
        stack()
            .stream_deadlines(stall(20).total(Duration::from_secs(10)))
            .build(),
        Err(StackError::Deadline(DeadlineError::AboveTotal("stall")))
    ));
    // The probe deadline longer than the attempt timeout, as before.
    assert!(matches!(
        stack()
            .breaker(
                Breaker::builder()
                    .trip_mode(TripMode::Open)
                    .probe_timeout(Duration::from_secs(31))
            )
            .build(),
        Err(StackError::Misfit(_))
    ));
}
