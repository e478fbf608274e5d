//! The background task of one attachment. All Redis I/O happens here; the
//! breakers it serves never wait for it.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::rng::Rng;

use super::conn::{Conn, Failure};
use super::messages::{announce_spent, next, ready, wait};
use super::script::{self, Caller, Census, Keys, Reply, SCHEMA};
use super::tracked::{later, Pending, Tracked};
use super::turns::{self, Ask, Desk};
use super::{Origins, Quorum, Schemas, Settings};
use crate::breaker::Counters;
use crate::keyed::{KeyedBreakers, Listening};
use crate::sync::lock;
use crate::Breaker;

/// Script calls per round trip.
const CHUNK: usize = 256;

/// What an attachment keeps in step.
#[derive(Clone)]
pub(super) enum Target {
    One(Breaker),
    Keyed(KeyedBreakers),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// Every breaker, whether or not anything changed (resync).
    All,
    /// Breakers with something to tell or to learn.
    Changes,
    /// Breakers that tripped, or that a health probe healed, locally since
    /// the last exchange.
    Trips,
    /// Only the breakers that pub/sub messages named, in `Worker::named`.
    Named,
}

pub(super) struct Worker {
    settings: Arc<Settings>,
    target: Target,
    tracked: HashMap<Arc<str>, Tracked>,
    shared: Arc<AtomicBool>,
    origins: Origins,
    stop: watch::Receiver<()>,
    channel: String,
    replica: Arc<str>,
    rng: Rng,
    round: u64,
    /// The keyed set's membership at the last look at its keys.
    members: Option<u64>,
    /// The quorum in force: the one configured, or the live replicas when
    /// fewer are alive.
    quorum: u32,
    /// Other schemas already reported.
    schemas: HashSet<u32>,
    /// And where the attachment shows them.
    seen_schemas: Schemas,
    /// The node to subscribe on next.
    node: usize,
    /// Where the breakers' probers ask whose turn it is to probe.
    desk: Desk,
    asks: mpsc::Receiver<Ask>,
    /// Breakers whose transitions messages announced, for `Pass::Named`.
    named: Vec<Arc<str>>,
    /// The breakers of a keyed set a flush looks at: every one not found
    /// idle at its last look, and those that saw calls since (the set
    /// tells). A resync looks at all of them.
    busy: Busy,
    /// The keyed set telling which keys saw calls.
    _listening: Option<Listening>,
}

impl Worker {
    pub(super) fn new(
        settings: Arc<Settings>,
        target: Target,
        shared: Arc<AtomicBool>,
        origins: Origins,
        seen_schemas: Schemas,
        stop: watch::Receiver<()>,
    ) -> Worker {
        let seed = crate::rng::random_seed();
        let channel = format!("{}:events", settings.prefix);
        let (desk, asks) = Desk::new(shared.clone(), settings.timeout);
        let listening = match &target {
            Target::Keyed(set) => Some(set.listen()),
            Target::One(_) => None,
        };
        let mut w = Worker {
            quorum: settings.quorum.needed(u32::MAX),
            replica: settings.replica.clone(),
            settings,
            target,
            tracked: HashMap::new(),
            shared,
            origins,
            stop,
            channel,
            rng: Rng::new(seed),
            round: 0,
            members: None,
            schemas: HashSet::new(),
            seen_schemas,
            #[allow(
                clippy::cast_possible_truncation,
                reason = "any bits of the seed pick a node"
            )]
            node: seed as usize,
            desk,
            asks,
            named: Vec::new(),
            busy: Busy::default(),
            _listening: listening,
        };
        w.refresh(false);
        w
    }

    pub(super) async fn run(mut self) {
        let mut backoff = self.settings.backoff.0;
        let mut warned = false;
        loop {
            let err = match self.session(&mut warned, &mut backoff).await {
                Ok(()) => break,
                Err(e) => e,
            };
            self.fallback();
            if warned {
                tracing::debug!(
                    target: "tower_circuit_breaker",
                    prefix = &*self.settings.prefix,
                    error = %err,
                    "redis still unavailable"
                );
            } else {
                tracing::warn!(
                    target: "tower_circuit_breaker",
                    prefix = &*self.settings.prefix,
                    error = %err,
                    "redis unavailable; breakers fall back to local state until it is back"
                );
                warned = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.stop.changed() => break,
            }
            backoff = backoff.saturating_mul(2).min(self.settings.backoff.1);
        }
        // Dropping the worker leaves shared mode.
    }

    /// One connection's life: connect, resync everything, then keep in step
    /// until stopped (`Ok`) or until Redis fails (`Err`).
    async fn session(&mut self, warned: &mut bool, backoff: &mut Duration) -> Result<(), Failure> {
        let limit = self.settings.timeout;
        let store = &self.settings.store;
        let mut conn = store.connect(limit).await?;
        let mut messages = store
            .subscribe(&self.channel, limit, &mut self.node)
            .await?;
        conn.load(limit).await?;
        self.heartbeat(&mut conn).await?;
        self.look_for_schema_1(&mut conn).await?;

        // Whatever happened while away: outcomes of that time are not sent,
        // and the cluster state is applied even where the epoch is known.
        self.refresh(false);
        for t in self.tracked.values_mut() {
            t.base = t.breaker.snapshot().counters;
            t.force = true;
            t.local_cycle = false;
            t.leases.clear();
            t.releases.clear();
        }
        self.exchange(&mut conn, Pass::All).await?;
        for t in self.tracked.values() {
            t.breaker.remote().set_shared(!t.local_cycle);
        }
        self.shared.store(true, Ordering::Release);
        if *warned {
            tracing::info!(
                target: "tower_circuit_breaker",
                prefix = &*self.settings.prefix,
                "redis reachable again; breakers share state"
            );
            *warned = false;
        }
        *backoff = self.settings.backoff.0;

        let start = Instant::now();
        let mut flush = interval_at(later(start, self.settings.flush), self.settings.flush);
        flush.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut resync = interval_at(later(start, self.settings.resync), self.settings.resync);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut changed = self.changed();
        let keyed = matches!(self.target, Target::Keyed(_));
        loop {
            tokio::select! {
                biased;
                _ = self.stop.changed() => return Ok(()),
                msg = next(&mut messages) => match msg {
                    Some(msg) => {
                        self.on_message(&mut conn, &msg).await?;
                        // Every message already here joins one round trip,
                        // which touches only the keys they name.
                        while let Some(Some(msg)) = ready(&mut messages).await {
                            self.on_message(&mut conn, &msg).await?;
                        }
                        if !self.named.is_empty() {
                            self.exchange(&mut conn, Pass::Named).await?;
                        }
                    }
                    // A cluster node went away: listen on another one, and
                    // read everything again for what was missed meanwhile.
                    None if self.settings.store.is_cluster() => {
                        messages = self
                            .settings
                            .store
                            .subscribe(&self.channel, limit, &mut self.node)
                            .await?;
                        self.exchange(&mut conn, Pass::All).await?;
                    }
                    None => return Err(Failure::SubscriptionClosed),
                },
                _ = wait(&mut changed) => {
                    changed = self.changed();
                    // A transition in a keyed set: send only the breakers
                    // that tripped or healed here, if any.
                    let pass = if keyed { Pass::Trips } else { Pass::Changes };
                    self.exchange(&mut conn, pass).await?;
                }
                _ = flush.tick() => self.exchange(&mut conn, Pass::Changes).await?,
                _ = resync.tick() => {
                    self.heartbeat(&mut conn).await?;
                    self.exchange(&mut conn, Pass::All).await?;
                }
                Some(ask) = self.asks.recv() => {
                    let tracked = &mut self.tracked;
                    // Circuits the cluster holds open take turns; whether
                    // this replica passes its turn on.
                    let status = |name: &str| {
                        tracked
                            .get_mut(name)
                            .filter(|t| t.held_open())
                            .map(Tracked::pass_turn)
                    };
                    let (replica, limit) = (&self.replica, self.settings.timeout);
                    turns::answer(&mut conn, replica, ask, &mut self.asks, status, limit).await?;
                }
            }
        }
    }

    /// Says this replica is alive, learns how many of its schema are, and
    /// of replicas of other schemas on the same prefix.
    async fn heartbeat(&mut self, conn: &mut Conn) -> Result<(), Failure> {
        let ttl = self
            .settings
            .resync
            .saturating_mul(3)
            .saturating_add(self.settings.timeout);
        let inv = script::heartbeat(&self.settings.prefix, &self.replica, ttl);
        let values = conn
            .invoke(std::slice::from_ref(&inv), self.settings.timeout)
            .await?;
        let census = values
            .first()
            .and_then(Census::parse)
            .ok_or(Failure::Reply)?;
        for other in census.others {
            self.other_schema(other);
        }
        let wanted = self.settings.quorum.needed(u32::MAX);
        let quorum = self.settings.quorum.needed(census.live);
        self.settings.fleet.set(census.live, quorum);
        if quorum != self.quorum {
            if matches!(self.settings.quorum, Quorum::Fraction(_)) {
                tracing::debug!(
                    target: "tower_circuit_breaker",
                    prefix = &*self.settings.prefix,
                    quorum,
                    live = census.live,
                    "the quorum follows the replicas alive"
                );
            } else if quorum < wanted {
                tracing::warn!(
                    target: "tower_circuit_breaker",
                    prefix = &*self.settings.prefix,
                    quorum = wanted,
                    live = census.live,
                    "fewer replicas alive than the quorum; a circuit opens on failures from {quorum}"
                );
            } else {
                tracing::info!(
                    target: "tower_circuit_breaker",
                    prefix = &*self.settings.prefix,
                    quorum,
                    "enough replicas alive for the quorum again"
                );
            }
            self.quorum = quorum;
        }
        Ok(())
    }

    /// A single breaker whose state key of the first schema exists: a
    /// replica of 0.1 may be sharing that state apart from this one.
    async fn look_for_schema_1(&mut self, conn: &mut Conn) -> Result<(), Failure> {
        let Target::One(b) = &self.target else {
            return Ok(());
        };
        let Some(name) = b.name() else {
            return Ok(());
        };
        let key = Keys::unversioned_state(&self.settings.prefix, name);
        let found: bool = conn
            .query(::redis::cmd("EXISTS").arg(key), self.settings.timeout)
            .await?;
        if found {
            self.other_schema(1);
        }
        Ok(())
    }

    /// Reports, once, that replicas of another schema share the prefix.
    fn other_schema(&mut self, schema: u32) {
        if schema != SCHEMA && self.schemas.insert(schema) {
            lock(&self.seen_schemas).insert(schema);
            tracing::warn!(
                target: "tower_circuit_breaker",
                prefix = &*self.settings.prefix,
                schema = SCHEMA,
                other = schema,
                "replicas of another shared-state schema use this prefix; \
                 the two keep separate state until every replica runs one version"
            );
        }
    }

    /// A future completing at the next transition of the breaker, or of
    /// any breaker of the keyed set, so a local trip is shared at once
    /// rather than at the next flush.
    fn changed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        match &self.target {
            Target::One(b) => Box::pin(b.changed()),
            Target::Keyed(set) => Box::pin(set.any_change()),
        }
    }

    /// Leaves shared mode everywhere: every breaker decides alone again.
    fn fallback(&mut self) {
        self.shared.store(false, Ordering::Release);
        for t in self.tracked.values_mut() {
            t.breaker.remote().set_shared(false);
            t.breaker.remote().leave_spend();
            t.leases.clear();
            t.releases.clear();
        }
    }

    /// Picks up keys new to the set and forgets evicted ones.
    fn refresh(&mut self, shared: bool) {
        let Target::Keyed(set) = &self.target else {
            if self.tracked.is_empty()
                && let Target::One(b) = &self.target
                && let Some(name) = b.name()
            {
                let t = Tracked::new(b.clone(), name.into(), &self.settings);
                b.remote()
                    .set_turns(Some(self.desk.hook(&t.name, &t.keys.health)));
                self.tracked.insert(t.name.clone(), t);
            }
            return;
        };
        // Read before the look: a key added during it moves the count, and
        // the next flush looks again.
        let members = set.membership();
        if self.members.replace(members) == Some(members) {
            return;
        }
        self.round += 1;
        let round = self.round;
        for b in set.breakers() {
            let Some(name) = b.name() else { continue };
            match self.tracked.get_mut(name) {
                Some(t) if t.breaker.ptr_eq(&b) => t.seen = round,
                _ => {
                    // New, or evicted and created again.
                    if shared {
                        b.remote().set_shared(true);
                    }
                    let mut t = Tracked::new(b.clone(), name.into(), &self.settings);
                    if shared {
                        // Made while sharing: every call it saw counts,
                        // the first ones (which made the key) too.
                        t.base = Counters::default();
                    }
                    b.remote()
                        .set_turns(Some(self.desk.hook(&t.name, &t.keys.health)));
                    t.seen = round;
                    self.busy.set(&mut t, true);
                    self.tracked.insert(t.name.clone(), t);
                }
            }
        }
        self.tracked.retain(|_, t| t.seen == round);
        let tracked = &self.tracked;
        self.busy.0.retain(|name| tracked.contains_key(name));
        // Evicted keys take their origin with them.
        lock(&self.origins).retain(|name, _| tracked.contains_key(name));
    }

    /// Adds the keys of the set that saw calls since the last time to the
    /// busy ones.
    fn take_touched(&mut self) {
        let Target::Keyed(set) = &self.target else {
            return;
        };
        let (tracked, busy) = (&mut self.tracked, &mut self.busy);
        set.take_touched(|b| {
            // A key not tracked yet is new: the next look at the set's
            // membership finds it.
            if let Some(name) = b.name()
                && let Some(t) = tracked.get_mut(name)
                && t.breaker.ptr_eq(b)
            {
                t.told = true;
                busy.set(t, true);
            }
        });
    }

    /// Whether a pass must look at every breaker: a resync does, and so
    /// does any pass over a keyed set whose calls are told to another
    /// listener too (who may have taken them from the list).
    fn looks_at_all(&self, pass: Pass) -> bool {
        match &self.target {
            Target::One(_) => true,
            Target::Keyed(set) => pass == Pass::All || set.listeners() != 1,
        }
    }

    /// One round trip: every breaker with something to say or learn, in one
    /// pipeline of script calls.
    async fn exchange(&mut self, conn: &mut Conn, pass: Pass) -> Result<(), Failure> {
        let shared = self.shared.load(Ordering::Acquire);
        let now = Instant::now();
        let mut pending = Vec::new();
        let named = std::mem::take(&mut self.named);
        if pass != Pass::Named {
            self.refresh(shared);
            // Taken at every pass that looks at the set, so the list never
            // holds what a pass over every key has seen anyway (nor, with
            // two listeners, grows with the keys evicted meanwhile).
            self.take_touched();
        }
        let all = pass != Pass::Named && self.looks_at_all(pass);
        let settings = self.settings.clone();
        // Whether the breaker is still busy after this look (`None`: not
        // looked at).
        let mut visit = |t: &mut Tracked| -> Option<bool> {
            if pass == Pass::Trips && !t.moved() {
                return None;
            }
            let claim = || {
                let n = settings.leases.fetch_add(1, Ordering::Relaxed) + 1;
                format!("{}:{n}", settings.replica)
            };
            let prepared = t.prepare(now, pass == Pass::All, shared, claim);
            let sent = prepared.is_some();
            if let Some((request, local)) = prepared {
                pending.push(Pending {
                    name: t.name.clone(),
                    request,
                    local,
                });
            }
            Some(t.stays_busy(sent))
        };
        // Only the keys messages named, or the busy ones: no scan of the
        // whole set (the next flush picks up keys new to it).
        let names = match pass {
            _ if all => Vec::new(),
            Pass::Named => named,
            _ => self.busy.0.iter().cloned().collect(),
        };
        let (tracked, busy) = (&mut self.tracked, &mut self.busy);
        let mut look = |t: &mut Tracked| {
            if let Some(b) = visit(t) {
                busy.set(t, b);
            }
        };
        if all {
            tracked.values_mut().for_each(&mut look);
        } else {
            for name in &names {
                if let Some(t) = tracked.get_mut(name) {
                    look(t);
                }
            }
        }
        if pending.is_empty() {
            if pass == Pass::All {
                // Nothing to resync: still make sure Redis answers in time.
                let pong: Value = conn
                    .query(&::redis::cmd("PING"), self.settings.timeout)
                    .await?;
                drop(pong);
            }
            return Ok(());
        }
        // In chunks, so a large keyed set neither holds Redis up with one
        // huge pipeline nor runs one round trip past the timeout.
        let mut spent = Vec::new();
        while !pending.is_empty() {
            let rest = pending.split_off(pending.len().min(CHUNK));
            let caller = Caller {
                channel: &self.channel,
                replica: &self.replica,
                quorum: self.quorum,
            };
            let calls: Vec<_> = pending
                .iter()
                .map(|p| {
                    let t = &self.tracked[&p.name];
                    let unit = self.rng.unit();
                    script::invocation(&caller, &t.name, &t.keys, &t.rule, unit, &p.request)
                })
                .collect();
            let sent = Instant::now();
            let values = conn.invoke(&calls, self.settings.timeout).await?;
            if values.len() != pending.len() {
                return Err(Failure::Reply);
            }
            for (p, value) in pending.into_iter().zip(&values) {
                let reply = Reply::parse(value).ok_or(Failure::Reply)?;
                if let Some(t) = self.tracked.get_mut(&p.name) {
                    t.apply(reply, p, sent, self.settings.flush, &self.origins);
                    spent.extend(t.spent_news());
                }
            }
            pending = rest;
        }
        announce_spent(conn, &self.channel, spent, self.settings.timeout).await
    }
}

/// The breakers a flush looks at, each marked in its [`Tracked`] too, so a
/// resync's look at every key changes the set only where a key's standing
/// changed.
#[derive(Default)]
struct Busy(HashSet<Arc<str>>);

impl Busy {
    fn set(&mut self, t: &mut Tracked, busy: bool) {
        if t.busy != busy {
            t.busy = busy;
            if busy {
                self.0.insert(t.name.clone());
            } else {
                self.0.remove(&t.name);
            }
        }
    }
}

impl Drop for Worker {
    /// However the task ends (detached, or its runtime shut down), the
    /// breakers must not wait for grants that will never come.
    fn drop(&mut self) {
        self.fallback();
        for t in self.tracked.values() {
            t.breaker.remote().set_turns(None);
        }
    }
}

#[path = "inbox.rs"]
mod inbox;

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
