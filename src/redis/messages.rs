//! The events channel: what a message says, what is already here, the next
//! message, a wake-up, the schema of a message in another format, and the
//! news of a spent budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ::redis::{Msg, Value};
use futures_core::Stream;

use super::conn::{Conn, Failure, Messages};
use super::script::{Cluster, Reply, MAX_MS};

/// The longest breaker key a message may name.
pub(super) const MAX_KEY_LEN: usize = 1024;

/// A message on the events channel, as this replica reads it.
#[derive(Debug, Clone)]
pub(super) enum Message<'a> {
    /// A transition with the state it led to, which a replica that knows
    /// the breaker's previous epoch applies as is: `v2 <state>/<ms
    /// left>/<flags> <epoch> <name>`.
    State { name: &'a str, reply: Reply },
    /// A transition that names the breaker only (`v2 <state> <epoch>
    /// <name>`, as earlier releases send them, or a state word or flag of a
    /// later one): the breaker's state is read back.
    Named {
        name: &'a str,
        epoch: u64,
        closed: bool,
    },
    /// The fleet's spend of the breaker reached its budget.
    Spent { name: &'a str },
    /// A message of another schema.
    Other(u32),
    /// Not ours, or malformed: nothing to do.
    Ignored,
}

/// Reads one message; never fails: anything it cannot read is
/// [`Message::Ignored`].
pub(super) fn parse(text: &str) -> Message<'_> {
    let Some(rest) = text.strip_prefix("v2 ") else {
        return schema_of(text).map_or(Message::Ignored, Message::Other);
    };
    let mut parts = rest.splitn(3, ' ');
    let (Some(state), Some(epoch), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return Message::Ignored;
    };
    let Ok(epoch) = epoch.parse::<u64>() else {
        return Message::Ignored;
    };
    if name.is_empty() || name.len() > MAX_KEY_LEN {
        return Message::Ignored;
    }
    if state == "spent" {
        return Message::Spent { name };
    }
    let named = |word: &str| Message::Named {
        name,
        epoch,
        closed: word == "closed",
    };
    let Some((word, carried)) = state.split_once('/') else {
        return named(state);
    };
    match carried_state(word, carried) {
        Carried::Known(_, _, _) if epoch == 0 => Message::Ignored,
        Carried::Known(cluster, reset, gated) => Message::State {
            name,
            reply: Reply {
                cluster,
                epoch,
                granted: false,
                reset,
                gated,
                window: None,
                spend: None,
            },
        },
        Carried::Later => named(word),
        Carried::Malformed => Message::Ignored,
    }
}

/// The state a message carries after its state word.
enum Carried {
    /// The cluster state, whether an operator reset it, whether it is a
    /// quota gate.
    Known(Cluster, bool, bool),
    /// A state word, flag or field this release does not know.
    Later,
    Malformed,
}

/// Reads `<ms left>/<flags>` after the state word `word`.
fn carried_state(word: &str, carried: &str) -> Carried {
    let Some((left, flags)) = carried.split_once('/') else {
        return Carried::Malformed;
    };
    let Some(left) = left
        .parse::<u64>()
        .ok()
        .filter(|&ms| ms <= MAX_MS && !left.starts_with('+'))
    else {
        return Carried::Malformed;
    };
    if flags.is_empty() {
        return Carried::Malformed;
    }
    if flags.contains('/') || !flags.bytes().all(|b| matches!(b, b'-' | b'r' | b'g')) {
        return Carried::Later;
    }
    let (reset, gated) = (flags.contains('r'), flags.contains('g'));
    if flags.contains('-') && flags != "-" {
        return Carried::Malformed;
    }
    let cluster = match word {
        "open" if left == 0 => Cluster::HalfOpen,
        "open" => Cluster::Open(Duration::from_millis(left)),
        "closed" if left == 0 && !gated => return Carried::Known(Cluster::Closed, reset, false),
        "forced" if left == 0 => Cluster::ForcedOpen,
        "disabled" if left == 0 => Cluster::Disabled,
        "closed" | "forced" | "disabled" => return Carried::Malformed,
        _ => return Carried::Later,
    };
    if reset || (gated && !matches!(cluster, Cluster::Open(_) | Cluster::HalfOpen)) {
        return Carried::Malformed;
    }
    Carried::Known(cluster, false, gated)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn state(text: &str) -> Option<(Cluster, u64, bool, bool)> {
        match parse(text) {
            Message::State { name: "m", reply } => {
                Some((reply.cluster, reply.epoch, reply.reset, reply.gated))
            }
            _ => None,
        }
    }

    fn named(text: &str) -> Option<(u64, bool)> {
        match parse(text) {
            Message::Named {
                name: "m",
                epoch,
                closed,
            } => Some((epoch, closed)),
            _ => None,
        }
    }

    #[test]
    fn a_transition_carries_its_state() {
        let open = Cluster::Open(Duration::from_millis(30_000));
        assert_eq!(state("v2 open/30000/- 7 m"), Some((open, 7, false, false)));
        assert_eq!(state("v2 open/30000/g 7 m"), Some((open, 7, false, true)));
        assert_eq!(
            state("v2 open/0/- 8 m"),
            Some((Cluster::HalfOpen, 8, false, false))
        );
        assert_eq!(
            state("v2 closed/0/r 9 m"),
            Some((Cluster::Closed, 9, true, false))
        );
        assert_eq!(
            state("v2 forced/0/- 9 m"),
            Some((Cluster::ForcedOpen, 9, false, false))
        );
        assert_eq!(
            state("v2 disabled/0/- 9 m"),
            Some((Cluster::Disabled, 9, false, false))
        );
        // A key may hold spaces and slashes.
        assert!(matches!(
            parse("v2 open/1/- 7 a b/c"),
            Message::State { name: "a b/c", .. }
        ));
    }

    #[test]
    fn an_earlier_or_later_format_names_the_breaker() {
        assert_eq!(named("v2 open 7 m"), Some((7, false)));
        assert_eq!(named("v2 closed 7 m"), Some((7, true)));
        assert_eq!(named("v2 closed/0/rx 7 m"), Some((7, true)));
        assert_eq!(named("v2 open/5/-/more 7 m"), Some((7, false)));
        assert_eq!(named("v2 resting/5/- 7 m"), Some((7, false)));
        assert!(matches!(
            parse("v2 spent 7 m"),
            Message::Spent { name: "m" }
        ));
        assert!(matches!(parse("v3 open/1/- 7 m"), Message::Other(3)));
        assert!(matches!(parse("open 7 m"), Message::Other(1)));
    }

    #[test]
    fn a_malformed_message_is_ignored() {
        for text in [
            "v2 open/x/- 7 m",
            "v2 open/+1/- 7 m",
            "v2 open/10000000001/- 7 m",
            "v2 open/1/ 7 m",
            "v2 open/1 7 m",
            "v2 open/1/r 7 m",
            "v2 open/1/-r 7 m",
            "v2 closed/1/- 7 m",
            "v2 forced/0/g 7 m",
            "v2 open/1/- 0 m",
            "v2 open/1/- -7 m",
            "v2 open/1/- 7 ",
            "v2 open/1/- 7",
            "v2 ",
            "",
        ] {
            assert!(matches!(parse(text), Message::Ignored), "{text:?}");
        }
        let long = format!("v2 open/1/- 7 {}", "k".repeat(MAX_KEY_LEN + 1));
        assert!(matches!(parse(&long), Message::Ignored));
    }
}
