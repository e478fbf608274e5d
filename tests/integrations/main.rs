//! The integrations, each behind its feature: reqwest, reqwest-middleware,
//! async-openai and tonic.

#[cfg(any(feature = "reqwest", feature = "async-openai"))]
#[path = "../support_openai/mod.rs"]
mod support_openai;

#[cfg(all(
    feature = "reqwest",
    feature = "reqwest-middleware",
    feature = "async-openai"
))]
mod one_verdict;
#[cfg(feature = "tonic")]
mod tonic_status;
#[cfg(feature = "async-openai")]
mod with_async_openai;
#[cfg(feature = "reqwest")]
mod with_reqwest;
#[cfg(all(feature = "reqwest-middleware", feature = "reqwest"))]
mod with_reqwest_middleware;
