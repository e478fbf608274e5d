//! A spare reference to the breaker each thread last finished a call with.
//!
//! A permit owns a reference to its breaker's state, and taking and giving
//! back a reference is an atomic read-modify-write on a count that every
//! thread calling the breaker shares: two per call, and under contention the
//! costliest part of a closed circuit's path. Instead, a finished permit
//! leaves its reference with its thread, and the thread's next admission to
//! the same breaker takes it back: in the steady state no call touches the
//! count at all.
//!
//! The price is that a thread may keep one breaker's state alive after its
//! last handle is dropped, until the thread finishes a call with another
//! breaker or exits. That is why calls in flight are counted, not read off
//! the reference count.

use std::cell::Cell;
use std::sync::Arc;

use super::Shared;
use crate::sync::thread_local;

thread_local! {
    static SPARE: Cell<Option<Arc<Shared>>> = const { Cell::new(None) };
}

/// A reference to `shared` for a new permit: this thread's spare if it is
/// one, a new one otherwise.
#[inline]
pub(super) fn take(shared: &Arc<Shared>) -> Arc<Shared> {
    if let Ok(Some(spare)) = SPARE.try_with(|slot| match slot.take() {
        Some(spare) if Arc::ptr_eq(&spare, shared) => Some(spare),
        other => {
            slot.set(other);
            None
        }
    }) {
        return spare;
    }
    Arc::clone(shared)
}

/// Leaves a finished permit's reference with this thread, in place of any
/// other (a thread that is exiting drops it).
#[inline]
pub(super) fn give_back(shared: Arc<Shared>) {
    let _ = SPARE.try_with(move |slot| drop(slot.replace(Some(shared))));
}
