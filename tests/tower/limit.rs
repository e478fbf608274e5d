//! Slowness without a fallback, over real connections: a hyper-util client
//! -> breaker -> attempt timeout -> a hyper server on 127.0.0.1:0, in
//! paused time. The in-flight limit falls only on overload signals whose
//! rate grows with the load; the ramp after half-open raises traffic with a
//! fallback over its period.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::{sleep, Instant};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::{
    Breaker, CircuitBreakerLayer, HasFallback, InFlightLimit, Rejection, State,
};

/// What the server does with one request: answer with a status after a
/// delay, or hang until the client gives up.
#[derive(Clone, Copy)]
enum Act {
    Answer(u16, Duration),
    Hang,
}

/// The server's rule: request number `n` arrives with `in_flight` others
/// at the server.
type Rule = Arc<dyn Fn(u64, usize) -> Act + Send + Sync>;

struct Upstream {
    addr: std::net::SocketAddr,
    in_flight: Arc<AtomicUsize>,
    hits: Arc<AtomicU64>,
    unavailable: Arc<AtomicU64>,
    rule: Arc<Mutex<Rule>>,
}

async fn upstream(rule: Rule) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let up = Upstream {
        addr,
        in_flight: Arc::default(),
        hits: Arc::default(),
        unavailable: Arc::default(),
        rule: Arc::new(Mutex::new(rule)),
    };
    let (in_flight, hits, unavailable, rule) = (
        up.in_flight.clone(),
        up.hits.clone(),
        up.unavailable.clone(),
        up.rule.clone(),
    );
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (in_flight, hits, unavailable, rule) = (
                in_flight.clone(),
                hits.clone(),
                unavailable.clone(),
                rule.clone(),
            );
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let n = hits.fetch_add(1, Ordering::SeqCst);
                    let now = in_flight.fetch_add(1, Ordering::SeqCst);
                    let act = (rule.lock().unwrap())(n, now);
                    let (in_flight, unavailable) = (in_flight.clone(), unavailable.clone());
                    async move {
                        let code = match act {
                            Act::Answer(code, delay) => {
                                sleep(delay).await;
                                code
                            }
                            Act::Hang => {
                                sleep(Duration::from_secs(3600)).await;
                                200
                            }
                        };
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        if code == 503 {
                            unavailable.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(code)
                                .body(Full::new(Bytes::from_static(b"{}")))
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
    up
}

/// What the callers saw.
#[derive(Default)]
struct Seen {
    answered: AtomicU64,
    limited: AtomicU64,
    other_rejections: AtomicU64,
    errors: AtomicU64,
}

/// Spawns `callers` loops calling through `layer` until `until`, each
/// waiting `think` between calls; an attempt times out after `timeout`.
#[allow(clippy::too_many_arguments)]
fn callers(
    layer: &CircuitBreakerLayer,
    addr: std::net::SocketAddr,
    callers: usize,
    start_gap: Duration,
    until: Instant,
    think: Duration,
    timeout: Duration,
    seen: &Arc<Seen>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .timeout(timeout)
        .service(client);
    let uri = format!("http://{addr}/v1/chat/completions");
    (0..callers)
        .map(|i| {
            let (mut svc, uri, seen) = (svc.clone(), uri.clone(), seen.clone());
            tokio::spawn(async move {
                sleep(start_gap * i as u32).await;
                while Instant::now() < until {
                    let req = Request::get(uri.as_str()).body(Empty::new()).unwrap();
                    match svc.ready().await.unwrap().call(req).await {
                        Ok(res) => {
                            res.into_body().collect().await.unwrap();
                            seen.answered.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => match e.circuit_open().map(|o| o.reason()) {
                            Some(Rejection::InFlightLimit) => {
                                seen.limited.fetch_add(1, Ordering::SeqCst);
                            }
                            Some(_) => {
                                seen.other_rejections.fetch_add(1, Ordering::SeqCst);
                            }
                            None => {
                                seen.errors.fetch_add(1, Ordering::SeqCst);
                            }
                        },
                    }
                    sleep(think).await;
                }
            })
        })
        .collect()
}

/// Samples the breaker's limit every 100 ms until `until`: (time since
/// `t0`, limit).
fn sample_limit(
    breaker: &Breaker,
    t0: Instant,
    until: Instant,
) -> tokio::task::JoinHandle<Vec<(Duration, Option<u64>)>> {
    let breaker = breaker.clone();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while Instant::now() < until {
            seen.push((t0.elapsed(), breaker.in_flight_limit()));
            sleep(Duration::from_millis(100)).await;
        }
        seen
    })
}

#[tokio::test(start_paused = true)]
async fn a_healthy_upstream_slowed_to_ten_seconds_keeps_every_call_admitted_without_a_fallback() {
    let up = upstream(Arc::new(|_, _| Act::Answer(200, Duration::from_secs(10)))).await;
    let layer = CircuitBreakerLayer::builder()
        .slow_call(Duration::from_secs(2), 0.5)
        .count_window(10)
        .min_calls(5)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let seen = Arc::new(Seen::default());
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(60);
    let tasks = callers(
        &layer,
        up.addr,
        20,
        Duration::from_millis(50),
        until,
        Duration::from_millis(100),
        Duration::from_secs(30),
        &seen,
    );
    for t in tasks {
        t.await.unwrap();
    }
    let answered = seen.answered.load(Ordering::SeqCst);
    assert!(answered >= 20 * 5, "answered {answered}");
    assert_eq!(seen.limited.load(Ordering::SeqCst), 0);
    assert_eq!(seen.other_rejections.load(Ordering::SeqCst), 0);
    assert_eq!(seen.errors.load(Ordering::SeqCst), 0);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.in_flight_limit(), None);
    let snap = breaker.snapshot();
    assert_eq!(snap.counters.rejected, 0);
    assert_eq!(
        snap.counters.slow, 0,
        "slowness without a fallback is not judged"
    );
}

#[tokio::test(start_paused = true)]
async fn an_upstream_hanging_a_share_of_calls_whatever_the_load_keeps_its_limit() {
    // 7 of every 20 requests hang (35 %), at any load; the rest answer in
    // 200 ms.
    let up = upstream(Arc::new(|n, _| {
        if (n * 7) % 20 < 7 {
            Act::Hang
        } else {
            Act::Answer(200, Duration::from_millis(200))
        }
    }))
    .await;
    // A window wide enough that 35 % failures stay below the rate rule's
    // 50 %: here the limit is what is watched.
    let layer = CircuitBreakerLayer::builder()
        .count_window(200)
        .min_calls(100)
        .failure_rate(0.5)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let seen = Arc::new(Seen::default());
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(90);
    let sampler = sample_limit(&breaker, t0, until);
    // The load grows: a caller more every 2 s, up to 40.
    let tasks = callers(
        &layer,
        up.addr,
        40,
        Duration::from_secs(2),
        until,
        Duration::from_millis(100),
        Duration::from_secs(5),
        &seen,
    );
    for t in tasks {
        t.await.unwrap();
    }
    let limits = sampler.await.unwrap();
    let timeouts = seen.errors.load(Ordering::SeqCst);
    assert!(timeouts >= 100, "the hangs time out: {timeouts}");
    assert!(
        limits.iter().all(|(_, l)| l.is_none()),
        "the limit never fell: {:?}",
        limits.iter().find(|(_, l)| l.is_some())
    );
    assert_eq!(seen.limited.load(Ordering::SeqCst), 0);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_capacity_bound_upstream_answering_503_under_load_has_its_limit_fall_within_a_window_and_recover(
) {
    // Serves 8 at once in 1 s each; beyond that, a fast 503.
    let up = upstream(Arc::new(|_, in_flight| {
        if in_flight >= 8 {
            Act::Answer(503, Duration::from_millis(10))
        } else {
            Act::Answer(200, Duration::from_secs(1))
        }
    }))
    .await;
    let window = Duration::from_secs(10);
    let layer = CircuitBreakerLayer::builder()
        // A failure-rate rule that the limit, once it fell, keeps from
        // firing.
        .count_window(200)
        .min_calls(100)
        .failure_rate(0.9)
        .in_flight_limit(InFlightLimit::new().window(window))
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(120);
    let sampler = sample_limit(&breaker, t0, end);
    let (quiet, busy) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let think = Duration::from_millis(100);
    let timeout = Duration::from_secs(30);
    // 4 callers all along: within capacity.
    let base = callers(
        &layer,
        up.addr,
        4,
        Duration::ZERO,
        end,
        think,
        timeout,
        &quiet,
    );
    // From 10 s to 40 s, 28 more join, one every 250 ms.
    sleep(Duration::from_secs(10)).await;
    let burst_end = t0 + Duration::from_secs(40);
    let burst = callers(
        &layer,
        up.addr,
        28,
        Duration::from_millis(250),
        burst_end,
        think,
        timeout,
        &busy,
    );
    for t in burst.into_iter().chain(base) {
        t.await.unwrap();
    }
    let limits = sampler.await.unwrap();
    let first_503 = up.unavailable.load(Ordering::SeqCst);
    assert!(first_503 > 0, "the burst overloads the upstream");
    let fell = limits
        .iter()
        .find(|(_, l)| l.is_some())
        .expect("the limit fell")
        .0;
    assert!(
        fell >= Duration::from_secs(10) && fell <= Duration::from_secs(10) + window,
        "the limit fell within one window of the overload: at {fell:?}"
    );
    let lowest = limits.iter().filter_map(|(_, l)| *l).min().unwrap();
    assert!(lowest <= 16, "it fell toward the capacity: {lowest}");
    assert!(busy.limited.load(Ordering::SeqCst) > 0);
    // After the burst the limit grows back until it is unbounded again.
    let recovered = limits
        .iter()
        .rev()
        .take_while(|(_, l)| l.is_none())
        .last()
        .expect("unbounded again at the end")
        .0;
    assert!(
        recovered >= Duration::from_secs(40) && recovered <= Duration::from_secs(100),
        "recovered at {recovered:?}"
    );
    // The calm callers were never refused once the burst was over.
    assert_eq!(quiet.other_rejections.load(Ordering::SeqCst), 0);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_healed_upstreams_traffic_with_a_fallback_rises_over_the_ramp() {
    let up = upstream(Arc::new(|_, _| Act::Answer(503, Duration::from_millis(10)))).await;
    let ramp = Duration::from_secs(10);
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(3)
        .open_duration(Duration::from_secs(30))
        .jitter(0.0)
        .probes(2)
        .close_after(2)
        .ramp(ramp)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new().layer(layer).service(client);
    let uri = format!("http://{}/v1/chat/completions", up.addr);
    // One call marked as having a fallback: to the upstream, or refused
    // (with the ramp's reason, while it lasts) so the caller goes to its
    // fallback. Returns whether the upstream got it.
    let call = || {
        let (svc, uri) = (svc.clone(), uri.clone());
        async move {
            let mut req = Request::get(uri.as_str()).body(Empty::new()).unwrap();
            req.extensions_mut().insert(HasFallback);
            match svc.oneshot(req).await {
                Ok(res) => {
                    res.into_body().collect().await.unwrap();
                    true
                }
                Err(e) => {
                    let reason = e.circuit_open().expect("only refusals").reason();
                    assert!(matches!(
                        reason,
                        Rejection::Ramp | Rejection::Open | Rejection::HalfOpenFull
                    ));
                    false
                }
            }
        }
    };
    while breaker.state() == State::Closed {
        call().await;
    }
    // The upstream heals; the probes close the circuit once open is over.
    *up.rule.lock().unwrap() = Arc::new(|_, _| Act::Answer(200, Duration::from_millis(10)));
    sleep(Duration::from_secs(30)).await;
    while breaker.state() != State::Closed {
        call().await;
    }
    // A call every 50 ms for the ramp and a second more: the upstream's
    // share per second rises.
    let mut per_second = vec![0u32; 11];
    let t0 = Instant::now();
    for i in 0..220u32 {
        tokio::time::sleep_until(t0 + Duration::from_millis(50) * i).await;
        if call().await {
            per_second[i as usize / 20] += 1;
        }
    }
    // 20 calls a second: about 2 × (s + 0.5) of them reach it in second s.
    assert!(per_second[0] <= 4, "{per_second:?}");
    assert!(per_second[4] >= 6 && per_second[4] <= 12, "{per_second:?}");
    assert!(per_second[9] >= 16, "{per_second:?}");
    assert_eq!(per_second[10], 20, "the ramp is over: {per_second:?}");
    for s in 1..10 {
        assert!(
            per_second[s] + 2 >= per_second[s - 1],
            "rising: {per_second:?}"
        );
    }
    assert_eq!(breaker.state(), State::Closed);
}
