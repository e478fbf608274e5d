//! The ledger: periods, resets, the running average and the warning.

use super::*;

fn ledger(budget: u64, period: Period) -> Ledger {
    Ledger::new(SpendGuard::micro_dollars(budget, period), Instant::now())
}

#[tokio::test(start_paused = true)]
async fn a_rolling_budget_resets_when_enough_spend_ages_out() {
    let hour = Duration::from_secs(3600);
    let l = ledger(100, Period::Rolling(hour));
    let min = 60_000_000_000;
    assert_eq!(l.charge(Charge::Observed(60), 0), Crossed::Nothing);
    assert_eq!(
        l.charge(Charge::Observed(60), 10 * min),
        Crossed::Budget(120)
    );
    // The first 60 age out an hour after their slice began.
    let err = l.admits(|| 30 * min).unwrap_err();
    assert_eq!(err.spent(), 120);
    assert_eq!(err.resets_at() - Instant::now(), hour);
    assert!(l.admits(|| 60 * min - 1).is_err());
    assert!(l.admits(|| 60 * min).is_ok());
    assert_eq!(l.snapshot(60 * min).spent, 60);
}

#[tokio::test(start_paused = true)]
async fn a_calendar_budget_resets_at_the_boundary() {
    let l = ledger(100, Period::UtcHour);
    let hour = 3_600_000_000_000u64;
    let to_boundary = hour - l.offset % hour;
    assert_eq!(l.charge(Charge::Observed(100), 0), Crossed::Budget(100));
    let err = l.admits(|| 1).unwrap_err();
    assert_eq!(
        err.resets_at() - Instant::now(),
        Duration::from_nanos(to_boundary)
    );
    assert!(l.admits(|| to_boundary - 1).is_err());
    assert!(l.admits(|| to_boundary).is_ok());
}

#[tokio::test(start_paused = true)]
async fn unknown_calls_pay_the_running_average() {
    let l = ledger(1_000, Period::UtcDay);
    l.charge(Charge::Observed(10), 0);
    l.charge(Charge::Observed(30), 0);
    l.charge(Charge::Unknown, 0);
    l.charge(Charge::Free, 0);
    let s = l.snapshot(0);
    assert_eq!((s.spent, s.observed_calls, s.unknown_calls), (60, 2, 1));
}

#[tokio::test(start_paused = true)]
async fn the_warning_comes_once_per_period() {
    let guard = SpendGuard::tokens(100, Period::Rolling(Duration::from_secs(60))).warn_at(0.5);
    let l = Ledger::new(guard, Instant::now());
    assert_eq!(l.charge(Charge::Observed(40), 0), Crossed::Nothing);
    assert_eq!(l.charge(Charge::Observed(20), 0), Crossed::Warning(60));
    assert_eq!(l.charge(Charge::Observed(20), 0), Crossed::Nothing);
    let later = 61_000_000_000;
    assert_eq!(l.charge(Charge::Observed(50), later), Crossed::Warning(50));
}

#[test]
fn bad_budgets_are_config_errors() {
    let zero = SpendGuard::tokens(0, Period::UtcDay);
    assert!(zero.validate().is_err());
    let warn = SpendGuard::tokens(1, Period::UtcDay).warn_at(1.5);
    assert!(warn.validate().is_err());
    let short = SpendGuard::tokens(1, Period::Rolling(Duration::from_nanos(1)));
    assert!(short.validate().is_err());
}

#[test]
fn amounts_read_as_money_or_tokens() {
    assert_eq!(Amount(1_234_567, Unit::MicroDollars).to_string(), "$1.24");
    assert_eq!(Amount(7, Unit::Tokens).to_string(), "7 tokens");
}
