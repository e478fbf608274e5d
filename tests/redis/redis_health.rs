//! Health probes across replicas sharing one circuit through real Redis: one
//! replica probes for all, its heal reaches every replica through the shared
//! state, and without Redis each replica probes on its own.
//!
//! Every replica is its own `Breaker`, backend and prober over one scripted
//! upstream that counts the health requests it is sent. Real time is
//! unavoidable with a real server: every wait is bounded and polls state,
//! and the one bound that involves time is stated in intervals of the time
//! the test measured itself.

use crate::redis_support;
use crate::runner::{Rt, Trial};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use redis::AsyncCommands;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::health::HealthProbe;
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::redis::Attachment;
use tower_circuit_breaker::{
    BoxError, Breaker, Builder, Outcome, Reason, State, Transition, TripMode,
};

use redis_support::{backend, connection, eventually, shared_url, unique_prefix, Server};

const WAIT: Duration = Duration::from_secs(5);

/// The probers' interval; each probe gives up after half of it.
const INTERVAL: Duration = Duration::from_millis(200);
const PROBE_TIMEOUT: Duration = Duration::from_millis(100);

/// An upstream that hangs until healed, then answers 200 at once, and keeps
/// count of the health requests it is sent: who sent each, how many were in
/// flight at once.
#[derive(Clone, Default)]
struct Upstream {
    healed: Arc<AtomicBool>,
    senders: Arc<Mutex<Vec<usize>>>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
}

/// Counts a request out of flight however it ends (a probe that times out
/// is dropped).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Upstream {
    /// The upstream as replica `replica` reaches it.
    fn service(
        &self,
        replica: usize,
    ) -> impl tower::Service<
        Request<String>,
        Response = Response<String>,
        Error = BoxError,
        Future = impl Send + use<>,
    > + Clone
           + Send
           + use<> {
        let me = self.clone();
        tower::service_fn(move |_req: Request<String>| {
            let me = me.clone();
            async move {
                me.senders.lock().unwrap().push(replica);
                let now = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                me.most_in_flight.fetch_max(now, Ordering::SeqCst);
                let _guard = InFlight(me.in_flight.clone());
                if !me.healed.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(Response::new(String::new()))
            }
        })
    }

    fn sent(&self) -> usize {
        self.senders.lock().unwrap().len()
    }

    /// Health requests per replica.
    fn by_sender(&self) -> HashMap<usize, usize> {
        let mut by = HashMap::new();
        for &s in self.senders.lock().unwrap().iter() {
            *by.entry(s).or_default() += 1;
        }
        by
    }

    /// Forgets what was sent so far.
    fn clear(&self) {
        self.senders.lock().unwrap().clear();
        self.most_in_flight
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// Transitions to half-open, when and why.
type Log = Arc<Mutex<Vec<(Instant, Reason)>>>;

/// One replica: its breaker, its attachment, its prober.
struct Replica {
    breaker: Breaker,
    attachment: Attachment,
    prober: JoinHandle<()>,
    half_opened: Log,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.prober.abort();
    }
}

fn config() -> Builder<Breaker> {
    // Open for a minute: within a test, only a health probe ends it.
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("upstream")
        .consecutive_failures(1)
        .jitter(0.0)
        .open_duration(Duration::from_secs(60))
        .probes(2)
        .close_after(1)
}

/// Spawns replica `replica`'s prober of `target` (a breaker, or every key
/// of a set) over `upstream`.
fn spawn_prober(upstream: &Upstream, replica: usize, target: Target) -> JoinHandle<()> {
    let prober = HealthProbe::builder(INTERVAL)
        .timeout(PROBE_TIMEOUT)
        .jitter(0.0)
        .build(upstream.service(replica), HttpClassifier, |_: &Breaker| {
            Request::get("http://upstream/health")
                .body(String::new())
                .unwrap()
        })
        .unwrap();
    match target {
        Target::One(breaker) => tokio::spawn(prober.run(breaker)),
        Target::Keyed(set) => tokio::spawn(prober.run_keyed(set)),
    }
}

enum Target {
    One(Breaker),
    Keyed(KeyedBreakers),
}

/// `n` replicas of one breaker on `url`, each probing `upstream`.
async fn replicas(n: usize, url: &str, prefix: &str, upstream: &Upstream) -> Vec<Replica> {
    replicas_with_quorum(n, url, prefix, upstream, 1).await
}

async fn replicas_with_quorum(
    n: usize,
    url: &str,
    prefix: &str,
    upstream: &Upstream,
    quorum: u32,
) -> Vec<Replica> {
    let mut out = Vec::new();
    for i in 0..n {
        let half_opened = Log::default();
        let log = half_opened.clone();
        let breaker = config()
            .on_transition(move |t: &Transition| {
                if t.to == State::HalfOpen {
                    log.lock().unwrap().push((t.at, t.reason));
                }
            })
            .build()
            .unwrap();
        let attachment = backend(url, prefix)
            .quorum(quorum)
            .build()
            .unwrap()
            .attach(&breaker)
            .unwrap();
        let prober = spawn_prober(upstream, i, Target::One(breaker.clone()));
        out.push(Replica {
            breaker,
            attachment,
            prober,
            half_opened,
        });
    }
    let shared = eventually(WAIT, || async {
        out.iter().all(|r| r.attachment.is_shared())
    })
    .await;
    assert!(shared, "every replica reaches redis");
    out
}

/// Trips replica 0 and waits until every replica is open.
async fn trip_all(replicas: &[Replica]) {
    replicas[0]
        .breaker
        .admit()
        .unwrap()
        .record(Outcome::Failure);
    let open = eventually(WAIT, || async {
        replicas.iter().all(|r| r.breaker.state() == State::Open)
    })
    .await;
    assert!(open, "the trip reaches every replica");
}

/// The cluster's state hash of the breaker.
async fn cluster_state(url: &str, prefix: &str) -> HashMap<String, String> {
    let mut conn = connection(url).await;
    conn.hgetall(format!("{{{prefix}:upstream}}:v2:state"))
        .await
        .unwrap()
}

/// Sends real calls through every replica until each is closed: the
/// traffic that confirms a heal.
async fn confirm(replicas: &[Replica]) -> bool {
    eventually(WAIT, || async {
        for r in replicas {
            if let Ok(permit) = r.breaker.admit() {
                permit.record(Outcome::Success);
            }
        }
        replicas.iter().all(|r| r.breaker.state() == State::Closed)
    })
    .await
}

async fn one_replica_probes_for_all_and_its_heal_half_opens_every_replica() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("health-one");
    let upstream = Upstream::default();
    let replicas = replicas(3, shared_url(), &prefix, &upstream).await;
    let start = Instant::now();
    trip_all(&replicas).await;
    let before = cluster_state(shared_url(), &prefix).await;
    assert_eq!(before.get("state").map(String::as_str), Some("open"));

    // (a) While the upstream hangs: six health probes, never two at once,
    // and no more than one an interval (the probers tick in step, without
    // jitter, so each tick asks three times for one turn).
    let six = eventually(WAIT, || async { upstream.sent() >= 6 }).await;
    let elapsed = start.elapsed();
    assert!(six, "health probes go out while the circuit is open");
    let sent = upstream.sent();
    let intervals = elapsed.as_secs_f64() / INTERVAL.as_secs_f64();
    eprintln!(
        "{sent} health probes from three replicas in {intervals:.1} intervals, by replica {:?}",
        upstream.by_sender()
    );
    assert_eq!(
        upstream.most_in_flight.load(Ordering::SeqCst),
        1,
        "one health probe in flight across the replicas: {:?}",
        upstream.by_sender()
    );
    assert!(
        sent as f64 <= intervals + 2.0,
        "{sent} health probes in {intervals:.1} intervals: {:?}",
        upstream.by_sender()
    );
    // Failed health probes changed nothing shared.
    let after = cluster_state(shared_url(), &prefix).await;
    for field in ["state", "until", "epoch", "reopens"] {
        assert_eq!(before.get(field), after.get(field), "{field}");
    }
    assert!(replicas.iter().all(|r| r.breaker.state() == State::Open));

    // (b) The heal: every replica half-open long before its minute is up,
    // the backoff where it was, and no resync (every 500 ms) undoes it.
    upstream.healed.store(true, Ordering::SeqCst);
    let half_open = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|r| r.breaker.state() == State::HalfOpen)
    })
    .await;
    assert!(
        half_open,
        "{:?}",
        replicas
            .iter()
            .map(|r| r.breaker.state())
            .collect::<Vec<_>>()
    );
    // From the healing probe's answer to the last replica's half-open.
    let logs: Vec<_> = replicas
        .iter()
        .map(|r| r.half_opened.lock().unwrap().clone())
        .collect();
    let healer = logs
        .iter()
        .flatten()
        .find(|(_, why)| *why == Reason::HealthProbe)
        .map(|&(at, _)| at)
        .expect("one replica healed by its health probe");
    let last = logs.iter().map(|l| l[0].0).max().unwrap();
    eprintln!(
        "health heal reached every replica {:?} after the healing probe ({:?})",
        last.saturating_duration_since(healer),
        logs.iter().map(|l| l[0].1).collect::<Vec<_>>()
    );
    let healed = cluster_state(shared_url(), &prefix).await;
    assert_eq!(healed.get("state").map(String::as_str), Some("open"));
    assert_eq!(healed.get("reopens"), before.get("reopens"), "no backoff");
    assert_ne!(healed.get("epoch"), before.get("epoch"), "a new period");
    let stayed = eventually(Duration::from_millis(1200), || async {
        replicas.iter().any(|r| r.breaker.state() == State::Open)
    })
    .await;
    assert!(!stayed, "a sync reopened a healed replica");
    for r in &replicas {
        let counters = r.breaker.snapshot().counters;
        assert_eq!(counters.probe_failures, 0);
    }

    // Real traffic confirms, on every replica.
    assert!(confirm(&replicas).await, "every replica closes");
}

async fn without_redis_each_replica_probes_and_heals_on_its_own() {
    if redis_support::skip() {
        return;
    }
    let mut server = Server::start().await;
    let url = server.url();
    let prefix = unique_prefix("health-alone");
    let upstream = Upstream::default();
    let replicas = replicas(3, &url, &prefix, &upstream).await;
    trip_all(&replicas).await;

    server.kill().await;
    let local = eventually(WAIT, || async {
        replicas.iter().all(|r| !r.attachment.is_shared())
    })
    .await;
    assert!(local, "every replica falls back to local state");
    upstream.clear();

    // (c) Every replica probes, though none can ask Redis whose turn it is.
    let everyone = eventually(WAIT, || async {
        let by = upstream.by_sender();
        (0..replicas.len()).all(|i| by.get(&i).is_some_and(|&n| n >= 2))
    })
    .await;
    assert!(everyone, "{:?}", upstream.by_sender());
    assert!(replicas.iter().all(|r| r.breaker.state() == State::Open));

    // And each heals on its own, then closes on its own traffic.
    upstream.healed.store(true, Ordering::SeqCst);
    let half_open = eventually(WAIT, || async {
        replicas.iter().all(|r| r.breaker.state() != State::Open)
    })
    .await;
    assert!(half_open, "each replica's own probe heals it");
    assert!(confirm(&replicas).await, "every replica closes");
    for r in &replicas {
        assert!(r.breaker.snapshot().counters.health_probe_successes >= 1);
    }
}

async fn replicas_open_on_their_own_probe_on_their_own() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("health-quorum");
    let upstream = Upstream::default();
    let replicas = replicas_with_quorum(3, shared_url(), &prefix, &upstream, 3).await;
    // Every replica has seen the others' heartbeats.
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // Two of three trip: short of the quorum, each is open on its own and
    // the cluster is closed, so neither waits for the other's probes.
    for r in &replicas[..2] {
        r.breaker.admit().unwrap().record(Outcome::Failure);
    }
    let both = eventually(WAIT, || async {
        let by = upstream.by_sender();
        by.get(&0).is_some_and(|&n| n >= 2) && by.get(&1).is_some_and(|&n| n >= 2)
    })
    .await;
    assert!(both, "{:?}", upstream.by_sender());
    assert_eq!(replicas[2].breaker.state(), State::Closed);
    assert!(replicas[..2]
        .iter()
        .all(|r| r.breaker.state() == State::Open));
}

async fn garbage_in_the_turn_key_stops_no_one_from_probing() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("health-garbage");
    let key = format!("{{{prefix}:upstream}}:v2:health");
    let mut conn = connection(shared_url()).await;
    // A turn that never expires, held by nobody alive.
    let _: () = conn.set(&key, "gone").await.unwrap();

    let upstream = Upstream::default();
    let replicas = replicas(2, shared_url(), &prefix, &upstream).await;
    trip_all(&replicas).await;
    let probed = eventually(WAIT, || async { upstream.sent() >= 2 }).await;
    assert!(probed, "a turn without expiry is no holder");
    let holder: Option<String> = conn.get(&key).await.unwrap();
    assert!(holder.is_some_and(|h| h != "gone"));
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!(ttl > 0, "the turn expires: {ttl}");

    // Another type altogether: taken over the same way.
    let _: () = conn.del(&key).await.unwrap();
    let _: () = conn.rpush(&key, "gone").await.unwrap();
    let _: () = conn.pexpire(&key, 2000).await.unwrap();
    upstream.clear();
    let probed = eventually(WAIT, || async { upstream.sent() >= 2 }).await;
    assert!(probed, "a turn of another type is no holder");
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string", "the turn was taken over");
    drop(replicas);
}

async fn keyed_replicas_probe_each_key_once_and_share_its_heal() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("health-keyed");
    let upstream = Upstream::default();
    let mut sets = Vec::new();
    for i in 0..2 {
        let set = KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(1)
            .jitter(0.0)
            .open_duration(Duration::from_secs(60))
            .probes(2)
            .close_after(1)
            .build()
            .unwrap();
        let attachment = backend(shared_url(), &prefix)
            .build()
            .unwrap()
            .attach_keyed(&set)
            .unwrap();
        let prober = spawn_prober(&upstream, i, Target::Keyed(set.clone()));
        sets.push((set, attachment, prober));
    }
    let shared = eventually(WAIT, || async {
        sets.iter().all(|(_, a, _)| a.is_shared())
    })
    .await;
    assert!(shared);
    let (a, b) = (&sets[0].0, &sets[1].0);
    // Both replicas know the key; one trips it.
    let (on_a, on_b) = (a.get_or_insert("gpt-4o"), b.get_or_insert("gpt-4o"));
    on_a.admit().unwrap().record(Outcome::Failure);
    let open = eventually(WAIT, || async { on_b.state() == State::Open }).await;
    assert!(open, "the trip reaches the other replica");

    let four = eventually(WAIT, || async { upstream.sent() >= 4 }).await;
    assert!(four);
    assert_eq!(
        upstream.most_in_flight.load(Ordering::SeqCst),
        1,
        "one health probe of the key at a time: {:?}",
        upstream.by_sender()
    );

    upstream.healed.store(true, Ordering::SeqCst);
    let half_open = eventually(WAIT, || async {
        on_a.state() == State::HalfOpen && on_b.state() == State::HalfOpen
    })
    .await;
    assert!(half_open, "{:?} {:?}", on_a.state(), on_b.state());
    for (_, _, prober) in &sets {
        prober.abort();
    }
}

// === the scripts themselves ===

// The state script is driven by name from the crate's own tests
// (`src/redis/script_tests.rs`).

const TURN: &str = include_str!("../../src/redis/turn.lua");

async fn a_holder_whose_probes_keep_failing_passes_the_turn_to_one_other_replica() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("health-pass");
    let key = format!("{{{prefix}:upstream}}:v2:health");
    let mut conn = connection(shared_url()).await;
    let script = redis::Script::new(TURN);
    let mut ask = async |who: &str, pass: bool| -> i64 {
        script
            .key(&key)
            .arg(who)
            .arg(60_000)
            .arg(u8::from(pass))
            .invoke_async(&mut conn)
            .await
            .unwrap()
    };
    assert_eq!(ask("a", false).await, 1, "a takes the free turn");
    assert_eq!(ask("b", false).await, 0);
    assert_eq!(ask("a", false).await, 1, "and renews it");
    assert_eq!(ask("a", true).await, 0, "a passes it on");
    assert_eq!(ask("a", false).await, 0, "and does not take it back");
    assert_eq!(ask("b", false).await, 1, "one other replica takes it");
    assert_eq!(ask("c", false).await, 0, "only one");
    assert_eq!(ask("b", true).await, 0, "b passes it in turn");
    assert_eq!(ask("a", false).await, 1, "and a may take it again");
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio(
            "redis_health::one_replica_probes_for_all_and_its_heal_half_opens_every_replica",
            Rt::Multi,
            one_replica_probes_for_all_and_its_heal_half_opens_every_replica,
        ),
        Trial::tokio(
            "redis_health::without_redis_each_replica_probes_and_heals_on_its_own",
            Rt::Multi,
            without_redis_each_replica_probes_and_heals_on_its_own,
        ),
        Trial::tokio(
            "redis_health::replicas_open_on_their_own_probe_on_their_own",
            Rt::Multi,
            replicas_open_on_their_own_probe_on_their_own,
        ),
        Trial::tokio(
            "redis_health::garbage_in_the_turn_key_stops_no_one_from_probing",
            Rt::Multi,
            garbage_in_the_turn_key_stops_no_one_from_probing,
        ),
        Trial::tokio(
            "redis_health::keyed_replicas_probe_each_key_once_and_share_its_heal",
            Rt::Multi,
            keyed_replicas_probe_each_key_once_and_share_its_heal,
        ),
        Trial::tokio(
            "redis_health::a_holder_whose_probes_keep_failing_passes_the_turn_to_one_other_replica",
            Rt::Multi,
            a_holder_whose_probes_keep_failing_passes_the_turn_to_one_other_replica,
        ),
    ]
}
