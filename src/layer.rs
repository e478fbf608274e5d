use tower_layer::Layer;

use crate::breaker::{Breaker, Builder};
use crate::classify::HttpClassifier;
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
#[derive(Debug, Clone)]
pub struct CircuitBreakerLayer<C = HttpClassifier> {
    breaker: Breaker,
    classifier: C,
}

impl CircuitBreakerLayer {
    /// A layer around an existing breaker, with the default [`HttpClassifier`].
    pub const fn new(breaker: Breaker) -> Self {
        CircuitBreakerLayer {
            breaker,
            classifier: HttpClassifier,
        }
    }

    /// A builder whose [`build`](Builder::build) returns a layer.
    pub fn builder() -> Builder<Self> {
        Builder::new()
    }
}

impl<C> CircuitBreakerLayer<C> {
    /// Uses another classifier.
    pub fn with_classifier<C2>(self, classifier: C2) -> CircuitBreakerLayer<C2> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier,
        }
    }

    /// The shared breaker, for snapshots and manual control.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl From<Breaker> for CircuitBreakerLayer {
    fn from(breaker: Breaker) -> Self {
        CircuitBreakerLayer::new(breaker)
    }
}

impl<S, C: Clone> Layer<S> for CircuitBreakerLayer<C> {
    type Service = CircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::with_classifier(inner, self.breaker.clone(), self.classifier.clone())
    }
}
