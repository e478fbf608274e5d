//! Shared circuit state across replicas, through Redis.
//!
//! When a service runs on several replicas, each one learning on its own that
//! an upstream is down multiplies the damage by the number of replicas. A
//! [`Backend`] keeps the breakers of every replica in step: a trip on one
//! opens them all, outcomes are counted across replicas, a half-open
//! cycle admits `probes` calls in the whole cluster, not on each replica,
//! and a [spend guard](crate::spend) holds one budget for the fleet.
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
//!   healed), and Redis publishes every cluster transition with the state
//!   it led to, which the other replicas apply as the message arrives,
//!   without a round trip of their own;
//! - every resync interval (1 s) it reads the state of every breaker that
//!   is not closed or saw calls since the last resync, in case a message was
//!   lost, and otherwise pings Redis.
//!
//! A message touches only the breaker it names: those a replica cannot
//! apply as they are join one pipelined round trip of their keys' script
//! calls, and no other key of a keyed set is read or written. Two replicas on
//! loopback, each a keyed set with every key in use, one tripping keys at
//! once, timed from that replica's transition to the other's (`cargo run
//! --release --features redis --example redis_replicas -- keys`, three runs
//! on a shared 2-core machine, load average 2.4 to 4.1 when the last two
//! began):
//!
//! | keys | trips | p50 | max |
//! |---:|---:|---:|---:|
//! | 50 | 1 | 0; 0; 3 ms | 0; 0; 3 ms |
//! | 5,000 | 1 | 0; 0; 0 ms | 0; 0; 0 ms |
//! | 5,000 | 100 | 4; 6; 7 ms | 7; 10; 11 ms |
//! | 5,000 | 1,000 | 33; 45; 50 ms | 63; 89; 94 ms |
//! | 20,000 | 1 | 0; 0; 0 ms | 0; 0; 0 ms |
//! | 20,000 | 100 | 6; 8; 5 ms | 9; 12; 10 ms |
//! | 20,000 | 1,000 | 43; 55; 34 ms | 90; 104; 77 ms |
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
#![doc = include_str!("operating.md")]
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
mod messages;
mod quorum;
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
pub(crate) use self::quorum::Quorum;
pub use ::redis::Client;

/// The version of what replicas share in Redis: key names, the state script
/// and the transition messages. It changes only with a release that says
/// how to roll it out; replicas of two schemas keep apart and log it.
pub const SCHEMA: u32 = script::SCHEMA;

/// Who put each breaker in its state, as the sync task last applied it.
pub(crate) type Origins = Arc<Mutex<HashMap<Arc<str>, (State, Origin)>>>;

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
    #[must_use]
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
    /// # Errors
    ///
    /// A [`SetupError`]: the breaker has no name
    /// ([`SetupError::Unnamed`]) or there is no tokio runtime to run the
    /// background task on ([`SetupError::NoRuntime`]).
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
    /// # Errors
    ///
    /// A [`SetupError`]: the set has no name ([`SetupError::Unnamed`]) or
    /// there is no tokio runtime ([`SetupError::NoRuntime`]).
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
    #[must_use]
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
    #[must_use]
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
    #[must_use]
    pub fn fleet(&self) -> Fleet {
        let f = &self.settings.fleet;
        Fleet {
            alive: f.alive.load(Ordering::Relaxed),
            quorum: f.quorum.load(Ordering::Relaxed),
        }
    }

    /// What [`fleet`](Self::fleet) and [`is_shared`](Self::is_shared) read,
    /// for a status page to keep.
    #[cfg(feature = "status")]
    pub(crate) fn view(&self) -> impl Fn() -> (Fleet, bool) + Send + Sync + 'static {
        let (settings, shared) = (Arc::clone(&self.settings), Arc::clone(&self.shared));
        move || {
            let f = &settings.fleet;
            let fleet = Fleet {
                alive: f.alive.load(Ordering::Relaxed),
                quorum: f.quorum.load(Ordering::Relaxed),
            };
            (fleet, shared.load(Ordering::Acquire))
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
