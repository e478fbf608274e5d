//! Connections to one Redis server or to a Redis Cluster, behind one face:
//! script calls, a ping, and a subscription that survives losing a node.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
#[cfg(feature = "redis-cluster")]
use std::task::Poll;
use std::time::Duration;

use ::redis::aio::{MultiplexedConnection, PubSubStream};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, FromRedisValue, RedisError, ScriptInvocation, Value,
};
use tokio::time::timeout;

use super::script;

/// Why a session with Redis ended.
#[derive(Debug)]
pub(super) enum Failure {
    Redis(RedisError),
    Timeout,
    SubscriptionClosed,
    Reply,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Redis(e) => fmt::Display::fmt(e, f),
            Failure::Timeout => f.write_str("timed out"),
            Failure::SubscriptionClosed => f.write_str("subscription connection closed"),
            Failure::Reply => f.write_str("unexpected reply from the state script"),
        }
    }
}

impl From<RedisError> for Failure {
    fn from(e: RedisError) -> Self {
        Failure::Redis(e)
    }
}

/// Runs `fut` with the backend's timeout.
pub(super) async fn bounded<T, E: Into<Failure>>(
    limit: Duration,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, Failure> {
    match timeout(limit, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(Failure::Timeout),
    }
}

/// Where the shared state lives.
// One per backend, behind its `Arc`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Store {
    Single(Client),
    #[cfg(feature = "redis-cluster")]
    Cluster {
        client: ::redis::cluster::ClusterClient,
        /// The nodes given, for the subscription (a cluster delivers every
        /// message to every node's subscribers).
        nodes: Vec<Client>,
    },
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Store::Single(_) => f.write_str("Single"),
            #[cfg(feature = "redis-cluster")]
            Store::Cluster { nodes, .. } => write!(f, "Cluster({} nodes)", nodes.len()),
        }
    }
}

/// A subscription to the transition channel.
pub(super) type Messages = Pin<Box<PubSubStream>>;

impl Store {
    /// A connection for script calls.
    pub(super) async fn connect(&self, limit: Duration) -> Result<Conn, Failure> {
        match self {
            Store::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(limit))
                    .set_response_timeout(Some(limit));
                let conn = bounded(
                    limit,
                    client.get_multiplexed_async_connection_with_config(&config),
                )
                .await?;
                Ok(Conn::Single(conn))
            }
            #[cfg(feature = "redis-cluster")]
            Store::Cluster { client, .. } => {
                let conn = bounded(limit, client.get_async_connection()).await?;
                Ok(Conn::Cluster(conn))
            }
        }
    }

    /// Subscribes to `channel` on the first node that answers, trying them
    /// in turn from `*next`, which is left at the node after the one used.
    pub(super) async fn subscribe(
        &self,
        channel: &str,
        limit: Duration,
        next: &mut usize,
    ) -> Result<Messages, Failure> {
        let nodes: &[Client] = match self {
            Store::Single(client) => std::slice::from_ref(client),
            #[cfg(feature = "redis-cluster")]
            Store::Cluster { nodes, .. } => nodes,
        };
        let mut last = Failure::SubscriptionClosed;
        for _ in 0..nodes.len() {
            let client = &nodes[*next % nodes.len()];
            *next = next.wrapping_add(1);
            let attempt = async {
                let mut pubsub = bounded(limit, client.get_async_pubsub()).await?;
                bounded(limit, pubsub.subscribe(channel)).await?;
                Ok::<_, Failure>(Box::pin(pubsub.into_on_message()))
            };
            match attempt.await {
                Ok(messages) => return Ok(messages),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether a lost subscription may be taken up on another node without
    /// ending the session.
    pub(super) fn is_cluster(&self) -> bool {
        !matches!(self, Store::Single(_))
    }
}

/// A connection for script calls.
pub(super) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(::redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// Loads the scripts (on every master of a cluster).
    pub(super) async fn load(&mut self, limit: Duration) -> Result<(), Failure> {
        match self {
            Conn::Single(c) => {
                bounded(limit, script::SYNC.load_async(c)).await?;
                bounded(limit, script::HEARTBEAT.load_async(c)).await?;
                bounded(limit, script::TURN.load_async(c)).await?;
            }
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => {
                bounded(limit, script::SYNC.load_async(c)).await?;
                bounded(limit, script::HEARTBEAT.load_async(c)).await?;
                bounded(limit, script::TURN.load_async(c)).await?;
            }
        }
        Ok(())
    }

    /// One command.
    pub(super) async fn query<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        limit: Duration,
    ) -> Result<T, Failure> {
        match self {
            Conn::Single(c) => bounded(limit, cmd.query_async(c)).await,
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => bounded(limit, cmd.query_async(c)).await,
        }
    }

    /// Script calls, their replies in order, within `limit` in all.
    ///
    /// On one server they go as one pipeline. On a cluster each call goes to
    /// its key's slot on its own (a pipeline may not span slots), all at
    /// once over the cluster connection, and a master that lost the script
    /// (a replica promoted since) is given it again.
    pub(super) async fn invoke(
        &mut self,
        calls: &[ScriptInvocation<'static>],
        limit: Duration,
    ) -> Result<Vec<Value>, Failure> {
        match self {
            Conn::Single(c) => {
                let mut pipe = ::redis::pipe();
                for inv in calls {
                    pipe.invoke_script(inv);
                }
                bounded(limit, pipe.query_async(c)).await
            }
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => {
                let calls = calls.iter().map(|inv| {
                    let mut c = c.clone();
                    async move { inv.invoke_async::<Value>(&mut c).await }
                });
                let replies = bounded(limit, async {
                    join_all(calls.collect())
                        .await
                        .into_iter()
                        .collect::<Result<Vec<Value>, RedisError>>()
                })
                .await?;
                Ok(replies)
            }
        }
    }
}

/// Runs every future to completion, concurrently, and gives their outputs in
/// order.
#[cfg(feature = "redis-cluster")]
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
