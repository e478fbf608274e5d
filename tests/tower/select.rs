//! Selection among equivalent members over real connections: a hyper-util
//! client, each member a breaker with the LLM classifier, against two hyper
//! servers on 127.0.0.1:0 whose latency and status the test sets.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::Empty;
use tower::ServiceExt;
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::failover::{Failover, Hedge, Selection};
use tower_circuit_breaker::{Breaker, CircuitBreaker, State, TripMode};

use crate::support::{http_client, json, read_all, serve, Hits, HttpClient};

/// A region whose answers take `delay_ms` and carry `status`.
struct Region {
    addr: SocketAddr,
    hits: Hits,
    status: Arc<AtomicU16>,
    delay_ms: Arc<AtomicU64>,
}

async fn region(name: &'static str, delay_ms: u64) -> Region {
    let hits = Hits::default();
    let status = Arc::new(AtomicU16::new(200));
    let delay = Arc::new(AtomicU64::new(delay_ms));
    let delay_ms = Arc::clone(&delay);
    let (h, s) = (hits.clone(), Arc::clone(&status));
    let app = Router::new().route(
        "/v1/chat/completions",
        get(move || {
            h.hit();
            let (status, delay) = (s.load(Ordering::SeqCst), delay.load(Ordering::SeqCst));
            async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                json(StatusCode::from_u16(status).unwrap(), &[], name)
            }
        }),
    );
    Region {
        addr: serve(app).await,
        hits,
        status,
        delay_ms,
    }
}

fn breaker(name: &str) -> Breaker {
    Breaker::builder()
        .name(name)
        .consecutive_failures(1)
        .trip_mode(TripMode::Open)
        .open_duration(Duration::from_secs(10))
        .jitter(0.0)
        .probes(1)
        .close_after(1)
        // No ramp after closing, which rejects a share of calls on its own.
        .ramp(Duration::ZERO)
        .build()
        .unwrap()
}

fn request(addr: SocketAddr) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}/v1/chat/completions"))
        .body(Empty::new())
        .unwrap()
}

type Member = CircuitBreaker<HttpClient, LlmClassifier>;

fn failover(
    fast: &Region,
    breakers: &[Breaker; 2],
    selection: Selection,
) -> Failover<Member, Request<Empty<Bytes>>, LlmClassifier> {
    let member = |b: &Breaker| {
        CircuitBreaker::with_classifier(http_client(), b.clone(), LlmClassifier::new())
    };
    let fast_addr = fast.addr;
    Failover::new(member(&breakers[0]))
        .fallback_with(
            member(&breakers[1]),
            move |req: &mut Request<Empty<Bytes>>| {
                *req.uri_mut() =
                    Uri::try_from(format!("http://{fast_addr}/v1/chat/completions")).unwrap();
            },
        )
        .with_classifier(LlmClassifier::new())
        .jitter(Duration::ZERO, Duration::ZERO)
        .seed(7)
        .select(selection)
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_faster_member_is_chosen_an_open_one_never_and_a_healed_one_again() {
    let slow = region("slow", 400).await;
    let fast = region("fast", 40).await;
    let breakers = [breaker("slow"), breaker("fast")];
    let selection = Selection::peak_ewma(breakers.clone());
    let svc = failover(&fast, &breakers, selection.clone());
    let call = || svc.clone().oneshot(request(slow.addr));

    // Both are tried once while they have no estimate, then the fast one
    // takes the traffic.
    for _ in 0..20 {
        let res = call().await.unwrap();
        read_all(res.into_body()).await.unwrap();
    }
    assert!(
        fast.hits.get() >= 17,
        "fast {} slow {}",
        fast.hits.get(),
        slow.hits.get()
    );

    // The fast region breaks: one 503 opens its circuit, and from then on it
    // is never chosen (not even rejected: no admission is asked of it).
    fast.status.store(503, Ordering::SeqCst);
    let res = call().await.unwrap();
    assert_eq!(
        read_all(res.into_body()).await.unwrap(),
        "slow",
        "failed over"
    );
    assert_eq!(breakers[1].state(), State::Open);
    let (fast_hits, rejected) = (fast.hits.get(), breakers[1].snapshot().counters.rejected);
    for _ in 0..20 {
        let res = call().await.unwrap();
        assert_eq!(read_all(res.into_body()).await.unwrap(), "slow");
    }
    assert_eq!(fast.hits.get(), fast_hits);
    assert_eq!(
        breakers[1].snapshot().counters.rejected,
        rejected,
        "never chosen while open"
    );

    // It heals; once its open period is over it is chosen again, closes,
    // and takes the traffic back.
    fast.status.store(200, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    for _ in 0..20 {
        let res = call().await.unwrap();
        read_all(res.into_body()).await.unwrap();
    }
    assert_eq!(
        breakers[1].state(),
        State::Closed,
        "{:?}",
        breakers[1].snapshot()
    );
    assert!(
        fast.hits.get() >= fast_hits + 17,
        "fast {} of 20",
        fast.hits.get() - fast_hits
    );

    // The slow region turns faster than the other. It is hardly called, but
    // once its estimate is a decay time old it is probed, and then takes the
    // traffic (but for one probe of the other a decay time, 10 s).
    slow.delay_ms.store(10, Ordering::SeqCst);
    for _ in 0..90 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let res = call().await.unwrap();
        read_all(res.into_body()).await.unwrap();
    }
    let slow_hits = slow.hits.get();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let res = call().await.unwrap();
        read_all(res.into_body()).await.unwrap();
    }
    assert_eq!(slow.hits.get(), slow_hits + 18, "all but the two probes");
}

#[tokio::test(start_paused = true)]
async fn the_cheapest_closed_member_is_chosen() {
    let dear = region("dear", 10).await;
    let cheap = region("cheap", 10).await;
    let breakers = [breaker("dear"), breaker("cheap")];
    let selection = Selection::cheapest([(breakers[0].clone(), 3.0), (breakers[1].clone(), 1.0)]);
    let svc = failover(&cheap, &breakers, selection);
    let call = || svc.clone().oneshot(request(dear.addr));
    for _ in 0..5 {
        assert_eq!(
            read_all(call().await.unwrap().into_body()).await.unwrap(),
            "cheap"
        );
    }
    breakers[1].force_open();
    for _ in 0..5 {
        assert_eq!(
            read_all(call().await.unwrap().into_body()).await.unwrap(),
            "dear"
        );
    }
    assert_eq!(
        breakers[1].snapshot().counters.rejected,
        0,
        "never chosen while open"
    );
    breakers[1].reset();
    assert_eq!(
        read_all(call().await.unwrap().into_body()).await.unwrap(),
        "cheap"
    );
    assert_eq!((dear.hits.get(), cheap.hits.get()), (5, 6));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_goes_to_the_selections_second_choice_and_the_loser_feeds_its_estimate() {
    let slow = region("slow", 2000).await;
    let fast = region("fast", 40).await;
    let breakers = [breaker("slow"), breaker("fast")];
    let selection = Selection::peak_ewma(breakers.clone());
    // The slow region looked the faster a moment ago: it is chosen first.
    selection.record(0, Duration::from_millis(100));
    selection.record(1, Duration::from_millis(300));
    let hedge = Hedge::after(Duration::from_millis(300))
        .budget_percent(1000.0)
        .unwrap();
    let svc = failover(&fast, &breakers, selection.clone()).hedge(hedge.clone());
    let call = || svc.clone().oneshot(request(slow.addr));

    let res = call().await.unwrap();
    assert_eq!(
        read_all(res.into_body()).await.unwrap(),
        "fast",
        "the hedge won"
    );
    assert_eq!(hedge.sent(), 1);
    assert_eq!((slow.hits.get(), fast.hits.get()), (1, 1));
    assert!(
        selection.estimate(0) >= Some(Duration::from_millis(300)),
        "the loser had no head after the hedge's delay: {:?}",
        selection.estimate(0)
    );
    assert_eq!(
        breakers[0].snapshot().counters.failures,
        0,
        "a lost race is no failure"
    );

    // Now the fast region is the selection's first choice: no hedge needed.
    let res = call().await.unwrap();
    assert_eq!(read_all(res.into_body()).await.unwrap(), "fast");
    assert_eq!(hedge.sent(), 1);
    assert_eq!((slow.hits.get(), fast.hits.get()), (1, 2));
}
