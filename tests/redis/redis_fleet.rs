//! The fleet soak (`examples/redis_fleet`) at 50 replicas: every round's
//! change reaches every replica. Slow in a debug build, so it runs in
//! release in `.ci/run` (`--ignored`); the example runs it at any size.

#[path = "../../examples/redis_fleet/soak.rs"]
#[allow(dead_code)]
mod soak;

use crate::redis_support::{self, shared_url, unique_prefix};
use crate::runner::{Rt, Trial};

async fn fifty_replicas_on_one_redis_converge_every_round() {
    if redis_support::skip() {
        return;
    }
    let plan = soak::Plan::new(shared_url(), 50, 1_000, 40);
    let mut f = soak::run(&plan, &unique_prefix("fleet")).await;
    assert_eq!(f.rounds, 40);
    assert_eq!(f.diverged, 0, "{f:?}");
    assert!(!f.trip.is_empty(), "trips were measured");
    let (_, p99, _) = soak::spread(&mut f.trip).unwrap();
    eprintln!(
        "50 replicas: trip p99 {p99:.1} ms, {} commands in {:?}",
        f.commands, f.elapsed
    );
}

pub fn trials() -> Vec<Trial> {
    vec![Trial::tokio(
        "redis_fleet::fifty_replicas_on_one_redis_converge_every_round",
        Rt::Multi,
        fifty_replicas_on_one_redis_converge_every_round,
    )
    .ignored()]
}
