//! The seam through which a breaker tells an observer above the core (the
//! `metrics` feature's recorder) what it does, without knowing who listens.
//!
//! The core owns the words ([`Outcome`], [`Rejection`], [`State`],
//! [`Transition`]); an observer implements [`Observe`], and the
//! configuration holds a [`MakeObserver`] that gives each breaker its own
//! (every key of a keyed set gets one, labelled by its key). A breaker built
//! without one pays one test of an empty field per report.

use std::sync::Arc;

use super::{Outcome, Rejection, State, Transition};

/// Told of one breaker's calls, rejections and transitions. Every report is
/// made on the caller's thread, outside every lock of the breaker.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) trait Observe: Send + Sync {
    /// A call finished with `outcome`, or was `dropped` unrecorded; `state`
    /// is the circuit's state now.
    fn outcome(&self, outcome: Outcome, dropped: bool, state: State);

    /// A call was rejected for `reason`; `state` is the circuit's state now.
    fn rejected(&self, reason: Rejection, state: State);

    /// The circuit changed state.
    fn transition(&self, transition: &Transition);

    /// A call admitted now starts: a token the permit keeps until the
    /// response head comes and hands to [`head`](Self::head); 0 when the
    /// call is not timed. 32 bits, so that it fits in a permit's padding.
    fn start(&self) -> u32 {
        0
    }

    /// The response head of a call that started with token `start` came;
    /// `probe`: the call is a half-open probe.
    fn head(&self, start: u32, probe: bool) {
        let _ = (start, probe);
    }

    /// The spend guard's warning threshold was reached.
    fn spend_warning(&self) {}
}

/// Gives each breaker built from a configuration its observer.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) trait MakeObserver: Send + Sync {
    /// The observer of a breaker named `name`; `keyed`: `name` is a key of
    /// a keyed set whose builder was named `set`.
    fn make(
        &self,
        set: Option<&Arc<str>>,
        name: Option<&Arc<str>>,
        keyed: bool,
    ) -> Box<dyn Observe>;
}

/// A configuration's observer factory.
pub(crate) type Observer = Arc<dyn MakeObserver>;
