//! The synchronisation primitives of the state machine, swapped for loom's
//! under `--cfg loom` so the model checker can explore their interleavings.
//! Thread-locals and statics come from here too: loom gives each model
//! thread its own thread-locals and each execution its own statics, so the
//! per-thread tricks of the hot path run under loom as they ship.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread_local;

/// Locks a mutex, carrying on if a panicking thread poisoned it: every value
/// behind these locks stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `std::thread_local!`, and under loom loom's, which takes no `const`
/// initializer (each model thread's value is made when it first asks).
#[cfg(loom)]
macro_rules! loom_thread_local {
    () => {};
    ($(#[$attr:meta])* static $name:ident: $t:ty = const { $init:expr }; $($rest:tt)*) => {
        loom::thread_local!($(#[$attr])* static $name: $t = $init;);
        $crate::sync::thread_local!($($rest)*);
    };
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr; $($rest:tt)*) => {
        loom::thread_local!($(#[$attr])* static $name: $t = $init;);
        $crate::sync::thread_local!($($rest)*);
    };
}
#[cfg(loom)]
pub(crate) use loom_thread_local as thread_local;

/// A static: a plain one, and under loom one made afresh for every
/// execution explored (so that what one model did to it, or a model
/// running beside it, cannot change what the next one explores).
macro_rules! model_static {
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        #[cfg(not(loom))]
        $(#[$attr])*
        static $name: $t = $init;
        #[cfg(loom)]
        loom::lazy_static! {
            $(#[$attr])*
            static ref $name: $t = $init;
        }
    };
}
pub(crate) use model_static;
