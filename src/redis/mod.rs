//! Shared circuit state across replicas, through Redis.
//!
//! When a service runs on several replicas, each one learning on its own that
//! an upstream is down multiplies the damage by the number of replicas. A
//! [`Backend`] keeps the breakers of every replica in step: a trip on one
//! opens them all, outcomes are counted across replicas, and a half-open
//! cycle admits `probes` calls in the whole cluster, not on each replica.
//!
//! # Redis stays off the hot path
//!
//! Requests only ever touch the local [`Breaker`]. Each [`Attachment`] runs
//! one background task that does all the Redis I/O:
//!
//! - every flush interval (50 ms by default) it sends what changed locally:
//!   the closed-state outcomes since the last flush, a local trip, probe
//!   outcomes, and claims for probe slots;
//! - a local trip is sent at once (a keyed set wakes its task on any of its
//!   breakers' transitions, which then sends the keys that tripped or
//!   healed), and Redis publishes every cluster transition, so
//!   the other replicas apply it within a round trip or two — about a
//!   millisecond on loopback;
//! - every resync interval (1 s) it reads the state of every breaker that
//!   is not closed or saw calls since the last resync, in case a message was
//!   lost, and otherwise pings Redis.
//!
//! A message touches only the breaker it names: the messages already
//! received join one pipelined round trip of their keys' script calls, and
//! no other key of a keyed set is read or written for them. Two replicas on
//! loopback, each a keyed set with every key in use, one tripping keys at
//! once, timed from that replica's transition to the other's (`cargo run
//! --release --features redis --example redis_replicas -- keys`, one run on
//! a shared 2-core machine):
//!
//! | keys | trips | p50 | max |
//! |---:|---:|---:|---:|
//! | 50 | 1 | 3 ms | 3 ms |
//! | 5,000 | 1 | 3 ms | 3 ms |
//! | 5,000 | 100 | 16 ms | 17 ms |
//! | 5,000 | 1,000 | 64 ms | 94 ms |
//! | 20,000 | 1 | 17 ms | 17 ms |
//! | 20,000 | 100 | 21 ms | 22 ms |
//! | 20,000 | 1,000 | 58 ms | 86 ms |
//!
//! A call costs about the same whether its breaker is attached or not (the
//! `redis_overhead` example measures both in one run).
//!
//! Every exchange is one Lua script call per breaker (pipelined on one
//! server; on a Redis Cluster, each to its breaker's slot), so every cluster
//! transition is atomic. Deadlines come from the Redis server's clock and
//! reach the replicas as remaining durations, so clock skew between replicas
//! cannot split the cluster; see [Clocks](#clocks) for a server clock that
//! steps.
//!
//! # How the cluster decides
//!
//! - **Trips.** A breaker that trips on its own rules opens the cluster. The
//!   cluster also keeps a time window of the closed-state outcomes of every
//!   replica, and hands the sum back with each exchange that adds to it; the
//!   breaker's own failure-rate and slow-call-rate rules, with its
//!   `min_calls`, judge the sum ([`Remote::evaluate`](crate::Remote::evaluate))
//!   and a replica that sees it cross trips and shares the trip: five
//!   replicas that each see a fifth of the failures trip together, as one
//!   breaker would, one round trip after the counts arrive. The rules live in
//!   the core alone; the script only stores and sums. The window is the
//!   breaker's own time window, or [`BackendBuilder::window`] (10 s by
//!   default) for breakers with a count window. The consecutive-failure rule
//!   stays local (a streak has no order across replicas), but its trips are
//!   shared like any other.
//! - **Open.** The open duration and its backoff are the cluster's, computed
//!   from the breaker's settings, and applied on every replica.
//! - **Half-open.** Each breaker runs in shared mode (see
//!   [`Remote`](crate::Remote)): it admits only probes the cluster granted.
//!   A replica whose callers are turned away in half-open claims one slot at
//!   a time; slots carry a lease (the breaker's probe lease), so a replica
//!   that dies cannot wedge the cycle. Probe outcomes are reported, and the
//!   cluster closes after `close_after` successes or reopens, with backoff,
//!   as soon as closing is out of reach.
//! - **Manual control**, cluster-wide: [`Attachment::force_open_cluster`],
//!   [`Attachment::disable_cluster`] and [`Attachment::reset_cluster`] act on
//!   every replica (each applies them within a round trip of the message;
//!   one that was away, when it is back), and [`Attachment::snapshot`] says
//!   whether a replica's state came from itself, from the cluster, or from
//!   such a control ([`Origin`]). The breaker's own controls stay local: a
//!   breaker forced open or disabled on one replica is left alone and
//!   shares nothing, and a [`reset`](Breaker::reset) closes one replica,
//!   which the cluster opens again while it is open elsewhere.
//! - **Health probes**, one replica for all: before each probe, a
//!   [`HealthProbe`](crate::health::HealthProbe) takes the breaker's turn in
//!   Redis, which its holder renews with each probe and loses after an
//!   interval plus the probe timeout without one; the other replicas skip
//!   their ticks meanwhile. A holder whose last three health probes all
//!   failed passes the turn on: the first other replica to ask takes it
//!   (one replica, never all, so a fleet does not multiply probes into a
//!   dead upstream), and if none asks within the hold, the turn is free
//!   again. A healthy answer ends the cluster's open period
//!   (as a new epoch, published), so every replica turns half-open within a
//!   round trip and real traffic confirms; the reopen backoff and the window
//!   stay as they were. A failed health probe tells the cluster nothing.
//!   When Redis does not answer, each replica probes on its own.
//! - **Quota gates** ([`quota_gate`](crate::Builder::quota_gate)) are
//!   shared as quota gates, with their reset: an account whose quota ran
//!   out on one replica is gated on every replica until the reset the
//!   answer announced (or the configured gate), with
//!   [`Reason::QuotaExhausted`](crate::Reason::QuotaExhausted), whatever
//!   the open duration, its backoff, the open cap or the quorum (an
//!   exhausted account is a fact, not one replica's view of the upstream).
//!   The cluster neither ends nor moves a replica's own gate, and a gate
//!   leaves the reopen backoff alone.
//! - A breaker in [metrics-only](Breaker::set_metrics_only) mode follows the
//!   cluster but never trips it, adds to its window or heals it.
//! - **Quorum** (off by default): with [`BackendBuilder::quorum`], the
//!   cluster opens only on failures seen by that many distinct replicas, so
//!   one replica with a broken path to the upstream opens only its own
//!   circuit. A replica is a [`Backend`]: every breaker attached to one
//!   backend (build one per process) counts once, under one id. When fewer
//!   replicas are alive than the quorum (by their heartbeats), the quorum
//!   falls to the number alive, so it can always be met.
//!
//! # Redis Cluster and TLS
//!
//! With the `redis-cluster` feature, [`Backend::cluster_builder`] takes the
//! nodes of a Redis Cluster. A breaker's keys share one hash tag, so its
//! script runs on its slot's master; transitions are published cluster-wide
//! and the subscription moves to another node when its node goes away. While
//! a master fails over, the attachment falls back to local state like for
//! any unreachable Redis, and returns to shared mode once the slot has a
//! master again (two to three seconds with a node timeout of one second).
//!
//! With the `redis-tls` feature, `rediss://` URLs work, over rustls with the
//! ring provider, verifying the server against the system's roots, or
//! against a CA of your own given with `Client::build_with_tls`. (If your
//! program also enables rustls's `aws-lc-rs` provider, install one as the
//! process default before attaching.)
//!
//! # Clocks
//!
//! The server's clock is trusted only within bounds. A deadline further out
//! than the open period it was set for means the server's clock went back:
//! the period ends then, and probes decide. Each replica also caps what the
//! cluster tells it by its own monotonic clock: no open period lasts longer
//! than the breaker's [longest open duration](crate::Builder::max_open_duration),
//! plus the [timeout](BackendBuilder::timeout) of one exchange, from the
//! moment the replica learned of it, and
//! a replica whose clock says the period is over tells the cluster, which
//! ends it. A server clock that jumps forward does not end a period early on
//! replicas that already know it: they keep their own deadline.
//! Replicas' heartbeats (which the [quorum](BackendBuilder::quorum) counts)
//! written before the server's clock stepped back count from the moment
//! the step is seen, so a replica that died meanwhile counts as alive for
//! one heartbeat lifetime (three resync intervals and a timeout), not for
//! the length of the step.
//!
//! # Schema versions and rolling upgrades
//!
//! What replicas share (key names, the script, the messages) carries a
//! version, [`SCHEMA`]. Replicas of different schemas keep separate state:
//! their keys differ, and each ignores the other's messages. They do not
//! split silently: every replica writes a heartbeat to `{p}:replicas`, a key
//! every schema from 2 on shares, and one that sees replicas of another
//! schema there, or their messages on the channel, or (for a single
//! breaker) the state key of schema 1, logs a warning once and lists the
//! schema in [`Attachment::other_schemas`]. During a rolling upgrade, the
//! old and the new replicas each share state among themselves until the
//! last old one is gone.
//!
//! Shared health probing came within schema 2, as an addition old replicas
//! can live with: a replica of an earlier release follows a heal (to it, the
//! open period simply ended) but neither shares its own heals nor takes
//! turns, so it probes on its own, as before.
//!
//! Shared quota gates came within schema 2 too: a replica of an earlier
//! release reads a gate as an ordinary open period, which its own open cap
//! may end early for every replica, and shares its own gates as plain trips
//! (the cluster's open duration), as before. Gates last their full reset
//! once every replica runs this release.
//!
//! # When Redis is down, slow or holds garbage
//!
//! Every breaker falls back to its local state (and its own half-open
//! decisions) the moment an exchange fails or takes longer than
//! [`BackendBuilder::timeout`]. No request fails because of Redis. The
//! attachment logs one warning, reconnects with backoff, and when Redis
//! answers again it resyncs and returns to shared mode. Lost shared state
//! (Redis restarted empty, or flushed) never changes a circuit: breakers
//! still open tell Redis that they are (the cluster opens again); a
//! half-open breaker finishes its cycle on its own probes, as without Redis,
//! and shares its verdict (a reopen opens the others); a state an operator
//! set cluster-wide stays on every replica that applied it. Values
//! in its keys that it cannot read (wrong types, non-numeric fields, unknown
//! states, absurd deadlines) are treated as absent, and overwritten by the
//! next transition.
//!
//! The background task runs user code too (the breakers' transition
//! listeners fire on the transitions it applies). If it ever dies early, a
//! panic included, its breakers fall back to local state at once, an error
//! is logged, and a fresh task starts after the reconnect backoff, resyncs
//! and returns to shared mode. None of this holds in a build with
//! `panic = "abort"`, where the first panic ends the process.
//!
//! # Running a fleet
//!
//! One [`Backend`] is one replica: build it once per process and attach
//! every breaker and keyed set to it, so a quorum counts processes. The
//! settings that matter as the fleet grows:
//!
//! - [`BackendBuilder::flush_interval`] (50 ms): how long a replica's
//!   closed-state counts wait before the cluster sums them, so the floor of
//!   a trip no replica makes alone. Local trips and heals do not wait for it
//!   (a single breaker and a keyed set both wake their task on the
//!   transition).
//! - [`BackendBuilder::resync_interval`] (1 s): how often a replica re-reads
//!   every breaker that is not closed or saw calls (in case a message was
//!   lost) and sends its heartbeat; a replica counts as alive for three
//!   intervals plus the timeout after its last one.
//! - [`BackendBuilder::quorum_fraction`] rather than
//!   [`quorum`](BackendBuilder::quorum) when the fleet autoscales: a share
//!   of the replicas alive, which [`Attachment::fleet`] shows.
//!
//! What it costs and how fast it is, measured with the `redis_fleet`
//! example (`cargo run --release --features redis --example redis_fleet --
//! REPLICAS 1000 ROUNDS`: every replica a backend of its own with a keyed
//! set of 1,000 keys, in one process on one local Redis; a trip, heal,
//! operator reset or replica restart every 250 ms; 20 calls per second per
//! replica; propagation from the deciding replica's transition to each
//! other replica's) on a 2-core machine that was running other builds:
//!
//! | replicas | trip p50 / p99 | heal p50 / p99 | operator reset p50 / p99 | Redis commands per replica | diverged |
//! |---|---|---|---|---|---|
//! | 10 | 3.7 / 89 ms | 1.7 / 8.5 ms | 4.9 / 96 ms | 643/s | 0 of 100 rounds |
//! | 50 | 30 / 95 ms | 11 / 44 ms | 81 / 291 ms | 386/s | 0 of 100 rounds |
//! | 200 | 211 / 561 ms | 82 / 375 ms | 783 / 1,618 ms | 156/s | 0 of 60 rounds |
//!
//! Redis memory was 140 to 242 bytes per breaker with shared state, and a
//! restarted replica knew every open key 72 to 1,025 ms (p50) after it
//! attached. The load a replica puts on Redis does not grow with the fleet
//! (it fell from 10 to 200 replicas, as messages arriving together share a
//! round trip). Latency does: with 200 replicas in one process the two cores
//! run every replica's exchanges and message handling, and each change
//! costs every replica one exchange; on hosts of their own each replica
//! does only its own share.
//!
//! When Redis is away, every breaker decides alone (see below); no call
//! waits on Redis, and the fleet converges again within a resync interval
//! of Redis answering.
//!
//! # Keys
//!
//! A breaker named `name` under prefix `p` uses `{p:name}:v2:state`,
//! `{p:name}:v2:win`, `{p:name}:v2:probes`, with a quorum
//! `{p:name}:v2:votes`, and with a health prober `{p:name}:v2:health` (the
//! replica holding the turn to probe; the hash tag keeps them all in one
//! Redis Cluster slot);
//! replicas write heartbeats to `{p}:replicas` (a random replica id, the
//! schema and a time), and transitions are published on `p:events` as
//! `v2 <state> <epoch> <name>`. Nothing else goes to Redis: no request data but
//! the breaker key itself, which for a credential is already a keyed hash
//! ([`Key::hashed`](crate::keyed::Key::hashed)). Replicas find one account's
//! breaker by that hash, so every replica must hash with the same
//! [`KeySecret`](crate::keyed::KeySecret); one with another secret keeps
//! breakers of its own for the same accounts.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower_circuit_breaker::redis::{Backend, Client};
//! use tower_circuit_breaker::{CircuitBreakerLayer, Outcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
//!     .prefix("checkout")
//!     .build()?;
//!
//! let layer = CircuitBreakerLayer::builder()
//!     .name("payments-api") // the name is the breaker's identity in Redis
//!     .count_window(20)
//!     .min_calls(10)
//!     .failure_rate(0.5)
//!     .build()?;
//! // Keep the attachment for as long as the breaker should share state.
//! let attachment = backend.attach(layer.breaker())?;
//!
//! // Requests never wait for Redis, whether it answers or not.
//! layer.breaker().admit().unwrap().record(Outcome::Success);
//! # attachment.detach().await;
//! # Ok(()) }
//! ```

mod builder;
mod conn;
mod control;
mod script;
mod supervise;
mod tracked;
mod turns;
mod worker;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::conn::Store;
use self::worker::{Target, Worker};
use crate::keyed::KeyedBreakers;
use crate::{Breaker, State};

pub use self::builder::BackendBuilder;
pub use self::control::{ControlError, Origin, SharedSnapshot};
pub use ::redis::Client;

/// The version of what replicas share in Redis: key names, the state script
/// and the transition messages. It changes only with a release that says
/// how to roll it out; replicas of two schemas keep apart and log it.
pub const SCHEMA: u32 = script::SCHEMA;

/// Who put each breaker in its state, as the sync task last applied it.
pub(crate) type Origins = Arc<Mutex<HashMap<Arc<str>, (State, Origin)>>>;

/// How many replicas must agree before a shared circuit opens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Quorum {
    /// At least this many, or every replica alive when fewer are.
    Replicas(u32),
    /// At least this share of the replicas alive, rounded up.
    Fraction(f64),
}

impl Quorum {
    /// The replicas that must agree when `alive` replicas are alive: never
    /// fewer than one, never more than are alive.
    pub(crate) fn needed(self, alive: u32) -> u32 {
        let n = match self {
            Quorum::Replicas(n) => n,
            Quorum::Fraction(f) => (f * f64::from(alive)).ceil() as u32,
        };
        n.min(alive).max(1)
    }
}

/// Where a backend's workers leave what their heartbeats learn.
#[derive(Debug, Default)]
pub(crate) struct FleetView {
    alive: AtomicU32,
    quorum: AtomicU32,
}

impl FleetView {
    pub(crate) fn set(&self, alive: u32, quorum: u32) {
        self.alive.store(alive, Ordering::Relaxed);
        self.quorum.store(quorum, Ordering::Relaxed);
    }
}

/// The fleet as one replica's last heartbeat saw it; see
/// [`Attachment::fleet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fleet {
    /// Replicas of this schema alive on the prefix (heartbeats within their
    /// TTL), this one included; 0 before the first heartbeat.
    pub alive: u32,
    /// Distinct replicas whose failures open a shared circuit now: the
    /// configured [`quorum`](BackendBuilder::quorum) or
    /// [`quorum_fraction`](BackendBuilder::quorum_fraction) of `alive`.
    pub quorum: u32,
}

/// Schemas other than [`SCHEMA`] seen on the prefix.
pub(crate) type Schemas = Arc<Mutex<BTreeSet<u32>>>;

/// Shares the state of breakers across replicas through one Redis server or
/// one Redis Cluster (feature `redis-cluster`).
///
/// Cheap to clone. See the [module docs](self).
///
/// ```
/// use tower_circuit_breaker::redis::{Backend, Client};
/// use tower_circuit_breaker::Breaker;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
///     .prefix("doc-backend")
///     .build()?;
/// // Every replica with this prefix and this name shares one circuit.
/// let breaker = Breaker::builder().name("gpt-4o").build()?;
/// let attachment = backend.attach(&breaker)?;
/// # attachment.detach().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Backend {
    settings: Arc<Settings>,
}

pub(crate) struct Settings {
    store: Store,
    prefix: Arc<str>,
    window: Option<(Duration, u32)>,
    flush: Duration,
    resync: Duration,
    timeout: Duration,
    backoff: (Duration, Duration),
    quorum: Quorum,
    /// The replicas alive and the quorum in force, as the last heartbeat
    /// found them.
    fleet: FleetView,
    /// This replica's id: in its heartbeats, quorum votes, probe leases and
    /// health-probe turns, shared by every attachment of the backend.
    replica: Arc<str>,
    /// Numbers the probe leases of every attachment of the backend.
    leases: AtomicU64,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("store", &self.store)
            .field("prefix", &self.prefix)
            .field("window", &self.window)
            .field("flush", &self.flush)
            .field("resync", &self.resync)
            .field("timeout", &self.timeout)
            .field("backoff", &self.backoff)
            .field("quorum", &self.quorum)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("settings", &self.settings)
            .finish()
    }
}

impl Backend {
    /// A builder for a backend on `client`'s server (`redis://`, or
    /// `rediss://` with the `redis-tls` feature).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("checkout")
    ///     .timeout(Duration::from_millis(200))
    ///     .build()?;
    /// # let _ = backend;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(client: Client) -> BackendBuilder {
        BackendBuilder::new(Ok(Store::Single(client)))
    }

    /// A builder for a backend on a Redis Cluster, reached through `nodes`
    /// (several, so that losing one does not lose the cluster).
    ///
    /// Each breaker's keys live in one slot and its script runs on that
    /// slot's master; transitions are published to the whole cluster, and
    /// the subscription moves to another of `nodes` when its node goes away.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// let nodes = ["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/", "redis://127.0.0.1:7002/"];
    /// let backend = Backend::cluster_builder(
    ///     nodes.iter().map(|url| Client::open(*url)).collect::<Result<Vec<_>, _>>()?,
    /// )
    /// .prefix("checkout")
    /// .build()?;
    /// # let _ = backend;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn cluster_builder(nodes: impl IntoIterator<Item = Client>) -> BackendBuilder {
        let nodes: Vec<Client> = nodes.into_iter().collect();
        let store = if nodes.is_empty() {
            Err("a cluster backend needs at least one node")
        } else {
            ::redis::cluster::ClusterClient::new(
                nodes.iter().map(|c| c.get_connection_info().clone()),
            )
            .map(|client| Store::Cluster { client, nodes })
            .map_err(|_| "the cluster nodes do not make a cluster client")
        };
        BackendBuilder::new(store)
    }

    /// Keeps `breaker` in step with the breakers of the same name on other
    /// replicas (for a layer: `backend.attach(layer.breaker())`).
    ///
    /// The breaker must have a [name](crate::Builder::name), and this must be
    /// called within a tokio runtime, which runs the background task.
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client, SetupError};
    /// use tower_circuit_breaker::{Breaker, CircuitBreakerLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("doc-attach")
    ///     .build()?;
    /// let layer = CircuitBreakerLayer::builder().name("chat").build()?;
    /// let attachment = backend.attach(layer.breaker())?;
    ///
    /// // A breaker without a name cannot be found on other replicas.
    /// let unnamed = Breaker::builder().build()?;
    /// assert_eq!(backend.attach(&unnamed).unwrap_err(), SetupError::Unnamed);
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub fn attach(&self, breaker: &Breaker) -> Result<Attachment, SetupError> {
        if breaker.name().is_none_or(str::is_empty) {
            return Err(SetupError::Unnamed);
        }
        self.spawn(Target::One(breaker.clone()))
    }

    /// Keeps every key of `breakers` in step with the same keys on other
    /// replicas, including keys opened elsewhere and not yet seen here (for a
    /// keyed layer: `backend.attach_keyed(layer.select().breakers())`).
    ///
    /// Must be called within a tokio runtime.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("doc-keyed")
    ///     .build()?;
    /// let layer = CircuitBreakerLayer::keyed(KeyedBreakers::builder().build()?, keyed::header("x-model"));
    /// let attachment = backend.attach_keyed(layer.select().breakers())?;
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub fn attach_keyed(&self, breakers: &KeyedBreakers) -> Result<Attachment, SetupError> {
        self.spawn(Target::Keyed(breakers.clone()))
    }

    fn spawn(&self, target: Target) -> Result<Attachment, SetupError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| SetupError::NoRuntime)?;
        let (stop, stopped) = watch::channel(());
        let shared = Arc::new(AtomicBool::new(false));
        let origins = Origins::default();
        let schemas = Schemas::default();
        let (settings, flag, rx, o, sc) = (
            self.settings.clone(),
            shared.clone(),
            stopped.clone(),
            origins.clone(),
            schemas.clone(),
        );
        // A fresh worker per run: one that died may have left its state
        // half-changed, and a new one resyncs everything from Redis.
        let start = move || {
            Worker::new(
                settings.clone(),
                target.clone(),
                flag.clone(),
                o.clone(),
                sc.clone(),
                rx.clone(),
            )
            .run()
        };
        let task = runtime.spawn(supervise::supervise(start, stopped, self.settings.backoff));
        Ok(Attachment {
            stop,
            task,
            shared,
            origins,
            schemas,
            settings: self.settings.clone(),
        })
    }
}

/// Keeps a breaker, or a keyed set, in step with the cluster while it is
/// held. Dropping it stops the background task and leaves every breaker to
/// its local state.
///
/// ```
/// use tower_circuit_breaker::redis::{Backend, Client};
/// use tower_circuit_breaker::Breaker;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
///     .prefix("doc-attachment")
///     .build()?;
/// let breaker = Breaker::builder().name("embed").build()?;
/// // Keep it for as long as the breaker should share state, e.g. in the app state.
/// let attachment = backend.attach(&breaker)?;
/// println!("{attachment:?}");
/// attachment.detach().await;
/// # Ok(()) }
/// ```
#[must_use = "the breaker stops sharing state when the attachment is dropped"]
pub struct Attachment {
    stop: watch::Sender<()>,
    task: JoinHandle<()>,
    shared: Arc<AtomicBool>,
    origins: Origins,
    schemas: Schemas,
    settings: Arc<Settings>,
}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

impl Attachment {
    /// Whether Redis answers and the breakers are in shared mode; `false`
    /// before the first exchange and while they fall back to local state.
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Nothing listens on port 1: the breaker keeps working on its own.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:1/")?).build()?;
    /// let breaker = Breaker::builder().name("embed").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// assert!(!attachment.is_shared());
    /// assert!(breaker.admit().is_ok());
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub fn is_shared(&self) -> bool {
        self.shared.load(Ordering::Acquire)
    }

    /// The shared-state schemas other than [`SCHEMA`] that replicas on this
    /// prefix were seen to use (by their heartbeats, their messages, or a
    /// single breaker's state key of the first schema), each also logged
    /// once as a warning. Replicas of two schemas do not share state: during
    /// a rolling upgrade this lists the old one until every replica runs the
    /// new one (and the old one's heartbeats expire).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("doc-schemas")
    ///     .build()?;
    /// let breaker = Breaker::builder().name("rerank").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// if !attachment.other_schemas().is_empty() {
    ///     eprintln!("a rollout is not finished: {:?}", attachment.other_schemas());
    /// }
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub fn other_schemas(&self) -> Vec<u32> {
        crate::sync::lock(&self.schemas).iter().copied().collect()
    }

    /// The replicas alive on the prefix and the quorum in force, as this
    /// replica's last heartbeat (every resync interval) found them.
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:1/")?)
    ///     .quorum_fraction(0.5)
    ///     .build()?;
    /// let breaker = Breaker::builder().name("chat").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// // Nothing answers on port 1: no heartbeat has counted anyone yet.
    /// assert_eq!(attachment.fleet().alive, 0);
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub fn fleet(&self) -> Fleet {
        let f = &self.settings.fleet;
        Fleet {
            alive: f.alive.load(Ordering::Relaxed),
            quorum: f.quorum.load(Ordering::Relaxed),
        }
    }

    /// Stops sharing and waits for the background task to end; the breakers
    /// are back in local mode when this returns.
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("doc-detach")
    ///     .build()?;
    /// let breaker = Breaker::builder().name("embed").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// attachment.detach().await;
    /// assert!(breaker.admit().is_ok(), "back on its own state");
    /// # Ok(()) }
    /// ```
    pub async fn detach(self) {
        let Attachment { stop, task, .. } = self;
        drop(stop);
        // The supervisor ends by returning (its runs' panics end at their own
        // handles), and a cancelled runtime has nothing left to wait for.
        let _ = task.await;
    }
}

/// A backend that could not be built or attached.
///
/// ```
/// use tower_circuit_breaker::redis::{Backend, Client, SetupError};
/// use tower_circuit_breaker::Breaker;
///
/// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?).build()?;
/// let breaker = Breaker::builder().name("embed").build()?;
/// // Outside a tokio runtime there is nothing to run the background task.
/// assert_eq!(backend.attach(&breaker).unwrap_err(), SetupError::NoRuntime);
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetupError {
    /// A breaker without a name cannot be found on other replicas.
    Unnamed,
    /// Attaching needs a tokio runtime to run the background task.
    NoRuntime,
    /// A setting is out of range.
    Invalid(&'static str),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Unnamed => f.write_str("a shared breaker needs a name"),
            SetupError::NoRuntime => f.write_str("attaching needs a tokio runtime"),
            SetupError::Invalid(why) => write!(f, "invalid redis backend setting: {why}"),
        }
    }
}

impl std::error::Error for SetupError {}
