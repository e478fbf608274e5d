//! What a stack is made of besides its timeouts: one breaker or a keyed
//! set, and stream deadlines or none.

use std::fmt;

use super::error::StackError;
use crate::breaker::{Breaker, Builder};
use crate::deadline::StreamDeadlines;
use crate::keyed::{Keyed, KeyedBreakers, KeyedSettings};
use crate::retry::{KeyedWatch, RetryPolicy};

/// The stream deadlines a [`StackBuilder`](super::StackBuilder) may carry:
/// none (`()`), or [`StreamDeadlines`]. Sealed.
///
/// ```
/// use tower_circuit_breaker::deadline::StreamDeadlines;
/// use tower_circuit_breaker::stack::StackDeadlines;
///
/// fn takes<D: StackDeadlines>(_: D) {}
/// takes(());
/// takes(StreamDeadlines::new());
/// ```
pub trait StackDeadlines: Clone + sealed::Sealed {
    #[doc(hidden)]
    fn get(&self) -> Option<&StreamDeadlines>;
}

impl StackDeadlines for () {
    fn get(&self) -> Option<&StreamDeadlines> {
        None
    }
}

impl StackDeadlines for StreamDeadlines {
    fn get(&self) -> Option<&StreamDeadlines> {
        Some(self)
    }
}

/// The breakers of a stack: one [`Breaker`] for every request (the
/// default), or [`Keyed`] breakers, one per key, whose retry watches the
/// request's own key. Sealed.
///
/// ```
/// use tower_circuit_breaker::keyed::{self, Keyed, KeyedBreakers};
/// use tower_circuit_breaker::stack::{Stack, StackLayer};
/// use tower_circuit_breaker::classify::HttpClassifier;
///
/// let one: StackLayer = Stack::builder().build().unwrap();
/// let per_model: StackLayer<HttpClassifier, (), Keyed<keyed::Header>> =
///     Stack::keyed(KeyedBreakers::builder(), keyed::header("x-model")).build().unwrap();
/// # let _ = (one, per_model);
/// ```
pub trait StackSelect: Clone + sealed::Sealed {
    /// The settings that only this kind has, kept until `build`.
    #[doc(hidden)]
    type Spec: Clone + fmt::Debug;

    /// What the stack's retry watches per request.
    #[doc(hidden)]
    type Watch: Clone + fmt::Debug;

    /// The settings of a keyed set, whose per-key overrides the stack
    /// checks and caps as it does the shared configuration.
    #[doc(hidden)]
    fn keyed_settings(spec: &mut Self::Spec) -> Option<&mut KeyedSettings>;

    /// Builds from the checked configuration.
    #[doc(hidden)]
    fn build(config: Builder<Breaker>, spec: Self::Spec) -> Result<Self, StackError>;

    /// The stack's retry, watching these breakers.
    #[doc(hidden)]
    fn watched_by(&self, retry: RetryPolicy<()>) -> RetryPolicy<(), Self::Watch>;

    /// What a health prober probes: the one breaker, or the keyed set.
    #[doc(hidden)]
    fn probed(&self) -> (Option<Breaker>, Option<KeyedBreakers>);
}

impl StackSelect for Breaker {
    type Spec = ();
    type Watch = ();

    fn keyed_settings((): &mut ()) -> Option<&mut KeyedSettings> {
        None
    }

    fn build(config: Builder<Breaker>, (): ()) -> Result<Self, StackError> {
        Ok(config.build()?)
    }

    fn watched_by(&self, retry: RetryPolicy<()>) -> RetryPolicy<()> {
        retry.watch_breaker(self.clone())
    }

    fn probed(&self) -> (Option<Breaker>, Option<KeyedBreakers>) {
        (Some(self.clone()), None)
    }
}

impl<K: Clone + fmt::Debug> StackSelect for Keyed<K> {
    type Spec = (KeyedSettings, K);
    type Watch = KeyedWatch<K>;

    fn keyed_settings((settings, _): &mut Self::Spec) -> Option<&mut KeyedSettings> {
        Some(settings)
    }

    fn build(config: Builder<Breaker>, (settings, key): Self::Spec) -> Result<Self, StackError> {
        let mut builder = config.into_builder::<KeyedBreakers>();
        builder.extra = settings;
        Ok(Keyed::new(builder.build()?, key))
    }

    fn watched_by(&self, retry: RetryPolicy<()>) -> RetryPolicy<(), KeyedWatch<K>> {
        retry.watch_keyed(self.breakers().clone(), self.key_fn().clone())
    }

    fn probed(&self) -> (Option<Breaker>, Option<KeyedBreakers>) {
        (None, Some(self.breakers().clone()))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for () {}
    impl Sealed for crate::deadline::StreamDeadlines {}
    impl Sealed for crate::breaker::Breaker {}
    impl<K> Sealed for crate::keyed::Keyed<K> {}
}
