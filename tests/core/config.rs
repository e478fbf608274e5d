//! Every configuration, at its extremes, either is a typed error from
//! `build()` or runs a whole trip / half-open / reopen / close cycle keeping
//! its promises: no panic, no wrap-around, exactly `probes` probes.
//!
//! More cases: `PROPTEST_CASES=2000 cargo test --release --test config`.

use std::time::Duration;
use tower_circuit_breaker::TripMode;

use proptest::prelude::*;
use tokio::time::advance;
use tower_circuit_breaker::{Breaker, Builder, ConfigError, Outcome, State};

const DURATIONS: [Duration; 8] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_millis(1),
    Duration::from_secs(30),
    Duration::from_secs(24 * 3600),
    Duration::from_secs(8 * 24 * 3600),
    Duration::from_secs(u64::MAX),
    Duration::MAX,
];

const COUNTS: [u32; 7] = [0, 1, 3, 20, 1 << 20, (1 << 20) + 1, u32::MAX];

const RATES: [f64; 8] = [-1.0, 0.0, 1e-9, 0.5, 1.0, 1.5, f64::NAN, f64::INFINITY];

/// One setting of the builder, at one of its interesting values.
#[derive(Debug, Clone)]
enum Setting {
    CountWindow(u32),
    TimeWindow(Duration, u32),
    MinCalls(u32),
    FailureRate(f64),
    Consecutive(u32),
    SlowCall(Duration, f64),
    Open(Duration),
    OpenMax(Duration),
    Multiplier(f64),
    Jitter(f64),
    Probes(u32),
    CloseAfter(u32),
    Lease(Duration),
    ProbeTimeout(Duration),
    Stripes(usize),
}

impl Setting {
    fn apply(&self, b: Builder) -> Builder {
        match *self {
            Setting::CountWindow(n) => b.count_window(n),
            Setting::TimeWindow(span, buckets) => b.time_window(span, buckets),
            Setting::MinCalls(n) => b.min_calls(n),
            Setting::FailureRate(r) => b.failure_rate(r),
            Setting::Consecutive(n) => b.consecutive_failures(n),
            Setting::SlowCall(t, r) => b.slow_call(t, r),
            Setting::Open(d) => b.open_duration(d),
            Setting::OpenMax(d) => b.max_open_duration(d),
            Setting::Multiplier(m) => b.backoff_multiplier(m),
            Setting::Jitter(j) => b.jitter(j),
            Setting::Probes(n) => b.probes(n),
            Setting::CloseAfter(n) => b.close_after(n),
            Setting::Lease(d) => b.probe_lease(d),
            Setting::ProbeTimeout(d) => b.probe_timeout(d),
            Setting::Stripes(n) => b.counter_stripes(n),
        }
    }
}

fn duration() -> impl Strategy<Value = Duration> {
    prop::sample::select(DURATIONS.to_vec())
}

fn count() -> impl Strategy<Value = u32> {
    prop::sample::select(COUNTS.to_vec())
}

fn rate() -> impl Strategy<Value = f64> {
    prop::sample::select(RATES.to_vec())
}

fn setting() -> impl Strategy<Value = Setting> {
    prop_oneof![
        count().prop_map(Setting::CountWindow),
        (duration(), count()).prop_map(|(d, n)| Setting::TimeWindow(d, n)),
        count().prop_map(Setting::MinCalls),
        rate().prop_map(Setting::FailureRate),
        count().prop_map(Setting::Consecutive),
        (duration(), rate()).prop_map(|(d, r)| Setting::SlowCall(d, r)),
        duration().prop_map(Setting::Open),
        duration().prop_map(Setting::OpenMax),
        prop::sample::select(vec![0.0, 1.0, 2.0, 1e300, f64::NAN, f64::INFINITY])
            .prop_map(Setting::Multiplier),
        rate().prop_map(Setting::Jitter),
        count().prop_map(Setting::Probes),
        count().prop_map(Setting::CloseAfter),
        duration().prop_map(Setting::Lease),
        duration().prop_map(Setting::ProbeTimeout),
        prop::sample::select(vec![0usize, 1, 16, 1024, 1025, 1 << 40, usize::MAX])
            .prop_map(Setting::Stripes),
    ]
}

/// Records failures until the circuit leaves `Closed`; how many it took.
fn trip(b: &Breaker) -> u64 {
    // The largest rule needs 2^20 calls; a little more for the window to fill.
    let limit = (1u64 << 20) + 2;
    for n in 1..=limit {
        b.admit()
            .expect("a closed circuit admits")
            .record(Outcome::Failure);
        if b.state() != State::Closed {
            return n;
        }
    }
    panic!("{limit} failures did not trip {b:?}");
}

/// Admits everything half-open will take; checks it is exactly `probes`.
fn probes(b: &Breaker, probes: u32) -> Vec<tower_circuit_breaker::Permit> {
    assert_eq!(b.state(), State::HalfOpen);
    let attempts = probes as usize + 10;
    let admitted: Vec<_> = (0..attempts).filter_map(|_| b.admit().ok()).collect();
    assert_eq!(admitted.len(), probes as usize, "exactly the probe budget");
    assert!(admitted.iter().all(|p| p.is_probe()));
    admitted
}

fn full_cycle(settings: &[Setting]) -> Result<(), ConfigError> {
    let builder = settings.iter().fold(
        Breaker::builder().trip_mode(TripMode::Open).seed(9),
        |b, s| s.apply(b),
    );
    // The settings as the builder resolved them, read back through a probe
    // of the same configuration: `probes` and `close_after` are all a
    // cycle needs to know.
    let (n_probes, close_after) = settings.iter().fold((3, 2), |(p, c), s| match *s {
        Setting::Probes(n) => (n, c),
        Setting::CloseAfter(n) => (p, n),
        _ => (p, c),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let b = builder.build()?;
        trip(&b);
        // At most the cap (a week) of waiting; jitter only shortens it.
        let week = Duration::from_secs(7 * 24 * 3600);
        for _ in 0..2 {
            // Fail every probe: it reopens, with the backoff grown but capped.
            advance(week + Duration::from_nanos(1)).await;
            let ps = probes(&b, n_probes);
            for p in ps {
                p.record(Outcome::Failure);
            }
            assert_eq!(b.state(), State::Open, "failed probes reopen it");
        }
        advance(week + Duration::from_nanos(1)).await;
        let ps = probes(&b, n_probes);
        for (i, p) in ps.into_iter().enumerate() {
            p.record(Outcome::Success);
            let expected = if i as u32 + 1 >= close_after {
                State::Closed
            } else {
                State::HalfOpen
            };
            assert_eq!(b.state(), expected);
        }
        // And it can trip again.
        trip(&b);
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn every_configuration_builds_to_an_error_or_runs_a_full_cycle(
        settings in prop::collection::vec(setting(), 0..6)
    ) {
        // Either outcome is fine; a panic or a broken promise is not.
        let _ = full_cycle(&settings);
    }
}

/// Every setting alone at every one of its values, plus the pairs that
/// bound each other (a lease against a probe timeout, `close_after` against
/// `probes`, `min_calls` against a window).
#[test]
fn every_setting_at_every_extreme_builds_to_an_error_or_runs_a_full_cycle() {
    let mut alone: Vec<Vec<Setting>> = Vec::new();
    for d in DURATIONS {
        for s in [
            Setting::Open(d),
            Setting::OpenMax(d),
            Setting::Lease(d),
            Setting::ProbeTimeout(d),
            Setting::SlowCall(d, 0.5),
            Setting::TimeWindow(d, 10),
        ] {
            alone.push(vec![s]);
        }
        alone.push(vec![
            Setting::ProbeTimeout(Duration::from_millis(1)),
            Setting::Lease(d),
        ]);
    }
    for n in COUNTS {
        for s in [
            Setting::CountWindow(n),
            Setting::MinCalls(n),
            Setting::Consecutive(n),
            Setting::Probes(n),
            Setting::CloseAfter(n),
            Setting::TimeWindow(Duration::from_secs(30), n),
        ] {
            alone.push(vec![s]);
        }
        alone.push(vec![Setting::Probes(n), Setting::CloseAfter(1)]);
        alone.push(vec![Setting::Probes(n), Setting::CloseAfter(n)]);
        alone.push(vec![Setting::CountWindow(n), Setting::MinCalls(n)]);
        alone.push(vec![
            Setting::TimeWindow(Duration::from_secs(30), 10),
            Setting::MinCalls(n),
        ]);
    }
    for r in RATES {
        alone.push(vec![Setting::FailureRate(r)]);
        alone.push(vec![Setting::Jitter(r)]);
        alone.push(vec![Setting::Multiplier(r)]);
        alone.push(vec![Setting::SlowCall(Duration::from_secs(1), r)]);
    }
    let (mut cycles, mut errors) = (0, 0);
    for settings in &alone {
        match full_cycle(settings) {
            Ok(()) => cycles += 1,
            Err(e) => {
                println!("{settings:?}: {e}");
                errors += 1
            }
        }
    }
    println!(
        "{} configurations: {cycles} full cycles, {errors} typed errors",
        alone.len()
    );
    assert!(
        cycles > 60 && errors > 60,
        "{cycles} cycles, {errors} errors"
    );
}

#[test]
fn extremes_are_typed_errors() {
    let err = |b: Builder| b.build().unwrap_err();
    assert!(matches!(
        err(Breaker::builder()
            .trip_mode(TripMode::Open)
            .open_duration(Duration::MAX)),
        ConfigError::TooLong {
            setting: "open_duration",
            ..
        }
    ));
    assert!(matches!(
        err(Breaker::builder()
            .trip_mode(TripMode::Open)
            .probes(u32::MAX)
            .close_after(1)),
        ConfigError::TooMany {
            setting: "probes",
            ..
        }
    ));
    assert!(matches!(
        err(Breaker::builder()
            .trip_mode(TripMode::Open)
            .time_window(Duration::from_secs(30), 10)
            .min_calls(u32::MAX)),
        ConfigError::TooMany {
            setting: "min_calls",
            ..
        }
    ));
    assert!(matches!(
        err(Breaker::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(u32::MAX)),
        ConfigError::TooMany {
            setting: "consecutive_failures",
            ..
        }
    ));
    assert!(matches!(
        err(Breaker::builder()
            .trip_mode(TripMode::Open)
            .count_window(u32::MAX)),
        ConfigError::WindowTooLarge(_)
    ));
    assert!(matches!(
        err(Breaker::builder()
            .trip_mode(TripMode::Open)
            .probe_timeout(Duration::ZERO)),
        ConfigError::ZeroProbeTimeout
    ));
    assert!(matches!(
        err(Breaker::builder()
            .trip_mode(TripMode::Open)
            .probe_lease(Duration::from_secs(1))),
        ConfigError::LeaseBelowProbeTimeout { .. }
    ));
}

#[test]
fn counter_stripes_are_bounded_instead_of_allocated() {
    // 2^40 stripes of 128 bytes each would abort the process inside build().
    for n in [1usize << 22, 1 << 40, usize::MAX] {
        assert!(matches!(
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .counter_stripes(n)
                .build()
                .unwrap_err(),
            ConfigError::TooMany {
                setting: "counter_stripes",
                max: 1024
            }
        ));
    }
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .counter_stripes(1024)
        .build()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_open_duration_alone_always_builds_with_backoff_on() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .open_duration(Duration::from_secs(600))
        .jitter(0.0)
        .consecutive_failures(1)
        .build()
        .expect("the default cap follows the open duration");
    b.admit().unwrap().record(Outcome::Failure);
    assert_eq!(b.snapshot().retry_in, Some(Duration::from_secs(600)));
    // A week-long open period: the default cap stays at the upper bound.
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .open_duration(Duration::from_secs(7 * 24 * 3600))
        .build()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_never_expiring_lease_keeps_the_probe_budget() {
    // `Duration::MAX` is the natural way to say "never": it saturates.
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(1))
        .probes(3)
        .probe_lease(Duration::MAX)
        .jitter(0.0)
        .build()
        .unwrap();
    b.admit().unwrap().record(Outcome::Failure);
    advance(Duration::from_secs(1)).await;
    let admitted: Vec<_> = (0..1_000)
        .filter_map(|_| b.admit().ok())
        .map(|mut p| {
            p.head_received();
            p
        })
        .collect();
    assert_eq!(admitted.len(), 3, "1,000 callers, 3 probe slots");
    advance(Duration::from_secs(3600 * 24 * 365)).await;
    assert!(b.admit().is_err(), "the lease never runs out");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_listener_never_reaches_the_caller() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let after = Arc::new(AtomicUsize::new(0));
    let seen = after.clone();
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .on_transition(|_| panic!("a listener with a bug"))
        .on_transition(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    // The transition happens inside `record`, on the request path.
    b.admit().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), State::Open);
    b.reset();
    assert_eq!(after.load(Ordering::SeqCst), 2, "later listeners still run");
    assert_eq!(b.snapshot().counters.listener_panics, 2);
}

/// A keyed set's own settings are the keyed set's errors, in a stack too;
/// the breaker settings its keys share stay the core's.
#[test]
fn a_keyed_stack_reports_the_keyed_sets_errors_apart_from_the_breakers() {
    use tower_circuit_breaker::keyed::{self, KeyedBreakers, KeyedConfigError};
    use tower_circuit_breaker::stack::{Stack, StackError};

    let build = |set| Stack::keyed(set, keyed::header("x-model")).build();
    assert_eq!(
        build(
            KeyedBreakers::builder()
                .trip_mode(TripMode::Open)
                .max_keys(0)
        )
        .unwrap_err(),
        StackError::Keyed(KeyedConfigError::KeyBounds)
    );
    assert_eq!(
        build(
            KeyedBreakers::builder()
                .trip_mode(TripMode::Open)
                .max_open_share(2.0)
        )
        .unwrap_err(),
        StackError::Keyed(KeyedConfigError::MaxOpenShare(2.0))
    );
    let err = build(
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .override_key("gpt-4o", |b| b.jitter(1.0)),
    )
    .unwrap_err();
    assert_eq!(
        err,
        StackError::Keyed(KeyedConfigError::Override {
            key: "gpt-4o".into(),
            error: ConfigError::Jitter(1.0)
        })
    );
    assert_eq!(
        err.to_string(),
        "key 'gpt-4o': jitter must be in [0, 1), got 1"
    );
    assert_eq!(
        build(KeyedBreakers::builder().trip_mode(TripMode::Open).probes(0)).unwrap_err(),
        StackError::Breaker(ConfigError::ZeroProbes)
    );
}
