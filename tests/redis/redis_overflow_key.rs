//! A key named like a keyed set's overflow breaker, learned from another
//! replica by a set that is full: it must not open the overflow breaker,
//! which every key without room shares.

use crate::redis_support;
use crate::runner::{Rt, Trial};

use std::time::Duration;

use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::{Outcome, State, TripMode};

use redis_support::{backend, eventually, shared_url, unique_prefix};

const WAIT: Duration = Duration::from_secs(5);

async fn a_full_set_learning_a_key_named_overflow_leaves_its_overflow_breaker_alone() {
    if redis_support::skip() {
        return;
    }
    let prefix = unique_prefix("overflow-name");
    let set = |max_keys| {
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(2)
            .jitter(0.0)
            .open_duration(Duration::from_secs(30))
            .max_keys(max_keys)
            .idle_timeout(Duration::from_secs(3600))
            .build()
            .unwrap()
    };
    // `a` has room; `b` has room for two keys.
    let (a, b) = (set(100), set(2));
    let attach_a = backend(shared_url(), &prefix)
        .build()
        .unwrap()
        .attach_keyed(&a)
        .unwrap();
    let attach_b = backend(shared_url(), &prefix)
        .build()
        .unwrap()
        .attach_keyed(&b)
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            attach_a.is_shared() && attach_b.is_shared()
        })
        .await
    );
    b.admit("claude/us").unwrap().record(Outcome::Success);
    // `b` learns of a key `a` opened, which fills it: the messages flow.
    for _ in 0..2 {
        a.admit("gpt-4o/eu").unwrap().record(Outcome::Failure);
    }
    let learned = eventually(WAIT, || async {
        b.get("gpt-4o/eu").is_some_and(|k| k.state() == State::Open)
    })
    .await;
    assert!(learned && b.len() == 2, "b learned the key and is full");

    // On `a`, a real key that happens to be named "(overflow)" opens; `b`
    // hears of it with no room for it.
    for _ in 0..2 {
        a.admit("(overflow)").unwrap().record(Outcome::Failure);
    }
    assert_eq!(a.get("(overflow)").unwrap().state(), State::Open);
    for _ in 0..20 {
        b.admit("claude/us").unwrap().record(Outcome::Success);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        b.get("(overflow)").is_none(),
        "no room: b holds no such key"
    );
    // In a full set, a key without room gets the overflow breaker.
    let overflow = b.get_or_insert("mistral/eu");
    assert!(b.is_overflow(&overflow));
    assert_eq!(
        overflow.state(),
        State::Closed,
        "b's overflow breaker was opened for another replica's key"
    );
    assert!(
        b.admit("mistral/eu").is_ok(),
        "a key without room in b is still admitted"
    );
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio("redis_overflow_key::a_full_set_learning_a_key_named_overflow_leaves_its_overflow_breaker_alone", Rt::Multi, a_full_set_learning_a_key_named_overflow_leaves_its_overflow_breaker_alone),
    ]
}
