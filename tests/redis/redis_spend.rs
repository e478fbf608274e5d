//! The spend guard shared through a real Redis server: replicas of one
//! breaker, each with its own backend, spending one budget.
//!
//! Real time is unavoidable with a real server: every wait is bounded, and
//! no assertion is about how long anything took.

use crate::redis_support;
use crate::runner::{Rt, Trial};

use std::time::Duration;

use redis::AsyncCommands;
use tower_circuit_breaker::redis::Attachment;
use tower_circuit_breaker::spend::{Charge, Period, SpendGuard};
use tower_circuit_breaker::{Breaker, Outcome, Permit, Rejection, TripMode};

use redis_support::{backend, connection, eventually, shared_url, unique_prefix};

const WAIT: Duration = Duration::from_secs(5);

/// What the backends' flush interval is (`redis_support::backend`): the
/// exchange interval of the bound.
const FLUSH: Duration = Duration::from_millis(20);

/// The fleet's spend as the store holds it, summed over its slices.
async fn stored_spend(prefix: &str, name: &str) -> u64 {
    let mut conn = connection(shared_url()).await;
    let key = format!("{{{prefix}:{name}}}:v2:spend:usd_micros:r3600000");
    let all: Vec<(String, u64)> = conn.hgetall(key).await.unwrap();
    all.iter().map(|(_, v)| v).sum()
}

/// `n` replicas of the breaker `name` under `guard`, each with its own
/// backend, once every one reaches Redis.
async fn replicas(
    n: usize,
    prefix: &str,
    name: &str,
    guard: SpendGuard,
) -> Vec<(Breaker, Attachment)> {
    let mut replicas = Vec::new();
    for _ in 0..n {
        let breaker = Breaker::builder()
            .trip_mode(TripMode::Open)
            .name(name)
            .spend_guard(guard)
            .build()
            .unwrap();
        let attachment = backend(shared_url(), prefix)
            .build()
            .unwrap()
            .attach(&breaker)
            .unwrap();
        replicas.push((breaker, attachment));
    }
    let shared = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|(_, a): &(Breaker, Attachment)| a.is_shared())
    })
    .await;
    assert!(shared, "every replica reaches redis");
    replicas
}

async fn three_replicas_share_one_budget_within_the_stated_overshoot() {
    if redis_support::skip() {
        return;
    }
    const REPLICAS: usize = 3;
    const IN_FLIGHT: usize = 2; // per replica
    const COST: u64 = 10_000; // one cent a call
    const BUDGET: u64 = 1_000_000; // $1: a hundred calls
    let prefix = unique_prefix("spend");
    let guard = SpendGuard::micro_dollars(BUDGET, Period::Rolling(Duration::from_secs(3600)));
    let replicas = replicas(REPLICAS, &prefix, "llm", guard).await;

    // Each replica keeps two calls in flight and finishes the older one at
    // every tick of the flush interval: at most two calls admitted per
    // replica within one exchange interval.
    let mut in_flight: Vec<Vec<Permit>> = (0..REPLICAS).map(|_| Vec::new()).collect();
    let mut charged = 0u64;
    let mut rejected = [false; REPLICAS];
    let mut tick = tokio::time::interval(FLUSH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..(3 * BUDGET / COST) {
        tick.tick().await;
        for (i, (breaker, _)) in replicas.iter().enumerate() {
            if in_flight[i].len() == IN_FLIGHT {
                let mut permit = in_flight[i].remove(0);
                permit.charge(Charge::Observed(COST));
                permit.record(Outcome::Success);
                charged += COST;
            }
            match breaker.admit() {
                Ok(permit) => in_flight[i].push(permit),
                Err(open) => {
                    assert_eq!(open.reason(), Rejection::SpendExceeded);
                    rejected[i] = true;
                }
            }
        }
        if rejected.iter().all(|&r| r) {
            break;
        }
    }
    assert!(
        rejected.iter().all(|&r| r),
        "every replica rejects: {rejected:?}"
    );
    // The calls still in flight complete and are charged too.
    for permits in &mut in_flight {
        for mut permit in permits.drain(..) {
            permit.charge(Charge::Observed(COST));
            permit.record(Outcome::Success);
            charged += COST;
        }
    }

    // The bound: (calls in flight + one exchange interval's calls) × the
    // largest call cost, across the fleet. One interval's calls: two per
    // replica (a tick at each end of the interval).
    let bound = BUDGET + (REPLICAS * IN_FLIGHT + REPLICAS * 2) as u64 * COST;
    assert!(charged >= BUDGET, "the budget was spent: {charged}");
    assert!(
        charged <= bound,
        "the fleet spent {charged} of a {BUDGET} budget, past the bound {bound}"
    );

    // Everything charged reaches the store, and every replica, told the
    // fleet's total, keeps rejecting with `SpendExceeded`.
    let stored = eventually(WAIT, || async {
        stored_spend(&prefix, "llm").await == charged
    })
    .await;
    assert!(
        stored,
        "the store sums every replica's charges: {} of {charged}",
        stored_spend(&prefix, "llm").await
    );
    let all_told = eventually(WAIT, || async {
        replicas
            .iter()
            .all(|(b, _)| b.snapshot().spend.is_some_and(|s| s.spent == charged))
    })
    .await;
    assert!(all_told, "every replica reads the fleet's spend");
    for (breaker, _) in &replicas {
        let open = breaker.admit().unwrap_err();
        assert_eq!(open.reason(), Rejection::SpendExceeded);
        let exceeded = open.spend().unwrap();
        assert_eq!((exceeded.spent(), exceeded.budget()), (charged, BUDGET));
    }
    for (_, attachment) in replicas {
        attachment.detach().await;
    }
}

async fn a_replica_that_spent_nothing_rejects_once_the_fleet_spent_the_budget() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("spend-idle");
    let guard = SpendGuard::tokens(1_000, Period::UtcDay);
    let replicas = replicas(2, &prefix, "embed", guard).await;
    let (spender, idle) = (&replicas[0].0, &replicas[1].0);
    let mut permit = spender.admit().unwrap();
    permit.charge(Charge::Observed(1_200));
    permit.record(Outcome::Success);
    assert_eq!(
        spender.admit().unwrap_err().reason(),
        Rejection::SpendExceeded
    );

    // The idle replica admitted nothing, so only the spender's word (its
    // announcement, or the next resync) tells it.
    let told = eventually(WAIT, || async {
        idle.snapshot().spend.is_some_and(|s| s.exceeded)
    })
    .await;
    assert!(told, "the idle replica learns the fleet's spend");
    let open = idle.admit().unwrap_err();
    assert_eq!(open.reason(), Rejection::SpendExceeded);
    assert_eq!(open.spend().unwrap().spent(), 1_200);
    for (_, attachment) in replicas {
        attachment.detach().await;
    }
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio(
            "redis_spend::three_replicas_share_one_budget_within_the_stated_overshoot",
            Rt::Multi,
            three_replicas_share_one_budget_within_the_stated_overshoot,
        ),
        Trial::tokio(
            "redis_spend::a_replica_that_spent_nothing_rejects_once_the_fleet_spent_the_budget",
            Rt::Multi,
            a_replica_that_spent_nothing_rejects_once_the_fleet_spent_the_budget,
        ),
    ]
}
