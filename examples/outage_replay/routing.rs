//! The stacks of a scenario's `[failover]` table, and what the report says
//! of them: `failover-select` (the failover stack whose first member a
//! selection chooses), `oracle` (each request to the upstream whose script
//! is the faster at that moment: what a selection could at best do) and
//! `failover-by-kind` (the failover stack with the rule table, each member
//! reading the kind of its error answers).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::timeout::{Timeout, TimeoutLayer};
use tower::{ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{ErrorKind, LlmClassifier};
use tower_circuit_breaker::failover::{Failover, FallbackTo, Selection};
use tower_circuit_breaker::kind::ReadKind;
use tower_circuit_breaker::{BoxError, Breaker, CircuitBreaker};

use super::{
    boxed, breaker_builder, chat_body, client, mix, retry_policy, spawn_health_probe,
    stream_deadlines, Replay, Sim, SimStack, StackRun, TransitionLog, FAILOVER_JITTER,
};
use crate::scenario::{Cost, Kind, Scenario, SelectPolicy};

thread_local! {
    /// The breakers of the stack this thread replays, for the failures they
    /// counted (each stack runs on a thread of its own).
    static BREAKERS: RefCell<Vec<Breaker>> = const { RefCell::new(Vec::new()) };
}

/// The failures the breakers of this thread's stack counted, when it is one
/// of the `[failover]` stacks.
pub fn breaker_failures() -> Option<u64> {
    BREAKERS.with(|b| {
        let b = b.borrow();
        (!b.is_empty()).then(|| b.iter().map(|b| b.snapshot().counters.failures).sum())
    })
}

/// Every upstream's breaker, as the `failover` stack builds them.
fn breakers(sim: &Arc<Sim>, log: &TransitionLog) -> Result<Vec<Breaker>, String> {
    let scenario = &sim.scenario;
    let mut breakers = Vec::new();
    for i in 0..scenario.upstreams.len() {
        let breaker = breaker_builder(scenario, i, 0, log)
            .build()
            .map_err(|e| format!("the breaker does not accept this scenario: {e}"))?;
        spawn_health_probe(sim, i, &breaker);
        breakers.push(breaker);
    }
    BREAKERS.with(|b| *b.borrow_mut() = breakers.clone());
    Ok(breakers)
}

fn no_deadlines(scenario: &Scenario) -> Result<(), String> {
    match stream_deadlines(scenario) {
        Some(_) => Err("the `[failover]` stacks do not take stream deadlines".to_owned()),
        None => Ok(()),
    }
}

/// A good answer's price at upstream `i`, for `select = "cheapest"`.
fn price(scenario: &Scenario, i: usize) -> f64 {
    match scenario.upstreams[i].cost {
        Cost::PerRequest { usd } => usd,
        Cost::PerToken {
            input_usd,
            output_usd,
        } => input_usd + output_usd,
    }
}

/// The failover stack, its first member chosen by the scenario's selection.
pub fn failover_select(sim: &Arc<Sim>, log: &TransitionLog) -> Result<SimStack, String> {
    let scenario = &sim.scenario;
    no_deadlines(scenario)?;
    let c = &scenario.client;
    let breakers = breakers(sim, log)?;
    let selection = match scenario.routing.select {
        Some(SelectPolicy::Cheapest) => Selection::cheapest(
            breakers
                .iter()
                .enumerate()
                .map(|(i, b)| (b.clone(), price(scenario, i))),
        ),
        _ => {
            let s = Selection::peak_ewma(breakers.clone());
            match scenario.routing.decay {
                Some(d) => s.decay(d),
                None => s,
            }
        }
    };
    let mut policy = retry_policy(scenario);
    for b in &breakers {
        policy = policy.watch_breaker(b.clone());
    }
    let mut members = breakers.into_iter().map(|b| {
        CircuitBreaker::with_classifier(
            Timeout::new(client(sim), c.attempt_timeout),
            b,
            LlmClassifier::new(),
        )
    });
    let mut failover = Failover::new(members.next().expect("a scenario has an upstream"))
        .jitter(FAILOVER_JITTER.0, FAILOVER_JITTER.1)
        .seed(mix(scenario.seed ^ 0xfa11))
        .with_classifier(LlmClassifier::new());
    for (member, upstream) in members.zip(&scenario.upstreams[1..]) {
        let model = upstream.name.clone();
        failover = failover.fallback_with(member, move |req: &mut Request<String>| {
            *req.body_mut() = chat_body(&model)
        });
    }
    let failover = failover
        .select(selection)
        .map_err(|e| format!("the selection does not fit: {e}"))?;
    Ok(boxed(
        ServiceBuilder::new()
            .option_layer(c.total_timeout.map(TimeoutLayer::new))
            .map_err(|e: tower_circuit_breaker::Error| BoxError::from(e))
            .layer(RetryLayer::new(policy))
            .service(failover),
    ))
}

/// The failover stack with the scenario's rule table; every member reads the
/// kind of its error answers.
pub fn failover_by_kind(sim: &Arc<Sim>, log: &TransitionLog) -> Result<SimStack, String> {
    let scenario = &sim.scenario;
    no_deadlines(scenario)?;
    let c = &scenario.client;
    let breakers = breakers(sim, log)?;
    let mut policy = retry_policy(scenario);
    for b in &breakers {
        policy = policy.watch_breaker(b.clone());
    }
    let mut members = breakers.into_iter().map(|b| {
        ReadKind::new(CircuitBreaker::with_classifier(
            Timeout::new(client(sim), c.attempt_timeout),
            b,
            LlmClassifier::new(),
        ))
    });
    let mut failover = Failover::new(members.next().expect("a scenario has an upstream"))
        .jitter(FAILOVER_JITTER.0, FAILOVER_JITTER.1)
        .seed(mix(scenario.seed ^ 0xfa11))
        .with_classifier(LlmClassifier::new());
    for (member, upstream) in members.zip(&scenario.upstreams[1..]) {
        let model = upstream.name.clone();
        failover = failover.fallback_with(member, move |req: &mut Request<String>| {
            *req.body_mut() = chat_body(&model)
        });
    }
    let routing = &scenario.routing;
    for (kind, to) in [
        (ErrorKind::ContextLength, routing.on_context_length),
        (ErrorKind::ContentPolicy, routing.on_content_policy),
    ] {
        if let Some(to) = to {
            failover = failover
                .on_kind(kind, FallbackTo::Member(to))
                .map_err(|e| format!("the rule does not fit: {e}"))?;
        }
    }
    Ok(boxed(
        ServiceBuilder::new()
            .option_layer(c.total_timeout.map(TimeoutLayer::new))
            .map_err(|e: tower_circuit_breaker::Error| BoxError::from(e))
            .layer(RetryLayer::new(policy))
            .service(failover),
    ))
}

/// The typical time to first byte of upstream `i` at `t`, as its script has
/// it: the mean of its answers' median latencies, weighted by their shares.
fn scripted_latency(scenario: &Scenario, i: usize, t: Duration) -> f64 {
    let phases = &scenario.upstreams[i].phases;
    let Some(phase) = phases.iter().rev().find(|p| p.from <= t) else {
        return f64::INFINITY;
    };
    phase
        .responses
        .iter()
        .map(|r| match r.kind {
            Kind::Hang => f64::INFINITY,
            k => r.p * k.latency().map_or(f64::INFINITY, |l| l.as_secs_f64()),
        })
        .sum()
}

/// Each request to the upstream whose script is the faster at the moment it
/// is sent, behind that upstream's breaker; no fallback. It reads the
/// script, which no real stack can: the bound a selection is measured by.
pub fn oracle(sim: &Arc<Sim>, log: &TransitionLog) -> Result<SimStack, String> {
    let scenario = Arc::clone(&sim.scenario);
    no_deadlines(&scenario)?;
    let c = sim.scenario.client.clone();
    let members: Vec<_> = breakers(sim, log)?
        .into_iter()
        .map(|b| {
            CircuitBreaker::with_classifier(
                Timeout::new(client(sim), c.attempt_timeout),
                b,
                LlmClassifier::new(),
            )
        })
        .collect();
    let start = sim.start;
    let route = tower::service_fn(move |mut req: Request<String>| {
        let t = Instant::now().saturating_duration_since(start);
        let best = (0..scenario.upstreams.len())
            .min_by(|&a, &b| {
                scripted_latency(&scenario, a, t).total_cmp(&scripted_latency(&scenario, b, t))
            })
            .unwrap_or(0);
        *req.body_mut() = chat_body(&scenario.upstreams[best].name);
        members[best].clone().oneshot(req)
    });
    Ok(boxed(
        ServiceBuilder::new()
            .option_layer(c.total_timeout.map(TimeoutLayer::new))
            .map_err(|e: tower_circuit_breaker::Error| BoxError::from(e))
            .layer(RetryLayer::new(retry_policy(&sim.scenario)))
            .service(route),
    ))
}

// === the report ===

/// A figure's median and range over seeds.
fn spread(mut xs: Vec<f64>) -> Option<(f64, f64, f64)> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    let median = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    };
    Some((median, xs[0], xs[n - 1]))
}

fn answered_p50(run: &StackRun) -> Option<f64> {
    run.all.answered_wait.map(|w| w.p50_s)
}

/// The requests whose first attempt got a context-length answer, and how
/// many of them the upstream `to` answered.
pub fn context_length_wave(run: &StackRun, to: usize) -> (u64, u64) {
    let mut hit = vec![false; run.requests.len()];
    let mut by = vec![false; run.requests.len()];
    for a in &run.attempt_log {
        if a.request >= run.requests.len() {
            continue;
        }
        if matches!(a.kind, Kind::ContextLength { .. }) {
            hit[a.request] = true;
        }
        if a.answered && a.upstream == to {
            by[a.request] = true;
        }
    }
    let n = hit.iter().filter(|h| **h).count() as u64;
    let answered = hit.iter().zip(&by).filter(|(h, b)| **h && **b).count() as u64;
    (n, answered)
}

/// The `[failover]` section: per stack, over the replays (one per seed),
/// the answered wait's median against the oracle's, and for a rule table
/// where the context-length requests were answered and what the breakers
/// counted. Empty for a scenario without a `[failover]` table.
pub fn table(replays: &[Replay]) -> String {
    let Some(first) = replays.first() else {
        return String::new();
    };
    let scenario = &first.setup;
    let routing = &scenario.routing;
    if routing.select.is_none() && !routing.has_rules() {
        return String::new();
    }
    let mut out = String::new();
    let show = |x: Option<(f64, f64, f64)>, unit: &str| match x {
        Some((m, lo, hi)) if unit == "s" => format!("{m:.3}s [{lo:.3} – {hi:.3}]"),
        Some((m, lo, hi)) if unit == "x" => format!("{m:.3} [{lo:.3} – {hi:.3}]"),
        Some((m, lo, hi)) => format!("{m:.0} [{lo:.0} – {hi:.0}]"),
        None => "—".to_owned(),
    };
    let _ = writeln!(
        out,
        "\n[failover] over {} seed{}: median [least – most]",
        replays.len(),
        if replays.len() == 1 { "" } else { "s" }
    );
    if routing.select.is_some() {
        let _ = writeln!(out, "answered wait p50, and over the oracle's (same seed):");
        for name in ["failover", "failover-select", "oracle"] {
            let p50: Vec<f64> = replays
                .iter()
                .filter_map(|r| answered_p50(r.stack(name)?))
                .collect();
            let vs: Vec<f64> = replays
                .iter()
                .filter_map(|r| {
                    Some(answered_p50(r.stack(name)?)? / answered_p50(r.stack("oracle")?)?)
                })
                .collect();
            let _ = writeln!(
                out,
                "  {name:<18} {:<28} x oracle {}",
                show(spread(p50), "s"),
                show(spread(vs), "x")
            );
        }
    }
    if let Some(to) = routing.on_context_length {
        let long = &scenario.upstreams[to].name;
        let _ = writeln!(
            out,
            "context-length requests; answered by {long}; failures counted by the breakers:"
        );
        for name in ["failover", "failover-by-kind"] {
            let runs: Vec<&StackRun> = replays.iter().filter_map(|r| r.stack(name)).collect();
            let waves: Vec<(u64, u64)> = runs.iter().map(|r| context_length_wave(r, to)).collect();
            let failures: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.breaker_failures)
                .map(|f| f as f64)
                .collect();
            let _ = writeln!(
                out,
                "  {name:<18} {:<18} {:<18} {}",
                show(spread(waves.iter().map(|w| w.0 as f64).collect()), "n"),
                show(spread(waves.iter().map(|w| w.1 as f64).collect()), "n"),
                show(spread(failures), "n"),
            );
        }
    }
    out
}
