//! What a rejection says: the breaker or key, the reason, and the wait.

use std::time::Duration;
use tower_circuit_breaker::TripMode;

use tower_circuit_breaker::keyed::{self, KeyFn, KeySecret, KeyedBreakers};
use tower_circuit_breaker::{Breaker, Outcome, Rejection, State};

fn tripped(name: Option<&str>) -> Breaker {
    let mut b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(12))
        .jitter(0.0);
    if let Some(name) = name {
        b = b.name(name);
    }
    let breaker = b.build().unwrap();
    breaker.admit().unwrap().record(Outcome::Failure);
    breaker
}

#[tokio::test(start_paused = true)]
async fn an_open_rejection_names_the_breaker_and_the_wait() {
    let open = tripped(Some("gpt-4o")).admit().unwrap_err();
    assert_eq!(
        open.to_string(),
        "circuit 'gpt-4o' open; next probe in 12 s"
    );
}

#[tokio::test(start_paused = true)]
async fn the_wait_shrinks_and_rounds_up() {
    let breaker = tripped(Some("gpt-4o"));
    let open = breaker.admit().unwrap_err();
    tokio::time::advance(Duration::from_millis(10_500)).await;
    assert_eq!(open.to_string(), "circuit 'gpt-4o' open; next probe in 2 s");
    tokio::time::advance(Duration::from_millis(1_250)).await;
    assert_eq!(
        open.to_string(),
        "circuit 'gpt-4o' open; next probe in 250 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unnamed_breaker_says_circuit_open() {
    let open = tripped(None).admit().unwrap_err();
    assert_eq!(open.to_string(), "circuit open; next probe in 12 s");
}

#[tokio::test(start_paused = true)]
async fn half_open_and_forced_open_say_so() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("claude")
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(1))
        .probes(1)
        .close_after(1)
        .jitter(0.0)
        .build()
        .unwrap();
    breaker.admit().unwrap().record(Outcome::Failure);
    tokio::time::advance(Duration::from_secs(1)).await;
    let _probe = breaker.admit().unwrap();
    let full = breaker.admit().unwrap_err();
    assert_eq!(full.reason(), Rejection::HalfOpenFull);
    assert_eq!(
        full.to_string(),
        "circuit 'claude' half-open; its probes are out"
    );

    breaker.force_open();
    assert_eq!(
        breaker.admit().unwrap_err().to_string(),
        "circuit 'claude' forced open"
    );
}

#[tokio::test(start_paused = true)]
async fn the_volume_guard_says_it_is_the_volume_guard() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("gpt-4o")
        .volume_guard(2, Duration::from_secs(16))
        .build()
        .unwrap();
    for _ in 0..2 {
        breaker.admit().unwrap().record(Outcome::Success);
    }
    let limited = breaker.admit().unwrap_err();
    assert_eq!(limited.reason(), Rejection::VolumeGuard);
    assert_eq!(limited.reason().as_str(), "volume_guard");
    assert_eq!(
        limited.state(),
        State::Closed,
        "the circuit itself is closed"
    );
    let message = limited.to_string();
    assert!(
        message.starts_with("circuit 'gpt-4o' volume guard: call limit reached; next call in "),
        "{message}"
    );
    assert!(!message.contains(" open"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_keyed_rejection_shows_the_stored_key_only() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(12))
        .jitter(0.0)
        .build()
        .unwrap();
    let secret = KeySecret::new("0123456789abcdef0123456789abcdef").unwrap();
    let request = http::Request::builder()
        .header("x-api-key", "sk-live-very-secret")
        .body(())
        .unwrap();
    let key = keyed::header_hashed("x-api-key", &secret)
        .key(&request)
        .unwrap();
    set.admit(key.as_str()).unwrap().record(Outcome::Failure);
    let message = set.admit(key.as_str()).unwrap_err().to_string();
    assert_eq!(
        message,
        format!("circuit '{}' open; next probe in 12 s", key.as_str())
    );
    assert!(!message.contains("sk-live"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_key_cannot_forge_a_log_line() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .build()
        .unwrap();
    let key = "gpt\nERROR forged line";
    set.admit(key).unwrap().record(Outcome::Failure);
    let message = set.admit(key).unwrap_err().to_string();
    assert!(!message.contains('\n'), "{message}");
    assert!(
        message.starts_with("circuit 'gpt\\nERROR forged line' open"),
        "{message}"
    );
}
