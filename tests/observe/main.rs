//! Observability, each behind its feature: metrics through the `metrics`
//! facade scraped as Prometheus reads them, and the status page in a real
//! browser.
//!
//! `harness = false`: the runner in `runner.rs` reports the browser tests
//! as skipped, with why, when Chromium or chromedriver is missing (and the
//! fleet test when Redis is), and fails them with `CI=true`, instead of
//! counting them as passed.

#[cfg(feature = "metrics")]
mod metrics;
#[cfg(all(feature = "status", feature = "redis"))]
#[path = "../redis_support/mod.rs"]
mod redis_support;
#[path = "../support/runner.rs"]
mod runner;
#[cfg(feature = "status")]
mod status;

fn main() -> std::process::ExitCode {
    #[allow(unused_mut)]
    let mut trials: Vec<runner::Trial> = Vec::new();
    #[cfg(feature = "metrics")]
    trials.extend(metrics::trials());
    #[cfg(feature = "status")]
    trials.extend(status::trials());
    runner::run(trials)
}
