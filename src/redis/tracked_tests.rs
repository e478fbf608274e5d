use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::redis::conn::Store;
use crate::Outcome;

pub(crate) fn settings() -> Settings {
    Settings {
        prefix: "t".into(),
        ..Settings::defaults(Store::Single(
            ::redis::Client::open("redis://127.0.0.1/").unwrap(),
        ))
    }
}

/// A shared breaker the cluster holds open (epoch 7), with a count of
/// its transitions.
fn held_open() -> (Tracked, Arc<AtomicUsize>) {
    let transitions = Arc::new(AtomicUsize::new(0));
    let n = transitions.clone();
    let breaker = Breaker::builder()
        .name("b")
        .jitter(0.0)
        .open_duration(Duration::from_secs(30))
        .on_transition(move |_| {
            n.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    breaker.remote().set_shared(true);
    let mut t = Tracked::new(breaker, "b".into(), &settings());
    let open = Reply {
        cluster: Cluster::Open(Duration::from_secs(30)),
        epoch: 7,
        granted: false,
        reset: false,
        gated: false,
        window: None,
        spend: None,
    };
    apply(&mut t, open, Request::default());
    assert_eq!(t.breaker.state(), State::Open);
    (t, transitions)
}

fn apply(t: &mut Tracked, reply: Reply, request: Request) {
    let pending = Pending {
        name: t.name.clone(),
        request,
        local: t.breaker.state(),
    };
    let origins = Origins::default();
    t.apply(
        reply,
        pending,
        Instant::now(),
        Duration::from_millis(50),
        &origins,
    );
}

fn prepare(t: &mut Tracked) -> Option<Request> {
    t.prepare(Instant::now(), false, true, || "lease".into())
        .map(|(req, _)| req)
}

#[tokio::test(start_paused = true)]
async fn a_heal_while_the_cluster_holds_the_circuit_open_is_sent_once_for_its_epoch() {
    let (mut t, _) = held_open();
    assert!(!t.healed());
    t.breaker.record_health_probe(Outcome::Success);
    assert_eq!(t.breaker.state(), State::HalfOpen);
    assert!(
        t.healed(),
        "the keyed set's wake-up finds it before the next flush"
    );
    let req = prepare(&mut t).expect("the heal is news");
    assert!(req.heal);
    assert_eq!(req.epoch, 7, "for the open period it was found in");
    assert!(!req.trip && req.calls == 0 && req.reports.is_empty());
    assert!(!t.healed());
    assert!(prepare(&mut t).is_none_or(|r| !r.heal), "sent once");
}

#[tokio::test(start_paused = true)]
async fn the_turn_passes_after_three_failed_health_probes_in_a_row() {
    let (mut t, _) = held_open();
    for _ in 0..2 {
        t.breaker.record_health_probe(Outcome::Failure);
        assert!(!t.pass_turn());
    }
    t.breaker.record_health_probe(Outcome::Success);
    assert!(!t.pass_turn(), "a success starts the streak again");
    for _ in 0..2 {
        t.breaker.record_health_probe(Outcome::Failure);
        assert!(!t.pass_turn());
    }
    t.breaker.record_health_probe(Outcome::Failure);
    assert!(t.pass_turn(), "three in a row");
    assert!(!t.pass_turn(), "once, then three more tries");
}

#[tokio::test(start_paused = true)]
async fn a_failed_health_probe_tells_the_cluster_nothing() {
    let (mut t, _) = held_open();
    t.breaker.record_health_probe(Outcome::Failure);
    t.breaker.record_health_probe(Outcome::Failure);
    assert!(!t.healed());
    assert!(prepare(&mut t).is_none(), "nothing to say");
    // Nor on a resync, which only reads.
    let req = t
        .prepare(Instant::now(), true, true, || "lease".into())
        .map(|(req, _)| req)
        .unwrap();
    assert!(req.is_read());
}

#[tokio::test(start_paused = true)]
async fn a_shadow_breaker_heals_only_itself() {
    let (mut t, _) = held_open();
    t.breaker.set_metrics_only(true);
    t.breaker.record_health_probe(Outcome::Success);
    assert!(!t.healed());
    assert!(prepare(&mut t).is_none_or(|r| !r.heal));
}

#[tokio::test(start_paused = true)]
async fn the_cluster_confirming_a_heal_leaves_the_healed_cycle_alone() {
    let (mut t, transitions) = held_open();
    t.breaker.record_health_probe(Outcome::Success);
    let req = prepare(&mut t).unwrap();
    let before = transitions.load(Ordering::SeqCst);
    let healed = Reply {
        cluster: Cluster::HalfOpen,
        epoch: 8,
        granted: false,
        reset: false,
        gated: false,
        window: None,
        spend: None,
    };
    apply(&mut t, healed, req);
    assert_eq!(t.breaker.state(), State::HalfOpen);
    assert_eq!(
        transitions.load(Ordering::SeqCst),
        before,
        "no reopen and half-open again"
    );
    // The heal stays: the next exchanges read what the cluster holds.
    assert!(prepare(&mut t).is_none());
    assert!(!t.healed());
}

#[tokio::test(start_paused = true)]
async fn another_replicas_heal_half_opens_this_one() {
    let (mut t, _) = held_open();
    let healed = Reply {
        cluster: Cluster::HalfOpen,
        epoch: 8,
        granted: false,
        reset: false,
        gated: false,
        window: None,
        spend: None,
    };
    apply(&mut t, healed, Request::default());
    // Its open period ends a nanosecond on.
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(t.breaker.state(), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn a_heal_the_cluster_did_not_take_gives_way_to_the_cluster() {
    // The cluster reopened meanwhile (a new epoch, still open): the heal
    // of the older period is dropped and this replica opens again; its
    // prober probes the new period.
    let (mut t, _) = held_open();
    t.breaker.record_health_probe(Outcome::Success);
    let req = prepare(&mut t).unwrap();
    let reopened = Reply {
        cluster: Cluster::Open(Duration::from_secs(60)),
        epoch: 9,
        granted: false,
        reset: false,
        gated: false,
        window: None,
        spend: None,
    };
    apply(&mut t, reopened, req);
    assert_eq!(t.breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_closed_breaker_is_skipped_but_an_outcome_of_an_older_call_is_sent() {
    let breaker = Breaker::builder()
        .name("b")
        .failure_rate(0.5)
        .min_calls(10)
        .build()
        .unwrap();
    breaker.remote().set_shared(true);
    let mut t = Tracked::new(breaker, "b".into(), &settings());
    let closed = Reply {
        cluster: Cluster::Closed,
        epoch: 3,
        granted: false,
        reset: false,
        gated: false,
        window: None,
        spend: None,
    };
    apply(&mut t, closed, Request::default());
    t.force = false;
    let all = |t: &mut Tracked| {
        t.prepare(Instant::now(), true, true, || "lease".into())
            .map(|(req, _)| req)
    };
    // The first resync takes the activity so far; nothing since, then.
    drop(all(&mut t));
    assert!(prepare(&mut t).is_none(), "nothing happened");
    assert!(all(&mut t).is_none(), "nor since the last resync");

    // Admitted before an exchange, finished after it: the admission alone
    // moved nothing the cluster sums, the outcome does.
    assert!(t.idle, "nothing in flight either");
    let permit = t.breaker.admit().unwrap();
    assert!(prepare(&mut t).is_none(), "no outcome yet");
    assert!(
        !t.idle,
        "a call in flight keeps the breaker in the flushes' looks"
    );
    permit.record(Outcome::Failure);
    let req = prepare(&mut t).expect("the failure is news");
    assert!(!t.idle);
    assert_eq!((req.calls, req.failures), (1, 1));
    assert!(prepare(&mut t).is_none(), "sent once");
    assert!(t.idle);
    assert!(!t.stays_busy(false), "idle: no more looks");
    // Taken from a keyed set's list: the call that put it there may be
    // counted only after this look, so the next flush looks again.
    t.told = true;
    assert!(prepare(&mut t).is_none());
    assert!(t.stays_busy(false), "one more look");
    assert!(prepare(&mut t).is_none());
    assert!(!t.stays_busy(false), "and only one");
    assert!(t.stays_busy(true), "sent: the reply is awaited");
    assert!(
        all(&mut t).is_some(),
        "the next resync reads a breaker with calls"
    );
    assert!(all(&mut t).is_none(), "and the one after skips it again");
}
