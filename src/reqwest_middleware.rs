//! The breaker as a [`reqwest_middleware::Middleware`].
//!
//! [`CircuitBreakerMiddleware`] admits every request through a [`Breaker`]
//! (or a [`Select`], such as [keyed breakers](crate::keyed)) and classifies
//! the answer with the same [`Classify`] implementations as the tower
//! service ([`LlmClassifier`](crate::classify::LlmClassifier) unless told
//! otherwise). Build it from a [`CircuitBreakerLayer`] and it shares that
//! layer's state and classifier, so one breaker can guard a tower stack and a
//! middleware client at once.
//!
//! * An open circuit answers `reqwest_middleware::Error::Middleware` holding a
//!   [`CircuitOpen`]: `err.downcast_ref::<CircuitOpen>()` on the inner error,
//!   or [`circuit_open`], which also finds a rejection that other middleware wrapped.
//! * A rejection by a breaker further in (a second `CircuitBreakerMiddleware`,
//!   keyed behind a global one) passes through as it is and is recorded as
//!   [`Ignored`](crate::Outcome::Ignored): the upstream was not called.
//! * When the classifier defers to the end of the body (an SSE stream), the
//!   response body is wrapped so the stream's end, error event or drop
//!   decides the outcome.
//! * Attach it after a retry middleware (middlewares run in the order they
//!   are attached), so every attempt is admitted and recorded and an open
//!   circuit ends the retry loop.
//!
//! # Example
//!
//! ```
//! use reqwest_middleware::ClientBuilder;
//! use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
//! use tower_circuit_breaker::{Breaker, CircuitOpen};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let breaker = Breaker::builder().name("openai").consecutive_failures(5).build()?;
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(CircuitBreakerMiddleware::new(breaker.clone()))
//!     .build();
//!
//! breaker.force_open();
//! let err = client.get("http://127.0.0.1:9/v1/models").send().await.unwrap_err();
//! let open = match &err {
//!     reqwest_middleware::Error::Middleware(inner) => inner.downcast_ref::<CircuitOpen>(),
//!     reqwest_middleware::Error::Reqwest(_) => None,
//! };
//! assert_eq!(open.unwrap().key(), Some("openai"));
//! # Ok(()) }
//! ```
//!
//! [`reqwest_middleware::Middleware`]: https://docs.rs/reqwest-middleware/0.5/reqwest_middleware/trait.Middleware.html

use ::reqwest::{Request, Response};
use ::reqwest_middleware::{Error, Middleware, Next, Result};
use http::Extensions;

use crate::breaker::{Breaker, CircuitOpen};
use crate::classify::{Classify, ErrorRef};
use crate::future::judged;
use crate::guard::Guard;
use crate::integrations::DefaultClassifier;
use crate::service::Select;
use crate::CircuitBreakerLayer;

/// The rejection inside a reqwest-middleware error, if a circuit rejected the
/// call: this crate's middleware, or one further in whose error another
/// middleware wrapped.
///
/// ```
/// use tower_circuit_breaker::{reqwest_middleware::circuit_open, Breaker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().name("chat").build().unwrap();
/// breaker.force_open();
/// let err = reqwest_middleware::Error::middleware(breaker.admit().unwrap_err());
/// assert_eq!(circuit_open(&err).and_then(|open| open.key()), Some("chat"));
///
/// // Wrapped once more, as a middleware that annotates errors would.
/// let err = reqwest_middleware::Error::middleware(err);
/// assert!(circuit_open(&err).is_some());
/// # }
/// ```
#[must_use]
pub fn circuit_open(error: &Error) -> Option<&CircuitOpen> {
    crate::CircuitOpen::find(error)
}

/// A [`reqwest_middleware::Middleware`]
/// that asks a breaker before every request and records how it went.
///
/// See the [module docs](self) for an example.
///
/// ```
/// use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
/// use tower_circuit_breaker::Breaker;
///
/// let breaker = Breaker::builder().name("chat").build().unwrap();
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(CircuitBreakerMiddleware::new(breaker))
///     .build();
/// # let _ = client;
/// ```
///
/// [`reqwest_middleware::Middleware`]: https://docs.rs/reqwest-middleware/0.5/reqwest_middleware/trait.Middleware.html
#[derive(Debug, Clone)]
pub struct CircuitBreakerMiddleware<C = DefaultClassifier, P = Breaker> {
    select: P,
    classifier: C,
}

impl CircuitBreakerMiddleware {
    /// A middleware around `breaker`, classifying with
    /// [`LlmClassifier`](crate::classify::LlmClassifier).
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let middleware = CircuitBreakerMiddleware::new(Breaker::builder().name("chat").build().unwrap());
    /// assert_eq!(middleware.breaker().name(), Some("chat"));
    /// ```
    #[must_use]
    pub fn new(breaker: Breaker) -> Self {
        CircuitBreakerMiddleware {
            select: breaker,
            classifier: DefaultClassifier::default(),
        }
    }
}

impl<C> CircuitBreakerMiddleware<C> {
    /// The breaker, for snapshots and manual control.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
    /// use tower_circuit_breaker::{Breaker, State};
    ///
    /// let middleware = CircuitBreakerMiddleware::new(Breaker::builder().build().unwrap());
    /// middleware.breaker().force_open();
    /// assert_eq!(middleware.breaker().state(), State::ForcedOpen);
    /// ```
    pub fn breaker(&self) -> &Breaker {
        &self.select
    }
}

impl<C, P> CircuitBreakerMiddleware<C, P> {
    /// A middleware that chooses the breaker for each request with `select`
    /// (a [`Breaker`], or [`Keyed`](crate::keyed::Keyed) breakers keyed on the
    /// `reqwest::Request`) and classifies with `classifier`.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::LlmClassifier;
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// // One breaker per host, shared with a tower layer:
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// let layer = CircuitBreakerLayer::keyed(set, keyed::authority());
    /// let middleware = CircuitBreakerMiddleware::with_select(layer.select().clone(), LlmClassifier::new());
    /// # let _ = middleware;
    /// ```
    pub const fn with_select(select: P, classifier: C) -> Self {
        CircuitBreakerMiddleware { select, classifier }
    }

    /// Uses another classifier.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::HttpClassifier;
    /// use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let middleware = CircuitBreakerMiddleware::new(Breaker::builder().build().unwrap())
    ///     .with_classifier(HttpClassifier);
    /// # let _ = middleware;
    /// ```
    pub fn with_classifier<C2>(self, classifier: C2) -> CircuitBreakerMiddleware<C2, P> {
        CircuitBreakerMiddleware {
            select: self.select,
            classifier,
        }
    }

    /// What chooses the breaker for each request.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let breaker = Breaker::builder().build().unwrap();
    /// let middleware = CircuitBreakerMiddleware::new(breaker.clone());
    /// assert!(middleware.select().ptr_eq(&breaker));
    /// ```
    pub fn select(&self) -> &P {
        &self.select
    }

    /// The classifier.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{Classify, Verdict};
    /// use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
    /// use tower_circuit_breaker::{Breaker, Outcome};
    ///
    /// let middleware = CircuitBreakerMiddleware::new(Breaker::builder().build().unwrap());
    /// let verdict = middleware.classifier().classify_response(http::StatusCode::SERVICE_UNAVAILABLE, &http::HeaderMap::new());
    /// assert!(matches!(verdict, Verdict::Done(Outcome::Failure)));
    /// ```
    pub fn classifier(&self) -> &C {
        &self.classifier
    }
}

impl From<Breaker> for CircuitBreakerMiddleware {
    fn from(breaker: Breaker) -> Self {
        CircuitBreakerMiddleware::new(breaker)
    }
}

/// Shares the layer's breaker (or keyed breakers) and classifier.
impl<C: Clone, P: Clone> From<&CircuitBreakerLayer<C, P>> for CircuitBreakerMiddleware<C, P> {
    fn from(layer: &CircuitBreakerLayer<C, P>) -> Self {
        CircuitBreakerMiddleware::with_select(layer.select().clone(), layer.classifier().clone())
    }
}

#[async_trait::async_trait]
impl<C, P> Middleware for CircuitBreakerMiddleware<C, P>
where
    C: Classify + Send + Sync + 'static,
    C::Stream: Send + Sync + 'static,
    P: Select<Request> + Send + Sync + 'static,
{
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        // The guard lives in this future: dropping the call records nothing
        // but `Ignored`.
        let mut guard = Guard::admit(&self.select, &request).map_err(Error::middleware)?;
        let answer = next.run(request, extensions).await;
        judged::<adapter::Middleware, _, _, _>(&mut guard, &self.classifier, answer)
    }
}

mod adapter {
    use reqwest_middleware::Error;

    use crate::breaker::CircuitOpen;
    use crate::classify::ErrorRef;
    use crate::future::Adapt;
    use crate::integrations::ReqwestAdapter;

    /// reqwest-middleware's types: a `reqwest::Response` in and out,
    /// `reqwest_middleware::Error`.
    #[derive(Debug)]
    pub(crate) struct Middleware;

    impl Adapt for Middleware {
        type Refused = CircuitOpen;

        fn reject(open: CircuitOpen) -> CircuitOpen {
            open
        }
    }

    impl ReqwestAdapter<Error> for Middleware {
        type Error = Error;

        fn error(error: Error, judge: impl FnOnce(Option<ErrorRef<'_>>)) -> Error {
            judge(Some(super::inner_error(&error)));
            error
        }

        fn refused(open: CircuitOpen) -> Error {
            Error::middleware(open)
        }
    }
}

/// The error a classifier sees.
fn inner_error(error: &Error) -> ErrorRef<'_> {
    match error {
        Error::Reqwest(e) => e,
        Error::Middleware(e) => e.as_ref(),
    }
}
