//! The outage replay's scenario parser on arbitrary text (and bytes, read
//! lossily): an error is reported with the file and a line in the text,
//! never a panic; a scenario it accepts keeps every rule it validates.
#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../examples/outage_replay/scenario.rs"]
mod scenario;

use scenario::{Cost, Kind, Scenario, WindowConfig};

const FILE: &str = "fuzz.toml";
const TEN_YEARS: Duration = Duration::from_secs(315_360_000);

fn check(s: &Scenario) {
    assert!(
        !s.name.is_empty() && s.name.trim() == s.name,
        "{:?}",
        s.name
    );
    assert!(
        !s.duration.is_zero() && s.duration <= TEN_YEARS,
        "{:?}",
        s.duration
    );
    assert!(s.rate_per_s.is_finite() && s.rate_per_s > 0.0);
    assert!(s.duration.as_secs_f64() * s.rate_per_s <= scenario::MAX_REQUESTS + 1.0);

    let c = &s.client;
    assert!(!c.attempt_timeout.is_zero() && c.attempt_timeout <= TEN_YEARS);
    assert!(c
        .total_timeout
        .is_none_or(|t| t >= c.attempt_timeout && t <= TEN_YEARS));
    assert!(c.max_retries <= scenario::MAX_RETRIES);
    assert!(c.backoff_base <= c.backoff_max);

    let b = &s.breaker;
    match b.window {
        WindowConfig::Off => {}
        WindowConfig::Count(n) => {
            assert!((1..=scenario::MAX_WINDOW).contains(&n) && b.min_calls <= n)
        }
        WindowConfig::Time(d) => assert!(d >= c.attempt_timeout * 2 && d <= TEN_YEARS),
    }
    let rate = |r: f64| r > 0.0 && r <= 1.0;
    assert!(rate(b.failure_rate));
    if let Some((threshold, r)) = b.slow_call {
        assert!(b.window != WindowConfig::Off && rate(r));
        assert!(!threshold.is_zero() && threshold < c.attempt_timeout);
    }
    assert_ne!(b.consecutive_failures, Some(0));
    assert!(!b.open.is_zero() && b.open <= b.open_max && b.open_max <= TEN_YEARS);
    assert!(b.probes >= 1 && (1..=b.probes).contains(&b.close_after));
    assert!(b
        .probe_timeout
        .is_none_or(|t| !t.is_zero() && t <= c.attempt_timeout));
    let share = |x: f64| (0.0..=1.0).contains(&x);
    let billing = &s.billing;
    assert!(share(billing.hang) && share(billing.stream_error) && share(billing.error));
    if let Some(w) = &s.writeup {
        assert!(!w.stacks.is_empty());
        assert!(w.rows.iter().all(|r| r.reported.len() == w.stacks.len()));
    }

    assert!((1..=scenario::MAX_UPSTREAMS).contains(&s.upstreams.len()));
    assert!((1..=64).contains(&s.replicas));
    let shares: f64 = s.traffic.iter().map(|t| t.p).sum();
    assert!(s.traffic.is_empty() || (shares - 1.0).abs() <= 1e-9);
    assert!(s.traffic.iter().all(|t| t.upstream < s.upstreams.len()));
    assert!(s.rates.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(s.rates.iter().all(|&(t, r)| t < s.duration && r >= 0.0 && r.is_finite()));
    assert!(s.bursts.iter().all(|b| b.at + b.over <= s.duration && b.requests > 0));
    assert!(s.sweep.len() <= scenario::SWEEP_KEYS.len());
    if let Some((p, after)) = s.client.cancel {
        assert!(p > 0.0 && p <= 1.0 && !after.is_zero());
    }
    assert!(b.volume_guard.is_none_or(|(n, d)| n > 0 && !d.is_zero()));
    for u in &s.upstreams {
        assert!(u.capacity.is_none_or(|c| c.concurrent > 0));
        assert!(u.breaker.as_ref().is_none_or(|b| b.keyed_by.is_none()));
    }
    for (i, u) in s.upstreams.iter().enumerate() {
        assert!(!u.name.is_empty() && u.name.trim() == u.name);
        assert!(!u.name.contains(['"', '\\']) && !u.name.chars().any(char::is_control));
        assert!(
            s.upstreams[..i].iter().all(|o| o.name != u.name),
            "{:?} twice",
            u.name
        );
        let good = match u.cost {
            Cost::PerRequest { usd } => usd,
            Cost::PerToken {
                input_usd,
                output_usd,
            } => input_usd + output_usd,
        };
        assert!(good.is_finite() && good >= 0.0);
        assert!(!u.phases.is_empty());
        assert!(u.phases[0].from.is_zero());
        assert!(u.phases.windows(2).all(|w| w[0].from < w[1].from));
        for (j, phase) in u.phases.iter().enumerate() {
            assert!(!phase.responses.is_empty());
            let sum: f64 = phase.responses.iter().map(|r| r.p).sum();
            assert!((sum - 1.0).abs() <= 1e-9, "probabilities add up to {sum}");
            for r in &phase.responses {
                assert!((0.0..=1.0).contains(&r.p));
                if let Kind::Status {
                    code, retry_after, ..
                } = r.kind
                {
                    assert!((200..=599).contains(&code));
                    assert!(retry_after.is_none_or(|w| w <= TEN_YEARS));
                }
            }
            // Every draw picks a response that can be drawn.
            for u in [0.0, 0.25, 0.5, 0.75, 0.999_999, 1.0 - f64::EPSILON / 2.0] {
                let kind = phase.draw(phase.from, u, 0.5, 0.5);
                assert!(phase.responses.iter().any(|r| r.p > 0.0
                    && std::mem::discriminant(&r.kind) == std::mem::discriminant(&kind)));
                assert!(kind.latency().is_none_or(|l| l <= TEN_YEARS));
            }
            for r in &phase.responses {
                let billed = u.cost.billed(s.billing.generated(r.kind, Duration::MAX));
                assert!(billed.is_finite() && billed >= 0.0 && billed <= good + 1e-9);
            }
            // The phase in force at its start is itself.
            assert!(std::ptr::eq(u.phase_at(phase.from), phase), "phase {j}");
        }
        let _ = u.phase_at(Duration::MAX);
        let _ = u.phase_at(s.duration);
        let _ = (u.healed_at(s.answer_within()), s.outage());
    }
}

/// The shipped scenarios, starting points for edits.
const BASES: &[&str] = &[
    include_str!("../../scenarios/seed-000-night.toml"),
    include_str!("../../scenarios/seed-000-night-slow.toml"),
    include_str!("../../scenarios/seed-002-failover.toml"),
    include_str!("../../scenarios/seed-002-failover-slow.toml"),
    include_str!("../../scenarios/seed-000-writeup.toml"),
    include_str!("../../scenarios/seed-002-writeup.toml"),
    include_str!("../../scenarios/brownout-ramp.toml"),
    include_str!("../../scenarios/regional-outage-keyed.toml"),
    include_str!("../../scenarios/sse-midstream-overload.toml"),
    include_str!("../../scenarios/429-storm-capacity.toml"),
    include_str!("../../scenarios/runaway-retry-loop.toml"),
    include_str!("../../scenarios/replicas-shared-breaker.toml"),
];

/// A shipped scenario with a few lines edited: a value (after one of the
/// line's `= `) set to an arbitrary number or text, a line dropped or
/// repeated. Most edits keep the file close to valid, so the checks on
/// accepted scenarios run often.
fn edited(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    let mut lines: Vec<String> = u.choose(BASES)?.lines().map(str::to_owned).collect();
    for _ in 0..u.int_in_range(0..=6)? {
        let i = u.choose_index(lines.len())?;
        let value = match u.int_in_range(0..=4u8)? {
            0 => match f64::arbitrary(u)? {
                x if x.is_nan() => "nan".to_owned(),
                x if x.is_infinite() => if x > 0.0 { "inf" } else { "-inf" }.to_owned(),
                x => format!("{x:?}"),
            },
            1 => i64::arbitrary(u)?.to_string(),
            2 => String::arbitrary(u)?,
            3 => {
                lines.remove(i);
                continue;
            }
            _ => {
                let line = lines[u.choose_index(lines.len())?].clone();
                lines.insert(i, line);
                continue;
            }
        };
        let line = &mut lines[i];
        let eqs: Vec<usize> = line.match_indices("= ").map(|(at, _)| at + 2).collect();
        if let Some(&start) = eqs.get(u.choose_index(eqs.len().max(1))?) {
            let end = line[start..]
                .find([',', '}'])
                .map_or(line.len(), |e| start + e);
            let space = if end < line.len() { " " } else { "" };
            line.replace_range(start..end, &format!("{value}{space}"));
        }
    }
    Ok(lines.join("\n"))
}

fuzz_target!(|bytes: &[u8]| {
    // A leading 0x01 (never in a scenario file) asks for an edited shipped
    // scenario; anything else is the file's text, read lossily.
    let text = match bytes.split_first() {
        Some((1, rest)) => match edited(&mut Unstructured::new(rest)) {
            Ok(text) => text.into(),
            Err(_) => return,
        },
        _ => String::from_utf8_lossy(bytes),
    };
    match scenario::parse(&text, FILE) {
        Ok(s) => check(&s),
        Err(e) => {
            assert_eq!(e.file, FILE);
            assert!(!e.message.is_empty());
            if let Some(line) = e.line {
                assert!(
                    line >= 1 && line <= text.matches('\n').count() + 1,
                    "line {line}: {e}"
                );
            }
            assert!(e.to_string().starts_with(FILE));
        }
    }
});
