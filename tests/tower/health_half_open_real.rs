//! A healthy health probe ends an open period and nothing else, over real
//! connections: a hyper-util client through the breaker and a hyper-util
//! health probe against an axum upstream on 127.0.0.1:0 that is healthy but
//! two seconds to its response head, in paused time.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use axum::routing::get;
use axum::Router;
use tokio::time::{sleep, Instant};
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::health::HealthProbe;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Outcome, Reason, State, Transition};

use crate::support::{get_req, http_client, serve};

const BUDGET: u32 = 3;

/// Probes at the upstream: requests that arrived while the circuit was
/// half-open (only probes are admitted then) and have not been answered.
#[derive(Clone, Default)]
struct Probes {
    now: Arc<AtomicU32>,
    max: Arc<AtomicU32>,
}

#[tokio::test(start_paused = true)]
async fn over_real_connections_a_slow_healthy_health_probe_ends_the_open_period_only() {
    type Log = Arc<Mutex<Vec<(Instant, State, State, Reason)>>>;
    let log: Log = Arc::default();
    let l = log.clone();
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(5))
        .probes(BUDGET)
        .close_after(2)
        .jitter(0.0)
        .on_transition(move |t: &Transition| {
            l.lock().unwrap().push((t.at, t.from, t.to, t.reason));
        })
        .build()
        .unwrap();

    let probes = Probes::default();
    let health_hits = Arc::new(AtomicUsize::new(0));
    let app = {
        let (b, p, h) = (breaker.clone(), probes.clone(), health_hits.clone());
        Router::new()
            .route(
                "/health",
                get(move || {
                    h.fetch_add(1, Ordering::SeqCst);
                    async {
                        sleep(Duration::from_secs(2)).await;
                        "ok"
                    }
                }),
            )
            .route(
                "/v1",
                get(move || {
                    let probe = b.state() == State::HalfOpen;
                    if probe {
                        let n = p.now.fetch_add(1, Ordering::SeqCst) + 1;
                        p.max.fetch_max(n, Ordering::SeqCst);
                    }
                    let p = p.clone();
                    async move {
                        sleep(Duration::from_secs(2)).await;
                        if probe {
                            p.now.fetch_sub(1, Ordering::SeqCst);
                        }
                        "answer"
                    }
                }),
            )
    };
    let addr = serve(app).await;

    let prober = HealthProbe::builder(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .jitter(0.0)
        .build(http_client(), HttpClassifier, move |_: &Breaker| {
            get_req(addr, "/health")
        })
        .unwrap();
    let health = tokio::spawn(prober.run(breaker.clone()));
    let client = CircuitBreakerLayer::new(breaker.clone())
        .with_classifier(HttpClassifier)
        .layer(http_client());

    breaker.admit().unwrap().record(Outcome::Failure);
    assert_eq!(breaker.state(), State::Open);

    // A request every 100 ms for 20 s.
    let start = Instant::now();
    let mut calls = Vec::new();
    for _ in 0..200 {
        let client = client.clone();
        calls.push(tokio::spawn(async move {
            let res = client.oneshot(get_req(addr, "/v1")).await;
            matches!(res, Ok(ref r) if r.status() == 200)
        }));
        sleep(Duration::from_millis(100)).await;
    }
    let mut answered = 0;
    for call in calls {
        answered += usize::from(call.await.unwrap());
    }
    health.abort();

    let log = log.lock().unwrap().clone();
    let snap = breaker.snapshot();
    println!(
        "health probes {} ({} healthy), calls answered {answered}, probe successes {}, \
         probes in flight at the upstream at most {} (budget {BUDGET}), transitions {log:?}",
        health_hits.load(Ordering::SeqCst),
        snap.counters.health_probe_successes,
        snap.counters.probe_successes,
        probes.max.load(Ordering::SeqCst),
    );
    assert!(snap.counters.health_probe_successes > 0);
    assert!(
        probes.max.load(Ordering::SeqCst) <= BUDGET,
        "probes in flight beyond the budget"
    );
    assert_eq!(snap.state, State::Closed);
    for (_, from, to, _) in &log {
        assert_ne!(from, to, "no transition without a change of state: {log:?}");
    }
    assert_eq!(
        log.iter()
            .filter(|(_, _, _, r)| *r == Reason::HealthProbe)
            .count(),
        1,
        "one heal ended the one open period: {log:?}"
    );
    let closed = log
        .iter()
        .find(|(_, _, to, _)| *to == State::Closed)
        .expect("closed");
    // The first health probe (sent at 1 s, head at 3 s) ends the open
    // period; the first probes' heads come 2 s later.
    assert!(
        closed.0.duration_since(start) <= Duration::from_secs(6),
        "closed within seconds: {log:?}"
    );
}

/// A health probe is judged by the guard's own rules, as a call is: sent
/// through a stack whose inner breaker is open, the probe comes back with
/// that breaker's rejection, which says nothing of the upstream. A call
/// through an outer breaker records it `Ignored`; the probe finds the same,
/// where the classifier alone (every error a failure) would say `Failure`.
#[tokio::test(start_paused = true)]
async fn over_a_real_connection_a_probe_rejected_further_in_is_ignored_as_a_call_is() {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = Router::new().route(
        "/health",
        get(move || {
            h.fetch_add(1, Ordering::SeqCst);
            async { "ok" }
        }),
    );
    let addr = serve(app).await;
    let inner = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("inner")
        .build()
        .unwrap();
    inner.force_open();
    let stack = CircuitBreakerLayer::new(inner.clone())
        .with_classifier(HttpClassifier)
        .layer(http_client());

    // A call: the outer breaker records the inner one's rejection as Ignored.
    let outer = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("outer")
        .build()
        .unwrap();
    let err = CircuitBreakerLayer::new(outer.clone())
        .with_classifier(HttpClassifier)
        .layer(stack.clone())
        .oneshot(get_req(addr, "/health"))
        .await
        .unwrap_err();
    assert_eq!(err.circuit_open().and_then(|o| o.key()), Some("inner"));
    let counters = outer.snapshot().counters;
    assert_eq!((counters.ignored, counters.failures), (1, 0));

    // A probe through the same stack is judged the same way.
    let mut prober = HealthProbe::builder(Duration::from_secs(1))
        .build(stack, HttpClassifier, move |_: &Breaker| {
            get_req(addr, "/health")
        })
        .unwrap();
    assert_eq!(prober.probe(&outer).await, Outcome::Ignored);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the upstream saw nothing");

    // Once the inner breaker admits again, the probe reaches the upstream.
    inner.reset();
    assert_eq!(prober.probe(&outer).await, Outcome::Success);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}
