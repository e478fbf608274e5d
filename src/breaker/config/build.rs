//! [`Build`]: what a [`Builder`] can build, each with its own error.

use std::fmt;

use super::{Builder, ConfigError};
use crate::breaker::Breaker;

/// What a [`Builder`] can build: a [`Breaker`], a [`CircuitBreakerLayer`](crate::CircuitBreakerLayer)
/// or [`KeyedBreakers`](crate::keyed::KeyedBreakers).
pub trait Build: sealed::Sealed + Sized {
    /// Settings only this target has.
    #[doc(hidden)]
    type Extra: Default + Clone + fmt::Debug;
    /// What `build` refuses a configuration with: a [`ConfigError`], or the target's own error.
    type Error;

    /// Builds from a validated configuration.
    #[doc(hidden)]
    fn build_from(builder: Builder<Self>) -> Result<Self, Self::Error>;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

impl sealed::Sealed for Breaker {}

impl Build for Breaker {
    type Extra = ();
    type Error = ConfigError;

    fn build_from(builder: Builder<Self>) -> Result<Self, ConfigError> {
        builder.config.validate()?;
        Ok(Breaker::from_config(builder.config))
    }
}
