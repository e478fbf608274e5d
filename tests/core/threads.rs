//! The state machine under real threads (no async runtime, no timers).

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use tower_circuit_breaker::{Breaker, Outcome, State};

#[test]
fn half_open_admits_exactly_the_probe_budget_across_eight_threads() {
    for _round in 0..20 {
        let b = Breaker::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(1)
            // So short that the circuit is due for half-open as soon as it
            // opened: the race is for the probe slots.
            .open_duration(Duration::from_nanos(1))
            .max_open_duration(Duration::from_nanos(1))
            .probe_timeout(Duration::from_secs(3600))
            .probes(3)
            .close_after(3)
            .jitter(0.0)
            .build()
            .unwrap();
        b.admit().unwrap().record(Outcome::Failure);
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (b, barrier) = (b.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    (0..1_000)
                        .filter_map(|_| b.admit().ok())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let permits: Vec<_> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        assert_eq!(permits.len(), 3);
        assert!(permits.iter().all(|p| p.is_probe()));
        assert_eq!(b.state(), State::HalfOpen);
        for p in permits {
            p.record(Outcome::Success);
        }
        assert_eq!(b.state(), State::Closed);
    }
}

#[test]
fn counters_balance_under_eight_threads_of_mixed_outcomes() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .count_window(50)
        .min_calls(50)
        .failure_rate(0.9)
        .open_duration(Duration::from_nanos(1))
        .max_open_duration(Duration::from_nanos(1))
        .probes(2)
        .close_after(1)
        .build()
        .unwrap();
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let b = b.clone();
            thread::spawn(move || {
                for i in 0..20_000u64 {
                    let Ok(p) = b.admit() else { continue };
                    match (i * 7 + t) % 10 {
                        0..=5 => p.record(Outcome::Success),
                        6 | 7 => p.record(Outcome::Failure),
                        8 => p.record(Outcome::Ignored),
                        _ => drop(p),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let c = b.snapshot().counters;
    // Every call was admitted or rejected, and every admitted one ended in
    // exactly one outcome: none leaked, none counted twice.
    assert_eq!(c.in_flight, 0);
    assert_eq!(c.admitted + c.rejected, 160_000);
    let w = b.snapshot().window;
    assert!(w.failures <= w.calls && w.calls <= 50, "{w:?}");
}

#[test]
fn counts_from_many_short_lived_threads_add_up() {
    // More threads than owned counter stripes, four alive at a time: the
    // stripes of exited threads are handed on, never shared by two live
    // threads, and no count is lost in the hand-over.
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .build()
        .unwrap();
    for _wave in 0..25 {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || {
                    for _ in 0..2_000 {
                        b.admit().unwrap().record(Outcome::Success);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    let c = b.snapshot().counters;
    assert_eq!(c.successes, 25 * 4 * 2_000);
    assert_eq!(c.admitted, c.successes);
    assert_eq!(c.in_flight, 0);
}

#[test]
fn a_busy_keys_counts_add_up_across_its_change_of_stripes() {
    // A keyed breaker counts in one shared stripe until it is busy, then
    // in stripes of its own: counts made on both sides of the change, by
    // threads racing through it, all add up.
    let set = tower_circuit_breaker::keyed::KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .build()
        .unwrap();
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (set, barrier) = (set.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for i in 0..3_000 {
                    let permit = set.admit("hot").unwrap();
                    permit.record(if i % 3 == 0 {
                        Outcome::Ignored
                    } else {
                        Outcome::Success
                    });
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let c = set.get("hot").unwrap().snapshot().counters;
    assert_eq!(c.admitted, 12_000);
    assert_eq!((c.successes, c.ignored), (8_000, 4_000));
    assert_eq!(c.in_flight, 0);
}
