//! Breakers on several replicas sharing state through a real Redis server.
//!
//! Each replica is its own breaker with its own backend and connections.
//! Tests share the server on 6379 under unique prefixes; those that kill the
//! server start their own. Real time is unavoidable with a real server: every
//! wait is bounded, and no assertion is about how long anything took.

use crate::redis_support;
use crate::runner::{Rt, Trial};

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::AsyncCommands;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::redis::{
    Attachment, Backend, BackendBuilder, Client, Origin, SetupError, SCHEMA,
};
use tower_circuit_breaker::{
    Breaker, Builder, CircuitBreakerLayer, Outcome, Reason, State, TripMode,
};

use redis_support::{
    backend, connection, eventually, scratch_dir, shared_url, unique_prefix, Server,
};

const WAIT: Duration = Duration::from_secs(5);

/// `n` replicas of the breaker `name`, each with its own backend on `url`.
async fn replicas(
    n: usize,
    url: &str,
    prefix: &str,
    config: impl Fn() -> Builder<Breaker>,
) -> Vec<(Breaker, Attachment)> {
    replicas_with(n, url, prefix, config, |b| b).await
}

/// `replicas`, with `tweak` applied to every backend.
async fn replicas_with(
    n: usize,
    url: &str,
    prefix: &str,
    config: impl Fn() -> Builder<Breaker>,
    tweak: impl Fn(BackendBuilder) -> BackendBuilder,
) -> Vec<(Breaker, Attachment)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let breaker = config().build().expect("valid configuration");
        let attachment = tweak(backend(url, prefix))
            .build()
            .unwrap()
            .attach(&breaker)
            .expect("named breaker in a runtime");
        out.push((breaker, attachment));
    }
    let all_shared = eventually(WAIT, || async {
        out.iter()
            .all(|(b, a)| a.is_shared() && b.remote().is_shared())
    })
    .await;
    assert!(all_shared, "every replica reaches redis");
    out
}

/// Whether a replica is in `want`: one that opened may already say
/// half-open, its open period over before a loaded machine looked.
fn reached(now: State, want: State) -> bool {
    now == want || (want == State::Open && now == State::HalfOpen)
}

async fn all_in(replicas: &[(Breaker, Attachment)], state: State) -> bool {
    eventually(WAIT, || async {
        replicas.iter().all(|(b, _)| reached(b.state(), state))
    })
    .await
}

fn trip(breaker: &Breaker, failures: usize) {
    for _ in 0..failures {
        breaker.admit().unwrap().record(Outcome::Failure);
    }
}

/// Sums the cluster window's counts of `kind` (`c`, `f` or `s`).
async fn window_sum(prefix: &str, name: &str, kind: char) -> i64 {
    let mut conn = connection(shared_url()).await;
    let all: Vec<(String, i64)> = conn
        .hgetall(format!("{{{prefix}:{name}}}:v2:win"))
        .await
        .unwrap();
    all.iter()
        .filter(|(f, _)| f.starts_with(kind))
        .map(|(_, v)| v)
        .sum()
}

async fn a_trip_on_one_replica_opens_every_replica() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("trip");
    let replicas = replicas(3, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(3)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
    })
    .await;

    trip(&replicas[0].0, 3);
    assert_eq!(replicas[0].0.state(), State::Open);

    let rejecting = eventually(WAIT, || async {
        replicas[1..].iter().all(|(b, _)| b.admit().is_err())
    })
    .await;
    assert!(rejecting, "the other replicas reject too");
    for (b, _) in &replicas[1..] {
        let err = b.admit().unwrap_err();
        let wait = err.retry_after().expect("open circuits say when to retry");
        assert!(wait <= Duration::from_secs(30) + Duration::from_millis(10));
        assert!(wait > Duration::from_secs(25), "{wait:?}");
    }
}

async fn replicas_under_the_threshold_on_their_own_trip_together() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("aggregate");
    let replicas = replicas(5, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .count_window(20)
            .min_calls(10)
            .failure_rate(0.5)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
    })
    .await;

    // Four failures each: under min_calls (10) on every replica alone, 20
    // failures of 20 calls together.
    for (b, _) in &replicas {
        trip(b, 4);
        assert_eq!(b.state(), State::Closed, "not enough calls to trip alone");
    }
    assert!(
        all_in(&replicas, State::Open).await,
        "the cluster trips them all"
    );
}

async fn replicas_together_under_the_threshold_stay_closed() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("under");
    let replicas = replicas(5, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .count_window(20)
            .min_calls(10)
            .failure_rate(0.5)
    })
    .await;

    // One failure and one success each: 10 calls, 5 failures, 50 %... but
    // only once all ten are in. Send them one replica at a time and watch
    // the cluster count them.
    for (b, _) in &replicas[..4] {
        trip(b, 1);
        b.admit().unwrap().record(Outcome::Success);
    }
    let counted = eventually(WAIT, || async {
        window_sum(&prefix, "upstream", 'c').await == 8
    })
    .await;
    assert!(counted, "every replica's outcomes reach the cluster window");
    assert_eq!(window_sum(&prefix, "upstream", 'f').await, 4);
    for (b, _) in &replicas {
        assert_eq!(b.state(), State::Closed, "8 calls are under min_calls");
    }

    // The last two calls, both successes: 10 calls at 40 % stay closed.
    replicas[4].0.admit().unwrap().record(Outcome::Success);
    replicas[4].0.admit().unwrap().record(Outcome::Success);
    let counted = eventually(WAIT, || async {
        window_sum(&prefix, "upstream", 'c').await == 10
    })
    .await;
    assert!(counted);
    for (b, _) in &replicas {
        assert_eq!(b.state(), State::Closed, "40 % is under the 50 % rate");
    }
}

async fn eight_replicas_with_a_hundred_callers_each_send_at_most_probes_probes() {
    if redis_support::skip() {
        return;
    }
    const PROBES: usize = 3;
    let prefix = unique_prefix("probes");
    let replicas = replicas(8, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_millis(300))
            .probes(PROBES as u32)
            .close_after(2)
            .probe_timeout(Duration::from_secs(20))
    })
    .await;
    trip(&replicas[0].0, 1);
    assert!(all_in(&replicas, State::Open).await);

    // The upstream counts calls and holds each one until released, so every
    // probe stays in flight while the callers keep trying.
    let upstream_calls = Arc::new(AtomicUsize::new(0));
    let (release, released) = tokio::sync::watch::channel(false);
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for (breaker, _) in &replicas {
        let layer = CircuitBreakerLayer::new(breaker.clone());
        for _ in 0..100 {
            let calls = upstream_calls.clone();
            let released = released.clone();
            let svc = layer.layer(tower::service_fn(move |_req: http::Request<String>| {
                calls.fetch_add(1, Ordering::SeqCst);
                let mut released = released.clone();
                async move {
                    let _ = released.wait_for(|r| *r).await;
                    Ok::<_, Infallible>(http::Response::new(String::new()))
                }
            }));
            let stop = stop.clone();
            callers.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let res = svc.clone().oneshot(http::Request::new(String::new())).await;
                    if res.is_err() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }));
        }
    }

    // Open 300 ms, then half-open; give every replica ample time to claim.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let probes = upstream_calls.load(Ordering::SeqCst);
    assert!(
        (1..=PROBES).contains(&probes),
        "{probes} calls reached the upstream in half-open, budget {PROBES}"
    );

    // The probes succeed: the cluster closes on every replica.
    stop.store(true, Ordering::Relaxed);
    release.send_replace(true);
    assert!(all_in(&replicas, State::Closed).await, "the cluster closes");
    for c in callers {
        tokio::time::timeout(WAIT, c).await.unwrap().unwrap();
    }
}

/// Admits a call on `breaker`, retrying while it is turned away.
async fn admit_probe(breaker: &Breaker) -> tower_circuit_breaker::Permit {
    let mut permit = None;
    let admitted = eventually(WAIT, || {
        permit = permit.take().or_else(|| breaker.admit().ok());
        let got = permit.is_some();
        async move { got }
    })
    .await;
    assert!(admitted, "a probe is admitted");
    let permit = permit.unwrap();
    assert!(permit.is_probe());
    permit
}

async fn failed_probes_reopen_every_replica_with_backoff() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("reopen");
    let replicas = replicas(2, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_millis(200))
            .max_open_duration(Duration::from_secs(60))
            .backoff_multiplier(20.0)
            .probes(1)
            .close_after(1)
    })
    .await;
    trip(&replicas[0].0, 1);
    assert!(all_in(&replicas, State::Open).await);

    admit_probe(&replicas[1].0).await.record(Outcome::Failure);

    // Reopened by the cluster for 200 ms × 20 = 4 s, on both replicas.
    let reopened = eventually(WAIT, || async {
        replicas.iter().all(|(b, _)| {
            let s = b.snapshot();
            s.state == State::Open && s.retry_in.is_some_and(|d| d > Duration::from_secs(3))
        })
    })
    .await;
    assert!(reopened, "every replica applies the reopen and its backoff");
}

async fn a_dead_replicas_probe_slot_comes_back_when_its_lease_ends() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("lease");
    let config = || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_millis(200))
            .probes(1)
            .close_after(1)
            .probe_lease(Duration::from_millis(800))
    };
    let mut replicas = replicas(2, shared_url(), &prefix, config).await;
    trip(&replicas[0].0, 1);
    assert!(all_in(&replicas, State::Open).await);

    // Replica 0 takes the only slot, then dies with its probe in flight.
    let (dead, attachment) = replicas.remove(0);
    let permit = admit_probe(&dead).await;
    let claimed = Instant::now();
    drop(attachment);
    std::mem::forget(permit);

    // The other replica is turned away while the lease lasts, then probes.
    let (alive, _a) = &replicas[0];
    let permit = admit_probe(alive).await;
    assert!(
        claimed.elapsed() >= Duration::from_millis(700),
        "the slot stayed taken while its lease lasted"
    );
    permit.record(Outcome::Success);
    assert!(all_in(&replicas, State::Closed).await);
}

async fn restarting_redis_mid_traffic_fails_no_request_and_converges() {
    if redis_support::skip() {
        return;
    }
    let mut server = Server::start().await;
    let url = server.url();
    let prefix = unique_prefix("restart");
    let replicas = replicas(3, &url, &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(3)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
    })
    .await;

    // Steady traffic through replicas 1 and 2 to a healthy upstream; every
    // result is kept with the time it came back.
    let stop = Arc::new(AtomicBool::new(false));
    // When each call came back, and whether it failed on an open circuit.
    type Log = Vec<(Instant, Result<(), bool>)>;
    let results: Arc<Mutex<Log>> = Arc::default();
    let mut traffic = Vec::new();
    for (breaker, _) in &replicas[1..] {
        let svc = CircuitBreakerLayer::new(breaker.clone()).layer(tower::service_fn(
            |_req: http::Request<String>| async {
                Ok::<_, Infallible>(http::Response::new(String::new()))
            },
        ));
        for _ in 0..4 {
            let (svc, stop, results) = (svc.clone(), stop.clone(), results.clone());
            traffic.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let res = svc.clone().oneshot(http::Request::new(String::new())).await;
                    let res = res.map(drop).map_err(|e| e.is_circuit_open());
                    results.lock().unwrap().push((Instant::now(), res));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
    }

    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill().await;
    let fell_back = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|(b, a)| !a.is_shared() && !b.remote().is_shared())
    })
    .await;
    assert!(fell_back, "every replica falls back to its local breaker");

    // While Redis is away, replica 0 sees the upstream fail and trips alone.
    trip(&replicas[0].0, 3);
    assert_eq!(replicas[0].0.state(), State::Open);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        replicas[1..]
            .iter()
            .all(|(b, _)| b.state() == State::Closed),
        "without redis the trip stays local"
    );

    let restarted = Instant::now();
    server.restart().await;
    let back = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|(b, a)| a.is_shared() && b.remote().is_shared())
    })
    .await;
    assert!(back, "every replica shares state again");
    assert!(
        all_in(&replicas, State::Open).await,
        "the trip made during the outage reaches every replica"
    );

    stop.store(true, Ordering::Relaxed);
    for t in traffic {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
    }
    let results = results.lock().unwrap();
    let ok = results.iter().filter(|(_, r)| r.is_ok()).count();
    assert!(ok > 100, "traffic flowed throughout ({ok} calls)");
    for (at, r) in results.iter() {
        match r {
            Ok(()) => {}
            Err(true) => assert!(
                *at >= restarted,
                "only the cluster's open circuit, after the restart, rejects"
            ),
            Err(false) => panic!("a request failed for another reason"),
        }
    }
}

async fn garbage_in_the_keys_is_treated_as_absent() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("garbage");
    let name = "upstream";
    let state_key = format!("{{{prefix}:{name}}}:v2:state");
    let win_key = format!("{{{prefix}:{name}}}:v2:win");
    let probes_key = format!("{{{prefix}:{name}}}:v2:probes");
    let mut conn = connection(shared_url()).await;

    // Wrong types in every key.
    let _: () = conn.rpush(&state_key, "open").await.unwrap();
    let _: () = conn.set(&win_key, "garbage").await.unwrap();
    let _: () = conn.hset(&probes_key, "x", "y").await.unwrap();

    let replicas = replicas(2, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name(name)
            .consecutive_failures(2)
            .jitter(0.0)
            .open_duration(Duration::from_millis(300))
            .probes(1)
            .close_after(1)
    })
    .await;
    assert!(replicas.iter().all(|(b, _)| b.state() == State::Closed));

    // Well-typed nonsense: unknown state, non-numeric and absurd fields,
    // a probe lease far in the future.
    for fields in [
        vec![("state", "banana"), ("until", "12"), ("epoch", "x")],
        vec![("state", "open"), ("until", "soon"), ("reopens", "-3")],
        vec![("state", "open"), ("until", "1e300"), ("epoch", "nan")],
        vec![
            ("state", "open"),
            ("until", "99999999999999999"),
            ("ok", "inf"),
        ],
    ] {
        let _: () = conn.del(&state_key).await.unwrap();
        let _: () = conn.hset_multiple(&state_key, &fields).await.unwrap();
        let _: () = conn.del(&win_key).await.unwrap();
        let _: () = conn
            .hset_multiple(
                &win_key,
                &[
                    ("c:abc", "1"),
                    ("f:1", "x"),
                    ("c:99999999999999", "1e999"),
                    ("zzz", "1"),
                ],
            )
            .await
            .unwrap();
        let _: () = conn.del(&probes_key).await.unwrap();
        let _: () = conn.zadd(&probes_key, "squatter", 1e18).await.unwrap();
        let _: () = redis::cmd("PUBLISH")
            .arg(format!("{prefix}:events"))
            .arg(format!("v2 open 1 {name}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        // A closed-state outcome makes the replicas write to the window.
        replicas[0].0.admit().unwrap().record(Outcome::Success);
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (b, a) in &replicas {
            assert!(a.is_shared(), "garbage must not break the exchange");
            assert_eq!(
                b.state(),
                State::Closed,
                "garbage is no open circuit: {fields:?}"
            );
        }
    }

    // Junk on the channel is ignored.
    for junk in ["", "junk", "open", "open notanumber upstream", "open 1 "] {
        let _: () = redis::cmd("PUBLISH")
            .arg(format!("{prefix}:events"))
            .arg(junk)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    // And the state machine still works over what is left: a trip spreads,
    // and the far-future squatter does not take the only probe slot.
    trip(&replicas[0].0, 2);
    let rejecting = eventually(WAIT, || async { replicas[1].0.admit().is_err() }).await;
    assert!(rejecting);
    admit_probe(&replicas[1].0).await.record(Outcome::Success);
    assert!(all_in(&replicas, State::Closed).await);
    for (_, a) in &replicas {
        assert!(a.is_shared());
    }
}

async fn keyed_sets_share_each_key_and_learn_keys_they_never_saw() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("keyed");
    let config = || {
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(2)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (a, b) = (config(), config());
    let attach_a = backend(shared_url(), &prefix)
        .build()
        .unwrap()
        .attach_keyed(&a)
        .unwrap();
    let attach_b = backend(shared_url(), &prefix)
        .build()
        .unwrap()
        .attach_keyed(&b)
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            attach_a.is_shared() && attach_b.is_shared()
        })
        .await
    );

    b.admit("claude/us").unwrap().record(Outcome::Success);
    assert!(b.get("gpt-4o/eu").is_none());
    for _ in 0..2 {
        a.admit("gpt-4o/eu").unwrap().record(Outcome::Failure);
    }
    let learned = eventually(WAIT, || async {
        b.get("gpt-4o/eu").is_some_and(|k| k.state() == State::Open)
    })
    .await;
    assert!(learned, "replica b opens a key it had never seen");
    assert!(b.admit("gpt-4o/eu").is_err());
    assert!(b.admit("claude/us").is_ok(), "other keys are unaffected");

    // Only breaker keys appear in Redis key names.
    let mut conn = connection(shared_url()).await;
    let keys: Vec<String> = conn.keys(format!("{{{prefix}:*")).await.unwrap();
    assert!(!keys.is_empty());
    for k in &keys {
        let ok = ["gpt-4o/eu", "claude/us"].iter().any(|name| {
            ["state", "win", "probes"]
                .iter()
                .any(|kind| *k == format!("{{{prefix}:{name}}}:v2:{kind}"))
        });
        assert!(ok, "unexpected key {k}");
    }
}

async fn a_keyed_sets_trip_is_sent_on_its_transition_not_at_the_next_flush() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("keyed-wake");
    let set = || {
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    // Neither a flush nor a resync comes within the test: only the set's
    // own wake-up on the transition can send the trip.
    let slow = |b: BackendBuilder| {
        b.flush_interval(Duration::from_secs(60))
            .resync_interval(Duration::from_secs(60))
    };
    let (a, b) = (set(), set());
    let attach_a = slow(backend(shared_url(), &prefix))
        .build()
        .unwrap()
        .attach_keyed(&a)
        .unwrap();
    let attach_b = slow(backend(shared_url(), &prefix))
        .build()
        .unwrap()
        .attach_keyed(&b)
        .unwrap();
    for s in [&a, &b] {
        s.admit("gpt-4o/eu").unwrap().record(Outcome::Success);
    }
    assert!(
        eventually(WAIT, || async {
            attach_a.is_shared() && attach_b.is_shared()
        })
        .await
    );
    a.admit("gpt-4o/eu").unwrap().record(Outcome::Failure);
    let learned = eventually(WAIT, || async {
        b.get("gpt-4o/eu").is_some_and(|k| k.state() == State::Open)
    })
    .await;
    assert!(learned, "the other replica learns the trip at once");
    attach_a.detach().await;
    attach_b.detach().await;
}

async fn an_idle_key_that_sees_calls_again_is_summed_by_the_next_flushes() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("keyed-touched");
    let mut replicas = Vec::new();
    for _ in 0..5 {
        let set = KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .count_window(20)
            .min_calls(10)
            .failure_rate(0.5)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap();
        // No resync within the test: flushes alone carry the counts.
        let attachment = backend(shared_url(), &prefix)
            .resync_interval(Duration::from_secs(60))
            .build()
            .unwrap()
            .attach_keyed(&set)
            .unwrap();
        replicas.push((set, attachment));
    }
    assert!(
        eventually(WAIT, || async {
            replicas.iter().all(|(_, a)| a.is_shared())
        })
        .await
    );
    let round = async |key: &str, outcome: Outcome, calls: i64| {
        for (set, _) in &replicas {
            set.admit(key).unwrap().record(outcome);
        }
        let counted = eventually(WAIT, || async {
            window_sum(&prefix, key, 'c').await >= calls
        })
        .await;
        assert!(counted, "{key}: {calls} calls summed");
    };
    // "k" is sent, then found idle by a later flush: the one that sends
    // "tick", called only once "k" was summed.
    round("k", Outcome::Success, 5).await;
    round("tick", Outcome::Success, 5).await;
    // Four failures each: under min_calls (10) on every replica alone, 20
    // failures in 25 calls together, seen only if the flushes look at "k"
    // again.
    for (set, _) in &replicas {
        for _ in 0..4 {
            set.admit("k").unwrap().record(Outcome::Failure);
        }
        assert_eq!(set.get("k").unwrap().state(), State::Closed);
    }
    let tripped = eventually(WAIT, || async {
        replicas.iter().all(|(set, _)| {
            set.get("k")
                .is_some_and(|b| reached(b.state(), State::Open))
        })
    })
    .await;
    assert!(tripped, "the cluster sums the calls of a key that was idle");
    for (_, a) in replicas {
        a.detach().await;
    }
}

async fn attaching_needs_a_name_and_sane_settings() {
    if redis_support::skip() {
        return;
    }
    let client = || Client::open(shared_url()).unwrap();
    let backend = Backend::builder(client()).build().unwrap();
    let unnamed = Breaker::builder()
        .trip_mode(TripMode::Open)
        .build()
        .unwrap();
    assert_eq!(backend.attach(&unnamed).unwrap_err(), SetupError::Unnamed);
    for bad in [
        Backend::builder(client()).prefix(""),
        Backend::builder(client()).prefix("a{b}"),
        Backend::builder(client()).flush_interval(Duration::ZERO),
        Backend::builder(client()).window(Duration::from_secs(1), 0),
        Backend::builder(client())
            .reconnect_backoff(Duration::from_secs(2), Duration::from_secs(1)),
    ] {
        assert!(matches!(bad.build().unwrap_err(), SetupError::Invalid(_)));
    }
}

fn attaching_outside_a_runtime_is_an_error_not_a_panic() {
    if redis_support::skip() {
        return;
    }
    let backend = Backend::builder(Client::open(shared_url()).unwrap())
        .build()
        .unwrap();
    let named = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("x")
        .build()
        .unwrap();
    assert_eq!(backend.attach(&named).unwrap_err(), SetupError::NoRuntime);
}

async fn open_replicas_tell_a_redis_that_lost_its_state() {
    if redis_support::skip() {
        return;
    }
    let mut server = Server::start().await;
    let url = server.url();
    let prefix = unique_prefix("lost");
    let replicas = replicas(2, &url, &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
    })
    .await;
    trip(&replicas[0].0, 1);
    assert!(all_in(&replicas, State::Open).await);

    // Restarted without persistence: the open state is gone from Redis.
    server.kill().await;
    server.restart().await;
    let back = eventually(WAIT, || async {
        replicas.iter().all(|(_, a)| a.is_shared())
    })
    .await;
    assert!(back);
    let conn = connection(&url).await;
    let state_key = format!("{{{prefix}:upstream}}:v2:state");
    let restored = eventually(WAIT, || {
        let (mut conn, key) = (conn.clone(), state_key.clone());
        async move {
            let s: Option<String> = conn.hget(key, "state").await.unwrap();
            s.as_deref() == Some("open")
        }
    })
    .await;
    assert!(restored, "the open replicas trip the cluster again");
    assert!(replicas.iter().all(|(b, _)| b.state() == State::Open));
}

/// Transitions seen by a breaker's listener.
fn counted(builder: Builder<Breaker>) -> (Breaker, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    let breaker = builder
        .on_transition(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    (breaker, n)
}

async fn lost_shared_state_changes_no_circuit_in_any_state() {
    if redis_support::skip() {
        return;
    }
    let mut server = Server::start().await;
    let url = server.url();
    let prefix = unique_prefix("lost-any");
    let names = ["closed", "open", "half-open", "forced", "disabled"];
    // Two replicas, each one backend holding one breaker of every name.
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let backend = backend(&url, &prefix).build().unwrap();
        let mut breakers = Vec::new();
        for name in names {
            let open = if name == "half-open" {
                Duration::from_millis(200)
            } else {
                Duration::from_secs(3600)
            };
            let (b, n) = counted(
                Breaker::builder()
                    .trip_mode(TripMode::Open)
                    .name(name)
                    .consecutive_failures(1)
                    .probes(1)
                    .close_after(1)
                    .jitter(0.0)
                    .open_duration(open),
            );
            let a = backend.attach(&b).unwrap();
            breakers.push((b, a, n));
        }
        replicas.push(breakers);
    }
    let all = || replicas.iter().flatten();
    assert!(eventually(WAIT, || async { all().all(|(_, a, _)| a.is_shared()) }).await);

    trip(&replicas[0][1].0, 1);
    trip(&replicas[0][2].0, 1);
    replicas[0][3].1.force_open_cluster("forced").await.unwrap();
    replicas[0][4].1.disable_cluster("disabled").await.unwrap();
    let want = [
        State::Closed,
        State::Open,
        State::HalfOpen,
        State::ForcedOpen,
        State::Disabled,
    ];
    let settled = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|r| r.iter().zip(want).all(|((b, _, _), s)| b.state() == s))
    })
    .await;
    assert!(settled, "every replica in every state");
    let before: Vec<usize> = all().map(|(_, _, n)| n.load(Ordering::SeqCst)).collect();
    let unchanged = |what: &str| {
        for (r, replica) in replicas.iter().enumerate() {
            for ((b, _, _), s) in replica.iter().zip(want) {
                assert_eq!(b.state(), s, "{what}: replica {r}, {:?}", b.name());
            }
        }
        let after: Vec<usize> = all().map(|(_, _, n)| n.load(Ordering::SeqCst)).collect();
        assert_eq!(before, after, "{what}: no transition");
    };

    // Restarted with no data.
    server.kill().await;
    assert!(eventually(WAIT, || async { all().all(|(_, a, _)| !a.is_shared()) }).await);
    server.restart().await;
    assert!(eventually(WAIT, || async { all().all(|(_, a, _)| a.is_shared()) }).await);
    // Several resyncs (every 500 ms) read what Redis holds.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    unchanged("restarted empty");

    // Flushed under live connections.
    let mut conn = connection(&url).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(all().all(|(_, a, _)| a.is_shared()));
    unchanged("flushed");

    // The half-open circuits still answer to their probes: a failed probe
    // reopens them, and the trip opens the other replica again.
    let probe = replicas[0][2].0.admit().expect("a probe of its own cycle");
    probe.record(Outcome::Failure);
    assert_eq!(replicas[0][2].0.state(), State::Open);
    let reopened = eventually(WAIT, || async {
        replicas[1][2].2.load(Ordering::SeqCst) > before[names.len() + 2]
    })
    .await;
    assert!(reopened, "the probe's verdict is shared");
}

async fn a_paused_redis_counts_as_down_until_it_answers_again() {
    if redis_support::skip() {
        return;
    }
    let server = Server::start().await;
    let url = server.url();
    let prefix = unique_prefix("paused");
    let replicas = replicas(2, &url, &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(3)
    })
    .await;

    let mut conn = connection(&url).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2000)
        .arg("ALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Calls made while it stalls go through the local breakers untouched.
    replicas[0].0.admit().unwrap().record(Outcome::Success);
    let fell_back = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|(b, a)| !a.is_shared() && !b.remote().is_shared())
    })
    .await;
    assert!(
        fell_back,
        "an exchange past the timeout means redis is down"
    );
    for (b, _) in &replicas {
        b.admit().unwrap().record(Outcome::Success);
    }
    let back = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|(b, a)| a.is_shared() && b.remote().is_shared())
    })
    .await;
    assert!(back, "shared again once redis answers");
}

async fn a_server_that_never_answers_leaves_the_breaker_local() {
    if redis_support::skip() {
        return;
    }
    // Accepts connections and says nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("upstream")
        .consecutive_failures(1)
        .jitter(0.0)
        .open_duration(Duration::from_millis(100))
        .probes(1)
        .close_after(1)
        .build()
        .unwrap();
    let attachment = backend(&url, &unique_prefix("silent"))
        .build()
        .unwrap()
        .attach(&breaker)
        .unwrap();

    // The local breaker runs a whole cycle on its own meanwhile.
    trip(&breaker, 1);
    assert_eq!(breaker.state(), State::Open);
    admit_probe(&breaker).await.record(Outcome::Success);
    assert_eq!(breaker.state(), State::Closed);
    assert!(!attachment.is_shared());
    assert!(!breaker.remote().is_shared());
    attachment.detach().await;
    held.abort();
}

fn a_runtime_shutting_down_leaves_the_breakers_local() {
    if redis_support::skip() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("upstream")
        .build()
        .unwrap();
    let prefix = unique_prefix("runtime");
    let attachment = rt.block_on(async {
        let a = backend(shared_url(), &prefix)
            .build()
            .unwrap()
            .attach(&breaker)
            .unwrap();
        assert!(eventually(WAIT, || async { a.is_shared() }).await);
        a
    });
    assert!(breaker.remote().is_shared());
    drop(rt);
    assert!(
        !breaker.remote().is_shared(),
        "no task is left to grant probes, so the breaker decides alone"
    );
    drop(attachment);
}

async fn a_keyed_set_larger_than_one_round_trip_stays_in_step() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("many");
    let config = || {
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (a, b) = (config(), config());
    let attach_a = backend(shared_url(), &prefix)
        .build()
        .unwrap()
        .attach_keyed(&a)
        .unwrap();
    let attach_b = backend(shared_url(), &prefix)
        .build()
        .unwrap()
        .attach_keyed(&b)
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            attach_a.is_shared() && attach_b.is_shared()
        })
        .await
    );

    // 700 keys on both replicas; every tenth fails once on replica a.
    let keys: Vec<String> = (0..700).map(|i| format!("model-{i}")).collect();
    for k in &keys {
        b.admit(k).unwrap().record(Outcome::Success);
        let outcome = if k.ends_with('0') {
            Outcome::Failure
        } else {
            Outcome::Success
        };
        a.admit(k).unwrap().record(outcome);
    }
    let in_step = eventually(WAIT, || async {
        keys.iter().all(|k| {
            let open = k.ends_with('0');
            b.get(k)
                .is_some_and(|br| (br.state() == State::Open) == open)
        })
    })
    .await;
    assert!(in_step, "replica b follows all 70 trips and no other key");
    assert!(attach_a.is_shared() && attach_b.is_shared());
}

async fn a_listener_panicking_under_the_sync_task_does_not_end_sharing() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("panicking-listener");
    // Replica 1's listener panics whenever the cluster opens it: that
    // transition is applied by its sync task, not by a caller.
    let panics = Arc::new(AtomicUsize::new(0));
    let p = panics.clone();
    let config = |listener: bool| {
        let p = p.clone();
        let b = Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_secs(2))
            .probes(1)
            .close_after(1);
        if listener {
            b.on_transition(move |t| {
                if t.to == State::Open {
                    p.fetch_add(1, Ordering::Relaxed);
                    panic!("listener bug");
                }
            })
        } else {
            b
        }
    };
    let mut replicas = Vec::new();
    for listener in [false, true] {
        let b = config(listener).build().unwrap();
        let a = backend(shared_url(), &prefix)
            .build()
            .unwrap()
            .attach(&b)
            .unwrap();
        replicas.push((b, a));
    }
    let shared = || async {
        replicas
            .iter()
            .all(|(b, a)| a.is_shared() && b.remote().is_shared())
    };
    assert!(
        eventually(WAIT, shared).await,
        "every replica reaches redis"
    );

    // Open long enough that a loaded machine still sees both replicas open
    // at once before the period ends (a state says half-open once it has).
    trip(&replicas[0].0, 1);
    assert!(
        all_in(&replicas, State::Open).await,
        "the cluster opens replica 1 too"
    );
    assert!(
        eventually(WAIT, || async { panics.load(Ordering::Relaxed) >= 1 }).await,
        "the listener ran under the sync task"
    );
    // Sharing comes back, and the replica still follows the cluster: a probe
    // on replica 0 closes both.
    assert!(
        eventually(WAIT, shared).await,
        "replica 1 is back in shared mode"
    );
    admit_probe(&replicas[0].0).await.record(Outcome::Success);
    assert!(all_in(&replicas, State::Closed).await);
    // And a second trip reaches it as well.
    trip(&replicas[0].0, 1);
    assert!(all_in(&replicas, State::Open).await);
    assert!(eventually(WAIT, shared).await);
}

async fn replicas_with_one_key_secret_share_a_credentials_breaker_and_redis_never_sees_it() {
    if redis_support::skip() {
        return;
    }
    use tower::{Service, ServiceBuilder};
    use tower_circuit_breaker::keyed::{self, KeySecret};

    let prefix = unique_prefix("hashed");
    // Each replica reads the same secret from its own configuration.
    let secret = || KeySecret::new("shared-deployment-secret-0123456789").unwrap();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let set = KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(2)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap();
        let a = backend(shared_url(), &prefix)
            .build()
            .unwrap()
            .attach_keyed(&set)
            .unwrap();
        let layer =
            CircuitBreakerLayer::keyed(set.clone(), keyed::header_hashed("x-api-key", &secret()));
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service(tower::service_fn(|_: http::Request<String>| async {
                Ok::<_, Infallible>(
                    http::Response::builder()
                        .status(503)
                        .body(String::new())
                        .unwrap(),
                )
            }));
        replicas.push((set, a, svc));
    }
    assert!(
        eventually(WAIT, || async {
            replicas.iter().all(|(_, a, _)| a.is_shared())
        })
        .await
    );

    let req = || {
        http::Request::get("/")
            .header("x-api-key", "sk-live-credential-42")
            .body(String::new())
            .unwrap()
    };
    for _ in 0..2 {
        let svc = &mut replicas[0].2;
        svc.ready().await.unwrap().call(req()).await.unwrap();
    }
    // The other replica opens the same credential's breaker without having
    // seen a call for it (no call there, so it cannot have tripped alone).
    let key = keyed::Key::hashed(&secret(), b"sk-live-credential-42");
    let learned = eventually(WAIT, || async {
        replicas[1]
            .0
            .get(key.as_str())
            .is_some_and(|b| b.state() == State::Open)
    })
    .await;
    assert!(
        learned,
        "replica 1 finds the credential's breaker by its hash"
    );
    let svc = &mut replicas[1].2;
    assert!(svc.ready().await.unwrap().call(req()).await.is_err());

    let mut conn = connection(shared_url()).await;
    let keys: Vec<String> = conn.keys(format!("{{{prefix}:*")).await.unwrap();
    assert!(!keys.is_empty());
    for k in &keys {
        assert!(!k.contains("sk-live"), "{k}");
        assert!(k.starts_with(&format!("{{{prefix}:#")), "{k}");
    }
}

// === cluster-wide operator controls ===

async fn cluster_wide_force_open_disable_and_reset_reach_every_replica() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("control");
    let config = || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(3)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
    };
    let replicas = replicas(3, shared_url(), &prefix, config).await;

    // Force open from replica 0: every replica, and who did it is visible.
    let began = Instant::now();
    replicas[0].1.force_open_cluster("upstream").await.unwrap();
    assert!(all_in(&replicas, State::ForcedOpen).await);
    eprintln!("force open reached 3 replicas in {:?}", began.elapsed());
    for (b, a) in &replicas {
        assert!(b.admit().is_err());
        assert_eq!(a.snapshot(b).origin, Origin::ClusterControl);
    }

    // A replica that starts later finds the circuit forced open.
    let late = self::replicas(1, shared_url(), &prefix, config).await;
    assert!(
        all_in(&late, State::ForcedOpen).await,
        "a late replica follows"
    );

    // Disable from replica 1: failures trip no one.
    let began = Instant::now();
    replicas[1].1.disable_cluster("upstream").await.unwrap();
    assert!(all_in(&replicas, State::Disabled).await);
    eprintln!("disable reached 3 replicas in {:?}", began.elapsed());
    trip(&replicas[2].0, 5);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(replicas.iter().all(|(b, _)| b.state() == State::Disabled));

    // Reset from replica 2 lifts it everywhere.
    let began = Instant::now();
    replicas[2].1.reset_cluster("upstream").await.unwrap();
    assert!(all_in(&replicas, State::Closed).await);
    assert!(all_in(&late, State::Closed).await);
    eprintln!("reset reached 4 replicas in {:?}", began.elapsed());

    // A trip is the cluster's on the others, local on the one that tripped.
    trip(&replicas[0].0, 3);
    assert!(all_in(&replicas, State::Open).await);
    assert_eq!(replicas[0].1.snapshot(&replicas[0].0).origin, Origin::Local);
    for (b, a) in &replicas[1..] {
        assert_eq!(a.snapshot(b).origin, Origin::Cluster);
    }

    // A reset closes an open cluster, and a replica forced open by its own
    // operator, everywhere.
    replicas[1].0.force_open();
    assert_eq!(replicas[1].1.snapshot(&replicas[1].0).origin, Origin::Local);
    let began = Instant::now();
    replicas[1].1.reset_cluster("upstream").await.unwrap();
    assert!(all_in(&replicas, State::Closed).await);
    eprintln!(
        "reset of an open circuit reached 3 replicas in {:?}",
        began.elapsed()
    );
    assert!(replicas.iter().all(|(b, _)| b.admit().is_ok()));
}

async fn a_cluster_control_redis_cannot_confirm_is_an_error() {
    if redis_support::skip() {
        return;
    }
    let mut server = Server::start().await;
    let prefix = unique_prefix("control-down");
    let replicas = replicas(1, &server.url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
    })
    .await;
    server.kill().await;
    let err = replicas[0]
        .1
        .force_open_cluster("upstream")
        .await
        .expect_err("no redis, no control");
    assert!(err.to_string().starts_with("cluster control not applied"));
    assert_eq!(replicas[0].0.state(), State::Closed);
    assert!(replicas[0].1.reset_cluster("").await.is_err());
}

// === quorum ===

async fn with_a_quorum_of_two_one_replica_alone_never_opens_the_others() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("quorum");
    let replicas = replicas_with(
        3,
        shared_url(),
        &prefix,
        || {
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .name("upstream")
                .consecutive_failures(3)
                .jitter(0.0)
                .open_duration(Duration::from_secs(30))
        },
        |b| b.quorum(2),
    )
    .await;
    // Every replica has seen the others' heartbeats.
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // Replica 0's path to the upstream is broken: it opens, alone.
    trip(&replicas[0].0, 3);
    assert_eq!(replicas[0].0.state(), State::Open);
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(1) {
        for (b, _) in &replicas[1..] {
            assert_eq!(
                b.state(),
                State::Closed,
                "one replica alone opens no one else"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(replicas[1..].iter().all(|(b, _)| b.admit().is_ok()));

    // A second replica agrees: the circuit opens everywhere.
    let began = Instant::now();
    trip(&replicas[1].0, 3);
    assert!(
        all_in(&replicas, State::Open).await,
        "two replicas make the quorum"
    );
    eprintln!("quorum trip reached 3 replicas in {:?}", began.elapsed());
    assert_eq!(
        replicas[2].1.snapshot(&replicas[2].0).origin,
        Origin::Cluster
    );
}

async fn a_quorum_larger_than_the_live_replicas_falls_to_the_largest_possible() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("quorum-fallback");
    let replicas = replicas_with(
        2,
        shared_url(),
        &prefix,
        || {
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .name("upstream")
                .consecutive_failures(2)
                .jitter(0.0)
                .open_duration(Duration::from_secs(30))
        },
        |b| b.quorum(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    trip(&replicas[0].0, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        replicas[1].0.state(),
        State::Closed,
        "two alive: a quorum of two"
    );
    trip(&replicas[1].0, 2);
    // Both are open on their own rules either way: the cluster's state says
    // whether the quorum was met.
    let conn = connection(shared_url()).await;
    let key = format!("{{{prefix}:upstream}}:v2:state");
    let opened = eventually(WAIT, || {
        let (mut conn, key) = (conn.clone(), key.clone());
        async move {
            let s: Option<String> = conn.hget(key, "state").await.unwrap();
            s.as_deref() == Some("open")
        }
    })
    .await;
    assert!(
        opened,
        "every live replica failing opens the shared circuit"
    );
}

async fn a_quorum_fraction_counts_the_replicas_alive() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("quorum-fraction");
    let mut replicas = replicas_with(
        10,
        shared_url(),
        &prefix,
        || {
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .name("upstream")
                .consecutive_failures(1)
                .jitter(0.0)
                .open_duration(Duration::from_secs(30))
        },
        // Heartbeats every 200 ms: a replica stopped counts as alive for
        // 3 × 200 ms plus the timeout after its last one.
        |b| {
            b.quorum_fraction(0.5)
                .resync_interval(Duration::from_millis(200))
        },
    )
    .await;
    let fleet = |replicas: &[(Breaker, Attachment)], want: (u32, u32)| {
        let got = replicas[0].1.fleet();
        (got.alive, got.quorum) == want
    };
    assert!(
        eventually(WAIT, || async { fleet(&replicas, (10, 5)) }).await,
        "10 alive, 5 must agree: {:?}",
        replicas[0].1.fleet()
    );
    for (_, attachment) in replicas.drain(7..) {
        attachment.detach().await;
    }
    assert!(
        eventually(WAIT, || async { fleet(&replicas, (7, 4)) }).await,
        "7 alive, 4 must agree: {:?}",
        replicas[0].1.fleet()
    );

    // Three of the seven agree: each stays open on its own, no one else.
    for (breaker, _) in &replicas[..3] {
        trip(breaker, 1);
        assert_eq!(breaker.state(), State::Open);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_ne!(
        cluster_state(&prefix, "upstream").await.as_deref(),
        Some("open")
    );
    assert_eq!(replicas[6].0.state(), State::Closed, "3 of 7 is short of 4");

    // The fourth opens the shared circuit, and every replica alive with it.
    trip(&replicas[3].0, 1);
    assert!(all_in(&replicas, State::Open).await, "4 of 7 agree");
    assert_eq!(
        cluster_state(&prefix, "upstream").await.as_deref(),
        Some("open")
    );
}

/// The cluster state of `name`, as its state key says.
async fn cluster_state(prefix: &str, name: &str) -> Option<String> {
    let mut conn = connection(shared_url()).await;
    conn.hget(format!("{{{prefix}:{name}}}:v2:state"), "state")
        .await
        .unwrap()
}

async fn a_quorum_counts_backends_not_the_breakers_attached_to_them() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("quorum-backends");
    let config = |name: &str| {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name(name)
            .consecutive_failures(2)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let with_quorum = || backend(shared_url(), &prefix).quorum(2).build().unwrap();
    // One process, one backend, two breakers: one replica.
    let first = with_quorum();
    let (solo, pair) = (config("solo"), config("pair"));
    let attached = [first.attach(&solo).unwrap(), first.attach(&pair).unwrap()];
    assert!(
        eventually(WAIT, || async {
            attached.iter().all(Attachment::is_shared)
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // Alone, its trip opens the shared circuit: the quorum falls to the one
    // replica alive.
    trip(&solo, 2);
    let opened = eventually(WAIT, || async {
        cluster_state(&prefix, "solo").await.as_deref() == Some("open")
    })
    .await;
    assert!(opened, "one replica alive: a quorum of one");

    // A second backend is a second replica.
    let second = with_quorum();
    let other = config("pair");
    let attachment = second.attach(&other).unwrap();
    assert!(eventually(WAIT, || async { attachment.is_shared() }).await);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    trip(&pair, 2);
    assert_eq!(pair.state(), State::Open);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        other.state(),
        State::Closed,
        "one of two replicas opens no one"
    );
    assert_ne!(
        cluster_state(&prefix, "pair").await.as_deref(),
        Some("open")
    );
    trip(&other, 2);
    let opened = eventually(WAIT, || async {
        cluster_state(&prefix, "pair").await.as_deref() == Some("open")
    })
    .await;
    assert!(opened, "two replicas make the quorum");
}

async fn a_heartbeat_from_before_a_clock_step_back_counts_for_one_ttl_only() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("quorum-ahead");
    // A replica that wrote its heartbeat an hour ahead of the server's clock
    // (the clock stepped back since) and died.
    let mut conn = connection(shared_url()).await;
    let time: Vec<String> = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = time[0].parse::<u64>().unwrap() * 1000;
    let _: () = conn
        .hset(
            format!("{{{prefix}}}:replicas"),
            "dead-replica",
            format!("{SCHEMA} {}", now_ms + 3_600_000),
        )
        .await
        .unwrap();
    let replicas = replicas_with(
        1,
        shared_url(),
        &prefix,
        || {
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .name("upstream")
                .consecutive_failures(1)
                .jitter(0.0)
                .open_duration(Duration::from_secs(30))
        },
        |b| b.quorum(2),
    )
    .await;
    // Its heartbeat lasts one ttl (3 resyncs of 500 ms and a timeout of
    // 300 ms) from the first heartbeat that saw it, then the quorum falls to
    // the one replica alive.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    trip(&replicas[0].0, 1);
    let opened = eventually(WAIT, || async {
        cluster_state(&prefix, "upstream").await.as_deref() == Some("open")
    })
    .await;
    assert!(
        opened,
        "a dead replica's heartbeat from ahead of the clock expired"
    );
}

// === quota gates ===

async fn a_quota_gate_keeps_its_reset_on_every_replica() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("quota");
    let replicas = replicas(2, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("account")
            .quota_gate(Duration::from_secs(3600))
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
    })
    .await;
    let (here, there) = (&replicas[0].0, &replicas[1].0);
    here.admit().unwrap().record(Outcome::QuotaExhausted);
    assert_eq!(here.snapshot().reason, Some(Reason::QuotaExhausted));
    assert!(eventually(WAIT, || async { there.state() == State::Open }).await);
    // Past a resync (every 500 ms), so every replica has read the cluster
    // state again since the gate was shared.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for (who, b) in [("this replica", here), ("the other replica", there)] {
        let snap = b.snapshot();
        let left = snap.retry_in.expect("open");
        assert!(left > Duration::from_secs(3590), "{who}: {left:?} left");
        assert!(left <= Duration::from_secs(3601), "{who}: {left:?} left");
        assert_eq!(snap.reason, Some(Reason::QuotaExhausted), "{who}");
    }
    let mut conn = connection(shared_url()).await;
    let gate: Option<String> = conn
        .hget(format!("{{{prefix}:account}}:v2:state"), "gate")
        .await
        .unwrap();
    assert_eq!(gate.as_deref(), Some("1"), "shared as a quota gate");
}

// === clock safety ===

/// Builds the shim that steps a process's wall clock; `None` (and a message,
/// or a failure on CI) when this machine has no C compiler.
fn clock_step_shim() -> Option<std::path::PathBuf> {
    let dir = scratch_dir("clock-shim");
    let out = dir.join("libclockstep.so");
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/redis_support/clock_step.c"
    );
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(source)
        .status()
        .is_ok_and(|s| s.success());
    if built {
        return Some(out);
    }
    let why = "no C compiler (`cc`) to build the clock-step shim for redis-server";
    if std::env::var_os("CI").is_some() {
        panic!("{why}: install gcc");
    }
    eprintln!("skipping the clock-step test: {why}");
    None
}

async fn an_hour_of_clock_step_on_redis_neither_holds_circuits_open_nor_ends_them_early() {
    if redis_support::skip() {
        return;
    }
    let Some(shim) = clock_step_shim() else {
        return;
    };
    let dir = scratch_dir("clock-step");
    let step = dir.join("step");
    std::fs::write(&step, "0").unwrap();
    let mut server = Server::start_with(
        Vec::new(),
        vec![
            ("LD_PRELOAD".into(), shim.display().to_string()),
            ("CLOCK_STEP_FILE".into(), step.display().to_string()),
        ],
        None,
    )
    .await;
    // Redis's clock really moves: the shim is in force.
    let mut conn = connection(&server.url()).await;
    let before: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    std::fs::write(&step, "-3600").unwrap();
    let after: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    assert!(
        after.0 + 3500 < before.0,
        "the server's clock went back an hour"
    );
    std::fs::write(&step, "0").unwrap();

    let prefix = unique_prefix("clock");
    let open = Duration::from_secs(1);
    let replicas = replicas(3, &server.url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(3)
            .jitter(0.0)
            .open_duration(open)
            // By the server's arithmetic alone, a period may last an hour.
            .max_open_duration(Duration::from_secs(3600))
            .probes(1)
            .close_after(1)
    })
    .await;

    // Back an hour while open: the period must still end on time by our
    // clock, and the cluster must grant the probe then.
    let tripped = Instant::now();
    trip(&replicas[0].0, 3);
    assert!(all_in(&replicas, State::Open).await);
    std::fs::write(&step, "-3600").unwrap();
    let probe = tokio::time::timeout(open + Duration::from_secs(1), admit_probe(&replicas[1].0))
        .await
        .expect("no circuit stays open past its period plus a margin");
    eprintln!(
        "back 1 h: probe admitted {:?} after the trip",
        tripped.elapsed()
    );
    probe.record(Outcome::Success);
    assert!(
        all_in(&replicas, State::Closed).await,
        "replicas re-converge"
    );

    // Forward an hour (back to the true time) while open: the period must
    // not end early by our clock.
    let tripped = Instant::now();
    trip(&replicas[2].0, 3);
    assert!(all_in(&replicas, State::Open).await);
    std::fs::write(&step, "0").unwrap();
    while tripped.elapsed() < open - Duration::from_millis(150) {
        for (b, _) in &replicas {
            assert!(
                b.admit().is_err(),
                "the period ends no earlier than it should"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probe = tokio::time::timeout(open + Duration::from_secs(1), admit_probe(&replicas[0].0))
        .await
        .expect("the period ends on time");
    probe.record(Outcome::Success);
    assert!(
        all_in(&replicas, State::Closed).await,
        "replicas re-converge"
    );
    for (_, a) in &replicas {
        assert!(a.is_shared());
    }
    server.kill().await;
    let _ = std::fs::remove_dir_all(dir);
    if let Some(shim_dir) = shim.parent() {
        let _ = std::fs::remove_dir_all(shim_dir);
    }
}

// === schema versions ===

async fn replicas_of_another_schema_are_detected_not_silently_split() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("schema");
    let mut conn = connection(shared_url()).await;
    assert_eq!(SCHEMA, 2);

    // A 0.1 replica's state: an unversioned key for the breaker.
    let _: () = conn
        .hset(format!("{{{prefix}:upstream}}:state"), "state", "open")
        .await
        .unwrap();
    let replicas = replicas(1, shared_url(), &prefix, || {
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
    })
    .await;
    assert!(
        eventually(WAIT, || async { replicas[0].1.other_schemas() == [1] }).await,
        "a replica of schema 1 is reported"
    );
    assert_eq!(
        replicas[0].0.state(),
        State::Closed,
        "its state is not taken as ours"
    );

    // A later schema's replica announces itself in the heartbeat hash.
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let _: () = conn
        .hset(
            format!("{{{prefix}}}:replicas"),
            "from-the-future",
            format!("3 {}", now.0 * 1000),
        )
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async { replicas[0].1.other_schemas() == [1, 3] }).await,
        "a replica of schema 3 is reported"
    );

    // A keyed set learns of schema 1 from its messages.
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .build()
        .unwrap();
    let keyed = backend(shared_url(), &prefix)
        .build()
        .unwrap()
        .attach_keyed(&set)
        .unwrap();
    assert!(eventually(WAIT, || async { keyed.is_shared() }).await);
    let _: () = redis::cmd("PUBLISH")
        .arg(format!("{prefix}:events"))
        .arg("open 1796117941000000 gpt-4o")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async { keyed.other_schemas().contains(&1) }).await,
        "a message of schema 1 is reported"
    );
    assert!(set.get("gpt-4o").is_none(), "and not acted on");
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio("redis_shared::a_trip_on_one_replica_opens_every_replica", Rt::Multi, a_trip_on_one_replica_opens_every_replica),
        Trial::tokio("redis_shared::replicas_under_the_threshold_on_their_own_trip_together", Rt::Multi, replicas_under_the_threshold_on_their_own_trip_together),
        Trial::tokio("redis_shared::replicas_together_under_the_threshold_stay_closed", Rt::Multi, replicas_together_under_the_threshold_stay_closed),
        Trial::tokio("redis_shared::eight_replicas_with_a_hundred_callers_each_send_at_most_probes_probes", Rt::Multi, eight_replicas_with_a_hundred_callers_each_send_at_most_probes_probes),
        Trial::tokio("redis_shared::failed_probes_reopen_every_replica_with_backoff", Rt::Multi, failed_probes_reopen_every_replica_with_backoff),
        Trial::tokio("redis_shared::a_dead_replicas_probe_slot_comes_back_when_its_lease_ends", Rt::Multi, a_dead_replicas_probe_slot_comes_back_when_its_lease_ends),
        Trial::tokio("redis_shared::restarting_redis_mid_traffic_fails_no_request_and_converges", Rt::Multi, restarting_redis_mid_traffic_fails_no_request_and_converges),
        Trial::tokio("redis_shared::garbage_in_the_keys_is_treated_as_absent", Rt::Multi, garbage_in_the_keys_is_treated_as_absent),
        Trial::tokio("redis_shared::keyed_sets_share_each_key_and_learn_keys_they_never_saw", Rt::Multi, keyed_sets_share_each_key_and_learn_keys_they_never_saw),
        Trial::tokio("redis_shared::a_keyed_sets_trip_is_sent_on_its_transition_not_at_the_next_flush", Rt::Multi, a_keyed_sets_trip_is_sent_on_its_transition_not_at_the_next_flush),
        Trial::tokio("redis_shared::an_idle_key_that_sees_calls_again_is_summed_by_the_next_flushes", Rt::Multi, an_idle_key_that_sees_calls_again_is_summed_by_the_next_flushes),
        Trial::tokio("redis_shared::attaching_needs_a_name_and_sane_settings", Rt::Current, attaching_needs_a_name_and_sane_settings),
        Trial::sync("redis_shared::attaching_outside_a_runtime_is_an_error_not_a_panic", attaching_outside_a_runtime_is_an_error_not_a_panic),
        Trial::tokio("redis_shared::open_replicas_tell_a_redis_that_lost_its_state", Rt::Multi, open_replicas_tell_a_redis_that_lost_its_state),
        Trial::tokio("redis_shared::lost_shared_state_changes_no_circuit_in_any_state", Rt::Multi, lost_shared_state_changes_no_circuit_in_any_state),
        Trial::tokio("redis_shared::a_paused_redis_counts_as_down_until_it_answers_again", Rt::Multi, a_paused_redis_counts_as_down_until_it_answers_again),
        Trial::tokio("redis_shared::a_server_that_never_answers_leaves_the_breaker_local", Rt::Multi, a_server_that_never_answers_leaves_the_breaker_local),
        Trial::sync("redis_shared::a_runtime_shutting_down_leaves_the_breakers_local", a_runtime_shutting_down_leaves_the_breakers_local),
        Trial::tokio("redis_shared::a_keyed_set_larger_than_one_round_trip_stays_in_step", Rt::Multi, a_keyed_set_larger_than_one_round_trip_stays_in_step),
        Trial::tokio("redis_shared::a_listener_panicking_under_the_sync_task_does_not_end_sharing", Rt::Multi, a_listener_panicking_under_the_sync_task_does_not_end_sharing),
        Trial::tokio("redis_shared::replicas_with_one_key_secret_share_a_credentials_breaker_and_redis_never_sees_it", Rt::Multi, replicas_with_one_key_secret_share_a_credentials_breaker_and_redis_never_sees_it),
        Trial::tokio("redis_shared::cluster_wide_force_open_disable_and_reset_reach_every_replica", Rt::Multi, cluster_wide_force_open_disable_and_reset_reach_every_replica),
        Trial::tokio("redis_shared::a_cluster_control_redis_cannot_confirm_is_an_error", Rt::Multi, a_cluster_control_redis_cannot_confirm_is_an_error),
        Trial::tokio("redis_shared::with_a_quorum_of_two_one_replica_alone_never_opens_the_others", Rt::Multi, with_a_quorum_of_two_one_replica_alone_never_opens_the_others),
        Trial::tokio("redis_shared::a_quorum_larger_than_the_live_replicas_falls_to_the_largest_possible", Rt::Multi, a_quorum_larger_than_the_live_replicas_falls_to_the_largest_possible),
        Trial::tokio("redis_shared::a_quorum_fraction_counts_the_replicas_alive", Rt::Multi, a_quorum_fraction_counts_the_replicas_alive),
        Trial::tokio("redis_shared::a_quorum_counts_backends_not_the_breakers_attached_to_them", Rt::Multi, a_quorum_counts_backends_not_the_breakers_attached_to_them),
        Trial::tokio("redis_shared::a_heartbeat_from_before_a_clock_step_back_counts_for_one_ttl_only", Rt::Multi, a_heartbeat_from_before_a_clock_step_back_counts_for_one_ttl_only),
        Trial::tokio("redis_shared::a_quota_gate_keeps_its_reset_on_every_replica", Rt::Multi, a_quota_gate_keeps_its_reset_on_every_replica),
        Trial::tokio("redis_shared::an_hour_of_clock_step_on_redis_neither_holds_circuits_open_nor_ends_them_early", Rt::Multi, an_hour_of_clock_step_on_redis_neither_holds_circuits_open_nor_ends_them_early),
        Trial::tokio("redis_shared::replicas_of_another_schema_are_detected_not_silently_split", Rt::Multi, replicas_of_another_schema_are_detected_not_silently_split),
    ]
}
