//! [`HealthProber`]: a stack's health prober, a future for the caller to
//! run.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The health prober of a [`Stack`](crate::stack::Stack) built with
/// [`health_probe`](crate::stack::StackBuilder::health_probe): a future that
/// probes the stack's breaker (or every open key of its keyed set) for as
/// long as it runs, and never ends on its own.
///
/// The crate starts no task for it: await it in a task of yours, or hand it
/// to a runtime with [`spawn_on`](Self::spawn_on). It sleeps on Tokio's
/// timers, so the runtime it runs on needs them
/// ([`enable_time`](https://docs.rs/tokio/1/tokio/runtime/struct.Builder.html#method.enable_time), which
/// `#[tokio::main]` turns on).
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use tower::Layer;
/// use tower_circuit_breaker::health::{openai_models_request, HealthProbe};
/// use tower_circuit_breaker::stack::Stack;
/// use tower_circuit_breaker::BoxError;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxError> {
/// let layer = Stack::builder()
///     .health_probe(
///         HealthProbe::builder(Duration::from_secs(5)),
///         openai_models_request::<Bytes>("http://127.0.0.1:9/v1", "sk-test")?,
///     )
///     .build()?;
/// let client = layer.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
///     Ok::<_, BoxError>(http::Response::new(String::new()))
/// }));
/// let prober = client.health_prober().expect("built with a health request");
/// let task = prober.spawn_on(&tokio::runtime::Handle::current());
/// task.abort();
/// # Ok(()) }
/// ```
pub struct HealthProber {
    future: Pin<Box<dyn Future<Output = ()> + Send + 'static>>,
}

impl HealthProber {
    pub(crate) fn new(future: impl Future<Output = ()> + Send + 'static) -> Self {
        HealthProber {
            future: Box::pin(future),
        }
    }

    /// Spawns the prober on `handle`'s runtime; abort the returned handle
    /// to stop it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower::Layer;
    /// use tower_circuit_breaker::health::{openai_models_request, HealthProbe};
    /// use tower_circuit_breaker::stack::Stack;
    /// use tower_circuit_breaker::BoxError;
    ///
    /// // Built outside any runtime; spawned on one given by name.
    /// let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    /// let layer = Stack::builder()
    ///     .health_probe(
    ///         HealthProbe::builder(Duration::from_secs(5)),
    ///         openai_models_request::<Bytes>("http://127.0.0.1:9/v1", "sk-test")?,
    ///     )
    ///     .build()?;
    /// let client = layer.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
    ///     Ok::<_, BoxError>(http::Response::new(String::new()))
    /// }));
    /// let task = client.health_prober().unwrap().spawn_on(runtime.handle());
    /// task.abort();
    /// # Ok::<_, BoxError>(())
    /// ```
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is a by-product"
    )]
    pub fn spawn_on(self, handle: &Handle) -> JoinHandle<()> {
        handle.spawn(self)
    }
}

impl Future for HealthProber {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.future.as_mut().poll(cx)
    }
}

impl fmt::Debug for HealthProber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthProber").finish_non_exhaustive()
    }
}
