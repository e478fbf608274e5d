//! Operator controls for every replica at once, and where a replica's state
//! came from.

use std::fmt;

use super::conn::Failure;
use super::script::{self, Caller, Control, Keys, Reply, Request, Rule};
use super::Attachment;
use crate::breaker::{SharedRules, Snapshot};
use crate::sync::lock;
use crate::Breaker;

/// The longest breaker name a control may carry (as messages may).
const MAX_NAME_LEN: usize = 1024;

/// Who put a breaker in the state it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// This replica: its own rules, its own operator, its own clock, or its
    /// own half-open decisions while Redis is away.
    Local,
    /// The cluster: another replica's trip, the cluster window, or a
    /// half-open cycle the cluster decided.
    Cluster,
    /// An operator, for every replica: [`Attachment::force_open_cluster`]
    /// or [`Attachment::disable_cluster`].
    ClusterControl,
}

/// A breaker's [`Snapshot`] and where its state came from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SharedSnapshot {
    /// The breaker's own snapshot.
    pub snapshot: Snapshot,
    /// Who put the breaker in [`snapshot.state`](Snapshot::state).
    pub origin: Origin,
}

/// A cluster-wide control that Redis did not confirm; no replica's state
/// changed because of it.
#[derive(Debug)]
pub struct ControlError {
    why: String,
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cluster control not applied: {}", self.why)
    }
}

impl std::error::Error for ControlError {}

impl From<Failure> for ControlError {
    fn from(e: Failure) -> Self {
        ControlError { why: e.to_string() }
    }
}

// === impl Attachment ===

impl Attachment {
    /// Forces the breaker `name` open on every replica, this one included,
    /// until [`reset_cluster`](Self::reset_cluster): replicas apply it
    /// as the message arrives, replicas that were away when they
    /// come back. It survives restarts of the replicas, not a Redis that
    /// loses its data.
    ///
    /// A replica may still override it locally ([`Breaker::reset`],
    /// [`Breaker::disable`]); the next cluster-wide control applies again.
    ///
    /// # Example
    ///
    /// # Errors
    ///
    /// A [`ControlError`] when Redis could not be reached or did not apply
    /// the change; no replica has then been told.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::redis::{Backend, Client, Origin};
    /// use tower_circuit_breaker::{Breaker, State};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("doc-control")
    ///     .build()?;
    /// let breaker = Breaker::builder().name("payments-api").build()?;
    /// let attachment = backend.attach(&breaker)?;
    ///
    /// attachment.force_open_cluster("payments-api").await?;
    /// // Every replica follows, this one too.
    /// # tokio::time::timeout(Duration::from_secs(5), async {
    /// while breaker.state() != State::ForcedOpen {
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    /// }
    /// # }).await?;
    /// assert_eq!(attachment.snapshot(&breaker).origin, Origin::ClusterControl);
    ///
    /// attachment.reset_cluster("payments-api").await?;
    /// # tokio::time::timeout(Duration::from_secs(5), async {
    /// while breaker.state() != State::Closed {
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    /// }
    /// # }).await?;
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub async fn force_open_cluster(&self, name: &str) -> Result<(), ControlError> {
        self.control(name, Control::ForceOpen).await
    }

    /// Disables the breaker `name` on every replica (it admits every call
    /// and records nothing) until [`reset_cluster`](Self::reset_cluster).
    /// Propagates like [`force_open_cluster`](Self::force_open_cluster).
    ///
    /// # Example
    ///
    /// # Errors
    ///
    /// A [`ControlError`] when Redis could not be reached or did not apply
    /// the change; no replica has then been told.
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("doc-disable")
    ///     .build()?;
    /// let breaker = Breaker::builder().name("search-api").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// attachment.disable_cluster("search-api").await?;
    /// attachment.reset_cluster("search-api").await?;
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub async fn disable_cluster(&self, name: &str) -> Result<(), ControlError> {
        self.control(name, Control::Disable).await
    }

    /// Closes the breaker `name` on every replica, whatever its state there,
    /// and lifts a cluster-wide forced open or disable: each replica
    /// [resets](Breaker::reset) it once.
    ///
    /// # Example
    ///
    /// # Errors
    ///
    /// A [`ControlError`] when Redis could not be reached or did not apply
    /// the change; no replica has then been told.
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("doc-reset")
    ///     .build()?;
    /// let breaker = Breaker::builder().name("chat-api").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// attachment.reset_cluster("chat-api").await?;
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    pub async fn reset_cluster(&self, name: &str) -> Result<(), ControlError> {
        self.control(name, Control::Reset).await
    }

    /// `breaker`'s snapshot, and whether its state came from this replica,
    /// from the cluster, or from a cluster-wide control.
    ///
    /// The origin is [`Origin::Local`] unless the sync task put the breaker
    /// in the state it is in now and it has not moved since (a cluster-wide
    /// forced open stays [`Origin::ClusterControl`] for as long as it lasts;
    /// a circuit the cluster opened turns `Local` when this replica's clock
    /// moves it to half-open).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client, Origin};
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?).build()?;
    /// let breaker = Breaker::builder().name("embeddings").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// let shared = attachment.snapshot(&breaker);
    /// assert_eq!(shared.origin, Origin::Local);
    /// println!("{:?} ({:?})", shared.snapshot.state, shared.origin);
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn snapshot(&self, breaker: &Breaker) -> SharedSnapshot {
        let snapshot = breaker.snapshot();
        let origin = breaker
            .name()
            .and_then(|name| lock(&self.origins).get(name).copied())
            .filter(|&(state, _)| state == snapshot.state)
            .map_or(Origin::Local, |(_, origin)| origin);
        SharedSnapshot { snapshot, origin }
    }

    async fn control(&self, name: &str, control: Control) -> Result<(), ControlError> {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(ControlError {
                why: "a breaker name of 1 to 1024 bytes is needed".into(),
            });
        }
        let settings = &self.settings;
        let limit = settings.timeout;
        let mut conn = settings.store.connect(limit).await?;
        conn.load(limit).await?;
        let channel = format!("{}:events", settings.prefix);
        let caller = Caller {
            channel: &channel,
            replica: "",
            quorum: 1,
        };
        let keys = Keys::new(&settings.prefix, name);
        let rule = Rule::new(&SharedRules::default(), settings.window);
        let req = Request {
            control: Some(control),
            ..Request::default()
        };
        let inv = script::invocation(&caller, name, &keys, &rule, 0.0, &req);
        let values = conn.invoke(std::slice::from_ref(&inv), limit).await?;
        values
            .first()
            .and_then(Reply::parse)
            .ok_or(Failure::Reply)?;
        Ok(())
    }
}
