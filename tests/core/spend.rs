//! The spend guard's rules on a bare breaker: shadow mode, probes, the
//! rejection's detail, and a disabled breaker.

use std::time::Duration;

use tower_circuit_breaker::spend::{Charge, Period, SpendGuard, Unit};
use tower_circuit_breaker::{Breaker, Outcome, Rejection, State};

fn call(breaker: &Breaker, cost: u64) {
    let mut permit = breaker.admit().unwrap();
    permit.charge(Charge::Observed(cost));
    permit.record(Outcome::Success);
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn shadow_mode_rejects_nothing_and_counts_what_it_would_reject() {
    let breaker = Breaker::builder()
        .spend_guard(SpendGuard::tokens(100, Period::Rolling(MINUTE)).shadow(true))
        .build()
        .unwrap();
    call(&breaker, 150);
    for _ in 0..3 {
        call(&breaker, 10);
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.counters.would_reject, 3);
    assert_eq!(snap.counters.rejected, 0);
    let spend = snap.spend.unwrap();
    assert_eq!((spend.spent, spend.exceeded), (180, true));
}

#[tokio::test(start_paused = true)]
async fn a_permit_finished_without_a_charge_pays_the_running_average() {
    let breaker = Breaker::builder()
        .spend_guard(SpendGuard::tokens(1_000, Period::Rolling(MINUTE)))
        .build()
        .unwrap();
    call(&breaker, 100);
    call(&breaker, 300);
    breaker.admit().unwrap().record(Outcome::Failure); // a hang, a reset
    drop(breaker.admit().unwrap()); // a cancelled call, a hedge loser
    let spend = breaker.snapshot().spend.unwrap();
    assert_eq!((spend.spent, spend.unknown_calls), (800, 2));
}

#[tokio::test(start_paused = true)]
async fn a_spent_budget_holds_half_open_probes_back_too() {
    let breaker = Breaker::builder()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(10))
        .jitter(0.0)
        .spend_guard(SpendGuard::micro_dollars(1_000, Period::Rolling(MINUTE)).unknown_cost(1_000))
        .build()
        .unwrap();
    // A failure that cost the budget (charged as a call of unknown usage).
    breaker.admit().unwrap().record(Outcome::Failure);
    assert_eq!(breaker.admit().unwrap_err().reason(), Rejection::Open);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    let open = breaker.admit().unwrap_err();
    assert_eq!(open.reason(), Rejection::SpendExceeded);
    let spend = open.spend().unwrap();
    assert_eq!(
        (spend.unit(), spend.budget(), spend.spent()),
        (Unit::MicroDollars, 1_000, 1_000)
    );
    assert_eq!(spend.period(), Period::Rolling(MINUTE));
    assert_eq!(open.retry_after(), Some(Duration::from_secs(50)));
    assert_eq!(
        open.to_string(),
        "circuit spend budget exceeded: $0.01 of $0.01; next call in 50 s"
    );
    // Once the spend ages out, the probe goes.
    tokio::time::advance(Duration::from_secs(50)).await;
    assert!(breaker.admit().unwrap().is_probe());
}

#[tokio::test(start_paused = true)]
async fn a_disabled_breaker_admits_and_still_charges() {
    let breaker = Breaker::builder()
        .spend_guard(SpendGuard::tokens(10, Period::UtcDay))
        .build()
        .unwrap();
    breaker.disable();
    call(&breaker, 50);
    call(&breaker, 50);
    assert_eq!(breaker.snapshot().spend.unwrap().spent, 100);
    breaker.reset();
    assert_eq!(
        breaker.admit().unwrap_err().reason(),
        Rejection::SpendExceeded
    );
}

#[test]
fn a_zero_budget_is_a_config_error() {
    let err = Breaker::builder()
        .spend_guard(SpendGuard::tokens(0, Period::UtcDay))
        .build()
        .unwrap_err();
    assert_eq!(err.to_string(), "spend guard: the budget is zero");
}
