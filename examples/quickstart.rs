//! The README's quick start against a local upstream that fails, then
//! heals. The rule fires after five failures and graded admission sheds
//! most calls (a dead upstream accepts none); once ten requests in its
//! window found no accept, the circuit opens for every call, and the
//! stack's own health prober finds the heal, so no user call is spent
//! finding out.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::health::{openai_completion_request, HealthProbe};
use tower_circuit_breaker::{BoxError, Breaker, CircuitOpen, Rejection, Stack, State};

/// What the upstream saw: users' calls and health probes, apart.
#[derive(Clone, Default)]
struct Seen {
    healthy: Arc<AtomicBool>,
    users: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
}

/// An OpenAI-compatible upstream on 127.0.0.1 that answers 503 until
/// healthy. A health probe is the one-token completion that says "ping".
async fn upstream(seen: Seen) -> Result<String, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/v1", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        let probe = body.windows(6).any(|w| w == b"\"ping\"");
                        let counter = if probe { &seen.probes } else { &seen.users };
                        counter.fetch_add(1, Ordering::SeqCst);
                        let code = if seen.healthy.load(Ordering::SeqCst) {
                            200
                        } else {
                            503
                        };
                        let res = Response::builder()
                            .status(code)
                            .body(Full::new(Bytes::from_static(b"{}")))
                            .unwrap();
                        Ok::<_, hyper::Error>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
        Ok::<_, Infallible>(())
    });
    Ok(base)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let seen = Seen::default();
    let base = upstream(seen.clone()).await?;

    // The quick start's stack, with times short enough to watch.
    let layer = Stack::builder()
        .attempt_timeout(Duration::from_secs(5))
        .max_retries(0)
        .breaker(
            Breaker::builder()
                .count_window(10)
                .min_calls(5)
                .failure_rate(0.5)
                .open_duration(Duration::from_secs(30))
                .probes(3)
                .close_after(2),
        )
        .classifier(LlmClassifier::default())
        .health_probe(
            HealthProbe::builder(Duration::from_millis(200)),
            openai_completion_request::<Bytes>(&base, "sk-example", "gpt-4o-mini")?,
        )
        .build()?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut svc = layer.layer(client);
    let prober = svc.health_prober().expect("built with a health request");
    let task = prober.spawn_on(&tokio::runtime::Handle::current());
    let breaker = svc.breaker().clone();
    let chat = format!("{base}/chat/completions");
    let call = || {
        Request::post(chat.as_str()).body(Full::new(Bytes::from_static(
            b"{\"model\":\"gpt-4o-mini\",\"messages\":[]}",
        )))
    };

    let mut state = breaker.state();
    for i in 1..=20 {
        if i == 13 {
            // Half a second of health probes meeting the 503s, then the heal.
            tokio::time::sleep(Duration::from_millis(500)).await;
            seen.healthy.store(true, Ordering::SeqCst);
            let left = breaker.snapshot().retry_in.unwrap_or_default();
            println!(
                "the upstream heals, {} s before the open period ends",
                left.as_secs_f64().round() as u64
            );
            // The prober finds the heal within one interval (200 ms).
            while breaker.state() == State::Open {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            state = breaker.state();
            println!(
                "a health probe found it: circuit {state} ({})",
                breaker.snapshot().reason.map_or("", |r| r.as_str())
            );
        }
        let line = match svc.ready().await?.call(call()?).await {
            Ok(res) => format!("call {i:>2}: {}", res.status()),
            Err(err) => match CircuitOpen::find(&*err) {
                Some(open) if open.reason() == Rejection::Graded => {
                    format!(
                        "call {i:>2}: shed by graded admission, circuit {}",
                        open.state()
                    )
                }
                Some(open) => format!(
                    "call {i:>2}: rejected, circuit {} (next probe in {} s)",
                    open.state(),
                    open.retry_after()
                        .map_or(0, |d| d.as_secs_f64().round() as u64)
                ),
                None => format!("call {i:>2}: error {err}"),
            },
        };
        let now = breaker.state();
        if now != state {
            println!("{line}  -> circuit {now}");
            state = now;
        } else {
            println!("{line}");
        }
    }
    println!(
        "the upstream saw {} user calls of 20 and {} health probes (one-token completions); circuit {}",
        seen.users.load(Ordering::SeqCst),
        seen.probes.load(Ordering::SeqCst),
        breaker.state()
    );
    task.abort();
    Ok(())
}
