//! The entry each thread last found, so that a key called over and over
//! (one model taking most of the traffic) is admitted without hashing it or
//! taking its shard's lock, whose read-modify-writes every thread calling
//! that key would otherwise contend on.
//!
//! A thread remembers an entry the second time in a row it looks the same
//! key up, so calls alternating between keys never pay for remembering.
//! What it remembers is valid while its set's version is unchanged: sets
//! draw versions from one counter, and take a new one whenever they evict
//! keys. A call that races the eviction of its key may still be admitted
//! by the evicted breaker, as it could a moment earlier; the key had been
//! closed and unused for a whole idle timeout.
//!
//! The remembered entry keeps its breaker alive until the thread looks up
//! another key twice or exits.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::key::same_key;
use super::touched::Touched;
use super::Entry;
use crate::breaker::CircuitOpen;
use crate::sync::thread_local;
use crate::Permit;

static VERSIONS: AtomicU64 = AtomicU64::new(1);

/// A version no set has had.
pub(super) fn next_version() -> u64 {
    VERSIONS.fetch_add(1, Ordering::Relaxed)
}

struct Last {
    /// The version of the set `entry` was found in; 0, which no set has,
    /// while it holds none.
    version: Cell<u64>,
    /// The hash of the key last looked up, remembered or not.
    hash: Cell<u64>,
    entry: RefCell<Option<Arc<Entry>>>,
}

thread_local! {
    static LAST: Last = const {
        Last {
            version: Cell::new(0),
            hash: Cell::new(0),
            entry: RefCell::new(None),
        }
    };
}

/// Admits through the remembered entry if it is `key`'s in the set at
/// `version`.
#[inline]
pub(super) fn admit(
    version: u64,
    key: &str,
    touched: &Touched,
    fallback: impl FnOnce() -> bool,
) -> Option<Result<Permit, CircuitOpen>> {
    LAST.try_with(|last| {
        // Nothing remembered from this set (or nothing at all): no need to
        // look at the entry.
        if last.version.get() != version {
            return None;
        }
        // A listener calling in during an admission finds it borrowed.
        let entry = last.entry.try_borrow().ok()?;
        let entry = entry.as_ref()?;
        if !same_key(&entry.key, key) {
            return None;
        }
        entry.touch(touched);
        Some(entry.breaker.admit_marked(fallback))
    })
    .ok()
    .flatten()
}

/// Notes that `entry` was found for the key hashing to `hash`; remembers it
/// if the previous lookup was for the same key.
#[inline]
pub(super) fn looked_up(version: u64, hash: u64, entry: &Arc<Entry>) {
    let _ = LAST.try_with(|last| {
        if last.hash.get() != hash {
            last.hash.set(hash);
        } else if let Ok(mut remembered) = last.entry.try_borrow_mut() {
            *remembered = Some(Arc::clone(entry));
            last.version.set(version);
        }
    });
}
