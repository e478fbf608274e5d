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

// === shared mode ===

const MS: u64 = 1_000_000;

#[tokio::test(start_paused = true)]
async fn in_shared_mode_the_fleets_spend_decides_and_ages_out_by_the_stores_slices() {
    // A rolling minute: 60 slices of a second in the store.
    let l = ledger(100, Period::Rolling(Duration::from_secs(60)));
    l.charge(Charge::Observed(30), 0);
    assert_eq!(l.take_unsent(0), 30);
    // The store: 50 spent 59 s ago (the oldest slice, 400 ms left in
    // the newest), ours and others' 30 + 40 in the newest.
    let mut slices = vec![0; 60];
    slices[0] = 50;
    slices[59] = 70;
    let (crossed, first) = l.fold(&slices, Duration::from_millis(400), true, 0);
    assert_eq!((crossed, first), (Crossed::Budget(120), true));
    let err = l.admits(|| 0).unwrap_err();
    assert_eq!(err.spent(), 120);
    // The oldest slice leaves the period as the newest ends: 70 < 100.
    assert_eq!(err.resets_at() - Instant::now(), Duration::from_millis(400));
    assert!(l.admits(|| 400 * MS - 1).is_err());
    assert!(l.admits(|| 400 * MS).is_ok());
    assert_eq!(l.snapshot(400 * MS).spent, 70);
    // What the breaker charges meanwhile counts at once, before it is sent.
    l.charge(Charge::Observed(30), 500 * MS);
    assert!(l.admits(|| 500 * MS).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_reading_under_the_budget_lifts_the_block_and_leaving_goes_back_to_our_own() {
    let l = ledger(100, Period::UtcDay);
    l.charge(Charge::Observed(40), 0);
    l.take_unsent(0);
    let (crossed, _) = l.fold(&[140], Duration::from_secs(60), true, 0);
    assert_eq!(crossed, Crossed::Budget(140));
    assert!(l.admits(|| MS).is_err());
    // Out of shared mode the breaker's own 40 decide.
    l.leave(MS);
    assert!(l.admits(|| MS).is_ok());
    assert_eq!(l.snapshot(MS).spent, 40);
    // Back in: a reading that found the budget at once, without adding to
    // it, is not this replica's to announce.
    assert_eq!(
        l.fold(&[120], Duration::from_secs(60), false, MS),
        (Crossed::Budget(120), false)
    );
    assert!(l.fold(&[90], Duration::from_secs(60), false, MS).0 == Crossed::Nothing);
    assert!(l.admits(|| MS).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_long_time_away_sends_only_the_spend_still_in_the_period() {
    let minute = Duration::from_secs(60);
    let l = ledger(1_000, Period::Rolling(minute));
    l.charge(Charge::Observed(300), 0);
    l.charge(Charge::Observed(200), 50_000 * MS);
    // At 70 s the first charge has left the period.
    assert_eq!(l.take_unsent(70_000 * MS), 200);
    assert_eq!(l.take_unsent(70_000 * MS), 0);
}
