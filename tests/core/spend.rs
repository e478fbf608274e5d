//! The spend guard's rules on a bare breaker: shadow mode, probes, the
//! rejection's detail, a disabled breaker, and health probes' charges.

use std::time::Duration;
use tower_circuit_breaker::TripMode;

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
        .trip_mode(TripMode::Open)
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
        .trip_mode(TripMode::Open)
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
        .trip_mode(TripMode::Open)
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
        .trip_mode(TripMode::Open)
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
        .trip_mode(TripMode::Open)
        .spend_guard(SpendGuard::tokens(0, Period::UtcDay))
        .build()
        .unwrap_err();
    assert_eq!(err.to_string(), "spend guard: the budget is zero");
}

#[tokio::test(start_paused = true)]
async fn a_health_probe_is_charged_its_usage_and_never_the_unknown_cost() {
    use tower_circuit_breaker::classify::LlmClassifier;
    use tower_circuit_breaker::health::HealthProbe;
    use tower_circuit_breaker::spend::{Meter, Prices};
    use tower_circuit_breaker::BoxError;

    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(60))
        .spend_guard(SpendGuard::tokens(1_000, Period::UtcDay).unknown_cost(500))
        .build()
        .unwrap();
    // The first probe answers a one-token completion with its usage; the
    // next ones answer without any.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let upstream = tower::service_fn(move |_req: http::Request<String>| {
        let first = !answered.swap(true, std::sync::atomic::Ordering::SeqCst);
        async move {
            let body = if first {
                r#"{"model":"gpt-4o-mini","usage":{"prompt_tokens":8,"completion_tokens":1}}"#
            } else {
                r#"{"model":"gpt-4o-mini","choices":[]}"#
            };
            let mut res = http::Response::new(body.to_string());
            res.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            Ok::<_, BoxError>(res)
        }
    });
    let meter = Meter::new(LlmClassifier::new(), Prices::tokens());
    let prober = HealthProbe::builder(Duration::from_secs(1))
        .jitter(0.0)
        .build(upstream, meter, |_: &Breaker| {
            http::Request::post("http://upstream/v1/chat/completions")
                .body(String::new())
                .unwrap()
        })
        .unwrap();
    tokio::spawn(prober.run(breaker.clone()));

    call(&breaker, 100);
    breaker.admit().unwrap().record(Outcome::Failure); // its usage never came: 500
    assert_eq!(breaker.state(), State::Open);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // The probe healed the circuit and cost its 9 tokens.
    assert_eq!(breaker.state(), State::HalfOpen);
    let spend = breaker.snapshot().spend.unwrap();
    assert_eq!(spend.spent, 100 + 500 + 9);
    // A probe is no user's call: the counts and the average are theirs.
    assert_eq!((spend.observed_calls, spend.unknown_calls), (1, 1));
    // Open again: probes whose usage never came cost nothing.
    breaker.admit().unwrap().record(Outcome::Failure);
    let before = breaker.snapshot().spend.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(breaker.snapshot().counters.health_probe_successes, 2);
    let after = breaker.snapshot().spend.unwrap();
    assert_eq!(
        (after.spent, after.unknown_calls),
        (before.spent, before.unknown_calls)
    );
}

#[tokio::test(start_paused = true)]
async fn a_success_charged_as_it_ends_breaks_a_failure_streak() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(3)
        .spend_guard(SpendGuard::tokens(1_000_000, Period::Rolling(MINUTE)).unknown_cost(5))
        .build()
        .unwrap();
    let fail = || breaker.admit().unwrap().record(Outcome::Failure);
    fail();
    fail();
    // No usage came: charged the unknown cost as it is recorded, and a
    // success all the same.
    breaker.admit().unwrap().record(Outcome::Success);
    fail();
    fail();
    assert_eq!(
        breaker.state(),
        State::Closed,
        "two failures since the success"
    );
    assert_eq!(breaker.snapshot().spend.unwrap().spent, 5 * 5);
    fail();
    assert_eq!(breaker.state(), State::Open);
}
