//! Recovery: a breaker closes again soon after its upstream heals, found by
//! its own health probes or by its half-open probes' deadlines, and never
//! bills users for finding out.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::{sleep, Instant};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{HttpClassifier, LlmClassifier};
use tower_circuit_breaker::health::{GrpcHealthClassifier, HealthProbe};
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::{
    BoxError, Breaker, CircuitBreakerLayer, Outcome, Reason, State, Transition,
};

type Log = Arc<Mutex<Vec<(Instant, State, Reason)>>>;

fn logged(b: tower_circuit_breaker::Builder) -> (tower_circuit_breaker::Builder, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let b = b.on_transition(move |t: &Transition| l.lock().unwrap().push((t.at, t.to, t.reason)));
    (b, log)
}

/// An upstream that hangs until healed, then answers 200 at once.
#[derive(Clone, Default)]
struct Scripted {
    healed: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Scripted {
    fn service(
        &self,
    ) -> impl Service<
        Request<String>,
        Response = Response<String>,
        Error = BoxError,
        Future = impl Send + use<>,
    > + Clone
           + use<> {
        let me = self.clone();
        tower::service_fn(move |_req: Request<String>| {
            let me = me.clone();
            async move {
                me.calls.fetch_add(1, Ordering::SeqCst);
                if !me.healed.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(Response::new(String::new()))
            }
        })
    }
}

fn quick_start() -> tower_circuit_breaker::Builder {
    // The README's quick start, with jitter off so the figures are exact.
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .count_window(20)
        .min_calls(20)
        .failure_rate(0.5)
        .open_duration(Duration::from_secs(30))
        .probes(3)
        .close_after(2)
        .jitter(0.0)
}

/// Sends one request through `svc` in its own task, so a hung call does
/// not hold the test; the task says whether it got an answer.
fn fire<S>(svc: &S) -> tokio::task::JoinHandle<Result<(), BoxError>>
where
    S: Service<Request<String>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send,
    S::Future: Send,
{
    let svc = svc.clone();
    tokio::spawn(async move {
        svc.oneshot(Request::new(String::new()))
            .await
            .map(drop)
            .map_err(Into::into)
    })
}

#[tokio::test(start_paused = true)]
async fn the_quick_start_over_a_hang_reopens_with_growing_backoff_and_closes_after_the_heal() {
    let upstream = Scripted::default();
    let (builder, log) = logged(quick_start());
    let breaker = builder.build().unwrap();
    let client = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone()).with_classifier(LlmClassifier::default()))
        .timeout(Duration::from_secs(60))
        .service(upstream.service());

    // Traffic every second for fifteen minutes; the upstream heals at 400 s.
    let start = Instant::now();
    let mut handles = Vec::new();
    for s in 0..900u64 {
        if s == 400 {
            upstream.healed.store(true, Ordering::SeqCst);
        }
        handles.push(fire(&client));
        sleep(Duration::from_secs(1)).await;
    }
    for h in handles {
        let _ = h.await;
    }
    let log = log.lock().unwrap().clone();
    let opens: Vec<_> = log.iter().filter(|(_, to, _)| *to == State::Open).collect();
    assert!(
        opens.len() >= 3,
        "tripped, then reopened after failed cycles: {log:?}"
    );
    // Each failed half-open cycle reopened at its probes' deadline (30 s
    // after they went out), for twice as long as the last time.
    let gaps: Vec<_> = opens
        .windows(2)
        .map(|w| w[1].0.duration_since(w[0].0).as_secs())
        .collect();
    // (Plus up to two seconds: calls come once a second, and both the end of
    // the open period and a probe's deadline are strict, so each is seen by
    // the first call after the moment, not by one arriving exactly at it.)
    assert!(
        (60..=62).contains(&gaps[0]) && (90..=92).contains(&gaps[1]),
        "open 30 s + deadline 30 s, then open 60 s + 30 s: {gaps:?}"
    );
    let closed = log
        .iter()
        .find(|(_, to, _)| *to == State::Closed)
        .unwrap_or_else(|| panic!("it closed after the heal: {log:?}"));
    let heal = start + Duration::from_secs(400);
    assert!(closed.0 > heal);
    // Closed within the backoff cap (300 s) plus the probe deadline plus 5 s.
    assert!(
        closed.0.duration_since(heal) <= Duration::from_secs(300 + 30 + 5),
        "{log:?}"
    );
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_health_probe_ends_the_open_period_and_real_traffic_confirms() {
    let upstream = Scripted::default();
    let (builder, log) = logged(
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(2)
            .open_duration(Duration::from_secs(300))
            .probes(1)
            .close_after(1)
            .jitter(0.0),
    );
    let breaker = builder.build().unwrap();
    let prober = HealthProbe::builder(Duration::from_secs(5))
        .jitter(0.0)
        .build(upstream.service(), HttpClassifier, |_: &Breaker| {
            Request::new(String::new())
        })
        .unwrap();
    tokio::spawn(prober.run(breaker.clone()));
    let client = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone()))
        .timeout(Duration::from_secs(60))
        .service(upstream.service());
    let _hung = [fire(&client), fire(&client)];
    sleep(Duration::from_secs(61)).await;
    assert_eq!(breaker.state(), State::Open);
    // Unhealthy probes change nothing: still open, backoff untouched.
    sleep(Duration::from_secs(60)).await;
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Open);
    assert!(snap.counters.health_probe_failures >= 10);
    assert_eq!(snap.reopens, 0);

    upstream.healed.store(true, Ordering::SeqCst);
    let healed_at = Instant::now();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        breaker.state(),
        State::HalfOpen,
        "found within one interval"
    );
    let (at, _, reason) = *log.lock().unwrap().last().unwrap();
    assert_eq!(reason, Reason::HealthProbe);
    assert!(at.duration_since(healed_at) <= Duration::from_secs(5));
    // Health probes never entered the window or the user counters.
    let snap = breaker.snapshot();
    assert_eq!(snap.counters.successes, 0);
    assert_eq!(snap.counters.health_probe_successes, 1);

    fire(&client).await.unwrap().unwrap();
    assert_eq!(breaker.state(), State::Closed, "a real call confirmed it");
}

#[tokio::test(start_paused = true)]
async fn a_half_open_cycle_held_by_hung_probes_hides_a_heal_no_longer_than_their_deadline() {
    let upstream = Scripted::default();
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(10))
        .probes(2)
        .close_after(1)
        .probe_timeout(Duration::from_secs(50))
        .jitter(0.0)
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone()))
        .timeout(Duration::from_secs(60))
        .service(upstream.service());
    breaker.admit().unwrap().record(Outcome::Failure);
    sleep(Duration::from_secs(10)).await;
    // Both probe slots go to calls that hang.
    let _hung = [fire(&client), fire(&client)];
    sleep(Duration::from_secs(1)).await;
    assert!(fire(&client).await.unwrap().is_err(), "every slot is taken");
    upstream.healed.store(true, Ordering::SeqCst);
    // A healthy health probe does not restart the cycle: its probes still
    // hold the upstream, and the budget bounds them.
    breaker.record_health_probe(Outcome::Success);
    assert_eq!(breaker.state(), State::HalfOpen);
    assert!(fire(&client).await.unwrap().is_err(), "still every slot");
    // At their deadline the hung probes fail and the circuit reopens; the
    // next healthy probe ends that open period and real traffic confirms.
    sleep(Duration::from_secs(50)).await;
    assert_eq!(breaker.state(), State::Open);
    breaker.record_health_probe(Outcome::Success);
    fire(&client).await.unwrap().unwrap();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn rate_limits_errors_and_panicking_factories_are_not_heals() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .jitter(0.0)
        .build()
        .unwrap();
    breaker.admit().unwrap().record(Outcome::Failure);
    let limited = tower::service_fn(|_req: Request<String>| async {
        let mut res = Response::new(String::new());
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        Ok::<_, BoxError>(res)
    });
    let mut prober = HealthProbe::builder(Duration::from_secs(1))
        .build(limited, HttpClassifier, |_: &Breaker| {
            Request::new(String::new())
        })
        .unwrap();
    let outcome = prober.probe(&breaker).await;
    breaker.record_health_probe(outcome);
    assert_eq!(breaker.state(), State::Open, "a 429 is not a heal");

    let failing = tower::service_fn(|_req: Request<String>| async {
        Err::<Response<String>, BoxError>("connection reset".into())
    });
    let mut prober = HealthProbe::builder(Duration::from_secs(1))
        .build(failing, HttpClassifier, |_: &Breaker| -> Request<String> {
            panic!("a factory with a bug")
        })
        .unwrap();
    let outcome = prober.probe(&breaker).await;
    assert_eq!(outcome, Outcome::Failure);
    breaker.record_health_probe(outcome);
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.snapshot().counters.health_probe_failures, 2);

    use tower_circuit_breaker::health::HealthProbeError;
    for (bad, why) in [
        (
            HealthProbe::builder(Duration::ZERO).build((), (), ()),
            HealthProbeError::ZeroInterval,
        ),
        (
            HealthProbe::builder(Duration::from_secs(1))
                .timeout(Duration::ZERO)
                .build((), (), ()),
            HealthProbeError::ZeroTimeout,
        ),
    ] {
        assert_eq!(bad.unwrap_err(), why);
    }
}

#[tokio::test(start_paused = true)]
async fn one_prober_serves_every_open_key_of_a_set() {
    let healthy = Arc::new(Mutex::new(vec!["gpt-4o".to_string()]));
    let h = healthy.clone();
    let upstream = tower::service_fn(move |req: Request<String>| {
        let ok = h.lock().unwrap().iter().any(|k| k == req.body());
        async move {
            let mut res = Response::new(String::new());
            if !ok {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok::<_, BoxError>(res)
        }
    });
    let set: KeyedBreakers = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(600))
        .jitter(0.0)
        .into_builder()
        .build()
        .unwrap();
    for key in ["gpt-4o", "claude", "gemini"] {
        set.admit(key).unwrap().record(Outcome::Failure);
    }
    let prober = HealthProbe::builder(Duration::from_secs(5))
        .max_in_flight(2)
        .build(upstream, HttpClassifier, |b: &Breaker| {
            Request::new(b.name().unwrap_or_default().to_string())
        })
        .unwrap();
    tokio::spawn(prober.run_keyed(set.clone()));
    sleep(Duration::from_secs(6)).await;
    assert_eq!(set.get("gpt-4o").unwrap().state(), State::HalfOpen);
    assert_eq!(set.get("claude").unwrap().state(), State::Open);
    healthy.lock().unwrap().push("claude".into());
    sleep(Duration::from_secs(5)).await;
    assert_eq!(set.get("claude").unwrap().state(), State::HalfOpen);
    assert_eq!(set.get("gemini").unwrap().state(), State::Open);
}

#[test]
fn the_grpc_health_classifier_reads_serving_from_the_body() {
    use http::HeaderMap;
    use tower_circuit_breaker::classify::{Classify, ClassifyStream, Verdict};
    let verdict = |body: &[u8], status: &str| {
        let Verdict::Defer(mut s) =
            GrpcHealthClassifier.classify_response(StatusCode::OK, &HeaderMap::new())
        else {
            panic!("defers to the body")
        };
        for chunk in body.chunks(2) {
            assert_eq!(s.on_data(chunk), None);
        }
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", status.parse().unwrap());
        s.on_trailers(&trailers)
    };
    assert_eq!(verdict(&[0, 0, 0, 0, 2, 8, 1], "0"), Some(Outcome::Success));
    assert_eq!(
        verdict(&[0, 0, 0, 0, 2, 8, 2], "0"),
        Some(Outcome::Failure),
        "NOT_SERVING"
    );
    assert_eq!(
        verdict(&[0, 0, 0, 0, 0], "0"),
        Some(Outcome::Failure),
        "UNKNOWN"
    );
    assert_eq!(
        verdict(&[0, 0, 0, 0, 2, 8, 1], "14"),
        Some(Outcome::Failure)
    );
    let mut trailers_only = HeaderMap::new();
    trailers_only.insert("grpc-status", "0".parse().unwrap());
    assert!(matches!(
        GrpcHealthClassifier.classify_response(StatusCode::OK, &trailers_only),
        Verdict::Done(Outcome::Failure)
    ));
}

// === over a real connection ===

/// A hyper server on 127.0.0.1:0 that hangs until healed; counts user
/// calls (`/v1/chat/completions`) and health probes (`/v1/models`) apart.
struct Upstream {
    addr: std::net::SocketAddr,
    healed: Arc<AtomicBool>,
    user_calls: Arc<AtomicUsize>,
    health_calls: Arc<AtomicUsize>,
}

async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let healed = Arc::new(AtomicBool::new(false));
    let user_calls = Arc::new(AtomicUsize::new(0));
    let health_calls = Arc::new(AtomicUsize::new(0));
    let (ok, users, health) = (healed.clone(), user_calls.clone(), health_calls.clone());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (ok, users, health) = (ok.clone(), users.clone(), health.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let counter = if req.uri().path() == "/v1/models" {
                        &health
                    } else {
                        &users
                    };
                    counter.fetch_add(1, Ordering::SeqCst);
                    let ok = ok.clone();
                    async move {
                        if !ok.load(Ordering::SeqCst) {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Upstream {
        addr,
        healed,
        user_calls,
        health_calls,
    }
}

#[tokio::test(start_paused = true)]
async fn over_a_real_connection_health_probes_find_the_heal_and_users_never_pay_for_it() {
    let up = upstream().await;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let (builder, log) = logged(
        Breaker::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(2)
            .open_duration(Duration::from_secs(120))
            .probes(1)
            .close_after(1)
            .jitter(0.0),
    );
    let breaker = builder.build().unwrap();
    let models = format!("http://{}/v1/models", up.addr);
    let prober = HealthProbe::builder(Duration::from_secs(2))
        .timeout(Duration::from_secs(1))
        .jitter(0.0)
        .build(client.clone(), HttpClassifier, move |_: &Breaker| {
            Request::get(models.as_str()).body(Empty::new()).unwrap()
        })
        .unwrap();
    tokio::spawn(prober.run(breaker.clone()));
    let svc = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone()))
        .timeout(Duration::from_secs(10))
        .service(client);
    let chat = format!("http://{}/v1/chat/completions", up.addr);
    // Two calls hang to their 10 s timeouts: the circuit opens.
    let hung: Vec<_> = (0..2)
        .map(|_| {
            let mut svc = svc.clone();
            let req = Request::post(chat.as_str())
                .body(Empty::<Bytes>::new())
                .unwrap();
            tokio::spawn(async move { svc.ready().await?.call(req).await })
        })
        .collect();
    for h in hung {
        assert!(h.await.unwrap().is_err());
    }
    assert_eq!(breaker.state(), State::Open);
    let users_at_open = up.user_calls.load(Ordering::SeqCst);
    assert_eq!(users_at_open, 2);

    // Twenty seconds of open circuit: users are turned away at once,
    // health probes keep failing against the hang.
    for _ in 0..20 {
        let req = Request::post(chat.as_str())
            .body(Empty::<Bytes>::new())
            .unwrap();
        let err = svc.clone().oneshot(req).await.unwrap_err();
        assert!(err.is_circuit_open());
        sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        up.user_calls.load(Ordering::SeqCst),
        users_at_open,
        "no user call while open"
    );
    assert!(up.health_calls.load(Ordering::SeqCst) >= 9);

    up.healed.store(true, Ordering::SeqCst);
    let healed_at = Instant::now();
    sleep(Duration::from_secs(2) + Duration::from_millis(100)).await;
    assert_eq!(
        breaker.state(),
        State::HalfOpen,
        "{:?}",
        log.lock().unwrap()
    );
    let (half_open_at, _, reason) = *log.lock().unwrap().last().unwrap();
    assert_eq!(reason, Reason::HealthProbe);
    assert!(half_open_at.duration_since(healed_at) <= Duration::from_secs(2));
    assert_eq!(up.user_calls.load(Ordering::SeqCst), users_at_open);

    // The confirming call closes it.
    let req = Request::post(chat.as_str())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let _ = res.into_body().collect().await;
    assert_eq!(breaker.state(), State::Closed);
}
