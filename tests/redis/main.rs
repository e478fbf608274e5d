//! Shared state through real Redis servers: one node, a cluster, TLS.

#[cfg(feature = "redis")]
#[path = "../redis_support/mod.rs"]
mod redis_support;

#[cfg(feature = "redis-cluster")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_fleet;
#[cfg(feature = "redis")]
mod redis_health;
#[cfg(feature = "redis")]
mod redis_overflow_key;
#[cfg(feature = "redis")]
mod redis_shared;
#[cfg(feature = "redis-tls")]
mod redis_tls;
