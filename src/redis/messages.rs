//! The events channel: what is already here, the next message, a wake-up,
//! the schema of a message in another format, and the news of a spent
//! budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ::redis::{Msg, Value};
use futures_core::Stream;

use super::conn::{Conn, Failure, Messages};

/// Tells the other replicas that the fleet's spend of each breaker of
/// `spent` (its name and the epoch this replica knows) reached the
/// budget, as `v2 spent <epoch> <name>`, so they read it within a round
/// trip rather than at their next call.
pub(super) async fn announce_spent(
    conn: &mut Conn,
    channel: &str,
    spent: Vec<(Arc<str>, u64)>,
    limit: Duration,
) -> Result<(), Failure> {
    for (name, epoch) in spent {
        let message = format!("v2 spent {epoch} {name}");
        let mut cmd = ::redis::cmd("PUBLISH");
        cmd.arg(channel).arg(message);
        let _receivers: Value = conn.query(&cmd, limit).await?;
    }
    Ok(())
}

/// The schema of a message that is not of this one's format: `vN ...`, or
/// the first schema's `<state> <epoch> <key>`.
pub(super) fn schema_of(text: &str) -> Option<u32> {
    let mut parts = text.splitn(3, ' ');
    let first = parts.next()?;
    if let Some(n) = first.strip_prefix('v').and_then(|n| n.parse::<u32>().ok()) {
        return Some(n);
    }
    let epoch = parts.next()?.parse::<u64>().ok()?;
    let named = parts.next().is_some_and(|n| !n.is_empty());
    (matches!(first, "open" | "closed") && epoch > 0 && named).then_some(1)
}

/// The next message if one is already here: `None` if none is, and
/// `Some(None)` if the subscription ended (left to `next` to see).
pub(super) async fn ready(stream: &mut Messages) -> Option<Option<Msg>> {
    std::future::poll_fn(|cx| match stream.as_mut().poll_next(cx) {
        Poll::Ready(Some(msg)) => Poll::Ready(Some(Some(msg))),
        Poll::Ready(None) | Poll::Pending => Poll::Ready(None),
    })
    .await
}

pub(super) async fn next(stream: &mut Messages) -> Option<Msg> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

pub(super) async fn wait(changed: &mut Pin<Box<dyn Future<Output = ()> + Send>>) {
    changed.as_mut().await
}
