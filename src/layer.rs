use tower_layer::Layer;

use crate::breaker::{sealed, Breaker, Build, Builder, ConfigError};
use crate::classify::HttpClassifier;
use crate::deadline::{DeadlineError, StreamDeadlines};
use crate::keyed::{Keyed, KeyedBreakers};
use crate::CircuitBreaker;

/// Applies a circuit breaker to every service it wraps.
///
/// The breaker's state lives in the layer: every service it makes, and every
/// clone of those, shares one breaker.
///
/// # Example
///
/// ```
/// use tower::{Layer, ServiceBuilder};
/// use tower_circuit_breaker::CircuitBreakerLayer;
///
/// # fn main() -> Result<(), tower_circuit_breaker::ConfigError> {
/// let layer = CircuitBreakerLayer::builder().count_window(20).failure_rate(0.5).build()?;
/// let a = layer.layer(tower::service_fn(|_: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// }));
/// let b = a.clone();
/// assert!(a.breaker().ptr_eq(b.breaker()));
/// # let _ = ServiceBuilder::new().layer(layer);
/// # Ok(()) }
/// ```
///
/// With [`stream_deadlines`](Self::stream_deadlines), every service it makes
/// keeps them on its response bodies (the `D` parameter is then
/// [`StreamDeadlines`]).
#[derive(Debug, Clone)]
pub struct CircuitBreakerLayer<C = HttpClassifier, P = Breaker, D = ()> {
    select: P,
    classifier: C,
    deadlines: D,
}

impl CircuitBreakerLayer {
    /// A layer around an existing breaker, with the default [`HttpClassifier`].
    #[must_use]
    pub const fn new(breaker: Breaker) -> Self {
        CircuitBreakerLayer {
            select: breaker,
            classifier: HttpClassifier,
            deadlines: (),
        }
    }

    /// A builder whose [`build`](Builder::build) returns a layer.
    #[must_use]
    pub fn builder() -> Builder<Self> {
        Builder::new()
    }
}

impl<K> CircuitBreakerLayer<HttpClassifier, Keyed<K>> {
    /// A layer with one breaker per key, the key taken from each request by
    /// `key` (see [`keyed`](crate::keyed) for the ready-made ones).
    pub fn keyed(breakers: KeyedBreakers, key: K) -> Self {
        CircuitBreakerLayer {
            select: Keyed::new(breakers, key),
            classifier: HttpClassifier,
            deadlines: (),
        }
    }
}

impl<C, D> CircuitBreakerLayer<C, Breaker, D> {
    /// The shared breaker, for snapshots and manual control.
    pub fn breaker(&self) -> &Breaker {
        &self.select
    }
}

impl<C, P> CircuitBreakerLayer<C, P> {
    /// Keeps `deadlines` on every response body of the services it makes:
    /// the first frame, stalls and the total time (see
    /// [`deadline`](crate::deadline) for an example). Refuses deadlines that
    /// cannot work with a [`DeadlineError`].
    ///
    /// # Errors
    ///
    /// A [`DeadlineError`] from [`StreamDeadlines::validate`](crate::deadline::StreamDeadlines::validate).
    pub fn stream_deadlines(
        self,
        deadlines: StreamDeadlines,
    ) -> Result<CircuitBreakerLayer<C, P, StreamDeadlines>, DeadlineError> {
        deadlines.validate()?;
        Ok(CircuitBreakerLayer {
            select: self.select,
            classifier: self.classifier,
            deadlines,
        })
    }
}

impl<C, P, D> CircuitBreakerLayer<C, P, D> {
    /// Uses another classifier.
    pub fn with_classifier<C2>(self, classifier: C2) -> CircuitBreakerLayer<C2, P, D> {
        CircuitBreakerLayer {
            select: self.select,
            classifier,
            deadlines: self.deadlines,
        }
    }

    /// The stream deadlines (`()` without them).
    pub fn deadlines(&self) -> &D {
        &self.deadlines
    }

    /// What chooses the breaker for each request.
    pub fn select(&self) -> &P {
        &self.select
    }

    /// The classifier every service made by this layer uses.
    pub fn classifier(&self) -> &C {
        &self.classifier
    }
}

impl From<Breaker> for CircuitBreakerLayer {
    fn from(breaker: Breaker) -> Self {
        CircuitBreakerLayer::new(breaker)
    }
}

impl sealed::Sealed for CircuitBreakerLayer {}

impl Build for CircuitBreakerLayer {
    type Extra = ();
    type Error = ConfigError;

    fn build_from(builder: Builder<Self>) -> Result<Self, ConfigError> {
        Ok(CircuitBreakerLayer::new(
            builder.into_builder::<Breaker>().build()?,
        ))
    }
}

impl<S, C: Clone, P: Clone, D: Clone> Layer<S> for CircuitBreakerLayer<C, P, D> {
    type Service = CircuitBreaker<S, C, P, D>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::from_parts(
            inner,
            self.select.clone(),
            self.classifier.clone(),
            self.deadlines.clone(),
        )
    }
}
