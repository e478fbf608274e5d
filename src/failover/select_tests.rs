//! Unit tests of the selection.

use super::*;

#[test]
fn a_walk_puts_the_chosen_member_first_and_keeps_the_rest_in_order() {
    let walk = Walk::starting_at(2);
    let order: Vec<usize> = (0..4).map(|p| walk.member(p)).collect();
    assert_eq!(order, [2, 0, 1, 3]);
    for m in 0..4 {
        assert_eq!(walk.member(walk.position(m)), m);
    }
    let plain = Walk::default();
    assert_eq!(
        (0..3).map(|p| plain.member(p)).collect::<Vec<_>>(),
        [0, 1, 2]
    );
}

#[tokio::test(start_paused = true)]
async fn an_estimate_jumps_to_a_peak_and_a_stale_one_is_probed_and_replaced() {
    let decay = nanos(DEFAULT_DECAY);
    // The moment a decay time before `t`, as the selection asks.
    let ago = |t: Instant| t.checked_sub(DEFAULT_DECAY);
    let mut e = Estimate::default();
    let t0 = Instant::now();
    assert!(e.stale(ago(t0)), "no sample yet");
    e.sample(1e9, t0, decay);
    e.sample(3e9, t0, decay);
    assert_eq!(e.ns, 3e9, "a peak replaces the estimate");
    let t1 = t0 + DEFAULT_DECAY / 2;
    e.sample(1e9, t1, decay);
    assert!(e.ns < 3e9 && e.ns > 1e9, "{}", e.ns);
    assert!(!e.stale(ago(t1)));
    let t2 = t1 + DEFAULT_DECAY;
    assert!(
        !e.stale(ago(t2 - Duration::from_nanos(1))),
        "a nanosecond short of a decay time"
    );
    assert!(e.stale(ago(t2)), "not sampled for a decay time");
    e.probe = Some(t2);
    assert!(!e.stale(ago(t2)), "one probe at a time");
    e.sample(0.1e9, t2, decay);
    assert_eq!(e.ns, 0.1e9, "the probe's answer replaces a stale estimate");
    e.at_least(0.05e9, t2);
    assert_eq!(e.ns, 0.1e9);
    e.at_least(2e9, t2);
    assert_eq!(e.ns, 2e9);
}

#[tokio::test(start_paused = true)]
async fn a_member_with_calls_in_flight_costs_its_estimate_times_their_count_plus_one() {
    let b = || Breaker::builder().build().unwrap();
    let selection = Selection::peak_ewma([b(), b()]);
    selection.record(0, Duration::from_millis(100));
    selection.record(1, Duration::from_millis(150));
    let rng = Rng::new(3);
    for _ in 0..10 {
        assert_eq!(selection.choose(&rng), 0, "the faster one, when idle");
    }
    // Two calls in flight on the faster one: 100 ms x 3 > 150 ms x 1.
    let calls = [selection.start(0), selection.start(0)];
    assert_eq!(selection.pending(0), 2);
    for _ in 0..10 {
        assert_eq!(selection.choose(&rng), 1, "the busy one is passed over");
    }
    drop(calls);
    assert_eq!(selection.pending(0), 0, "counted until dropped");
    assert_eq!(selection.choose(&rng), 0);
    assert!(Selection::cheapest([(b(), 1.0)]).start(0).is_none());
}

#[tokio::test(start_paused = true)]
async fn open_and_paced_members_are_never_chosen_and_come_back() {
    use crate::Outcome;
    let b = || {
        Breaker::builder()
            .pace_rate_limits(true)
            .consecutive_failures(1)
            .trip_mode(crate::TripMode::Open)
            .build()
            .unwrap()
    };
    let (cheap, dear) = (b(), b());
    let selection = Selection::cheapest([(cheap.clone(), 1.0), (dear.clone(), 2.0)]);
    let rng = Rng::new(7);
    assert_eq!(selection.choose(&rng), 0);
    // Paced for five seconds by a 429 that said so.
    cheap.admit().unwrap().record(Outcome::RateLimited {
        retry_after: Some(Duration::from_secs(5)),
    });
    assert_eq!(selection.choose(&rng), 1);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(selection.choose(&rng), 0, "the pacing is over");
    cheap.admit().unwrap().record(Outcome::Failure);
    assert_eq!(selection.choose(&rng), 1, "open");
    assert_eq!(
        cheap.snapshot().counters.rejected,
        0,
        "read without admitting"
    );

    // The peak-EWMA walks around them too, by its two choices.
    let ewma = Selection::peak_ewma([cheap.clone(), dear.clone()]);
    ewma.record(0, Duration::from_millis(1));
    ewma.record(1, Duration::from_secs(1));
    for _ in 0..20 {
        assert_eq!(ewma.choose(&rng), 1);
    }
}
