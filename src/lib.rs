//! A circuit breaker for [tower] HTTP clients, built for LLM traffic: slow,
//! costly, bursty calls where an ordinary breaker either never trips or trips
//! on the wrong errors.
//!
//! Wrap any `tower::Service` that answers with an `http::Response` (a
//! hyper-util client, a tonic channel, an axum route; reqwest through
//! [`ReqwestService`](crate::reqwest::ReqwestService) with the `reqwest` feature).
//! Before every call the [`Breaker`] decides whether the upstream deserves
//! it; after the call a [classifier](classify) decides what it said about the
//! upstream's health: [`Outcome::Success`], [`Outcome::Failure`],
//! [`Outcome::Ignored`] (a 400, a cancelled call) or [`Outcome::RateLimited`]
//! (a 429, passed through).
//!
//! # For LLM clients: [`Stack`]
//!
//! [`Stack`] builds the whole client stack in the order that works — total
//! timeout, retry, breaker, attempt timeout — and checks that its pieces fit;
//! [`Stack::keyed`] does the same with a breaker per model or key. With a
//! health request ([`stack::StackBuilder::health_probe`]) it also hands back
//! the prober that finds the heal while the circuit is open.
//!
//! ```
//! use std::time::Duration;
//! use tower::{Layer, Service, ServiceExt};
//! use tower_circuit_breaker::classify::LlmClassifier;
//! use tower_circuit_breaker::{Breaker, Stack, State};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_circuit_breaker::BoxError> {
//! // An LLM API that is down.
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(
//!         http::Response::builder().status(503).body(String::new()).unwrap(),
//!     )
//! });
//! let layer = Stack::builder()
//!     .attempt_timeout(Duration::from_secs(60))
//!     .breaker(Breaker::builder().count_window(20).min_calls(10).failure_rate(0.5))
//!     .classifier(LlmClassifier::default())
//!     .build()?;
//! let handle = layer.breaker().clone();
//! let mut client = layer.layer(upstream);
//! for _ in 0..10 {
//!     let _ = client.ready().await?.call(http::Request::new(String::new())).await;
//! }
//! // Ten failed calls (and their retries) tripped it: the next calls fail at
//! // once, without reaching the upstream.
//! assert_eq!(handle.state(), State::Open);
//! # Ok(()) }
//! ```
//!
//! # Any tower service: the bare layer
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::{CircuitBreakerLayer, CircuitOpen, State};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // An upstream that is down.
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(
//!         http::Response::builder().status(503).body(String::new()).unwrap(),
//!     )
//! });
//!
//! let breaker = CircuitBreakerLayer::builder()
//!     .count_window(20)          // the last 20 calls
//!     .min_calls(10)             // once 10 are seen
//!     .failure_rate(0.5)         // open at 50 % failures
//!     .open_duration(Duration::from_secs(30))
//!     .probes(3)                 // then 3 half-open probes
//!     .close_after(2)            // of which 2 must succeed
//!     .build()?;
//! let handle = breaker.breaker().clone();
//!
//! let mut client = ServiceBuilder::new()
//!     .layer(breaker)
//!     .timeout(Duration::from_secs(60)) // attempt timeout: inside, so it counts
//!     .service(upstream);
//!
//! for _ in 0..10 {
//!     let res = client.ready().await?.call(http::Request::new(String::new())).await?;
//!     assert_eq!(res.status(), 503);
//! }
//! assert_eq!(handle.state(), State::Open);
//!
//! // Now calls fail fast, without reaching the upstream.
//! let err = client.ready().await?.call(http::Request::new(String::new())).await.unwrap_err();
//! let err: tower_circuit_breaker::BoxError = err.into();
//! assert!(CircuitOpen::find(&*err).is_some());
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `reqwest` | [`reqwest`]: a tower service around `reqwest::Client`, `ReqwestClient`, `send_through` |
//! | `reqwest-middleware` | a `reqwest_middleware::Middleware` sharing a stack's breaker |
//! | `async-openai` | a service for `async_openai::Client::with_http_service` |
//! | `tonic` | an open circuit as `tonic::Status` `UNAVAILABLE` |
//! | `metrics` | calls, rejections, transitions, state and time to first byte through the `metrics` facade |
//! | `status` | a status page (JSON and HTML) of every breaker and key, as a tower service |
//! | `testing` | a scripted upstream in paused time for testing your own service against an outage |
//! | `redis` | shared state across replicas through Redis (`redis-cluster`, `redis-tls` for Redis Cluster and `rediss://`) |
//!
//! # Examples
//!
//! Each starts its own local servers and finishes by itself
//! (`cargo run --example NAME`, with its feature where it needs one):
//! `quickstart` (the stack with a health prober, against an upstream that
//! fails and heals), `hyper_client`, `axum_app`, `tonic_client`,
//! `keyed_memory`, `reqwest_client`, `reqwest_middleware_client`,
//! `async_openai_client`, `tonic_status`, `prometheus`, `status_page`,
//! `redis_replicas`, `redis_overhead`, `redis_fleet`, and `outage_replay`,
//! which replays an incident against stacks with and without the breaker
//! (`scenarios/`). The README lists what each shows.
//!
//! # How a request flows
//!
//! [`CircuitBreaker::call`](https://docs.rs/tower-service/0.3/tower_service/trait.Service.html#tymethod.call) asks
//! [`Breaker::admit`] for a [`Permit`]. A closed circuit admits without a lock;
//! an open one returns a ready [`future::ResponseFuture`] holding
//! [`CircuitOpen`]. An admitted call runs the inner future; its response head
//! or error goes to the [`Classify`](classify::Classify) implementation, which
//! decides at once or defers to the end of the body ([`ResponseBody`]). The
//! permit then records the [`Outcome`], and the trip rules are evaluated.
//!
//! # Traffic controls beyond open and closed
//!
//! All opt-in, and each respects [`Breaker::set_metrics_only`] (counts what
//! it would reject, rejects nothing) and [`Breaker::disable`]:
//!
//! - **stream deadlines** ([`deadline`]): the first token, stalls and the
//!   total stream time, with one table of every deadline a call can meet;
//! - **a retry budget** ([`retry::RetryBudget`]): retries at most a
//!   percentage of first attempts over 10 s;
//! - **every upstream open** ([`failover::AllOpen`]): fail fast with the
//!   soonest retry time, or one last-resort call per open period;
//! - **fallback by error kind** ([`kind::ReadKind`],
//!   [`Failover::on_kind`](failover::Failover::on_kind)): a context-length
//!   400 to a long-context member, a refusal to another provider, a refused
//!   key to the next, read from bounded error bodies beside the outcome;
//! - **selection** ([`failover::Selection`]): the member tried first among
//!   equivalent ones, by a peak-EWMA of time to first byte or by price;
//! - **quota gating** ([`Builder::quota_gate`]): an exhausted quota opens
//!   that key's circuit until its reset, with [`Rejection::Quota`];
//! - **pacing** ([`Builder::pace_rate_limits`]): a known rate limit makes
//!   that key reject locally with [`Rejection::RateLimited`] until it
//!   resets, so no call is spent to hear "429" again.
//!
//! [tower]: https://docs.rs/tower/0.5/tower/

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![warn(clippy::pedantic)]
#![allow(
    clippy::cast_precision_loss,
    reason = "counts and nanoseconds become f64 only for rates, shares and averages, \
              which need no more than f64's 53 bits"
)]
#![allow(
    clippy::doc_markdown,
    reason = "names in prose (OpenAI, SSE, LiteLLM) are words, not code to format"
)]
#![allow(
    clippy::missing_fields_in_debug,
    reason = "Debug output leaves out locks, closures and caches on purpose"
)]
#![allow(
    clippy::redundant_closure_for_method_calls,
    clippy::explicit_iter_loop,
    clippy::many_single_char_names,
    clippy::similar_names,
    clippy::inline_always,
    clippy::wildcard_imports,
    clippy::too_many_lines,
    clippy::items_after_statements,
    clippy::semicolon_if_nothing_returned,
    clippy::unnested_or_patterns,
    clippy::struct_excessive_bools,
    clippy::ignored_unit_patterns,
    clippy::match_bool,
    clippy::single_match_else,
    clippy::unnecessary_wraps,
    clippy::if_not_else,
    clippy::map_unwrap_or,
    clippy::match_same_arms,
    clippy::match_wildcard_for_single_variants,
    clippy::elidable_lifetime_names,
    clippy::ref_option,
    clippy::unused_self,
    clippy::needless_pass_by_value,
    reason = "style lints of the pedantic group that change nothing a user sees; \
              the codebase keeps its own style"
)]
#![cfg_attr(
    test,
    allow(
        clippy::pedantic,
        reason = "unit tests ignore results and cast freely on purpose"
    )
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
pub mod breaker;
pub mod classify;
pub mod deadline;
pub mod error;
pub mod failover;
mod fallback;
pub mod future;
mod guard;
pub mod health;
pub mod keyed;
pub mod kind;
mod layer;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
pub mod response;
pub mod retry;
mod rng;
mod service;
pub mod spend;
pub mod stack;
#[cfg(feature = "status")]
#[cfg_attr(docsrs, doc(cfg(feature = "status")))]
pub mod status;
mod sync;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

#[cfg(any(
    feature = "reqwest",
    feature = "reqwest-middleware",
    feature = "async-openai"
))]
mod integrations;

#[cfg(feature = "async-openai")]
#[cfg_attr(docsrs, doc(cfg(feature = "async-openai")))]
pub mod async_openai;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub mod reqwest;
#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
pub mod reqwest_middleware;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod tonic;

pub use crate::body::ResponseBody;
pub use crate::breaker::InFlightLimit;
pub use crate::breaker::{
    Breaker, Build, Builder, Changed, ConfigError, Counters, Permit, Reason, Remote, Shed,
    Snapshot, State, Thresholds, Transition, TripMode, Window, WindowStats,
};
pub use crate::classify::Outcome;
pub use crate::error::{CircuitOpen, Error, Rejection};
pub use crate::failover::Failover;
pub use crate::fallback::{Fallback, HasFallback, Retried};
pub use crate::layer::CircuitBreakerLayer;
pub use crate::retry::RetryPolicy;
pub use crate::service::{CircuitBreaker, Select};
pub use crate::stack::{Stack, StackLayer};

/// The boxed error type used across tower.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The README's Rust blocks run as doc tests, so its quick start compiles.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
