//! The Lua scripts every exchange with Redis goes through, their arguments
//! and their replies.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::{Script, ScriptInvocation, Value};

use crate::breaker::SharedRules;

/// Source of the state script; see the comments at its top for its contract.
const SOURCE: &str = include_str!("sync.lua");

/// Source of the heartbeat script.
const HEARTBEAT_SOURCE: &str = include_str!("heartbeat.lua");

/// Source of the script handing out the turn to send a health probe.
const TURN_SOURCE: &str = include_str!("turn.lua");

pub(super) static SYNC: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

pub(super) static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| Script::new(HEARTBEAT_SOURCE));

pub(super) static TURN: LazyLock<Script> = LazyLock::new(|| Script::new(TURN_SOURCE));

/// The cluster-wide rules of one breaker, taken from its configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rule {
    span_ms: u64,
    buckets: u32,
    min_calls: u32,
    failure_rate: f64,
    slow_rate: f64,
    open_ms: u64,
    open_max_ms: u64,
    multiplier: f64,
    jitter: f64,
    pub(super) probes: u32,
    close_after: u32,
    pub(super) lease: Duration,
    /// The longest open period the cluster may set.
    pub(super) open_max: Duration,
}

impl Rule {
    /// The breaker's own rules over a time window in Redis: the breaker's
    /// time window when it has one, else `window`.
    pub(super) fn new(rules: &SharedRules, window: Option<(Duration, u32)>) -> Rule {
        let (span, buckets) = match (window, rules.time_window) {
            (Some(w), _) => w,
            (None, Some((span, buckets))) => (span, buckets.min(1000)),
            (None, None) => (Duration::from_secs(10), 10),
        };
        Rule {
            span_ms: ms(span).max(1),
            buckets: buckets.max(1),
            min_calls: rules.min_calls,
            failure_rate: rules.failure_rate.unwrap_or(0.0),
            slow_rate: rules.slow_call_rate.unwrap_or(0.0),
            open_ms: ms(rules.open).max(1),
            open_max_ms: ms(rules.open_max).max(1),
            multiplier: rules.backoff_multiplier,
            jitter: rules.jitter,
            probes: rules.probes,
            close_after: rules.close_after,
            // What the cluster will hold a slot for, so the replica stops
            // using it no later.
            lease: rules.lease.min(Duration::from_millis(MAX_MS)),
            open_max: rules.open_max.min(Duration::from_millis(MAX_MS)),
        }
    }

    /// Whether outcomes are worth aggregating at all.
    pub(super) fn aggregates(&self) -> bool {
        self.failure_rate > 0.0 || self.slow_rate > 0.0
    }
}

/// An operator's decision for every replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Control {
    ForceOpen,
    Disable,
    Reset,
}

impl Control {
    fn as_arg(self) -> &'static str {
        match self {
            Control::ForceOpen => "force",
            Control::Disable => "disable",
            Control::Reset => "reset",
        }
    }
}

/// What a replica tells the cluster about one breaker.
#[derive(Debug, Default)]
pub(super) struct Request {
    /// The epoch the probe reports belong to.
    pub(super) epoch: u64,
    pub(super) trip: bool,
    pub(super) calls: u64,
    pub(super) failures: u64,
    pub(super) slow: u64,
    /// An operator's control to apply for every replica.
    pub(super) control: Option<Control>,
    /// This replica's clock says the open period outlasted the open cap.
    pub(super) overdue: bool,
    /// A probe lease id to claim.
    pub(super) claim: Option<String>,
    /// A health probe found the upstream answering in the open period of
    /// `epoch`: the cluster ends it.
    pub(super) heal: bool,
    /// With `trip`: the trip is a quota gate, open for this long (its
    /// reset), whatever the open duration, backoff or quorum.
    pub(super) gate: Option<Duration>,
    /// Probe lease ids with `s` (succeeded), `f` (failed) or `r` (unused).
    pub(super) reports: Vec<(String, &'static str)>,
}

impl Request {
    /// Whether this request only reads.
    pub(super) fn is_read(&self) -> bool {
        !self.trip
            && self.calls == 0
            && self.claim.is_none()
            && self.reports.is_empty()
            && self.control.is_none()
            && !self.overdue
            && !self.heal
    }
}

/// The version of the keys, the state script and the messages. Replicas of
/// different schemas keep apart (their keys differ) and tell each other
/// apart (see the module docs).
pub(super) const SCHEMA: u32 = 2;

/// Keys of one breaker.
pub(super) struct Keys {
    pub(super) state: String,
    pub(super) window: String,
    pub(super) probes: String,
    pub(super) votes: String,
    /// Whose turn it is to send the health probe.
    pub(super) health: String,
}

impl Keys {
    /// `{prefix:name}:v2:state` and so on: the hash tag keeps one breaker's
    /// keys in one Redis Cluster slot, so one script may touch them all.
    pub(super) fn new(prefix: &str, name: &str) -> Keys {
        let v = SCHEMA;
        Keys {
            state: format!("{{{prefix}:{name}}}:v{v}:state"),
            window: format!("{{{prefix}:{name}}}:v{v}:win"),
            probes: format!("{{{prefix}:{name}}}:v{v}:probes"),
            votes: format!("{{{prefix}:{name}}}:v{v}:votes"),
            health: format!("{{{prefix}:{name}}}:v{v}:health"),
        }
    }

    /// The state key of the first schema (0.1), which had no version.
    pub(super) fn unversioned_state(prefix: &str, name: &str) -> String {
        format!("{{{prefix}:{name}}}:state")
    }
}

/// The key every replica of every schema from 2 on writes its heartbeat to.
pub(super) fn replicas_key(prefix: &str) -> String {
    format!("{{{prefix}}}:replicas")
}

/// Who calls, and with what quorum.
pub(super) struct Caller<'a> {
    pub(super) channel: &'a str,
    pub(super) replica: &'a str,
    pub(super) quorum: u32,
}

/// One call of the state script.
pub(super) fn invocation(
    caller: &Caller<'_>,
    name: &str,
    keys: &Keys,
    rule: &Rule,
    jitter_unit: f64,
    req: &Request,
) -> ScriptInvocation<'static> {
    let mut inv = SYNC.prepare_invoke();
    inv.key(&keys.state)
        .key(&keys.window)
        .key(&keys.probes)
        .key(&keys.votes)
        .arg(caller.channel)
        .arg(name)
        .arg(req.epoch)
        .arg(u8::from(req.trip))
        .arg(req.calls)
        .arg(req.failures)
        .arg(req.slow)
        .arg(rule.span_ms)
        .arg(rule.buckets)
        .arg(rule.min_calls)
        .arg(rule.failure_rate)
        .arg(rule.slow_rate)
        .arg(rule.open_ms)
        .arg(rule.open_max_ms)
        .arg(rule.multiplier)
        .arg(rule.jitter * jitter_unit)
        .arg(rule.probes)
        .arg(rule.close_after)
        .arg(lease_ms(rule))
        .arg(caller.replica)
        .arg(caller.quorum.max(1))
        .arg(req.control.map_or("", Control::as_arg))
        .arg(u8::from(req.overdue))
        .arg(req.claim.as_deref().unwrap_or(""))
        .arg(u8::from(req.heal))
        .arg(req.gate.map_or(0, |g| ms(g).max(1)));
    for (id, code) in &req.reports {
        inv.arg(id.as_str()).arg(*code);
    }
    inv
}

/// What the heartbeat answered: live replicas of this schema, and the other
/// schemas among live replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Census {
    pub(super) live: u32,
    pub(super) others: Vec<u32>,
}

impl Census {
    pub(super) fn parse(value: &Value) -> Option<Census> {
        let Value::Array(items) = value else {
            return None;
        };
        let mut ints = items.iter().map(|v| match v {
            Value::Int(n) => u32::try_from(*n).ok(),
            _ => None,
        });
        let live = ints.next()??;
        let others = ints.collect::<Option<Vec<u32>>>()?;
        Some(Census { live, others })
    }
}

/// The heartbeat of one replica.
pub(super) fn heartbeat(prefix: &str, replica: &str, ttl: Duration) -> ScriptInvocation<'static> {
    let mut inv = HEARTBEAT.prepare_invoke();
    inv.key(replicas_key(prefix))
        .arg(replica)
        .arg(SCHEMA)
        .arg(ms(ttl).max(1));
    inv
}

/// One ask for the turn to send a health probe, held for `hold` unless the
/// holder renews it; the script answers 1 when the turn is `replica`'s. With
/// `pass`, a holder passes the turn on instead (its probes keep failing).
pub(super) fn turn(
    key: &str,
    replica: &str,
    hold: Duration,
    pass: bool,
) -> ScriptInvocation<'static> {
    let mut inv = TURN.prepare_invoke();
    inv.key(key)
        .arg(replica)
        .arg(ms(hold).max(1))
        .arg(u8::from(pass));
    inv
}

/// The cluster state of one breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cluster {
    Closed,
    /// Open for this much longer.
    Open(Duration),
    /// Open, with its open duration elapsed: probes decide.
    HalfOpen,
    /// Forced open by an operator, for every replica.
    ForcedOpen,
    /// Disabled by an operator, for every replica.
    Disabled,
}

impl Cluster {
    pub(super) fn is_closed(self) -> bool {
        self == Cluster::Closed
    }
}

/// What the script answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reply {
    pub(super) cluster: Cluster,
    pub(super) epoch: u64,
    pub(super) granted: bool,
    /// The cluster is closed because an operator reset it.
    pub(super) reset: bool,
    /// The open period is a quota gate.
    pub(super) gated: bool,
}

impl Reply {
    /// Parses a reply; `None` for anything that is not the script's shape.
    pub(super) fn parse(value: &Value) -> Option<Reply> {
        let Value::Array(items) = value else {
            return None;
        };
        let int = |i: usize| match items.get(i) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        let cluster = match int(0)? {
            0 => Cluster::Closed,
            1 => Cluster::Open(Duration::from_millis(u64::try_from(int(1)?).ok()?)),
            2 => Cluster::HalfOpen,
            3 => Cluster::ForcedOpen,
            4 => Cluster::Disabled,
            _ => return None,
        };
        Some(Reply {
            cluster,
            epoch: u64::try_from(int(2)?).ok()?,
            granted: int(3)? == 1,
            reset: int(4)? == 1,
            gated: int(5) == Some(1),
        })
    }
}

/// The longest span, open duration or lease the script takes, in ms (about
/// 115 days); it reads anything longer as absent.
pub(super) const MAX_MS: u64 = 10_000_000_000;

fn lease_ms(rule: &Rule) -> u64 {
    ms(rule.lease).max(1)
}

/// Whole milliseconds, saturating at [`MAX_MS`]: a longer setting ("never
/// expire") means the longest the script keeps, never its fallback.
fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(MAX_MS)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::{Config, Window};

    #[test]
    fn a_lease_that_never_expires_saturates_at_the_scripts_longest() {
        let config = Config {
            probe_lease: Some(Duration::MAX),
            open: Duration::MAX,
            open_max: Some(Duration::MAX),
            ..Config::default()
        };
        let rule = Rule::new(&config.shared_rules(), Some((Duration::MAX, 10)));
        let longest = Duration::from_millis(MAX_MS);
        // What the replica holds a granted slot for is what the cluster
        // grants it for: not `Duration::MAX` here and the script's fallback
        // (the open duration) there.
        assert_eq!(rule.lease, longest);
        assert_eq!(lease_ms(&rule), MAX_MS);
        assert_eq!(
            (rule.span_ms, rule.open_ms, rule.open_max_ms),
            (MAX_MS, MAX_MS, MAX_MS)
        );
        // Well inside what a Lua number holds exactly, with a clock added.
        const { assert!(MAX_MS * 4 < 1 << 53) };
    }

    #[test]
    fn keys_of_one_breaker_share_a_hash_tag() {
        let k = Keys::new("svc", "gpt-4o/eu");
        assert_eq!(k.state, "{svc:gpt-4o/eu}:v2:state");
        assert_eq!(k.window, "{svc:gpt-4o/eu}:v2:win");
        assert_eq!(k.probes, "{svc:gpt-4o/eu}:v2:probes");
        assert_eq!(k.votes, "{svc:gpt-4o/eu}:v2:votes");
        assert_eq!(k.health, "{svc:gpt-4o/eu}:v2:health");
    }

    #[test]
    fn replies_of_another_shape_are_refused() {
        let good = Value::Array(vec![
            Value::Int(1),
            Value::Int(250),
            Value::Int(7),
            Value::Int(0),
            Value::Int(0),
        ]);
        let r = Reply::parse(&good).unwrap();
        assert_eq!(r.cluster, Cluster::Open(Duration::from_millis(250)));
        assert_eq!(r.epoch, 7);
        assert!(!r.granted);
        for bad in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![
                Value::Int(9),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(-5),
                Value::Int(0),
                Value::Int(0),
            ]),
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![
                Value::Nil,
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
        ] {
            assert!(Reply::parse(&bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn rule_follows_the_breaker_configuration() {
        let c = Config {
            window: Window::Count(20),
            min_calls: 10,
            failure_rate: Some(0.5),
            probes: 3,
            close_after: 2,
            ..Config::default()
        };
        let r = Rule::new(&c.shared_rules(), None);
        assert_eq!((r.span_ms, r.buckets, r.min_calls), (10_000, 10, 10));
        assert!(r.aggregates());
        let off = Rule::new(
            &Config {
                window: Window::None,
                ..c.clone()
            }
            .shared_rules(),
            None,
        );
        assert!(!off.aggregates());
        let timed = Rule::new(
            &Config {
                window: Window::Time {
                    span: Duration::from_secs(30),
                    buckets: 6,
                },
                ..c
            }
            .shared_rules(),
            None,
        );
        assert_eq!((timed.span_ms, timed.buckets), (30_000, 6));
    }
}
