//! Deadlines without timers: the end of the open period and each probe's
//! deadline are kept to the nanosecond whenever the breaker is next touched,
//! on a runtime nobody drives, on one built without timers, and on none; and
//! the crate never provokes a panic to find out which it is on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use tokio::time::advance;
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::{Breaker, Builder, Outcome, State};

/// Opens on one failure, for `open`, with `probes` probes that all must
/// succeed, each failed if it has no head within `deadline`.
fn builder(open: Duration, probes: u32, deadline: Duration) -> Builder {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .open_duration(open)
        .max_open_duration(open.max(Duration::from_secs(300)))
        .probes(probes)
        .close_after(probes)
        .probe_timeout(deadline)
        .jitter(0.0)
}

fn breaker(open: Duration) -> Breaker {
    builder(open, 3, open).build().unwrap()
}

fn trip(b: &Breaker) {
    b.admit().unwrap().record(Outcome::Failure);
    assert_ne!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_moved_deadline_is_kept_either_way() {
    let b = breaker(Duration::from_secs(10));
    trip(&b);
    // Later than the armed timer: the old timer must not admit early.
    b.remote().open_for(Duration::from_secs(30));
    advance(Duration::from_secs(10)).await;
    assert!(b.admit().is_err(), "the deadline moved to 30 s");
    advance(Duration::from_secs(20) - Duration::from_nanos(1)).await;
    assert!(b.admit().is_err());
    advance(Duration::from_nanos(1)).await;
    assert!(b.admit().expect("due at 30 s").is_probe());

    // Earlier than the armed timer: the new one must not admit late.
    let b = breaker(Duration::from_secs(60));
    trip(&b);
    b.remote().open_for(Duration::from_secs(5));
    advance(Duration::from_secs(5) - Duration::from_nanos(1)).await;
    assert!(b.admit().is_err());
    advance(Duration::from_nanos(1)).await;
    assert!(b.admit().expect("due at 5 s").is_probe());
}

#[tokio::test(start_paused = true)]
async fn a_held_rejection_says_how_long_is_left_when_asked() {
    let b = breaker(Duration::from_secs(30));
    trip(&b);
    let err = b.admit().unwrap_err();
    let at = err.retry_at().expect("open circuits say when");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
    advance(Duration::from_secs(12)).await;
    assert_eq!(err.retry_after(), Some(Duration::from_secs(18)));
    assert_eq!(err.retry_at(), Some(at));
    advance(Duration::from_secs(40)).await;
    assert_eq!(err.retry_after(), Some(Duration::ZERO));
}

#[test]
fn a_runtime_nobody_drives_cannot_hold_the_circuit_open() {
    // The circuit opens inside a runtime that is entered but never driven:
    // no timer of any kind fires there.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _entered = rt.enter();
    let b = breaker(Duration::from_secs(30));
    trip(&b);
    for _ in 0..1_000 {
        assert!(b.admit().is_err());
    }
    // Moves the paused clock past the deadline without running the driver.
    futures::executor::block_on(advance(Duration::from_secs(31)));
    assert_eq!(b.state(), State::HalfOpen, "no call needed to tell");
    assert!(b
        .admit()
        .expect("the first call after the deadline")
        .is_probe());
}

/// Counts the panics, caught or not, that run the panic hook on this thread
/// (other tests in this binary may panic on theirs on purpose).
fn count_panics() -> Arc<AtomicUsize> {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let me = std::thread::current().id();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() == me {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    count
}

#[test]
fn breakers_cycle_on_a_runtime_without_timers_without_a_single_panic() {
    let panics = count_panics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        // Due as soon as it opened: only the clock can tell, and no timer
        // may be armed for it.
        let plain = builder(Duration::from_nanos(1), 1, Duration::from_secs(3600))
            .max_open_duration(Duration::from_nanos(1))
            .build()
            .unwrap();
        let keyed: KeyedBreakers = builder(Duration::from_nanos(1), 1, Duration::from_secs(3600))
            .max_open_duration(Duration::from_nanos(1))
            .into_builder()
            .build()
            .unwrap();
        for round in 0..100 {
            trip(&plain);
            let probe = plain.admit().expect("the clock admits the probe");
            assert!(probe.is_probe());
            probe.record(Outcome::Success);
            assert_eq!(plain.state(), State::Closed);

            let key = format!("model-{}", round % 10);
            keyed.admit(&key).unwrap().record(Outcome::Failure);
            let probe = keyed.admit(&key).expect("half-open");
            assert!(probe.is_probe());
            probe.record(Outcome::Success);
            assert_eq!(keyed.get(&key).unwrap().state(), State::Closed);
        }
        let b = breaker(Duration::from_secs(30));
        trip(&b);
        let err = b.admit().unwrap_err();
        assert!(err.retry_after().unwrap() <= Duration::from_secs(30));
    });
    assert_eq!(panics.load(Ordering::SeqCst), 0, "the panic hook ran");
}

#[test]
fn breakers_work_outside_any_runtime() {
    let b = builder(Duration::from_nanos(1), 1, Duration::from_secs(1))
        .max_open_duration(Duration::from_nanos(1))
        .build()
        .unwrap();
    trip(&b);
    assert_eq!(b.state(), State::HalfOpen);
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
}

fn half_open(probes: u32, deadline: Duration) -> Breaker {
    let b = builder(Duration::from_secs(10), probes, deadline)
        .build()
        .unwrap();
    trip(&b);
    b
}

#[tokio::test(start_paused = true)]
async fn with_every_probe_out_calls_wait_for_the_probe_deadline_to_the_nanosecond() {
    let b = half_open(2, Duration::from_secs(20));
    advance(Duration::from_secs(10)).await;
    let first = b.admit().expect("probe");
    let _second = b.admit().expect("probe");
    for _ in 0..200 {
        let err = b.admit().unwrap_err();
        assert_eq!(err.state(), State::HalfOpen);
    }

    // A probe that gives its slot back frees it at once.
    drop(first);
    let third = b.admit().expect("the slot given back");
    assert!(b.admit().is_err());

    // The second probe has no head by its deadline: held exactly its
    // deadline it is still in flight; a nanosecond more and it is a failed
    // probe, and with two probes that must both succeed, a reopen.
    advance(Duration::from_secs(20)).await;
    assert!(b.admit().is_err());
    assert_eq!(b.state(), State::HalfOpen);
    advance(Duration::from_nanos(1)).await;
    assert_eq!(b.state(), State::Open);
    assert_eq!(
        b.admit().unwrap_err().retry_after(),
        Some(Duration::from_secs(20)),
        "reopened at the deadline, for twice the open duration"
    );
    drop(third);
}

#[tokio::test(start_paused = true)]
async fn a_granted_probe_is_admitted_at_once_in_shared_mode() {
    let b = half_open(3, Duration::from_secs(60));
    let remote = b.remote();
    remote.set_shared(true);
    advance(Duration::from_secs(10)).await;
    // No probe granted: every slot is taken, and no lease will free one.
    for _ in 0..100 {
        assert!(b.admit().is_err());
    }
    advance(Duration::from_secs(600)).await;
    assert!(b.admit().is_err());
    remote.grant_probes(1);
    let probe = b.admit().expect("the granted probe");
    assert!(b.admit().is_err());
    // Leaving shared mode restores the local budget of three.
    remote.set_shared(false);
    let _more = [b.admit().unwrap(), b.admit().unwrap()];
    assert!(b.admit().is_err());
    drop(probe);
}

// === one strict comparison for every deadline ===

/// Holds a call admitted now for `held`, then records its head and a
/// success.
async fn held(b: &Breaker, held: Duration) {
    let mut permit = b.admit().expect("admitted");
    advance(held).await;
    permit.head_received();
    permit.record(Outcome::Success);
}

#[tokio::test(start_paused = true)]
async fn a_probe_held_exactly_its_probe_timeout_is_still_in_flight() {
    let deadline = Duration::from_secs(20);
    let b = half_open(1, deadline);
    advance(Duration::from_secs(10)).await;
    held(&b, deadline).await;
    assert_eq!(b.state(), State::Closed, "its success counted");

    // One nanosecond more and it failed at its deadline.
    let b = half_open(1, deadline);
    advance(Duration::from_secs(10)).await;
    held(&b, deadline + Duration::from_nanos(1)).await;
    assert_eq!(b.state(), State::Open);
    assert_eq!(b.snapshot().counters.probe_failures, 1);
}

#[tokio::test(start_paused = true)]
async fn exactly_the_slow_threshold_is_not_slow_in_closed_and_half_open_alike() {
    let threshold = Duration::from_secs(2);
    // The slow-call rule for every call, as without the in-flight limit.
    let slow = |b: Builder| {
        b.slow_call(threshold, 1.0)
            .min_calls(1)
            .count_window(1)
            .no_in_flight_limit()
    };
    let b = slow(builder(Duration::from_secs(10), 1, Duration::from_secs(20)))
        .build()
        .unwrap();

    // Closed: a call of exactly the threshold is not slow.
    held(&b, threshold).await;
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.snapshot().counters.slow, 0);

    // Half-open: nor is a probe of exactly the threshold (its deadline).
    trip(&b);
    advance(Duration::from_secs(10)).await;
    held(&b, threshold).await;
    assert_eq!(b.state(), State::Closed, "the probe succeeded, not slow");
    assert_eq!(b.snapshot().counters.slow, 0);

    // A nanosecond more is slow in both states.
    held(&b, threshold + Duration::from_nanos(1)).await;
    assert_eq!(b.state(), State::Open, "one slow call in a window of one");
    advance(Duration::from_secs(10)).await;
    held(&b, threshold + Duration::from_nanos(1)).await;
    assert_eq!(b.state(), State::Open, "a slow probe failed");
    assert_eq!(b.snapshot().counters.probe_failures, 1);
}
