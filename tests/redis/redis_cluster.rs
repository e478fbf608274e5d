//! Replicas sharing state through a real Redis Cluster the test starts:
//! three masters, each with a replica, on free local ports; one master is
//! killed mid-traffic.
//!
//! Every wait is bounded; no assertion is about how long anything took (the
//! figures are printed).

use crate::redis_support;
use crate::runner::{Rt, Trial};

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::redis::{Attachment, Backend, Client};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Outcome, State, TripMode};

use redis_support::{eventually, unique_prefix, RedisCluster};

/// Longer than a failover (node timeout 1 s, then an election).
const WAIT: Duration = Duration::from_secs(20);

fn replica(urls: &[String], prefix: &str) -> (Breaker, Attachment) {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("upstream")
        .consecutive_failures(3)
        .jitter(0.0)
        .open_duration(Duration::from_millis(300))
        .probes(1)
        .close_after(1)
        .build()
        .unwrap();
    let nodes = urls.iter().map(|u| Client::open(u.as_str()).unwrap());
    let attachment = Backend::cluster_builder(nodes)
        .prefix(prefix)
        .flush_interval(Duration::from_millis(20))
        .resync_interval(Duration::from_millis(500))
        .timeout(Duration::from_millis(300))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .unwrap()
        .attach(&breaker)
        .unwrap();
    (breaker, attachment)
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

async fn all_shared(replicas: &[(Breaker, Attachment)]) -> bool {
    eventually(WAIT, || async {
        replicas
            .iter()
            .all(|(b, a)| a.is_shared() && b.remote().is_shared())
    })
    .await
}

fn trip(breaker: &Breaker) {
    for _ in 0..3 {
        breaker.admit().unwrap().record(Outcome::Failure);
    }
}

/// Trips replica `from` and closes the circuit again with one probe; how
/// long the trip took to reach every replica.
async fn trip_and_heal(replicas: &[(Breaker, Attachment)], from: usize) -> Duration {
    let began = Instant::now();
    trip(&replicas[from].0);
    assert!(
        all_in(replicas, State::Open).await,
        "the trip reaches every replica"
    );
    let spread = began.elapsed();
    let prober = &replicas[(from + 1) % replicas.len()].0;
    let mut permit = None;
    let admitted = eventually(WAIT, || {
        permit = permit.take().or_else(|| prober.admit().ok());
        let got = permit.is_some();
        async move { got }
    })
    .await;
    assert!(admitted, "the cluster grants a probe");
    permit.unwrap().record(Outcome::Success);
    assert!(
        all_in(replicas, State::Closed).await,
        "the close reaches every replica"
    );
    spread
}

async fn a_master_killed_mid_traffic_fails_no_request_and_replicas_reconverge() {
    if redis_support::skip() {
        return;
    }
    let mut cluster = RedisCluster::start(3).await;
    let urls = cluster.urls();
    let prefix = unique_prefix("cluster");
    let replicas: Vec<_> = (0..3).map(|_| replica(&urls, &prefix)).collect();
    assert!(
        all_shared(&replicas).await,
        "every replica reaches the cluster"
    );

    let before = trip_and_heal(&replicas, 0).await;
    eprintln!("before the failover: a trip reached 3 replicas in {before:?}");

    // Steady traffic through every replica to a healthy upstream.
    let stop = Arc::new(AtomicBool::new(false));
    type Log = Vec<Result<(), bool>>;
    let results: Arc<Mutex<Log>> = Arc::default();
    let mut traffic = Vec::new();
    for (breaker, _) in &replicas {
        let svc = CircuitBreakerLayer::new(breaker.clone()).layer(tower::service_fn(
            |_req: http::Request<String>| async {
                Ok::<_, Infallible>(http::Response::new(String::new()))
            },
        ));
        for _ in 0..3 {
            let (svc, stop, results) = (svc.clone(), stop.clone(), results.clone());
            traffic.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let res = svc.clone().oneshot(http::Request::new(String::new())).await;
                    let res = res.map(drop).map_err(|e| e.is_circuit_open());
                    results.lock().unwrap().push(res);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Kill the master that holds this breaker's keys.
    let slot = cluster.slot(&format!("{{{prefix}:upstream}}")).await;
    let master = cluster
        .master_of(slot)
        .await
        .expect("a master serves the slot");
    let killed = Instant::now();
    cluster.kill(master).await;
    let promoted = eventually(WAIT, || async {
        cluster.master_of(slot).await.is_some_and(|p| p != master)
    })
    .await;
    assert!(promoted, "a replica takes the slot over");
    assert!(cluster.healthy(WAIT).await);
    let failover = killed.elapsed();
    assert!(
        all_shared(&replicas).await,
        "every replica shares state again"
    );
    let reshared = killed.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;

    stop.store(true, Ordering::Relaxed);
    for t in traffic {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
    }
    let (calls, failed) = {
        let results = results.lock().unwrap();
        (results.len(), results.iter().filter(|r| r.is_err()).count())
    };
    eprintln!(
        "killed master {master}: slot {slot} failed over in {failover:?}, replicas shared \
         again after {reshared:?}; {calls} requests, {failed} failed"
    );
    assert!(calls > 100, "traffic flowed throughout");
    assert_eq!(failed, 0, "no request failed because of the cluster");

    // Converged again: a trip reaches everyone through the new master.
    let after = trip_and_heal(&replicas, 2).await;
    eprintln!("after the failover: a trip reached 3 replicas in {after:?}");
}

async fn a_cluster_backend_needs_a_node() {
    let err = Backend::cluster_builder(Vec::new()).build().unwrap_err();
    assert!(err.to_string().contains("at least one node"), "{err}");
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio(
            "redis_cluster::a_master_killed_mid_traffic_fails_no_request_and_replicas_reconverge",
            Rt::Multi,
            a_master_killed_mid_traffic_fails_no_request_and_replicas_reconverge,
        ),
        Trial::tokio(
            "redis_cluster::a_cluster_backend_needs_a_node",
            Rt::Current,
            a_cluster_backend_needs_a_node,
        ),
    ]
}
