//! The fleet soak: replicas as separate backends on one Redis, a keyed set
//! each, random trips, heals, operator actions and restarts, every round
//! checked for convergence. Shared by the `redis_fleet` example and the
//! Redis test suite.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::AsyncCommands;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::redis::{Attachment, Backend, Client};
use tower_circuit_breaker::{Outcome, State, TripMode};

/// What a soak runs; every setting it uses is named here.
#[derive(Debug, Clone)]
pub struct Plan {
    pub url: String,
    pub replicas: usize,
    pub keys: usize,
    pub rounds: usize,
    pub seed: u64,
    /// How often each replica exchanges what changed.
    pub flush: Duration,
    /// How often each replica re-reads every breaker with activity, and
    /// sends its heartbeat.
    pub resync: Duration,
    /// Calls per second each replica makes, on random keys.
    pub calls_per_s: u32,
    /// How long a replica may take to reach the cluster's state before it
    /// counts as diverged.
    pub converge: Duration,
    /// One round starts this often (a round that takes longer starts the
    /// next at once), so the fleet sees the same rate of changes at any size.
    pub round_every: Duration,
}

impl Plan {
    pub fn new(url: &str, replicas: usize, keys: usize, rounds: usize) -> Plan {
        Plan {
            url: url.to_string(),
            replicas,
            keys,
            rounds,
            seed: 1,
            flush: Duration::from_millis(50),
            resync: Duration::from_secs(1),
            calls_per_s: 20,
            converge: Duration::from_secs(10),
            round_every: Duration::from_millis(250),
        }
    }
}

/// What a soak measured.
#[derive(Debug, Default)]
pub struct Figures {
    /// From the deciding replica's transition to each other replica's.
    pub trip: Vec<Duration>,
    pub heal: Vec<Duration>,
    pub control: Vec<Duration>,
    /// From a restarted replica's attach to every open key open on it.
    pub join: Vec<Duration>,
    pub rounds: usize,
    /// Replicas that had not reached the cluster's state in time, summed
    /// over rounds.
    pub diverged: usize,
    /// Operator resets Redis did not confirm in five tries (the round
    /// checks nothing then).
    pub unconfirmed: usize,
    /// Redis commands processed while the rounds ran, and for how long.
    pub commands: u64,
    pub elapsed: Duration,
    /// The same over the rounds without a restart alone, with the script
    /// calls among them: the fleet's steady load, apart from what a
    /// restarted replica's first read of every key costs once.
    pub steady_commands: u64,
    pub steady_scripts: u64,
    pub steady_elapsed: Duration,
    /// Commands and script calls the restart rounds processed, less the
    /// steady rate over their length: what a replica's join costs.
    pub join_commands: Vec<u64>,
    /// Bytes of Redis memory the prefix's keys take, and the breakers they
    /// hold state for.
    pub bytes: u64,
    pub breakers_stored: usize,
    /// Calls the replicas made while the rounds ran (a loaded machine
    /// makes fewer than the plan asks).
    pub calls: u64,
}

/// Calls every replica of the process made so far.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Transitions a replica saw: key, state entered, when.
type Log = Arc<Mutex<Vec<(Arc<str>, State, Instant)>>>;

struct Replica {
    set: KeyedBreakers,
    attachment: Attachment,
    log: Log,
    traffic: JoinHandle<()>,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn key(i: usize) -> String {
    format!("model-{i:04}")
}

async fn start(plan: &Plan, prefix: &str, seed: u64) -> Replica {
    let log = Log::default();
    let l = log.clone();
    let set = KeyedBreakers::builder()
        .max_keys(plan.keys + 16)
        .consecutive_failures(1)
        // Every call of a tripped key is rejected, as a fleet's would be.
        .trip_mode(TripMode::Open)
        .jitter(0.0)
        // Long enough that only the soak's heals end an open period.
        .open_duration(Duration::from_secs(3600))
        .probes(1)
        .close_after(1)
        .on_transition(move |t| {
            if let Some(k) = &t.key {
                l.lock().unwrap().push((k.clone(), t.to, Instant::now()));
            }
        })
        .build()
        .expect("valid settings");
    // Every replica serves every key.
    for i in 0..plan.keys {
        drop(set.get_or_insert(&key(i)));
    }
    let backend = Backend::builder(Client::open(plan.url.as_str()).expect("valid url"))
        .prefix(prefix)
        .flush_interval(plan.flush)
        .resync_interval(plan.resync)
        .build()
        .expect("valid settings");
    let attachment = backend.attach_keyed(&set).expect("in a runtime");
    let (s, keys, every) = (
        set.clone(),
        plan.keys,
        Duration::from_secs(1) / plan.calls_per_s.max(1),
    );
    let traffic = tokio::spawn(async move {
        let mut rng = Rng(seed);
        loop {
            sleep(every).await;
            if let Ok(p) = s.admit(&key(rng.below(keys))) {
                p.record(Outcome::Success);
            }
            CALLS.fetch_add(1, Ordering::Relaxed);
        }
    });
    Replica {
        set,
        attachment,
        log,
        traffic,
    }
}

/// The state a replica's breaker for `k` is in, open and half-open alike
/// (a cluster-held open period) counted as open.
fn local(r: &Replica, k: &str) -> State {
    match r.set.get(k).map(|b| b.state()) {
        Some(State::HalfOpen) => State::Open,
        Some(s) => s,
        None => State::Closed,
    }
}

/// When replica `r` last entered a state in `want` for `k`, after `since`.
fn entered(r: &Replica, k: &str, want: &[State], since: Instant) -> Option<Instant> {
    r.log
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(key, to, at)| &**key == k && want.contains(to) && *at >= since)
        .map(|(_, _, at)| *at)
}

/// Waits until every replica has `k` in `want`; returns how many had not
/// within the plan's limit.
async fn converge(plan: &Plan, fleet: &[Replica], k: &str, want: State) -> usize {
    let end = Instant::now() + plan.converge;
    loop {
        let behind = fleet.iter().filter(|r| local(r, k) != want).count();
        if behind == 0 || Instant::now() >= end {
            return behind;
        }
        sleep(Duration::from_millis(5)).await;
    }
}

/// Each other replica's delay from `decider`'s transition of `k` into one of
/// `want`, after `since`.
fn delays(
    fleet: &[Replica],
    decider: usize,
    k: &str,
    want: &[State],
    since: Instant,
) -> Vec<Duration> {
    let Some(first) = entered(&fleet[decider], k, want, since) else {
        return Vec::new();
    };
    fleet
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != decider)
        .filter_map(|(_, r)| entered(r, k, want, since))
        .map(|at| at.saturating_duration_since(first))
        .collect()
}

async fn info_field(
    conn: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> u64 {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Commands Redis processed so far (script commands included), and
/// `EVALSHA` calls among them, with one `INFO` each.
async fn counts(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let total = info_field(conn, "stats", "total_commands_processed").await;
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let scripts = text
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|v| v.split(',').next()?.parse().ok())
        .unwrap_or(0);
    (total, scripts)
}

/// Runs the soak; `prefix` keeps its keys apart from anything else.
pub async fn run(plan: &Plan, prefix: &str) -> Figures {
    let mut rng = Rng(plan.seed);
    let mut conn = Client::open(plan.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("redis answers");
    let mut fleet = Vec::new();
    for i in 0..plan.replicas {
        let r = start(plan, prefix, plan.seed ^ (i as u64 + 1)).await;
        // One replica's first read of every key at a time: a fleet that
        // starts all at once on a busy machine can keep Redis past the
        // exchanges' timeout, which starts every read again.
        let _ = timeout(Duration::from_secs(30), async {
            while !r.attachment.is_shared() {
                sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        fleet.push(r);
    }
    // Each replica's first exchange reads every key it holds.
    let joining = Duration::from_secs(30) + Duration::from_millis(500) * plan.replicas as u32;
    let shared = timeout(joining, async {
        while !fleet.iter().all(|r| r.attachment.is_shared()) {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(shared.is_ok(), "every replica reaches redis");

    let mut figures = Figures::default();
    let mut open: Vec<usize> = Vec::new();
    let mut joins: Vec<(u64, Duration)> = Vec::new();
    let mut last = None;
    let before = info_field(&mut conn, "stats", "total_commands_processed").await;
    let calls = CALLS.load(Ordering::Relaxed);
    let began = Instant::now();
    let mut ticks = tokio::time::interval(plan.round_every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..plan.rounds {
        ticks.tick().await;
        let decider = rng.below(fleet.len());
        let roll = rng.below(100);
        let since = Instant::now();
        let restart = roll < 10 && fleet.len() > 1;
        // Each round's count runs to the next round's start.
        let now = counts(&mut conn).await;
        tally(
            &mut figures,
            &mut joins,
            last.replace((now, since, restart)),
            now,
        );
        'round: {
            let (k, want) = if restart {
                // A replica restarts: a new backend, a new id, a fresh set.
                let old = fleet.swap_remove(decider);
                old.traffic.abort();
                old.attachment.detach().await;
                let joined = Instant::now();
                let fresh = start(plan, prefix, rng.next()).await;
                let caught_up = timeout(plan.converge, async {
                    while !open.iter().all(|&i| local(&fresh, &key(i)) == State::Open) {
                        sleep(Duration::from_millis(2)).await;
                    }
                })
                .await;
                if caught_up.is_ok() {
                    figures.join.push(joined.elapsed());
                } else {
                    figures.diverged += 1;
                }
                // Its first read of every key ends in this round, so the
                // steady rounds after it do not count it.
                let _ = timeout(plan.converge, async {
                    while !fresh.attachment.is_shared() {
                        sleep(Duration::from_millis(2)).await;
                    }
                })
                .await;
                fleet.push(fresh);
                figures.rounds += 1;
                break 'round;
            } else if roll < 55 || open.is_empty() {
                // A trip on one replica.
                let i = loop {
                    let i = rng.below(plan.keys);
                    if !open.contains(&i) {
                        break i;
                    }
                };
                let k = key(i);
                if let Ok(p) = fleet[decider].set.admit(&k) {
                    p.record(Outcome::Failure);
                }
                open.push(i);
                let behind = converge(plan, &fleet, &k, State::Open).await;
                figures
                    .trip
                    .extend(delays(&fleet, decider, &k, &[State::Open], since));
                figures.diverged += behind;
                figures.rounds += 1;
                break 'round;
            } else if roll < 85 {
                // A heal: one replica's health probe finds the upstream
                // answering, and its probe closes the circuit for everyone.
                let i = open.swap_remove(rng.below(open.len()));
                let k = key(i);
                let b = fleet[decider].set.get_or_insert(&k);
                b.record_health_probe(Outcome::Success);
                let probed = timeout(plan.converge, async {
                    loop {
                        if let Ok(p) = b.admit() {
                            p.record(Outcome::Success);
                            if b.state() == State::Closed {
                                return;
                            }
                        }
                        sleep(Duration::from_millis(2)).await;
                    }
                })
                .await;
                if probed.is_err() {
                    figures.diverged += 1;
                }
                let behind = converge(plan, &fleet, &k, State::Closed).await;
                figures
                    .heal
                    .extend(delays(&fleet, decider, &k, &[State::Closed], since));
                figures.diverged += behind;
                (k, State::Closed)
            } else {
                // An operator resets one open key for every replica.
                let i = open.swap_remove(rng.below(open.len()));
                let k = key(i);
                // The control opens its own connection, which a loaded machine
                // may not finish within the backend's timeout: ask again.
                let mut confirmed = false;
                for _ in 0..5 {
                    if fleet[decider].attachment.reset_cluster(&k).await.is_ok() {
                        confirmed = true;
                        break;
                    }
                }
                if !confirmed {
                    figures.unconfirmed += 1;
                    open.push(i);
                    figures.rounds += 1;
                    break 'round;
                }
                let behind = converge(plan, &fleet, &k, State::Closed).await;
                // Timed from the call: the operator's replica learns it from
                // the same message as the others.
                figures.control.extend(
                    fleet
                        .iter()
                        .filter_map(|r| entered(r, &k, &[State::Closed], since))
                        .map(|at| at.saturating_duration_since(since)),
                );
                figures.diverged += behind;
                (k, State::Closed)
            };
            let _ = (k, want);
            figures.rounds += 1;
        }
    }
    let now = counts(&mut conn).await;
    tally(&mut figures, &mut joins, last.take(), now);
    figures.elapsed = began.elapsed();
    // A join's commands, less what the rest of the fleet sent meanwhile.
    let steady = figures.steady_commands as f64 / figures.steady_elapsed.as_secs_f64().max(1e-9);
    figures.join_commands = joins
        .iter()
        .map(|&(c, took)| (c as f64 - steady * took.as_secs_f64()).max(0.0) as u64)
        .collect();
    let after = info_field(&mut conn, "stats", "total_commands_processed").await;
    figures.commands = after.saturating_sub(before);
    figures.calls = CALLS.load(Ordering::Relaxed) - calls;

    let stored: Vec<String> = conn.keys(format!("{{{prefix}:*")).await.unwrap();
    let mut names = HashMap::new();
    for k in &stored {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        let name = k.split('}').next().unwrap_or(k).to_string();
        *names.entry(name).or_insert(0) += bytes.unwrap_or(0);
    }
    figures.breakers_stored = names.len();
    figures.bytes = names.values().sum();
    for r in fleet {
        r.traffic.abort();
        r.attachment.detach().await;
    }
    let _: Result<u64, _> = if stored.is_empty() {
        Ok(0)
    } else {
        conn.del(&stored).await
    };
    figures
}

/// Adds the round that began at `at` (counts `then`, a restart or not) up
/// to counts `now`, taken as the next round starts.
fn tally(
    figures: &mut Figures,
    joins: &mut Vec<(u64, Duration)>,
    last: Option<((u64, u64), Instant, bool)>,
    now: (u64, u64),
) {
    let Some((then, at, restart)) = last else {
        return;
    };
    // The counts' own two INFO commands are not the fleet's.
    let (c, scripts) = (
        now.0.saturating_sub(then.0 + 2),
        now.1.saturating_sub(then.1),
    );
    if restart {
        joins.push((c, at.elapsed()));
    } else {
        figures.steady_commands += c;
        figures.steady_scripts += scripts;
        figures.steady_elapsed += at.elapsed();
    }
}

/// p50, p99 and max of `v`, in ms.
pub fn spread(v: &mut [Duration]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    Some((at(0.5), at(0.99), at(1.0)))
}
