//! One replica probes for all: the turn to send a breaker's health probe is
//! a short-lived key in Redis, taken and renewed by the replica that probes.
//!
//! A prober asks its breaker's hook before each probe; the hook hands the ask
//! to the attachment's task, which sends every ask pending at that moment in
//! one round trip. Turns are taken only while the cluster holds the circuit
//! open: a replica open on its own (its trip short of a quorum) probes on its
//! own. Whenever Redis cannot answer in time (it is down, slow, or the
//! attachment is not sharing), the answer is "probe" too: each replica then
//! probes on its own, as it would without Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use tokio::sync::{mpsc, oneshot};

use super::conn::{Conn, Failure};
use super::script;
use crate::breaker::{Turn, Turns};

/// Asks waiting for the attachment's task; beyond that many, a prober does
/// not wait and probes on its own.
const QUEUE: usize = 1024;

/// Asks answered in one round trip at most.
const BATCH: usize = 256;

/// A prober's ask for the turn of one breaker.
pub(super) struct Ask {
    /// The breaker's name, and its turn's key.
    name: Arc<str>,
    key: Arc<str>,
    hold: Duration,
    reply: oneshot::Sender<bool>,
}

/// Where the breakers of one attachment's task send their asks.
pub(super) struct Desk {
    asks: mpsc::Sender<Ask>,
    shared: Arc<AtomicBool>,
    /// How long a prober waits for an answer before probing on its own.
    patience: Duration,
}

impl Desk {
    /// A desk, and the queue of asks its task answers.
    pub(super) fn new(shared: Arc<AtomicBool>, timeout: Duration) -> (Desk, mpsc::Receiver<Ask>) {
        let (asks, queue) = mpsc::channel(QUEUE);
        let desk = Desk {
            asks,
            shared,
            // The ask may wait behind one exchange, then takes one of its own.
            patience: timeout.saturating_mul(2),
        };
        (desk, queue)
    }

    /// The hook for the breaker `name`, whose turn lives at `key`.
    pub(super) fn hook(&self, name: &Arc<str>, key: &str) -> Arc<dyn Turns> {
        Arc::new(Hook {
            name: name.clone(),
            key: key.into(),
            asks: self.asks.clone(),
            shared: self.shared.clone(),
            patience: self.patience,
        })
    }
}

/// One breaker's hook: asks the attachment's task.
struct Hook {
    name: Arc<str>,
    key: Arc<str>,
    asks: mpsc::Sender<Ask>,
    shared: Arc<AtomicBool>,
    patience: Duration,
}

impl Turns for Hook {
    fn take(&self, hold: Duration) -> Turn {
        if !self.shared.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(true));
        }
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            name: self.name.clone(),
            key: self.key.clone(),
            hold,
            reply,
        };
        if self.asks.try_send(ask).is_err() {
            // The task is gone, or far behind: probe on our own.
            return Box::pin(std::future::ready(true));
        }
        let patience = self.patience;
        Box::pin(async move {
            // No answer (Redis failed it, or took too long): probe.
            tokio::time::timeout(patience, answer)
                .await
                .map_or(true, |a| a.unwrap_or(true))
        })
    }
}

/// Answers `first` and every other ask already waiting in `queue`, in one
/// round trip; `status` says, for a breaker the cluster holds open, whether
/// this replica passes its turn on (`None`: not held open, probe alone). On
/// a failure the asks are dropped unanswered, which their probers take as
/// "probe".
pub(super) async fn answer(
    conn: &mut Conn,
    replica: &str,
    first: Ask,
    queue: &mut mpsc::Receiver<Ask>,
    mut status: impl FnMut(&str) -> Option<bool>,
    limit: Duration,
) -> Result<(), Failure> {
    // In the order of the asks that go to Redis.
    let mut passes = Vec::new();
    let asks = for_redis(first, queue, |name| {
        status(name).map(|pass| passes.push(pass)).is_some()
    });
    if asks.is_empty() {
        return Ok(());
    }
    let calls: Vec<_> = asks
        .iter()
        .zip(&passes)
        .map(|(a, &pass)| script::turn(&a.key, replica, a.hold, pass))
        .collect();
    let values = conn.invoke(&calls, limit).await?;
    if values.len() != asks.len() {
        return Err(Failure::Reply);
    }
    for (ask, value) in asks.into_iter().zip(&values) {
        let _ = ask.reply.send(mine(value));
    }
    Ok(())
}

/// Takes `first` and the asks waiting behind it, answers those that need no
/// turn (the cluster does not hold their circuit open: this replica probes
/// on its own) and drops those whose prober gave up; the rest go to Redis.
fn for_redis(
    first: Ask,
    queue: &mut mpsc::Receiver<Ask>,
    mut held_open: impl FnMut(&str) -> bool,
) -> Vec<Ask> {
    let mut asks = vec![first];
    while asks.len() < BATCH {
        match queue.try_recv() {
            Ok(ask) => asks.push(ask),
            Err(_) => break,
        }
    }
    asks.retain(|a| !a.reply.is_closed());
    let (shared, alone): (Vec<Ask>, Vec<Ask>) = asks.into_iter().partition(|a| held_open(&a.name));
    for ask in alone {
        let _ = ask.reply.send(true);
    }
    shared
}

/// Whether the script's answer leaves the turn to this replica: anything but
/// a plain "another replica holds it" does.
fn mine(value: &Value) -> bool {
    !matches!(value, Value::Int(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hook_probes_on_its_own_when_not_sharing_or_unanswered() {
        let shared = Arc::new(AtomicBool::new(false));
        let (desk, mut queue) = Desk::new(shared.clone(), Duration::from_millis(500));
        let hook = desk.hook(&"b".into(), "{p:b}:v2:health");
        let hold = Duration::from_secs(1);
        // Not sharing: no ask, our turn.
        assert!(hook.take(hold).await);
        assert!(queue.try_recv().is_err());

        shared.store(true, Ordering::Release);
        // An ask nobody answers: our turn after the patience (1 s).
        let start = tokio::time::Instant::now();
        assert!(hook.take(hold).await);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        let ask = queue.try_recv().expect("the ask was queued");
        assert_eq!(&*ask.key, "{p:b}:v2:health");
        assert_eq!(ask.hold, hold);

        // An ask dropped unanswered (Redis failed): our turn, at once.
        let turn = hook.take(hold);
        drop(queue.try_recv().unwrap());
        assert!(turn.await);

        // Answered: whatever the answer says.
        let turn = hook.take(hold);
        queue.try_recv().unwrap().reply.send(false).unwrap();
        assert!(!turn.await);

        // The task is gone: our turn, without waiting.
        drop(queue);
        let start = tokio::time::Instant::now();
        assert!(hook.take(hold).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn only_circuits_the_cluster_holds_open_take_turns() {
        let shared = Arc::new(AtomicBool::new(true));
        let (desk, mut queue) = Desk::new(shared, Duration::from_millis(500));
        let hold = Duration::from_secs(1);
        let names: Vec<Arc<str>> = ["held", "alone", "gave-up", "held-too"]
            .into_iter()
            .map(Arc::from)
            .collect();
        let mut turns: Vec<_> = names
            .iter()
            .map(|n| desk.hook(n, &format!("{{p:{n}}}:v2:health")).take(hold))
            .collect();
        drop(turns.remove(2)); // its prober stopped waiting
        let first = queue.try_recv().unwrap();
        let sent = for_redis(first, &mut queue, |name| name.starts_with("held"));
        let sent: Vec<&str> = sent.iter().map(|a| &*a.name).collect();
        assert_eq!(sent, ["held", "held-too"]);
        // "alone" was answered at once: probe on its own.
        assert!(turns.remove(1).await);
    }

    #[test]
    fn only_a_plain_no_keeps_a_replica_from_probing() {
        assert!(!mine(&Value::Int(0)));
        assert!(mine(&Value::Int(1)));
        assert!(mine(&Value::Nil));
        assert!(mine(&Value::Okay));
    }
}
