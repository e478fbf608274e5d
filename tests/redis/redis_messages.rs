//! Transitions carried in their messages: a replica that knows a breaker
//! applies the state a message carries without a round trip, never rolls
//! back to an older state, and ignores what it cannot read.
//!
//! Each test runs its own server, so that the commands it counts (`INFO
//! commandstats`) are its replicas' alone. Real time is unavoidable with a
//! real server: every wait is bounded, and no assertion is about how long
//! anything took.

use crate::redis_support;
use crate::runner::{Rt, Trial};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_circuit_breaker::redis::Attachment;
use tower_circuit_breaker::{Breaker, Outcome, State, TripMode};

use redis_support::{backend, connection, eventually, unique_prefix, Server};

const WAIT: Duration = Duration::from_secs(5);
const NAME: &str = "upstream";

/// The states a breaker entered, in order.
type Entered = Arc<Mutex<Vec<State>>>;

/// Waits until the replica is in `state` and its transition listener has
/// heard of it (the listener runs just after the state changes, on the
/// thread that changed it).
async fn reached(b: &Breaker, entered: &Entered, state: State) -> bool {
    eventually(WAIT, || async {
        b.state() == state && entered.lock().unwrap().last() == Some(&state)
    })
    .await
}

/// A replica of the breaker `NAME` on `url`, with the states it enters.
/// Resyncs are an hour apart, so every command a test counts is one of
/// the exchanges it causes.
async fn replica(url: &str, prefix: &str) -> (Breaker, Attachment, Entered) {
    let entered = Entered::default();
    let log = entered.clone();
    let breaker = Breaker::builder()
        .name(NAME)
        .consecutive_failures(1)
        .trip_mode(TripMode::Open)
        .jitter(0.0)
        .open_duration(Duration::from_secs(3600))
        .on_transition(move |t| log.lock().unwrap().push(t.to))
        .build()
        .expect("valid configuration");
    let attachment = backend(url, prefix)
        .resync_interval(Duration::from_secs(3600))
        .build()
        .unwrap()
        .attach(&breaker)
        .expect("named breaker in a runtime");
    let shared = eventually(WAIT, || async {
        attachment.is_shared() && breaker.remote().is_shared()
    })
    .await;
    assert!(shared, "the replica reaches redis");
    (breaker, attachment, entered)
}

/// State script calls the server ran since its stats were last reset.
async fn script_calls(url: &str) -> u64 {
    let mut conn = connection(url).await;
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn reset_stats(url: &str) {
    let mut conn = connection(url).await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
}

async fn publish(url: &str, prefix: &str, message: impl redis::ToRedisArgs) {
    let mut conn = connection(url).await;
    let _receivers: u64 = redis::cmd("PUBLISH")
        .arg(format!("{prefix}:events"))
        .arg(message)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The epoch of the breaker's shared state.
async fn epoch(url: &str, prefix: &str) -> u64 {
    let mut conn = connection(url).await;
    let e: Option<u64> = redis::cmd("HGET")
        .arg(format!("{{{prefix}:{NAME}}}:v2:state"))
        .arg("epoch")
        .query_async(&mut conn)
        .await
        .unwrap();
    e.unwrap_or(0)
}

async fn a_trip_reaches_another_replica_without_an_exchange() {
    if redis_support::skip() {
        return;
    }
    let server = Server::start().await;
    let (url, prefix) = (server.url(), unique_prefix("carried"));
    let (a, _a, _) = replica(&url, &prefix).await;
    let (b, _b, entered) = replica(&url, &prefix).await;

    reset_stats(&url).await;
    a.admit().unwrap().record(Outcome::Failure);
    assert_eq!(a.state(), State::Open);
    assert!(
        reached(&b, &entered, State::Open).await,
        "the trip reaches the other replica"
    );
    assert_eq!(*entered.lock().unwrap(), [State::Open]);
    // The tripping replica's exchange, and nothing from the other one.
    assert_eq!(script_calls(&url).await, 1, "one exchange in all");
    // Open for the cluster's period (read without a call, which would be
    // turned away and have the replica claim a probe slot once half-open).
    let wait = b.snapshot().retry_in.expect("says when");
    assert!(wait > Duration::from_secs(3500), "{wait:?}");

    // A heal, then the probe that closes: both carried too.
    reset_stats(&url).await;
    a.record_health_probe(Outcome::Success);
    assert!(
        eventually(WAIT, || async { b.state() == State::HalfOpen }).await,
        "the heal reaches the other replica"
    );
    assert_eq!(
        script_calls(&url).await,
        1,
        "the healing replica's exchange only"
    );
}

async fn an_older_message_does_not_roll_a_replica_back() {
    if redis_support::skip() {
        return;
    }
    let server = Server::start().await;
    let (url, prefix) = (server.url(), unique_prefix("stale"));
    let (a, _a, _) = replica(&url, &prefix).await;
    let (b, _b, entered) = replica(&url, &prefix).await;
    a.admit().unwrap().record(Outcome::Failure);
    assert!(eventually(WAIT, || async { b.state() == State::Open }).await);
    let open = epoch(&url, &prefix).await;
    assert!(open > 1);

    // Closes from before the trip, in this release's format and an
    // earlier one's, and an older open period with another deadline.
    for message in [
        format!("v2 closed/0/- {} {NAME}", open - 1),
        format!("v2 closed/0/r {} {NAME}", open - 1),
        format!("v2 closed {} {NAME}", open - 1),
        format!("v2 open/5000/- {} {NAME}", open - 1),
    ] {
        publish(&url, &prefix, message).await;
    }
    // Then a newer transition, a heal on the first replica: once the
    // second one has it, it read the older messages before it.
    a.record_health_probe(Outcome::Success);
    assert!(
        reached(&b, &entered, State::HalfOpen).await,
        "the newer transition is applied"
    );
    assert_eq!(
        *entered.lock().unwrap(),
        [State::Open, State::HalfOpen],
        "nothing older moved the replica"
    );
}

async fn a_malformed_message_is_ignored() {
    if redis_support::skip() {
        return;
    }
    let server = Server::start().await;
    let (url, prefix) = (server.url(), unique_prefix("malformed"));
    let (b, attachment, entered) = replica(&url, &prefix).await;
    let next = epoch(&url, &prefix).await + 1_000_000;

    reset_stats(&url).await;
    let long = "k".repeat(2000);
    let malformed: Vec<Vec<u8>> = [
        format!("v2 open/abc/- {next} {NAME}"),
        format!("v2 open/-5/- {next} {NAME}"),
        format!("v2 open/+5/- {next} {NAME}"),
        format!("v2 open/99999999999999999999/- {next} {NAME}"),
        format!("v2 open/5/ {next} {NAME}"),
        format!("v2 open/5 {next} {NAME}"),
        format!("v2 open//- {next} {NAME}"),
        format!("v2 open/5/r {next} {NAME}"),
        format!("v2 open/5/-g {next} {NAME}"),
        format!("v2 closed/5/- {next} {NAME}"),
        format!("v2 closed/0/g {next} {NAME}"),
        format!("v2 forced/7/- {next} {NAME}"),
        format!("v2 open/5000/- 0 {NAME}"),
        format!("v2 open/5000/- x{next} {NAME}"),
        format!("v2 open/5000/- {next}"),
        format!("v2 open/5000/- {next} "),
        format!("v2 open/5000/- {next} {long}"),
        "v2 open/5000/-".to_string(),
        "v2".to_string(),
        String::new(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .chain([b"v2 open/5000/- 7 up\xffstream".to_vec(), vec![0xff, 0xfe]])
    .collect();
    for message in malformed {
        publish(&url, &prefix, message).await;
    }
    // A well-formed one after them: once it is applied, they were all read.
    publish(&url, &prefix, format!("v2 open/1000000/- {next} {NAME}")).await;
    assert!(
        reached(&b, &entered, State::Open).await,
        "the well-formed message is applied"
    );
    assert_eq!(
        *entered.lock().unwrap(),
        [State::Open],
        "no malformed message moved the replica"
    );
    assert_eq!(script_calls(&url).await, 0, "none was even read back");
    assert!(attachment.is_shared(), "and the replica still shares state");
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio(
            "redis_messages::a_trip_reaches_another_replica_without_an_exchange",
            Rt::Multi,
            a_trip_reaches_another_replica_without_an_exchange,
        ),
        Trial::tokio(
            "redis_messages::an_older_message_does_not_roll_a_replica_back",
            Rt::Multi,
            an_older_message_does_not_roll_a_replica_back,
        ),
        Trial::tokio(
            "redis_messages::a_malformed_message_is_ignored",
            Rt::Multi,
            a_malformed_message_is_ignored,
        ),
    ]
}
