//! The state machine's rules, one per test, in paused time.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use tokio::time::advance;
use tower_circuit_breaker::{Breaker, ConfigError, Outcome, Reason, State};

fn record(b: &Breaker, outcome: Outcome, n: usize) {
    for _ in 0..n {
        b.admit().expect("admitted").record(outcome);
    }
}

fn base() -> tower_circuit_breaker::Builder {
    Breaker::builder().trip_mode(TripMode::Open).jitter(0.0)
}

#[tokio::test(start_paused = true)]
async fn count_window_of_10_at_half_opens_after_1000_successes_and_10_failures() {
    let b = base()
        .count_window(10)
        .min_calls(10)
        .failure_rate(0.5)
        .build()
        .unwrap();
    record(&b, Outcome::Success, 1_000);
    for i in 0..10 {
        if b.state() == State::Open {
            // The window is the last 10 calls, not all 1,010: five failures
            // out of ten reach 50 %.
            assert_eq!(i, 5);
            break;
        }
        b.admit().unwrap().record(Outcome::Failure);
    }
    assert_eq!(b.state(), State::Open);
    let snap = b.snapshot();
    assert_eq!((snap.window.calls, snap.window.failures), (10, 5));
}

#[tokio::test(start_paused = true)]
async fn min_calls_holds_the_rate_rule_back() {
    let b = base()
        .count_window(20)
        .min_calls(8)
        .failure_rate(0.5)
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 7);
    assert_eq!(b.state(), State::Closed, "7 calls are fewer than min_calls");
    record(&b, Outcome::Failure, 1);
    assert_eq!(b.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_success_that_reaches_min_calls_can_trip_the_rate_rule() {
    let b = base()
        .count_window(20)
        .min_calls(4)
        .failure_rate(0.5)
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 2);
    record(&b, Outcome::Success, 1);
    assert_eq!(b.state(), State::Closed);
    record(&b, Outcome::Success, 1);
    assert_eq!(b.state(), State::Open, "2 of 4 is 50 %");
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_trip_and_a_success_resets_the_streak() {
    let b = base().no_window().consecutive_failures(3).build().unwrap();
    record(&b, Outcome::Failure, 2);
    record(&b, Outcome::Success, 1);
    record(&b, Outcome::Failure, 2);
    assert_eq!(b.state(), State::Closed);
    // Neutral outcomes neither count nor break the streak.
    record(&b, Outcome::Ignored, 5);
    record(&b, Outcome::RateLimited { retry_after: None }, 5);
    assert_eq!(b.state(), State::Closed);
    record(&b, Outcome::Failure, 1);
    assert_eq!(b.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn ignored_and_rate_limited_outcomes_stay_out_of_the_window() {
    let b = base()
        .count_window(4)
        .min_calls(4)
        .failure_rate(0.5)
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 1);
    record(&b, Outcome::Ignored, 50);
    record(
        &b,
        Outcome::RateLimited {
            retry_after: Some(Duration::from_secs(7)),
        },
        50,
    );
    let snap = b.snapshot();
    assert_eq!((snap.window.calls, snap.window.failures), (1, 1));
    assert_eq!(snap.counters.rate_limited, 50);
    assert_eq!(snap.counters.ignored, 50);
    assert_eq!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn time_window_forgets_calls_older_than_its_span() {
    let b = base()
        .time_window(Duration::from_secs(10), 10)
        .min_calls(4)
        .failure_rate(0.5)
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 3);
    advance(Duration::from_secs(11)).await;
    record(&b, Outcome::Success, 3);
    record(&b, Outcome::Failure, 1);
    // Only the last four calls are within 10 s: one failure in four.
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.snapshot().window.calls, 4);
    record(&b, Outcome::Failure, 2);
    assert_eq!(b.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn slow_calls_trip_the_slow_rate_rule() {
    let b = base()
        .count_window(4)
        .min_calls(4)
        .no_failure_rate()
        .slow_call(Duration::from_secs(2), 0.5)
        .build()
        .unwrap();
    for latency in [1, 3, 1, 3] {
        let mut p = b.admit_with_fallback().unwrap();
        advance(Duration::from_secs(latency)).await;
        p.head_received();
        p.record(Outcome::Success);
    }
    assert_eq!(b.state(), State::Open);
    assert_eq!(b.snapshot().window.slow, 2);
}

#[tokio::test(start_paused = true)]
async fn exactly_the_threshold_is_not_slow() {
    let b = base()
        .count_window(2)
        .min_calls(2)
        .no_failure_rate()
        .slow_call(Duration::from_secs(2), 0.5)
        .build()
        .unwrap();
    for _ in 0..2 {
        let p = b.admit().unwrap();
        advance(Duration::from_secs(2)).await;
        p.record(Outcome::Success);
    }
    assert_eq!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_slow_success_counts_in_a_full_window_of_fast_ones() {
    let b = base()
        .count_window(4)
        .min_calls(4)
        .no_failure_rate()
        .slow_call(Duration::from_secs(2), 0.5)
        .build()
        .unwrap();
    let fast = |n| {
        for _ in 0..n {
            let mut p = b.admit_with_fallback().unwrap();
            p.head_received();
            p.record(Outcome::Success);
        }
    };
    // A full window of fast successes, then one slow to its head.
    fast(4);
    let mut slow = b.admit_with_fallback().unwrap();
    advance(Duration::from_secs(3)).await;
    slow.head_received();
    slow.record(Outcome::Success);
    assert_eq!(b.snapshot().window.slow, 1);
    // Clean and full again, then one slow whose head was never reported:
    // judged when it is recorded.
    fast(4);
    assert_eq!(b.snapshot().window.slow, 0);
    let unjudged = b.admit_with_fallback().unwrap();
    advance(Duration::from_secs(3)).await;
    unjudged.record(Outcome::Success);
    assert_eq!(b.snapshot().window.slow, 1);
    assert_eq!(b.snapshot().counters.slow, 2);
    assert_eq!(b.state(), State::Closed);
}

/// Trips once half of at least four calls have been in flight past 5 s.
fn hanging_breaker() -> Breaker {
    base()
        .count_window(10)
        .min_calls(4)
        .no_failure_rate()
        .slow_call(Duration::from_secs(5), 0.5)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn calls_hanging_past_the_slow_threshold_trip_before_they_return() {
    let b = hanging_breaker();
    // Four calls hang (think: 60 s attempt timeouts that have not fired yet).
    let hanging: Vec<_> = (0..4).map(|_| b.admit_with_fallback().unwrap()).collect();
    advance(Duration::from_secs(6)).await;
    // The next admission notices that they crossed the threshold, trips
    // the circuit, and is the first call it turns away.
    assert!(
        b.admit_with_fallback().is_err(),
        "the tripping admission is rejected"
    );
    assert_eq!(
        b.state(),
        State::Open,
        "tripped while the calls are still in flight"
    );
    assert_eq!(b.snapshot().counters.slow, 4);
    // Their eventual failures belong to the closed period that has ended:
    // counted in the lifetime counters only, and not slow a second time.
    for h in hanging {
        h.record(Outcome::Failure);
    }
    let snap = b.snapshot();
    assert_eq!(snap.counters.failures, 4);
    assert_eq!(snap.counters.slow, 4);
    assert_eq!(snap.window.slow, 4, "the window that tripped it");
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_fallback_finds_the_tracked_calls_that_crossed() {
    // The in-flight limit is on (the default): calls without a fallback
    // are not tracked by the slow-call rule, but their admissions still
    // sweep for the tracked calls that crossed.
    let b = hanging_breaker();
    let untracked = b.admit().unwrap();
    advance(Duration::from_secs(6)).await;
    assert!(b.admit().is_ok(), "nothing tracked has crossed");
    assert_eq!(
        b.snapshot().counters.slow,
        0,
        "calls without a fallback are not tracked"
    );
    let hanging: Vec<_> = (0..4).map(|_| b.admit_with_fallback().unwrap()).collect();
    advance(Duration::from_secs(6)).await;
    assert!(b.admit().is_err(), "the tripping admission is rejected");
    assert_eq!(b.state(), State::Open);
    assert_eq!(b.snapshot().counters.slow, 4);
    drop((untracked, hanging));
}

#[tokio::test(start_paused = true)]
async fn breakers_called_in_turn_each_end_their_open_period_on_time() {
    let tripped = |open: u64| {
        let b = base()
            .consecutive_failures(1)
            .open_duration(Duration::from_secs(open))
            .build()
            .unwrap();
        b.admit().unwrap().record(Outcome::Failure);
        b
    };
    let (a, d) = (tripped(30), tripped(100));
    advance(Duration::from_secs(5)).await;
    // Made and tripped 5 s after `a`: the same open period, counted from a
    // later start; and beside it, a longer one from that same start.
    let (b, c) = (tripped(30), tripped(40));
    let mut elapsed = 5;
    for step in [24, 1, 4, 1, 9, 1] {
        advance(Duration::from_secs(step)).await;
        elapsed += step;
        // Each is asked right after one whose open period ends later: `b`
        // after `c` (the same start), `a` after `b` (the same duration).
        for (name, breaker, ends) in [("d", &d, 100), ("c", &c, 45), ("b", &b, 35), ("a", &a, 30)] {
            assert_eq!(
                breaker.admit().is_ok(),
                elapsed >= ends,
                "{name} at {elapsed} s"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn open_rejects_with_time_until_the_next_probe() {
    let b = base()
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(30))
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 1);
    advance(Duration::from_secs(10)).await;
    let err = b.admit().unwrap_err();
    assert_eq!(err.state(), State::Open);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(20)));
    advance(Duration::from_secs(20) - Duration::from_nanos(1)).await;
    assert!(
        b.admit().is_err(),
        "half-open only once the open duration has fully elapsed"
    );
    advance(Duration::from_nanos(1)).await;
    let probe = b.admit().expect("probe admitted");
    assert!(probe.is_probe());
    assert_eq!(b.state(), State::HalfOpen);
}

fn tripped(probes: u32, close_after: u32) -> Breaker {
    let b = base()
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(10))
        .max_open_duration(Duration::from_secs(60))
        .probes(probes)
        .close_after(close_after)
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 1);
    b
}

#[tokio::test(start_paused = true)]
async fn half_open_closes_after_close_after_successes() {
    let b = tripped(3, 2);
    advance(Duration::from_secs(10)).await;
    let probes: Vec<_> = (0..3).map(|_| b.admit().unwrap()).collect();
    assert!(b.admit().is_err(), "the fourth caller is rejected");
    let mut probes = probes.into_iter();
    probes.next().unwrap().record(Outcome::Success);
    assert_eq!(b.state(), State::HalfOpen);
    probes.next().unwrap().record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
    // The third probe's outcome belongs to the finished cycle.
    probes.next().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn half_open_reopens_as_soon_as_closing_is_out_of_reach() {
    let b = tripped(3, 2);
    advance(Duration::from_secs(10)).await;
    let mut probes: Vec<_> = (0..3).map(|_| b.admit().unwrap()).collect();
    probes.pop().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), State::HalfOpen, "two probes could still succeed");
    probes.pop().unwrap().record(Outcome::Failure);
    assert_eq!(
        b.state(),
        State::Open,
        "one probe left cannot make two successes"
    );
}

#[tokio::test(start_paused = true)]
async fn dropped_ignored_and_rate_limited_probes_give_their_slot_back() {
    let b = tripped(1, 1);
    advance(Duration::from_secs(10)).await;
    let p = b.admit().unwrap();
    assert!(b.admit().is_err());
    drop(p);
    let p = b.admit().expect("the dropped probe's slot is free again");
    p.record(Outcome::Ignored);
    let p = b.admit().expect("an ignored probe's slot is free again");
    p.record(Outcome::RateLimited { retry_after: None });
    let p = b
        .admit()
        .expect("a rate-limited probe's slot is free again");
    assert_eq!(b.state(), State::HalfOpen);
    p.record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_streaming_probe_gives_its_slot_back_when_its_lease_expires() {
    let b = base()
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(10))
        .probes(1)
        .close_after(1)
        .probe_timeout(Duration::from_secs(2))
        .probe_lease(Duration::from_secs(5))
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 1);
    advance(Duration::from_secs(10)).await;
    let mut streaming = b.admit().unwrap();
    advance(Duration::from_secs(1)).await;
    // Its head came in time; its body is still streaming.
    streaming.head_received();
    advance(Duration::from_secs(4)).await;
    assert!(b.admit().is_err(), "held exactly its lease: it still holds");
    advance(Duration::from_nanos(1)).await;
    let fresh = b.admit().expect("the expired lease freed the slot");
    // The late outcome is dropped, and expiry was not a failure.
    streaming.record(Outcome::Failure);
    assert_eq!(b.state(), State::HalfOpen);
    fresh.record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
}

/// Tripped by one failure, open 10 s, probes failed 5 s after admission
/// without a head; returned once half-open.
async fn half_open_with_deadline(probes: u32, close_after: u32) -> Breaker {
    let b = base()
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(10))
        .probes(probes)
        .close_after(close_after)
        .probe_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 1);
    advance(Duration::from_secs(10)).await;
    b
}

#[tokio::test(start_paused = true)]
async fn a_probe_without_a_head_by_its_deadline_fails_and_reopens_then() {
    let b = half_open_with_deadline(3, 2).await;
    let hung: Vec<_> = (0..3).map(|_| b.admit().unwrap()).collect();
    advance(Duration::from_secs(5)).await;
    assert_eq!(
        b.state(),
        State::HalfOpen,
        "held exactly the deadline: in flight"
    );
    advance(Duration::from_nanos(1)).await;
    // Two probes without a head: closing is out of reach, so it reopens at
    // the deadline, with the backoff grown, and nobody had to call.
    let snap = b.snapshot();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.reopens, 1);
    assert_eq!(snap.retry_in, Some(Duration::from_secs(20)));
    // The second failure decided the cycle; the third probe belongs to it
    // no more.
    assert_eq!(snap.counters.probe_failures, 2);
    // Their late outcomes are dropped.
    for h in hung {
        h.record(Outcome::Success);
    }
    assert_eq!(b.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn an_idle_breaker_tells_its_state_at_the_deadline_it_passed() {
    let b = half_open_with_deadline(1, 1).await;
    let hung = b.admit().unwrap();
    // Nobody touches it for 100 s: the probe failed at 15 s, the circuit
    // reopened for 20 s, and went half-open again at 35 s.
    advance(Duration::from_secs(100)).await;
    let snap = b.snapshot();
    assert_eq!(snap.state, State::HalfOpen);
    assert_eq!(snap.reopens, 1);
    drop(hung);
}

#[tokio::test(start_paused = true)]
async fn a_slow_probe_is_a_failed_probe() {
    let b = base()
        .count_window(10)
        .min_calls(10)
        .slow_call(Duration::from_secs(1), 1.0)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(10))
        .probes(1)
        .close_after(1)
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 1);
    advance(Duration::from_secs(10)).await;
    let mut p = b.admit().unwrap();
    advance(Duration::from_secs(2)).await;
    p.head_received();
    p.record(Outcome::Success);
    assert_eq!(b.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn reopen_backoff_grows_and_stops_at_its_cap() {
    let b = tripped(1, 1);
    let mut seen = Vec::new();
    for _ in 0..6 {
        let wait = b.admit().unwrap_err().retry_after().unwrap();
        seen.push(wait.as_secs());
        advance(wait).await;
        b.admit().unwrap().record(Outcome::Failure);
    }
    assert_eq!(seen, [10, 20, 40, 60, 60, 60]);
    assert_eq!(b.snapshot().reopens, 6);
    // Closing resets the backoff.
    advance(Duration::from_secs(60)).await;
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
    record(&b, Outcome::Failure, 1);
    assert_eq!(
        b.admit().unwrap_err().retry_after(),
        Some(Duration::from_secs(10))
    );
}

#[tokio::test(start_paused = true)]
async fn jitter_shortens_open_durations_by_at_most_its_fraction() {
    let mut waits = Vec::new();
    for seed in 0..20 {
        let b = Breaker::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(1)
            .open_duration(Duration::from_secs(100))
            .jitter(0.2)
            .seed(seed)
            .build()
            .unwrap();
        record(&b, Outcome::Failure, 1);
        waits.push(b.admit().unwrap_err().retry_after().unwrap());
    }
    assert!(waits
        .iter()
        .all(|w| *w > Duration::from_secs(80) && *w <= Duration::from_secs(100)));
    waits.sort();
    waits.dedup();
    assert!(
        waits.len() > 10,
        "replicas with different seeds spread out: {waits:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outcome_counts_only_in_the_state_that_admitted_it() {
    let b = tripped(3, 2);
    // A call admitted while closed...
    b.reset();
    let slow_call = b.admit().unwrap();
    b.admit().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), State::Open);
    // ...that fails after the circuit opened neither extends the open period
    // nor counts as a probe.
    let before = b.admit().unwrap_err().retry_after();
    slow_call.record(Outcome::Failure);
    assert_eq!(b.admit().unwrap_err().retry_after(), before);
    advance(Duration::from_secs(10)).await;
    let probe = b.admit().unwrap();
    assert_eq!(b.state(), State::HalfOpen);
    probe.record(Outcome::Success);
    // The trip in `tripped`, the one above, and the late one.
    assert_eq!(
        b.snapshot().counters.failures,
        3,
        "lifetime counters see the late failure"
    );
}

#[tokio::test(start_paused = true)]
async fn forced_open_rejects_until_reset_and_does_not_advance_backoff() {
    let b = tripped(1, 1);
    b.force_open();
    advance(Duration::from_secs(3600)).await;
    let err = b.admit().unwrap_err();
    assert_eq!(err.state(), State::ForcedOpen);
    assert_eq!(err.retry_after(), None);
    b.reset();
    assert_eq!(b.state(), State::Closed);
    record(&b, Outcome::Failure, 1);
    assert_eq!(
        b.admit().unwrap_err().retry_after(),
        Some(Duration::from_secs(10))
    );
}

#[tokio::test(start_paused = true)]
async fn disabled_admits_everything_and_records_nothing() {
    let b = tripped(1, 1);
    b.disable();
    record(&b, Outcome::Failure, 100);
    assert_eq!(b.state(), State::Disabled);
    b.reset();
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.snapshot().consecutive_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn metrics_only_reports_transitions_but_never_rejects() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let b = base()
        .no_window()
        .consecutive_failures(2)
        .metrics_only(true)
        .on_transition(move |t| log.lock().unwrap().push((t.from, t.to, t.reason)))
        .build()
        .unwrap();
    record(&b, Outcome::Failure, 2);
    assert_eq!(b.state(), State::Open);
    // Would be rejected, but is admitted.
    record(&b, Outcome::Failure, 10);
    let snap = b.snapshot();
    assert_eq!(snap.counters.would_reject, 10);
    assert_eq!(snap.counters.rejected, 0);
    assert_eq!(
        *seen.lock().unwrap(),
        [(State::Closed, State::Open, Reason::ConsecutiveFailures)]
    );
}

#[tokio::test(start_paused = true)]
async fn counters_balance() {
    let b = tripped(2, 1);
    let dropped = b.admit();
    assert!(dropped.is_err());
    advance(Duration::from_secs(10)).await;
    drop(b.admit().unwrap());
    b.admit().unwrap().record(Outcome::Success);
    record(&b, Outcome::Ignored, 3);
    record(&b, Outcome::RateLimited { retry_after: None }, 2);
    let held = b.admit().unwrap();
    assert_eq!(b.snapshot().counters.in_flight, 1);
    drop(held);
    let c = b.snapshot().counters;
    assert_eq!(c.in_flight, 0, "no permit leaked");
    // The trip in `tripped`, a dropped and a successful probe, 3 ignored, 2
    // rate-limited, and the permit held above.
    assert_eq!(c.admitted, 9);
    assert_eq!(
        (c.dropped, c.rejected, c.successes, c.failures),
        (2, 1, 1, 1)
    );
}

#[tokio::test]
async fn bad_configuration_is_a_typed_error() {
    type Check = fn(&ConfigError) -> bool;
    let cases: Vec<(tower_circuit_breaker::Builder, Check)> = vec![
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .open_duration(Duration::ZERO),
            |e| matches!(e, ConfigError::ZeroOpenDuration),
        ),
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .count_window(10)
                .min_calls(11),
            |e| matches!(e, ConfigError::MinCallsAboveWindow { .. }),
        ),
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .open_duration(Duration::from_secs(30))
                .max_open_duration(Duration::from_secs(10)),
            |e| matches!(e, ConfigError::OpenMaxBelowOpen { .. }),
        ),
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .probes(2)
                .close_after(3),
            |e| matches!(e, ConfigError::CloseAfter { .. }),
        ),
        (
            Breaker::builder().trip_mode(TripMode::Open).probes(0),
            |e| matches!(e, ConfigError::ZeroProbes),
        ),
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .failure_rate(1.5),
            |e| matches!(e, ConfigError::Rate { .. }),
        ),
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .failure_rate(f64::NAN),
            |e| matches!(e, ConfigError::Rate { .. }),
        ),
        (
            Breaker::builder().trip_mode(TripMode::Open).jitter(1.0),
            |e| matches!(e, ConfigError::Jitter(_)),
        ),
        (
            Breaker::builder().trip_mode(TripMode::Open).count_window(0),
            |e| matches!(e, ConfigError::EmptyWindow),
        ),
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .consecutive_failures(0),
            |e| matches!(e, ConfigError::ZeroConsecutiveFailures),
        ),
        (
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .slow_call(Duration::ZERO, 0.5),
            |e| matches!(e, ConfigError::ZeroSlowThreshold),
        ),
    ];
    for (builder, expected) in cases {
        let err = builder.build().unwrap_err();
        assert!(expected(&err), "unexpected error {err:?}");
        assert!(!err.to_string().is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn listeners_and_changed_see_every_transition() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let b = base()
        .name("gpt-4o/eu")
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(5))
        .probes(1)
        .close_after(1)
        .on_transition(move |t| log.lock().unwrap().push((t.key.clone(), t.to, t.open_for)))
        .build()
        .unwrap();
    let changed = b.changed();
    record(&b, Outcome::Failure, 1);
    changed.await;
    advance(Duration::from_secs(5)).await;
    b.admit().unwrap().record(Outcome::Success);
    let seen = seen.lock().unwrap();
    let key: Option<Arc<str>> = Some("gpt-4o/eu".into());
    assert_eq!(
        *seen,
        [
            (key.clone(), State::Open, Some(Duration::from_secs(5))),
            (key.clone(), State::HalfOpen, None),
            (key, State::Closed, None)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn shared_mode_admits_only_granted_probes_and_leaves_the_cycle_to_the_cluster() {
    let b = tripped(3, 2);
    let remote = b.remote();
    remote.set_shared(true);
    advance(Duration::from_secs(10)).await;
    assert!(b.admit().is_err(), "no probe granted yet");
    assert_eq!(b.state(), State::HalfOpen);
    remote.grant_probes(1);
    let p = b.admit().expect("the granted probe");
    assert!(b.admit().is_err());
    p.record(Outcome::Success);
    remote.grant_probes(1);
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(
        b.state(),
        State::HalfOpen,
        "the cluster decides, not this replica"
    );
    assert_eq!(b.snapshot().counters.probe_successes, 2);
    remote.close();
    assert_eq!(b.state(), State::Closed);

    remote.open_for(Duration::from_secs(7));
    assert_eq!(b.state(), State::Open);
    assert_eq!(
        b.admit().unwrap_err().retry_after(),
        Some(Duration::from_secs(7))
    );
    remote.open_for(Duration::from_secs(3));
    assert_eq!(
        b.admit().unwrap_err().retry_after(),
        Some(Duration::from_secs(3))
    );

    // Without the store, half-open is local again.
    remote.set_shared(false);
    advance(Duration::from_secs(3)).await;
    b.admit().unwrap().record(Outcome::Success);
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_long_stream_with_a_quick_first_token_is_not_slow() {
    let b = base()
        .count_window(4)
        .min_calls(1)
        .no_failure_rate()
        .slow_call(Duration::from_secs(2), 0.5)
        .build()
        .unwrap();
    let mut streaming = b.admit().unwrap();
    advance(Duration::from_millis(300)).await;
    streaming.head_received();
    // The body streams for a minute; other calls come and go meanwhile.
    advance(Duration::from_secs(60)).await;
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(b.snapshot().counters.slow, 0, "time to head was 300 ms");
    streaming.record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.snapshot().window.slow, 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_crossed_the_slow_threshold_counts_once_in_the_window() {
    let b = base()
        .count_window(10)
        .min_calls(10)
        .no_failure_rate()
        .slow_call(Duration::from_secs(5), 1.0)
        .build()
        .unwrap();
    let failing = b.admit_with_fallback().unwrap();
    let succeeding = b.admit_with_fallback().unwrap();
    advance(Duration::from_secs(6)).await;
    // This admission finds both in flight past the threshold.
    drop(b.admit_with_fallback().unwrap());
    let w = b.snapshot().window;
    assert_eq!((w.calls, w.failures, w.slow), (2, 0, 2));
    failing.record(Outcome::Failure);
    succeeding.record(Outcome::Success);
    let w = b.snapshot().window;
    assert_eq!(
        (w.calls, w.failures, w.slow),
        (2, 1, 2),
        "one entry each: slow, and failed if it failed"
    );
    assert_eq!(b.snapshot().consecutive_failures, 1);
    assert_eq!(b.snapshot().counters.slow, 2);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_call_counts_at_the_first_admission_after_it_crosses() {
    let b = base()
        .count_window(10)
        .min_calls(10)
        .no_failure_rate()
        .slow_call(Duration::from_secs(5), 1.0)
        .build()
        .unwrap();
    let hanging = b.admit_with_fallback().unwrap();
    advance(Duration::from_secs(5)).await;
    drop(b.admit_with_fallback().unwrap());
    assert_eq!(b.snapshot().counters.slow, 0, "exactly the threshold");
    advance(Duration::from_nanos(1)).await;
    drop(b.admit_with_fallback().unwrap());
    assert_eq!(b.snapshot().counters.slow, 1, "a nanosecond past it");
    assert_eq!(b.snapshot().window.slow, 1);
    hanging.record(Outcome::Success);
    assert_eq!(b.snapshot().counters.slow, 1, "counted once");
}

#[tokio::test(start_paused = true)]
async fn a_call_younger_than_one_that_finished_is_still_found_when_it_crosses() {
    let b = base()
        .count_window(10)
        .min_calls(10)
        .no_failure_rate()
        .slow_call(Duration::from_secs(5), 1.0)
        .build()
        .unwrap();
    let mut quick = b.admit_with_fallback().unwrap();
    advance(Duration::from_secs(1)).await;
    let hanging = b.admit_with_fallback().unwrap();
    quick.head_received();
    quick.record(Outcome::Success);
    // The oldest call could have crossed by now, but it finished: the
    // admission finds nothing, and looks again when the younger one can.
    advance(Duration::from_secs(5)).await;
    drop(b.admit_with_fallback().unwrap());
    assert_eq!(b.snapshot().counters.slow, 0);
    advance(Duration::from_nanos(1)).await;
    drop(b.admit_with_fallback().unwrap());
    assert_eq!(b.snapshot().counters.slow, 1);
    drop(hanging);
    assert_eq!(b.snapshot().counters.slow, 1);
}

#[tokio::test(start_paused = true)]
async fn calls_beyond_the_tracked_ones_are_judged_on_their_heads() {
    // A time window tracks eight calls in flight for each of `min_calls`
    // (16 at least); the rest are judged when their heads come.
    let b = base()
        .time_window(Duration::from_secs(60), 6)
        .min_calls(2)
        .no_failure_rate()
        .slow_call(Duration::from_secs(5), 1.0)
        .build()
        .unwrap();
    record(&b, Outcome::Success, 10);
    let hanging: Vec<_> = (0..18).map(|_| b.admit_with_fallback().unwrap()).collect();
    advance(Duration::from_secs(6)).await;
    drop(b.admit_with_fallback().unwrap());
    assert_eq!(b.snapshot().counters.slow, 16, "the tracked ones crossed");
    for mut h in hanging {
        h.head_received();
        h.record(Outcome::Success);
    }
    let snap = b.snapshot();
    assert_eq!(snap.counters.slow, 18, "the other two, at their heads");
    assert_eq!((snap.window.calls, snap.window.slow), (28, 18));
    assert_eq!(snap.state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_call_of_an_ended_period_is_not_counted_in_the_next() {
    let b = base()
        .count_window(10)
        .min_calls(10)
        .no_failure_rate()
        .slow_call(Duration::from_secs(5), 1.0)
        .build()
        .unwrap();
    let old = b.admit().unwrap();
    b.reset();
    advance(Duration::from_secs(6)).await;
    drop(b.admit().unwrap());
    let snap = b.snapshot();
    assert_eq!((snap.counters.slow, snap.window.slow), (0, 0));
    old.record(Outcome::Failure);
    let snap = b.snapshot();
    assert_eq!((snap.counters.slow, snap.window.calls), (0, 0));
}
