//! The `testing` feature's scripted upstream under a user's own service:
//! phases in paused time, hangs, resets, error events, stalls, a capacity
//! with 429s, and draws that repeat.
#![cfg(not(loom))]

use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::header::HeaderName;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::deadline::StreamDeadlines;
use tower_circuit_breaker::error::StreamElapsed;
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::testing::{Answer, Capacity, Latency, Phase, Script, ScriptedUpstream};
use tower_circuit_breaker::{BoxError, Breaker, CircuitOpen, State};

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

// === a user's service ===

/// What the user's service tells its own callers.
#[derive(Debug, Clone, PartialEq)]
enum Summary {
    Done,
    /// The model is known to be down: come back later (the circuit says
    /// when).
    TryLater,
    Failed,
}

/// The user's code: summarises a text through an LLM client, reading the
/// whole streamed answer.
async fn summarise<S, B>(client: &mut S, text: &str) -> Summary
where
    S: Service<Request<String>, Response = http::Response<B>, Error = BoxError>,
    B: http_body::Body,
{
    let request = Request::post("http://llm.invalid/v1/chat/completions")
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{text}"}}]}}"#
        ))
        .unwrap();
    let response = match client.ready().await {
        Ok(ready) => ready.call(request).await,
        Err(e) => Err(e),
    };
    match response {
        Ok(res) if res.status().is_success() => match res.into_body().collect().await {
            Ok(body) => match contains(&body.to_bytes(), b"event: error") {
                false => Summary::Done,
                true => Summary::Failed,
            },
            Err(_) => Summary::Failed,
        },
        Ok(_) => Summary::Failed,
        Err(e) if CircuitOpen::find(&*e).is_some() => Summary::TryLater,
        Err(_) => Summary::Failed,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Healthy for a minute, then an outage of every kind for three, then
/// healthy again.
fn outage() -> Script {
    let healthy = |from| {
        Phase::new(from).answer_with(
            1.0,
            Answer::stream(ms(800)).after(ms(300)),
            Latency::Lognormal { sigma: 0.3 },
        )
    };
    Script::builder()
        .phase(healthy(Duration::ZERO))
        .phase(
            Phase::new(secs(60))
                .answer(0.4, Answer::Hang)
                .answer(0.2, Answer::reset().after(ms(50)))
                .answer(
                    0.2,
                    Answer::SseError {
                        latency: ms(200),
                        stream: ms(500),
                    },
                )
                .answer(0.2, Answer::status(503).after(secs(1))),
        )
        .phase(healthy(secs(240)))
        .seed(42)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_users_summary_service_rides_out_a_scripted_outage_behind_the_stack() {
    let upstream = ScriptedUpstream::new(outage());
    let log = upstream.log().clone();
    let layer = Stack::builder()
        .attempt_timeout(secs(10))
        .breaker(
            Breaker::builder()
                .trip_mode(TripMode::Open)
                .count_window(10)
                .min_calls(5)
                .failure_rate(0.5)
                .open_duration(secs(30))
                .max_open_duration(secs(30))
                .jitter(0.0),
        )
        .classifier(LlmClassifier::new())
        .seed(1)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let client = BoxCloneService::new(layer.layer(upstream));

    // A user every second for five minutes.
    let start = Instant::now();
    let mut users = Vec::new();
    for s in 0..300 {
        tokio::time::sleep_until(start + secs(s)).await;
        let mut client = client.clone();
        users.push(tokio::spawn(async move {
            let summary = summarise(&mut client, "Summarise this chapter.").await;
            (s, summary, Instant::now() - start - secs(s))
        }));
    }
    let mut answers = Vec::new();
    for user in users {
        answers.push(user.await.unwrap());
    }
    let in_window = |from: u64, to: u64| answers.iter().filter(move |a| (from..to).contains(&a.0));

    // Before the outage every summary is done, within a stream's time.
    assert!(
        in_window(0, 60).all(|a| a.1 == Summary::Done),
        "{answers:?}"
    );
    // During it, the breaker opened and most users were told to come back
    // later at once, without reaching the upstream.
    let later: Vec<_> = in_window(60, 240)
        .filter(|a| a.1 == Summary::TryLater)
        .collect();
    let at_once = later.iter().filter(|a| a.2 == Duration::ZERO).count();
    assert!(at_once > 120, "{at_once} of 180 told at once: {answers:?}");
    assert!(in_window(60, 240).all(|a| a.1 != Summary::Done));
    let reached = log
        .attempts()
        .iter()
        .filter(|a| (60..240).contains(&a.at.as_secs()))
        .count();
    assert!(
        reached < 40,
        "{reached} attempts reached the broken upstream"
    );
    // Every kind of failure the phase scripts reached the stack.
    let attempts = log.attempts();
    for kind in [
        |a: &Answer| matches!(a, Answer::Hang),
        |a: &Answer| matches!(a, Answer::Reset { .. }),
        |a: &Answer| matches!(a, Answer::SseError { .. }),
        |a: &Answer| matches!(a, Answer::Status { code: 503, .. }),
    ] {
        assert!(attempts.iter().any(|a| kind(&a.answer)), "{attempts:?}");
    }
    // After the heal, summaries are done again and the circuit closed.
    let healed: Vec<_> = in_window(240, 300).collect();
    assert!(
        healed[healed.len() - 30..]
            .iter()
            .all(|a| a.1 == Summary::Done),
        "{healed:?}"
    );
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_full_upstream_queues_then_answers_429_with_retry_after_at_once() {
    let script = Script::builder()
        .phase(Phase::new(Duration::ZERO).answer(1.0, Answer::ok().after(secs(1))))
        .capacity(Capacity::new(1, 1).retry_after(secs(2)))
        .build()
        .unwrap();
    let upstream = ScriptedUpstream::new(script);
    let start = Instant::now();
    let first = tokio::spawn(upstream.clone().oneshot(Request::new(())));
    let queued = tokio::spawn(upstream.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;

    // No slot and no room in the queue: a 429 at once.
    let res = upstream.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "2");
    assert_eq!(Instant::now(), start);

    // The first is served in 1 s, the queued one after it.
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(Instant::now() - start, secs(1));
    assert_eq!(queued.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(Instant::now() - start, secs(2));
    let log = upstream.log().attempts();
    let served: Vec<_> = log.iter().map(|a| (a.served, a.ran)).collect();
    assert_eq!(
        served,
        [(true, secs(1)), (true, secs(1)), (true, Duration::ZERO)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_gets_the_same_answers_in_every_run_whatever_else_is_going_on() {
    // Half the calls fail: which ones is up to the seed.
    let script = |seed| {
        Script::builder()
            .phase(
                Phase::new(Duration::ZERO)
                    .answer(0.5, Answer::ok())
                    .answer(0.5, Answer::status(503)),
            )
            .seed(seed)
            .request_id_header(HeaderName::from_static("x-request-id"))
            .build()
            .unwrap()
    };
    let call = |id: u64| {
        Request::get("/")
            .header("x-request-id", id.to_string())
            .body(())
            .unwrap()
    };
    // Requests 0..20, two attempts each, in two different orders: what
    // each request's attempts got, in their order.
    let run = |seed, order: Vec<u64>| async move {
        let upstream = ScriptedUpstream::new(script(seed));
        let mut seen = std::collections::BTreeMap::<u64, Vec<StatusCode>>::new();
        for id in order {
            let res = upstream.clone().oneshot(call(id)).await.unwrap();
            seen.entry(id).or_default().push(res.status());
        }
        seen
    };
    let forward: Vec<u64> = (0..20).chain(0..20).collect();
    let backward: Vec<u64> = (0..20).rev().flat_map(|id| [id, id]).collect();
    let a = run(7, forward.clone()).await;
    assert_eq!(a, run(7, backward).await);
    assert_ne!(a, run(8, forward).await, "another seed, other answers");
    let failed = a.values().flatten().filter(|s| s.is_server_error()).count();
    assert!((10..=30).contains(&failed), "{failed} of 40");
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_stalls_is_cut_by_the_stacks_stall_deadline() {
    let script = Script::builder()
        .phase(Phase::new(Duration::ZERO).answer(
            1.0,
            Answer::Stall {
                latency: ms(200),
                stall_after: ms(500),
            },
        ))
        .build()
        .unwrap();
    let layer = Stack::builder()
        .attempt_timeout(secs(10))
        .stream_deadlines(StreamDeadlines::new().stall(secs(2)))
        .classifier(LlmClassifier::new())
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let client = layer.layer(ScriptedUpstream::new(script));

    let start = Instant::now();
    let res = client.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(Instant::now() - start, ms(200));
    let mut body = res.into_body();
    let mut tokens = 0;
    let err = loop {
        match body.frame().await {
            Some(Ok(_)) => tokens += 1,
            Some(Err(e)) => break e,
            None => panic!("a stalled stream never ends by itself"),
        }
    };
    // A token every 100 ms for 500 ms, then silence until the deadline.
    assert_eq!(tokens, 5);
    assert!(err.downcast_ref::<StreamElapsed>().is_some(), "{err}");
    assert_eq!(Instant::now() - start, ms(200) + ms(400) + secs(2));
    assert_eq!(breaker.snapshot().counters.failures, 1);
}
