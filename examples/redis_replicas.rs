//! Measures how long a trip on one replica takes to reach the others through
//! Redis: several replicas, each its own breaker with its own connections;
//! one trips; each other replica's time until it rejects is recorded. Prints
//! min / median / max over the trials, for a single named breaker, for a
//! key of a keyed set, and for a cluster-wide force open made on one replica
//! (timed from the call, which opens its own connection, to each replica
//! rejecting, itself included), and for a trip no replica decides alone
//! (each under the failure-rate rule, the sum over it: timed from the
//! failure that takes the sum over to each replica rejecting, the one that
//! recorded it included; the counts wait for the next flush, 50 ms by
//! default).
//!
//! ```text
//! cargo run --release --features redis --example redis_replicas -- [replicas] [trials]
//! ```
//!
//! With `keys`, it measures propagation at many keys instead: two replicas,
//! each a keyed set holding the same keys (every key used on both), one
//! trips a number of keys at once, and each trip is timed from the
//! deciding replica's transition to the other replica's (both taken in
//! the sets' transition listeners). Prints p50 and max for 50, 5,000 and
//! 20,000 keys and 1, 100 and 1,000 trips, or one cell:
//!
//! ```text
//! cargo run --release --features redis --example redis_replicas -- keys [keys trips]
//! ```
//!
//! `REDIS_URL` picks the server (default `redis://127.0.0.1:6379/`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{timeout, Instant};
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::redis::{Attachment, Backend, Client};
use tower_circuit_breaker::{Breaker, Outcome, TripMode};

fn backend(url: &str, prefix: &str) -> Backend {
    Backend::builder(Client::open(url).expect("valid REDIS_URL"))
        .prefix(prefix)
        .build()
        .expect("valid settings")
}

async fn until_shared(attachments: &[Attachment]) {
    timeout(Duration::from_secs(10), async {
        while !attachments.iter().all(Attachment::is_shared) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("redis answers");
}

/// Each watcher's time from `start` to its replica rejecting; `what` names
/// what must arrive within 5 s.
async fn arrivals(
    watchers: Vec<tokio::task::JoinHandle<Instant>>,
    start: Instant,
    what: &str,
) -> Vec<Duration> {
    let mut out = Vec::new();
    for w in watchers {
        let at = timeout(Duration::from_secs(5), w)
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .unwrap();
        out.push(at.saturating_duration_since(start));
    }
    out
}

/// Waits until `breaker` rejects, on its transitions rather than by polling.
async fn until_rejecting(breaker: Breaker) -> Instant {
    loop {
        let changed = breaker.changed();
        if breaker.admit().is_err() {
            return Instant::now();
        }
        changed.await;
    }
}

/// One trial with single breakers: per-replica latencies.
async fn single(url: &str, replicas: usize, trial: usize) -> Vec<Duration> {
    let prefix = format!("propagation-{}-{trial}", std::process::id());
    let mut breakers = Vec::new();
    let mut attachments = Vec::new();
    for _ in 0..replicas {
        // All or nothing, to show the circuit opening: by default a call
        // without a fallback is graded instead (`TripMode::Graded`).
        let b = Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .consecutive_failures(3)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap();
        attachments.push(backend(url, &prefix).attach(&b).unwrap());
        breakers.push(b);
    }
    until_shared(&attachments).await;
    let watchers: Vec<_> = breakers[1..]
        .iter()
        .map(|b| tokio::spawn(until_rejecting(b.clone())))
        .collect();
    for _ in 0..2 {
        breakers[0].admit().unwrap().record(Outcome::Failure);
    }
    let start = Instant::now();
    breakers[0].admit().unwrap().record(Outcome::Failure);
    let out = arrivals(watchers, start, "the trip arrives").await;
    for a in attachments {
        a.detach().await;
    }
    out
}

/// One trial of a trip no replica decides alone: every replica's own window
/// stays under the failure-rate rule, and the last failure takes the sum
/// over it. Per-replica latencies (the one that recorded it included), from
/// that failure to each replica rejecting.
async fn summed(url: &str, replicas: usize, trial: usize) -> Vec<Duration> {
    let prefix = format!("propagation-summed-{}-{trial}", std::process::id());
    let mut breakers = Vec::new();
    let mut attachments = Vec::new();
    for _ in 0..replicas {
        let b = Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .time_window(Duration::from_secs(30), 10)
            .min_calls(2 * replicas as u32)
            .failure_rate(0.5)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap();
        attachments.push(backend(url, &prefix).attach(&b).unwrap());
        breakers.push(b);
    }
    until_shared(&attachments).await;
    // One success on each replica, one failure on each but the last: one
    // failure short of half, on every replica and in the sum.
    for (i, b) in breakers.iter().enumerate() {
        b.admit().unwrap().record(Outcome::Success);
        if i + 1 < replicas {
            b.admit().unwrap().record(Outcome::Failure);
        }
    }
    // Every count has reached the cluster (several flushes).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        breakers.iter().all(|b| b.admit().is_ok()),
        "no replica open yet"
    );
    let watchers: Vec<_> = breakers
        .iter()
        .map(|b| tokio::spawn(until_rejecting(b.clone())))
        .collect();
    let start = Instant::now();
    breakers[replicas - 1]
        .admit()
        .unwrap()
        .record(Outcome::Failure);
    let out = arrivals(watchers, start, "the trip arrives").await;
    for a in attachments {
        a.detach().await;
    }
    out
}

/// One trial of a cluster-wide force open: per-replica latencies, from the
/// call on replica 0.
async fn forced(url: &str, replicas: usize, trial: usize) -> Vec<Duration> {
    let prefix = format!("propagation-forced-{}-{trial}", std::process::id());
    let mut breakers = Vec::new();
    let mut attachments = Vec::new();
    for _ in 0..replicas {
        let b = Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("upstream")
            .build()
            .unwrap();
        attachments.push(backend(url, &prefix).attach(&b).unwrap());
        breakers.push(b);
    }
    until_shared(&attachments).await;
    let watchers: Vec<_> = breakers
        .iter()
        .map(|b| tokio::spawn(until_rejecting(b.clone())))
        .collect();
    let start = Instant::now();
    attachments[0]
        .force_open_cluster("upstream")
        .await
        .expect("redis confirms the control");
    let out = arrivals(watchers, start, "the control arrives").await;
    attachments[0]
        .reset_cluster("upstream")
        .await
        .expect("redis confirms the reset");
    for a in attachments {
        a.detach().await;
    }
    out
}

/// One trial with keyed sets: the trip of one key, seen or not elsewhere.
async fn keyed(url: &str, replicas: usize, trial: usize) -> Vec<Duration> {
    let prefix = format!("propagation-keyed-{}-{trial}", std::process::id());
    let mut sets = Vec::new();
    let mut attachments = Vec::new();
    for _ in 0..replicas {
        let s = KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(3)
            .open_duration(Duration::from_secs(30))
            .build()
            .unwrap();
        attachments.push(backend(url, &prefix).attach_keyed(&s).unwrap());
        // Every replica has seen the key, so it can be watched.
        s.admit("gpt-4o/eu").unwrap().record(Outcome::Success);
        sets.push(s);
    }
    until_shared(&attachments).await;
    let watchers: Vec<_> = sets[1..]
        .iter()
        .map(|s| tokio::spawn(until_rejecting(s.get("gpt-4o/eu").unwrap())))
        .collect();
    for _ in 0..2 {
        sets[0].admit("gpt-4o/eu").unwrap().record(Outcome::Failure);
    }
    let start = Instant::now();
    sets[0].admit("gpt-4o/eu").unwrap().record(Outcome::Failure);
    let out = arrivals(watchers, start, "the trip arrives").await;
    for a in attachments {
        a.detach().await;
    }
    out
}

/// When each key turned open, by the set's transition listener.
type Opened = Arc<Mutex<HashMap<Arc<str>, Instant>>>;

fn recording_set(keys: usize) -> (KeyedBreakers, Opened) {
    let opened = Opened::default();
    let o = opened.clone();
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .max_keys(keys + 16)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(600))
        .on_transition(move |t| {
            if t.to == tower_circuit_breaker::State::Open
                && let Some(key) = &t.key
            {
                o.lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_insert_with(Instant::now);
            }
        })
        .build()
        .unwrap();
    (set, opened)
}

/// `trips` of `keys` keys trip at once on one replica: each trip's time
/// from that replica's transition to the other's; and how many arrived.
async fn many_keys(url: &str, keys: usize, trips: usize) -> (Vec<Duration>, usize) {
    let prefix = format!("propagation-many-{}-{keys}-{trips}", std::process::id());
    let names: Vec<String> = (0..keys).map(|i| format!("key-{i}")).collect();
    let (deciding, opened_here) = recording_set(keys);
    let (other, opened_there) = recording_set(keys);
    for set in [&deciding, &other] {
        for n in &names {
            set.admit(n).unwrap().record(Outcome::Success);
        }
    }
    let attachments = vec![
        backend(url, &prefix).attach_keyed(&deciding).unwrap(),
        backend(url, &prefix).attach_keyed(&other).unwrap(),
    ];
    until_shared(&attachments).await;
    // Past the first resync, so both replicas hold every key's state.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Spread over the keys.
    let step = keys / trips;
    let tripped: Vec<&String> = names.iter().step_by(step.max(1)).take(trips).collect();
    for n in &tripped {
        deciding.admit(n).unwrap().record(Outcome::Failure);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while opened_there.lock().unwrap().len() < tripped.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (here, there) = (
        opened_here.lock().unwrap().clone(),
        opened_there.lock().unwrap().clone(),
    );
    let mut out = Vec::new();
    for n in &tripped {
        let key: &str = n;
        if let (Some(a), Some(b)) = (here.get(key), there.get(key)) {
            out.push(b.saturating_duration_since(*a));
        }
    }
    let arrived = out.len();
    for a in attachments {
        a.detach().await;
    }
    (out, arrived)
}

fn report_many(keys: usize, trips: usize, mut lat: Vec<Duration>, arrived: usize) {
    lat.sort();
    let (p50, max) = match lat.len() {
        0 => ("-".to_string(), "-".to_string()),
        n => (
            format!("{} ms", lat[n / 2].as_millis()),
            format!("{} ms", lat[n - 1].as_millis()),
        ),
    };
    println!(
        "{keys:>6} keys {trips:>5} trips   p50 {p50:>8}   max {max:>8}   arrived {arrived}/{trips}"
    );
}

fn report(what: &str, mut per_replica: Vec<Duration>, mut last: Vec<Duration>) {
    let show = |v: &mut Vec<Duration>| {
        v.sort();
        format!(
            "min {:>7.2?}  median {:>7.2?}  max {:>7.2?}  (n={})",
            v[0],
            v[v.len() / 2],
            v[v.len() - 1],
            v.len()
        )
    };
    println!("{what}");
    println!("  each replica:        {}", show(&mut per_replica));
    println!("  all replicas reject: {}", show(&mut last));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("keys") {
        args.next();
        let cell: Vec<usize> = args.filter_map(|a| a.parse().ok()).collect();
        let cells: Vec<(usize, usize)> = match cell[..] {
            [keys, trips] => vec![(keys, trips.clamp(1, keys))],
            _ => [50, 5_000, 20_000]
                .into_iter()
                .flat_map(|k| [1, 100, 1_000].into_iter().map(move |t| (k, t)))
                .filter(|&(k, t)| t <= k)
                .collect(),
        };
        println!("propagation at many keys: 2 replicas, {url}, from the deciding replica's transition to the other's");
        for (keys, trips) in cells {
            let (lat, arrived) = many_keys(&url, keys, trips).await;
            report_many(keys, trips, lat, arrived);
        }
        return;
    }
    let replicas: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5).max(2);
    let trials: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(20)
        .max(1);
    println!("{replicas} replicas, {trials} trials, {url}");

    for (what, mode) in [
        ("single breaker (trip sent on the transition)", 0),
        ("keyed set (trip sent when the set wakes its task on the transition)", 1),
        ("cluster-wide force open (from the call on one replica)", 2),
        ("summed window (no replica over the rule alone; from the failure that takes the sum over)", 3),
    ] {
        let (mut each, mut all) = (Vec::new(), Vec::new());
        for trial in 0..trials {
            let lat = match mode {
                0 => single(&url, replicas, trial).await,
                1 => keyed(&url, replicas, trial).await,
                2 => forced(&url, replicas, trial).await,
                _ => summed(&url, replicas, trial).await,
            };
            all.push(*lat.iter().max().unwrap());
            each.extend(lat);
        }
        report(what, each, all);
    }
}
