//! Which keys saw calls since a shared-state backend last looked, so that
//! its flushes visit those keys rather than every key of a large set.
//!
//! Each entry carries two marks: `USED`, which the idle sweep clears, and
//! `UNSENT`, which the backend clears when it takes the entry from the
//! list. A call sets both as it is admitted, and only the call that finds
//! `UNSENT` clear puts the entry on the list, so an entry is on it at most
//! once between two looks. Every other call reads the marks and moves on:
//! no read-modify-write on a hot key's line, no lock.
//!
//! The backend takes the list, clears each entry's `UNSENT` (a
//! read-modify-write, so a call that set the mark before it is seen) and
//! then reads the breaker's counters. A call marks its key just before its
//! admission is counted, so that read may miss it: a key taken from the
//! list is looked at by the next flush too, whatever the first look found,
//! and keys with calls in flight stay in the backend's looks until those
//! calls end (an outcome may come long after its admission). A weak memory
//! order may show a call's counts later still; the backend's resync, which
//! reads every key, bounds how much later.
//!
//! Without a backend listening no call puts anything on the list, and the
//! marks stay set after a key's first call: the check is one load.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Entry, KeyedBreakers};
use crate::sync::{lock, AtomicU32, AtomicU8, Mutex};
use crate::Breaker;

/// A call came since the last idle sweep.
pub(super) const USED: u8 = 1;
/// A call came since the backend last took the entry from the list.
pub(super) const UNSENT: u8 = 2;

/// The entries that saw calls, for the backends listening.
pub(super) struct Touched {
    listeners: AtomicU32,
    list: Mutex<Vec<Arc<Entry>>>,
}

impl Touched {
    pub(super) fn new() -> Touched {
        Touched {
            listeners: AtomicU32::new(0),
            list: Mutex::new(Vec::new()),
        }
    }
}

/// An entry's marks, [`USED`] and [`UNSENT`].
pub(super) struct Marks(AtomicU8);

impl Marks {
    /// The marks of an entry made for a call: used, and not yet put on the
    /// list (a backend finds a new key by the set's membership).
    pub(super) fn new() -> Marks {
        Marks(AtomicU8::new(USED))
    }

    /// Clears [`USED`]; whether it was set.
    pub(super) fn take_used(&self) -> bool {
        self.0.fetch_and(!USED, Ordering::Relaxed) & USED != 0
    }
}

impl Entry {
    /// Notes a call, as it is admitted.
    #[inline]
    pub(super) fn touch(self: &Arc<Self>, touched: &Touched) {
        if self.marks.0.load(Ordering::Relaxed) != USED | UNSENT {
            touched.add(self);
        }
    }
}

impl Touched {
    #[cold]
    #[inline(never)]
    fn add(&self, entry: &Arc<Entry>) {
        // Acquire: a backend that cleared `UNSENT` started listening first,
        // and this call must see that it did.
        let before = entry.marks.0.fetch_or(USED | UNSENT, Ordering::AcqRel);
        if before & UNSENT == 0 && self.listeners.load(Ordering::Acquire) > 0 {
            lock(&self.list).push(Arc::clone(entry));
        }
    }
}

/// A backend listening to a set's calls; it stops when dropped.
pub(crate) struct Listening {
    set: KeyedBreakers,
}

impl KeyedBreakers {
    /// Starts telling a backend which keys see calls
    /// ([`take_touched`](Self::take_touched)).
    #[cfg_attr(not(any(feature = "redis", loom)), allow(dead_code))]
    pub(crate) fn listen(&self) -> Listening {
        let inner = &*self.inner;
        inner.touched.listeners.fetch_add(1, Ordering::AcqRel);
        // Marks set while nobody listened: the next call of every key puts
        // it on the list.
        for shard in &inner.shards {
            for e in super::shards::read(shard).iter() {
                if e.marks.0.load(Ordering::Relaxed) & UNSENT != 0 {
                    e.marks.0.fetch_and(!UNSENT, Ordering::AcqRel);
                }
            }
        }
        Listening { set: self.clone() }
    }

    /// How many backends listen: a list taken by one is lost to the
    /// others, who must then visit every key.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn listeners(&self) -> u32 {
        self.inner.touched.listeners.load(Ordering::Acquire)
    }

    /// Hands `f` the breaker of every key that saw a call since the last
    /// time, each once; read its counters after this returns, and again a
    /// little later (a call is marked just before its admission is
    /// counted).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn take_touched(&self, mut f: impl FnMut(&Breaker)) {
        let list = std::mem::take(&mut *lock(&self.inner.touched.list));
        for e in list {
            e.marks.0.fetch_and(!UNSENT, Ordering::AcqRel);
            f(&e.breaker);
        }
    }

    /// For the model checker: [`listen`](Self::listen).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn model_listen(&self) -> impl Drop {
        self.listen()
    }

    /// For the model checker: whether `key`'s mark says it saw a call the
    /// list does not hold, or the list holds a key whose mark is clear (so
    /// no look would find it, or one would find it twice).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn model_stuck(&self, key: &str) -> bool {
        let inner = &*self.inner;
        let listed = lock(&inner.touched.list)
            .iter()
            .any(|e| super::key::same_key(&e.key, key));
        let hash = inner.hash(key);
        let unsent = super::shards::read(inner.shard(hash))
            .find(hash, |e| super::key::same_key(&e.key, key))
            .is_some_and(|e| e.marks.0.load(Ordering::Relaxed) & UNSENT != 0);
        listed != unsent
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let t = &self.set.inner.touched;
        if t.listeners.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Nobody takes the list any more: it would only keep evicted
            // entries alive.
            lock(&t.list).clear();
        }
    }
}
