//! The outage replay: the shipped scenarios meet their bounds, runs repeat
//! exactly, and bad scenario files are reported with the key and the line.

#[allow(dead_code)]
#[path = "../examples/outage_replay/engine.rs"]
mod engine;
#[allow(dead_code)]
#[path = "../examples/outage_replay/report.rs"]
mod report;
#[allow(dead_code)]
#[path = "../examples/outage_replay/scenario.rs"]
mod scenario;

use std::path::Path;

use engine::{Replay, StackKind, StackRun};

fn load(name: &str) -> scenario::Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name);
    scenario::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn stack<'a>(replay: &'a Replay, name: &str) -> &'a StackRun {
    replay
        .stack(name)
        .unwrap_or_else(|| panic!("no stack {name}"))
}

fn primary_attempts(run: &StackRun) -> u64 {
    run.attempts[0].1
}

fn assert_consistent(replay: &Replay) {
    for run in &replay.stacks {
        assert_eq!(run.requests, replay.arrivals_s.len() as u64, "{}", run.name);
        assert_eq!(
            run.succeeded + run.failed + run.rejected,
            run.requests,
            "{}",
            run.name
        );
        let logged = run.attempt_log.len() as u64;
        let counted: u64 = run.attempts.iter().map(|(_, n)| n).sum();
        assert_eq!(logged, counted, "{}", run.name);
        assert!(run.wait_p50_s <= run.wait_p99_s && run.wait_p99_s <= run.wait_max_s);
    }
}

/// The night of the writing assistant: the breaker lets at most 51 % of the
/// primary attempts through (the incident: 2,140 of 4,200), and failover to
/// the light model keeps the mean wait at most 1.6 s.
fn check_night(file: &str) {
    let replay = engine::replay_stacks(
        &load(file),
        &[
            StackKind::NoBreaker,
            StackKind::Breaker,
            StackKind::Failover,
        ],
    )
    .unwrap();
    assert_consistent(&replay);
    let without = primary_attempts(stack(&replay, "no-breaker"));
    let with = primary_attempts(stack(&replay, "breaker"));
    assert!(
        with as f64 <= 0.51 * without as f64,
        "{file}: breaker sent {with} primary attempts, no-breaker {without}"
    );
    let failover = stack(&replay, "failover");
    assert!(
        failover.wait_mean_s <= 1.6,
        "{file}: failover mean wait {:.3} s",
        failover.wait_mean_s
    );
    // The light model really carried the outage.
    assert!(failover.succeeded > stack(&replay, "breaker").succeeded);
}

/// The SaaS back end: per-provider breakers with ordered failover keep p99 at
/// most 1.8 s and send at most 1 % of the primary attempts naive fallback
/// sends during the outage (180 s to 900 s).
fn check_failover(file: &str) {
    let replay = engine::replay_stacks(
        &load(file),
        &[StackKind::NaiveFailover, StackKind::Failover],
    )
    .unwrap();
    assert_consistent(&replay);
    let naive = stack(&replay, "naive-failover");
    let failover = stack(&replay, "failover");
    assert!(
        failover.wait_p99_s <= 1.8,
        "{file}: failover p99 {:.3} s",
        failover.wait_p99_s
    );
    let naive_outage = naive.attempts_between(0, 180.0, 900.0);
    let failover_outage = failover.attempts_between(0, 180.0, 900.0);
    assert!(naive_outage > 0);
    assert!(
        failover_outage as f64 <= 0.01 * naive_outage as f64,
        "{file}: failover sent {failover_outage} primary attempts in the outage, naive {naive_outage}"
    );
    // Naive fallback makes users wait out the hanging primary.
    assert!(naive.wait_p99_s > failover.wait_p99_s);
}

#[test]
fn night_scenario_meets_its_bounds() {
    check_night("seed-000-night.toml");
}

#[test]
fn night_scenario_meets_its_bounds_with_the_slow_call_rule() {
    check_night("seed-000-night-slow.toml");
}

#[test]
fn failover_scenario_meets_its_bounds() {
    check_failover("seed-002-failover.toml");
}

#[test]
fn failover_scenario_meets_its_bounds_with_the_slow_call_rule() {
    check_failover("seed-002-failover-slow.toml");
}

#[test]
fn same_seed_same_numbers_other_seed_other_numbers() {
    let mut scenario = load("seed-000-night.toml");
    let a = report::json(&engine::replay(&scenario).unwrap());
    let b = report::json(&engine::replay(&scenario).unwrap());
    assert_eq!(a, b);
    scenario.seed += 1;
    let c = report::json(&engine::replay(&scenario).unwrap());
    assert_ne!(a, c);
}

#[test]
fn json_has_exactly_the_documented_fields() {
    let replay = engine::replay(&load("seed-000-night.toml")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&report::json(&replay)).unwrap();
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&doc), ["scenario", "stacks"]);
    assert_eq!(doc["scenario"], "seed-000-night");
    let stacks = doc["stacks"].as_array().unwrap();
    let names: Vec<&str> = stacks.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["no-breaker", "breaker", "naive-failover", "failover"]
    );
    for s in stacks {
        assert_eq!(
            keys(s),
            [
                "attempts",
                "failed",
                "name",
                "rejected",
                "requests",
                "succeeded",
                "transitions",
                "wait_max_s",
                "wait_mean_s",
                "wait_p50_s",
                "wait_p99_s"
            ]
        );
        for t in s["transitions"].as_array().unwrap() {
            assert_eq!(keys(t), ["t_s", "to", "upstream"]);
        }
    }
    // Stacks without fallbacks report the primary only, with breakers
    // reporting their state changes.
    assert_eq!(keys(&stacks[0]["attempts"]), ["primary"]);
    assert_eq!(stacks[0]["transitions"].as_array().unwrap().len(), 0);
    assert_eq!(stacks[1]["transitions"][0]["to"], "open");
    let order: Vec<&String> = stacks[3]["attempts"].as_object().unwrap().keys().collect();
    assert_eq!(order.len(), 2);
}

#[test]
fn the_svg_timeline_covers_every_stack_and_upstream() {
    let replay = engine::replay(&load("seed-000-night.toml")).unwrap();
    let svg = report::svg(&replay);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for name in [
        "no-breaker",
        "breaker",
        "naive-failover",
        "failover",
        "light-model attempts",
    ] {
        assert!(svg.contains(name), "{name}");
    }
    assert!(svg.contains("<title>open from"));
}

// === scenario errors ===

const GOOD: &str = r#"name = "t"
seed = 1
duration_s = 10
rate_per_s = 2
poisson = false

[client]
attempt_timeout_s = 5
total_timeout_s = 0
max_retries = 1
backoff_base_ms = 100
backoff_max_ms = 1000

[breaker]
window = 10
min_calls = 5
failure_rate = 0.5
consecutive_failures = 0
slow_call_ms = 0
slow_call_rate = 1.0
open_s = 5
open_max_s = 20
probes = 2
close_after = 1

[[upstream]]
name = "only"
  [[upstream.phase]]
  from_s = 0
  responses = [ { p = 0.5, kind = "ok", latency_ms = 100 },
                { p = 0.5, kind = "status", code = 503, latency_ms = 50 } ]
"#;

fn parse(text: &str) -> Result<scenario::Scenario, scenario::ScenarioError> {
    scenario::parse(text, "test.toml")
}

fn error(text: &str) -> scenario::ScenarioError {
    match parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).expect(needle) + 1
}

#[test]
fn a_valid_scenario_parses_and_replays() {
    let s = parse(GOOD).unwrap();
    assert_eq!(s.upstreams[0].phases[0].responses.len(), 2);
    let replay = engine::replay(&s).unwrap();
    assert_eq!(replay.stacks.len(), 2, "one upstream: no failover stacks");
    assert_eq!(replay.arrivals_s.len(), 20, "evenly spaced: 2/s for 10 s");
    assert_consistent(&replay);
}

#[test]
fn an_unknown_key_is_named_with_its_line() {
    let text = GOOD.replace("max_retries = 1", "max_retries = 1\nmax_retry = 2");
    let e = error(&text);
    assert_eq!(e.line, Some(line_of(&text, "max_retry = 2")));
    assert!(e.message.contains("max_retry"), "{e}");
    assert!(e
        .to_string()
        .starts_with(&format!("test.toml:{}:", line_of(&text, "max_retry = 2"))));

    let text = GOOD.replace(
        "kind = \"ok\", latency_ms = 100",
        "kind = \"ok\", latency_ms = 100, colour = 1",
    );
    let e = error(&text);
    assert_eq!(e.line, Some(line_of(&text, "colour")));
    assert!(e.message.contains("colour"), "{e}");
}

#[test]
fn a_missing_key_is_named() {
    let text = GOOD.replace("probes = 2\n", "");
    let e = error(&text);
    assert!(e.message.contains("probes"), "{e}");
    assert!(e.line.is_some());
}

#[test]
fn probabilities_must_add_up_to_one() {
    let text = GOOD.replace("p = 0.5, kind = \"status\"", "p = 0.4, kind = \"status\"");
    let e = error(&text);
    assert!(e.message.contains("add up to 0.9"), "{e}");
    assert_eq!(e.line, Some(line_of(&text, "responses = [")));
}

#[test]
fn keys_must_fit_their_kind() {
    let text = GOOD.replace(
        "kind = \"ok\", latency_ms = 100",
        "kind = \"ok\", latency_ms = 100, code = 200",
    );
    let e = error(&text);
    assert!(
        e.message.contains("`code`") && e.message.contains("\"ok\""),
        "{e}"
    );
    assert_eq!(e.line, Some(line_of(&text, "code = 200")));

    let text = GOOD.replace(
        "kind = \"status\", code = 503, latency_ms = 50",
        "kind = \"status\", latency_ms = 50",
    );
    let e = error(&text);
    assert!(e.message.contains("needs `code`"), "{e}");

    let text = GOOD.replace("kind = \"ok\"", "kind = \"teapot\"");
    let e = error(&text);
    assert!(e.message.contains("teapot"), "{e}");
    assert_eq!(e.line, Some(line_of(&text, "teapot")));
}

#[test]
fn values_are_checked_where_they_are() {
    for (from, to, key) in [
        ("close_after = 1", "close_after = 3", "close_after"),
        ("min_calls = 5", "min_calls = 50", "min_calls"),
        ("failure_rate = 0.5", "failure_rate = 1.5", "failure_rate"),
        ("rate_per_s = 2", "rate_per_s = -2", "rate_per_s"),
        ("open_max_s = 20", "open_max_s = 1", "open_max_s"),
        (
            "total_timeout_s = 0",
            "total_timeout_s = 2",
            "total_timeout_s",
        ),
        ("slow_call_ms = 0", "slow_call_ms = 6000", "slow_call_ms"),
        ("window = 10", "window_s = 6", "window_s"),
        ("window = 10", "window = 10\nwindow_s = 60", "window_s"),
        ("seed = 1", "seed = -1", "seed"),
        ("duration_s = 10", "duration_s = 1e300", "duration_s"),
        ("rate_per_s = 2", "rate_per_s = 1e9", "rate_per_s"),
        ("window = 10", "window = 4000000000", "window"),
        ("max_retries = 1", "max_retries = 1000", "max_retries"),
        ("code = 503", "code = 99", "code"),
    ] {
        let text = GOOD.replace(from, to);
        assert_ne!(text, GOOD, "{from}");
        let e = error(&text);
        assert!(
            e.message.contains(key) || e.line == Some(line_of(&text, key)),
            "{key}: {e}"
        );
        assert!(e.line.is_some(), "{key}: {e}");
    }
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    for text in [
        "",
        "name = ",
        "[[[",
        "\u{0}\u{1}",
        "name = \"x\"\nseed = 1e400",
        &GOOD[..GOOD.len() / 2],
    ] {
        assert!(parse(text).is_err(), "{text:?}");
    }
    let e = scenario::load(Path::new("/nonexistent/scenario.toml")).unwrap_err();
    assert!(e.message.contains("cannot read"), "{e}");
}
