//! Keyed breakers and the volume guard.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::advance;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::error::Rejection;
use tower_circuit_breaker::keyed::{
    self, Key, KeySecret, KeySecretError, KeyedBreakers, KeyedConfigError,
};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, ConfigError, Outcome, State};

fn set() -> tower_circuit_breaker::Builder<KeyedBreakers> {
    KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(3)
        .jitter(0.0)
        .open_duration(Duration::from_secs(30))
}

fn secret() -> KeySecret {
    KeySecret::new("test-secret-0123456789abcdef").unwrap()
}

#[tokio::test(start_paused = true)]
async fn one_failing_model_never_blocks_a_healthy_one_over_a_real_connection() {
    // The upstream fails every call for model "broken".
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let h = h.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let broken = req.headers().get("x-model").is_some_and(|m| m == "broken");
                    if broken {
                        h.fetch_add(1, Ordering::SeqCst);
                    }
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(if broken { 503 } else { 200 })
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });

    let breakers = set().build().unwrap();
    let layer = CircuitBreakerLayer::keyed(breakers.clone(), keyed::header("x-model"));
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut svc = ServiceBuilder::new().layer(layer).service(client);
    let uri = format!("http://{addr}/v1/chat/completions");

    let mut healthy_ok = 0;
    let mut broken_rejected = 0;
    for i in 0..40 {
        let model = if i % 2 == 0 { "broken" } else { "healthy" };
        let req = Request::post(uri.as_str())
            .header("x-model", model)
            .body(Empty::new())
            .unwrap();
        match svc.ready().await.unwrap().call(req).await {
            Ok(res) => {
                if model == "healthy" {
                    assert_eq!(res.status(), StatusCode::OK);
                    healthy_ok += 1;
                }
                res.into_body().collect().await.unwrap();
            }
            Err(e) => {
                assert_eq!(model, "broken", "the healthy model must never be rejected");
                assert_eq!(e.circuit_open().unwrap().key(), Some("broken"));
                broken_rejected += 1;
            }
        }
    }
    assert_eq!(healthy_ok, 20);
    assert_eq!(broken_rejected, 17);
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(breakers.get("broken").unwrap().state(), State::Open);
    assert_eq!(breakers.get("healthy").unwrap().state(), State::Closed);
    let snaps = breakers.snapshots();
    assert_eq!(snaps.len(), 2, "a snapshot for every key");
}

#[tokio::test(start_paused = true)]
async fn every_key_extractor_routes_to_its_own_breaker() {
    #[derive(Clone)]
    struct Route(&'static str);
    impl AsRef<str> for Route {
        fn as_ref(&self) -> &str {
            self.0
        }
    }
    let req = |host: &str, model: &str, route: &'static str| {
        let mut r = Request::get(format!("http://{host}/v1"))
            .header("x-model", model)
            .header("authorization", "Bearer sk-secret-123")
            .body(())
            .unwrap();
        r.extensions_mut().insert(Route(route));
        r
    };
    use tower_circuit_breaker::keyed::KeyFn;
    let r = req("api.example:443", "gpt-4o", "eu");
    assert_eq!(keyed::header("x-model").key(&r).unwrap().as_str(), "gpt-4o");
    assert_eq!(
        keyed::authority().key(&r).unwrap().as_str(),
        "api.example:443"
    );
    assert_eq!(keyed::extension::<Route>().key(&r).unwrap().as_str(), "eu");
    let hashed = keyed::header_hashed("authorization", &secret())
        .key(&r)
        .unwrap();
    assert!(hashed.as_str().starts_with('#') && !hashed.as_str().contains("secret"));
    let f =
        keyed::from_fn(|r: &Request<()>| r.headers().get("x-model")?.to_str().ok().map(Key::from));
    assert_eq!(f.key(&r).unwrap().as_str(), "gpt-4o");
    assert!(keyed::header("x-missing").key(&r).is_none());
}

#[tokio::test(start_paused = true)]
async fn credential_keys_appear_only_as_hashes() {
    let breakers = set().build().unwrap();
    let layer = CircuitBreakerLayer::keyed(
        breakers.clone(),
        keyed::header_hashed("x-api-key", &secret()),
    );
    let upstream = tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::builder().status(503).body(String::new()).unwrap())
    });
    let mut svc = ServiceBuilder::new().layer(layer).service(upstream);
    let req = || {
        Request::get("/")
            .header("x-api-key", "sk-live-abcdef")
            .body(String::new())
            .unwrap()
    };
    for _ in 0..3 {
        svc.ready().await.unwrap().call(req()).await.unwrap();
    }
    let err = svc.ready().await.unwrap().call(req()).await.unwrap_err();
    let key = err.circuit_open().unwrap().key().unwrap().to_owned();
    assert!(key.starts_with('#') && !key.contains("sk-live"));
    assert!(!format!("{err:?} {err}").contains("sk-live"));
    assert!(breakers.snapshots().iter().all(|s| !s
        .key
        .as_deref()
        .unwrap_or("")
        .contains("sk-live")));
}

#[tokio::test(start_paused = true)]
async fn overrides_apply_to_their_key_only() {
    let breakers = set()
        .override_key("fragile", |b| b.consecutive_failures(1))
        .build()
        .unwrap();
    breakers.admit("fragile").unwrap().record(Outcome::Failure);
    breakers.admit("sturdy").unwrap().record(Outcome::Failure);
    assert_eq!(breakers.get("fragile").unwrap().state(), State::Open);
    assert_eq!(breakers.get("sturdy").unwrap().state(), State::Closed);
    let bad = set()
        .override_key("x", |b| b.probes(0))
        .build()
        .unwrap_err();
    assert_eq!(
        bad,
        KeyedConfigError::Override {
            key: "x".into(),
            error: ConfigError::ZeroProbes
        }
    );
    assert_eq!(
        bad.to_string(),
        "key 'x': half-open must admit at least one probe"
    );
}

#[tokio::test(start_paused = true)]
async fn keys_are_bounded_and_open_keys_survive_eviction_under_pressure() {
    let breakers = set()
        .max_keys(100)
        .idle_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // An outage on one key.
    for _ in 0..3 {
        breakers.admit("down").unwrap().record(Outcome::Failure);
    }
    // A flood of unique keys fills the set.
    for i in 0..10_000 {
        breakers
            .admit(&format!("junk-{i}"))
            .unwrap()
            .record(Outcome::Success);
    }
    assert_eq!(breakers.len(), 100);
    // Keys beyond the cap share the overflow breaker rather than growing memory.
    assert!(breakers.get("junk-9999").is_none());
    // Long idle: two sweep intervals pass; the flood continues.
    for round in 0..3 {
        advance(Duration::from_secs(61)).await;
        for i in 0..1_000 {
            drop(breakers.admit(&format!("flood-{round}-{i}")));
        }
        assert!(breakers.len() <= 100);
        let down = breakers.get("down").expect("an open key is never evicted");
        // Its open period is over, so it says half-open, with no call needed.
        assert_eq!(down.state(), State::HalfOpen);
    }
    // The outage was remembered throughout: its open period ran out, so the
    // next call is a half-open probe, not a fresh closed breaker's call.
    assert!(breakers.admit("down").unwrap().is_probe());
    // Idle closed keys were evicted to make room for new ones.
    assert!(breakers.get("junk-0").is_none());
    assert!(breakers.get("flood-1-0").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_key_called_again_after_its_eviction_counts_in_the_sets_new_breaker() {
    let breakers = set()
        .max_keys(3)
        .idle_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // Called over and over: this thread remembers the entry.
    for _ in 0..5 {
        breakers.admit("hot").unwrap().record(Outcome::Success);
    }
    let before = breakers.get("hot").unwrap();
    // Idle past two sweeps while other keys arrive: "hot" is evicted.
    breakers.admit("a").unwrap().record(Outcome::Success);
    for (round, key) in ["b", "c"].into_iter().enumerate() {
        advance(Duration::from_secs(61)).await;
        breakers.admit(key).unwrap().record(Outcome::Success);
        assert!(breakers.len() <= 3, "round {round}");
    }
    assert!(breakers.get("hot").is_none(), "evicted");
    // The next calls must reach the set, not the breaker remembered from
    // before the eviction.
    for _ in 0..3 {
        breakers.admit("hot").unwrap().record(Outcome::Failure);
    }
    let after = breakers.get("hot").expect("back in the set");
    assert!(!after.ptr_eq(&before));
    assert_eq!(after.state(), State::Open);
    assert_eq!(after.snapshot().counters.failures, 3);
    assert_eq!(before.snapshot().counters.failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_million_distinct_keys_stay_within_the_cap() {
    let breakers = set()
        .max_keys(1_000)
        .idle_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    for i in 0..1_000_000u32 {
        if i % 100_000 == 0 {
            advance(Duration::from_secs(1)).await;
        }
        let buf = itoa_buf(i);
        let key = std::str::from_utf8(&buf).unwrap();
        drop(breakers.admit(key));
        assert!(breakers.len() <= 1_000);
    }
}

fn itoa_buf(mut n: u32) -> [u8; 10] {
    let mut b = [b'0'; 10];
    for slot in b.iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    b
}

#[tokio::test(start_paused = true)]
async fn volume_guard_trips_on_call_k_plus_one_within_p_and_admits_again_after_p() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .volume_guard(100, Duration::from_secs(3600))
        .build()
        .unwrap();
    for _ in 0..100 {
        b.admit().unwrap().record(Outcome::Success);
        advance(Duration::from_secs(1)).await;
    }
    let err = b.admit().unwrap_err();
    assert_eq!(err.reason(), Rejection::VolumeGuard);
    assert_eq!(err.state(), State::Closed, "no half-open cycle is involved");
    assert_eq!(b.state(), State::Closed);
    let wait = err.retry_after().unwrap();
    assert!(wait <= Duration::from_secs(3600 - 100));
    advance(wait).await;
    assert!(b.admit().is_ok());
    let c = b.snapshot().counters;
    assert_eq!((c.volume_limited, c.rejected), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn volume_guard_is_per_key() {
    let breakers = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .volume_guard(2, Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..2 {
        drop(breakers.admit("runaway").unwrap());
    }
    assert_eq!(
        breakers.admit("runaway").unwrap_err().reason(),
        Rejection::VolumeGuard
    );
    assert!(breakers.admit("calm").is_ok());
}

#[tokio::test]
async fn bad_key_bounds_are_config_errors() {
    assert_eq!(
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .max_keys(0)
            .build()
            .unwrap_err(),
        KeyedConfigError::KeyBounds
    );
    assert_eq!(
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .idle_timeout(Duration::ZERO)
            .build()
            .unwrap_err(),
        KeyedConfigError::KeyBounds
    );
    // The breaker settings the keys share are the core's errors, wrapped.
    assert_eq!(
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .probes(0)
            .build()
            .unwrap_err(),
        KeyedConfigError::Breaker(ConfigError::ZeroProbes)
    );
    assert_eq!(
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .volume_guard(0, Duration::from_secs(1))
            .build()
            .unwrap_err(),
        ConfigError::VolumeGuard
    );
}

#[tokio::test(start_paused = true)]
async fn authority_key_is_host_and_port_without_url_credentials() {
    use tower_circuit_breaker::keyed::KeyFn;
    let key_of = |uri: &str| {
        let r = Request::get(uri).body(()).unwrap();
        keyed::authority().key(&r).map(|k| k.as_str().to_owned())
    };
    for (uri, want) in [
        ("https://user:secret@api.example.com/v1", "api.example.com"),
        (
            "https://user:secret@api.example.com:8443/v1",
            "api.example.com:8443",
        ),
        ("https://sk-only@api.example.com/", "api.example.com"),
        ("https://a:b@c@api.example.com/", "api.example.com"),
        ("https://:@api.example.com/", "api.example.com"),
        ("http://[::1]:8080/", "[::1]:8080"),
        ("https://api.example.com/v1", "api.example.com"),
    ] {
        assert_eq!(key_of(uri).as_deref(), Some(want), "{uri}");
    }
    assert_eq!(key_of("/relative"), None);
}

#[tokio::test(start_paused = true)]
async fn url_credentials_and_query_never_reach_a_key_event_or_snapshot() {
    use std::sync::Mutex;
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s = seen.clone();
    let breakers = set()
        .on_transition(move |t| s.lock().unwrap().push(format!("{t:?}")))
        .build()
        .unwrap();
    let layer = CircuitBreakerLayer::keyed(breakers.clone(), keyed::authority());
    let upstream = tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::builder().status(503).body(String::new()).unwrap())
    });
    let mut svc = ServiceBuilder::new().layer(layer).service(upstream);
    // Two credentials for one host: one breaker, and neither credential in it.
    let uris = [
        "https://alice:pw-one@generativelanguage.example/v1/models/m:generateContent?key=AIza-SECRET-1",
        "https://bob:pw-two@generativelanguage.example/v1/models/m:generateContent?key=AIza-SECRET-2",
        "https://generativelanguage.example/v1/models/m:generateContent?key=AIza-SECRET-3",
    ];
    for uri in uris {
        let req = Request::get(uri).body(String::new()).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
    let req = Request::get(uris[0]).body(String::new()).unwrap();
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(
        err.circuit_open().unwrap().key(),
        Some("generativelanguage.example")
    );
    assert_eq!(
        breakers.len(),
        1,
        "one host is one breaker, whatever the credential"
    );
    let mut shown = format!("{err:?} {err}");
    for snap in breakers.snapshots() {
        shown.push_str(&format!("{snap:?}"));
    }
    shown.push_str(&seen.lock().unwrap().join(" "));
    for secret in ["pw-one", "pw-two", "alice", "bob", "AIza", "key="] {
        assert!(!shown.contains(secret), "{secret} leaked: {shown}");
    }
}

/// What anyone holding a log line could compute before keys were keyed: an
/// unkeyed FNV-1a-64 of the credential.
fn unkeyed_fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("#{h:016x}")
}

#[test]
fn a_hashed_key_cannot_be_recomputed_from_the_credential_alone() {
    use tower_circuit_breaker::keyed::KeyFn;
    let r = Request::get("/")
        .header("x-api-key", "sk-live-abcdef")
        .body(())
        .unwrap();
    let key = keyed::header_hashed("x-api-key", &secret())
        .key(&r)
        .unwrap();
    assert_ne!(
        key.as_str(),
        unkeyed_fnv(b"sk-live-abcdef"),
        "an offline guess matches the key"
    );
    assert_eq!(key.as_str().len(), 17);
    assert!(key.as_str()[1..].bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn replicas_with_one_secret_agree_and_other_secrets_do_not() {
    let a = KeySecret::new("shared-by-every-replica-0001").unwrap();
    let b = KeySecret::new("shared-by-every-replica-0001").unwrap();
    let c = KeySecret::new("shared-by-every-replica-0002").unwrap();
    let cred = b"Bearer sk-live-abcdef";
    assert_eq!(
        Key::hashed(&a, cred).as_str(),
        Key::hashed(&b, cred).as_str()
    );
    assert_ne!(
        Key::hashed(&a, cred).as_str(),
        Key::hashed(&c, cred).as_str()
    );
    // Different credentials under one secret stay apart.
    let mut seen = std::collections::HashSet::new();
    for i in 0..10_000u32 {
        let k = Key::hashed(&a, format!("sk-live-{i}").as_bytes());
        assert!(seen.insert(k.as_str().to_owned()));
    }
}

#[test]
fn a_key_secret_is_long_enough_and_never_shown() {
    assert_eq!(
        KeySecret::new("").unwrap_err(),
        KeySecretError::TooShort { len: 0 }
    );
    assert_eq!(
        KeySecret::new([7u8; 15]).unwrap_err(),
        KeySecretError::TooShort { len: 15 }
    );
    assert!(KeySecret::new([7u8; 16]).is_ok());
    let s = KeySecret::new("hunter2-hunter2-hunter2").unwrap();
    let shown = format!("{s:?} {:?}", keyed::header_hashed("x-api-key", &s));
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        !shown.contains(char::is_numeric),
        "no key material: {shown}"
    );
}

// === the cap on open keys ===

fn open_keys(set: &KeyedBreakers) -> usize {
    set.breakers()
        .iter()
        .filter(|b| b.state() == State::Open)
        .count()
}

/// 1,000 keys whose upstream fails for all of them at once, over 20 rounds
/// of open periods and half-open probes: after every call, no more keys are
/// open than the cap allows, and the cap is full (every key it can hold is
/// open) whenever at least that many have failed.
#[tokio::test(start_paused = true)]
async fn a_thousand_keys_failing_at_once_never_open_more_than_the_cap() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .probes(1)
        .close_after(1)
        .jitter(0.0)
        .open_duration(Duration::from_secs(10))
        .max_open_share(0.1)
        .max_keys(2_000)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..1_000).map(|i| format!("model-{i}")).collect();
    for key in &keys {
        set.admit(key).unwrap().record(Outcome::Success);
    }
    assert_eq!(set.max_open(), Some(100));
    let (mut most, mut calls, mut ends) = (0, 0u64, 0u64);
    for _round in 0..8 {
        for key in &keys {
            // Every call that gets through fails.
            if let Ok(permit) = set.admit(key) {
                permit.record(Outcome::Failure);
                calls += 1;
            }
            let open = open_keys(&set);
            assert!(open <= 100, "{open} keys open, the cap is 100");
            most = most.max(open);
        }
        advance(Duration::from_secs(3)).await;
    }
    for b in set.breakers() {
        ends += b.snapshot().counters.admitted;
    }
    assert_eq!(most, 100, "the cap is reached, never passed");
    assert!(calls > 1_000 && ends > 1_000);
}

/// The same from eight threads at once: once they are done, at most the
/// cap is open.
#[test]
fn racing_threads_opening_keys_leave_at_most_the_cap_open() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .jitter(0.0)
        .open_duration(Duration::from_secs(3600))
        .max_open_share(0.05)
        .build()
        .unwrap();
    for i in 0..1_000 {
        set.admit(&format!("k{i}"))
            .unwrap()
            .record(Outcome::Success);
    }
    std::thread::scope(|s| {
        for t in 0..8 {
            let set = &set;
            s.spawn(move || {
                for i in (t..1_000).step_by(8) {
                    if let Ok(p) = set.admit(&format!("k{i}")) {
                        p.record(Outcome::Failure);
                    }
                }
            });
        }
    });
    assert_eq!(open_keys(&set), 50);
}

/// Beyond the cap, the key that opened longest ago goes first; a key that
/// reopens is then the newest.
#[tokio::test(start_paused = true)]
async fn beyond_the_cap_the_key_open_longest_goes_half_open_first() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .probes(1)
        .close_after(1)
        .jitter(0.0)
        .open_duration(Duration::from_secs(60))
        .max_open_share(0.25)
        .build()
        .unwrap();
    for k in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        set.admit(k).unwrap().record(Outcome::Success);
    }
    assert_eq!(set.max_open(), Some(2));
    let state = |k: &str| set.get(k).unwrap().state();
    for k in ["a", "b", "c"] {
        set.admit(k).unwrap().record(Outcome::Failure);
        advance(Duration::from_secs(1)).await;
    }
    assert_eq!(
        (state("a"), state("b"), state("c")),
        (State::HalfOpen, State::Open, State::Open)
    );
    assert_eq!(
        set.get("a").unwrap().snapshot().reason,
        Some(tower_circuit_breaker::Reason::OpenKeysCap)
    );
    // `a`'s probe fails: it reopens, the newest open key, and `b` goes.
    set.admit("a").unwrap().record(Outcome::Failure);
    assert_eq!(
        (state("a"), state("b"), state("c")),
        (State::Open, State::HalfOpen, State::Open)
    );
    // A probe that succeeds closes its key, as after any open period.
    set.admit("b").unwrap().record(Outcome::Success);
    assert_eq!(state("b"), State::Closed);
    // One key may always be open, however small the share.
    let one = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .max_open_share(0.01)
        .build()
        .unwrap();
    one.admit("x").unwrap().record(Outcome::Failure);
    assert_eq!(one.get("x").unwrap().state(), State::Open);
}

/// Only circuits the trip rules opened count: a forced-open key and the
/// overflow breaker take no one's place, and are never ended.
#[tokio::test(start_paused = true)]
async fn forced_open_keys_and_the_overflow_breaker_are_not_counted() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .jitter(0.0)
        .max_keys(4)
        .max_open_share(0.25)
        .build()
        .unwrap();
    for k in ["a", "b", "c", "d"] {
        set.admit(k).unwrap().record(Outcome::Success);
    }
    set.get("a").unwrap().force_open();
    // The set is full: "e" and "f" share the overflow breaker, which opens.
    set.admit("e").unwrap().record(Outcome::Failure);
    set.admit("b").unwrap().record(Outcome::Failure);
    assert_eq!(set.get("a").unwrap().state(), State::ForcedOpen);
    assert_eq!(set.get("b").unwrap().state(), State::Open);
    assert!(set.admit("f").is_err(), "the overflow breaker is open");
}

#[test]
fn a_share_outside_zero_to_one_is_a_config_error() {
    for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        let err = KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .max_open_share(bad)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, KeyedConfigError::MaxOpenShare(_)),
            "{bad}: {err}"
        );
    }
    assert!(KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .max_open_share(1.0)
        .build()
        .is_ok());
}

/// The cap acts on transitions, which happen inside admissions, sweeps and
/// snapshots of the set: with keys opening, going half-open and being
/// evicted from four threads while new keys keep arriving, nothing waits
/// on itself (a hang here fails the test after a minute).
#[test]
fn the_cap_on_open_keys_never_deadlocks_with_admissions_sweeps_and_snapshots() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .jitter(0.0)
        .open_duration(Duration::from_micros(50))
        .probes(1)
        .close_after(1)
        .max_keys(64)
        .idle_timeout(Duration::from_micros(200))
        .max_open_share(0.1)
        .build()
        .unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    for t in 0..4u64 {
        let set = set.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for i in 0..20_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // New keys (inserts and sweeps), and a few hot ones that
                // keep opening and going half-open under the lookups.
                let key = if x % 4 == 0 {
                    format!("new-{t}-{i}")
                } else {
                    format!("hot-{}", x % 16)
                };
                if let Ok(p) = set.admit(&key) {
                    let outcome = if x % 3 == 0 {
                        Outcome::Success
                    } else {
                        Outcome::Failure
                    };
                    p.record(outcome);
                }
                if i % 512 == 0 {
                    let _ = set.snapshots();
                }
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..4 {
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("a thread is stuck: the set waits on itself");
    }
    let open = open_keys(&set);
    assert!(open <= set.max_open().unwrap(), "{open} open");
}
