//! The open circuit's timer: rejections read no clock while it is pending,
//! and the deadline is still kept to the nanosecond, on a runtime nobody
//! drives any more and on one without timers.

use std::time::Duration;

use tokio::time::advance;
use tower_circuit_breaker::{Breaker, Builder, Outcome, State};

/// Opens on one failure, for `open`, with `probes` probes that all must
/// succeed and hold their slot for `lease`.
fn builder(open: Duration, probes: u32, lease: Duration) -> Builder {
    Breaker::builder()
        .no_window()
        .consecutive_failures(1)
        .open_duration(open)
        .max_open_duration(open.max(Duration::from_secs(300)))
        .probes(probes)
        .close_after(probes)
        .probe_lease(lease)
        .jitter(0.0)
}

fn breaker(open: Duration) -> Breaker {
    builder(open, 3, open).build().unwrap()
}

fn trip(b: &Breaker) {
    b.admit().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), State::Open);
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
fn a_timer_on_a_runtime_nobody_drives_cannot_hold_the_circuit_open() {
    // The circuit opens inside a runtime that is entered but never driven,
    // so its timer never fires.
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
    let rejected_before_the_probe = (0..1_000)
        .position(|_| b.admit().is_ok())
        .expect("a probe within a bounded number of calls");
    assert!(
        rejected_before_the_probe < 64,
        "{rejected_before_the_probe} calls rejected after the deadline"
    );
    assert_eq!(b.state(), State::HalfOpen);
}

#[test]
fn a_runtime_without_timers_falls_back_to_the_clock() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        // Due as soon as it opened: only the clock can tell.
        let b = builder(Duration::from_nanos(1), 1, Duration::from_secs(3600))
            .max_open_duration(Duration::from_nanos(1))
            .build()
            .unwrap();
        for _ in 0..3 {
            trip(&b);
            let probe = b.admit().expect("the clock admits the probe");
            assert!(probe.is_probe());
            probe.record(Outcome::Failure);
            assert_eq!(b.state(), State::Open);
            b.reset();
        }
        let b = breaker(Duration::from_secs(30));
        trip(&b);
        let err = b.admit().unwrap_err();
        assert!(err.retry_after().unwrap() <= Duration::from_secs(30));
    });
}

fn half_open(probes: u32, lease: Duration) -> Breaker {
    let b = builder(Duration::from_secs(10), probes, lease)
        .build()
        .unwrap();
    trip(&b);
    b
}

#[tokio::test(start_paused = true)]
async fn with_every_probe_out_calls_wait_for_a_slot_to_the_nanosecond() {
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

    // Leases run out at their deadline, not a moment later or earlier.
    advance(Duration::from_secs(20) - Duration::from_nanos(1)).await;
    assert!(b.admit().is_err());
    advance(Duration::from_nanos(1)).await;
    assert!(b.admit().expect("the first lease ran out").is_probe());
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
