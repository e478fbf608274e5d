//! Graded admission over real connections: a hyper-util client -> breaker
//! -> hyper server on 127.0.0.1:0 that answers a fixed share of its calls.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitBreakerLayer, Rejection, State};

/// A server whose `n`th call (from 0) is answered 200 when
/// `n * ok % 100 < ok`, 503 otherwise: `ok` % of every 100 calls, spread.
async fn upstream(ok: u64) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    serve(move |n| if n * ok % 100 < ok { 200 } else { 503 }).await
}

/// A server answering its `n`th call (from 0) with `code(n)`.
async fn serve(
    code: impl Fn(u64) -> u16 + Copy + Send + Sync + 'static,
) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let h = h.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let code = code(h.fetch_add(1, Ordering::SeqCst));
                    async move {
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
    (addr, hits)
}

type Svc = CircuitBreaker<Client<HttpConnector, Empty<Bytes>>>;

fn client(layer: CircuitBreakerLayer) -> Svc {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    ServiceBuilder::new().layer(layer).service(client)
}

/// One call 100 ms after the last, through the breaker (or a layer around
/// it); `Err` holds the rejection's reason.
async fn call<S, B>(svc: &mut S, addr: std::net::SocketAddr) -> Result<u16, Rejection>
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = tower_circuit_breaker::Error>,
    B: http_body::Body<Error: std::fmt::Debug>,
{
    tokio::time::advance(Duration::from_millis(100)).await;
    let request = Request::get(format!("http://{addr}/v1/chat/completions"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    match svc.ready().await.unwrap().call(request).await {
        Ok(res) => {
            let status = res.status().as_u16();
            res.into_body().collect().await.unwrap();
            Ok(status)
        }
        Err(e) => Err(e.circuit_open().expect("only rejections fail").reason()),
    }
}

fn layer(failure_rate: f64) -> (CircuitBreakerLayer, Breaker) {
    let layer = CircuitBreakerLayer::builder()
        .count_window(20)
        .min_calls(20)
        .failure_rate(failure_rate)
        // The defaults: graded admission, K = 5.
        .seed(11)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    (layer, breaker)
}

#[tokio::test(start_paused = true)]
async fn an_upstream_answering_58_percent_keeps_nearly_all_its_traffic() {
    let (addr, hits) = upstream(58).await;
    // A rule strict enough to fire on 42 % failures: all or nothing would
    // open the circuit on this upstream.
    let (layer, breaker) = layer(0.3);
    let mut svc = client(layer);
    let (mut rejected, mut graded_seen) = (0, false);
    for _ in 0..1000 {
        if call(&mut svc, addr).await.is_err() {
            rejected += 1;
        }
        graded_seen |= breaker.snapshot().shed.is_some();
    }
    assert!(graded_seen, "the rule fired and graded admission took over");
    assert!(rejected * 100 <= 5 * 1000, "{rejected} of 1000 rejected");
    assert_eq!(hits.load(Ordering::SeqCst), 1000 - rejected);
    assert_eq!(breaker.snapshot().counters.graded_rejected, rejected);
}

#[tokio::test(start_paused = true)]
async fn an_upstream_answering_5_percent_is_shed_to_a_trickle_within_one_window() {
    let (addr, hits) = upstream(5).await;
    let (layer, breaker) = layer(0.5);
    let mut svc = client(layer);
    // Until the rule fires.
    let mut calls = 0;
    while breaker.snapshot().shed.is_none() {
        assert!(call(&mut svc, addr).await.is_ok());
        calls += 1;
        assert!(calls <= 20, "min_calls is 20");
    }

    // The next 50 calls, 5 s of the 30 s window: the share the snapshot
    // says was shed is what this test counts.
    let mut graded = 0;
    for _ in 0..50 {
        if call(&mut svc, addr).await == Err(Rejection::Graded) {
            graded += 1;
        }
    }
    let snap = breaker.snapshot();
    let shed = snap.shed.expect("still grading");
    assert_eq!(snap.counters.graded_rejected, graded);
    assert_eq!(shed.rejected, graded);
    // The window holds the 20 calls that fired the rule and these 50.
    assert_eq!(shed.requests, 20 + 50);
    assert_eq!(shed.share(), graded as f64 / 70.0);
    // p starts at (20 − 5·1) / 21 ≈ 0.71 and rises as requests pass accepts.
    assert!(graded >= 30, "only {graded} of 50 shed");

    // The rest of the window: a trickle reaches the upstream, then none.
    let mut reached = [0; 5];
    for slice in &mut reached {
        let at = hits.load(Ordering::SeqCst);
        for _ in 0..50 {
            let _ = call(&mut svc, addr).await;
        }
        *slice = hits.load(Ordering::SeqCst) - at;
    }
    // K = 5 and s = 0.05: K·s = 0.25, so the trickle decays (at most a
    // fifth of each 50 calls, a tenth of the last) until the circuit opens.
    assert!(
        reached.iter().all(|&n| n <= 50 / 5) && reached[4] <= 50 / 10,
        "{reached:?} of each 50 calls reached the upstream"
    );
    assert_eq!(breaker.state(), State::Open, "accepts nearly zero: open");
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_fails_everything_since_it_answered_opens_when_the_rule_fires() {
    // Healthy for 20 calls, then 503 for good.
    let (addr, hits) = serve(|n| if n < 20 { 200 } else { 503 }).await;
    let (layer, breaker) = layer(0.5);
    let mut svc = client(layer);
    for _ in 0..20 {
        assert_eq!(call(&mut svc, addr).await, Ok(200));
    }
    // The rule fires at the 10th 503 (10 of the last 20 failed). Its window
    // still holds 10 accepts, but every failure it saw is in the streak:
    // the upstream answered until it failed everything, and the circuit
    // opens for every call, as all or nothing would.
    for failure in 1..=10 {
        assert_eq!(call(&mut svc, addr).await, Ok(503), "failure {failure}");
        assert!(breaker.snapshot().shed.is_none(), "never graded");
    }
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(call(&mut svc, addr).await, Err(Rejection::Open));
    assert_eq!(hits.load(Ordering::SeqCst), 30);
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_dies_opens_after_twenty_failures_in_a_row() {
    // Healthy for 20 calls but the 16th, then 503 for good.
    let (addr, hits) = serve(|n| if n < 20 && n != 15 { 200 } else { 503 }).await;
    let (layer, breaker) = layer(0.5);
    let mut svc = client(layer);
    for n in 0..20 {
        let expected = if n == 15 { 503 } else { 200 };
        assert_eq!(call(&mut svc, addr).await, Ok(expected));
    }
    // The rule fires at the 9th 503 in a row (with the 16th call's, 10 of
    // the last 20 failed), with 10 accepts in the window: nothing is shed
    // yet, and under the window's test alone (accepts below 1 in 100
    // requests) this would go on for its 30 s. The 20th failure in a row
    // opens it for every call.
    for failure in 1..=20 {
        assert_eq!(call(&mut svc, addr).await, Ok(503), "failure {failure}");
        let graded = breaker.snapshot().shed.is_some();
        assert_eq!(
            graded,
            (9..20).contains(&failure),
            "grading after failure {failure}"
        );
    }
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(call(&mut svc, addr).await, Err(Rejection::Open));
    assert_eq!(hits.load(Ordering::SeqCst), 40);
}

#[tokio::test(start_paused = true)]
async fn once_a_graded_call_succeeds_a_streak_does_not_open_it() {
    // Healthy for 20 calls but the 16th, 9 failures (the rule fires), one
    // more, one success while grading, then 503 for good.
    let ok = |n: u64| (n < 20 && n != 15) || n == 30;
    let (addr, hits) = serve(move |n| if ok(n) { 200 } else { 503 }).await;
    let (layer, breaker) = layer(0.5);
    let mut svc = client(layer);
    for n in 0..51 {
        let expected = if ok(n) { 200 } else { 503 };
        assert_eq!(call(&mut svc, addr).await, Ok(expected), "call {n}");
    }
    // 20 failures in a row since that success: the upstream answered a
    // graded call, so only the window (accepts under 1 in 100) opens it.
    assert_eq!(breaker.state(), State::Closed);
    assert!(breaker.snapshot().shed.is_some(), "still grading");
    assert_eq!(hits.load(Ordering::SeqCst), 51);
}

/// A breaker grading with a high shed share over an upstream that has
/// healed: 19 of its first 20 calls failed (the 11th answered), every call
/// after them is answered.
async fn grading_over_a_healed_upstream() -> (std::net::SocketAddr, Arc<AtomicU64>, Svc, Breaker) {
    let (addr, hits) = serve(|n| if n >= 20 || n == 10 { 200 } else { 503 }).await;
    let (layer, breaker) = layer(0.5);
    let mut svc = client(layer);
    for _ in 0..20 {
        call(&mut svc, addr).await.unwrap();
    }
    let shed = breaker.snapshot().shed.expect("the rule fired and grades");
    // (20 − 5·1) / 21.
    assert!(shed.probability > 0.7, "{shed:?}");
    (addr, hits, svc, breaker)
}

/// Calls through a retry of up to 5 retries; how many got an answer.
async fn answered_through_retries(
    svc: Svc,
    addr: std::net::SocketAddr,
    retry_graded: bool,
) -> usize {
    let policy = tower_circuit_breaker::retry::RetryPolicy::new()
        .max_retries(5)
        .backoff(Duration::from_millis(10), Duration::from_millis(100))
        .retry_graded(retry_graded)
        .seed(5);
    let mut retrying = ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(policy))
        .service(svc);
    let mut answered = 0;
    for _ in 0..20 {
        match call(&mut retrying, addr).await {
            Ok(status) => {
                assert_eq!(status, 200);
                answered += 1;
            }
            Err(reason) => assert_eq!(reason, Rejection::Graded),
        }
    }
    answered
}

#[tokio::test(start_paused = true)]
async fn a_retry_policy_retries_graded_refusals_only_when_told_to() {
    // By default a graded refusal ends the retry loop, as an open
    // circuit's does: some of the 20 calls end refused.
    let (addr, hits, svc, breaker) = grading_over_a_healed_upstream().await;
    let answered = answered_through_retries(svc, addr, false).await;
    let refused = breaker.snapshot().counters.graded_rejected;
    assert!(answered < 20, "{answered} of 20 answered");
    assert_eq!(
        refused as usize,
        20 - answered,
        "one refusal per refused call"
    );
    assert_eq!(hits.load(Ordering::SeqCst) as usize, 20 + answered);

    // Told to, it retries them after a backoff: every call is answered,
    // after more refusals than calls refused before.
    let (addr, hits, svc, breaker) = grading_over_a_healed_upstream().await;
    let answered = answered_through_retries(svc, addr, true).await;
    assert_eq!(answered, 20);
    assert_eq!(hits.load(Ordering::SeqCst), 40);
    assert!(
        breaker.snapshot().counters.graded_rejected > 0,
        "some draws refused"
    );
}
