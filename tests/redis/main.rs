//! Shared state through real Redis servers: one node, a cluster, TLS.
//!
//! `harness = false`: the runner in `tests/support/runner.rs` reports a test
//! that finds no Redis as skipped, with why (and fails it with `CI=true`),
//! instead of counting it as passed.

#[cfg(feature = "redis")]
#[path = "../redis_support/mod.rs"]
mod redis_support;
#[path = "../support/runner.rs"]
mod runner;

#[cfg(feature = "redis-cluster")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_fleet;
#[cfg(feature = "redis")]
mod redis_health;
#[cfg(feature = "redis")]
mod redis_messages;
#[cfg(feature = "redis")]
mod redis_overflow_key;
#[cfg(feature = "redis")]
mod redis_shared;
#[cfg(feature = "redis")]
mod redis_spend;
#[cfg(feature = "redis-tls")]
mod redis_tls;

fn main() -> std::process::ExitCode {
    #[allow(unused_mut)]
    let mut trials: Vec<runner::Trial> = Vec::new();
    #[cfg(feature = "redis-cluster")]
    trials.extend(redis_cluster::trials());
    #[cfg(feature = "redis")]
    {
        trials.extend(redis_fleet::trials());
        trials.extend(redis_health::trials());
        trials.extend(redis_messages::trials());
        trials.extend(redis_overflow_key::trials());
        trials.extend(redis_shared::trials());
        trials.extend(redis_spend::trials());
    }
    #[cfg(feature = "redis-tls")]
    trials.extend(redis_tls::trials());
    runner::run(trials)
}
