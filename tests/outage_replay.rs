//! The outage replay: the shipped scenarios meet their bounds, the figures
//! are what the requests and attempts did, the documents quote what the
//! replay prints, runs repeat exactly, and bad scenario files are reported
//! with the key and the line.

#[allow(dead_code)]
#[path = "../examples/outage_replay/budget.rs"]
mod budget;
#[allow(dead_code)]
#[path = "../examples/outage_replay/engine.rs"]
mod engine;
#[allow(dead_code)]
#[path = "../examples/outage_replay/figures.rs"]
mod figures;
#[allow(dead_code)]
#[path = "../examples/outage_replay/report.rs"]
mod report;
#[allow(dead_code)]
#[path = "../examples/outage_replay/scenario.rs"]
mod scenario;
#[allow(dead_code)]
#[path = "../examples/outage_replay/seeds.rs"]
mod seeds;
#[allow(dead_code)]
#[path = "../examples/outage_replay/svg.rs"]
mod svg;

#[path = "../examples/outage_replay/sweep.rs"]
mod sweep;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use engine::{Replay, StackKind, StackRun, TransitionRecord};
use figures::{Figures, Recovery};
use scenario::{Billing, Cost, Kind};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn load(name: &str) -> scenario::Scenario {
    let path = Path::new(ROOT).join("scenarios").join(name);
    scenario::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// A shipped scenario's full replay, run once for all the tests that read
/// it (one at a time: each replays its stacks on threads of its own).
fn replayed(name: &str) -> &'static Replay {
    static RUNS: OnceLock<Mutex<HashMap<String, &'static Replay>>> = OnceLock::new();
    let mut runs = RUNS.get_or_init(Default::default).lock().unwrap();
    let run = runs
        .entry(name.to_owned())
        .or_insert_with(|| Box::leak(Box::new(engine::replay(&load(name)).unwrap())));
    // Reborrowed through the `&'static`, it outlives the lock.
    run
}

fn stack<'a>(replay: &'a Replay, name: &str) -> &'a StackRun {
    replay
        .stack(name)
        .unwrap_or_else(|| panic!("no stack {name}"))
}

fn outage<'a>(replay: &'a Replay, name: &str) -> &'a Figures {
    stack(replay, name)
        .outage
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: no outage"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn assert_consistent(replay: &Replay) {
    for run in &replay.stacks {
        let all = &run.all;
        assert_eq!(all.requests, replay.arrivals_s.len() as u64, "{}", run.name);
        assert_eq!(
            all.succeeded + all.failed + all.rejected,
            all.requests,
            "{}",
            run.name
        );
        let logged = run.attempt_log.len() as u64;
        let counted: u64 = all.attempts.iter().map(|(_, n)| n).sum();
        assert_eq!(logged, counted, "{}", run.name);
        for f in [Some(all), run.outage.as_ref()].into_iter().flatten() {
            for w in [f.wait, f.answered_wait, f.answered_ttft]
                .into_iter()
                .flatten()
            {
                assert!(w.p50_s <= w.p99_s && w.p99_s <= w.max_s, "{}", run.name);
            }
            assert!(f.wasted_cost_usd <= f.cost_usd + 1e-9, "{}", run.name);
            assert!(
                f.wasted_cost_usd_hangs_unbilled <= f.wasted_cost_usd + 1e-9,
                "{}",
                run.name
            );
            assert!(f.answered <= f.succeeded, "{}", run.name);
        }
    }
}

/// The night of the writing assistant, during the outage: the breaker lets
/// at most 51 % of no-breaker's attempts through to the primary and wastes
/// at most 46 % of its spend (the write-up: 2,140 of 4,200 and ~96 of ~210
/// yuan); failover to the light model answers at least 99 % of the users
/// with a mean wait of at most 1.6 s.
fn check_night(replay: &Replay) {
    assert_consistent(replay);
    let without = outage(replay, "no-breaker");
    let with = outage(replay, "breaker");
    assert!(
        with.attempts[0].1 as f64 <= 0.51 * without.attempts[0].1 as f64,
        "breaker sent {} primary attempts, no-breaker {}",
        with.attempts[0].1,
        without.attempts[0].1
    );
    assert!(
        with.wasted_cost_usd <= 0.46 * without.wasted_cost_usd,
        "wasted: breaker {}, no-breaker {}",
        with.wasted_cost_usd,
        without.wasted_cost_usd
    );
    let failover = outage(replay, "failover");
    assert!(failover.user_error_rate.unwrap() <= 0.01);
    // The light model really carried the outage.
    assert!(failover.succeeded > with.succeeded);
}

/// A primary whose time to first token has a heavy tail (p99 ≥ 10 × p50):
/// hedging after its own p90 cuts the answered p99 to at most 40 % of the
/// failover's for at most 10 % more cost, within the hedge budget (the
/// fallback's attempts are the hedges), and no breaker opens.
#[test]
fn hedging_the_first_token_cuts_a_heavy_tail_for_little_more_cost() {
    let replay = replayed("heavy-tail-first-token.toml");
    assert_consistent(replay);
    let (failover, hedged) = (&stack(replay, "failover").all, &stack(replay, "hedged").all);
    let (f, h) = (
        failover.answered_wait.unwrap(),
        hedged.answered_wait.unwrap(),
    );
    assert!(f.p99_s >= 10.0 * f.p50_s, "not a heavy tail: {f:?}");
    assert!(
        h.p99_s <= 0.4 * f.p99_s,
        "hedged p99 {} vs failover {}",
        h.p99_s,
        f.p99_s
    );
    assert!(
        hedged.cost_usd <= 1.1 * failover.cost_usd,
        "hedged ${} vs failover ${}",
        hedged.cost_usd,
        failover.cost_usd
    );
    assert_eq!(hedged.answered, failover.answered);
    let hedges = hedged.attempts[1].1 as f64;
    let budget = replay.setup.hedge.unwrap().budget_percent / 100.0;
    assert!(
        hedges <= (budget + 0.01) * hedged.requests as f64,
        "{hedges} hedges"
    );
    assert!(hedges > 0.0);
    assert!(stack(replay, "hedged").transitions.is_empty());
}

#[test]
fn night_scenario_meets_its_bounds() {
    let replay = replayed("seed-000-night.toml");
    check_night(replay);
    let failover = outage(replay, "failover").answered_wait.unwrap();
    assert!(failover.mean_s <= 1.6, "{failover:?}");
}

#[test]
fn night_scenario_meets_its_bounds_with_the_slow_call_rule() {
    let replay = replayed("seed-000-night-slow.toml");
    check_night(replay);
    let failover = outage(replay, "failover").answered_wait.unwrap();
    assert!(failover.mean_s <= 1.6, "{failover:?}");
}

/// The SaaS back end: per-provider breakers with ordered failover keep the
/// answered p99 at most 1.8 s and waste at most 5 % of what naive failover
/// wastes during the outage.
#[test]
fn failover_scenario_meets_its_bounds() {
    let replay = replayed("seed-002-failover.toml");
    assert_consistent(replay);
    let failover = stack(replay, "failover");
    for f in [&failover.all, outage(replay, "failover")] {
        let p99 = f.answered_wait.unwrap().p99_s;
        assert!(p99 <= 1.8, "failover answered p99 {p99:.3} s");
    }
    let naive = outage(replay, "naive-failover");
    let mine = outage(replay, "failover");
    assert!(naive.wasted_cost_usd > 0.0);
    assert!(
        mine.wasted_cost_usd <= 0.05 * naive.wasted_cost_usd,
        "wasted: failover {}, naive {}",
        mine.wasted_cost_usd,
        naive.wasted_cost_usd
    );
    // Naive fallback makes users wait out the hanging primary.
    assert!(naive.answered_wait.unwrap().p99_s > mine.answered_wait.unwrap().p99_s);
}

/// A primary that slows down without failing: only the slow-call rule
/// opens the circuit, and failover then spares users the slow answers.
#[test]
fn the_slow_call_rule_sees_a_slowdown_that_failures_do_not_show() {
    let mut scenario = load("seed-002-failover-slow.toml");
    let kinds = [StackKind::NaiveFailover, StackKind::Failover];
    let with = engine::replay_stacks(&scenario, &kinds).unwrap();
    assert_consistent(&with);
    let naive = outage(&with, "naive-failover").answered_wait.unwrap();
    let failover = outage(&with, "failover");
    assert!(failover.answered_wait.unwrap().mean_s * 4.0 < naive.mean_s);
    assert!(stack(&with, "failover").recovery[0]
        .time_to_trip_s
        .is_some());

    // Without the rule the slow answers count as healthy: no outage, no
    // trip, every request goes to the primary.
    scenario.breaker.slow_call = None;
    let without = engine::replay_stacks(&scenario, &kinds).unwrap();
    let failover = stack(&without, "failover");
    assert!(failover.outage.is_none() && failover.transitions.is_empty());
    assert_eq!(failover.all.attempts[0].1, failover.all.requests);
}

/// One upstream, evenly spaced requests, every answer certain: the figures
/// can be worked out by hand.
const EXACT: &str = r#"name = "exact"
seed = 1
duration_s = 10
rate_per_s = 1
poisson = false

[client]
attempt_timeout_s = 2.5
total_timeout_s = 0
max_retries = 0
backoff_base_ms = 100
backoff_max_ms = 1000

[breaker]
trip_mode = "open"
window = 0
min_calls = 0
failure_rate = 1.0
consecutive_failures = 2
slow_call_ms = 0
slow_call_rate = 1.0
open_s = 5
open_max_s = 5
probes = 1
close_after = 1

[[upstream]]
name = "only"
  [[upstream.phase]]
  from_s = 0
  responses = [ { p = 1.0, kind = "ok", latency_ms = 100, stream_ms = 400 } ]
  [[upstream.phase]]
  from_s = 4.5
  responses = [ { p = 1.0, kind = "hang" } ]
  [[upstream.phase]]
  from_s = 7.5
  responses = [ { p = 1.0, kind = "ok", latency_ms = 100, stream_ms = 400 } ]
"#;

#[test]
fn figures_are_what_the_requests_and_attempts_did() {
    let replay = engine::replay(&scenario::parse(EXACT, "exact.toml").unwrap()).unwrap();
    assert_consistent(&replay);
    // Requests arrive at 0, 1, …, 9 s; those at 5, 6 and 7 s meet the hang
    // and time out after 2.5 s; answers stream from 0.1 s to 0.5 s.
    let plain = stack(&replay, "no-breaker");
    let all = &plain.all;
    assert_eq!((all.succeeded, all.failed, all.rejected), (7, 3, 0));
    assert!(close(all.user_error_rate.unwrap(), 0.3));
    assert!(close(all.answered_wait.unwrap().mean_s, 0.5));
    assert!(close(all.answered_ttft.unwrap().mean_s, 0.1));
    assert!(close(
        all.wait.unwrap().mean_s,
        (7.0 * 0.5 + 3.0 * 2.5) / 10.0
    ));
    assert!(close(all.amplification.unwrap(), 1.0));
    // 0.01 USD a request: the hung generations are billed in full.
    assert!(close(all.cost_usd, 0.10) && close(all.wasted_cost_usd, 0.03));
    let window = plain.outage.as_ref().unwrap();
    assert_eq!((window.from_s, window.to_s), (4.5, 7.5));
    assert_eq!((window.requests, window.failed), (3, 3));
    assert!(window.answered_wait.is_none() && close(window.wasted_cost_usd, 0.03));
    assert_eq!(
        plain.recovery,
        [Recovery {
            upstream: "only".into(),
            healed_at_s: Some(7.5),
            recovery_lag_s: Some(0.0),
            time_to_trip_s: None,
            failing_share: Some(1.0),
            lag_bound_s: None,
        }]
    );

    // The second hang fails at 8.5 s and trips the breaker, which rejects
    // the request at 9 s and is still open when the run ends.
    let breaker = stack(&replay, "breaker");
    let all = &breaker.all;
    assert_eq!((all.succeeded, all.failed, all.rejected), (6, 3, 1));
    assert!(close(all.user_error_rate.unwrap(), 0.4));
    assert!(close(all.amplification.unwrap(), 0.9));
    assert!(close(all.cost_usd, 0.09) && close(all.wasted_cost_usd, 0.03));
    let r = &breaker.recovery[0];
    assert_eq!(r.recovery_lag_s, None);
    assert!(close(r.time_to_trip_s.unwrap(), 4.0), "{r:?}");
}

#[test]
fn answers_count_within_the_deadline_in_every_window() {
    // No total timeout: every answer counts. The heal at 7.5 s leaves the
    // requests at 8 and 9 s after it; the breaker answers the first and
    // rejects the second.
    let replay = engine::replay(&scenario::parse(EXACT, "exact.toml").unwrap()).unwrap();
    let plain = stack(&replay, "no-breaker");
    let breaker = stack(&replay, "breaker");
    assert_eq!(replay.setup.client.deadline, None);
    assert_eq!((plain.all.answered, breaker.all.answered), (7, 6));
    let (p, b) = (
        plain.after_heal.as_ref().unwrap(),
        breaker.after_heal.as_ref().unwrap(),
    );
    assert_eq!((p.from_s, p.requests, p.answered), (7.5, 2, 2));
    assert_eq!((b.requests, b.answered, b.rejected), (2, 1, 1));
    let nb = report::no_breaker_answered(&replay, None, report::Window::AfterHeal);
    assert_eq!(nb, Some(2));
    assert_eq!(report::vs_no_breaker(b.answered, nb), Some(0.5));
    assert_eq!(report::vs_no_breaker(3, Some(0)), None);
    let outage = breaker.outage.as_ref().unwrap();
    assert_eq!(outage.answered, 0);
    let doc: serde_json::Value = serde_json::from_str(&report::json(&replay)).unwrap();
    assert!(doc["stacks"][1]["outage"]["answers_vs_no_breaker"].is_null());
    assert_eq!(doc["stacks"][1]["outage"]["no_breaker_answered"], 0);
    assert_eq!(doc["stacks"][1]["after_heal"]["answers_vs_no_breaker"], 0.5);

    // Answers take 0.5 s: a 0.4 s deadline counts none of them, 0.5 s all.
    for (deadline, answered) in [("0.4", 0), ("0.5", 7)] {
        let text = EXACT.replace(
            "max_retries = 0",
            &format!("max_retries = 0\ndeadline_s = {deadline}"),
        );
        let replay = engine::replay(&scenario::parse(&text, "exact.toml").unwrap()).unwrap();
        let plain = stack(&replay, "no-breaker");
        assert_eq!((plain.all.succeeded, plain.all.answered), (7, answered));
        assert!(
            report::table(&replay).contains(&format!("{answered}/{answered} = ")) || answered == 0
        );
    }
    // By default, the total timeout.
    let text = EXACT.replace("total_timeout_s = 0", "total_timeout_s = 3");
    let s = scenario::parse(&text, "exact.toml").unwrap();
    assert_eq!(s.client.deadline, Some(Duration::from_secs(3)));
}

#[test]
fn a_bad_deadline_is_named_with_its_line() {
    for bad in ["0", "-1"] {
        let text = EXACT.replace(
            "max_retries = 0",
            &format!("max_retries = 0\ndeadline_s = {bad}"),
        );
        let e = scenario::parse(&text, "t.toml").unwrap_err();
        assert!(e.message.contains("deadline_s"), "{e}");
        assert_eq!(e.line, Some(line_of(&text, "deadline_s")), "{e}");
    }
    // A value of the wrong type: its line, as for any key.
    let text = EXACT.replace("max_retries = 0", "max_retries = 0\ndeadline_s = \"soon\"");
    let e = scenario::parse(&text, "t.toml").unwrap_err();
    assert_eq!(e.line, Some(line_of(&text, "deadline_s")), "{e}");
    let text = EXACT.replace("max_retries = 0", "max_retries = 0\ndeadline = 3");
    let e = scenario::parse(&text, "t.toml").unwrap_err();
    assert!(e.message.contains("deadline"), "{e}");
    assert_eq!(e.line, Some(line_of(&text, "deadline = 3")));
}

#[test]
fn a_health_probe_is_billed_as_one_token_and_keeps_its_own_timeout() {
    // The hang never ends; probes every second from the trip on.
    let text = EXACT
        .replace("close_after = 1", "close_after = 1\nhealth_probe_interval_s = 1")
        .replace(
            "name = \"only\"",
            "name = \"only\"\ncost = { usd_per_mtok_in = 1.0, usd_per_mtok_out = 10.0, tokens_in = 1000, tokens_out = 500 }",
        )
        .replace("from_s = 7.5", "from_s = 9.5");
    let s = scenario::parse(&text, "t.toml").unwrap();
    let probe_price = Cost::PerToken {
        input_usd: 0.001,
        output_usd: 10.0 / 1e6,
    };
    assert_eq!(s.upstreams[0].probe_cost, probe_price);
    assert_eq!(s.breaker.health_probe_timeout, None, "the prober's default");
    let replay = engine::replay(&s).unwrap();
    let breaker = stack(&replay, "breaker");
    let probes: Vec<_> = breaker.attempt_log.iter().filter(|a| a.probe).collect();
    assert!(!probes.is_empty());
    for a in &probes {
        // An answered probe: the input and one token; a hanging one as
        // [billing] hang says of that one token; one still waiting for its
        // head when the run ends, nothing.
        assert!(
            close(a.cost_usd, probe_price.billed(1.0)) || a.cost_usd == 0.0,
            "{a:?}"
        );
    }
    assert!(probes.iter().any(|a| close(a.cost_usd, 0.001 + 10.0 / 1e6)));
    // Users' answers cost the full price.
    let user = breaker
        .attempt_log
        .iter()
        .find(|a| !a.probe && a.answered)
        .unwrap();
    assert!(close(user.cost_usd, 0.001 + 0.005), "{user:?}");

    let text = text.replace(
        "health_probe_interval_s = 1",
        "health_probe_interval_s = 1\nhealth_probe_timeout_s = 0.25",
    );
    let s = scenario::parse(&text, "t.toml").unwrap();
    assert_eq!(
        s.breaker.health_probe_timeout,
        Some(Duration::from_millis(250))
    );
    let e = scenario::parse(
        &text.replace(
            "health_probe_timeout_s = 0.25",
            "health_probe_timeout_s = 0",
        ),
        "t.toml",
    )
    .unwrap_err();
    assert!(e.message.contains("health_probe_timeout_s"), "{e}");
}

/// The health probe's own deadline changes what the replay does: after the
/// heal the upstream answers in 1.5 s, so probes every second with the
/// prober's default deadline (one interval) are all given up and the
/// circuit waits out its 20 s open period, while a 2 s deadline lets the
/// first probe after the heal close it.
#[test]
fn the_health_probe_timeout_decides_whether_a_slow_upstream_re_closes() {
    let text = EXACT
        .replace("duration_s = 10", "duration_s = 30")
        .replace("open_s = 5\nopen_max_s = 5", "open_s = 20\nopen_max_s = 20")
        .replace("close_after = 1", "close_after = 1\nhealth_probe_interval_s = 1")
        .replace(
            "from_s = 7.5\n  responses = [ { p = 1.0, kind = \"ok\", latency_ms = 100, stream_ms = 400 } ]",
            "from_s = 7.5\n  responses = [ { p = 1.0, kind = \"ok\", latency_ms = 1500 } ]",
        );
    assert!(text.contains("latency_ms = 1500") && text.contains("open_s = 20"));
    let closed_at = |text: &str| {
        let s = scenario::parse(text, "t.toml").unwrap();
        let replay = engine::replay(&s).unwrap();
        let breaker = stack(&replay, "breaker");
        assert!(breaker.attempt_log.iter().any(|a| a.probe));
        breaker
            .transitions
            .iter()
            .find(|t| t.to == "closed" && t.t_s > 7.5)
            .map(|t| t.t_s)
    };
    // The prober's default: one interval, shorter than every answer.
    let default_close = closed_at(&text);
    assert!(
        default_close.is_none_or(|t| t >= 28.0),
        "closed at {default_close:?}: only the open period's end can close it"
    );
    // Its own deadline, longer than the upstream's answer.
    let longer = text.replace(
        "health_probe_interval_s = 1",
        "health_probe_interval_s = 1\nhealth_probe_timeout_s = 2",
    );
    let close = closed_at(&longer).expect("a probe answered, the circuit closes");
    assert!(close < 13.0, "closed at {close}");
}

#[test]
fn wasted_cost_is_given_with_hangs_billed_and_unbilled() {
    let replay = engine::replay(&scenario::parse(EXACT, "exact.toml").unwrap()).unwrap();
    let all = &stack(&replay, "no-breaker").all;
    // Three hung attempts, billed in full at 0.01 USD, and nothing else.
    assert!(close(all.wasted_cost_usd, 0.03));
    assert!(close(all.wasted_cost_usd_hangs_unbilled, 0.0));
    let table = report::table(&replay);
    assert!(
        table.contains("billing: cost $ and wasted $ bill"),
        "{table}"
    );
    assert!(table.contains("hangs unbilled"), "{table}");
}

#[test]
fn billing_follows_what_was_generated() {
    let billing = Billing::default();
    let ms = Duration::from_millis;
    let ok = Kind::Ok {
        latency: ms(800),
        stream: ms(200),
    };
    assert_eq!(billing.generated(ok, ms(800)), 1.0);
    assert_eq!(billing.generated(ok, ms(500)), 0.5, "cut off half way");
    assert_eq!(billing.generated(Kind::Hang, ms(60_000)), 1.0);
    let error = Kind::Status {
        code: 503,
        latency: ms(300),
        retry_after: None,
    };
    assert_eq!(billing.generated(error, ms(300)), 0.0);
    let stream = Kind::SseError {
        latency: ms(100),
        stream: ms(900),
    };
    assert_eq!(billing.generated(stream, ms(100)), 0.5);
    assert_eq!(billing.generated(stream, ms(50)), 0.0);

    let tokens = Cost::PerToken {
        input_usd: 0.002,
        output_usd: 0.010,
    };
    assert_eq!(tokens.billed(0.0), 0.0);
    assert!(close(tokens.billed(0.5), 0.007));
    assert!(close(Cost::PerRequest { usd: 0.02 }.billed(1.0), 0.02));
}

#[test]
fn the_ground_truth_counts_what_fails_by_construction_weighted_by_duration() {
    // 40 s of 503s (50 %), 429s (20 %, not failures) and answers whose
    // lognormal head has its median at the 10 s attempt timeout (half of
    // them late); then 20 s of hangs; then healthy from 80 s.
    let text = EXACT
        .replace("duration_s = 10", "duration_s = 100")
        .replace("attempt_timeout_s = 2.5", "attempt_timeout_s = 10")
        .replace(
            r#"  from_s = 4.5
  responses = [ { p = 1.0, kind = "hang" } ]
  [[upstream.phase]]
  from_s = 7.5"#,
            r#"  from_s = 20
  responses = [ { p = 0.5, kind = "status", code = 503, latency_ms = 100 },
                { p = 0.2, kind = "status", code = 429, latency_ms = 100 },
                { p = 0.3, kind = "ok", latency_ms = 10000, latency_sigma = 0.5 } ]
  [[upstream.phase]]
  from_s = 60
  responses = [ { p = 1.0, kind = "hang" } ]
  [[upstream.phase]]
  from_s = 80"#,
        );
    let scenario = scenario::parse(&text, "truth.toml").unwrap();
    let (within, timeout) = (scenario.answer_within(), scenario.client.attempt_timeout);
    let u = &scenario.upstreams[0];
    let share = u.failing_share(within, timeout).unwrap();
    let expected = (40.0 * (0.5 + 0.3 * 0.5) + 20.0 * 1.0) / 60.0;
    assert!((share - expected).abs() < 1e-6, "{share} != {expected}");
    assert_eq!(scenario::outage_class(share), "between");
    assert_eq!(scenario::outage_class(0.5), "partial");
    assert_eq!(scenario::outage_class(0.9), "dead");
    // The exact scenario's hang is dead; an upstream that never fails has
    // no outage to class.
    let exact = scenario::parse(EXACT, "exact.toml").unwrap();
    let within = exact.answer_within();
    let timeout = exact.client.attempt_timeout;
    assert_eq!(exact.upstreams[0].failing_share(within, timeout), Some(1.0));
    let healthy = scenario::parse(
        &EXACT.replace(r#"kind = "hang""#, r#"kind = "ok", latency_ms = 100"#),
        "ok.toml",
    )
    .unwrap();
    assert_eq!(healthy.upstreams[0].failing_share(within, timeout), None);

    // Per class of traffic: a model's upstream, or an API key's own script.
    let regional = load("regional-outage-keyed.toml");
    assert_eq!(regional.class_failing_share("gpt-eu"), Some(1.0));
    assert_eq!(regional.class_failing_share("claude-us"), None);
    assert_eq!(regional.class_failing_share("no-such-model"), None);
    let keys = load("key-quota-exhausted.toml");
    // team-a's key runs out of quota (a 429, which does not fail); team-b
    // has no script of its own, and the upstream's never fails.
    assert_eq!(keys.class_failing_share("gpt-4o/team-a"), Some(0.0));
    assert_eq!(keys.class_failing_share("gpt-4o/team-b"), None);
}

#[test]
fn the_lag_bound_is_the_interval_twice_the_p99_verdict_and_a_second() {
    let scenario = scenario::parse(EXACT, "exact.toml").unwrap();
    let r = Recovery::of(&scenario, 0, &[]);
    // 100 verdicts of 0.01 … 1.00 s: the p99 is 0.99 s.
    let verdicts: Vec<f64> = (1..=100).map(|i| f64::from(i) / 100.0).collect();
    let bounded = r.clone().with_bound(Duration::from_secs(5), verdicts);
    assert!((bounded.lag_bound_s.unwrap() - (5.0 + 2.0 * 0.99 + 1.0)).abs() < 1e-9);
    assert_eq!(
        r.with_bound(Duration::from_secs(5), Vec::new()).lag_bound_s,
        None
    );
    // A replay with health probes gives the breaker stack a bound and no
    // breaker none.
    let mut probed = scenario.clone();
    probed.breaker.health_probe_interval = Some(Duration::from_secs(1));
    let replay = engine::replay(&probed).unwrap();
    let bound = |name: &str| stack(&replay, name).recovery[0].lag_bound_s;
    assert_eq!(bound("no-breaker"), None);
    // Healthy heads come in 100 ms: 1 + 0.2 + 1.
    assert!(
        (bound("breaker").unwrap() - 2.2).abs() < 1e-6,
        "{:?}",
        bound("breaker")
    );
}

#[test]
fn recovery_is_measured_from_the_heal() {
    let scenario = scenario::parse(EXACT, "exact.toml").unwrap();
    let at = |t_s: f64, to: &'static str| TransitionRecord {
        t_s,
        upstream: "only".into(),
        to,
    };
    let of = |ts: &[TransitionRecord]| Recovery::of(&scenario, 0, ts);
    let r = of(&[at(5.0, "open"), at(7.0, "half-open"), at(9.0, "closed")]);
    assert_eq!(r.healed_at_s, Some(7.5));
    assert_eq!((r.time_to_trip_s, r.recovery_lag_s), (Some(0.5), Some(1.5)));
    // Closed at the heal, then tripped by late failures and closed again:
    // the lag runs to the close that lasts.
    let r = of(&[
        at(5.0, "open"),
        at(6.0, "closed"),
        at(8.0, "open"),
        at(9.5, "closed"),
    ]);
    assert_eq!(r.recovery_lag_s, Some(2.0));
    assert_eq!(
        of(&[at(5.0, "open"), at(6.0, "closed")]).recovery_lag_s,
        Some(0.0)
    );
    assert_eq!(of(&[at(5.0, "open")]).recovery_lag_s, None);
    assert_eq!(of(&[]).time_to_trip_s, None);

    // The heal is the start of the healthy phases that end the run, however
    // many; 1 % failures is healthy. An upstream whose last phase fails, or
    // answers slower than the attempt timeout, never heals, and its outage
    // lasts to the end of the run.
    let then = |responses: &str| {
        let text =
            format!("{EXACT}  [[upstream.phase]]\n  from_s = 9\n  responses = [ {responses} ]\n");
        scenario::parse(&text, "then.toml").unwrap()
    };
    let reset = "{ p = 0.01, kind = \"reset\", latency_ms = 10 }";
    for healthy in [
        "{ p = 1.0, kind = \"ok\", latency_ms = 200 }".to_owned(),
        format!("{{ p = 0.99, kind = \"ok\", latency_ms = 200 }}, {reset}"),
    ] {
        let s = then(&healthy);
        assert_eq!(Recovery::of(&s, 0, &[]).healed_at_s, Some(7.5), "{healthy}");
    }
    for sick in [
        "{ p = 1.0, kind = \"hang\" }".to_owned(),
        "{ p = 1.0, kind = \"ok\", latency_ms = 3000 }".to_owned(),
        format!("{{ p = 0.98, kind = \"ok\", latency_ms = 200 }}, {reset}, {reset}"),
    ] {
        let s = then(&sick);
        assert_eq!(Recovery::of(&s, 0, &[]).healed_at_s, None, "{sick}");
        assert_eq!(s.outage(), Some((Duration::from_millis(4500), s.duration)));
    }
}

/// The longest half-open period of each breaker stack, per upstream.
fn longest_half_open(run: &StackRun) -> f64 {
    let mut longest = 0.0_f64;
    for upstream in run.recovery.iter().map(|r| &r.upstream) {
        let mine: Vec<&TransitionRecord> = run
            .transitions
            .iter()
            .filter(|t| &t.upstream == upstream)
            .collect();
        for w in mine.windows(2) {
            if w[0].to == "half-open" {
                longest = longest.max(w[1].t_s - w[0].t_s);
            }
        }
    }
    longest
}

fn breaker_stacks(replay: &Replay) -> impl Iterator<Item = &StackRun> {
    replay
        .stacks
        .iter()
        .filter(|s| matches!(s.name, "breaker" | "failover"))
}

#[test]
fn health_probes_close_every_breaker_within_ten_seconds_of_the_heal() {
    // The shipped scenarios as they are in the shared set, with only
    // `health_probe_interval_s = 5` added.
    for name in ["seed-000-night.toml", "seed-002-failover.toml"] {
        let mut scenario = load(name);
        let without = engine::replay(&scenario).unwrap();
        scenario.breaker.health_probe_interval = Some(Duration::from_secs(5));
        let with = engine::replay(&scenario).unwrap();
        for run in breaker_stacks(&with) {
            for r in run
                .recovery
                .iter()
                .filter(|r| r.healed_at_s.unwrap_or(0.0) > 0.0)
            {
                let lag = r.recovery_lag_s.unwrap_or(f64::INFINITY);
                assert!(
                    lag <= 10.0,
                    "{name} {} {}: closed {lag} s after the heal",
                    run.name,
                    r.upstream
                );
            }
        }
        // Without them, recovery waits for the backoff (or the run's end).
        let slow = breaker_stacks(&without)
            .flat_map(|run| &run.recovery)
            .filter(|r| r.healed_at_s.unwrap_or(0.0) > 0.0)
            .map(|r| r.recovery_lag_s.unwrap_or(f64::INFINITY))
            .fold(0.0, f64::max);
        assert!(slow > 10.0, "{name}: {slow} s without health probes");
    }
}

#[test]
fn with_the_slow_rule_no_half_open_period_outlasts_the_threshold_by_two_seconds() {
    for name in ["seed-000-night-slow.toml", "seed-002-failover-slow.toml"] {
        let mut scenario = load(name);
        let threshold = scenario
            .breaker
            .slow_call
            .expect("a slow rule")
            .0
            .as_secs_f64();
        for interval in [None, Some(Duration::from_secs(5))] {
            scenario.breaker.health_probe_interval = interval;
            let replay = engine::replay(&scenario).unwrap();
            for run in breaker_stacks(&replay) {
                let longest = longest_half_open(run);
                assert!(
                    longest <= threshold + 2.0,
                    "{name} {}: half-open for {longest} s, threshold {threshold} s",
                    run.name
                );
            }
        }
    }
}

#[test]
fn without_health_probes_every_breaker_closes_within_its_backoff_cap_and_deadline() {
    // A breaker still open when the run ends is checked only where the run
    // lasts long enough after the heal for the longest backoff.
    let mut checked = 0;
    for name in ["seed-000-night.toml", "recovery-after-a-long-outage.toml"] {
        let scenario = load(name);
        let b = &scenario.breaker;
        let deadline = b
            .probe_timeout
            .or(b.slow_call.map(|(t, _)| t))
            .unwrap_or(scenario.client.attempt_timeout);
        let bound = (b.open_max + deadline).as_secs_f64() + 5.0;
        let end = scenario.duration.as_secs_f64();
        let replay = engine::replay(&scenario).unwrap();
        for run in breaker_stacks(&replay) {
            for r in run
                .recovery
                .iter()
                .filter(|r| r.healed_at_s.unwrap_or(0.0) > 0.0)
            {
                let lag = r.recovery_lag_s.unwrap_or(f64::INFINITY);
                if lag.is_infinite() && end - r.healed_at_s.unwrap() < bound {
                    continue;
                }
                checked += 1;
                assert!(
                    lag <= bound,
                    "{name} {} {}: closed {lag} s after the heal, bound {bound} s",
                    run.name,
                    r.upstream
                );
            }
        }
    }
    assert!(
        checked >= 3,
        "only {checked} recoveries long enough to check"
    );
}

#[test]
fn probe_timeout_s_reaches_the_breaker() {
    // A probe that hangs is failed at its deadline, not at the 60 s attempt
    // timeout: half-open periods end sooner.
    let mut scenario = load("seed-000-night.toml");
    let kinds = [StackKind::Breaker];
    let half_open = |replay: &Replay| {
        let t = &stack(replay, "breaker").transitions;
        let spans: Vec<f64> = t
            .windows(2)
            .filter(|w| w[0].to == "half-open")
            .map(|w| w[1].t_s - w[0].t_s)
            .collect();
        spans.into_iter().fold(0.0, f64::max)
    };
    let before = half_open(&engine::replay_stacks(&scenario, &kinds).unwrap());
    scenario.breaker.probe_timeout = Some(Duration::from_secs(5));
    let after = half_open(&engine::replay_stacks(&scenario, &kinds).unwrap());
    // Deadlines are applied when the breaker is next touched: by the next
    // arrival, a fraction of a second later.
    assert!(
        after <= 6.0 && after < before,
        "{after} s, before {before} s"
    );
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

const FIGURES: [&str; 25] = [
    "amplification",
    "answered",
    "answered_ttft_mean_s",
    "answered_ttft_p50_s",
    "answered_ttft_p99_s",
    "answered_wait_max_s",
    "answered_wait_mean_s",
    "answered_wait_p50_s",
    "answered_wait_p99_s",
    "answers_vs_no_breaker",
    "attempts",
    "cost_usd",
    "error_wait_mean_s",
    "failed",
    "no_breaker_answered",
    "rejected",
    "requests",
    "succeeded",
    "user_error_rate",
    "wait_max_s",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p99_s",
    "wasted_cost_usd",
    "wasted_cost_usd_hangs_unbilled",
];

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn json_has_exactly_the_documented_fields() {
    let mut stack_keys: Vec<&str> = FIGURES.to_vec();
    stack_keys.extend(["name", "outage", "after_heal", "transitions", "upstreams"]);
    let mut outage_keys: Vec<&str> = FIGURES.to_vec();
    outage_keys.extend(["from_s", "to_s"]);
    for (file, upstreams) in [
        ("seed-000-night.toml", ["primary", "light-model"]),
        (
            "seed-002-failover.toml",
            ["gpt-primary", "deepseek-fallback"],
        ),
    ] {
        let doc: serde_json::Value = serde_json::from_str(&report::json(replayed(file))).unwrap();
        assert_eq!(
            keys(&doc),
            [
                "billing",
                "deadline_s",
                "scenario",
                "schema_version",
                "seed",
                "stacks"
            ]
        );
        assert!(doc["billing"]["text"]
            .as_str()
            .unwrap()
            .contains("a hang 1.00"));
        assert_eq!(doc["schema_version"], report::SCHEMA_VERSION);
        let stacks = doc["stacks"].as_array().unwrap();
        let names: Vec<&str> = stacks.iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["no-breaker", "breaker", "naive-failover", "failover"]
        );
        for s in stacks {
            let name = s["name"].as_str().unwrap();
            assert_eq!(keys(s), sorted(&stack_keys), "{file} {name}");
            assert_eq!(keys(&s["outage"]), sorted(&outage_keys), "{file} {name}");
            assert_eq!(
                keys(&s["after_heal"]),
                sorted(&outage_keys),
                "{file} {name}"
            );
            // Figures are numbers, or null only where there is nothing to
            // measure (no answered request in the breaker's outage, no
            // error for failover).
            for key in FIGURES
                .iter()
                .filter(|k| !["attempts", "error_wait_mean_s"].contains(k))
            {
                assert!(s[key].is_number(), "{file} {name} {key}");
            }
            // Each window's answers beside no breaker's in the same window.
            for w in [s, &s["outage"], &s["after_heal"]] {
                let (a, n) = (&w["answered"], &w["no_breaker_answered"]);
                let (a, n) = (a.as_u64().unwrap(), n.as_u64().unwrap());
                assert!(a <= w["succeeded"].as_u64().unwrap());
                match w["answers_vs_no_breaker"].as_f64() {
                    Some(r) => assert!((r - a as f64 / n as f64).abs() < 1e-6),
                    None => assert_eq!(
                        n, 0,
                        "{file} {name}: null only where no breaker answered none"
                    ),
                }
            }
            let reach = if name.contains("failover") { 2 } else { 1 };
            assert_eq!(keys(&s["attempts"]).len(), reach);
            assert_eq!(keys(&s["outage"]["attempts"]).len(), reach);
            for upstream in &upstreams[..reach] {
                let r = &s["upstreams"][upstream];
                assert_eq!(
                    keys(r),
                    [
                        "class",
                        "failing_share",
                        "healed_at_s",
                        "recovery_lag_bound_s",
                        "recovery_lag_s",
                        "time_to_trip_s"
                    ],
                    "{file} {name} {upstream}"
                );
                assert!(r["healed_at_s"].is_number());
            }
            for t in s["transitions"].as_array().unwrap() {
                assert_eq!(keys(t), ["t_s", "to", "upstream"]);
            }
        }
        // Breakers trip on the primary; no breaker, no trip.
        assert!(stacks[1]["upstreams"][upstreams[0]]["time_to_trip_s"].is_number());
        assert!(stacks[0]["upstreams"][upstreams[0]]["time_to_trip_s"].is_null());
        assert_eq!(stacks[0]["upstreams"][upstreams[0]]["recovery_lag_s"], 0.0);
    }
}

#[test]
fn the_text_table_prints_every_figure() {
    let table = report::table(replayed("seed-000-night.toml"));
    for needle in [
        "every request:",
        "the outage: requests that arrived from 120.0 s to 780.0 s",
        "errors",
        "answered: mean",
        "ttft p50",
        "ampl.",
        "wasted $",
        "healed  780.0",
        "trip ",
        "lag ",
    ] {
        assert!(table.contains(needle), "{needle}:\n{table}");
    }
    assert!(table.lines().all(|l| l == l.trim_end()));
}

#[test]
fn the_writeup_tables_print_beside_the_writeups_figures() {
    for (file, reported) in [
        (
            "seed-000-writeup.toml",
            ["4,200 | ", "2,140 | ", "62 s | ", "~96 yuan | $"],
        ),
        (
            "seed-002-writeup.toml",
            ["23 s | ", "1.8 s | ", "4.7× | ", "— | "],
        ),
    ] {
        let replay = replayed(file);
        let rows = replay.setup.writeup.as_ref().unwrap().rows.len();
        let table = report::table(replay);
        let (_, writeup) = table.split_once(" (write-up | replay").unwrap();
        let writeup = writeup.split("\n\n").next().unwrap();
        assert_eq!(writeup.lines().count(), rows + 2, "{writeup}");
        for cell in reported {
            assert!(writeup.contains(cell), "{cell}:\n{writeup}");
        }
    }
}

/// The figure rendered by a real SVG renderer, as RGBA pixels.
fn render(svg: &str) -> resvg::tiny_skia::Pixmap {
    let tree = resvg::usvg::Tree::from_str(svg, &resvg::usvg::Options::default()).unwrap();
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap
}

fn rgb(hex: &str) -> [u8; 3] {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

/// Pixels of `colour` (within a renderer's rounding) in rows `y0..y1`
/// (all rows: `None`).
fn pixels(pixmap: &resvg::tiny_skia::Pixmap, colour: &str, rows: Option<(f64, f64)>) -> usize {
    let [r, g, b] = rgb(colour);
    let w = pixmap.width() as usize;
    let (y0, y1) = rows.map_or((0, pixmap.height() as usize), |(a, b)| {
        (a.ceil() as usize, b.floor() as usize)
    });
    pixmap.data()[y0 * w * 4..y1 * w * 4]
        .chunks(4)
        .filter(|p| p[0].abs_diff(r) <= 4 && p[1].abs_diff(g) <= 4 && p[2].abs_diff(b) <= 4)
        .count()
}

#[test]
fn the_post_mortem_figure_draws_what_a_reader_needs() {
    let colours = [
        report::OK,
        report::FAILED,
        report::RATE_LIMITED,
        report::REJECTED,
        report::CLOSED,
        report::OPEN,
        report::HALF_OPEN,
        report::HEALTHY,
        report::FAILING,
        report::SLOW,
    ];
    for (i, c) in colours.iter().enumerate() {
        assert!(!colours[..i].contains(c), "{c} twice");
    }
    let replay = replayed("seed-000-night.toml");
    let (svg, layout) = report::svg_with_layout(replay);
    for needle in [
        "ground truth",
        "bin width 5 s",
        "answered wait p50, p99",
        "requests per bin",
        "cumulative cost",
        "breaker primary",
        "breaker light-model",
        "half-open",
        "rate limited (429)",
    ] {
        assert!(svg.contains(needle), "{needle}");
    }
    let pixmap = render(&svg);
    assert_eq!(
        (pixmap.width() as f64, pixmap.height() as f64),
        (layout.width, layout.height.round())
    );
    // Every stack's row of requests is drawn, answered ones included.
    let names: Vec<&str> = layout.bars.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["no-breaker", "breaker", "naive-failover", "failover"]
    );
    for (name, y0, y1) in &layout.bars {
        assert!(
            pixels(&pixmap, report::OK, Some((*y0, *y1))) > 100,
            "{name}: no answered requests drawn"
        );
    }
    // No breaker, no rejections; the breaker stack's are drawn.
    let (_, y0, y1) = &layout.bars[0];
    assert_eq!(pixels(&pixmap, report::REJECTED, Some((*y0, *y1))), 0);
    let (_, y0, y1) = &layout.bars[1];
    assert!(pixels(&pixmap, report::REJECTED, Some((*y0, *y1))) > 100);
    // Above the legend, which has a swatch of every colour.
    let data = Some((0.0, layout.legend));
    for colour in [
        report::FAILED,
        report::OPEN,
        report::FAILING,
        report::HEALTHY,
    ] {
        assert!(pixels(&pixmap, colour, data) > 50, "{colour}");
    }
    // Half-open periods of a few seconds over a 900 s run stay visible.
    assert!(pixels(&pixmap, report::HALF_OPEN, data) > 20);
}

#[test]
fn a_short_half_open_period_stays_visible() {
    // The failover stack's primary is half-open for 0.3 s at 210.7 s.
    let replay = replayed("recovery-after-a-long-outage.toml");
    let t = &stack(replay, "failover").transitions;
    let shortest = t
        .windows(2)
        .filter(|w| w[0].to == "half-open" && w[0].upstream == w[1].upstream)
        .map(|w| w[1].t_s - w[0].t_s)
        .fold(f64::INFINITY, f64::min);
    assert!(shortest < 0.5, "{shortest}");
    // Alone, with the other half-open periods drawn over by open, it is
    // still drawn: a replay whose only half-open state is that one.
    let mut only = replay.clone();
    only.stacks.retain(|s| s.name == "failover");
    let run = &mut only.stacks[0];
    let keep = t
        .windows(2)
        .position(|w| w[0].to == "half-open" && w[1].t_s - w[0].t_s == shortest)
        .unwrap();
    run.transitions = t[keep..keep + 2].to_vec();
    let (svg, layout) = report::svg_with_layout(&only);
    let pixmap = render(&svg);
    assert!(pixels(&pixmap, report::HALF_OPEN, Some((0.0, layout.legend))) >= 10);
}

// === the figure, panel by panel ===

/// The figure rendered with its labels, in DejaVu Sans (`None`: the font is
/// not installed here).
fn render_with_text(svg: &str) -> Option<resvg::tiny_skia::Pixmap> {
    let mut options = resvg::usvg::Options::default();
    for face in ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf"] {
        let font = std::fs::read(Path::new("/usr/share/fonts/truetype/dejavu").join(face)).ok()?;
        options.fontdb_mut().load_font_data(font);
    }
    options.font_family = "DejaVu Sans".to_owned();
    let tree = resvg::usvg::Tree::from_str(svg, &options).unwrap();
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    Some(pixmap)
}

/// The figures `scenarios/README.md` shows, as PNGs under `docs/`.
const PNG_FIGURES: [&str; 2] = ["seed-000-night", "retry-overload-metastable"];

#[test]
#[ignore = "writes docs/replay-*.png: cargo test --release --test outage_replay -- --ignored the_figures_are_drawn_to_png"]
fn the_figures_are_drawn_to_png() {
    for name in PNG_FIGURES {
        let drawn = svg::svg(replayed(&format!("{name}.toml")));
        let pixmap = render_with_text(&drawn).expect("DejaVu Sans under /usr/share/fonts");
        let path = Path::new(ROOT).join(format!("docs/replay-{name}.png"));
        pixmap.save_png(&path).unwrap();
    }
}

#[test]
fn the_figure_has_one_panel_per_quantity() {
    let replay = replayed("seed-000-night.toml");
    let (drawn, layout) = svg::svg_with_layout(replay);
    let pixmap = render(&drawn);
    assert_eq!(pixmap.height() as f64, layout.height.round());
    let mut want: Vec<(Option<&str>, &str)> = vec![(None, "ground truth")];
    for s in &replay.stacks {
        for q in ["requests", "attempts", "answered wait"] {
            want.push((Some(s.name), q));
        }
        if !matches!(s.name, "no-breaker" | "naive-failover") {
            want.push((Some(s.name), "breaker state"));
        }
    }
    want.push((None, "cost"));
    let got: Vec<(Option<&str>, &str)> = layout
        .panels
        .iter()
        .map(|p| (p.stack.as_deref(), p.quantity))
        .collect();
    assert_eq!(got, want);
    // One below the other, none over another.
    for w in layout.panels.windows(2) {
        assert!(w[0].y0 < w[0].y1 && w[0].y1 <= w[1].y0, "{w:?}");
    }
    // The attempts panel counts every stack's attempts, the retry storm
    // and the breaker's few alike.
    for s in &replay.stacks {
        let attempts = s.attempt_log.iter().filter(|a| !a.probe).count();
        assert!(
            drawn.contains(&format!(": {attempts} attempts (")),
            "{}",
            s.name
        );
    }
    // Answers the fallback gave are drawn in its own colour.
    let (_, y0, y1) = layout
        .bars
        .iter()
        .find(|(n, _, _)| n == "failover")
        .unwrap();
    let fallback = svg::ANSWERED_BY[1];
    assert!(pixels(&pixmap, fallback, Some((*y0, *y1))) > 100);
    let (_, y0, y1) = layout.bars.iter().find(|(n, _, _)| n == "breaker").unwrap();
    assert_eq!(pixels(&pixmap, fallback, Some((*y0, *y1))), 0);
}

#[test]
fn no_two_labels_of_the_figure_overlap() {
    for name in [
        "seed-000-night",
        "retry-overload-metastable",
        "seed-002-failover",
    ] {
        let replay = replayed(&format!("{name}.toml"));
        let (drawn, layout) = svg::svg_with_layout(replay);
        // Every text drawn was measured.
        assert_eq!(
            drawn.matches("<text ").count(),
            layout.labels.len(),
            "{name}"
        );
        for (i, a) in layout.labels.iter().enumerate() {
            assert!(
                a.x0 >= 0.0 && a.x1 <= layout.width && a.y0 >= 0.0 && a.y1 <= layout.height,
                "{name}: {a:?} leaves the picture"
            );
            for b in &layout.labels[..i] {
                assert!(!a.overlaps(b), "{name}: {a:?} over {b:?}");
            }
        }
        // None of the ones a reader needs was left out for want of room.
        for s in &replay.stacks {
            let cost = format!("{} ${:.2}", s.name, s.all.cost_usd);
            assert!(
                layout.labels.iter().any(|l| l.text == cost),
                "{name}: {cost}"
            );
        }
        let marks = drawn.matches(r#"stroke-dasharray="4,3""#).count() - 1;
        let labelled = layout
            .labels
            .iter()
            .filter(|l| l.text.contains(" fails ") || l.text.contains(" heals "))
            .count();
        assert_eq!(labelled, marks, "{name}");
        // The estimate is no narrower than the text drawn in DejaVu Sans.
        let Some(_) = render_with_text(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"/>",
        ) else {
            continue;
        };
        let mut options = resvg::usvg::Options::default();
        for face in ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf"] {
            let font =
                std::fs::read(Path::new("/usr/share/fonts/truetype/dejavu").join(face)).unwrap();
            options.fontdb_mut().load_font_data(font);
        }
        let tree = resvg::usvg::Tree::from_str(&drawn, &options).unwrap();
        let mut texts = Vec::new();
        fn walk(group: &resvg::usvg::Group, out: &mut Vec<resvg::usvg::Rect>) {
            for node in group.children() {
                match node {
                    resvg::usvg::Node::Text(t) => out.push(t.abs_bounding_box()),
                    resvg::usvg::Node::Group(g) => walk(g, out),
                    _ => {}
                }
            }
        }
        walk(tree.root(), &mut texts);
        assert_eq!(texts.len(), layout.labels.len(), "{name}");
        for (drawn, est) in texts.iter().zip(&layout.labels) {
            assert!(
                f64::from(drawn.left()) >= est.x0 - 0.5 && f64::from(drawn.right()) <= est.x1 + 0.5,
                "{name}: {:?} is drawn {drawn:?}, estimated {est:?}",
                est.text
            );
        }
    }
}

#[test]
fn cost_labels_of_equal_costs_are_set_apart() {
    // Two stacks whose costs end at the same dollar: their labels would
    // fall on one line.
    let mut twice = replayed("seed-000-night.toml").clone();
    let mut copy = twice.stack("failover").unwrap().clone();
    copy.name = "failover-again";
    twice.stacks.push(copy);
    let (_, layout) = svg::svg_with_layout(&twice);
    let cost = |name: &str| {
        let s = twice.stack(name).unwrap();
        let text = format!("{name} ${:.2}", s.all.cost_usd);
        layout.labels.iter().find(|l| l.text == text).cloned()
    };
    let (a, b) = (cost("failover").unwrap(), cost("failover-again").unwrap());
    assert!(!a.overlaps(&b), "{a:?} {b:?}");
}

#[test]
fn wait_lines_break_where_no_request_was_answered() {
    let replay = replayed("seed-000-night.toml");
    let (drawn, layout) = svg::svg_with_layout(replay);
    let bins = layout
        .waits
        .iter()
        .flat_map(|w| w.runs.iter().flatten())
        .max()
        .unwrap()
        + 1;
    for line in &layout.waits {
        let s = stack(replay, &line.stack);
        let mut answered = std::collections::BTreeSet::new();
        for r in s
            .requests
            .iter()
            .filter(|r| r.fate == engine::Fate::Succeeded)
        {
            answered.insert(((r.arrival_s / layout.bin_s) as usize).min(bins - 1));
        }
        let drawn_bins: Vec<usize> = line.runs.iter().flatten().copied().collect();
        assert_eq!(
            drawn_bins,
            answered.iter().copied().collect::<Vec<_>>(),
            "{}",
            line.stack
        );
        for run in &line.runs {
            assert!(
                run.windows(2).all(|w| w[1] == w[0] + 1),
                "{}: {run:?}",
                line.stack
            );
        }
    }
    // Drawn as one polyline per run, no point further than a bin from the
    // one before it.
    let runs: usize = layout.waits.iter().map(|w| w.runs.len()).sum();
    let lines: Vec<&str> = drawn
        .split(r#"<polyline class="wait" points=""#)
        .skip(1)
        .collect();
    assert_eq!(lines.len(), runs);
    for line in lines {
        let xs: Vec<f64> = line
            .split('"')
            .next()
            .unwrap()
            .split(' ')
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            xs.windows(2).all(|w| w[1] - w[0] <= layout.bin_px + 0.2),
            "{xs:?}"
        );
    }
    // No breaker answers nobody from 120 s to 600 s: a gap, not a ramp.
    let p99 = layout
        .waits
        .iter()
        .find(|w| w.stack == "no-breaker" && w.p == 0.99)
        .unwrap();
    let gap = |b: usize| !p99.runs.iter().flatten().any(|&d| d == b);
    let mid = (360.0 / layout.bin_s) as usize;
    assert!(gap(mid), "{:?}", p99.runs);
    assert!(p99.runs.len() >= 2);
}

#[test]
fn attempts_refused_for_load_are_drawn_where_the_script_says_healthy() {
    let replay = replayed("retry-overload-metastable.toml");
    let (drawn, layout) = svg::svg_with_layout(replay);
    let s = stack(replay, "no-breaker");
    let upstream = &replay.setup.upstreams[0];
    let refused = s
        .attempt_log
        .iter()
        .filter(|a| svg::refused_by_load(upstream, replay.setup.answer_within(), a))
        .count();
    assert!(refused > 100, "{refused}");
    assert!(drawn.contains(&format!(
        "; {refused} refused for load while the script says"
    )));
    // Drawn in their own colour in the no-breaker stack's attempts.
    let panel = layout
        .panels
        .iter()
        .find(|p| p.stack.as_deref() == Some("no-breaker") && p.quantity == "attempts")
        .unwrap();
    let pixmap = render(&drawn);
    assert!(
        pixels(
            &pixmap,
            svg::REFUSED_BY_LOAD,
            Some((panel.y0 + 12.0, panel.y1))
        ) > 50
    );
}

const FIGURE: &str = "docs/outage-replay-seed-000-night.svg";

#[test]
fn the_readme_figure_is_what_the_replay_draws() {
    let drawn = report::svg(replayed("seed-000-night.toml"));
    let path = Path::new(ROOT).join(FIGURE);
    if std::env::var_os("UPDATE_FIGURES").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &drawn).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == drawn,
        "{FIGURE} is stale: run UPDATE_FIGURES=1 cargo test --release --test outage_replay"
    );
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    assert!(readme.contains(&format!("]({FIGURE})")));
}

// === the documents quote the replay ===

const COMMAND: &str = "$ cargo run --release --example outage_replay";

/// What the replay prints for the arguments of a documented command.
fn printed(args: &str) -> String {
    let mut json = false;
    let mut sweep = false;
    let mut seeds: Option<u32> = None;
    let mut file = "scenarios/seed-000-night.toml";
    let mut words = args.split_whitespace();
    while let Some(arg) = words.next() {
        match arg {
            "--" => {}
            "--json" => json = true,
            "--sweep" => sweep = true,
            "--seeds" => seeds = words.next().and_then(|n| n.parse().ok()),
            _ => file = arg,
        }
    }
    let name = file.strip_prefix("scenarios/").expect("a shipped scenario");
    if let (Some(n), false) = (seeds, sweep) {
        let s = over_seeds(name, n);
        return if json {
            seeds::json(s) + "\n"
        } else {
            seeds::table(s) + &routing_over_seeds(name, n) + &spend_over_seeds(name, n)
        };
    }
    if sweep {
        let s = swept(name);
        return if json {
            sweep::json(s) + "\n"
        } else {
            sweep::table(s)
        };
    }
    let replay = replayed(name);
    if json {
        report::json(replay) + "\n"
    } else {
        report::table(replay) + &engine::routing_table(std::slice::from_ref(replay))
    }
}

/// The numbers in a text: runs of digits, with their separators.
fn numbers(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .map(|t| t.trim_matches(|c| c == '.' || c == ','))
        .filter(|t| t.chars().any(|c| c.is_ascii_digit()))
        .collect()
}

/// Every block in `doc` that starts with a replay command must be lines
/// the command prints, in order; every number in the paragraph just before
/// it must be one of the block's.
fn check_document(name: &str) -> usize {
    let doc = std::fs::read_to_string(Path::new(ROOT).join(name)).unwrap();
    let lines: Vec<&str> = doc.lines().collect();
    let mut blocks = 0;
    for (i, line) in lines.iter().enumerate() {
        let Some(args) = line.strip_prefix(COMMAND) else {
            continue;
        };
        assert!(
            i > 0 && lines[i - 1].starts_with("```"),
            "{name}:{}: a command opens its block",
            i + 1
        );
        let end = i + lines[i..]
            .iter()
            .position(|l| l.starts_with("```"))
            .unwrap();
        let shown: String = lines[i + 1..end].iter().map(|l| format!("{l}\n")).collect();
        assert!(!shown.is_empty(), "{name}:{}: an empty block", i + 1);
        let output = format!("\n{}", printed(args));
        assert!(
            output.contains(&format!("\n{shown}")),
            "{name}:{}: the block is not what `{}` prints:\n{shown}\nit prints:{output}",
            i + 1,
            line.trim_start_matches("$ ")
        );
        let paragraph_start = lines[..i - 1]
            .iter()
            .rposition(|l| l.trim().is_empty())
            .map_or(0, |p| p + 1);
        let block_numbers = numbers(&shown);
        for n in numbers(&lines[paragraph_start..i - 1].join(" ")) {
            assert!(
                block_numbers.contains(&n) || args.contains(n),
                "{name}:{}: {n} is not a figure of the block below it",
                paragraph_start + 1
            );
        }
        blocks += 1;
    }
    blocks
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "many seeds: run in release, in its own step of .ci/run"
)]
fn the_documents_show_what_the_replay_prints() {
    assert!(check_document("README.md") >= 1);
    let blocks = check_document("scenarios/README.md");
    // One for each shipped scenario, at least.
    let shipped = std::fs::read_dir(Path::new(ROOT).join("scenarios"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "toml")
        })
        .count();
    assert!(blocks >= shipped, "{blocks} blocks for {shipped} scenarios");
}

#[test]
fn every_shipped_scenario_replays_consistently() {
    for entry in std::fs::read_dir(Path::new(ROOT).join("scenarios")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            let name = path.file_name().unwrap().to_str().unwrap();
            assert_consistent(replayed(name));
        }
    }
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
    assert_eq!(s.upstreams[0].cost, Cost::PerRequest { usd: 0.01 });
    assert_eq!(s.billing, Billing::default());
    assert_eq!(s.breaker.probe_timeout, None);
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

#[test]
fn cost_billing_and_probe_keys_are_checked_where_they_are() {
    let upstream = "name = \"only\"\n";
    let cost = |c: &str| GOOD.replace(upstream, &format!("{upstream}cost = {{ {c} }}\n"));
    let s = parse(&cost(
        "usd_per_mtok_in = 2, usd_per_mtok_out = 10, tokens_in = 1000, tokens_out = 500",
    ))
    .unwrap();
    let Cost::PerToken {
        input_usd,
        output_usd,
    } = s.upstreams[0].cost
    else {
        panic!("{:?}", s.upstreams[0].cost);
    };
    assert!(close(input_usd, 0.002) && close(output_usd, 0.005));
    let probes = "close_after = 1\n";
    let billing = "\n[billing]\nhang = 0.25\n";
    let s = parse(&format!("{GOOD}{billing}")).unwrap();
    assert_eq!(s.billing.hang, 0.25);
    let s = parse(&GOOD.replace(probes, &format!("{probes}probe_timeout_s = 4\n"))).unwrap();
    assert_eq!(s.breaker.probe_timeout, Some(Duration::from_secs(4)));
    let off = GOOD.replace(
        probes,
        &format!("{probes}probe_timeout_s = 0\nhealth_probe_interval_s = 0\n"),
    );
    assert_eq!(parse(&off).unwrap().breaker.probe_timeout, None);
    assert_eq!(parse(&off).unwrap().breaker.health_probe_interval, None);
    let on = GOOD.replace(probes, &format!("{probes}health_probe_interval_s = 5\n"));
    assert_eq!(
        parse(&on).unwrap().breaker.health_probe_interval,
        Some(Duration::from_secs(5))
    );

    for (text, key) in [
        (cost("usd_per_request = -1"), "usd_per_request"),
        (
            cost("usd_per_request = 1, tokens_in = 5"),
            "usd_per_request",
        ),
        (
            cost("usd_per_mtok_in = 2, usd_per_mtok_out = 10, tokens_in = 1000"),
            "tokens_out",
        ),
        (cost("usd_per_request = 1, colour = 2"), "colour"),
        (format!("{GOOD}\n[billing]\nhang = 1.5\n"), "hang"),
        (
            GOOD.replace(probes, &format!("{probes}probe_timeout_s = -3\n")),
            "probe_timeout_s",
        ),
        (
            GOOD.replace(probes, &format!("{probes}probe_timeout_s = 6\n")),
            "probe_timeout_s",
        ),
        (
            GOOD.replace(probes, &format!("{probes}health_probe_interval_s = -5\n")),
            "health_probe_interval_s",
        ),
        (
            format!(
                "{GOOD}\n[writeup]\ntitle = \"t\"\nstacks = [\"failover\"]\n[[writeup.row]]\n\
                 label = \"x\"\nfigure = \"requests\"\nreported = [\"1\"]\n"
            ),
            "failover",
        ),
        (
            format!(
                "{GOOD}\n[writeup]\ntitle = \"t\"\nstacks = [\"breaker\"]\n[[writeup.row]]\n\
                 label = \"x\"\nfigure = \"colour\"\nreported = [\"1\"]\n"
            ),
            "colour",
        ),
        (
            format!(
                "{GOOD}\n[writeup]\ntitle = \"t\"\nstacks = [\"breaker\"]\n[[writeup.row]]\n\
                 label = \"x\"\nfigure = \"requests\"\nreported = [\"1\", \"2\"]\n"
            ),
            "reported",
        ),
    ] {
        let e = error(&text);
        assert!(e.message.contains(key), "{key}: {e}");
        let line = e.line.unwrap_or_else(|| panic!("{key}: {e}"));
        let word = key.split_whitespace().next().unwrap();
        assert!(
            text.lines().nth(line - 1).unwrap().contains(word) || key == "tokens_out",
            "{key}: line {line}: {e}"
        );
    }
}

// === the incident shapes ===

fn classes<'a>(
    replay: &'a Replay,
    run: &'a StackRun,
) -> impl Iterator<Item = (&'a str, &'a Figures)> {
    replay
        .classes
        .iter()
        .map(String::as_str)
        .zip(run.by_class.iter().map(|c| &c.all))
}

#[test]
fn the_breaker_opens_in_the_brownout_before_anything_fails() {
    let replay = replayed("brownout-ramp.toml");
    assert_consistent(replay);
    // The ramp runs from 300 s; the first failures come at 900 s. Calls
    // with a fallback (failover's to its primary) are moved by the slow-call
    // rule; a bare breaker's, without one, are not refused for slowness.
    for run in breaker_stacks(replay) {
        let open = run.transitions.iter().find(|t| t.to == "open");
        if run.name == "breaker" {
            // Graded: it may never open at all.
            assert!(
                open.is_none_or(|o| o.t_s >= 900.0),
                "breaker: opened at {open:?}"
            );
            continue;
        }
        let open = open.unwrap();
        assert!(
            open.t_s > 300.0 && open.t_s < 900.0,
            "{}: opened at {}",
            run.name,
            open.t_s
        );
    }
    let slow = outage(replay, "naive-failover").answered_wait.unwrap();
    let failover = outage(replay, "failover").answered_wait.unwrap();
    assert!(failover.p99_s < slow.p99_s, "{failover:?} {slow:?}");
}

#[test]
fn only_the_broken_models_key_opens_in_the_regional_outage() {
    let replay = replayed("regional-outage-keyed.toml");
    assert_consistent(replay);
    let keyed = stack(replay, "breaker");
    assert!(keyed.transitions.iter().any(|t| t.to == "open"));
    for t in &keyed.transitions {
        assert_eq!(t.upstream, "gpt-eu", "{t:?}");
    }
    for (class, f) in classes(replay, keyed) {
        if class != "gpt-eu" {
            assert_eq!(f.rejected, 0, "{class}");
        }
    }
    // One breaker for every model rejects the healthy ones too.
    let global = stack(replay, "global-breaker");
    for (class, f) in classes(replay, global) {
        if class != "gpt-eu" {
            assert!(f.rejected > 0, "{class}");
        }
    }
}

#[test]
fn streams_that_break_mid_answer_trip_the_breaker() {
    let replay = replayed("sse-midstream-overload.toml");
    assert_consistent(replay);
    let plain = outage(replay, "no-breaker");
    let failover = outage(replay, "failover");
    // The broken streams are failures: failover's primary opens (the bare
    // breaker grades, and sheds nothing while most streams still answer).
    assert!(stack(replay, "failover").recovery[0]
        .time_to_trip_s
        .is_some());
    assert!(failover.user_error_rate.unwrap() * 2.0 < plain.user_error_rate.unwrap());
    assert!(failover.wasted_cost_usd * 2.0 < plain.wasted_cost_usd);
}

#[test]
fn retries_under_a_capacity_feed_the_storm_without_a_breaker_and_not_with_one() {
    // The slow-call rule for every call (the in-flight limit off): a bare
    // breaker's calls have no fallback, and by default slowness alone moves
    // nothing for them; here the rule is the point.
    let shipped = replayed("429-storm-capacity.toml");
    assert_consistent(shipped);
    let mut scenario = load("429-storm-capacity.toml");
    scenario.breaker.no_in_flight_limit = true;
    let with_retries = &engine::replay(&scenario).unwrap();
    assert_consistent(with_retries);
    assert!(scenario.client.max_retries > 0 && scenario.upstreams[0].capacity.is_some());
    scenario.client.max_retries = 0;
    let without = engine::replay(&scenario).unwrap();
    // By default the bare breaker answers nearly what no breaker answers
    // (its in-flight limit sheds what the queue turns away anyway) with
    // fewer attempts.
    let (bare, none) = (
        &stack(shipped, "breaker").all,
        &stack(shipped, "no-breaker").all,
    );
    assert!(
        bare.succeeded as f64 >= 0.95 * none.succeeded as f64,
        "{} vs {}",
        bare.succeeded,
        none.succeeded
    );
    assert!(bare.attempts[0].1 < none.attempts[0].1);
    let growth = |name: &str| {
        let (a, b) = (&stack(with_retries, name).all, &stack(&without, name).all);
        let p99 = |f: &Figures| f.answered_wait.unwrap().p99_s;
        (
            a.attempts[0].1 as f64 / b.attempts[0].1 as f64,
            p99(a) / p99(b),
        )
    };
    let (load, p99) = growth("no-breaker");
    assert!(
        load > 1.5 && p99 > 1.25,
        "no-breaker: load ×{load}, p99 ×{p99}"
    );
    let (load, p99_with) = growth("breaker");
    assert!(
        load < 1.1 && p99_with < p99,
        "breaker: load ×{load}, p99 ×{p99_with}"
    );
    // The queue really was full: 429s reached the users.
    assert!(stack(with_retries, "no-breaker").all.rate_limited > 0);
}

#[test]
fn the_volume_guard_stops_the_runaway_loop_and_spares_the_users() {
    let replay = replayed("runaway-retry-loop.toml");
    assert_consistent(replay);
    let script = |run: &StackRun| {
        classes(replay, run)
            .find(|(c, _)| c.ends_with("nightly-script"))
            .unwrap()
            .1
            .clone()
    };
    let users = |run: &StackRun| {
        classes(replay, run)
            .find(|(c, _)| c.ends_with("users"))
            .unwrap()
            .1
            .clone()
    };
    let guarded = stack(replay, "breaker");
    let scenario = &replay.setup;
    let (limit, period) = scenario.breaker.volume_guard.unwrap();
    let periods = (scenario.duration.as_secs_f64() / period.as_secs_f64()).ceil();
    // The script's calls, at most the limit per period (each key counts its own).
    assert_eq!(script(stack(replay, "no-breaker")).attempts[0].1, 6000);
    assert!(script(guarded).attempts[0].1 as f64 <= f64::from(limit) * periods);
    assert!(script(guarded).rejected > 0);
    assert_eq!(users(guarded).rejected, 0);
    // A guard on one breaker for everyone stops the users too.
    assert!(users(stack(replay, "global-breaker")).rejected > 0);
}

#[test]
fn replicas_are_replayed_as_bounds() {
    let replay = replayed("replicas-shared-breaker.toml");
    assert_consistent(replay);
    assert_eq!(replay.setup.replicas, 8);
    for (shared, independent) in [
        ("breaker", "breaker-independent"),
        ("failover", "failover-independent"),
    ] {
        let (s, i) = (stack(replay, shared), stack(replay, independent));
        // Each replica's breaker trips on its own failures: eight circuits
        // open where one does.
        let opens = |run: &StackRun| {
            let mut labels: Vec<&str> = run
                .transitions
                .iter()
                .filter(|t| t.to == "open")
                .map(|t| t.upstream.as_str())
                .collect();
            labels.sort();
            labels.dedup();
            labels.len()
        };
        assert_eq!((opens(s), opens(i)), (1, 8), "{shared}");
        let primary = |run: &StackRun| run.outage.as_ref().unwrap().attempts[0].1;
        assert!(primary(i) > primary(s), "{independent}");
    }
}

/// A shipped scenario over `n` seeds, run once for all the tests that
/// read it.
/// What the replay prints after the seeds' table for a scenario with
/// `[spend]` (nothing for the others).
fn spend_over_seeds(name: &str, n: u32) -> String {
    let s = load(name);
    if s.spend.is_none() {
        return String::new();
    }
    let replays = seeds::replay_seeds(&s, &s.stacks(), &seeds::sequence(s.seed, n)).unwrap();
    budget::by_traffic(&replays)
}

fn over_seeds(name: &str, n: u32) -> &'static seeds::Seeds {
    static RUNS: OnceLock<Mutex<HashMap<(String, u32), &'static seeds::Seeds>>> = OnceLock::new();
    let mut runs = RUNS.get_or_init(Default::default).lock().unwrap();
    (runs.entry((name.to_owned(), n)).or_insert_with(|| {
        let s = load(name);
        let replays = seeds::replay_seeds(&s, &s.stacks(), &seeds::sequence(s.seed, n)).unwrap();
        routing_tables()
            .lock()
            .unwrap()
            .insert((name.to_owned(), n), engine::routing_table(&replays));
        Box::leak(Box::new(seeds::summarize(&replays)))
    })) as _
}

/// The `[failover]` sections of the multi-seed runs, by scenario and count.
fn routing_tables() -> &'static Mutex<HashMap<(String, u32), String>> {
    static TABLES: OnceLock<Mutex<HashMap<(String, u32), String>>> = OnceLock::new();
    TABLES.get_or_init(Default::default)
}

/// What a multi-seed run prints after its table: the `[failover]` section.
fn routing_over_seeds(name: &str, n: u32) -> String {
    over_seeds(name, n);
    routing_tables().lock().unwrap()[&(name.to_owned(), n)].clone()
}

/// The multi-seed figures the documents quote, checked in their own step
/// of `.ci/run` (in release): over 11 seeds every stack answers within the
/// deadline what its windows add up to, and failover re-closes in most.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "many seeds: run in release, in its own step of .ci/run"
)]
fn over_eleven_seeds_the_documented_scenarios_hold() {
    for name in ["seed-000-night.toml", "seed-002-failover.toml"] {
        let s = over_seeds(name, 11);
        assert_eq!(s.seeds.len(), 11);
        for st in &s.stacks {
            let (closed, of) = st.closed_at_end;
            assert!(closed <= of && of <= 11, "{name} {}", st.name);
            for (_, _, spread) in &st.figures {
                if let Some(x) = spread {
                    assert!(x.min <= x.median && x.median <= x.max, "{name} {}", st.name);
                }
            }
        }
        let failover = s.stacks.iter().find(|x| x.name == "failover").unwrap();
        let errors = failover.figures[0].2.unwrap();
        assert!(
            errors.max <= 0.01,
            "{name}: failover answers nearly every user"
        );
    }
}

/// The median of `xs` (of an even count, the mean of the middle two).
fn median_of(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    (xs[(n - 1) / 2] + xs[n / 2]) / 2.0
}

/// The dead-upstream targets with health probes every 5 s, over 11 seeds,
/// for the breaker alone, in every shipped scenario with an upstream dead
/// by its ground truth (at least 90 % of its outage's attempts fail): the
/// median recovery lag within the median bound (the interval, twice the p99
/// time to a verdict on the healed upstream, 1 s); after the heal at least
/// `min(95 %, 1 − bound ÷ the time after the heal)` of no breaker's
/// answers; closed at the end in every seed; and the outage's waste within
/// 5 % of no breaker's, or the probes' own cost and the failed attempts the
/// trip rule needs, where that is more.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "many seeds: run in release, in its own step of .ci/run"
)]
fn over_eleven_seeds_health_probes_meet_the_dead_upstream_targets() {
    let interval = Duration::from_secs(5);
    let mut checked = Vec::new();
    let dir = Path::new(ROOT).join("scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    for name in names {
        let mut scenario = load(&name);
        let within = scenario.answer_within();
        let timeout = scenario.client.attempt_timeout;
        let dead: Vec<usize> = (0..scenario.upstreams.len())
            .filter(|&i| {
                scenario.upstreams[i]
                    .failing_share(within, timeout)
                    .is_some_and(|f| f >= 0.9)
            })
            .collect();
        if dead.is_empty() {
            continue;
        }
        scenario.breaker.health_probe_interval = Some(interval);
        for u in &mut scenario.upstreams {
            if let Some(b) = &mut u.breaker {
                b.health_probe_interval = Some(interval);
            }
        }
        let kinds = [StackKind::NoBreaker, StackKind::Breaker];
        let replays =
            seeds::replay_seeds(&scenario, &kinds, &seeds::sequence(scenario.seed, 11)).unwrap();
        let rule = {
            let b = &scenario.breaker;
            let by_rate = (!matches!(b.window, scenario::WindowConfig::Off)).then_some(b.min_calls);
            by_rate
                .into_iter()
                .chain(b.consecutive_failures)
                .min()
                .unwrap_or(1) as usize
        };
        for &u in &dead {
            let upstream = scenario.upstreams[u].name.clone();
            let (mut lags, mut bounds, mut after, mut wasted, mut nb_wasted, mut allowed) =
                (vec![], vec![], vec![], vec![], vec![], vec![]);
            let mut heal = 0.0;
            for replay in &replays {
                let (nb, run) = (&replay.stacks[0], &replay.stacks[1]);
                assert_eq!((nb.name, run.name), ("no-breaker", "breaker"));
                // An upstream only failover reaches (a dead fallback).
                let Some(r) = run.recovery.iter().find(|r| r.upstream == upstream) else {
                    break;
                };
                heal = r.healed_at_s.expect("a dead upstream that heals");
                let lag = r.recovery_lag_s.unwrap_or_else(|| {
                    panic!(
                        "{name} {upstream} seed {}: not closed at the end",
                        replay.seed
                    )
                });
                lags.push(lag);
                bounds.push(r.lag_bound_s.expect("a bound, with health probes"));
                let (a, n) = (
                    run.after_heal.as_ref().unwrap(),
                    nb.after_heal.as_ref().unwrap(),
                );
                after.push(a.answered as f64 / n.answered.max(1) as f64);
                let outage = run.outage.as_ref().unwrap();
                wasted.push(outage.wasted_cost_usd);
                nb_wasted.push(nb.outage.as_ref().unwrap().wasted_cost_usd);
                let failing_from = scenario.upstreams[u]
                    .failing_from(within)
                    .unwrap()
                    .as_secs_f64();
                let probes: f64 = run
                    .attempt_log
                    .iter()
                    .filter(|a| a.probe && a.t_s >= outage.from_s && a.t_s < outage.to_s)
                    .map(|a| a.cost_usd)
                    .sum();
                let trip: f64 = run
                    .attempt_log
                    .iter()
                    .filter(|a| a.upstream == u && !a.probe && a.failed && a.t_s >= failing_from)
                    .take(rule)
                    .map(|a| a.cost_usd)
                    .sum();
                allowed.push(probes + trip);
            }
            if lags.is_empty() {
                continue;
            }
            let (lag, bound) = (median_of(lags), median_of(bounds));
            let after_target = 0.95f64.min(1.0 - bound / (scenario.duration.as_secs_f64() - heal));
            let after = median_of(after);
            let (wasted, nb_wasted, allowed) =
                (median_of(wasted), median_of(nb_wasted), median_of(allowed));
            println!(
                "{name} {upstream}: lag {lag:.2} s (bound {bound:.2} s), after the heal \
                 {after:.3} (target {after_target:.3}), outage waste ${wasted:.2} (no breaker \
                 ${nb_wasted:.2}, probes and trip ${allowed:.2})"
            );
            assert!(
                lag <= bound,
                "{name} {upstream}: lag {lag} s > bound {bound} s"
            );
            assert!(
                after >= after_target,
                "{name} {upstream}: {after} of no breaker's answers after the heal"
            );
            if nb_wasted > 0.0 {
                assert!(
                    wasted <= (0.05 * nb_wasted).max(allowed) + 1e-9,
                    "{name} {upstream}: wasted ${wasted} (no breaker ${nb_wasted}, \
                     allowance ${allowed})"
                );
            }
            checked.push(name.clone());
        }
    }
    assert!(checked.len() >= 7, "dead scenarios checked: {checked:?}");
}

// === the sweep ===

/// A shipped scenario's sweep over its grid, run once.
fn swept(name: &str) -> &'static sweep::Sweep {
    static RUNS: OnceLock<Mutex<HashMap<String, &'static sweep::Sweep>>> = OnceLock::new();
    let mut runs = RUNS.get_or_init(Default::default).lock().unwrap();

    (runs.entry(name.to_owned()).or_insert_with(|| {
        let path = Path::new(ROOT).join("scenarios").join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let file = path.display().to_string();
        let grid = sweep::grid(&scenario::parse(&text, &file).unwrap(), Vec::new());
        let seeds = seeds::sequence(1, seeds::DEFAULT_SEEDS);
        let order = sweep::Objective::parse(None).unwrap();
        Box::leak(Box::new(
            sweep::run(&text, &file, &grid, &seeds, &order).unwrap(),
        ))
    })) as _
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "many seeds: run in release, in its own step of .ci/run"
)]
fn the_sweep_ranks_on_its_objective_and_recommends_the_first_that_recloses() {
    let doc: serde_json::Value =
        serde_json::from_str(&printed("--sweep --json scenarios/seed-000-night.toml")).unwrap();
    let ranked = doc["ranked"].as_array().unwrap();
    let grid: usize = sweep::DEFAULT_GRID.iter().map(|(_, v)| v.len()).product();
    // Every stack with a breaker, at every combination.
    assert_eq!(doc["stacks"], serde_json::json!(["breaker", "failover"]));
    assert_eq!(ranked.len(), 2 * grid);
    assert_eq!(doc["seeds"].as_array().unwrap().len(), 11);
    let med = |v: &serde_json::Value| v["median"].as_f64();
    // The objective, recomputed from the printed medians.
    let key = |r: &serde_json::Value| {
        let at = |v: Option<f64>, step: f64| v.map_or(f64::INFINITY, |x| (x / step).round());
        let closed = &r["closed_at_end"];
        let lag = if closed["seeds"] == closed["of"] {
            at(med(&r["recovery_lag_s"]).or(Some(0.0)), 1.0)
        } else {
            f64::INFINITY
        };
        [
            -med(&r["answered"]).unwrap(),
            at(med(&r["user_error_rate"]), 0.001),
            at(med(&r["answered_wait_p99_s"]), 0.1),
            lag,
            at(med(&r["wasted_cost_usd"]), 0.01),
        ]
    };
    for (i, pair) in ranked.windows(2).enumerate() {
        assert_eq!(pair[0]["rank"], i + 1);
        let (a, b) = (key(&pair[0]), key(&pair[1]));
        assert!(
            a.partial_cmp(&b).unwrap().is_le(),
            "rank {} before {}: {a:?} {b:?}",
            i + 1,
            i + 2
        );
    }
    // The recommendation: the first row whose breakers re-closed after the
    // heal in every seed.
    let best = &doc["recommended"];
    let first = ranked
        .iter()
        .find(|r| r["closed_at_end"]["seeds"] == r["closed_at_end"]["of"])
        .unwrap();
    assert_eq!(best["rank"], first["rank"]);
    assert_eq!(best["settings"], first["settings"]);
    assert_eq!(best["closed_at_end"]["seeds"], 11);
    // It answers at least as many as the old pick (the failover stack,
    // failure rate 0.25, 10 s open, no health probes), which never
    // re-closes in some seeds.
    let old = ranked
        .iter()
        .find(|r| {
            r["stack"] == "failover"
                && r["settings"]
                    == serde_json::json!({"failure_rate": 0.25, "open_s": 10, "health_probe_interval_s": 0})
        })
        .unwrap();
    assert!(med(&best["answered"]) >= med(&old["answered"]));
    assert!(old["closed_at_end"]["seeds"].as_u64() < Some(11));
    // The Pareto marks: no row dominates a marked one; every unmarked one
    // is dominated.
    let rows = &swept("seed-000-night.toml").rows;
    for r in rows {
        let dominated = rows
            .iter()
            .any(|o| sweep::dominates(&o.objectives(), &r.objectives()));
        assert_eq!(r.pareto, !dominated);
    }
    let table = printed("--sweep scenarios/seed-000-night.toml");
    assert!(table.contains("recommended: "), "{table}");
    assert_eq!(
        table.lines().filter(|l| l.contains('*')).count() - 1,
        ranked.iter().filter(|r| r["pareto"] == true).count()
    );
}

#[test]
fn the_objective_can_be_reordered() {
    let o = sweep::Objective::parse(Some("wasted,lag")).unwrap();
    assert_eq!(
        o.0,
        [
            sweep::Criterion::Wasted,
            sweep::Criterion::Lag,
            sweep::Criterion::Answered,
            sweep::Criterion::Errors,
            sweep::Criterion::P99
        ]
    );
    assert!(sweep::Objective::parse(Some("speed")).is_err());
    assert!(sweep::Objective::parse(Some("lag,lag")).is_err());
    let text =
        std::fs::read_to_string(Path::new(ROOT).join("scenarios/seed-000-night.toml")).unwrap();
    let grid = scenario::parse_grid(&["health_probe_interval_s=0,5".to_owned()]).unwrap();
    let s = sweep::run(&text, "night.toml", &grid, &[1, 2, 3], &o).unwrap();
    // Wasted cost first: the rows without health probes (cheaper) lead.
    let first = &s.rows[0];
    assert_eq!(first.settings[0].1, "0", "{:?}", first.settings);
    for pair in s.rows.windows(2) {
        assert!(pair[0].rank_key(&o) <= pair[1].rank_key(&o));
    }
}

#[test]
fn a_sweep_value_the_format_rejects_is_skipped_with_why() {
    let text =
        std::fs::read_to_string(Path::new(ROOT).join("scenarios/seed-000-night.toml")).unwrap();
    let grid = scenario::parse_grid(&["close_after=2,4".to_owned()]).unwrap();
    let order = sweep::Objective::parse(None).unwrap();
    let s = sweep::run(&text, "night.toml", &grid, &[1], &order).unwrap();
    assert_eq!(s.rows.len(), 2, "one combination, two stacks");
    assert!(s.skipped[0].1.contains("close_after"), "{:?}", s.skipped);
    assert!(scenario::parse_grid(&["colour=1,2".to_owned()]).is_err());
    assert!(scenario::parse_grid(&["open_s=\"x\"".to_owned()]).is_err());
}

// === bad files, property-tested ===

/// A scenario with every kind of table and key of the format, one value a
/// line.
const RICH: &str = r#"name = "rich"
seed = 3
duration_s = 60
rate_per_s = 2
poisson = true
replicas = 2
traffic = [ { p = 0.5, model = "a" }, { p = 0.5, model = "b", api_key = "k" } ]

[[rate]]
from_s = 20
per_s = 4

[[burst]]
at_s = 10
requests = 20
over_s = 5
model = "b"

[client]
attempt_timeout_s = 5
total_timeout_s = 0
max_retries = 1
backoff_base_ms = 100
backoff_max_ms = 1000
cancel_p = 0.1
cancel_after_s = 3

[breaker]
keyed_by = "model"
window = 10
min_calls = 5
failure_rate = 0.5
consecutive_failures = 0
slow_call_ms = 2000
slow_call_rate = 0.5
open_s = 5
open_max_s = 20
probes = 2
close_after = 1
probe_timeout_s = 2
health_probe_interval_s = 2
volume_limit = 100
volume_period_s = 30

[sweep]
open_s = [5, 10]

[[upstream]]
name = "a"
capacity = { concurrent = 4, queue = 8, retry_after_s = 1 }
  [upstream.breaker]
  open_s = 3
  [[upstream.phase]]
  from_s = 0
  responses = [ { p = 0.5, kind = "ok", latency_ms = 100, latency_sigma = 0.5 }, { p = 0.5, kind = "status", code = 503, latency_ms = 50 } ]
  [[upstream.phase]]
  from_s = 30
  responses = [ { p = 1.0, kind = "ok", latency_ms = 100, latency_to_ms = 900, stream_ms = 200 } ]

[[upstream]]
name = "b"
  [[upstream.phase]]
  from_s = 0
  responses = [ { p = 0.7, kind = "ok", latency_ms = 100 }, { p = 0.3, kind = "hang" } ]
"#;

#[test]
fn the_rich_scenario_parses_and_replays() {
    let s = parse(RICH).unwrap();
    assert_eq!(s.traffic.len(), 2);
    assert_eq!(s.breaker_for(0).open, Duration::from_secs(3));
    assert_eq!(s.breaker_for(1).open, Duration::from_secs(5));
    let replay = engine::replay(&s).unwrap();
    assert_consistent(&replay);
    assert_eq!(
        replay.stacks.iter().map(|s| s.name).collect::<Vec<_>>(),
        [
            "no-breaker",
            "breaker",
            "global-breaker",
            "breaker-independent"
        ]
    );
}

/// Lines of `text` that hold `key = value` outside any array of tables'
/// inline tables, with the key.
fn key_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let (k, _) = l.split_once(" = ")?;
            let k = k.trim();
            (!k.contains(['{', '[', ' '])).then(|| (i, k.to_owned()))
        })
        .collect()
}

fn check_error(text: &str, line: usize, key: &str) {
    let e = match parse(text) {
        Ok(_) => panic!("accepted with `{key}` on line {line}:\n{text}"),
        Err(e) => e,
    };
    assert_eq!(e.file, "test.toml");
    assert_eq!(e.line, Some(line), "`{key}`: {e}");
    assert!(
        e.to_string().starts_with(&format!("test.toml:{line}:")),
        "{e}"
    );
    let shown = text.lines().nth(line - 1).unwrap();
    assert!(
        e.message.contains(key) || shown.contains(key),
        "`{key}`: {e}"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    #[test]
    fn an_unknown_key_is_an_error_at_its_line(at in 0usize..1000, name in "[a-z]{3,8}_[a-z]{2,5}") {
        let lines = key_lines(RICH);
        let (i, _) = &lines[at % lines.len()];
        let mut edited: Vec<&str> = RICH.lines().collect();
        let added = format!("{name} = 1");
        edited.insert(i + 1, &added);
        check_error(&(edited.join("\n") + "\n"), i + 2, &name);
    }

    #[test]
    fn a_wrong_type_is_an_error_at_its_line(at in 0usize..1000, value in proptest::prop_oneof![
        proptest::prelude::Just("\"text\"".to_owned()),
        proptest::prelude::Just("[1, 2]".to_owned()),
        proptest::prelude::Just("{ x = 1 }".to_owned()),
    ]) {
        let lines = key_lines(RICH);
        let (i, key) = &lines[at % lines.len()];
        let shown = RICH.lines().nth(*i).unwrap();
        // `name`, `keyed_by` and text keys take a string; `[sweep]` takes arrays.
        proptest::prop_assume!(!(shown.contains('"') && value.starts_with('"')));
        proptest::prop_assume!(!(key == "open_s" && *i == RICH.lines().position(|l| l == "open_s = [5, 10]").unwrap()));
        let edited: Vec<String> = RICH
            .lines()
            .enumerate()
            .map(|(j, l)| if j == *i { format!("{key} = {value}") } else { l.to_owned() })
            .collect();
        check_error(&(edited.join("\n") + "\n"), i + 1, key);
    }

    #[test]
    fn a_negative_time_is_an_error_at_its_line(at in 0usize..1000, x in 0.001f64..1e6) {
        let lines: Vec<(usize, String)> = key_lines(RICH)
            .into_iter()
            .filter(|(_, k)| k.ends_with("_s") || k.ends_with("_ms"))
            .collect();
        let (i, key) = &lines[at % lines.len()];
        let edited: Vec<String> = RICH
            .lines()
            .enumerate()
            .map(|(j, l)| if j == *i { format!("{key} = -{x}") } else { l.to_owned() })
            .collect();
        check_error(&(edited.join("\n") + "\n"), i + 1, key);
    }

    #[test]
    fn shares_that_do_not_add_up_to_one_are_an_error_at_their_line(
        at in 0usize..1000,
        by in proptest::prop_oneof![-0.4f64..-0.01, 0.01f64..0.4],
    ) {
        // Every `p = ` in the text: of a response or of the traffic.
        let spots: Vec<(usize, usize)> = RICH
            .lines()
            .enumerate()
            .flat_map(|(i, l)| l.match_indices(" p = ").map(move |(at, _)| (i, at + 1)))
            .collect();
        let (i, col) = spots[at % spots.len()];
        let line = RICH.lines().nth(i).unwrap();
        let rest = &line[col + 4..];
        let end = rest.find([',', ' ']).unwrap();
        let p: f64 = rest[..end].parse().unwrap();
        let q = (p + by).clamp(0.0, 1.0);
        proptest::prop_assume!((q - p).abs() > 1e-6);
        let edited_line = format!("{}p = {q}{}", &line[..col], &rest[end..]);
        let edited: Vec<&str> = RICH
            .lines()
            .enumerate()
            .map(|(j, l)| if j == i { edited_line.as_str() } else { l })
            .collect();
        let key = if line.starts_with("traffic") { "traffic" } else { "responses" };
        check_error(&(edited.join("\n") + "\n"), i + 1, key);
    }
}

// === stream deadlines and the retry budget ===

/// Upstream `i`'s slowest good answer, to its end: the 99th-percentile head
/// plus the stream.
fn slowest_answer(scenario: &scenario::Scenario, i: usize) -> Duration {
    scenario.upstreams[i]
        .phases
        .iter()
        .flat_map(|p| &p.responses)
        .filter_map(|r| match r.kind {
            Kind::Ok { stream, .. } => Some(r.slowest().unwrap() + stream),
            _ => None,
        })
        .max()
        .expect("the fallback answers")
}

#[test]
fn streams_that_stall_for_minutes_open_the_breaker_with_a_stall_deadline() {
    let scenario = load("stalled-streams.toml");
    let stall = scenario.client.stall_timeout.expect("a stall deadline");
    let replay = replayed("stalled-streams.toml");
    assert_consistent(replay);
    let bound = stall.as_secs_f64() + slowest_answer(&scenario, 1).as_secs_f64() + 2.5;
    let failover = outage(replay, "failover");
    let p99 = failover.answered_wait.unwrap().p99_s;
    assert!(
        p99 <= bound,
        "failover's answered p99 {p99} s over {bound} s"
    );
    // The stalls are failures: failover's primary opens, and the bare
    // breaker's rule fires (it grades, shedding calls, or opens).
    assert!(
        stack(replay, "failover").recovery[0]
            .time_to_trip_s
            .is_some(),
        "failover: the primary's breaker never opened"
    );
    assert!(
        stack(replay, "breaker").all.rejected > 0,
        "breaker: the primary's rule never fired"
    );
    // No stalled stream holds its user until they give up.
    for run in &replay.stacks {
        assert_eq!(run.all.cancelled, 0, "{}", run.name);
    }
    let plain = outage(replay, "no-breaker");
    assert!(failover.user_error_rate.unwrap() * 5.0 < plain.user_error_rate.unwrap());

    // Without the deadlines a stalled stream is never a failure: no breaker
    // opens, and users wait until they give up.
    let mut without = scenario.clone();
    without.client.stall_timeout = None;
    without.client.ttft_timeout = None;
    let without = engine::replay(&without).unwrap();
    assert_consistent(&without);
    for name in ["breaker", "failover"] {
        assert!(stack(&without, name).recovery[0].time_to_trip_s.is_none());
        assert_eq!(stack(&without, name).all.rejected, 0, "{name}");
    }
    let stalled = outage(&without, "failover");
    assert!(stalled.cancelled > 0);
    assert!(stalled.user_error_rate.unwrap() > failover.user_error_rate.unwrap() * 5.0);
    let (patience_s, waited_s) = (
        scenario.client.cancel.unwrap().1.as_secs_f64(),
        stalled.wait.unwrap().p99_s,
    );
    assert!(close(waited_s, patience_s), "{waited_s}");
}

#[test]
fn a_retry_budget_caps_the_amplification_of_a_503_storm() {
    let scenario = load("503-storm-retry-budget.toml");
    assert_eq!(scenario.client.retry_budget_percent, Some(20.0));
    assert_eq!(scenario.client.max_retries, 3);
    let replay = replayed("503-storm-retry-budget.toml");
    assert_consistent(replay);
    for run in &replay.stacks {
        let amplification = run.outage.as_ref().unwrap().amplification.unwrap();
        assert!(amplification <= 1.25, "{}: {amplification}", run.name);
    }
    let mut without = scenario.clone();
    without.client.retry_budget_percent = None;
    let without = engine::replay(&without).unwrap();
    let amplification = outage(&without, "no-breaker").amplification.unwrap();
    assert!(
        (1.5..1.9).contains(&amplification),
        "without a budget: {amplification}"
    );
}

#[test]
fn the_stall_kind_and_the_client_deadline_keys_are_checked_where_they_are() {
    let stall = GOOD.replace(
        "{ p = 0.5, kind = \"ok\", latency_ms = 100 }",
        "{ p = 0.5, kind = \"stall\", latency_ms = 100, stall_after_ms = 300 }",
    );
    // A stalled stream never ends without a stall deadline or impatient users.
    check_error(&stall, line_of(&stall, "\"stall\""), "stall_timeout_s");
    let with = |keys: &str| {
        stall.replace(
            "backoff_max_ms = 1000",
            &format!("backoff_max_ms = 1000\n{keys}"),
        )
    };
    let s = parse(&with(
        "stall_timeout_s = 2\nttft_timeout_s = 1.5\nretry_budget_percent = 20",
    ))
    .unwrap();
    assert_eq!(s.client.stall_timeout, Some(Duration::from_secs(2)));
    assert_eq!(s.client.ttft_timeout, Some(Duration::from_millis(1500)));
    assert_eq!(s.client.retry_budget_percent, Some(20.0));
    assert_eq!(
        s.upstreams[0].phases[0].responses[0].kind,
        Kind::Stall {
            latency: Duration::from_millis(100),
            stall_after: Duration::from_millis(300)
        }
    );
    assert_consistent(&engine::replay(&s).unwrap());
    assert!(parse(&with("cancel_p = 1.0\ncancel_after_s = 5")).is_ok());
    assert!(parse(&with("cancel_p = 0.5\ncancel_after_s = 5")).is_err());
    let base = with("stall_timeout_s = 2");
    for (keys, key) in [
        ("ttft_timeout_s = 0", "ttft_timeout_s"),
        ("ttft_timeout_s = -1", "ttft_timeout_s"),
        ("retry_budget_percent = -5", "retry_budget_percent"),
        ("retry_budget_percent = 1001", "retry_budget_percent"),
    ] {
        let text = base.replace(
            "stall_timeout_s = 2",
            &format!("stall_timeout_s = 2\n{keys}"),
        );
        check_error(&text, line_of(&text, keys), key);
    }
    let text = base
        .replace("total_timeout_s = 0", "total_timeout_s = 5")
        .replace("stall_timeout_s = 2", "stall_timeout_s = 6");
    check_error(&text, line_of(&text, "stall_timeout_s"), "stall_timeout_s");
    let text = base.replace(
        "stall_after_ms = 300",
        "stall_after_ms = 300, stream_ms = 9",
    );
    check_error(&text, line_of(&text, "stream_ms"), "stream_ms");
    let text = base.replace(", stall_after_ms = 300", "");
    check_error(&text, line_of(&text, "\"stall\""), "stall_after_ms");
    let text = base.replace(
        "kind = \"status\", code = 503",
        "kind = \"status\", stall_after_ms = 1, code = 503",
    );
    check_error(
        &text,
        line_of(&text, "stall_after_ms = 1,"),
        "stall_after_ms",
    );
}

#[test]
fn a_stalled_stream_bills_what_it_generated_until_the_stall() {
    let billing = Billing::default();
    let ms = Duration::from_millis;
    let stall = Kind::Stall {
        latency: ms(700),
        stall_after: ms(1500),
    };
    assert!(stall.is_failure());
    assert_eq!(billing.generated(stall, ms(700)), billing.stall);
    assert_eq!(
        billing.generated(stall, ms(300)),
        0.0,
        "given up before its head"
    );
    let silent = Kind::Stall {
        latency: ms(700),
        stall_after: ms(0),
    };
    assert_eq!(
        billing.generated(silent, ms(700)),
        0.0,
        "no token was generated"
    );
    let text = GOOD.replace("[breaker]", "[billing]\nstall = 2.0\n\n[breaker]");
    check_error(&text, line_of(&text, "stall = 2.0"), "stall");
}

// === the shapes the next changes are judged on ===

/// Retries keep the upstream overloaded after the slowdown that caused it:
/// without a breaker, at least half the users get an error over the run,
/// and most of those who arrive after the heal do too.
#[test]
fn retries_keep_an_overloaded_upstream_overloaded_after_its_cause() {
    let replay = replayed("retry-overload-metastable.toml");
    assert_consistent(replay);
    assert!(replay.setup.upstreams[0]
        .capacity
        .is_some_and(|c| c.queue > 0));
    let plain = stack(replay, "no-breaker");
    assert!(plain.all.user_error_rate.unwrap() >= 0.5, "{:?}", plain.all);
    let after = plain.after_heal.as_ref().unwrap();
    assert_eq!(after.from_s, 180.0);
    assert!(after.user_error_rate.unwrap() >= 0.5, "{after:?}");
    // Every phase answers well within the attempt timeout: the failures
    // are the load's, not the upstream's answers.
    for phase in &replay.setup.upstreams[0].phases {
        assert!(phase.responses.iter().all(|r| !r.kind.is_failure()));
    }
}

/// The failing model of the keyed mix fails at most half of its attempts by
/// construction, some answering fine, some hanging, some 503; the others
/// never fail; the replay's attempts agree.
#[test]
fn the_partial_outage_fails_at_most_half_of_one_models_attempts() {
    let replay = replayed("partial-outage-keyed.toml");
    assert_consistent(replay);
    let failing = &replay.setup.upstreams[0].phases[1];
    let share = |f: fn(&Kind) -> bool| -> f64 {
        failing
            .responses
            .iter()
            .filter(|r| f(&r.kind))
            .map(|r| r.p)
            .sum()
    };
    assert!(share(|k| k.is_failure()) <= 0.5 + 1e-12);
    assert!(share(|k| matches!(k, Kind::Ok { .. })) > 0.0);
    assert!(share(|k| matches!(k, Kind::Hang)) > 0.0);
    assert!(share(|k| matches!(k, Kind::Status { code: 503, .. })) > 0.0);
    let plain = stack(replay, "no-breaker");
    let (from, to) = (failing.from.as_secs_f64(), failing.until.as_secs_f64());
    let theirs: Vec<_> = plain
        .attempt_log
        .iter()
        .filter(|a| a.upstream == 0 && a.t_s >= from && a.t_s < to && !a.probe)
        .collect();
    let failed = theirs.iter().filter(|a| a.failed).count() as f64;
    assert!(
        failed / theirs.len() as f64 <= 0.56,
        "{failed} of {}",
        theirs.len()
    );
    for u in 1..replay.setup.upstreams.len() {
        assert!(
            replay.setup.heals()[u].is_none(),
            "upstream {u} never fails"
        );
    }
    assert!(stack(replay, "breaker").by_class.len() == 3);
}

// === seeds ===

/// Seeds run in parallel give what each seed gives alone, in order; the
/// medians and the re-close count are those of the runs.
#[test]
fn seeds_replay_each_seed_and_summarize_medians_and_reclose_counts() {
    let base = scenario::parse(EXACT, "exact.toml").unwrap();
    let seeds = seeds::sequence(base.seed, 3);
    assert_eq!(seeds, [1, 2, 3]);
    let runs = seeds::replay_seeds(&base, &base.stacks(), &seeds).unwrap();
    for (run, seed) in runs.iter().zip(&seeds) {
        let mut alone = base.clone();
        alone.seed = *seed;
        let one = engine::replay(&alone).unwrap();
        assert_eq!(run.seed, *seed);
        assert_eq!(report::json(run), report::json(&one));
    }
    let s = seeds::summarize(&runs);
    let breaker = s.stacks.iter().find(|x| x.name == "breaker").unwrap();
    // The breaker is open at the end of every seed (the last hang trips it).
    assert_eq!(breaker.closed_at_end, (0, 3));
    let answered = breaker
        .figures
        .iter()
        .find(|(n, _, _)| *n == "answered")
        .unwrap()
        .2
        .unwrap();
    let mut xs: Vec<f64> = runs
        .iter()
        .map(|r| r.stack("breaker").unwrap().all.answered as f64)
        .collect();
    xs.sort_by(f64::total_cmp);
    assert_eq!(
        (answered.min, answered.median, answered.max),
        (xs[0], xs[1], xs[2])
    );
    assert_eq!(
        seeds::Spread::of(vec![4.0, 1.0, 3.0, 2.0]).unwrap().median,
        2.5
    );
    assert!(seeds::table(&s).contains("breaker: closed at the end in 0 of 3 seeds"));
}

/// With more than one class of traffic, the seeds' summary has each key's
/// figures: their medians are those of the key's own runs, and the
/// answers ratio is over no breaker's answers for the same key.
#[test]
fn seeds_summarize_every_key_of_a_mix() {
    let text = EXACT.replace(
        "poisson = false",
        "poisson = false\ntraffic = [ { p = 0.5, model = \"only\", api_key = \"a\" }, { p = 0.5, model = \"only\", api_key = \"b\" } ]",
    );
    let base = scenario::parse(&text, "mix.toml").unwrap();
    let seeds = seeds::sequence(base.seed, 3);
    let runs = seeds::replay_seeds(&base, &base.stacks(), &seeds).unwrap();
    let s = seeds::summarize(&runs);
    let breaker = s.stacks.iter().find(|x| x.name == "breaker").unwrap();
    let keys: Vec<&str> = breaker.by_key.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        keys,
        runs[0]
            .classes
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    assert_eq!(keys.len(), 2);
    for (c, key) in breaker.by_key.iter().enumerate() {
        let get = |name: &str| {
            key.figures
                .iter()
                .find(|(n, _, _)| *n == name)
                .unwrap()
                .2
                .unwrap()
        };
        let mut answered: Vec<f64> = runs
            .iter()
            .map(|r| r.stack("breaker").unwrap().by_class[c].all.answered as f64)
            .collect();
        answered.sort_by(f64::total_cmp);
        let a = get("answered");
        assert_eq!(
            (a.min, a.median, a.max),
            (answered[0], answered[1], answered[2])
        );
        let mut ratios: Vec<f64> = runs
            .iter()
            .map(|r| {
                let mine = r.stack("breaker").unwrap().by_class[c].all.answered as f64;
                let theirs = r.stack("no-breaker").unwrap().by_class[c].all.answered as f64;
                mine / theirs
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        assert!(close(get("answers_vs_no_breaker").median, ratios[1]));
    }
    let table = seeds::table(&s);
    assert!(table.contains("  breaker by key only/a:"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&seeds::json(&s)).unwrap();
    let stack = json["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "breaker")
        .unwrap();
    for key in ["only/a", "only/b"] {
        for field in [
            "answered",
            "answers_vs_no_breaker",
            "after_heal_answered",
            "outage_answered",
        ] {
            assert!(
                stack["by_key"][key][field].is_object(),
                "{key} {field}: {stack}"
            );
        }
    }
}

// === the [failover] table: selection and fallback by error kind ===

#[test]
fn the_selection_answers_within_ten_percent_of_the_oracle_when_providers_swap() {
    let replay = replayed("swapping-providers.toml");
    let p50 = |name: &str| stack(replay, name).all.answered_wait.unwrap().p50_s;
    let (select, oracle, ordered) = (p50("failover-select"), p50("oracle"), p50("failover"));
    assert!(select <= oracle * 1.10, "select {select} oracle {oracle}");
    assert!(
        ordered > oracle * 1.2,
        "ordered failover {ordered} does not follow the swaps"
    );
    for name in ["failover-select", "oracle"] {
        let run = stack(replay, name);
        assert_eq!(run.all.answered, run.all.requests, "{name}");
        assert_eq!(run.breaker_failures, Some(0), "{name}");
    }
}

#[test]
fn the_context_length_wave_is_answered_by_the_long_context_member_and_trips_nothing() {
    let replay = replayed("context-length-wave.toml");
    let long = replay
        .upstreams
        .iter()
        .position(|u| u == "long-context")
        .unwrap();
    for name in ["failover", "failover-by-kind"] {
        let run = stack(replay, name);
        let (n, answered) = engine::context_length_wave(run, long);
        assert!(n > 100, "{name}: {n} context-length requests");
        if name == "failover" {
            assert_eq!(answered, 0, "ordered failover hands the 400 back");
        } else {
            assert_eq!(answered, n, "every one answered by the long-context member");
            assert_eq!(run.breaker_failures, Some(0));
            assert_eq!(run.all.answered, run.all.requests);
        }
    }
}

#[test]
fn the_spend_guard_stops_the_runaway_agent_within_its_bound_and_spares_the_users() {
    let replay = replayed("runaway-agent-loop.toml");
    assert_consistent(replay);
    let class = |run: &StackRun, key: &str| {
        classes(replay, run)
            .find(|(c, _)| c.ends_with(key))
            .unwrap()
            .1
            .clone()
    };
    let scenario = &replay.setup;
    let budget = scenario.spend.unwrap().budget_usd;
    let per_call = scenario.upstreams[1].cost.billed(1.0);
    let (bare, guarded) = (stack(replay, "no-breaker"), stack(replay, "breaker"));
    let agent = class(guarded, "agent");
    assert!((class(bare, "agent").cost_usd - 2400.0 * per_call).abs() < 1e-6);
    // The call that crosses the budget completes, and so do those in flight
    // with it: at most the loop's calls of the longest latency drawn (ten
    // seconds at one call a second).
    assert!(agent.cost_usd >= budget, "{}", agent.cost_usd);
    assert!(
        agent.cost_usd <= budget + 10.0 * per_call,
        "{} over a budget of {budget}",
        agent.cost_usd
    );
    assert!(agent.rejected > 2000);
    // The users' own key never comes near its budget: their errors are the
    // unguarded stack's.
    let users = class(guarded, "users");
    assert_eq!(users.rejected, 0);
    assert_eq!(users.user_error_rate, class(bare, "users").user_error_rate);
    assert!((users.cost_usd - class(bare, "users").cost_usd).abs() < 1e-9);
    // One budget for everyone: the loop spends the users' share.
    assert!(class(stack(replay, "global-breaker"), "users").rejected > 1000);
}

#[test]
fn error_bodies_parse_to_the_answers_the_classifier_reads() {
    let ok_503 = "{ p = 0.5, kind = \"status\", code = 503, latency_ms = 50 }";
    let with = |response: &str| GOOD.replace(ok_503, response);
    for (response, kind) in [
        (
            "{ p = 0.5, kind = \"status\", error = \"insufficient_quota\", latency_ms = 50 }",
            Kind::QuotaExhausted {
                latency: Duration::from_millis(50),
            },
        ),
        (
            "{ p = 0.5, kind = \"status\", code = 429, error = \"insufficient_quota\", latency_ms = 50 }",
            Kind::QuotaExhausted {
                latency: Duration::from_millis(50),
            },
        ),
        (
            "{ p = 0.5, kind = \"status\", error = \"context_length_exceeded\", latency_ms = 50 }",
            Kind::ContextLength {
                latency: Duration::from_millis(50),
            },
        ),
        (
            "{ p = 0.5, kind = \"status\", code = 400, error = \"content_policy\", latency_ms = 50 }",
            Kind::ContentFilter {
                latency: Duration::from_millis(50),
            },
        ),
    ] {
        let s = parse(&with(response)).unwrap_or_else(|e| panic!("{response}: {e}"));
        assert_eq!(s.upstreams[0].phases[0].responses[1].kind, kind, "{response}");
    }
    let gate = "close_after = 1\n";
    let s = parse(&GOOD.replace(gate, &format!("{gate}quota_gate_s = 60\n"))).unwrap();
    assert_eq!(s.breaker.quota_gate, Some(Duration::from_secs(60)));
    assert_eq!(parse(GOOD).unwrap().breaker.quota_gate, None);
}

#[test]
fn bad_error_bodies_and_quota_gates_are_errors_on_their_line() {
    let ok_503 = "{ p = 0.5, kind = \"status\", code = 503, latency_ms = 50 }";
    let with = |response: &str| GOOD.replace(ok_503, response);
    let gate = "close_after = 1\n";
    let gated = |v: &str| GOOD.replace(gate, &format!("{gate}quota_gate_s = {v}\n"));
    for (text, needle, says) in [
        (
            with("{ p = 0.5, kind = \"status\", error = \"out_of_money\", latency_ms = 50 }"),
            "out_of_money",
            "\"insufficient_quota\"",
        ),
        (
            with("{ p = 0.5, kind = \"status\", code = 400, error = \"insufficient_quota\", latency_ms = 50 }"),
            "insufficient_quota",
            "answered with 429",
        ),
        (
            with("{ p = 0.5, kind = \"status\", code = 503, error = \"content_policy\", latency_ms = 50 }"),
            "content_policy",
            "answered with 400",
        ),
        (
            with("{ p = 0.5, kind = \"ok\", error = \"insufficient_quota\", latency_ms = 50 }"),
            "insufficient_quota",
            "`error` is not a key of kind \"ok\"",
        ),
        (
            with("{ p = 0.5, kind = \"status\", error = \"insufficient_quota\", retry_after_s = 5, latency_ms = 50 }"),
            "insufficient_quota",
            "`retry_after_s` is not a key",
        ),
        (
            with("{ p = 0.5, kind = \"status\", error = \"insufficient_quota\" }"),
            "insufficient_quota",
            "needs `latency_ms`",
        ),
        (
            with("{ p = 0.5, kind = \"status\", error = 429, latency_ms = 50 }"),
            "error = 429",
            "expected a string",
        ),
        (
            with("{ p = 0.5, kind = \"status\", latency_ms = 50 }"),
            "kind = \"status\", latency_ms",
            "needs `code`",
        ),
        (gated("0"), "quota_gate_s", "greater than 0"),
        (gated("-60"), "quota_gate_s", "quota_gate_s"),
        (gated("\"a minute\""), "quota_gate_s", "invalid type"),
    ] {
        let e = error(&text);
        assert!(e.message.contains(says), "{needle}: {e}");
        assert_eq!(e.line, Some(line_of(&text, needle)), "{needle}: {e}");
    }
}

/// Serves `upstream` over HTTP/1 on 127.0.0.1, one task per connection.
async fn serve_scripted(
    upstream: tower_circuit_breaker::testing::ScriptedUpstream,
) -> std::net::SocketAddr {
    use tower::ServiceExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        upstream.clone().oneshot(req)
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// A hyper-util client to `addr` behind `layer` with the LLM classifier.
type LlmClient = tower_circuit_breaker::CircuitBreaker<
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Empty<hyper::body::Bytes>,
    >,
    tower_circuit_breaker::classify::LlmClassifier,
>;

/// `layer` with the LLM classifier over a hyper-util client.
fn llm_client(layer: tower_circuit_breaker::CircuitBreakerLayer) -> LlmClient {
    use hyper_util::rt::TokioExecutor;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<http_body_util::Empty<hyper::body::Bytes>>();
    tower::ServiceBuilder::new()
        .layer(layer.with_classifier(tower_circuit_breaker::classify::LlmClassifier::new()))
        .service(client)
}

/// A chat completion request to `addr`.
fn chat_request(
    addr: std::net::SocketAddr,
) -> http::Request<http_body_util::Empty<hyper::body::Bytes>> {
    http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .body(http_body_util::Empty::new())
        .unwrap()
}

/// One call through `svc` that the breaker lets through.
async fn answered(
    svc: &mut LlmClient,
    addr: std::net::SocketAddr,
) -> http::Response<
    tower_circuit_breaker::ResponseBody<
        hyper::body::Incoming,
        tower_circuit_breaker::classify::LlmStream,
    >,
> {
    use tower::{Service, ServiceExt};
    svc.ready()
        .await
        .unwrap()
        .call(chat_request(addr))
        .await
        .unwrap()
}

/// One call through `svc`; the rejection if the breaker refused it.
async fn rejected(
    svc: &mut LlmClient,
    addr: std::net::SocketAddr,
) -> tower_circuit_breaker::Rejection {
    use tower::{Service, ServiceExt};
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(chat_request(addr))
        .await
        .unwrap_err();
    err.circuit_open()
        .expect("rejected by the breaker")
        .reason()
}

#[test]
fn retry_graded_is_off_unless_set_and_a_bad_value_is_an_error_on_its_line() {
    let at = "max_retries = ";
    let set = |v: &str| GOOD.replacen(at, &format!("retry_graded = {v}\n{at}"), 1);
    assert!(!parse(GOOD).unwrap().client.retry_graded);
    assert!(parse(&set("true")).unwrap().client.retry_graded);
    assert!(!parse(&set("false")).unwrap().client.retry_graded);
    let text = set("\"yes\"");
    let e = error(&text);
    assert!(e.message.contains("invalid type"), "{e}");
    assert_eq!(e.line, Some(line_of(&text, "retry_graded")), "{e}");
}

#[test]
fn trip_mode_open_is_the_all_or_nothing_breaker_and_a_bad_mode_is_an_error_on_its_line() {
    let after = "close_after = 1\n";
    let mode = |v: &str| GOOD.replace(after, &format!("{after}trip_mode = {v}\n"));
    assert!(
        !parse(GOOD).unwrap().breaker.open_all_or_nothing,
        "graded by default"
    );
    assert!(
        !parse(&mode("\"graded\""))
            .unwrap()
            .breaker
            .open_all_or_nothing
    );
    assert!(
        parse(&mode("\"open\""))
            .unwrap()
            .breaker
            .open_all_or_nothing
    );
    for (v, says) in [
        ("\"closed\"", "is not \"graded\" or \"open\""),
        ("1", "invalid type"),
    ] {
        let text = mode(v);
        let e = error(&text);
        assert!(e.message.contains(says), "{v}: {e}");
        assert_eq!(e.line, Some(line_of(&text, "trip_mode")), "{v}: {e}");
    }
    // What it changes: the exact scenario's breaker, graded, is never open
    // when its second hang fails, all or nothing it is.
    let graded = EXACT.replace("trip_mode = \"open\"\n", "");
    assert_ne!(graded, EXACT);
    for (text, opens) in [(EXACT.to_owned(), true), (graded, false)] {
        let replay = engine::replay(&parse(&text).unwrap()).unwrap();
        let breaker = stack(&replay, "breaker");
        assert_eq!(
            breaker.recovery[0].time_to_trip_s.is_some(),
            opens,
            "{text}"
        );
    }
}

#[test]
fn an_exhausted_quota_is_retried_without_a_breaker_and_gated_with_one() {
    let replay = replayed("quota-exhausted.toml");
    assert_consistent(replay);
    let primary = |f: &Figures| {
        f.attempts
            .iter()
            .find(|(u, _)| u == "primary")
            .map_or(0, |&(_, n)| n)
    };
    let none = outage(replay, "no-breaker");
    let breaker = outage(replay, "breaker");
    // The client retries the 429 (its head says "rate limited"), and the
    // quota never comes back: every request in the outage fails.
    assert_eq!(none.answered, 0);
    assert_eq!(none.user_error_rate, Some(1.0));
    assert!(primary(none) > 2 * none.requests, "{}", primary(none));
    // The quota gate opens on the first answer and stops calling: a few
    // probes a minute, every other request rejected at once.
    assert!(
        primary(breaker) * 20 < primary(none),
        "{}",
        primary(breaker)
    );
    assert!(
        breaker.rejected * 10 > breaker.requests * 9,
        "{}",
        breaker.rejected
    );
    let open = stack(replay, "breaker")
        .transitions
        .iter()
        .filter(|t| t.upstream == "primary" && t.to == "open")
        .count();
    assert!(open >= 5, "reopened each minute: {open}");
    // Failover answers everyone from the fallback.
    for name in ["naive-failover", "failover"] {
        let f = outage(replay, name);
        assert_eq!(f.answered, f.requests, "{name}");
    }
}

/// The quota answer over a real connection: a scripted upstream served by
/// hyper on a local port, a hyper-util client behind a quota-gated breaker.
#[tokio::test(start_paused = true)]
async fn a_quota_answer_over_a_real_connection_opens_a_quota_gated_breaker() {
    use http_body_util::BodyExt;
    use tower_circuit_breaker::testing::{AttemptLog, Phase, Script, ScriptedUpstream};
    use tower_circuit_breaker::{CircuitBreakerLayer, Reason, Rejection};

    let log = AttemptLog::new();
    let script = Script::builder()
        .name("primary")
        .phase(Phase::new(Duration::ZERO).answer(
            1.0,
            Kind::QuotaExhausted {
                latency: Duration::from_millis(90),
            },
        ))
        .build()
        .unwrap();
    let addr = serve_scripted(ScriptedUpstream::with_log(script, log.clone())).await;

    let layer = CircuitBreakerLayer::builder()
        .count_window(10)
        .min_calls(5)
        .failure_rate(0.5)
        .quota_gate(Duration::from_secs(60))
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let mut svc = llm_client(layer);

    let res = answered(&mut svc, addr).await;
    assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(std::str::from_utf8(&body)
        .unwrap()
        .contains("insufficient_quota"));
    assert_eq!(breaker.snapshot().reason, Some(Reason::QuotaExhausted));
    assert_eq!(rejected(&mut svc, addr).await, Rejection::Quota);
    assert_eq!(log.attempts().len(), 1, "the rejected call never left");
}

// === per-key behaviour, rate limits and the all-open policy (#35) ===

/// `GOOD` with two keys of its own on the upstream, a rate limit, pacing
/// and the last-resort policy's table (on a second upstream).
fn keyed_good() -> String {
    GOOD.replace(
        "poisson = false\n",
        "poisson = false\n\ntraffic = [ { p = 0.5, model = \"only\", api_key = \"a\" },\n            { p = 0.5, model = \"only\", api_key = \"b\" } ]\n",
    )
    .replace("close_after = 1\n", "close_after = 1\npace_rate_limits = true\n")
    .replace(
        "name = \"only\"\n",
        "name = \"only\"\nrate_limit = { requests = 5, period_s = 2 }\n",
    ) + r#"
  [[upstream.key]]
  name = "a"
  rate_limit = { requests = 3, period_s = 1 }
    [[upstream.key.phase]]
    from_s = 0
    responses = [ { p = 1.0, kind = "ok", latency_ms = 100 } ]
    [[upstream.key.phase]]
    from_s = 4
    responses = [ { p = 1.0, kind = "status", error = "insufficient_quota", latency_ms = 10 } ]

  [[upstream.key]]
  name = "b"
    [[upstream.key.phase]]
    from_s = 0
    responses = [ { p = 1.0, kind = "ok", latency_ms = 100 } ]
"#
}

#[test]
fn keys_rate_limits_pacing_and_the_all_open_policy_parse() {
    let text = keyed_good();
    let s = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let u = &s.upstreams[0];
    assert_eq!(u.keys.len(), 2);
    assert_eq!(u.keys[0].name, "a");
    assert_eq!(u.keys[0].phases.len(), 2);
    assert_eq!(u.keys[0].phases[1].from, Duration::from_secs(4));
    let limit = |l: Option<tower_circuit_breaker::testing::RateLimit>| {
        l.map(|l| (l.requests(), l.period()))
    };
    assert_eq!(
        limit(u.keys[0].rate_limit),
        Some((3, Duration::from_secs(1)))
    );
    assert_eq!(limit(u.keys[1].rate_limit), None, "the upstream's, below");
    assert_eq!(limit(u.rate_limit), Some((5, Duration::from_secs(2))));
    assert_eq!(u.key("b"), Some(1));
    assert_eq!(u.key("c"), None);
    assert!(s.breaker.pace_rate_limits);
    assert!(!parse(GOOD).unwrap().breaker.pace_rate_limits);
    // Key a's quota runs out at 4 s and never comes back: the upstream's
    // ground truth is its own phases' and its keys'.
    let within = s.answer_within();
    assert_eq!(u.keys[0].failing_from(within), Some(Duration::from_secs(4)));
    assert_eq!(u.keys[0].healed_at(within), None);
    assert_eq!(u.failing_from(within), Some(Duration::ZERO), "its own 503s");
    assert_eq!(u.healed_at(within), None);
    assert_eq!(u.keys[1].failing_from(within), None);
    let replay = engine::replay(&s).unwrap();
    assert_consistent(&replay);
    assert_eq!(replay.classes, ["only/a", "only/b"]);

    // The all-open policy, on a scenario with a fallback.
    let two = GOOD.to_owned()
        + "\n[[upstream]]\nname = \"second\"\n  [[upstream.phase]]\n  from_s = 0\n  responses = [ { p = 1.0, kind = \"ok\", latency_ms = 100 } ]\n";
    let with = |v: &str| {
        two.replace(
            "[[upstream]]\nname = \"only\"",
            &format!("[failover]\nall_open = {v}\n\n[[upstream]]\nname = \"only\""),
        )
    };
    assert!(!parse(&two).unwrap().routing.last_resort);
    assert!(!parse(&with("\"fail_fast\"")).unwrap().routing.last_resort);
    let s = parse(&with("\"last_resort\"")).unwrap();
    assert!(s.routing.last_resort);
    assert!(s.stacks().contains(&StackKind::FailoverLastResort));
    let replay = engine::replay(&s).unwrap();
    assert_consistent(&replay);
    assert!(replay.stack("failover-last-resort").is_some());
}

#[test]
fn bad_keys_rate_limits_and_all_open_policies_are_errors_on_their_line() {
    let text = keyed_good();
    let two = GOOD.to_owned()
        + "\n[[upstream]]\nname = \"second\"\n  [[upstream.phase]]\n  from_s = 0\n  responses = [ { p = 1.0, kind = \"ok\", latency_ms = 100 } ]\n";
    let all_open = |v: &str| {
        two.replace(
            "[[upstream]]\nname = \"only\"",
            &format!("[failover]\nall_open = {v}\n\n[[upstream]]\nname = \"only\""),
        )
    };
    let cases = [
        // A key no traffic is sent with.
        (text.replace("api_key = \"b\"", "api_key = \"c\""), "name = \"b\"", "no traffic is sent with key \"b\""),
        (text.replace("name = \"b\"", "name = \"a\"  "), "name = \"a\"  ", "listed twice"),
        (text.replace("name = \"a\"", "name = \"a/x\""), "name = \"a/x\"", "without `/`"),
        (text.replace("    from_s = 0\n    responses = [ { p = 1.0, kind = \"ok\", latency_ms = 100 } ]\n    [[upstream.key.phase]]", "    from_s = 1\n    responses = [ { p = 1.0, kind = \"ok\", latency_ms = 100 } ]\n    [[upstream.key.phase]]"), "from_s = 1", "must start at 0"),
        (text.replace("from_s = 4", "from_s = 0"), "from_s = 0\n    responses = [ { p = 1.0, kind = \"status\"", "increasing order"),
        (text.replace("error = \"insufficient_quota\", latency_ms = 10", "error = \"insufficient_quota\", latency_ms = 10, p = 0.5"), "latency_ms = 10, p", "duplicate key"),
        (text.replace("name = \"b\"\n", "name = \"b\"\ncolour = \"red\"\n"), "colour", "unknown field"),
        (text.replace("requests = 3,", "requests = 0,"), "requests = 0", "at least 1"),
        (text.replace("period_s = 1 }", "period_s = 0 }"), "period_s = 0", "greater than 0"),
        (text.replace("period_s = 2 }", "period_s = -2 }"), "period_s = -2", "period_s"),
        (text.replace("requests = 5, period_s = 2", "requests = 5"), "requests = 5", "period_s"),
        (text.replace("pace_rate_limits = true", "pace_rate_limits = \"yes\""), "pace_rate_limits", "invalid type"),
        (all_open("\"panic\""), "all_open", "\"last_resort\""),
        (all_open("true"), "all_open", "invalid type"),
    ];
    // A key with no phases.
    let cut = text[..text.find("  [[upstream.key]]\n  name = \"b\"").unwrap()].to_owned();
    let no_phase = cut + "  [[upstream.key]]\n  name = \"b\"\n  phase = []\n";
    let e = error(&no_phase);
    assert!(e.message.contains("needs at least one phase"), "{e}");
    assert_eq!(e.line, Some(line_of(&no_phase, "phase = []")), "{e}");
    for (text, needle, says) in cases {
        let e = error(&text);
        assert!(e.message.contains(says), "{needle}: {e}");
        let line = text
            .find(needle)
            .map(|at| text[..at].lines().count() + usize::from(text[..at].ends_with('\n')));
        assert_eq!(e.line, line, "{needle}: {e}");
    }
    for text in [
        text.replace("[[upstream.key]]\n  name = \"a\"", "[[upstream.key]]"),
        text.replace(
            "rate_limit = { requests = 3, period_s = 1 }",
            "rate_limit = 3",
        ),
        text[..text.find("  [[upstream.key]]\n  name = \"b\"").unwrap()].to_owned()
            + "  [[upstream.key]]\n  name = \"b\"\n",
        text.replace("[[upstream.key]]", "[[upstream.key.phase]]"),
    ] {
        let e = error(&text);
        assert!(e.line.is_some() || !e.message.is_empty(), "{e}");
    }
}

#[test]
fn only_the_exhausted_key_is_gated_with_keyed_breakers() {
    let replay = replayed("key-quota-exhausted.toml");
    assert_consistent(replay);
    let by = |stack_name: &str, class: &str| {
        let run = stack(replay, stack_name);
        let c = replay.classes.iter().position(|k| k == class).unwrap();
        &run.by_class[c]
    };
    // team-a's key answers nobody after 120 s without a breaker: its own
    // ground truth says so, team-b's key has no outage at all.
    let a = by("no-breaker", "gpt-4o/team-a");
    let a_outage = a.outage.as_ref().expect("team-a's key fails");
    assert_eq!(a_outage.answered, 0);
    assert_eq!(a_outage.user_error_rate, Some(1.0));
    assert!(by("no-breaker", "gpt-4o/team-b").outage.is_none());
    // Keyed breakers gate team-a's key and nothing else.
    let keyed = stack(replay, "breaker");
    assert!(keyed.transitions.iter().any(|t| t.to == "open"));
    for t in &keyed.transitions {
        assert_eq!(t.upstream, "gpt-4o/team-a", "{t:?}");
    }
    assert!(by("breaker", "gpt-4o/team-a").all.rejected * 2 > a.all.requests);
    let b = &by("breaker", "gpt-4o/team-b").all;
    assert_eq!(b.rejected, 0);
    assert_eq!(b.answered, b.requests);
    // One breaker for both keys gates team-b's users too.
    let global = &by("global-breaker", "gpt-4o/team-b").all;
    assert!(global.rejected * 2 > global.requests, "{}", global.rejected);
}

#[test]
fn pacing_on_announced_rate_limits_spends_no_call_on_a_429() {
    let replay = replayed("rate-limit-pacing.toml");
    assert_consistent(replay);
    let none = &stack(replay, "no-breaker").all;
    let paced = &stack(replay, "breaker").all;
    let attempts = |f: &Figures| f.attempts.iter().map(|&(_, n)| n).sum::<u64>();
    // 150 a minute for ten minutes: without pacing, every call beyond them
    // hears a 429 (and its retries wait for the reset); paced, the breaker
    // rejects them locally after the answer that said none were left.
    assert!(attempts(none) > none.answered + 1000, "{}", attempts(none));
    assert!(
        attempts(paced) <= paced.answered + 20,
        "{}",
        attempts(paced)
    );
    assert!(paced.answered >= 1490, "{}", paced.answered);
    assert!(paced.rejected > 500, "{}", paced.rejected);
    let p99 = |f: &Figures| f.answered_wait.unwrap().p99_s;
    assert!(
        p99(paced) < 3.0 && p99(none) > 10.0,
        "{} {}",
        p99(paced),
        p99(none)
    );
    // Pacing is no failure: the circuit never opens.
    assert!(stack(replay, "breaker").transitions.is_empty());
}

#[test]
fn the_last_resort_policy_lets_calls_through_when_every_circuit_is_open() {
    let replay = replayed("all-open-last-resort.toml");
    assert_consistent(replay);
    let attempts = |f: &Figures| f.attempts.iter().map(|&(_, n)| n).sum::<u64>();
    let fail_fast = outage(replay, "failover");
    let last_resort = outage(replay, "failover-last-resort");
    // Both upstreams are down: every request of the outage fails either
    // way, but the last-resort stack makes a call per open period where
    // failing fast makes none.
    assert_eq!(fail_fast.answered, 0);
    assert_eq!(last_resort.answered, 0);
    assert!(
        attempts(last_resort) > attempts(fail_fast),
        "{} {}",
        attempts(last_resort),
        attempts(fail_fast)
    );
    assert!(last_resort.rejected < fail_fast.rejected);
}

/// The rate-limit headers over a real connection: a scripted upstream with
/// a rate limit served by hyper on a local port, a hyper-util client behind
/// a breaker that paces on them.
#[tokio::test(start_paused = true)]
async fn announced_rate_limits_over_a_real_connection_pace_the_breaker() {
    use tower_circuit_breaker::testing::{AttemptLog, Phase, RateLimit, Script, ScriptedUpstream};
    use tower_circuit_breaker::{CircuitBreakerLayer, Rejection};

    let log = AttemptLog::new();
    let script = Script::builder()
        .name("primary")
        .rate_limit(RateLimit::new(2, Duration::from_secs(60)))
        .phase(Phase::new(Duration::ZERO).answer(1.0, Kind::ok().after(Duration::from_millis(50))))
        .build()
        .unwrap();
    let addr = serve_scripted(ScriptedUpstream::with_log(script, log.clone())).await;

    let layer = CircuitBreakerLayer::builder()
        .count_window(10)
        .min_calls(5)
        .failure_rate(0.5)
        .pace_rate_limits(true)
        .build()
        .unwrap();
    let mut svc = llm_client(layer);

    let first = answered(&mut svc, addr).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-ratelimit-remaining-requests"], "1");
    let second = answered(&mut svc, addr).await;
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["x-ratelimit-remaining-requests"], "0");
    // The second answer said none are left: the third call is paced
    // locally, not sent to hear a 429.
    assert_eq!(rejected(&mut svc, addr).await, Rejection::RateLimited);
    assert_eq!(log.attempts().len(), 2, "the paced call never left");
    // After the reset, calls go out again.
    tokio::time::advance(Duration::from_secs(60)).await;
    let again = answered(&mut svc, addr).await;
    assert_eq!(again.status(), 200);
    assert_eq!(log.attempts().len(), 3);
}
