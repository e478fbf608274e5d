//! Every `Duration` setting of every builder at 0, 1 ns, large and
//! `Duration::MAX`: each is a typed error from `build()` or a working
//! breaker that handles requests (through an outage and a rate limit)
//! without a panic.
#![cfg(not(loom))]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::retry::Retry;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::deadline::StreamDeadlines;
use tower_circuit_breaker::failover::Failover;
use tower_circuit_breaker::health::HealthProbe;
use tower_circuit_breaker::keyed::{self, KeyedBreakers};
use tower_circuit_breaker::retry::RetryPolicy;
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::{BoxError, Breaker, CircuitBreaker, CircuitBreakerLayer, State};

const VALUES: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_secs(100 * 365 * 24 * 3600),
    Duration::MAX,
];

/// An upstream that fails its first three calls (503), then rate-limits
/// one (429 `Retry-After: 1`), then answers 200 with a body.
fn upstream() -> impl Service<
    Request<String>,
    Response = Response<Full<Bytes>>,
    Error = BoxError,
    Future = impl Send + use<>,
> + Clone
       + Send
       + use<> {
    let n = Arc::new(AtomicU32::new(0));
    tower::service_fn(move |_req: Request<String>| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(Full::new(Bytes::from_static(b"data: hi\n\n")));
            match i {
                0..3 => *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE,
                3 => {
                    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    res.headers_mut()
                        .insert("retry-after", http::HeaderValue::from_static("1"));
                }
                _ => {}
            }
            Ok::<_, BoxError>(res)
        }
    })
}

/// Sends requests through `svc` for an hour of paused time, reading each
/// body, touching each error.
async fn exercise<S, B>(svc: S)
where
    S: Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    exercise_every(svc, Duration::from_secs(300)).await;
}

/// [`exercise`], a request every `step`.
async fn exercise_every<S, B>(svc: S, step: Duration)
where
    S: Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    for _ in 0..12 {
        match svc.clone().oneshot(Request::new(String::new())).await {
            Ok(res) => {
                let _ = res.into_body().collect().await.map_err(Into::into);
            }
            Err(e) => {
                let e: BoxError = e.into();
                let _ = format!("{e} {e:?}");
            }
        }
        tokio::time::sleep(step).await;
    }
}

/// A breaker that opens on the first failure, with one setting changed.
fn breaker(
    f: impl Fn(tower_circuit_breaker::Builder) -> tower_circuit_breaker::Builder,
) -> tower_circuit_breaker::Builder {
    f(Breaker::builder()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(1))
        .pace_rate_limits(true)
        .jitter(0.1))
}

type Case = (
    &'static str,
    fn(Duration) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>,
);

/// Builds with the setting at `d`: `Err` is the typed error's text, `Ok`
/// means it was built and exercised.
fn cases() -> Vec<Case> {
    fn core(
        set: impl Fn(tower_circuit_breaker::Builder) -> tower_circuit_breaker::Builder + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(async move {
            let b = breaker(set).build().map_err(|e| e.to_string())?;
            exercise(CircuitBreaker::new(upstream(), b.clone())).await;
            let snap = b.snapshot();
            let _ = format!("{snap:?}");
            if let Err(open) = b.admit() {
                let _ = (open.retry_after(), format!("{open}"));
            }
            Ok(())
        })
    }
    fn deadlines(d: StreamDeadlines) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(async move {
            let layer = CircuitBreakerLayer::new(breaker(|b| b).build().unwrap())
                .with_classifier(HttpClassifier)
                .stream_deadlines(d)
                .map_err(|e| e.to_string())?;
            exercise(layer.layer(upstream())).await;
            Ok(())
        })
    }
    fn stack(
        set: impl FnOnce(
                tower_circuit_breaker::stack::StackBuilder,
            ) -> tower_circuit_breaker::stack::StackBuilder
            + Send
            + 'static,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(async move {
            let layer = set(Stack::builder().seed(1))
                .build()
                .map_err(|e| e.to_string())?;
            exercise(layer.layer(upstream())).await;
            Ok(())
        })
    }
    fn stack_deadlines(
        d: StreamDeadlines,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(async move {
            let layer = Stack::builder()
                .seed(1)
                .stream_deadlines(d)
                .build()
                .map_err(|e| e.to_string())?;
            exercise(layer.layer(upstream())).await;
            Ok(())
        })
    }
    fn health(
        interval: Duration,
        timeout: Option<Duration>,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(async move {
            let mut builder = HealthProbe::builder(interval);
            if let Some(t) = timeout {
                builder = builder.timeout(t);
            }
            let prober = builder
                .jitter(0.5)
                .build(upstream(), HttpClassifier, |_: &Breaker| {
                    Request::new(String::new())
                })
                .map_err(|e| e.to_string())?;
            let b = breaker(|b| b.open_duration(Duration::from_secs(600)))
                .build()
                .unwrap();
            let task = tokio::spawn(prober.run(b.clone()));
            b.admit()
                .unwrap()
                .record(tower_circuit_breaker::Outcome::Failure);
            // (A probe every nanosecond is a busy loop: a short run.)
            exercise_every(
                CircuitBreaker::new(upstream(), b.clone()),
                Duration::from_millis(5),
            )
            .await;
            assert!(!task.is_finished(), "the prober runs on");
            task.abort();
            Ok(())
        })
    }
    fn retry(
        set: impl FnOnce(RetryPolicy) -> RetryPolicy + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(async move {
            let b = breaker(|b| b.consecutive_failures(10)).build().unwrap();
            let policy = set(RetryPolicy::new().seed(1)).watch_breaker(b.clone());
            let svc = Retry::new(policy, CircuitBreaker::new(upstream(), b));
            exercise(svc).await;
            Ok(())
        })
    }
    vec![
        ("time_window span", |d| core(move |b| b.time_window(d, 10))),
        ("slow_call threshold", |d| {
            core(move |b| b.slow_call(d, 0.5))
        }),
        ("open_duration", |d| core(move |b| b.open_duration(d))),
        ("max_open_duration", |d| {
            core(move |b| b.max_open_duration(d))
        }),
        ("open_duration = max_open_duration", |d| {
            core(move |b| b.open_duration(d).max_open_duration(d))
        }),
        ("probe_timeout", |d| core(move |b| b.probe_timeout(d))),
        ("probe_lease", |d| core(move |b| b.probe_lease(d))),
        ("volume_guard period", |d| {
            core(move |b| b.volume_guard(2, d))
        }),
        ("quota_gate", |d| core(move |b| b.quota_gate(d))),
        ("max_rate_limit_wait", |d| {
            core(move |b| b.pace_rate_limits(true).max_rate_limit_wait(d))
        }),
        ("keyed idle_timeout", |d| {
            Box::pin(async move {
                let set = KeyedBreakers::builder()
                    .consecutive_failures(1)
                    .idle_timeout(d)
                    .override_key("b", |b| b.open_duration(Duration::from_secs(2)))
                    .build()
                    .map_err(|e| e.to_string())?;
                let layer = CircuitBreakerLayer::keyed(set.clone(), keyed::header("x-key"));
                let svc = layer.layer(upstream());
                exercise(svc).await;
                let _ = set.get("b").map(|b| b.state() == State::Closed);
                Ok(())
            })
        }),
        ("keyed override_key probe_timeout", |d| {
            Box::pin(async move {
                let set = KeyedBreakers::builder()
                    .consecutive_failures(1)
                    .override_key("", move |b| b.probe_timeout(d))
                    .build()
                    .map_err(|e| e.to_string())?;
                let layer = CircuitBreakerLayer::keyed(set, keyed::header("x-key"));
                exercise(layer.layer(upstream())).await;
                Ok(())
            })
        }),
        ("stream first_frame", |d| {
            deadlines(StreamDeadlines::new().first_frame(d))
        }),
        ("stream stall", |d| {
            deadlines(StreamDeadlines::new().stall(d))
        }),
        ("stream total", |d| {
            deadlines(StreamDeadlines::new().total(d))
        }),
        ("stream all three", |d| {
            deadlines(StreamDeadlines::new().first_frame(d).stall(d).total(d))
        }),
        ("stack attempt_timeout", |d| {
            stack(move |s| s.attempt_timeout(d))
        }),
        ("stack total_timeout", |d| {
            stack(move |s| s.total_timeout(d))
        }),
        ("stack attempt = total timeout", |d| {
            stack(move |s| s.attempt_timeout(d).total_timeout(d))
        }),
        ("stack backoff base and cap", |d| {
            stack(move |s| s.backoff(d, d))
        }),
        ("stack backoff cap", |d| {
            stack(move |s| s.backoff(Duration::from_millis(1), d))
        }),
        ("stack retry_after_cap", |d| {
            stack(move |s| s.retry_after_cap(d))
        }),
        ("stack breaker open_duration", |d| {
            stack(move |s| s.breaker(Breaker::builder().open_duration(d)))
        }),
        ("stack stream total", |d| {
            stack_deadlines(StreamDeadlines::new().total(d))
        }),
        ("stack stream stall", |d| {
            stack_deadlines(StreamDeadlines::new().stall(d))
        }),
        ("health interval", |d| health(d, None)),
        ("health timeout", |d| {
            health(Duration::from_secs(1), Some(d))
        }),
        ("retry backoff", |d| retry(move |r| r.backoff(d, d))),
        ("retry retry_after_cap", |d| {
            retry(move |r| r.retry_after_cap(d))
        }),
        ("failover jitter", |d| {
            Box::pin(async move {
                let primary = CircuitBreaker::new(upstream(), breaker(|b| b).build().unwrap());
                let fallback = CircuitBreaker::new(upstream(), breaker(|b| b).build().unwrap());
                let svc = Failover::new(primary)
                    .fallback(fallback)
                    .jitter(Duration::ZERO, d);
                exercise(svc).await;
                Ok(())
            })
        }),
    ]
}

#[tokio::test(start_paused = true)]
async fn every_duration_setting_is_a_typed_error_or_works_without_a_panic() {
    let mut panicked = Vec::new();
    let (mut built, mut refused) = (0, 0);
    for (name, case) in cases() {
        for d in VALUES {
            match tokio::spawn(case(d)).await {
                Ok(Ok(())) => built += 1,
                Ok(Err(e)) => {
                    refused += 1;
                    println!("{name} = {d:?}: refused: {e}");
                }
                Err(e) => panicked.push(format!("{name} = {d:?}: {e}")),
            }
        }
    }
    println!("{built} built and handled requests, {refused} refused at build");
    assert!(panicked.is_empty(), "panicked:\n{}", panicked.join("\n"));
}
