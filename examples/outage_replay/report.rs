//! The replay's outputs: a table for people, JSON for programs, an SVG
//! timeline.

use std::fmt::Write as _;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::engine::{ClassRun, Replay, StackRun};
use crate::figures::{belongs, Figures, Waits};
use crate::scenario::{outage_class, Figure, Writeup};

// === table ===

/// A number, or a dash for a figure there is nothing to measure for.
fn or_dash(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "—".to_owned(), f)
}

fn secs(x: Option<f64>) -> String {
    or_dash(x, |x| format!("{x:.2}s"))
}

fn figures_table(out: &mut String, stacks: &[(&str, &Figures)]) {
    let w = stacks
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(0)
        .max(15);
    let _ = writeln!(
        out,
        "{:<w$} {:>8} {:>7}  {:>14} {:>7} {:>7} {:>8}  {:>9} {:>7}  {:>5} {:>9} {:>9}  attempts per upstream",
        "stack", "requests", "errors", "answered: mean", "p50", "p99", "ttft p50", "all: mean", "p99",
        "ampl.", "cost $", "wasted $"
    );
    for (name, f) in stacks {
        let attempts = f
            .attempts
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "{:<w$} {:>8} {:>7}  {:>14} {:>7} {:>7} {:>8}  {:>9} {:>7}  {:>5} {:>9.2} {:>9.2}  {}",
            name,
            f.requests,
            or_dash(f.user_error_rate, |x| format!("{:.1}%", x * 100.0)),
            secs(f.answered_wait.map(|w| w.mean_s)),
            secs(f.answered_wait.map(|w| w.p50_s)),
            secs(f.answered_wait.map(|w| w.p99_s)),
            secs(f.answered_ttft.map(|w| w.p50_s)),
            secs(f.wait.map(|w| w.mean_s)),
            secs(f.wait.map(|w| w.p99_s)),
            or_dash(f.amplification, |x| format!("{x:.2}")),
            f.cost_usd,
            f.wasted_cost_usd,
            attempts
        );
    }
}

pub fn table(replay: &Replay) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "outage replay: {} (seed {}), {} requests over {:.0} s; upstreams: {}",
        replay.scenario,
        replay.seed,
        replay.arrivals_s.len(),
        replay.duration_s,
        replay.upstreams.join(", ")
    );
    let _ = writeln!(
        out,
        "errors: failed + rejected, of requests; answered: arrival to the end of the answer; \
         ttft: to its first byte; all: every request, errors included; ampl.: attempts per \
         request; wasted: billed for attempts whose answer the user did not get"
    );
    let _ = writeln!(out, "billing: {}", billing_text(replay));
    let _ = writeln!(out);
    let _ = writeln!(out, "every request:");
    let all: Vec<(&str, &Figures)> = replay.stacks.iter().map(|s| (s.name, &s.all)).collect();
    figures_table(&mut out, &all);
    let outage: Vec<(&str, &Figures)> = replay
        .stacks
        .iter()
        .filter_map(|s| Some((s.name, s.outage.as_ref()?)))
        .collect();
    if let Some((_, f)) = outage.first() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "the outage: requests that arrived from {:.1} s to {:.1} s, while {} was failing:",
            f.from_s, f.to_s, replay.upstreams[0]
        );
        figures_table(&mut out, &outage);
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "recovery (s): healed at, time to trip (from the first failing phase), recovery lag \
         (heal to closed for good; never: not closed at the end); breaker state changes"
    );
    let w = replay
        .stacks
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0)
        .max(15);
    for s in &replay.stacks {
        for r in &s.recovery {
            let changes: Vec<String> = s
                .transitions
                .iter()
                .filter(|t| belongs(&t.upstream, &r.upstream))
                .map(|t| format!("{} {:.1}", t.to, t.t_s))
                .collect();
            let shown = if changes.len() > 10 {
                format!(
                    "{}, … ({} more), {}",
                    changes[..8].join(", "),
                    changes.len() - 9,
                    changes[changes.len() - 1]
                )
            } else {
                changes.join(", ")
            };
            let _ = writeln!(
                out,
                "  {:<w$} {:<18} healed {:>6}  trip {:>6}  lag {:>6}  {:>3} changes{}{}",
                s.name,
                r.upstream,
                or_dash(r.healed_at_s, |x| format!("{x:.1}")),
                or_dash(r.time_to_trip_s, |x| format!("{x:.1}")),
                match (r.healed_at_s, r.recovery_lag_s) {
                    (Some(_), None) => "never".to_owned(),
                    (_, lag) => or_dash(lag, |x| format!("{x:.1}")),
                },
                changes.len(),
                if shown.is_empty() { "" } else { ": " },
                shown
            );
        }
    }
    if replay.classes.len() > 1 {
        by_class(&mut out, replay);
    }
    if let Some(w) = &replay.setup.writeup {
        writeup(&mut out, replay, w);
    }
    answers(&mut out, replay);
    // Padded columns leave spaces at the ends of lines; documents quoting
    // the table do not keep them.
    out.lines().fold(String::new(), |mut text, line| {
        text.push_str(line.trim_end());
        text.push('\n');
        text
    })
}

/// Per class of traffic (model, or model and API key), every request.
fn by_class(out: &mut String, replay: &Replay) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "by traffic (model or model/api key), every request: requests, errors, rejected, answered p99, cost"
    );
    let w = replay
        .classes
        .iter()
        .map(|c| c.len())
        .max()
        .unwrap_or(0)
        .max(18);
    let sw = replay
        .stacks
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0)
        .max(15);
    for s in &replay.stacks {
        for (class, f) in replay.classes.iter().zip(s.by_class.iter().map(|c| &c.all)) {
            let _ = writeln!(
                out,
                "  {:<sw$} {:<w$} {:>6} {:>7} {:>6} {:>8} {:>9.2}",
                s.name,
                class,
                f.requests,
                or_dash(f.user_error_rate, |x| format!("{:.1}%", x * 100.0)),
                f.rejected,
                secs(f.answered_wait.map(|w| w.p99_s)),
                f.cost_usd
            );
        }
    }
}

/// The billing assumption every cost figure rests on, in words.
pub fn billing_text(replay: &Replay) -> String {
    let b = &replay.setup.billing;
    format!(
        "cost $ and wasted $ bill what was generated: a good answer in full, a hang {:.2} of one \
         ([billing] hang; 1.00: in full), a stream cut by an error event {:.2}, a stalled stream \
         {:.2}, an error answer {:.2}; a health probe (max_tokens 1) the input and one output \
         token (per-request pricing: one request); each upstream at its own price",
        b.hang, b.stream_error, b.stall, b.error
    )
}

/// The user's deadline, in words.
pub fn deadline_text(replay: &Replay) -> String {
    let c = &replay.setup.client;
    match c.deadline {
        None => "no deadline: every answer counts".to_owned(),
        Some(d) if Some(d) == c.total_timeout => {
            format!("{:.1} s, the total timeout", d.as_secs_f64())
        }
        Some(d) => format!("{:.1} s ([client] deadline_s)", d.as_secs_f64()),
    }
}

/// Which window of a stack's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Whole,
    Outage,
    AfterHeal,
}

fn window_of(c: &ClassRun, w: Window) -> Option<&Figures> {
    match w {
        Window::Whole => Some(&c.all),
        Window::Outage => c.outage.as_ref(),
        Window::AfterHeal => c.after_heal.as_ref(),
    }
}

/// A stack's figures in window `w`, for one class of traffic or (`None`)
/// for all of it.
pub fn stack_window(s: &StackRun, class: Option<usize>, w: Window) -> Option<&Figures> {
    match class {
        Some(c) => window_of(s.by_class.get(c)?, w),
        None => match w {
            Window::Whole => Some(&s.all),
            Window::Outage => s.outage.as_ref(),
            Window::AfterHeal => s.after_heal.as_ref(),
        },
    }
}

/// What the stack without a breaker answered in the same window, for the
/// same class: the denominator of `answers_vs_no_breaker`.
pub fn no_breaker_answered(replay: &Replay, class: Option<usize>, w: Window) -> Option<u64> {
    let nb = replay.stack("no-breaker")?;
    stack_window(nb, class, w).map(|f| f.answered)
}

/// answered ÷ no breaker's answered; `None` where no breaker answered
/// nothing.
pub fn vs_no_breaker(answered: u64, no_breaker: Option<u64>) -> Option<f64> {
    no_breaker
        .filter(|&n| n > 0)
        .map(|n| answered as f64 / n as f64)
}

fn answers_cell(replay: &Replay, f: Option<&Figures>, class: Option<usize>, w: Window) -> String {
    let Some(f) = f else {
        return "—".to_owned();
    };
    let nb = no_breaker_answered(replay, class, w);
    format!(
        "{}/{} = {}",
        f.answered,
        nb.map_or_else(|| "—".to_owned(), |n| n.to_string()),
        or_dash(vs_no_breaker(f.answered, nb), |x| format!("{x:.3}"))
    )
}

/// Answers within the deadline in every window, beside no breaker's; the
/// whole run's answered p99 and max; wasted cost under both billings.
fn answers(out: &mut String, replay: &Replay) {
    let _ = writeln!(out);
    let windows = replay
        .stacks
        .first()
        .map(|s| {
            let outage = s.outage.as_ref().map_or_else(
                || "outage (none)".to_owned(),
                |f| format!("outage {:.1}–{:.1} s", f.from_s, f.to_s),
            );
            let after = s.after_heal.as_ref().map_or_else(
                || "after heal (none)".to_owned(),
                |f| format!("after heal, from {:.1} s", f.from_s),
            );
            (outage, after)
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "answers within the deadline ({}): answered / no-breaker's answered = ratio, by window \
         (after heal: requests that arrived after their upstream healed)",
        deadline_text(replay)
    );
    let sw = replay
        .stacks
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0)
        .max(15);
    let rows: Vec<(String, Option<usize>)> = std::iter::once((String::new(), None))
        .chain(
            (replay.classes.len() > 1)
                .then(|| {
                    replay
                        .classes
                        .iter()
                        .cloned()
                        .enumerate()
                        .map(|(i, c)| (c, Some(i)))
                })
                .into_iter()
                .flatten(),
        )
        .collect();
    let kw = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let cells = |s: &StackRun, class: Option<usize>| -> [String; 3] {
        [Window::Whole, Window::Outage, Window::AfterHeal]
            .map(|w| answers_cell(replay, stack_window(s, class, w), class, w))
    };
    let mut lines: Vec<(String, [String; 3])> = Vec::new();
    for (key, class) in &rows {
        for s in &replay.stacks {
            let label = if key.is_empty() {
                s.name.to_owned()
            } else {
                format!("{:<sw$} {key:<kw$}", s.name)
            };
            lines.push((label, cells(s, *class)));
        }
    }
    let lw = lines
        .iter()
        .map(|(l, _)| l.len())
        .max()
        .unwrap_or(0)
        .max(sw);
    let cw = lines
        .iter()
        .flat_map(|(_, c)| c.iter().map(String::len))
        .chain([windows.0.len(), windows.1.len(), 9])
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "  {:<lw$}  {:<cw$}  {:<cw$}  {}",
        "stack", "whole run", windows.0, windows.1
    );
    for (label, [a, b, c]) in &lines {
        let _ = writeln!(out, "  {label:<lw$}  {a:<cw$}  {b:<cw$}  {c}");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "whole run: answered wait p99 and max; wasted $ with hangs billed as [billing] hang = {:.2} \
         and with hangs unbilled",
        replay.setup.billing.hang
    );
    for s in &replay.stacks {
        let w = s.all.answered_wait;
        let _ = writeln!(
            out,
            "  {:<sw$} answered p99 {:>8} max {:>8}  wasted $ {:>9.2} | hangs unbilled {:>9.2}",
            s.name,
            secs(w.map(|w| w.p99_s)),
            secs(w.map(|w| w.max_s)),
            s.all.wasted_cost_usd,
            s.all.wasted_cost_usd_hangs_unbilled
        );
    }
}

/// The write-up's own table, its figures beside the replay's for the outage.
fn writeup(out: &mut String, replay: &Replay, w: &Writeup) {
    let _ = writeln!(out);
    let window = replay.setup.outage();
    let _ = writeln!(
        out,
        "{} (write-up | replay{}):",
        w.title,
        window.map_or(String::new(), |(from, to)| format!(
            ", requests from {:.0} s to {:.0} s",
            from.as_secs_f64(),
            to.as_secs_f64()
        ))
    );
    let label_width = w
        .rows
        .iter()
        .map(|r| r.label.chars().count())
        .max()
        .unwrap_or(0);
    let cells: Vec<Vec<String>> = w
        .rows
        .iter()
        .map(|row| {
            w.stacks
                .iter()
                .zip(&row.reported)
                .map(|(kind, reported)| {
                    let figures = replay
                        .stack(kind.name())
                        .and_then(|s| s.outage.as_ref().or(Some(&s.all)));
                    let value = figures.and_then(|f| f.figure(row.figure, &replay.setup));
                    format!("{reported} | {}", show(row.figure, value))
                })
                .collect()
        })
        .collect();
    let width = cells
        .iter()
        .flatten()
        .map(|c| c.chars().count())
        .chain(w.stacks.iter().map(|k| k.name().len()))
        .max()
        .unwrap_or(0);
    let _ = write!(out, "  {:<label_width$}", "");
    for kind in &w.stacks {
        let _ = write!(out, "  {:<width$}", kind.name());
    }
    let _ = writeln!(out);
    for (row, cells) in w.rows.iter().zip(cells) {
        let _ = write!(out, "  {:<label_width$}", row.label);
        for cell in cells {
            let _ = write!(out, "  {cell:<width$}");
        }
        let _ = writeln!(out);
    }
}

fn show(figure: Figure, value: Option<f64>) -> String {
    or_dash(value, |x| match figure {
        Figure::Requests | Figure::Errors | Figure::PrimaryAttempts => format!("{x:.0}"),
        Figure::UserErrorRate => format!("{:.1} %", x * 100.0),
        Figure::WaitMean
        | Figure::WaitP99
        | Figure::ErrorWaitMean
        | Figure::AnsweredWaitMean
        | Figure::AnsweredWaitP99 => {
            format!("{x:.2} s")
        }
        Figure::CostUsd | Figure::WastedCostUsd => format!("${x:.2}"),
        Figure::CostMultiple => format!("{x:.2}×"),
    })
}

// === JSON ===

/// The version of the JSON form; it changes when a field changes meaning or
/// goes away.
pub const SCHEMA_VERSION: u32 = 3;

#[derive(Serialize)]
struct JsonReplay<'a> {
    schema_version: u32,
    scenario: &'a str,
    seed: u64,
    /// The user's deadline; `null`: every answer counts.
    deadline_s: Option<f64>,
    billing: JsonBilling,
    stacks: Vec<JsonStack<'a>>,
}

/// The billing assumption of every cost figure.
#[derive(Serialize)]
pub struct JsonBilling {
    /// Share of a good answer billed for a hang in `cost_usd` and
    /// `wasted_cost_usd` (1: in full).
    hang: f64,
    stream_error: f64,
    stall: f64,
    error: f64,
    /// `wasted_cost_usd_hangs_unbilled` bills a hang 0.
    hangs_unbilled: f64,
    health_probe: &'static str,
    text: String,
}

#[derive(Serialize)]
struct JsonStack<'a> {
    name: &'a str,
    #[serde(flatten)]
    all: JsonFigures<'a>,
    outage: Option<JsonOutage<'a>>,
    after_heal: Option<JsonOutage<'a>>,
    upstreams: Keyed<'a, JsonRecovery>,
    transitions: Vec<JsonTransition<'a>>,
    /// Only with more than one class of traffic.
    #[serde(skip_serializing_if = "Option::is_none")]
    by_key: Option<Keyed<'a, JsonClass<'a>>>,
}

#[derive(Serialize)]
struct JsonClass<'a> {
    #[serde(flatten)]
    all: JsonFigures<'a>,
    outage: Option<JsonOutage<'a>>,
    after_heal: Option<JsonOutage<'a>>,
    /// The key's ground truth and its class, as for an upstream.
    failing_share: Option<f64>,
    class: Option<&'static str>,
}

#[derive(Serialize)]
struct JsonOutage<'a> {
    from_s: f64,
    to_s: f64,
    #[serde(flatten)]
    figures: JsonFigures<'a>,
}

#[derive(Serialize)]
struct JsonFigures<'a> {
    requests: u64,
    succeeded: u64,
    /// Answers within the deadline.
    answered: u64,
    /// The stack without a breaker's, in the same window.
    no_breaker_answered: Option<u64>,
    /// answered ÷ no_breaker_answered; `null` where that is 0.
    answers_vs_no_breaker: Option<f64>,
    failed: u64,
    rejected: u64,
    attempts: Keyed<'a, u64>,
    user_error_rate: Option<f64>,
    answered_wait_mean_s: Option<f64>,
    answered_wait_p50_s: Option<f64>,
    answered_wait_p99_s: Option<f64>,
    answered_wait_max_s: Option<f64>,
    error_wait_mean_s: Option<f64>,
    answered_ttft_mean_s: Option<f64>,
    answered_ttft_p50_s: Option<f64>,
    answered_ttft_p99_s: Option<f64>,
    wait_mean_s: Option<f64>,
    wait_p50_s: Option<f64>,
    wait_p99_s: Option<f64>,
    wait_max_s: Option<f64>,
    amplification: Option<f64>,
    cost_usd: f64,
    wasted_cost_usd: f64,
    wasted_cost_usd_hangs_unbilled: f64,
    /// Only when users gave up or were answered 429.
    #[serde(skip_serializing_if = "Option::is_none")]
    cancelled: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limited: Option<u64>,
}

impl<'a> JsonFigures<'a> {
    fn of(f: &'a Figures, no_breaker: Option<u64>) -> Self {
        let pick = |w: Option<Waits>, g: fn(Waits) -> f64| w.map(|w| ms(g(w)));
        JsonFigures {
            requests: f.requests,
            succeeded: f.succeeded,
            answered: f.answered,
            no_breaker_answered: no_breaker,
            answers_vs_no_breaker: vs_no_breaker(f.answered, no_breaker).map(micro),
            failed: f.failed,
            rejected: f.rejected,
            attempts: Keyed(f.attempts.iter().map(|(n, k)| (n.as_str(), *k)).collect()),
            user_error_rate: f.user_error_rate.map(micro),
            answered_wait_mean_s: pick(f.answered_wait, |w| w.mean_s),
            answered_wait_p50_s: pick(f.answered_wait, |w| w.p50_s),
            answered_wait_p99_s: pick(f.answered_wait, |w| w.p99_s),
            answered_wait_max_s: pick(f.answered_wait, |w| w.max_s),
            error_wait_mean_s: pick(f.error_wait, |w| w.mean_s),
            answered_ttft_mean_s: pick(f.answered_ttft, |w| w.mean_s),
            answered_ttft_p50_s: pick(f.answered_ttft, |w| w.p50_s),
            answered_ttft_p99_s: pick(f.answered_ttft, |w| w.p99_s),
            wait_mean_s: pick(f.wait, |w| w.mean_s),
            wait_p50_s: pick(f.wait, |w| w.p50_s),
            wait_p99_s: pick(f.wait, |w| w.p99_s),
            wait_max_s: pick(f.wait, |w| w.max_s),
            amplification: f.amplification.map(micro),
            cost_usd: micro(f.cost_usd),
            wasted_cost_usd: micro(f.wasted_cost_usd),
            wasted_cost_usd_hangs_unbilled: micro(f.wasted_cost_usd_hangs_unbilled),
            cancelled: (f.cancelled > 0).then_some(f.cancelled),
            rate_limited: (f.rate_limited > 0).then_some(f.rate_limited),
        }
    }
}

#[derive(Serialize)]
struct JsonRecovery {
    healed_at_s: Option<f64>,
    recovery_lag_s: Option<f64>,
    time_to_trip_s: Option<f64>,
    /// The outage's ground truth and its class (partial, between, dead).
    failing_share: Option<f64>,
    class: Option<&'static str>,
    recovery_lag_bound_s: Option<f64>,
}

#[derive(Serialize)]
struct JsonTransition<'a> {
    t_s: f64,
    upstream: &'a str,
    to: &'a str,
}

/// Values by upstream, as an object that keeps the upstreams' order.
struct Keyed<'a, T>(Vec<(&'a str, T)>);

impl<T: Serialize> Serialize for Keyed<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, v) in &self.0 {
            map.serialize_entry(name, v)?;
        }
        map.end()
    }
}

/// Milliseconds are the resolution that matters; fewer digits read better.
fn ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Rates and dollars to a millionth.
fn micro(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// The billing assumption, as the JSON states it.
pub fn json_billing(replay: &Replay) -> JsonBilling {
    let b = &replay.setup.billing;
    JsonBilling {
        hang: b.hang,
        stream_error: b.stream_error,
        stall: b.stall,
        error: b.error,
        hangs_unbilled: 0.0,
        health_probe: "the input and one output token (max_tokens 1); one request's price under \
                       per-request pricing",
        text: billing_text(replay),
    }
}

fn json_window<'a>(
    replay: &Replay,
    f: Option<&'a Figures>,
    class: Option<usize>,
    w: Window,
) -> Option<JsonOutage<'a>> {
    f.map(|f| JsonOutage {
        from_s: ms(f.from_s),
        to_s: ms(f.to_s.min(replay.duration_s)),
        figures: JsonFigures::of(f, no_breaker_answered(replay, class, w)),
    })
}

pub fn json(replay: &Replay) -> String {
    let doc = JsonReplay {
        schema_version: SCHEMA_VERSION,
        scenario: &replay.scenario,
        seed: replay.seed,
        deadline_s: replay.setup.client.deadline.map(|d| ms(d.as_secs_f64())),
        billing: json_billing(replay),
        stacks: replay
            .stacks
            .iter()
            .map(|s| JsonStack {
                name: s.name,
                all: JsonFigures::of(&s.all, no_breaker_answered(replay, None, Window::Whole)),
                outage: json_window(replay, s.outage.as_ref(), None, Window::Outage),
                after_heal: json_window(replay, s.after_heal.as_ref(), None, Window::AfterHeal),
                upstreams: Keyed(
                    s.recovery
                        .iter()
                        .map(|r| {
                            let json = JsonRecovery {
                                healed_at_s: r.healed_at_s.map(ms),
                                recovery_lag_s: r.recovery_lag_s.map(ms),
                                time_to_trip_s: r.time_to_trip_s.map(ms),
                                failing_share: r.failing_share.map(micro),
                                class: r.failing_share.map(outage_class),
                                recovery_lag_bound_s: r.lag_bound_s.map(ms),
                            };
                            (r.upstream.as_str(), json)
                        })
                        .collect(),
                ),
                by_key: (!s.by_class.is_empty()).then(|| {
                    let truth = |c: &str| replay.setup.class_failing_share(c);
                    Keyed(
                        replay
                            .classes
                            .iter()
                            .zip(&s.by_class)
                            .enumerate()
                            .map(|(i, (c, k))| {
                                let class = Some(i);
                                let json = JsonClass {
                                    all: JsonFigures::of(
                                        &k.all,
                                        no_breaker_answered(replay, class, Window::Whole),
                                    ),
                                    outage: json_window(
                                        replay,
                                        k.outage.as_ref(),
                                        class,
                                        Window::Outage,
                                    ),
                                    after_heal: json_window(
                                        replay,
                                        k.after_heal.as_ref(),
                                        class,
                                        Window::AfterHeal,
                                    ),
                                    failing_share: truth(c).map(micro),
                                    class: truth(c).map(outage_class),
                                };
                                (c.as_str(), json)
                            })
                            .collect(),
                    )
                }),
                transitions: s
                    .transitions
                    .iter()
                    .map(|t| JsonTransition {
                        t_s: ms(t.t_s),
                        upstream: &t.upstream,
                        to: t.to,
                    })
                    .collect(),
            })
            .collect(),
    };
    serde_json::to_string(&doc).unwrap_or_else(|e| format!(r#"{{"error":"{e}"}}"#))
}

// === SVG ===

// The figure has its own file; the names stay reachable from here.
#[allow(unused_imports)]
pub use crate::svg::{
    svg, svg_with_layout, Layout, CLOSED, FAILED, FAILING, HALF_OPEN, HEALTHY, OK, OPEN,
    RATE_LIMITED, REJECTED, SLOW,
};
