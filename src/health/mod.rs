//! Health probes: recovery found by the breaker's own cheap requests instead
//! of by users' calls.
//!
//! Without health probes, an open circuit learns that its upstream healed
//! only from the half-open probes it lets through after each open period:
//! real users' requests, which wait out the upstream's hang while it is
//! still broken, and which come only as often as the reopen backoff allows.
//! A [`HealthProbe`] sends its own request instead (a one-token completion,
//! `GET /v1/models`, `grpc.health.v1.Health/Check`) through the inner
//! service, every `interval` (with jitter) while the circuit is not closed,
//! with its own timeout, at most one in flight per breaker, classified by
//! the same [`Classify`] as real calls. A healthy answer ends the open period
//! at once: the circuit goes half-open, and real traffic confirms the heal
//! (see [`Breaker::record_health_probe`]). A 429, a quota answer or anything
//! else is not a heal. Health probes never enter the window, never advance
//! the reopen backoff, and are counted apart
//! ([`Counters::health_probe_successes`](crate::Counters::health_probe_successes)).
//!
//! The prober is a future that the caller spawns: the crate starts no task
//! of its own, and the prober's sleeps are the caller's (so it needs a
//! runtime with timers). A [`Stack`](crate::stack::Stack) builds its own
//! from a health request
//! ([`StackBuilder::health_probe`](crate::stack::StackBuilder::health_probe))
//! and hands it back as a [`HealthProber`], with
//! [`spawn_on`](HealthProber::spawn_on): no prober code needed. Its requests carry credentials; the crate never
//! logs them. A request factory that panics, or a probe that errors or
//! times out, is a counted failed health probe.
//!
//! Which request to send: `GET /v1/models` is free and quick, but an
//! OpenAI-compatible provider can keep answering it with 200 while its
//! completions fail, so it can end the open period too early (real traffic
//! then reopens the circuit). A one-token completion
//! ([`openai_completion_request`]) is the faithful probe and costs one
//! output token. A gRPC service answers `grpc.health.v1.Health/Check`
//! ([`grpc_health_request`], classified by [`GrpcHealthClassifier`], which
//! reads the body: `NOT_SERVING` comes with status 0).
//!
//! With the breaker shared across replicas through Redis (feature `redis`),
//! one replica probes for all: before each probe the prober asks Redis for
//! the breaker's turn (per key, for a keyed set), which the replica that took
//! it keeps by renewing it on each of its probes, and hands on by falling
//! silent for an interval plus a timeout. The others skip their ticks; a heal
//! ends the open period in the shared state, so every replica goes half-open
//! within a round trip of it. When Redis does not answer, every replica
//! probes on its own.
//!
//! None of the panic containment holds in a build with `panic = "abort"`.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower_circuit_breaker::classify::HttpClassifier;
//! use tower_circuit_breaker::health::HealthProbe;
//! use tower_circuit_breaker::{Breaker, BoxError, Outcome, State, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let breaker = Breaker::builder().trip_mode(TripMode::Open).consecutive_failures(1).jitter(0.0).build().unwrap();
//! // The upstream, as the prober sees it: healthy again.
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, BoxError>(http::Response::new(String::new()))
//! });
//! let prober = HealthProbe::builder(Duration::from_secs(2))
//!     .jitter(0.0)
//!     .build(upstream, HttpClassifier, |_breaker: &Breaker| {
//!         http::Request::get("http://upstream/v1/models").body(String::new()).unwrap()
//!     })
//!     .unwrap();
//! tokio::spawn(prober.run(breaker.clone()));
//!
//! breaker.admit().unwrap().record(Outcome::Failure);
//! assert_eq!(breaker.state(), State::Open);
//! tokio::time::sleep(Duration::from_secs(3)).await;
//! assert_eq!(breaker.state(), State::HalfOpen, "healed 27 s before the open period's end");
//! # }
//! ```

use std::fmt;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use tokio::time::Instant;
use tower_service::Service;

use crate::breaker::{Breaker, Outcome, State};
use crate::classify::{Classify, ClassifyStream, Verdict};
use crate::guard::{error_outcome, read_frame};
use crate::keyed::KeyedBreakers;
use crate::rng::Rng;
use crate::BoxError;

mod builder;
mod prober;
mod requests;

pub use self::builder::{HealthProbeBuilder, HealthProbeError};
pub use self::prober::HealthProber;
pub use self::requests::{
    anthropic_messages_request, grpc_health_request, openai_completion_request,
    openai_models_request, GrpcHealthClassifier, GrpcHealthStream, MakeHealthRequest,
};

/// Sends health probes while circuits are not closed; built by
/// [`HealthProbeBuilder`]. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::classify::LlmClassifier;
/// use tower_circuit_breaker::health::{openai_completion_request, HealthProbe};
/// use tower_circuit_breaker::{Breaker, BoxError};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().name("gpt-4o").build().unwrap();
/// let upstream = tower::service_fn(|_req: http::Request<bytes::Bytes>| async {
///     Ok::<_, BoxError>(http::Response::new(String::new()))
/// });
/// let prober = HealthProbe::builder(Duration::from_secs(5))
///     .build(upstream, LlmClassifier::default(), |_: &Breaker| {
///         openai_completion_request("http://127.0.0.1:9/v1", "sk-...", "gpt-4o").unwrap()
///     })
///     .unwrap();
/// // The caller spawns it; it sleeps until the circuit leaves closed.
/// let task = tokio::spawn(prober.run(breaker));
/// task.abort();
/// # }
/// ```
pub struct HealthProbe<S, C, F> {
    service: S,
    classifier: C,
    make_request: F,
    interval: Duration,
    timeout: Duration,
    jitter: f64,
    max_in_flight: usize,
    rng: Rng,
}

impl<S, C, F> fmt::Debug for HealthProbe<S, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthProbe")
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("jitter", &self.jitter)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

/// Whether health probes have anything to find out.
fn wants_probe(state: State) -> bool {
    matches!(state, State::Open | State::HalfOpen)
}

impl<S, C, F, B, RB> HealthProbe<S, C, F>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    C: Classify,
    F: Fn(&Breaker) -> Request<B>,
{
    fn next_wait(&self) -> Duration {
        self.interval
            .mul_f64(1.0 - self.jitter * self.rng.unit())
            .max(Duration::from_nanos(1))
    }

    /// How long a turn to probe lasts unless renewed: past the holder's next
    /// probe (an interval apart, or a timeout when probes outlast it), so the
    /// holder keeps it, and no longer, so another replica takes over soon
    /// when the holder is gone.
    fn turn_hold(&self) -> Duration {
        self.interval.saturating_add(self.timeout)
    }

    /// Probes `breaker` for as long as the returned future runs: while the
    /// circuit is open or half-open, one probe every interval (start to
    /// start, so a heal is found within one interval when the timeout is no
    /// longer than the interval); while it is closed, forced open or
    /// disabled, nothing (it waits for the next state change). With the
    /// breaker shared through Redis, a tick is skipped while another replica
    /// holds the turn to probe (see the [module docs](self)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::classify::HttpClassifier;
    /// use tower_circuit_breaker::health::HealthProbe;
    /// use tower_circuit_breaker::{Breaker, BoxError, Outcome, State, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder().trip_mode(TripMode::Open).consecutive_failures(1).jitter(0.0).build().unwrap();
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, BoxError>(http::Response::new(String::new()))
    /// });
    /// let prober = HealthProbe::builder(Duration::from_secs(1))
    ///     .jitter(0.0)
    ///     .build(upstream, HttpClassifier, |_: &Breaker| http::Request::new(String::new()))
    ///     .unwrap();
    /// tokio::spawn(prober.run(breaker.clone()));
    ///
    /// breaker.admit().unwrap().record(Outcome::Failure);
    /// tokio::time::sleep(Duration::from_millis(1_500)).await;
    /// assert_eq!(breaker.state(), State::HalfOpen, "the first probe found the upstream healthy");
    /// # }
    /// ```
    pub async fn run(mut self, breaker: Breaker) {
        loop {
            if !wants_probe(breaker.state()) {
                breaker.changed().await;
                continue;
            }
            let mut next = Instant::now() + self.next_wait();
            while wants_probe(breaker.state()) {
                tokio::time::sleep_until(next).await;
                next = Instant::now() + self.next_wait();
                if wants_probe(breaker.state())
                    && breaker.health_turn(self.turn_hold()).await
                    && wants_probe(breaker.state())
                {
                    let outcome = self.probe(&breaker).await;
                    breaker.record_health_probe(outcome);
                }
            }
        }
    }

    /// Sends one health probe to `breaker`'s upstream now, whatever its
    /// state, and returns what it found (without recording it).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::classify::HttpClassifier;
    /// use tower_circuit_breaker::health::HealthProbe;
    /// use tower_circuit_breaker::{Breaker, BoxError, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let breaker = Breaker::builder().build().unwrap();
    /// let broken = tower::service_fn(|_req: http::Request<String>| async {
    ///     let mut res = http::Response::new(String::new());
    ///     *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    ///     Ok::<_, BoxError>(res)
    /// });
    /// let mut prober = HealthProbe::builder(Duration::from_secs(5))
    ///     .build(broken, HttpClassifier, |_: &Breaker| http::Request::new(String::new()))
    ///     .unwrap();
    /// assert_eq!(prober.probe(&breaker).await, Outcome::Failure);
    /// # }
    /// ```
    pub async fn probe(&mut self, breaker: &Breaker) -> Outcome {
        let make = &self.make_request;
        probe_with(
            &mut self.service,
            &self.classifier,
            || make(breaker),
            self.timeout,
            breaker,
        )
        .await
    }
}

/// One probe: makes the request (a panicking factory is a failed probe),
/// sends it and classifies the answer, all within `timeout`.
async fn probe_with<S, C, B, RB>(
    service: &mut S,
    classifier: &C,
    make_request: impl FnOnce() -> Request<B>,
    timeout: Duration,
    breaker: &Breaker,
) -> Outcome
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    C: Classify,
{
    let Ok(request) = catch_unwind(AssertUnwindSafe(make_request)) else {
        tracing::error!(
            target: "tower_circuit_breaker",
            key = breaker.name().unwrap_or(""),
            "the health probe's request factory panicked"
        );
        return Outcome::Failure;
    };
    let attempt = async {
        let ready = poll_fn(|cx| service.poll_ready(cx)).await;
        match ready.map_err(Into::into) {
            Ok(()) => {
                let answer = service.call(request).await.map_err(Into::into);
                classify(classifier, answer, breaker).await
            }
            Err(e) => error_outcome(classifier, &*e),
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(Outcome::Failure)
}

impl<S, C, F, B, RB> HealthProbe<S, C, F>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    RB: Body,
    C: Classify,
    F: Fn(&Breaker) -> Request<B>,
{
    /// Probes every key of `set` whose circuit is open or half-open, every
    /// interval, at most [`max_in_flight`](HealthProbeBuilder::max_in_flight)
    /// at once, for as long as the returned future runs. The factory gets
    /// each key's breaker (its [`name`](Breaker::name) is the key). With the
    /// set shared through Redis, each key has its own turn to probe.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::classify::HttpClassifier;
    /// use tower_circuit_breaker::health::HealthProbe;
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::{Breaker, BoxError, Outcome, State, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let set = KeyedBreakers::builder().trip_mode(TripMode::Open).consecutive_failures(1).jitter(0.0).build().unwrap();
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, BoxError>(http::Response::new(String::new()))
    /// });
    /// // The factory sees each key's breaker: route the probe by its name.
    /// let prober = HealthProbe::builder(Duration::from_secs(1))
    ///     .jitter(0.0)
    ///     .build(upstream, HttpClassifier, |b: &Breaker| {
    ///         http::Request::get(format!("http://gateway/{}/health", b.name().unwrap_or("")))
    ///             .body(String::new())
    ///             .unwrap()
    ///     })
    ///     .unwrap();
    /// tokio::spawn(prober.run_keyed(set.clone()));
    ///
    /// set.admit("gpt-4o").unwrap().record(Outcome::Failure);
    /// tokio::time::sleep(Duration::from_millis(1_500)).await;
    /// assert_eq!(set.get("gpt-4o").unwrap().state(), State::HalfOpen);
    /// # }
    /// ```
    pub async fn run_keyed(self, set: KeyedBreakers) {
        let mut next = Instant::now() + self.next_wait();
        loop {
            tokio::time::sleep_until(next).await;
            next = Instant::now() + self.next_wait();
            let open: Vec<Breaker> = set
                .breakers()
                .into_iter()
                .filter(|b| wants_probe(b.state()))
                .collect();
            let hold = self.turn_hold();
            for chunk in open.chunks(self.max_in_flight) {
                let (classifier, make) = (&self.classifier, &self.make_request);
                let probes = chunk.iter().map(|breaker| {
                    let mut service = self.service.clone();
                    async move {
                        if !breaker.health_turn(hold).await {
                            return;
                        }
                        let outcome = probe_with(
                            &mut service,
                            classifier,
                            || make(breaker),
                            self.timeout,
                            breaker,
                        )
                        .await;
                        breaker.record_health_probe(outcome);
                    }
                });
                join_all(probes.collect()).await;
            }
        }
    }
}

/// Polls every future to completion, concurrently, in the caller's task.
async fn join_all<T: Future<Output = ()>>(futures: Vec<T>) {
    let mut futures: Vec<Option<Pin<Box<T>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for slot in &mut futures {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
}

/// Classifies a probe's answer as the guard judges a call: an error by the
/// guard's error rule (a breaker's rejection inside it is
/// [`Outcome::Ignored`], a passed stream deadline a failure, anything else
/// the classifier's), a head by the classifier, and a deferred verdict by
/// reading the body to its end as a call's body is read.
async fn classify<C: Classify, RB: Body>(
    classifier: &C,
    answer: Result<Response<RB>, BoxError>,
    breaker: &Breaker,
) -> Outcome {
    let response = match answer {
        Ok(response) => response,
        Err(e) => return error_outcome(classifier, &*e),
    };
    let (head, body) = response.into_parts();
    let mut stream = match classifier.classify_response(head.status, &head.headers) {
        Verdict::Done(outcome) => return outcome,
        Verdict::Defer(stream) => stream,
    };
    let mut body = std::pin::pin!(body);
    if body.is_end_stream() {
        breaker.charge_health_probe(|| stream.charge());
        return stream.on_end();
    }
    loop {
        let frame = poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        if let Some(end) = read_frame(&mut stream, &frame, || body.is_end_stream()) {
            breaker.charge_health_probe(|| stream.charge());
            return end.outcome(stream);
        }
    }
}
