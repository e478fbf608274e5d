//! A scripted upstream for testing your own service against an outage, in
//! paused time (feature `testing`).
//!
//! [`ScriptedUpstream`] is a `tower::Service<http::Request<B>>` that stands
//! in for an LLM API. Its [`Script`] is a list of [`Phase`]s, each a mix of
//! [`Answer`]s drawn with given probabilities: good answers (JSON or event
//! streams), error statuses, a 429 with `Retry-After`, hangs, connection
//! resets, a stream that breaks with an `event: error`, a stream that
//! stalls; latencies fixed, lognormal or ramping; and optionally a capacity
//! beyond which calls queue and then get a 429, and a request
//! [`RateLimit`] announced in `x-ratelimit-*` headers. Every delay runs on Tokio's
//! clock, so under `tokio::time::pause()` a ten-minute outage replays in
//! milliseconds, and every draw comes from a seed, so it replays the same
//! way every time. Put it under your own stack where your HTTP client
//! would go; its [`AttemptLog`] tells you what reached it and when.
//!
//! It is the upstream of the crate's outage replay
//! (`cargo run --release --example outage_replay`).
//!
//! # Example
//!
//! An axum app whose route calls an LLM through the breaker and answers
//! `503` with `Retry-After` itself while the LLM is known to be down,
//! tested against a scripted outage:
//!
//! ```
//! use std::time::Duration;
//! use axum::body::Body;
//! use axum::error_handling::HandleErrorLayer;
//! use axum::response::{IntoResponse, Response};
//! use axum::Router;
//! use http::{Request, StatusCode};
//! use tower::util::BoxCloneSyncService;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::response::service_unavailable;
//! use tower_circuit_breaker::testing::{Answer, Phase, Script, ScriptedBody, ScriptedUpstream};
//! use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, ConfigError, TripMode};
//!
//! // --- the app under test: your own code ---
//!
//! /// The LLM client the app is given: a hyper-util client in production.
//! type Llm = BoxCloneSyncService<Request<Body>, http::Response<Body>, BoxError>;
//!
//! async fn on_error(err: tower_circuit_breaker::Error) -> Response {
//!     match err.circuit_open() {
//!         Some(open) => service_unavailable(open),
//!         None => (StatusCode::BAD_GATEWAY, err.to_string()).into_response(),
//!     }
//! }
//!
//! fn app(llm: Llm) -> Result<Router, ConfigError> {
//!     let breaker = CircuitBreakerLayer::builder()
//!         .trip_mode(TripMode::Open)
//!         .consecutive_failures(3)
//!         .open_duration(Duration::from_secs(30))
//!         .max_open_duration(Duration::from_secs(30))
//!         .probes(1)
//!         .close_after(1)
//!         // Exact open periods keep the figures below easy to check by
//!         // hand; the test would repeat with jitter too (see below).
//!         .jitter(0.0)
//!         .build()?;
//!     let chat = ServiceBuilder::new()
//!         .layer(HandleErrorLayer::new(on_error))
//!         .layer(breaker)
//!         .timeout(Duration::from_secs(10))
//!         .service(llm);
//!     Ok(Router::new().route_service("/v1/chat", chat))
//! }
//!
//! // --- the test ---
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Fine for a minute, then 503s after 2 s each for two minutes, then fine.
//! let script = Script::builder()
//!     .phase(Phase::new(Duration::ZERO).answer(1.0, Answer::ok().after(Duration::from_millis(500))))
//!     .phase(Phase::new(Duration::from_secs(60)).answer(1.0, Answer::status(503).after(Duration::from_secs(2))))
//!     .phase(Phase::new(Duration::from_secs(180)).answer(1.0, Answer::ok().after(Duration::from_millis(500))))
//!     .build()?;
//! let upstream = ScriptedUpstream::new(script);
//! let log = upstream.log().clone();
//! let llm = ServiceBuilder::new()
//!     .map_response(|r: http::Response<ScriptedBody>| r.map(Body::new))
//!     .service(upstream);
//! let app = app(Llm::new(llm))?;
//!
//! // A user every second (or as soon as the one before is answered) for
//! // five minutes.
//! let start = tokio::time::Instant::now();
//! let mut statuses = Vec::new();
//! for s in 0..300 {
//!     tokio::time::sleep_until(start + Duration::from_secs(s)).await;
//!     let req = Request::post("/v1/chat").body(Body::from(r#"{"model":"gpt-4o"}"#))?;
//!     let res = app.clone().oneshot(req).await?;
//!     let shed = res.headers().contains_key("retry-after");
//!     statuses.push((s, res.status(), shed));
//! }
//!
//! // Fine before the outage, fine again after it.
//! assert!(statuses[..60].iter().all(|&(_, status, _)| status == StatusCode::OK));
//! assert_eq!(statuses.last().unwrap().1, StatusCode::OK);
//! // During it, three 503s from the LLM opened the circuit. From then on
//! // the app answered 503 with `Retry-After` at once, without calling the
//! // LLM, but for one probe each 30 s (three before the heal).
//! let outage = &statuses[60..180];
//! let passed_on = outage.iter().filter(|&&(_, status, shed)| status == 503 && !shed);
//! assert_eq!(passed_on.count(), 3 + 3);
//! assert_eq!(outage.iter().filter(|&&(_, _, shed)| shed).count(), 120 - 6);
//! let reached = log.attempts().iter().filter(|a| (60..180).contains(&a.at.as_secs())).count();
//! assert_eq!(reached, 3 + 3);
//! # Ok(()) }
//! ```
//!
//! # Repeatable jitter
//!
//! A test through [`Stack`](crate::stack::Stack), a
//! [`RetryPolicy`](crate::retry::RetryPolicy), a
//! [`Failover`](crate::failover::Failover), a breaker with jitter or a
//! health probe repeats run after run with no seed of its own: with this
//! feature, jitter that was given no seed (`seed` on the builder or policy)
//! is seeded from the script. Making a [`ScriptedUpstream`] gives its
//! thread the script's [seed](ScriptBuilder::seed); every unseeded
//! generator takes its seed, in turn, at its first draw on that thread, so
//! components built before the upstream (an app's stack, say) are seeded
//! too. On a current-thread runtime in paused time (`#[tokio::test]` with
//! `start_paused = true`) the draws come in the same order every run, so
//! every wait repeats; another script seed gives other waits. Draws first
//! made on other threads (a multi-thread runtime's workers) stay random: seed
//! those components yourself.
//!
//! This holds in any binary built with the `testing` feature, which is
//! meant for tests: a production binary that enables it gets jitter seeded
//! from the last script made on each thread, or random where none was.

mod answer;
mod body;
mod rate_limit;
mod script;
mod upstream;

pub use self::answer::{Answer, Latency};
pub use self::body::ScriptedBody;
pub use self::rate_limit::RateLimit;
pub use self::script::{Capacity, Phase, Script, ScriptBuilder, ScriptError};
pub use self::upstream::{Attempt, AttemptLog, ResponseFuture, ScriptedUpstream};

use std::time::Duration;

/// The gap between two tokens of a streamed answer that sends tokens (see
/// [`ScriptBuilder::stream_tokens`]), and of a [`Stall`](Answer::Stall)
/// before it stalls.
///
/// ```
/// assert_eq!(tower_circuit_breaker::testing::TOKEN_GAP.as_millis(), 100);
/// ```
pub const TOKEN_GAP: Duration = Duration::from_millis(100);
