//! Health probes and half-open: a healthy health probe ends an open period
//! and nothing else, so the probe budget holds while its probes are in
//! flight and real probes close the circuit.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response};
use tokio::time::{sleep, Instant};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::health::HealthProbe;
use tower_circuit_breaker::{BoxError, Breaker, Outcome, Reason, State, Transition};

type Log = Arc<Mutex<Vec<(Instant, State, State, Reason)>>>;

fn logged(b: tower_circuit_breaker::Builder) -> (Breaker, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let breaker = b
        .on_transition(move |t: &Transition| {
            l.lock().unwrap().push((t.at, t.from, t.to, t.reason));
        })
        .build()
        .unwrap();
    (breaker, log)
}

/// Probes in flight in the current half-open period, and the most seen at
/// once. A period ends when the circuit closes or opens: probes still out
/// from an earlier period were decided by its verdict and no longer hold a
/// slot. A half-open cycle restarted in place stays in the same period.
#[derive(Clone, Default)]
struct InFlight {
    /// (period, probes in flight in it)
    now: Arc<Mutex<(u64, u32)>>,
    period: Arc<AtomicU64>,
    max: Arc<AtomicU32>,
}

impl InFlight {
    fn watch(&self, b: tower_circuit_breaker::Builder) -> tower_circuit_breaker::Builder {
        let period = self.period.clone();
        b.on_transition(move |t: &Transition| {
            if t.to != State::HalfOpen {
                period.fetch_add(1, Ordering::SeqCst);
            }
        })
    }

    /// A probe just admitted goes out; returns its period and how many
    /// are out in it.
    fn enter(&self) -> (u64, u32) {
        let period = self.period.load(Ordering::SeqCst);
        let mut now = self.now.lock().unwrap();
        if now.0 != period {
            *now = (period, 0);
        }
        now.1 += 1;
        self.max.fetch_max(now.1, Ordering::SeqCst);
        (period, now.1)
    }

    fn leave(&self, period: u64) {
        let mut now = self.now.lock().unwrap();
        if now.0 == period {
            now.1 -= 1;
        }
    }

    fn max(&self) -> u32 {
        self.max.load(Ordering::SeqCst)
    }
}

#[tokio::test(start_paused = true)]
async fn a_healthy_health_probe_never_restarts_a_half_open_cycle_with_probes_in_flight() {
    const BUDGET: u32 = 3;
    let probes = InFlight::default();
    let (breaker, log) = logged(
        probes.watch(
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .no_window()
                .consecutive_failures(1)
                .open_duration(Duration::from_secs(5))
                .probes(BUDGET)
                .close_after(2)
                .jitter(0.0),
        ),
    );
    // Healthy, but two seconds to its response head.
    let health_calls = Arc::new(AtomicUsize::new(0));
    let h = health_calls.clone();
    let upstream = tower::service_fn(move |_req: Request<String>| {
        h.fetch_add(1, Ordering::SeqCst);
        async {
            sleep(Duration::from_secs(2)).await;
            Ok::<_, BoxError>(Response::new(String::new()))
        }
    });
    let prober = HealthProbe::builder(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .jitter(0.0)
        .build(upstream, HttpClassifier, |_: &Breaker| {
            Request::new(String::new())
        })
        .unwrap();
    tokio::spawn(prober.run(breaker.clone()));
    breaker.admit().unwrap().record(Outcome::Failure);
    assert_eq!(breaker.state(), State::Open);

    // A request every 100 ms for 60 s, each two seconds to its head.
    let admitted = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..600 {
        if let Ok(mut permit) = breaker.admit() {
            admitted.fetch_add(1, Ordering::SeqCst);
            let probes = probes.clone();
            tasks.push(tokio::spawn(async move {
                let probe = permit.is_probe().then(|| probes.enter());
                if let Some((_, n)) = probe {
                    assert!(n <= BUDGET, "{n} probes in flight, budget {BUDGET}");
                }
                sleep(Duration::from_secs(2)).await;
                permit.head_received();
                if let Some((period, _)) = probe {
                    probes.leave(period);
                }
                permit.record(Outcome::Success);
            }));
        }
        sleep(Duration::from_millis(100)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    let snap = breaker.snapshot();
    println!(
        "health probes {} ({} healthy), calls admitted {}, probe successes {}, \
         probes in flight at most {} (budget {BUDGET}), transitions {log:?}",
        health_calls.load(Ordering::SeqCst),
        snap.counters.health_probe_successes,
        admitted.load(Ordering::SeqCst),
        snap.counters.probe_successes,
        probes.max(),
    );
    assert!(probes.max() <= BUDGET);
    assert_eq!(snap.state, State::Closed);
    for (_, from, to, _) in &log {
        assert_ne!(from, to, "no transition without a change of state: {log:?}");
    }
    let closed = log
        .iter()
        .find(|(_, _, to, _)| *to == State::Closed)
        .expect("closed");
    // The first health probe (at 1 s, head at 3 s) ends the open period;
    // the first probes' heads come 2 s later.
    assert!(
        closed.0.duration_since(start) <= Duration::from_secs(6),
        "closed within seconds: {log:?}"
    );
    assert_eq!(
        log.iter()
            .filter(|(_, _, _, r)| *r == Reason::HealthProbe)
            .count(),
        1,
        "one heal ended the one open period: {log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_healthy_health_probe_in_half_open_changes_nothing() {
    let (breaker, log) = logged(
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(1)
            .open_duration(Duration::from_secs(10))
            .probes(2)
            .close_after(1)
            .probe_timeout(Duration::from_secs(50))
            .jitter(0.0),
    );
    breaker.admit().unwrap().record(Outcome::Failure);
    sleep(Duration::from_secs(10)).await;
    let hung = [breaker.admit().unwrap(), breaker.admit().unwrap()];
    assert!(hung.iter().all(|p| p.is_probe()));
    let before = log.lock().unwrap().len();
    for _ in 0..10 {
        breaker.record_health_probe(Outcome::Success);
    }
    assert_eq!(log.lock().unwrap().len(), before, "no transition");
    assert_eq!(breaker.state(), State::HalfOpen);
    assert!(breaker.admit().is_err(), "both slots are still held");
    assert_eq!(breaker.snapshot().counters.health_probe_successes, 10);
}

/// 1,000 callers race for probe slots while a health probe reports a heal
/// on every tick: over 10^5 ticks of 1 ms no more probes are in flight
/// than the budget.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn health_probes_racing_real_probes_keep_the_probe_budget() {
    const BUDGET: u32 = 3;
    const CALLERS: usize = 1_000;
    const TICKS: u32 = 100_000;
    let probes = InFlight::default();
    let breaker = probes
        .watch(Breaker::builder().trip_mode(TripMode::Open))
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_millis(20))
        .probes(BUDGET)
        .close_after(2)
        .probe_timeout(Duration::from_millis(15))
        .jitter(0.0)
        .build()
        .unwrap();
    let admitted = Arc::new(AtomicUsize::new(0));
    let tick = Arc::new(AtomicU32::new(0));
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        let (breaker, probes, admitted, tick) = (
            breaker.clone(),
            probes.clone(),
            admitted.clone(),
            tick.clone(),
        );
        callers.push(tokio::spawn(async move {
            let mut rng = (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            loop {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Each caller wakes about every 100 ticks.
                sleep(Duration::from_millis(1 + rng % 200)).await;
                if tick.load(Ordering::SeqCst) >= TICKS {
                    return;
                }
                let Ok(mut permit) = breaker.admit() else {
                    continue;
                };
                if !permit.is_probe() {
                    // Closed again: fail now and then so it keeps cycling.
                    permit.record(if rng.is_multiple_of(64) {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    });
                    continue;
                }
                admitted.fetch_add(1, Ordering::SeqCst);
                let (period, n) = probes.enter();
                assert!(n <= BUDGET, "{n} probes in flight, budget {BUDGET}");
                // Every head comes before the probe deadline, so the
                // cycle's probes in flight are the calls at the upstream.
                sleep(Duration::from_millis(rng % 14)).await;
                permit.head_received();
                probes.leave(period);
                permit.record(match rng % 3 {
                    0 => Outcome::Failure,
                    _ => Outcome::Success,
                });
            }
        }));
    }
    // The health prober: healthy on every tick.
    while tick.fetch_add(1, Ordering::SeqCst) < TICKS {
        breaker.record_health_probe(Outcome::Success);
        sleep(Duration::from_millis(1)).await;
    }
    for c in callers {
        c.await.unwrap();
    }
    let snap = breaker.snapshot();
    println!(
        "{TICKS} ticks, {CALLERS} callers: {} probes admitted, {} health successes, \
         probes in flight at most {} (budget {BUDGET})",
        admitted.load(Ordering::SeqCst),
        snap.counters.health_probe_successes,
        probes.max(),
    );
    assert!(probes.max() <= BUDGET);
    assert!(
        admitted.load(Ordering::SeqCst) > 1_000,
        "many half-open cycles ran"
    );
}
