use super::*;
use crate::redis::script::{Cluster, Request};
use crate::redis::tracked::tests::settings;
use crate::redis::tracked::{lease_end, MARGIN};
use crate::redis::Origin;
use crate::State;

#[tokio::test(start_paused = true)]
async fn a_deadline_past_the_open_cap_is_capped_and_reported_overdue_by_the_local_clock() {
    let breaker = Breaker::builder()
        .name("b")
        .jitter(0.0)
        .open_duration(Duration::from_secs(1))
        .max_open_duration(Duration::from_secs(2))
        .build()
        .unwrap();
    breaker.remote().set_shared(true);
    let mut t = Tracked::new(breaker.clone(), "b".into(), &settings());
    let pending = |t: &Tracked| Pending {
        name: t.name.clone(),
        request: Request::default(),
        local: t.breaker.state(),
    };
    // A server whose clock went back says the period lasts an hour more.
    let reply = Reply {
        cluster: Cluster::Open(Duration::from_secs(3600)),
        epoch: 7,
        granted: false,
        reset: false,
        gated: false,
        window: None,
        spend: None,
    };
    let p = pending(&t);
    let origins = Origins::default();
    t.apply(
        reply,
        p,
        Instant::now(),
        Duration::from_millis(50),
        &origins,
    );
    // The cap, and the timeout of an exchange (500 ms) as slack.
    let longest = Duration::from_millis(2500) + MARGIN;
    let left = breaker.snapshot().retry_in.expect("open");
    assert!(left <= longest, "{left:?}");
    assert!(left > longest - Duration::from_millis(100), "{left:?}");
    assert_eq!(
        lock(&origins).get("b").copied(),
        Some((State::Open, Origin::Cluster))
    );

    // Not overdue yet; past the cap by this clock, the cluster is told.
    let early = t.prepare(Instant::now(), false, true, || "x".into());
    assert!(early.is_none_or(|(req, _)| !req.overdue));
    tokio::time::advance(longest).await;
    let (req, _) = t
        .prepare(Instant::now(), false, true, || "x".into())
        .unwrap();
    assert!(req.overdue, "the period outlasted the open cap");
}

#[tokio::test(start_paused = true)]
async fn lease_ends_saturate_instead_of_overflowing() {
    let now = Instant::now();
    let year = Duration::from_secs(365 * 24 * 3600);
    for (lease, flush) in [
        (Duration::MAX, Duration::from_millis(50)),
        (Duration::MAX, Duration::MAX),
        (Duration::from_millis(50), Duration::MAX),
        (Duration::MAX - Duration::from_secs(1), Duration::ZERO),
    ] {
        let end = lease_end(now, lease, flush);
        assert!(end >= now, "{lease:?} {flush:?}");
        if lease > flush.saturating_mul(2) {
            assert!(end > now + year, "{lease:?} {flush:?}: still far away");
        }
    }
    assert_eq!(
        lease_end(now, Duration::from_secs(1), Duration::from_millis(50)),
        now + Duration::from_millis(900)
    );
}
