//! Unit tests of hedging.

use std::sync::atomic::{AtomicU32, AtomicU64};

use tower::retry::Retry;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

use super::*;
use crate::failover::Failover;
use crate::retry::RetryPolicy;
use crate::{Breaker, CircuitBreaker};

type Req = http::Request<String>;

type Member = CircuitBreaker<BoxCloneSyncService<Req, Response<String>, std::convert::Infallible>>;

/// A member answering `status` after `delay` behind `breaker`, counting its
/// calls.
fn member(delay: Duration, status: u16, breaker: Breaker, calls: &Arc<AtomicU32>) -> Member {
    let calls = Arc::clone(calls);
    let svc = tower::service_fn(move |_req: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            let res = Response::builder().status(status).body(String::new());
            Ok::<_, std::convert::Infallible>(res.unwrap())
        }
    });
    CircuitBreaker::new(BoxCloneSyncService::new(svc), breaker)
}

/// An upstream that answers `status` after `delay`, counting its calls.
fn upstream(delay: Duration, status: u16, calls: &Arc<AtomicU32>) -> Member {
    member(delay, status, Breaker::builder().build().unwrap(), calls)
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_never_hedged() {
    let (a, b) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    // Both answer 503 at once: the caller's first attempt fails over and
    // is retried; every retry is slow enough to be hedged, were it not a
    // retry.
    let hedge = Hedge::after(Duration::ZERO).budget_percent(1000.0).unwrap();
    let failover = Failover::new(upstream(Duration::from_secs(1), 503, &a))
        .fallback(upstream(Duration::from_secs(1), 503, &b))
        .jitter(Duration::ZERO, Duration::ZERO)
        .hedge(hedge.clone());
    let policy = RetryPolicy::new().max_retries(2).seed(1);
    let res = Retry::new(policy, failover)
        .oneshot(http::Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    // The first attempt was hedged (the fallback, at once); the two
    // retries went to the primary, then the fallback, one at a time.
    assert_eq!(hedge.sent(), 1);
    assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (3, 3));
}

/// `n` call counters and `n` breakers with the default settings.
fn counted_breakers(n: usize) -> (Vec<Arc<AtomicU32>>, Vec<Breaker>) {
    let calls = (0..n).map(|_| Arc::new(AtomicU32::new(0))).collect();
    let breakers = (0..n)
        .map(|_| Breaker::builder().build().unwrap())
        .collect();
    (calls, breakers)
}

/// A member answering 200 after `delay` behind `breaker`.
fn timed(delay: Duration, breaker: &Breaker, calls: &Arc<AtomicU32>) -> Member {
    member(delay, 200, breaker.clone(), calls)
}

#[tokio::test(start_paused = true)]
async fn a_selecting_failover_hedges_to_the_selections_second_choice() {
    let (calls, b) = counted_breakers(3);
    // The cheapest is member 1 (slow), then member 0 in the walk; member
    // 2 is next in plain order after member 1, and must not get the hedge.
    let selection = crate::failover::Selection::cheapest([
        (b[0].clone(), 2.0),
        (b[1].clone(), 1.0),
        (b[2].clone(), 3.0),
    ]);
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(1000.0)
        .unwrap();
    let failover = Failover::new(timed(Duration::from_millis(100), &b[0], &calls[0]))
        .fallback(timed(Duration::from_secs(5), &b[1], &calls[1]))
        .fallback(timed(Duration::from_millis(100), &b[2], &calls[2]))
        .hedge(hedge.clone())
        .select(selection)
        .unwrap();
    let start = Instant::now();
    let res = failover
        .oneshot(http::Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(600),
        "hedged at 500 ms"
    );
    assert_eq!(hedge.sent(), 1);
    let n: Vec<u32> = calls.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    assert_eq!(n, [1, 1, 0], "the hedge went to member 0");
}

#[tokio::test(start_paused = true)]
async fn a_hedge_loser_feeds_the_selection_a_censored_sample() {
    let (calls, b) = counted_breakers(2);
    let selection = crate::failover::Selection::peak_ewma(b.clone());
    // Member 0 looked faster; it has become slow.
    selection.record(0, Duration::from_millis(100));
    selection.record(1, Duration::from_millis(200));
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(1000.0)
        .unwrap();
    let failover = Failover::new(timed(Duration::from_secs(5), &b[0], &calls[0]))
        .fallback(timed(Duration::from_millis(100), &b[1], &calls[1]))
        .hedge(hedge.clone())
        .select(selection.clone())
        .unwrap();
    let res = failover
        .oneshot(http::Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(hedge.sent(), 1);
    // The loser had no head after 600 ms: its estimate is raised to that.
    assert_eq!(selection.estimate(0), Some(Duration::from_millis(600)));
    // The winner's 100 ms sample is averaged in.
    assert!(selection.estimate(1) < Some(Duration::from_millis(200)));
    assert_eq!((selection.pending(0), selection.pending(1)), (0, 0));
    assert_eq!(b[0].snapshot().counters.failures, 0, "the loser is ignored");
}

#[tokio::test(start_paused = true)]
async fn when_both_fail_the_failover_goes_on_after_them() {
    let calls: Vec<_> = (0..3).map(|_| Arc::new(AtomicU32::new(0))).collect();
    let hedge = Hedge::after(Duration::from_millis(100))
        .budget_percent(100.0)
        .unwrap();
    let failover = Failover::new(upstream(Duration::from_millis(300), 503, &calls[0]))
        .fallback(upstream(Duration::from_millis(300), 503, &calls[1]))
        .fallback(upstream(Duration::from_millis(10), 200, &calls[2]))
        .jitter(Duration::ZERO, Duration::ZERO)
        .hedge(hedge.clone());
    let start = Instant::now();
    let res = failover
        .oneshot(http::Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // The primary failed at 300 ms, its hedge at 400 ms: the third
    // member was called then, once.
    assert_eq!(start.elapsed(), Duration::from_millis(410));
    let n: Vec<u32> = calls.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    assert_eq!(n, [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn the_percentile_delay_follows_the_members_own_latency() {
    let b = Arc::new(AtomicU32::new(0));
    let delay_ms = Arc::new(AtomicU64::new(200));
    let d = Arc::clone(&delay_ms);
    let primary = tower::service_fn(move |_req: Req| {
        let delay = Duration::from_millis(d.load(Ordering::SeqCst));
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, std::convert::Infallible>(Response::new("primary".to_owned()))
        }
    });
    let primary = CircuitBreaker::new(
        BoxCloneSyncService::new(primary),
        Breaker::builder().build().unwrap(),
    );
    let hedge = Hedge::at_percentile(50.0, Duration::from_secs(5))
        .unwrap()
        .budget_percent(1000.0)
        .unwrap();
    let failover = Failover::new(primary)
        .fallback(upstream(Duration::from_millis(50), 200, &b))
        .hedge(hedge.clone());
    // Until it has samples, the initial 5 s: never reached.
    for _ in 0..Latency::MIN_SAMPLES {
        let res = failover.clone().oneshot(http::Request::new(String::new()));
        assert_eq!(res.await.unwrap().status(), 200);
    }
    assert_eq!(hedge.sent(), 0);
    assert_eq!(
        failover.latency(0).and_then(|l| l.percentile(50.0)),
        Some(Duration::from_millis(200))
    );
    // Now its median, 200 ms: a call that would take a second is hedged
    // then, and the fallback answers 50 ms later.
    delay_ms.store(1000, Ordering::SeqCst);
    let start = Instant::now();
    let res = failover.clone().oneshot(http::Request::new(String::new()));
    assert_eq!(res.await.unwrap().status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert_eq!(hedge.sent(), 1);
    assert_eq!(b.load(Ordering::SeqCst), 1);
}
