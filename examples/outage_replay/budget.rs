//! The `[spend]` section on the replay's breaker stacks: a spend guard on
//! their breakers, and the classifier that reads each answer's `usage`.

use tower_circuit_breaker::breaker::Build;
use tower_circuit_breaker::classify::{Classify, LlmClassifier};
use tower_circuit_breaker::spend::{Meter, Price, Prices, SpendGuard};
use tower_circuit_breaker::Builder;

use crate::scenario::{Cost, Scenario};

/// The classifiers a breaker stack of the replay takes.
pub trait SimClassifier:
    Classify<Stream: Send + Sync + 'static> + Clone + Send + Sync + 'static
{
}

impl<C> SimClassifier for C where
    C: Classify<Stream: Send + Sync + 'static> + Clone + Send + Sync + 'static
{
}

fn micros(usd: f64) -> u64 {
    (usd * 1e6).round() as u64
}

/// `builder` with the scenario's spend guard, if it has one.
pub fn guard<T: Build>(builder: Builder<T>, scenario: &Scenario) -> Builder<T> {
    let Some(spend) = scenario.spend else {
        return builder;
    };
    let mut guard = SpendGuard::micro_dollars(micros(spend.budget_usd), spend.period);
    if let Some(usd) = spend.unknown_usd {
        guard = guard.unknown_cost(micros(usd));
    }
    builder.spend_guard(guard)
}

/// The LLM classifier, reading each answer's usage priced by its upstream's
/// per-token `cost`.
pub fn meter(scenario: &Scenario) -> Meter<LlmClassifier> {
    let mut prices = Prices::new();
    for u in &scenario.upstreams {
        if let (
            Cost::PerToken {
                input_usd,
                output_usd,
            },
            Some((tokens_in, tokens_out)),
        ) = (u.cost, u.tokens)
        {
            let per_million = |usd: f64, n: u64| if n == 0 { 0.0 } else { usd * 1e6 / n as f64 };
            prices = prices.model(
                &u.name,
                Price::per_million(
                    per_million(input_usd, tokens_in),
                    per_million(output_usd, tokens_out),
                    0.0,
                ),
            );
        }
    }
    Meter::new(LlmClassifier::new(), prices)
}

/// With `[spend]`, over the seeds: per stack and class of traffic, the
/// users' error rate and the spend, median [least – most].
pub fn by_traffic(replays: &[crate::engine::Replay]) -> String {
    use std::fmt::Write as _;

    use crate::seeds::Spread;
    let Some(first) = replays.first() else {
        return String::new();
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nspend by traffic (model/api key), median [least – most] over the seeds: error rate, cost $"
    );
    let show = |s: Option<Spread>, f: &dyn Fn(f64) -> String| {
        s.map_or_else(
            || "—".to_owned(),
            |s| format!("{} [{} – {}]", f(s.median), f(s.min), f(s.max)),
        )
    };
    for stack in &first.stacks {
        for (c, class) in first.classes.iter().enumerate() {
            let runs: Vec<_> = replays
                .iter()
                .filter_map(|r| r.stack(stack.name)?.by_class.get(c))
                .collect();
            let errors = Spread::of(runs.iter().filter_map(|r| r.all.user_error_rate).collect());
            let cost = Spread::of(runs.iter().map(|r| r.all.cost_usd).collect());
            let _ = writeln!(
                out,
                "  {:<15} {:<14} errors {:<24} cost {}",
                stack.name,
                class,
                show(errors, &|x| format!("{:.1}%", x * 100.0)),
                show(cost, &|x| format!("{x:.2}")),
            );
        }
    }
    out
}
