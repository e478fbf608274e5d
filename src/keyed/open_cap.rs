//! The cap on open keys: at most a share of a keyed set open at once.
//!
//! Each key's breaker tells the cap of its transitions (a listener the set
//! installs on its keys' configuration, and only when the cap is on, so no
//! admission or outcome of a set without it runs any of this). On each one the cap reads
//! that key's state again, under its own lock, so transitions reported out
//! of order by racing threads still leave it with the truth; when more keys
//! are open than it allows, it ends the open period of the key whose
//! circuit opened longest ago, after letting its lock go (ending it is a
//! transition, which reports back here).
//!
//! Transitions happen inside lookups that hold a shard's lock (an
//! admission, a sweep), so the cap never takes one: it finds breakers in
//! its own register of the keys, kept beside the table as keys are added
//! and evicted. Locks are taken in one order only: a shard's, then the
//! cap's, then the register's, then a breaker's.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};

use tokio::time::Instant;

use super::Inner;
use crate::breaker::{Breaker, Transition};

pub(super) struct OpenCap {
    share: f64,
    set: Weak<Inner>,
    open: Mutex<Open>,
    /// Every key's breaker, as the table holds them.
    keys: Mutex<HashMap<Arc<str>, Breaker>>,
}

/// The keys whose circuits are open, by when they opened.
#[derive(Default)]
struct Open {
    since: HashMap<Arc<str>, Instant>,
    by_age: BTreeSet<(Instant, Arc<str>)>,
}

impl Open {
    fn set(&mut self, key: &Arc<str>, at: Option<Instant>) {
        if let Some(old) = self.since.remove(key) {
            self.by_age.remove(&(old, key.clone()));
        }
        if let Some(at) = at {
            self.since.insert(key.clone(), at);
            self.by_age.insert((at, key.clone()));
        }
    }

    fn pop_oldest(&mut self) -> Option<(Instant, Arc<str>)> {
        let oldest = self.by_age.pop_first()?;
        self.since.remove(&oldest.1);
        Some(oldest)
    }
}

impl OpenCap {
    pub(super) fn new(share: f64, set: Weak<Inner>) -> Self {
        OpenCap {
            share,
            set,
            open: Mutex::new(Open::default()),
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// A key the table now holds.
    pub(super) fn added(&self, key: &Arc<str>, breaker: &Breaker) {
        lock(&self.keys).insert(key.clone(), breaker.clone());
    }

    /// A key the table no longer holds.
    pub(super) fn evicted(&self, key: &str) {
        lock(&self.keys).remove(key);
    }

    fn breaker(&self, key: &str) -> Option<Breaker> {
        lock(&self.keys).get(key).cloned()
    }

    /// How many of `keys` may be open at once: the share, rounded down,
    /// and never fewer than one.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a float in [0, keys], converted by a saturating `as`"
    )]
    pub(super) fn allowed(&self, keys: usize) -> usize {
        ((self.share * keys as f64).floor() as usize).max(1)
    }

    /// A transition of one key's breaker.
    pub(super) fn on_transition(&self, t: &Transition) {
        let Some(set) = self.set.upgrade() else {
            return;
        };
        let Some(key) = &t.key else {
            return;
        };
        let mut open = lock(&self.open);
        let since = self.breaker(key).as_ref().and_then(Breaker::open_since);
        open.set(key, since);
        let ended = self.over_cap(&set, &mut open);
        drop(open);
        end(ended);
    }

    /// Brings the open keys back under the cap (after the set shrank).
    pub(super) fn enforce(&self, set: &Inner) {
        let mut open = lock(&self.open);
        let ended = self.over_cap(set, &mut open);
        drop(open);
        end(ended);
    }

    /// Under the lock: takes the oldest open keys off the list until the
    /// rest fit the cap, checking each against its breaker (a key whose
    /// open period ran out is no longer open, and takes no one's place).
    fn over_cap(&self, set: &Inner, open: &mut Open) -> Vec<(Breaker, Instant)> {
        let allowed = self.allowed(set.len.load(std::sync::atomic::Ordering::Relaxed));
        let mut ended = Vec::new();
        while open.since.len() > allowed {
            let Some((at, key)) = open.pop_oldest() else {
                break;
            };
            if let Some(breaker) = self.breaker(&key)
                && breaker.open_since() == Some(at)
            {
                ended.push((breaker, at));
            }
        }
        ended
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends each open period, outside the cap's lock.
fn end(ended: Vec<(Breaker, Instant)>) {
    for (breaker, at) in ended {
        breaker.end_open_period(at);
    }
}
