//! The in-flight limit for calls without a fallback and the ramp after
//! half-open, on the core alone (mock calls held as permits, paused time).
#![cfg(not(loom))]

use std::time::Duration;
use tower_circuit_breaker::TripMode;

use tokio::time::advance;
use tower_circuit_breaker::{
    Breaker, ConfigError, InFlightLimit, Outcome, Permit, Rejection, State,
};

fn breaker() -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        // No rate rule: the limit alone is watched here.
        .no_window()
        .in_flight_limit(InFlightLimit::new().window(Duration::from_secs(10)))
        .build()
        .unwrap()
}

/// One round: `n` calls held at once, then ended; `fails(i)` says whether
/// the `i`-th (0-based, in admission order, so `i` is the calls in flight
/// it was admitted with) ends in an overload signal. Returns the
/// rejections.
fn round(b: &Breaker, n: usize, fails: impl Fn(usize) -> bool) -> usize {
    let mut held: Vec<(usize, Permit)> = Vec::new();
    let mut rejected = 0;
    for i in 0..n {
        match b.admit() {
            Ok(p) => held.push((i, p)),
            Err(e) => {
                assert_eq!(e.reason(), Rejection::InFlightLimit);
                assert_eq!(e.state(), State::Closed);
                rejected += 1;
            }
        }
    }
    for (i, mut p) in held {
        if fails(i) {
            p.overloaded();
            p.record(Outcome::Failure);
        } else {
            p.record(Outcome::Success);
        }
    }
    rejected
}

#[tokio::test(start_paused = true)]
async fn signals_at_the_same_share_at_every_load_leave_the_limit_unbounded() {
    let b = breaker();
    // 35 % of the calls at every level of load from 2 to 40 in flight.
    for step in 0..200 {
        let n = 2 + (step * 7) % 39;
        let rejected = round(&b, n, |i| (i * 7 + step) % 20 < 7);
        assert_eq!(rejected, 0);
        assert_eq!(b.in_flight_limit(), None, "step {step}");
        advance(Duration::from_millis(200)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn signals_that_grow_with_the_load_lower_the_limit_and_it_grows_back_once_they_stop() {
    let b = breaker();
    // A capacity of 8: calls beyond it are answered 503.
    let mut fell_at = None;
    for step in 0..50 {
        let n = 4 + step % 20;
        round(&b, n, |i| i >= 8);
        if fell_at.is_none() && b.in_flight_limit().is_some() {
            fell_at = Some(step);
        }
        advance(Duration::from_millis(100)).await;
    }
    let fell_at = fell_at.expect("the limit fell");
    assert!(fell_at < 30, "within a few seconds: step {fell_at}");
    let limit = b.in_flight_limit().unwrap();
    assert!(limit <= 12, "near the capacity: {limit}");
    // Beyond the limit, calls are refused.
    assert!(round(&b, 30, |i| i >= 8) > 0);
    // The load falls back within the capacity: no more signals, and the
    // limit grows by one a second until it is unbounded again.
    let mut last = limit;
    for _ in 0..60 {
        round(&b, 4, |_| false);
        advance(Duration::from_secs(1)).await;
        match b.in_flight_limit() {
            Some(l) => {
                assert!(l >= last && l <= last + 1, "additive: {last} -> {l}");
                last = l;
            }
            None => return,
        }
    }
    panic!("the limit never came back: {:?}", b.in_flight_limit());
}

#[tokio::test(start_paused = true)]
async fn rate_limited_outcomes_are_signals_too_and_each_kind_is_judged_alone() {
    let b = breaker();
    for step in 0..50 {
        let n = 4 + step % 20;
        // Timeouts at every load (not counted) and 429s beyond 8 (counted).
        let mut held: Vec<(usize, Permit)> =
            (0..n).filter_map(|i| Some((i, b.admit().ok()?))).collect();
        for (i, mut p) in held.drain(..) {
            if i >= 8 {
                p.record(Outcome::RateLimited { retry_after: None });
            } else if i % 3 == 0 {
                p.overloaded();
                p.record(Outcome::Failure);
            } else {
                p.record(Outcome::Success);
            }
        }
        advance(Duration::from_millis(100)).await;
    }
    assert!(b.in_flight_limit().is_some());
}

#[tokio::test(start_paused = true)]
async fn calls_with_a_fallback_are_not_held_to_the_limit() {
    let b = breaker();
    for step in 0..50 {
        round(&b, 4 + step % 20, |i| i >= 8);
        advance(Duration::from_millis(100)).await;
    }
    let limit = b.in_flight_limit().unwrap() as usize;
    let held: Vec<Permit> = (0..limit + 5)
        .map(|_| b.admit_with_fallback().unwrap())
        .collect();
    assert_eq!(b.admit().unwrap_err().reason(), Rejection::InFlightLimit);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_ramp_admits_a_rising_share_of_calls_with_a_fallback_and_a_trip_during_it_reopens_at_once(
) {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(3)
        .probes(1)
        .close_after(1)
        .open_duration(Duration::from_secs(30))
        .jitter(0.0)
        .ramp(Duration::from_secs(10))
        .build()
        .unwrap();
    let trip = |b: &Breaker| {
        for _ in 0..3 {
            b.admit().unwrap().record(Outcome::Failure);
        }
        assert_eq!(b.state(), State::Open);
    };
    trip(&b);
    advance(Duration::from_secs(30)).await;
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
    // 100 calls with a fallback each second of the ramp.
    let mut admitted = Vec::new();
    for _ in 0..10 {
        let mut n = 0;
        for _ in 0..100 {
            match b.admit_with_fallback() {
                Ok(p) => {
                    n += 1;
                    p.record(Outcome::Success);
                }
                Err(e) => assert_eq!(e.reason(), Rejection::Ramp),
            }
            advance(Duration::from_millis(10)).await;
        }
        admitted.push(n);
    }
    // Second s admits about 10 s + 5 of its 100.
    for (s, n) in admitted.iter().enumerate() {
        let expect = 10 * s as i32 + 5;
        assert!((n - expect).abs() <= 2, "second {s}: {admitted:?}");
    }
    assert!(b.admit_with_fallback().is_ok(), "the ramp is over");

    // Again, and this time the upstream fails during the ramp: the trip rule
    // reopens the circuit at once, and the ramp is over with it.
    trip(&b);
    advance(Duration::from_secs(60)).await;
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(b.state(), State::Closed);
    advance(Duration::from_secs(1)).await;
    trip(&b);
    assert_eq!(
        b.admit_with_fallback().unwrap_err().reason(),
        Rejection::Open
    );
}

#[test]
fn bad_limit_settings_are_typed_errors() {
    let bad = [
        InFlightLimit::new().window(Duration::from_millis(1)),
        InFlightLimit::new().window(Duration::from_secs(8 * 24 * 3600)),
        InFlightLimit::new().decrease(0.0),
        InFlightLimit::new().decrease(f64::NAN),
        InFlightLimit::new().increase(0),
        InFlightLimit::new().min_signals(0),
    ];
    for limit in bad {
        let err = Breaker::builder()
            .trip_mode(TripMode::Open)
            .in_flight_limit(limit)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::InFlightLimit(_)),
            "{limit:?}: {err}"
        );
    }
    let err = Breaker::builder()
        .trip_mode(TripMode::Open)
        .ramp(Duration::from_secs(8 * 24 * 3600))
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        ConfigError::TooLong {
            setting: "ramp",
            ..
        }
    ));
    assert!(Breaker::builder()
        .trip_mode(TripMode::Open)
        .ramp(Duration::ZERO)
        .build()
        .is_ok());
}

#[tokio::test(start_paused = true)]
async fn each_key_of_a_keyed_set_has_its_own_limit() {
    use tower_circuit_breaker::keyed::KeyedBreakers;
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .in_flight_limit(InFlightLimit::new().window(Duration::from_secs(10)))
        .build()
        .unwrap();
    let (busy, calm) = (set.get_or_insert("busy"), set.get_or_insert("calm"));
    for step in 0..50 {
        round(&busy, 4 + step % 20, |i| i >= 8);
        round(&calm, 4 + step % 20, |_| false);
        advance(Duration::from_millis(100)).await;
    }
    assert!(busy.in_flight_limit().is_some());
    assert_eq!(calm.in_flight_limit(), None);
    let held: Vec<Permit> = (0..30).map(|_| set.admit("calm").unwrap()).collect();
    drop(held);
}
