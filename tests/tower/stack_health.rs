//! A stack's own health prober: built from a health request, handed back as
//! a future (or spawned on a runtime given by name), over real connections.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::sleep;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::health::{
    anthropic_messages_request, openai_completion_request, HealthProbe,
};
use tower_circuit_breaker::keyed::{self, KeyedBreakers};
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::{Breaker, CircuitOpen, Reason, State};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One health probe as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    auth: Option<String>,
    api_key: Option<String>,
    version: Option<String>,
    body: String,
}

/// A hyper server on 127.0.0.1:0 that answers 503 to every request for a
/// broken model until healed, and 200 to everything else. Requests with
/// `x-user` are users'; the rest are health probes, recorded.
#[derive(Clone, Default)]
struct Upstream {
    healed: Arc<AtomicBool>,
    users: Arc<AtomicUsize>,
    probes: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    async fn serve(&self, broken: &'static str) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let me = me.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let me = me.clone();
                        async move {
                            let header = |name: &str| {
                                req.headers()
                                    .get(name)
                                    .map(|v| v.to_str().unwrap().to_owned())
                            };
                            let user = header("x-user").is_some();
                            let seen = Seen {
                                path: req.uri().path().to_owned(),
                                auth: header("authorization"),
                                api_key: header("x-api-key"),
                                version: header("anthropic-version"),
                                body: String::new(),
                            };
                            let model = header("x-model");
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let body = String::from_utf8(body.to_vec()).unwrap();
                            let for_broken = model.as_deref() == Some(broken)
                                || body.contains(&format!("\"model\":\"{broken}\""));
                            if user {
                                me.users.fetch_add(1, Ordering::SeqCst);
                            } else {
                                me.probes.lock().unwrap().push(Seen { body, ..seen });
                            }
                            let status = if for_broken && !me.healed.load(Ordering::SeqCst) {
                                503
                            } else {
                                200
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
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
        addr
    }

    fn probes(&self) -> Vec<Seen> {
        self.probes.lock().unwrap().clone()
    }
}

fn user_call(base: &str, path: &str, model: &str) -> Request<Full<Bytes>> {
    Request::post(format!("{base}{path}"))
        .header("x-user", "1")
        .header("x-model", model)
        .body(Full::new(Bytes::from(format!("{{\"model\":\"{model}\"}}"))))
        .unwrap()
}

fn breaker() -> tower_circuit_breaker::Builder {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(2)
        .open_duration(Duration::from_secs(120))
        .probes(1)
        .close_after(1)
        .jitter(0.0)
}

fn probe_every_2s() -> tower_circuit_breaker::health::HealthProbeBuilder {
    HealthProbe::builder(Duration::from_secs(2))
        .timeout(Duration::from_secs(1))
        .jitter(0.0)
}

/// The stack's prober, with nothing but the health request given: it
/// probes while the circuit is open, users never pay for it, and the heal
/// ends the open period within one interval; a user call then closes it.
#[tokio::test(start_paused = true)]
async fn a_stack_built_with_a_health_request_recovers_with_no_prober_code() {
    let up = Upstream::default();
    let base = format!("http://{}/v1", up.serve("gpt-4o").await);
    let layer = Stack::builder()
        .breaker(breaker())
        .max_retries(0)
        .attempt_timeout(Duration::from_secs(10))
        .classifier(LlmClassifier::default())
        .health_probe(
            probe_every_2s(),
            openai_completion_request::<Bytes>(&base, "sk-health", "gpt-4o").unwrap(),
        )
        .build()
        .unwrap();
    let mut svc = layer.layer(client());
    tokio::spawn(svc.health_prober().expect("built with a health request"));
    let call = || user_call(&base, "/chat/completions", "gpt-4o");

    for _ in 0..2 {
        let res = svc.ready().await.unwrap().call(call()).await.unwrap();
        assert_eq!(res.status(), 503);
    }
    assert_eq!(svc.breaker().state(), State::Open);
    assert!(up.probes().is_empty(), "no probe while closed");

    // Ten seconds open: users are turned away, probes meet the 503s.
    for _ in 0..10 {
        let err = svc.ready().await.unwrap().call(call()).await.unwrap_err();
        assert!(CircuitOpen::find(&*err).is_some());
        sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        up.users.load(Ordering::SeqCst),
        2,
        "no user call while open"
    );
    let probes = up.probes();
    assert!(probes.len() >= 4, "{} probes", probes.len());
    let p = &probes[0];
    assert_eq!(p.path, "/v1/chat/completions");
    assert_eq!(p.auth.as_deref(), Some("Bearer sk-health"));
    assert!(p.body.contains("\"model\":\"gpt-4o\"") && p.body.contains("\"max_tokens\":1"));
    assert_eq!(svc.breaker().state(), State::Open);

    up.healed.store(true, Ordering::SeqCst);
    sleep(Duration::from_millis(2_100)).await;
    let snap = svc.breaker().snapshot();
    assert_eq!(snap.state, State::HalfOpen);
    assert_eq!(snap.reason, Some(Reason::HealthProbe));
    assert!(snap.counters.health_probe_successes >= 1);
    let res = svc.ready().await.unwrap().call(call()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(svc.breaker().state(), State::Closed);
}

/// A keyed stack's prober probes each open key with its own model, and
/// leaves closed keys alone.
#[tokio::test(start_paused = true)]
async fn a_keyed_stack_probes_each_open_key_with_its_own_model() {
    let up = Upstream::default();
    let base = format!("http://{}/v1", up.serve("big").await);
    let probe_base = base.clone();
    let layer = Stack::keyed(
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .no_window()
            .consecutive_failures(2)
            .open_duration(Duration::from_secs(120))
            .probes(1)
            .close_after(1)
            .jitter(0.0),
        keyed::header("x-model"),
    )
    .max_retries(0)
    .attempt_timeout(Duration::from_secs(10))
    .health_probe(probe_every_2s(), move |b: &Breaker| {
        openai_completion_request(&probe_base, "sk-health", b.name().unwrap()).unwrap()
    })
    .build()
    .unwrap();
    let mut svc = layer.layer(client());
    tokio::spawn(svc.health_prober().unwrap());

    for _ in 0..2 {
        for model in ["big", "small"] {
            let call = user_call(&base, "/chat/completions", model);
            let _ = svc.ready().await.unwrap().call(call).await.unwrap();
        }
    }
    let set = svc.breakers().clone();
    assert_eq!(set.get("big").unwrap().state(), State::Open);
    assert_eq!(set.get("small").unwrap().state(), State::Closed);
    sleep(Duration::from_secs(5)).await;
    let probes = up.probes();
    assert!(probes.len() >= 2, "{probes:?}");
    assert!(probes.iter().all(|p| p.body.contains("\"model\":\"big\"")));

    up.healed.store(true, Ordering::SeqCst);
    sleep(Duration::from_millis(2_100)).await;
    assert_eq!(set.get("big").unwrap().state(), State::HalfOpen);
    let call = user_call(&base, "/chat/completions", "big");
    let res = svc.ready().await.unwrap().call(call).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(set.get("big").unwrap().state(), State::Closed);
}

/// Built outside any runtime, the prober is not lost: it is spawned on the
/// runtime given by name, and finds an Anthropic upstream's heal through
/// the ready-made Messages request.
#[test]
fn built_outside_a_runtime_the_prober_runs_where_it_is_spawned() {
    let up = Upstream::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let addr = runtime.block_on(up.serve("claude"));
    let base = format!("http://{addr}/v1");
    // Outside the runtime: no task can be started here, and none is.
    let layer = Stack::builder()
        .breaker(breaker())
        .max_retries(0)
        .attempt_timeout(Duration::from_secs(10))
        .health_probe(
            probe_every_2s(),
            anthropic_messages_request::<Bytes>(&base, "sk-ant-health", "claude").unwrap(),
        )
        .build()
        .unwrap();
    let prober = {
        let _guard = runtime.enter(); // the hyper-util client's executor
        let svc = layer.layer(client());
        (svc.clone(), svc.health_prober().unwrap())
    };
    let (mut svc, prober) = prober;
    let task = prober.spawn_on(runtime.handle());
    runtime.block_on(async {
        for _ in 0..2 {
            let call = user_call(&base, "/messages", "claude");
            let res = svc.ready().await.unwrap().call(call).await.unwrap();
            assert_eq!(res.status(), 503);
        }
        assert_eq!(svc.breaker().state(), State::Open);
        sleep(Duration::from_secs(3)).await;
        up.healed.store(true, Ordering::SeqCst);
        sleep(Duration::from_millis(2_100)).await;
        assert_eq!(svc.breaker().state(), State::HalfOpen);
    });
    let probes = up.probes();
    assert!(!probes.is_empty());
    let p = &probes[0];
    assert_eq!(p.path, "/v1/messages");
    assert_eq!(p.api_key.as_deref(), Some("sk-ant-health"));
    assert_eq!(p.version.as_deref(), Some("2023-06-01"));
    assert!(p.auth.is_none(), "the key goes in x-api-key only");
    task.abort();
}

/// A stack built without a health request has no prober to hand back; a
/// probe timeout longer than the attempt timeout does not fit.
#[test]
fn no_health_request_no_prober_and_the_timeouts_must_fit() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let svc = Stack::builder().build().unwrap().layer(client());
    assert!(svc.health_prober::<Full<Bytes>, Incoming>().is_none());
    let err = Stack::builder()
        .attempt_timeout(Duration::from_secs(5))
        .health_probe(
            HealthProbe::builder(Duration::from_secs(30)).timeout(Duration::from_secs(10)),
            |_: &Breaker| Request::new(Bytes::new()),
        )
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("health probe timeout"), "{err}");
}
