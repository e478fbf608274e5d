//! Lookups that must find exactly their own key.

use super::key::same_key;
use super::KeyedBreakers;
use crate::Outcome;
use crate::TripMode;

/// Keys of every length up to 40 bytes, and for each every way to differ
/// from it in one byte, or in length.
#[test]
fn keys_are_equal_exactly_when_their_bytes_are() {
    for n in 0..=40 {
        let key: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        assert!(same_key(&key, &key.clone()), "{key:?} against itself");
        for at in 0..n {
            let mut other = key.clone().into_bytes();
            other[at] = b'Z';
            let other = String::from_utf8(other).unwrap();
            assert!(!same_key(&key, &other), "{key:?} against {other:?}");
            assert!(!same_key(&other, &key), "{other:?} against {key:?}");
        }
        let longer = format!("{key}a");
        assert!(!same_key(&key, &longer), "{key:?} against {longer:?}");
        assert!(!same_key(&longer, &key), "{longer:?} against {key:?}");
    }
}

/// Keys differing in one byte, at every position and length, each have
/// their own breaker, looked up through the table and through the entry a
/// thread remembers.
#[test]
fn keys_one_byte_apart_have_their_own_breakers() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .build()
        .unwrap();
    for n in 1..=40 {
        let key: String = "k".repeat(n);
        for at in 0..n {
            let mut other = key.clone().into_bytes();
            other[at] = b'x';
            let other = String::from_utf8(other).unwrap();
            // Twice in a row, so this thread remembers the entry, then the
            // other key.
            set.admit(&key).unwrap().record(Outcome::Success);
            set.admit(&key).unwrap().record(Outcome::Success);
            set.admit(&other).unwrap().record(Outcome::Failure);
            assert!(set.admit(&key).is_ok(), "{key:?} took {other:?}'s failure");
            assert!(set.admit(&other).is_err(), "{other:?} is open");
            set.get(&other).unwrap().reset();
        }
    }
}

/// A thread that remembers a key's entry in one set admits the same key
/// in another set on that set's breaker.
#[test]
fn a_remembered_entry_serves_only_its_own_set() {
    let set = || {
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(100)
            .build()
            .unwrap()
    };
    let (first, second) = (set(), set());
    for _ in 0..3 {
        first.admit("gpt-4o").unwrap().record(Outcome::Success);
    }
    second.admit("gpt-4o").unwrap().record(Outcome::Success);
    let admitted = |s: &KeyedBreakers| s.get("gpt-4o").unwrap().snapshot().counters.admitted;
    assert_eq!((admitted(&first), admitted(&second)), (3, 1));
}

/// A set with the cap on open keys is freed when its last handle goes:
/// its keys' breakers, which the cap registers, hold the cap only weakly.
#[test]
fn a_set_with_a_cap_on_open_keys_is_freed_with_its_last_handle() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .max_open_share(0.5)
        .build()
        .unwrap();
    set.admit("a").unwrap().record(Outcome::Failure);
    set.admit("b").unwrap().record(Outcome::Success);
    let weak = std::sync::Arc::downgrade(set.inner.open_cap.as_ref().unwrap());
    // This thread may remember an entry of the set: look up another set's
    // key twice so it lets go.
    let other = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .build()
        .unwrap();
    other.admit("x").unwrap().record(Outcome::Success);
    other.admit("x").unwrap().record(Outcome::Success);
    drop(set);
    assert!(weak.upgrade().is_none(), "the cap outlived its set");
}

/// The membership count moves when a key is added or evicted, and only
/// then: a backend keeping the set in step looks at its keys again by it.
#[tokio::test(start_paused = true)]
async fn membership_moves_when_keys_come_and_go() {
    let idle = std::time::Duration::from_secs(60);
    let set = KeyedBreakers::builder().idle_timeout(idle).build().unwrap();
    let empty = set.membership();
    set.admit("a").unwrap().record(Outcome::Success);
    let one = set.membership();
    assert_ne!(one, empty, "a key added");
    set.admit("a").unwrap().record(Outcome::Success);
    drop(set.get_or_insert("a"));
    assert_eq!(set.membership(), one, "the same key again");
    // Two idle periods without a call to "a": the next insert's sweep
    // evicts it.
    tokio::time::advance(idle * 2).await;
    set.admit("b").unwrap().record(Outcome::Success);
    tokio::time::advance(idle * 2).await;
    set.admit("c").unwrap().record(Outcome::Success);
    assert!(set.get("a").is_none(), "evicted");
    let later = set.membership();
    assert!(later >= one + 3, "two keys added and a sweep that evicted");
    assert_eq!(set.len(), 2, "\"b\" was used since the sweep before");
}

/// The keys a listening backend takes, sorted.
fn taken(set: &KeyedBreakers) -> Vec<String> {
    let mut keys = Vec::new();
    set.take_touched(|b| keys.push(b.name().unwrap().to_owned()));
    keys.sort();
    keys
}

fn call(set: &KeyedBreakers, key: &str) {
    set.admit(key).unwrap().record(Outcome::Success);
}

/// Through the table and through the entry a thread remembers (a key
/// called twice in a row), each key that saw calls is told once per look,
/// new keys are left to the set's membership, and nothing is kept while
/// nobody listens.
#[test]
fn a_listening_backend_is_told_each_key_that_saw_calls_once_per_look() {
    let set = KeyedBreakers::builder().build().unwrap();
    for key in ["a", "a", "b"] {
        call(&set, key);
    }
    assert!(taken(&set).is_empty(), "nobody listened");

    let listening = set.listen();
    assert_eq!(set.listeners(), 1);
    for key in ["a", "b", "a", "a", "a"] {
        call(&set, key);
    }
    assert_eq!(
        taken(&set),
        ["a", "b"],
        "each once, marks set before listening cleared"
    );
    assert!(taken(&set).is_empty(), "no calls since");
    call(&set, "a");
    assert_eq!(taken(&set), ["a"], "through the remembered entry");
    call(&set, "c");
    assert!(
        taken(&set).is_empty(),
        "a new key is found by the set's membership"
    );
    call(&set, "c");
    assert_eq!(taken(&set), ["c"]);

    drop(listening);
    assert_eq!(set.listeners(), 0);
    call(&set, "b");
    assert!(taken(&set).is_empty(), "nobody listens");
}
