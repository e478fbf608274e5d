//! Measures how long a trip on one replica takes to reach the others through
//! Redis: several replicas, each its own breaker with its own connections;
//! one trips; each other replica's time until it rejects is recorded. Prints
//! min / median / max over the trials, for a single named breaker, for a
//! key of a keyed set, and for a cluster-wide force open made on one replica
//! (timed from the call, which opens its own connection, to each replica
//! rejecting, itself included).
//!
//! ```text
//! cargo run --release --features redis --example redis_replicas -- [replicas] [trials]
//! ```
//!
//! `REDIS_URL` picks the server (default `redis://127.0.0.1:6379/`).

use std::time::Duration;

use tokio::time::{timeout, Instant};
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::redis::{Attachment, Backend, Client};
use tower_circuit_breaker::{Breaker, Outcome};

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
        let b = Breaker::builder()
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
    let mut out = Vec::new();
    for w in watchers {
        let at = timeout(Duration::from_secs(5), w)
            .await
            .expect("the trip arrives")
            .unwrap();
        out.push(at.saturating_duration_since(start));
    }
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
        let b = Breaker::builder().name("upstream").build().unwrap();
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
    let mut out = Vec::new();
    for w in watchers {
        let at = timeout(Duration::from_secs(5), w)
            .await
            .expect("the control arrives")
            .unwrap();
        out.push(at.saturating_duration_since(start));
    }
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
    let mut out = Vec::new();
    for w in watchers {
        let at = timeout(Duration::from_secs(5), w)
            .await
            .expect("the trip arrives")
            .unwrap();
        out.push(at.saturating_duration_since(start));
    }
    for a in attachments {
        a.detach().await;
    }
    out
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
    let mut args = std::env::args().skip(1);
    let replicas: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5).max(2);
    let trials: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(20)
        .max(1);
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    println!("{replicas} replicas, {trials} trials, {url}");

    for (what, mode) in [
        ("single breaker (trip sent on the transition)", 0),
        ("keyed set (trip found by a state scan every 5 ms)", 1),
        ("cluster-wide force open (from the call on one replica)", 2),
    ] {
        let (mut each, mut all) = (Vec::new(), Vec::new());
        for trial in 0..trials {
            let lat = match mode {
                0 => single(&url, replicas, trial).await,
                1 => keyed(&url, replicas, trial).await,
                _ => forced(&url, replicas, trial).await,
            };
            all.push(*lat.iter().max().unwrap());
            each.extend(lat);
        }
        report(what, each, all);
    }
}
