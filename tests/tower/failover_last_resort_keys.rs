//! The last-resort call of a failover over keys of one set goes to the key's
//! breaker as the set holds it now: a key evicted while idle and created
//! again is the one granted, not the handle taken before the eviction.

use std::convert::Infallible;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response};
use tower::Layer;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::failover::{AllOpen, Failover, LastResortCircuit};
use tower_circuit_breaker::keyed::{self, KeyedBreakers};
use tower_circuit_breaker::{CircuitBreakerLayer, Outcome, Reason, State};

fn request(model: &str) -> Request<String> {
    Request::builder()
        .header("x-model", model)
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_key_evicted_and_created_again_is_the_one_granted_the_last_resort_call() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .idle_timeout(Duration::from_secs(1))
        .jitter(0.0)
        .build()
        .unwrap();
    let ok = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let svc = CircuitBreakerLayer::keyed(set.clone(), keyed::header("x-model")).layer(ok);
    for key in ["a", "b"] {
        set.admit(key).unwrap().record(Outcome::Success);
    }
    let mut failover = Failover::new(svc.clone())
        .fallback_with(svc, |req: &mut Request<String>| {
            req.headers_mut().insert("x-model", "b".parse().unwrap());
        })
        .when_all_open(AllOpen::last_resort([
            LastResortCircuit::key(&set, "a"),
            LastResortCircuit::key(&set, "b"),
        ]));
    // Handles taken now go stale: "a" and "b" are evicted while idle.
    let old_b = set.get("b").unwrap();
    for key in ["c", "d"] {
        tokio::time::advance(Duration::from_secs(1)).await;
        set.admit(key).unwrap().record(Outcome::Success);
    }
    assert!(set.get("b").is_none(), "evicted");

    // Created again, "b" opens first, then "a".
    set.admit("b").unwrap().record(Outcome::Failure);
    tokio::time::advance(Duration::from_secs(1)).await;
    set.admit("a").unwrap().record(Outcome::Failure);
    let b = set.get("b").unwrap();
    assert!(!b.ptr_eq(&old_b));

    let res = failover
        .ready()
        .await
        .unwrap()
        .call(request("a"))
        .await
        .expect("the last-resort call reaches the upstream");
    assert_eq!(res.status(), 200);
    assert_eq!(
        b.state(),
        State::HalfOpen,
        "granted to b, which opened first"
    );
    assert_eq!(b.snapshot().reason, Some(Reason::LastResort));
    assert_eq!(set.get("a").unwrap().state(), State::Open);
}
