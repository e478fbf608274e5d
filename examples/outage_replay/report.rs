//! The replay's outputs: a table for people, JSON for programs, an SVG
//! timeline.

use std::fmt::Write as _;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::engine::{ClassRun, Fate, Replay, StackRun};
use crate::figures::{belongs, Figures, Waits};
use crate::scenario::{Figure, Writeup};

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

fn stack_window(s: &StackRun, class: Option<usize>, w: Window) -> Option<&Figures> {
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
                            };
                            (r.upstream.as_str(), json)
                        })
                        .collect(),
                ),
                by_key: (!s.by_class.is_empty()).then(|| {
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

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 210.0;
const RIGHT: f64 = 110.0;
/// Height of a stack's stacked request bars.
const BARS: f64 = 56.0;
/// Height of a stack's wait chart.
const WAITS: f64 = 36.0;
const BAND: f64 = 10.0;
const GAP: f64 = 8.0;
/// Most breaker state rows drawn per stack (keys, replicas).
const MAX_BANDS: usize = 8;
/// A state shorter than this many pixels is drawn this wide.
const MIN_STATE_PX: f64 = 3.0;

pub const OK: &str = "#3b7dd8";
pub const FAILED: &str = "#d7263d";
pub const RATE_LIMITED: &str = "#f49d37";
pub const REJECTED: &str = "#8d8d8d";
pub const CLOSED: &str = "#b9e4b9";
pub const OPEN: &str = "#5a2a82";
pub const HALF_OPEN: &str = "#f2c500";
pub const HEALTHY: &str = "#dcefdc";
pub const FAILING: &str = "#7f0000";
pub const SLOW: &str = "#b07aa1";
const STACK_COLOURS: [&str; 8] = [
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#444444",
];

/// Where each stack's request bars were drawn (top and bottom y), for
/// checks on the rendered picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub width: f64,
    pub height: f64,
    pub bars: Vec<(String, f64, f64)>,
    /// Where the legend starts: everything above it is data.
    pub legend: f64,
}

/// The post-mortem figure.
pub fn svg(replay: &Replay) -> String {
    svg_with_layout(replay).0
}

/// What an upstream's phase is, as the figure's ground truth.
fn truth(
    phase: &crate::scenario::Phase,
    within: std::time::Duration,
) -> (&'static str, &'static str) {
    use crate::scenario::Kind;
    let live = || phase.responses.iter().filter(|r| r.p > 0.0);
    let failing: f64 = live().filter(|r| r.kind.is_failure()).map(|r| r.p).sum();
    let limited: f64 = live()
        .filter(|r| matches!(r.kind, Kind::Status { code: 429, .. }))
        .map(|r| r.p)
        .sum();
    if failing > 0.01 + 1e-12 {
        ("failing", FAILING)
    } else if !phase.is_healthy(within) {
        ("slow", SLOW)
    } else if limited > 0.01 + 1e-12 {
        ("rate limited", RATE_LIMITED)
    } else {
        ("healthy", HEALTHY)
    }
}

/// A bin width that reads well: about 200 bins over the run.
fn bin_width(end: f64) -> f64 {
    [
        0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|&w| end / w <= 200.0)
    .unwrap_or_else(|| (end / 200.0).ceil())
}

/// The figure and where its rows are: per upstream the ground truth; per
/// stack its requests by arrival bin, stacked by how they ended, on one
/// scale for all stacks, the answered p50 and p99 wait per bin, and its
/// breakers' states; the cumulative cost of every stack.
pub fn svg_with_layout(replay: &Replay) -> (String, Layout) {
    let setup = &replay.setup;
    let end = replay
        .stacks
        .iter()
        .flat_map(|s| s.transitions.iter().map(|t| t.t_s))
        .fold(replay.duration_s, f64::max)
        .max(1.0);
    let plot = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + plot * (t / end).clamp(0.0, 1.0);
    let width = bin_width(end);
    let bins = (end / width).ceil() as usize;
    let bin_of = |t: f64| ((t / width) as usize).min(bins - 1);
    let bin_px = plot * width / end;

    let mut body = String::new();
    let mut layout = Layout {
        width: WIDTH,
        height: 0.0,
        bars: Vec::new(),
        legend: 0.0,
    };
    let _ = writeln!(
        body,
        r##"<text x="8" y="22" font-size="15" font-weight="bold">outage replay: {} (seed {}), {} requests over {:.0} s</text>"##,
        esc(&replay.scenario),
        replay.seed,
        replay.arrivals_s.len(),
        replay.duration_s
    );
    let _ = writeln!(
        body,
        r##"<text x="8" y="40" font-size="11" fill="#444">bin width {} s; requests by arrival bin, by how they ended (one scale for every stack); answered wait p50 and p99 of the requests that arrived in the bin</text>"##,
        fmt_num(width)
    );
    let mut y = 56.0;

    // Ground truth, the same for every stack.
    let within = setup.answer_within();
    let _ = writeln!(
        body,
        r##"<text x="8" y="{:.1}" font-size="12" font-weight="bold">ground truth</text>"##,
        y + 9.0
    );
    for u in &setup.upstreams {
        let label = match u.capacity {
            Some(c) => format!("{} (capacity {} + queue {})", u.name, c.concurrent, c.queue),
            None => u.name.clone(),
        };
        let _ = writeln!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            LEFT - 6.0,
            y + BAND - 1.0,
            esc(&label)
        );
        for phase in &u.phases {
            let (what, colour) = truth(phase, within);
            let (from, to) = (phase.from.as_secs_f64(), phase.until.as_secs_f64().max(end));
            let to = u
                .phases
                .iter()
                .find(|p| p.from > phase.from)
                .map_or(to, |p| p.from.as_secs_f64());
            let _ = writeln!(
                body,
                r##"<rect x="{:.2}" y="{y:.1}" width="{:.2}" height="{BAND}" fill="{colour}"><title>{} {what} from {from:.1} s</title></rect>"##,
                x(from),
                (x(to) - x(from)).max(MIN_STATE_PX),
                esc(&u.name)
            );
        }
        y += BAND + 3.0;
    }
    y += GAP;

    // One scale for every stack: the most requests that arrived in a bin.
    let mut arrivals = vec![0u64; bins];
    for &t in &replay.arrivals_s {
        arrivals[bin_of(t)] += 1;
    }
    let most = arrivals.iter().copied().max().unwrap_or(1).max(1) as f64;
    let answered_p = |s: &crate::engine::StackRun, p: f64| -> Vec<Option<f64>> {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); bins];
        for r in s.requests.iter().filter(|r| r.fate == Fate::Succeeded) {
            per[bin_of(r.arrival_s)].push(r.wait_s);
        }
        per.into_iter()
            .map(|mut w| {
                w.sort_by(f64::total_cmp);
                (!w.is_empty())
                    .then(|| w[((p * w.len() as f64).ceil() as usize).clamp(1, w.len()) - 1])
            })
            .collect()
    };
    let p99s: Vec<Vec<Option<f64>>> = replay.stacks.iter().map(|s| answered_p(s, 0.99)).collect();
    let slowest = p99s
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(0.0, f64::max)
        .max(0.1);

    for (si, stack) in replay.stacks.iter().enumerate() {
        let _ = writeln!(
            body,
            r##"<text x="8" y="{:.1}" font-size="13" font-weight="bold">{}</text><text x="{LEFT}" y="{:.1}" font-size="11" fill="#444">{} ok, {} failed ({} rate limited, {} given up), {} rejected; answered p99 {}; cost ${:.2}, wasted ${:.2}</text>"##,
            y + 10.0,
            esc(stack.name),
            y + 10.0,
            stack.all.succeeded,
            stack.all.failed,
            stack.all.rate_limited,
            stack.all.cancelled,
            stack.all.rejected,
            secs(stack.all.answered_wait.map(|w| w.p99_s)),
            stack.all.cost_usd,
            stack.all.wasted_cost_usd
        );
        y += 16.0;
        // Requests by arrival bin, stacked: ok, failed, rate limited, rejected.
        let mut stacks = vec![[0u64; 4]; bins];
        for r in &stack.requests {
            let which = match r.fate {
                Fate::Succeeded => 0,
                Fate::Failed if r.rate_limited => 2,
                Fate::Failed => 1,
                Fate::Rejected => 3,
            };
            stacks[bin_of(r.arrival_s)][which] += 1;
        }
        let _ = writeln!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">requests per bin</text><text x="{:.1}" y="{:.1}" font-size="9" fill="#666" text-anchor="end">scale: {most:.0} per bin</text>"##,
            LEFT - 6.0,
            y + BARS / 2.0,
            LEFT - 6.0,
            y + BARS / 2.0 + 11.0
        );
        for (b, counts) in stacks.iter().enumerate() {
            let mut top = y + BARS;
            for (n, colour) in counts.iter().zip([OK, FAILED, RATE_LIMITED, REJECTED]) {
                if *n == 0 {
                    continue;
                }
                let h = BARS * *n as f64 / most;
                top -= h;
                let _ = writeln!(
                    body,
                    r##"<rect x="{:.2}" y="{top:.2}" width="{:.2}" height="{h:.2}" fill="{colour}"/>"##,
                    LEFT + b as f64 * bin_px,
                    bin_px
                );
            }
        }
        layout.bars.push((stack.name.to_owned(), y, y + BARS));
        y += BARS + 4.0;
        // Answered waits over time, one scale for every stack.
        let _ = writeln!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">answered wait p50, p99</text><text x="{:.1}" y="{:.1}" font-size="9" fill="#666" text-anchor="end">scale: 0 to {} s</text><line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#bbb" stroke-width="0.5"/>"##,
            LEFT - 6.0,
            y + WAITS / 2.0,
            LEFT - 6.0,
            y + WAITS / 2.0 + 11.0,
            fmt_num((slowest * 100.0).round() / 100.0),
            WIDTH - RIGHT,
            y + WAITS,
            y + WAITS
        );
        for (values, colour, dash) in [
            (
                answered_p(stack, 0.5),
                "#555555",
                r#" stroke-dasharray="3,2""#,
            ),
            (p99s[si].clone(), "#000000", ""),
        ] {
            let points: Vec<String> = values
                .iter()
                .enumerate()
                .filter_map(|(b, v)| {
                    v.map(|v| {
                        format!(
                            "{:.1},{:.1}",
                            LEFT + (b as f64 + 0.5) * bin_px,
                            y + WAITS - WAITS * v / slowest
                        )
                    })
                })
                .collect();
            if !points.is_empty() {
                let _ = writeln!(
                    body,
                    r##"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1"{dash}/>"##,
                    points.join(" ")
                );
            }
        }
        y += WAITS + 6.0;
        // Breaker states.
        // Every breaker that changed state, and every upstream's breaker
        // that never did (closed throughout).
        let mut labels: Vec<&str> = Vec::new();
        let has_breakers = !matches!(stack.name, "no-breaker" | "naive-failover");
        for r in stack.recovery.iter().filter(|_| has_breakers) {
            let mine = stack
                .transitions
                .iter()
                .filter(|t| belongs(&t.upstream, &r.upstream));
            let before = labels.len();
            for t in mine {
                if !labels.contains(&t.upstream.as_str()) {
                    labels.push(&t.upstream);
                }
            }
            if labels.len() == before {
                labels.push(&r.upstream);
            }
        }
        for label in labels.iter().take(MAX_BANDS) {
            let _ = writeln!(
                body,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">breaker {}</text>"##,
                LEFT - 6.0,
                y + BAND - 1.0,
                esc(label)
            );
            let mut from = 0.0;
            let mut state = "closed";
            let changes = stack.transitions.iter().filter(|t| t.upstream == *label);
            // Half-open periods last, so the state after a short one does
            // not cover the width it was widened to.
            let mut rects = Vec::new();
            for (t, to) in changes.map(|t| (t.t_s, t.to)).chain([(end, "")]) {
                let w = (x(t) - x(from)).max(if state == "closed" { 0.0 } else { MIN_STATE_PX });
                rects.push((state == "half-open", format!(
                    r##"<rect x="{:.2}" y="{y:.1}" width="{w:.2}" height="{BAND}" fill="{}"><title>{state} from {from:.1} s</title></rect>"##,
                    x(from),
                    state_colour(state)
                )));
                from = t;
                state = to;
            }
            rects.sort_by_key(|(on_top, _)| *on_top);
            for (_, rect) in rects {
                let _ = writeln!(body, "{rect}");
            }
            y += BAND + 3.0;
        }
        if labels.len() > MAX_BANDS {
            let _ = writeln!(
                body,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">(+{} more breakers)</text>"##,
                LEFT - 6.0,
                y + 9.0,
                labels.len() - MAX_BANDS
            );
            y += 13.0;
        }
        y += GAP * 1.5;
    }

    // Cumulative cost, one line per stack.
    let cost_h = 70.0;
    let totals: Vec<f64> = replay.stacks.iter().map(|s| s.all.cost_usd).collect();
    let most_cost = totals.iter().copied().fold(0.0, f64::max).max(0.01);
    let _ = writeln!(
        body,
        r##"<text x="8" y="{:.1}" font-size="12" font-weight="bold">cumulative cost</text><text x="{:.1}" y="{:.1}" font-size="9" fill="#666" text-anchor="end">scale: $0 to ${most_cost:.2}</text><line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#bbb" stroke-width="0.5"/>"##,
        y + 10.0,
        LEFT - 6.0,
        y + cost_h / 2.0,
        WIDTH - RIGHT,
        y + cost_h,
        y + cost_h
    );
    for (si, stack) in replay.stacks.iter().enumerate() {
        let mut per = vec![0.0; bins];
        for a in &stack.attempt_log {
            per[bin_of(a.t_s)] += a.cost_usd;
        }
        let mut sum = 0.0;
        let mut points = vec![format!("{LEFT:.1},{:.1}", y + cost_h)];
        for (b, c) in per.iter().enumerate() {
            sum += c;
            points.push(format!(
                "{:.1},{:.1}",
                LEFT + (b as f64 + 1.0) * bin_px,
                y + cost_h - cost_h * sum / most_cost
            ));
        }
        let colour = STACK_COLOURS[si % STACK_COLOURS.len()];
        let _ = writeln!(
            body,
            r##"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" font-size="10" fill="{colour}">{} ${sum:.2}</text>"##,
            points.join(" "),
            WIDTH - RIGHT + 4.0,
            y + cost_h - cost_h * sum / most_cost + 3.0,
            esc(stack.name)
        );
    }
    y += cost_h + 8.0;

    // Time axis.
    let step = nice_step(end);
    let mut t = 0.0;
    while t <= end + 1e-9 {
        let _ = writeln!(
            body,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="50" y2="{1:.1}" stroke="#ddd" stroke-width="0.5"/><text x="{0:.1}" y="{2:.1}" font-size="10" text-anchor="middle">{3} s</text>"##,
            x(t),
            y,
            y + 12.0,
            t
        );
        t += step;
    }
    y += 34.0;
    layout.legend = y - 12.0;
    let legend = [
        (OK, "ok"),
        (FAILED, "failed"),
        (RATE_LIMITED, "rate limited (429)"),
        (REJECTED, "rejected"),
        (CLOSED, "closed"),
        (OPEN, "open"),
        (HALF_OPEN, "half-open"),
        (HEALTHY, "healthy"),
        (FAILING, "failing"),
        (SLOW, "slow"),
    ];
    let mut lx = 8.0;
    for (colour, label) in legend {
        let _ = writeln!(
            body,
            r##"<rect x="{lx:.1}" y="{:.1}" width="12" height="10" fill="{colour}" stroke="#999" stroke-width="0.3"/><text x="{:.1}" y="{:.1}" font-size="11">{label}</text>"##,
            y - 9.0,
            lx + 16.0,
            y
        );
        lx += 26.0 + label.len() as f64 * 6.2;
    }
    y += 12.0;
    layout.height = y;
    let svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y:.0}" viewBox="0 0 {WIDTH} {y:.0}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
{body}</svg>
"##
    );
    (svg, layout)
}

fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

fn state_colour(state: &str) -> &'static str {
    match state {
        "open" | "forced-open" => OPEN,
        "half-open" => HALF_OPEN,
        _ => CLOSED,
    }
}

fn nice_step(end: f64) -> f64 {
    [
        1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
    ]
    .into_iter()
    .find(|&s| end / s <= 12.0)
    .unwrap_or_else(|| (end / 12.0).ceil())
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
