//! Model checks of the state machine's concurrent core with loom.
//!
//! Every interleaving of the threads below (up to the preemption bound) is
//! explored. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom
//! ```
//!
//! Time plays no part: circuits open for 1ns (so they are due for half-open
//! by the time any thread runs) and probes hold hour-long leases.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use loom::thread;
use tower_circuit_breaker::{Breaker, Builder, InFlightLimit, Outcome, Permit, State};

/// Explores every interleaving, with a preemption bound of
/// `LOOM_MAX_PREEMPTIONS` (3 when unset, so a plain run finishes in minutes),
/// and prints how many it explored.
///
/// The model runs on a thread of its own: a thread that counted gives its
/// counter-stripe index back when it exits, and loom drops the statics of an
/// execution before the thread-locals of its main thread. So a model may
/// spawn three threads besides this one.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let f = Arc::new(f);
    builder.check(move || {
        counter.fetch_add(1, SeqCst);
        let f = f.clone();
        thread::spawn(move || f()).join().unwrap();
    });
    eprintln!(
        "{} interleavings explored (preemption bound {:?})",
        runs.load(SeqCst),
        builder.preemption_bound
    );
}

fn base() -> Builder<Breaker> {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .counter_stripes(1)
        .open_duration(Duration::from_nanos(1))
        .max_open_duration(Duration::from_nanos(1))
        .probe_timeout(Duration::from_secs(3600))
        .jitter(0.0)
        .seed(1)
}

/// A breaker that opens on one failure, with `probes` probe slots.
fn tripped(probes: u32, close_after: u32) -> Breaker {
    let b = base()
        .no_window()
        .consecutive_failures(1)
        .probes(probes)
        .close_after(close_after)
        .build()
        .unwrap();
    b.admit().unwrap().record(Outcome::Failure);
    // Open for a nanosecond: by now it may already say half-open.
    assert_ne!(b.state(), State::Closed);
    b
}

/// Waits (on the real clock, not modelled) until the 1ns open period is over
/// and the breaker admits a probe, then gives that probe's slot back.
fn into_half_open(b: &Breaker) {
    loop {
        if let Ok(p) = b.admit() {
            assert!(p.is_probe());
            drop(p);
            break;
        }
    }
    assert_eq!(b.state(), State::HalfOpen);
}

fn balance(b: &Breaker, in_flight: u64) {
    let c = b.snapshot().counters;
    assert_eq!(
        c.admitted,
        c.successes + c.failures + c.ignored + c.rate_limited + c.dropped + in_flight,
        "{c:?}"
    );
}

// === admission and half-open probe accounting ===

#[test]
fn three_threads_racing_out_of_open_get_exactly_two_probes() {
    model(|| {
        let b = tripped(2, 2);
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.admit().ok())
            })
            .collect();
        let permits: Vec<Permit> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        // The open period is over before any thread runs, and no slot is
        // given back: exactly two are admitted, both as probes.
        assert_eq!(permits.len(), 2);
        assert!(permits.iter().all(Permit::is_probe));
        assert_eq!(b.state(), State::HalfOpen);
        let c = b.snapshot().counters;
        assert_eq!((c.admitted, c.rejected), (3, 1)); // the trip's call and two probes; one rejected
        for p in permits {
            p.record(Outcome::Success);
        }
        assert_eq!(b.state(), State::Closed);
        balance(&b, 0);
    });
}

#[test]
fn a_dropped_probe_gives_its_slot_back_and_never_more_than_two_are_held() {
    model(|| {
        let b = tripped(2, 2);
        into_half_open(&b);
        let held = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let (b, held) = (b.clone(), held.clone());
                thread::spawn(move || {
                    let p = b.admit().ok()?;
                    let now = held.fetch_add(1, SeqCst) + 1;
                    assert!(now <= 2, "{now} probes held at once");
                    if i == 0 {
                        // A cancelled probe: its slot comes back.
                        held.fetch_sub(1, SeqCst);
                        drop(p);
                        None
                    } else {
                        Some(p)
                    }
                })
            })
            .collect();
        let permits: Vec<Permit> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        assert!(permits.len() <= 2);
        // Whatever the order, a slot is free now exactly when fewer than two
        // probes are held.
        let extra = b.admit();
        assert_eq!(extra.is_ok(), permits.len() < 2, "held {}", permits.len());
        drop(extra);
        drop(permits);
        assert_eq!(b.state(), State::HalfOpen);
        balance(&b, 0);
    });
}

#[test]
fn a_failed_and_a_successful_probe_racing_reopen_once() {
    model(|| {
        let transitions = Arc::new(AtomicUsize::new(0));
        let t = transitions.clone();
        let b = base()
            .no_window()
            .consecutive_failures(1)
            .probes(2)
            .close_after(2)
            .on_transition(move |tr| {
                if tr.to == State::Open {
                    t.fetch_add(1, SeqCst);
                }
            })
            .build()
            .unwrap();
        b.admit().unwrap().record(Outcome::Failure);
        into_half_open(&b);
        let p1 = b.admit().unwrap();
        let p2 = b.admit().unwrap();
        let h1 = thread::spawn(move || p1.record(Outcome::Failure));
        let h2 = thread::spawn(move || p2.record(Outcome::Success));
        h1.join().unwrap();
        h2.join().unwrap();
        // Two successes were needed; one failure makes that impossible,
        // whichever outcome lands first. The success that lands after the
        // reopen belongs to a finished cycle and is dropped.
        // (Reopened for a nanosecond: by now it may say half-open again.)
        let s = b.snapshot();
        assert_ne!(s.state, State::Closed);
        assert_eq!(s.reopens, 1);
        assert_eq!(transitions.load(SeqCst), 2, "the trip and one reopen");
        balance(&b, 0);
    });
}

#[test]
fn closed_admissions_racing_a_trip_neither_double_trip_nor_count_late() {
    model(|| {
        let transitions = Arc::new(AtomicUsize::new(0));
        let t = transitions.clone();
        let b = base()
            .no_window()
            .consecutive_failures(2)
            .open_duration(Duration::from_secs(3600))
            .max_open_duration(Duration::from_secs(3600))
            .on_transition(move |_| {
                t.fetch_add(1, SeqCst);
            })
            .build()
            .unwrap();
        b.admit().unwrap().record(Outcome::Failure);
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || {
                    if let Ok(p) = b.admit() {
                        p.record(Outcome::Failure);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = b.snapshot();
        assert_eq!(s.state, State::Open);
        assert_eq!(s.reopens, 0);
        assert_eq!(transitions.load(SeqCst), 1, "exactly one trip");
        balance(&b, 0);
    });
}

// === count window ===

/// A count window of 2 that opens only when both calls failed.
fn window_of_two() -> Breaker {
    base()
        .count_window(2)
        .min_calls(2)
        .failure_rate(1.0)
        .open_duration(Duration::from_secs(3600))
        .max_open_duration(Duration::from_secs(3600))
        .build()
        .unwrap()
}

fn record(b: &Breaker, outcome: Outcome) {
    b.admit().unwrap().record(outcome);
}

/// Once `n` successes have pushed everything else out of a window of `n`,
/// its failure counter must read zero, and one failure must read one: the
/// counter equals the failure bits in the slots.
fn assert_window_is_consistent(b: &Breaker, n: u64) {
    for _ in 0..n {
        record(b, Outcome::Success);
    }
    let w = b.snapshot().window;
    assert_eq!((w.calls, w.failures), (n, 0), "after {n} successes");
    record(b, Outcome::Failure);
    let w = b.snapshot().window;
    assert_eq!((w.calls, w.failures), (n, 1), "after one more failure");
    assert_eq!(b.state(), State::Closed);
}

#[test]
fn concurrent_records_keep_the_failure_counter_equal_to_the_slots() {
    model(|| {
        let b = window_of_two();
        // Three writers on the two slots of a window still filling up: the
        // first and the last write the same slot, and their counter updates
        // may land in either order.
        let handles: Vec<_> = [Outcome::Failure, Outcome::Success, Outcome::Success]
            .into_iter()
            .map(|o| {
                let p = b.admit().unwrap();
                thread::spawn(move || p.record(o))
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // One failure can never fill a window of two with failures.
        assert_eq!(b.state(), State::Closed, "{:?}", b.snapshot());
        let w = b.snapshot().window;
        assert!(w.failures <= 1, "{w:?}");
        assert_window_is_consistent(&b, 2);
        balance(&b, 0);
    });
}

#[test]
fn a_failure_and_a_success_on_one_slot_never_report_more_failures_than_calls() {
    model(|| {
        let b = base()
            .count_window(1)
            .min_calls(1)
            .failure_rate(1.0)
            .open_duration(Duration::from_secs(3600))
            .max_open_duration(Duration::from_secs(3600))
            .build()
            .unwrap();
        // Both land on the one slot of an empty window.
        let p1 = b.admit().unwrap();
        let p2 = b.admit().unwrap();
        let h1 = thread::spawn(move || p1.record(Outcome::Failure));
        let h2 = thread::spawn(move || p2.record(Outcome::Success));
        h1.join().unwrap();
        h2.join().unwrap();
        // Either order may trip (a window of one that held a failure), but
        // the window reported, live or the one that tripped, is a real one.
        let w = b.snapshot().window;
        assert!(w.failures <= w.calls && w.calls <= 1, "{w:?}");
        balance(&b, 0);
    });
}

fn reset_racing_a_record(prefill: [Outcome; 2], late: Outcome) {
    model(move || {
        let b = window_of_two();
        for o in prefill {
            record(&b, o);
        }
        let p = b.admit().unwrap();
        let b2 = b.clone();
        let writer = thread::spawn(move || p.record(late));
        let operator = thread::spawn(move || b2.reset());
        writer.join().unwrap();
        operator.join().unwrap();
        assert_eq!(b.state(), State::Closed);
        assert_window_is_consistent(&b, 2);
        balance(&b, 0);
    });
}

#[test]
fn a_failure_recorded_during_reset_leaves_a_consistent_window() {
    // The late failure overwrites a success.
    reset_racing_a_record([Outcome::Success, Outcome::Success], Outcome::Failure);
}

#[test]
fn a_success_recorded_during_reset_leaves_a_consistent_window() {
    // The late success overwrites a failure.
    reset_racing_a_record([Outcome::Failure, Outcome::Success], Outcome::Success);
}

// === the per-thread tricks of the hot path, as they ship ===

/// A breaker no outcome here trips, one stripe owned by the first thread.
fn never_trips() -> Breaker {
    base()
        .no_window()
        .consecutive_failures(100)
        .counter_stripes(1)
        .build()
        .unwrap()
}

#[test]
fn counts_add_up_across_owned_stripes_spares_and_a_thread_index_handed_on() {
    model(|| {
        let b = never_trips();
        // The first thread to count owns the one stripe; when it exits, its
        // index goes to the next thread that counts, and the other thread
        // counts in the shared stripe.
        let first = b.clone();
        thread::spawn(move || first.admit().unwrap().record(Outcome::Success))
            .join()
            .unwrap();
        // A permit admitted here and recorded on another thread leaves its
        // reference with that thread, whose next admission takes it back.
        let carried = b.admit().unwrap();
        let mut carried = Some(carried);
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let b = b.clone();
                let carried = if i == 0 { carried.take() } else { None };
                thread::spawn(move || {
                    if let Some(p) = carried {
                        p.record(Outcome::Failure);
                    }
                    b.admit().unwrap().record(Outcome::Success);
                    b.admit().unwrap().record(Outcome::Failure);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let c = b.snapshot().counters;
        assert_eq!((c.admitted, c.successes, c.failures), (6, 3, 3), "{c:?}");
        balance(&b, 0);
    });
}

#[test]
fn keyed_calls_through_remembered_entries_count_on_their_own_key() {
    use tower_circuit_breaker::keyed::KeyedBreakers;
    model(|| {
        let set = KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(100)
            .counter_stripes(1)
            .build()
            .unwrap();
        for key in ["a", "b"] {
            set.admit(key).unwrap().record(Outcome::Success);
        }
        // Each thread looks its first key up twice, so it remembers that
        // entry; one then calls the other key.
        let handles: Vec<_> = [["a", "a", "b"], ["b", "b", "b"]]
            .into_iter()
            .map(|keys| {
                let set = set.clone();
                thread::spawn(move || {
                    for key in keys {
                        set.admit(key).unwrap().record(Outcome::Success);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        for (key, calls) in [("a", 3), ("b", 5)] {
            let c = set.get(key).unwrap().snapshot().counters;
            assert_eq!((c.admitted, c.successes), (calls, calls), "{key}: {c:?}");
        }
    });
}

// === which keys saw calls, for a shared-state backend ===

fn keyed_set() -> tower_circuit_breaker::keyed::KeyedBreakers {
    tower_circuit_breaker::keyed::KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(100)
        .counter_stripes(1)
        .build()
        .unwrap()
}

/// After the threads are done, a key's mark says it saw a call exactly when
/// the list holds it: no key is left where no look finds it.
fn not_stuck(set: &tower_circuit_breaker::keyed::KeyedBreakers, key: &str) {
    assert!(
        !set.model_stuck(key),
        "{key}: its mark and the list disagree"
    );
}

#[test]
fn a_call_racing_the_start_of_listening_leaves_no_mark_stuck() {
    model(|| {
        let set = keyed_set();
        // Called before anyone listens: its marks are set.
        set.admit("a").unwrap().record(Outcome::Success);
        set.admit("a").unwrap().record(Outcome::Success);
        let caller = {
            let set = set.clone();
            thread::spawn(move || set.admit("a").unwrap().record(Outcome::Success))
        };
        let listening = set.model_listen();
        caller.join().unwrap();
        not_stuck(&set, "a");
        drop(listening);
    });
}

// === the slow-call rule's calls in flight ===

/// Every call is slow: the threshold is a nanosecond, and the clock (real,
/// not modelled) moves on by more than that between any two steps. The
/// window (of 8, tracking 4 calls under loom) cannot trip.
///
/// The calling thread takes the one owned counter stripe first, so that
/// neither thread a model spawns can be handed it by the other (see the
/// counters' model).
fn slow_breaker() -> Breaker {
    let b = base()
        .count_window(8)
        .min_calls(8)
        .no_failure_rate()
        .slow_call(Duration::from_nanos(1), 1.0)
        .build()
        .unwrap();
    base()
        .build()
        .unwrap()
        .admit()
        .unwrap()
        .record(Outcome::Success);
    b
}

#[test]
fn calls_crossing_the_slow_threshold_are_counted_once_and_none_is_missed() {
    model(|| {
        // The slow-call rule watches calls with a fallback (the in-flight
        // limit holds the others), so these calls have one.
        let b = slow_breaker();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || {
                    let mut first = b.admit_with_fallback().unwrap();
                    // Sweeps (if it takes the sweep): the other thread's
                    // calls and `first` may be found crossed here.
                    let second = b.admit_with_fallback().unwrap();
                    // Takes its slot back, racing the other thread's sweep:
                    // crossed already, or judged slow now.
                    first.head_received();
                    first.record(Outcome::Success);
                    second
                })
            })
            .collect();
        let held: Vec<Permit> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        // No call missed: this admission finds the two still in flight
        // crossed, whoever swept last.
        let last = b.admit_with_fallback().unwrap();
        let s = b.snapshot();
        assert_eq!(s.counters.slow, 4, "each call once: {:?}", s.counters);
        assert_eq!((s.window.calls, s.window.slow), (4, 4), "{:?}", s.window);
        drop(last);
        for p in held {
            p.record(Outcome::Failure);
        }
        let s = b.snapshot();
        assert_eq!(s.counters.slow, 5, "the dropped call, at its drop");
        assert_eq!(
            (s.window.calls, s.window.failures, s.window.slow),
            (4, 2, 4),
            "a crossed call's failure marks its own entry"
        );
        assert_eq!(s.state, State::Closed);
        balance(&b, 0);
    });
}

/// A call without a fallback (not tracked: the in-flight limit, on by
/// default, holds it) is admitted while a call with one claims its slot:
/// the untracked admission skips the clock while nothing is tracked and
/// sweeps otherwise, and either way the tracked call is counted slow once.
#[test]
fn an_untracked_admission_racing_a_tracked_claim_misses_nothing() {
    model(|| {
        let b = slow_breaker();
        let t = b.clone();
        let tracked = thread::spawn(move || t.admit_with_fallback().unwrap());
        let u = b.clone();
        let untracked = thread::spawn(move || u.admit().unwrap());
        let tracked = tracked.join().unwrap();
        let untracked = untracked.join().unwrap();
        // Whoever swept (or not): this admission finds it crossed if no
        // sweep did.
        let last = b.admit().unwrap();
        let s = b.snapshot();
        assert_eq!(
            s.counters.slow, 1,
            "the tracked call once: {:?}",
            s.counters
        );
        assert_eq!((s.window.calls, s.window.slow), (1, 1), "{:?}", s.window);
        drop((last, untracked));
        tracked.record(Outcome::Success);
        assert_eq!(b.snapshot().counters.slow, 1, "not again at its outcome");
        assert_eq!(b.state(), State::Closed);
        balance(&b, 0);
    });
}

#[test]
fn a_call_claimed_while_a_sweep_resets_the_due_moment_is_not_missed() {
    use tower_circuit_breaker::breaker::InFlightRing;
    model(|| {
        // Calls slower than 100ns, the clock in hand: one call in flight
        // since 0, so a sweep is due from 101.
        let ring = Arc::new(InFlightRing::new(100));
        let (early, _) = ring.admit(0);
        // A call admitted at 50, before anything crossed: it claims its slot
        // and finds the moment 101 (earlier than its own, 151) already
        // there, unless it sees the sweep's reset.
        let r = ring.clone();
        let late = thread::spawn(move || r.admit(50));
        // A sweep at 200 (an admission's, before its own claim): it takes
        // the moment 101, then reads every slot. Either it finds the late
        // call (crossed by 200), or the late call found the reset and wrote
        // its own moment.
        let r = ring.clone();
        let sweeper = thread::spawn(move || if r.is_due(200) { r.sweep(200) } else { 0 });
        let (late, none) = late.join().unwrap();
        let swept = sweeper.join().unwrap();
        assert_eq!(none, 0, "nothing had crossed at 50");
        let after = if ring.is_due(1000) {
            ring.sweep(1000)
        } else {
            0
        };
        assert_eq!(
            swept + after,
            2,
            "swept {swept}, then {after}: a call missed"
        );
        assert!(
            ring.finish(early) && ring.finish(late),
            "each counted by a sweep"
        );
    });
}

/// A probe closing the circuit (which starts the ramp after half-open)
/// races a call with a fallback: whichever way it goes, once both are done
/// the ramp holds for calls with a fallback (an hour long, it admits
/// nothing yet) and never for calls without one.
#[test]
fn a_probe_closing_into_the_ramp_racing_an_admission_leaves_the_ramp_on() {
    model(|| {
        let b = base()
            .no_window()
            .consecutive_failures(1)
            .probes(1)
            .close_after(1)
            .ramp(Duration::from_secs(3600))
            .build()
            .unwrap();
        b.admit().unwrap().record(Outcome::Failure);
        let probe = loop {
            if let Ok(p) = b.admit() {
                break p;
            }
        };
        let other = b.clone();
        let t = thread::spawn(move || {
            if let Ok(p) = other.admit_with_fallback() {
                p.record(Outcome::Success);
            }
        });
        probe.record(Outcome::Success);
        t.join().unwrap();
        assert_eq!(b.state(), State::Closed);
        let refused = b.admit_with_fallback().unwrap_err();
        assert_eq!(refused.reason(), tower_circuit_breaker::Rejection::Ramp);
        b.admit().unwrap().record(Outcome::Success);
    });
}

/// A breaker whose in-flight limit watches: one call ended with an
/// overload signal. Nothing else can trip it. Its window is days long, so
/// no moment of the watch comes while a model runs: the calls in flight
/// are summed from the counters at the first watched admission, and
/// counted from then on.
fn watching() -> Breaker {
    let b = base()
        .no_window()
        .in_flight_limit(InFlightLimit::new().window(Duration::from_secs(6 * 24 * 3600)))
        .build()
        .unwrap();
    let mut p = b.admit().unwrap();
    p.overloaded();
    p.record(Outcome::Failure);
    assert_eq!(b.watch_counts(), Some((0, 0)), "the watch is on");
    b
}

/// While the in-flight limit watches, a call is admitted and ends without
/// the lock (its end adds to the window with one atomic add) while another
/// ends with a signal under it: every call is counted in flight once and
/// out once, and the window holds both.
#[test]
fn watched_calls_ending_with_and_without_the_lock_are_each_counted_once() {
    model(|| {
        let b = watching();
        let other = b.clone();
        let t = thread::spawn(move || {
            other.admit().unwrap().record(Outcome::Success);
        });
        let mut p = b.admit().unwrap();
        p.overloaded();
        p.record(Outcome::Failure);
        t.join().unwrap();
        assert_eq!(b.watch_counts(), Some((0, 2)));
        assert_eq!(b.in_flight_limit(), None);
    });
}

/// Calls with and without a fallback admitted and ended at once while the
/// limit watches: the counted ones (a fallback call is counted in flight,
/// not watched) leave the count at zero; only the watched one is in the
/// window.
#[test]
fn counted_and_watched_calls_racing_leave_the_count_at_zero() {
    model(|| {
        let b = watching();
        let (one, two) = (b.clone(), b.clone());
        let t1 = thread::spawn(move || {
            one.admit_with_fallback().unwrap().record(Outcome::Success);
        });
        let t2 = thread::spawn(move || {
            drop(two.admit().unwrap());
        });
        let p = b.admit().unwrap();
        assert!(matches!(b.watch_counts(), Some((1..=3, _))));
        p.record(Outcome::Success);
        t1.join().unwrap();
        t2.join().unwrap();
        // The dropped call is counted out but not in the window.
        assert_eq!(b.watch_counts(), Some((0, 1)));
    });
}
