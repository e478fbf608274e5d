//! A scripted test through `Stack` repeats by default: with no seed given to
//! the stack, its jitter (the retry's backoff, the breaker's open duration)
//! is drawn from the script's seed, so three runs of one test agree to the
//! nanosecond.

use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::Request;
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::testing::{Answer, Phase, Script, ScriptedUpstream};
use tower_circuit_breaker::{Breaker, CircuitOpen};

/// What one run saw: each attempt at the upstream (when, which request,
/// which attempt of it) and how many requests the stack shed.
type Run = (Vec<(Duration, u64, u32)>, usize);

/// A handler's test: a request every 100 ms for 30 s through a stack built
/// with every default jitter and no seed, against an upstream that fails
/// half its calls; on a runtime of its own, in paused time.
fn run_once() -> Run {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        // The stack first, as an app builds it; the script comes after.
        let layer = Stack::builder()
            .attempt_timeout(Duration::from_secs(10))
            .breaker(
                Breaker::builder()
                    .trip_mode(TripMode::Open)
                    .count_window(10)
                    .min_calls(5)
                    .failure_rate(0.5)
                    .open_duration(Duration::from_secs(2)),
            )
            .classifier(LlmClassifier::new())
            .build()
            .unwrap();
        let script = Script::builder()
            .phase(
                Phase::new(Duration::ZERO)
                    .answer(0.5, Answer::ok().after(Duration::from_millis(50)))
                    .answer(0.5, Answer::status(503).after(Duration::from_millis(50))),
            )
            .seed(42)
            .build()
            .unwrap();
        let upstream = ScriptedUpstream::new(script);
        let log = upstream.log().clone();
        let client = layer.layer(upstream);
        let mut calls = Vec::new();
        for _ in 0..300 {
            calls.push(tokio::spawn(
                client.clone().oneshot(Request::new(String::new())),
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut shed = 0;
        for call in calls {
            shed += usize::from(
                call.await
                    .unwrap()
                    .is_err_and(|e| CircuitOpen::find(&*e).is_some()),
            );
        }
        let attempts = log
            .attempts()
            .iter()
            .map(|a| (a.at, a.request, a.n))
            .collect();
        (attempts, shed)
    })
}

#[test]
fn a_scripted_test_through_the_stack_repeats_without_a_seed() {
    let runs: Vec<Run> = (0..3).map(|_| run_once()).collect();
    let shed: Vec<usize> = runs.iter().map(|r| r.1).collect();
    let attempts: Vec<usize> = runs.iter().map(|r| r.0.len()).collect();
    println!("shed per run {shed:?}, attempts per run {attempts:?}");
    assert!(shed[0] > 0, "the breaker opened and shed requests");
    assert!(attempts[0] > 300 - shed[0], "the retry retried");
    assert_eq!(runs[0], runs[1], "run 2 differs from run 1");
    assert_eq!(runs[0], runs[2], "run 3 differs from run 1");
}
