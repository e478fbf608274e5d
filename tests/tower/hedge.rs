//! Hedging in `Failover`, over real connections: a hyper-util client through
//! a breaker per upstream against hyper servers on 127.0.0.1:0, in paused
//! time. A hedge fires at its delay, the first head wins, the loser's
//! connection is dropped (its server sees its handler cancelled), an open
//! circuit never gets a hedge, under a thousand slow first attempts the
//! hedges stay within their budget, and with a first-frame deadline on its
//! members the race is on the first token of an event stream.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::deadline::StreamDeadlines;
use tower_circuit_breaker::failover::{Failover, Hedge};
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitBreakerLayer};

use crate::support::{http2_client, http_client, HttpClient};

/// What a server saw.
#[derive(Clone, Default)]
struct Seen {
    /// When each request arrived.
    arrivals: Arc<Mutex<Vec<Instant>>>,
    answered: Arc<AtomicUsize>,
    /// Handlers dropped before they answered: the client went away.
    cancelled: Arc<AtomicUsize>,
}

impl Seen {
    fn hits(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

/// Notes a cancellation when a handler is dropped before it answers.
struct Cancelled(Option<Arc<AtomicUsize>>);

impl Cancelled {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Cancelled {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A server on 127.0.0.1:0, over HTTP/1 or HTTP/2, that notes each
/// request's arrival and answers with `answer(guard, answered)`: the guard
/// counts the handler as cancelled unless it is disarmed.
async fn serve<F, Fut, B>(h2: bool, answer: F) -> (SocketAddr, Seen)
where
    F: Fn(Cancelled, Arc<AtomicUsize>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (s, answer) = (s.clone(), answer.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    s.arrivals.lock().unwrap().push(Instant::now());
                    let answer = answer(Cancelled(Some(s.cancelled.clone())), s.answered.clone());
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                let io = TokioIo::new(stream);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .max_concurrent_streams(5000)
                        .serve_connection(io, svc)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                }
            });
        }
    });
    (addr, seen)
}

/// A server that answers `name` after `delay`, over HTTP/1 or HTTP/2.
async fn server(name: &'static str, delay: Duration, h2: bool) -> (SocketAddr, Seen) {
    serve(
        h2,
        move |guard: Cancelled, answered: Arc<AtomicUsize>| async move {
            tokio::time::sleep(delay).await;
            guard.disarm();
            answered.fetch_add(1, Ordering::SeqCst);
            Response::new(Full::new(Bytes::from(name)))
        },
    )
    .await
}

fn breaker(name: &str) -> Breaker {
    Breaker::builder()
        .name(name)
        .consecutive_failures(3)
        .open_duration(Duration::from_secs(3600))
        .max_open_duration(Duration::from_secs(3600))
        .jitter(0.0)
        .build()
        .unwrap()
}

fn request(addr: SocketAddr) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}/v1/chat"))
        .body(Empty::new())
        .unwrap()
}

type Route = CircuitBreaker<HttpClient>;

/// A failover over `members` (server, breaker), each a rewrite of the URI
/// to its server, on one client.
fn failover(
    client: &HttpClient,
    members: &[(SocketAddr, Breaker)],
    hedge: Hedge,
) -> Failover<Route, Request<Empty<Bytes>>> {
    let route = |b: &Breaker| CircuitBreaker::new(client.clone(), b.clone());
    let mut f = Failover::new(route(&members[0].1)).jitter(Duration::ZERO, Duration::ZERO);
    for (addr, b) in &members[1..] {
        let addr = *addr;
        f = f.fallback_with(route(b), move |req: &mut Request<Empty<Bytes>>| {
            *req.uri_mut() = Uri::try_from(format!("http://{addr}/v1/chat")).unwrap();
        });
    }
    f.hedge(hedge)
}

async fn body(res: Response<impl http_body::Body<Data = Bytes, Error: std::fmt::Debug>>) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Lets the servers' tasks see what the client did (a dropped connection).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(start_paused = true)]
async fn a_hedge_fires_at_its_delay_the_first_head_wins_and_the_loser_is_cancelled() {
    let (slow, slow_seen) = server("slow", Duration::from_secs(10), false).await;
    let (fast, fast_seen) = server("fast", Duration::from_millis(100), false).await;
    let (primary, fallback) = (breaker("slow"), breaker("fast"));
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(100.0)
        .unwrap();
    let client = http_client();
    let svc = failover(
        &client,
        &[(slow, primary.clone()), (fast, fallback.clone())],
        hedge.clone(),
    );

    let start = Instant::now();
    let res = svc.clone().oneshot(request(slow)).await.unwrap();
    let took = start.elapsed();
    assert_eq!(
        body(res).await,
        "fast",
        "the winner's answer reaches the caller"
    );
    assert_eq!(took, Duration::from_millis(600));
    assert_eq!(hedge.sent(), 1);
    let hedged_at = fast_seen.arrivals.lock().unwrap()[0] - start;
    assert_eq!(
        hedged_at,
        Duration::from_millis(500),
        "the hedge fires at its delay"
    );

    settle().await;
    assert_eq!(slow_seen.hits(), 1);
    assert_eq!(
        slow_seen.cancelled.load(Ordering::SeqCst),
        1,
        "the loser's server sees its handler cancelled"
    );
    assert_eq!(slow_seen.answered.load(Ordering::SeqCst), 0);
    // The loser is ignored by its breaker's trip rules; the winner succeeded.
    let p = primary.snapshot().counters;
    assert_eq!((p.failures, p.successes, p.dropped), (0, 0, 1));
    assert_eq!(fallback.snapshot().counters.successes, 1);
    // Its elapsed time is a censored sample of the primary's latency.
    assert_eq!(svc.latency(0).unwrap().samples(), 1);
    assert_eq!(svc.latency(1).unwrap().samples(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_that_answers_before_the_delay_is_never_hedged() {
    let (quick, quick_seen) = server("quick", Duration::from_millis(200), false).await;
    let (other, other_seen) = server("other", Duration::from_millis(100), false).await;
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(100.0)
        .unwrap();
    let svc = failover(
        &http_client(),
        &[(quick, breaker("quick")), (other, breaker("other"))],
        hedge.clone(),
    );
    for _ in 0..5 {
        let res = svc.clone().oneshot(request(quick)).await.unwrap();
        assert_eq!(body(res).await, "quick");
    }
    assert_eq!(
        (quick_seen.hits(), other_seen.hits(), hedge.sent()),
        (5, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn no_hedge_goes_to_an_open_circuit() {
    let (slow, _) = server("slow", Duration::from_secs(2), false).await;
    let (open, open_seen) = server("open", Duration::from_millis(100), false).await;
    let (fast, fast_seen) = server("fast", Duration::from_millis(100), false).await;
    let open_breaker = breaker("open");
    open_breaker.force_open();
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(100.0)
        .unwrap();
    let client = http_client();

    // The open member is skipped: the hedge goes to the next closed one.
    let svc = failover(
        &client,
        &[
            (slow, breaker("slow")),
            (open, open_breaker.clone()),
            (fast, breaker("fast")),
        ],
        hedge.clone(),
    );
    let res = svc.oneshot(request(slow)).await.unwrap();
    assert_eq!(body(res).await, "fast");
    assert_eq!(open_seen.hits(), 0, "nothing was sent to the open circuit");
    assert_eq!(fast_seen.hits(), 1);
    assert_eq!(hedge.sent(), 1);

    // Every other member open: no hedge, the first attempt is waited for.
    let fast_breaker = breaker("fast");
    fast_breaker.force_open();
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(100.0)
        .unwrap();
    let svc = failover(
        &client,
        &[
            (slow, breaker("slow")),
            (open, open_breaker),
            (fast, fast_breaker),
        ],
        hedge.clone(),
    );
    let start = Instant::now();
    let res = svc.oneshot(request(slow)).await.unwrap();
    assert_eq!(body(res).await, "slow");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!((open_seen.hits(), fast_seen.hits()), (0, 1));
    assert_eq!(
        hedge.sent(),
        0,
        "a hedge no circuit admitted is not counted"
    );
    assert_eq!(hedge.denied(), 0, "nor taken from the budget");
}

#[tokio::test(start_paused = true)]
async fn under_a_thousand_slow_first_attempts_hedges_stay_within_their_budget() {
    const REQUESTS: usize = 1000;
    const BUDGET: f64 = 10.0;
    let (slow, slow_seen) = server("slow", Duration::from_secs(2), true).await;
    let (fast, fast_seen) = server("fast", Duration::from_millis(100), true).await;
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(BUDGET)
        .unwrap();
    // One request to each server first, outside the failover, so that the
    // thousand share an HTTP/2 connection already open to each: opening one
    // under a thousand concurrent requests can fail them before any reaches
    // the server (an error, not a slow start).
    let client = http2_client();
    for addr in [slow, fast] {
        let res = client.request(request(addr)).await.unwrap();
        body(res).await;
    }
    let (slow_before, fast_before) = (slow_seen.hits(), fast_seen.hits());
    let svc = failover(
        &client,
        &[(slow, breaker("slow")), (fast, breaker("fast"))],
        hedge.clone(),
    );
    let calls: Vec<_> = (0..REQUESTS)
        .map(|_| tokio::spawn(svc.clone().oneshot(request(slow))))
        .collect();
    let mut fast_answers = 0;
    for call in calls {
        let res = call.await.unwrap().unwrap();
        fast_answers += usize::from(body(res).await == "fast");
    }
    let (slow_hits, fast_hits) = (
        slow_seen.hits() - slow_before,
        fast_seen.hits() - fast_before,
    );
    let share = fast_hits as f64 / REQUESTS as f64 * 100.0;
    println!(
        "hedges {fast_hits} of {REQUESTS} ({share:.1} %), {fast_answers} won, denied {}",
        hedge.denied()
    );
    assert_eq!(slow_hits, REQUESTS);
    assert!(share <= BUDGET + 1.0, "hedged {share} % > {BUDGET} % + 1");
    assert!(fast_hits > 0, "the budget allowed some hedges");
    assert_eq!(fast_hits as u64, hedge.sent());
    assert_eq!(fast_answers, fast_hits);
}

/// A server that sends an event stream's head at once and its one event,
/// `data: <name>`, after `first_token`; a stream dropped before its event
/// counts as cancelled.
async fn sse_server(name: &'static str, first_token: Duration) -> (SocketAddr, Seen) {
    serve(
        false,
        move |guard: Cancelled, answered: Arc<AtomicUsize>| {
            let event = futures::stream::once(async move {
                tokio::time::sleep(first_token).await;
                guard.disarm();
                answered.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Frame::data(Bytes::from(format!("data: {name}\n\n"))))
            });
            async move {
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(StreamBody::new(event))
                    .unwrap()
            }
        },
    )
    .await
}

/// A failover of breakers with the LLM classifier, each under `deadlines`,
/// over servers `addrs` in order.
fn streaming_failover(
    addrs: &[SocketAddr],
    breakers: &[Breaker],
    deadlines: StreamDeadlines,
    hedge: Hedge,
) -> Failover<
    CircuitBreaker<HttpClient, LlmClassifier, Breaker, StreamDeadlines>,
    Request<Empty<Bytes>>,
> {
    let client = http_client();
    let route = |b: &Breaker| {
        CircuitBreakerLayer::new(b.clone())
            .with_classifier(LlmClassifier::new())
            .stream_deadlines(deadlines)
            .unwrap()
            .layer(client.clone())
    };
    let mut f = Failover::new(route(&breakers[0])).jitter(Duration::ZERO, Duration::ZERO);
    for (addr, b) in addrs[1..].iter().zip(&breakers[1..]) {
        let addr = *addr;
        f = f.fallback_with(route(b), move |req: &mut Request<Empty<Bytes>>| {
            *req.uri_mut() = Uri::try_from(format!("http://{addr}/v1/chat")).unwrap();
        });
    }
    f.hedge(hedge)
}

#[tokio::test(start_paused = true)]
async fn with_a_first_frame_deadline_the_hedge_races_on_the_first_token() {
    // Both heads come at once; the primary's first token comes after 10 s,
    // the fallback's after 100 ms.
    let (slow, slow_seen) = sse_server("slow", Duration::from_secs(10)).await;
    let (fast, fast_seen) = sse_server("fast", Duration::from_millis(100)).await;
    let breakers = [breaker("slow"), breaker("fast")];
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(100.0)
        .unwrap();
    let deadlines = StreamDeadlines::new().first_frame(Duration::from_secs(30));
    let svc = streaming_failover(&[slow, fast], &breakers, deadlines, hedge.clone());

    let start = Instant::now();
    let res = svc.clone().oneshot(request(slow)).await.unwrap();
    let took = start.elapsed();
    assert_eq!(body(res).await, "data: fast\n\n", "the first token wins");
    assert_eq!(took, Duration::from_millis(600));
    assert_eq!(hedge.sent(), 1);
    assert_eq!(
        fast_seen.arrivals.lock().unwrap()[0] - start,
        Duration::from_millis(500),
        "the hedge fires at its delay, though the primary's head came at once"
    );
    settle().await;
    assert_eq!(
        (slow_seen.hits(), slow_seen.cancelled.load(Ordering::SeqCst)),
        (1, 1),
        "the loser's stream is dropped before its first token"
    );
    // Dropped while waiting for its first frame: ignored, not a failure.
    let p = breakers[0].snapshot().counters;
    assert_eq!(
        (p.failures, p.successes, p.ignored + p.dropped, p.in_flight),
        (0, 0, 1, 0)
    );
    assert_eq!(breakers[1].snapshot().counters.successes, 1);
    // The time to first token is what the latency estimate learns.
    assert_eq!(svc.latency(1).unwrap().samples(), 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_first_frame_deadline_the_head_wins_the_race() {
    let (slow, slow_seen) = sse_server("slow", Duration::from_secs(10)).await;
    let (fast, fast_seen) = sse_server("fast", Duration::from_millis(100)).await;
    let hedge = Hedge::after(Duration::from_millis(500))
        .budget_percent(100.0)
        .unwrap();
    // A stall deadline only: the response future resolves at the head.
    let deadlines = StreamDeadlines::new().stall(Duration::from_secs(30));
    let svc = streaming_failover(
        &[slow, fast],
        &[breaker("slow"), breaker("fast")],
        deadlines,
        hedge.clone(),
    );

    let start = Instant::now();
    let res = svc.oneshot(request(slow)).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "the head came at once");
    assert_eq!(body(res).await, "data: slow\n\n");
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(
        (slow_seen.hits(), fast_seen.hits(), hedge.sent()),
        (1, 0, 0)
    );
}
