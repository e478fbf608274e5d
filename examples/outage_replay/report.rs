//! The replay's outputs: a table for people, JSON for programs, an SVG
//! timeline.

use std::fmt::Write as _;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::engine::Replay;
use crate::figures::{Figures, Waits};
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
    let _ = writeln!(
        out,
        "{:<15} {:>8} {:>7}  {:>14} {:>7} {:>7} {:>8}  {:>9} {:>7}  {:>5} {:>9} {:>9}  attempts per upstream",
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
            "{:<15} {:>8} {:>7}  {:>14} {:>7} {:>7} {:>8}  {:>9} {:>7}  {:>5} {:>9.2} {:>9.2}  {}",
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
    for s in &replay.stacks {
        for r in &s.recovery {
            let changes: Vec<String> = s
                .transitions
                .iter()
                .filter(|t| t.upstream == r.upstream)
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
                "  {:<15} {:<18} healed {:>6}  trip {:>6}  lag {:>6}  {:>3} changes{}{}",
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
    if let Some(w) = &replay.setup.writeup {
        writeup(&mut out, replay, w);
    }
    // Padded columns leave spaces at the ends of lines; documents quoting
    // the table do not keep them.
    out.lines().fold(String::new(), |mut text, line| {
        text.push_str(line.trim_end());
        text.push('\n');
        text
    })
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
        Figure::WaitMean | Figure::WaitP99 | Figure::AnsweredWaitMean | Figure::AnsweredWaitP99 => {
            format!("{x:.2} s")
        }
        Figure::CostUsd | Figure::WastedCostUsd => format!("${x:.2}"),
        Figure::CostMultiple => format!("{x:.2}×"),
    })
}

// === JSON ===

/// The version of the JSON form; it changes when a field changes meaning or
/// goes away.
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Serialize)]
struct JsonReplay<'a> {
    schema_version: u32,
    scenario: &'a str,
    stacks: Vec<JsonStack<'a>>,
}

#[derive(Serialize)]
struct JsonStack<'a> {
    name: &'a str,
    #[serde(flatten)]
    all: JsonFigures<'a>,
    outage: Option<JsonOutage<'a>>,
    upstreams: Keyed<'a, JsonRecovery>,
    transitions: Vec<JsonTransition<'a>>,
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
    failed: u64,
    rejected: u64,
    attempts: Keyed<'a, u64>,
    user_error_rate: Option<f64>,
    answered_wait_mean_s: Option<f64>,
    answered_wait_p50_s: Option<f64>,
    answered_wait_p99_s: Option<f64>,
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
}

impl<'a> JsonFigures<'a> {
    fn of(f: &'a Figures) -> Self {
        let pick = |w: Option<Waits>, g: fn(Waits) -> f64| w.map(|w| ms(g(w)));
        JsonFigures {
            requests: f.requests,
            succeeded: f.succeeded,
            failed: f.failed,
            rejected: f.rejected,
            attempts: Keyed(f.attempts.iter().map(|(n, k)| (n.as_str(), *k)).collect()),
            user_error_rate: f.user_error_rate.map(micro),
            answered_wait_mean_s: pick(f.answered_wait, |w| w.mean_s),
            answered_wait_p50_s: pick(f.answered_wait, |w| w.p50_s),
            answered_wait_p99_s: pick(f.answered_wait, |w| w.p99_s),
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

pub fn json(replay: &Replay) -> String {
    let doc = JsonReplay {
        schema_version: SCHEMA_VERSION,
        scenario: &replay.scenario,
        stacks: replay
            .stacks
            .iter()
            .map(|s| JsonStack {
                name: s.name,
                all: JsonFigures::of(&s.all),
                outage: s.outage.as_ref().map(|f| JsonOutage {
                    from_s: ms(f.from_s),
                    to_s: ms(f.to_s),
                    figures: JsonFigures::of(f),
                }),
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
const LEFT: f64 = 220.0;
const RIGHT: f64 = 20.0;
const BINS: usize = 240;
const ROW: f64 = 46.0;
const BAND: f64 = 10.0;
const GAP: f64 = 8.0;

/// A timeline per stack: arrivals, then per upstream its attempts (failed
/// ones in red) and, for stacks with breakers, the breaker's state.
pub fn svg(replay: &Replay) -> String {
    let end = replay
        .stacks
        .iter()
        .flat_map(|s| {
            s.attempt_log
                .iter()
                .map(|a| a.t_s)
                .chain(s.transitions.iter().map(|t| t.t_s))
        })
        .fold(replay.duration_s, f64::max)
        .max(1.0);
    let plot = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + plot * (t / end).clamp(0.0, 1.0);
    let bin_of = |t: f64| ((t / end * BINS as f64) as usize).min(BINS - 1);
    let bin_w = plot / BINS as f64;

    let mut body = String::new();
    let mut y = 40.0;
    let _ = writeln!(
        body,
        r##"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">outage replay: {} (seed {}), {} requests</text>"##,
        esc(&replay.scenario),
        replay.seed,
        replay.arrivals_s.len()
    );

    // Arrivals, the same for every stack.
    let mut arrivals = vec![0u64; BINS];
    for &t in &replay.arrivals_s {
        arrivals[bin_of(t)] += 1;
    }
    histogram(&mut body, "arrivals", &arrivals, None, y, bin_w, "#777");
    y += ROW + GAP * 2.0;

    for stack in &replay.stacks {
        let _ = writeln!(
            body,
            r##"<text x="8" y="{:.1}" font-size="13" font-weight="bold">{}</text>"##,
            y + 4.0,
            esc(stack.name)
        );
        let _ = writeln!(
            body,
            r##"<text x="{LEFT}" y="{:.1}" font-size="11" fill="#444">{} ok, {} failed, {} rejected; wait mean {:.2} s, p99 {:.2} s</text>"##,
            y + 4.0,
            stack.all.succeeded,
            stack.all.failed,
            stack.all.rejected,
            stack.all.wait.map_or(0.0, |w| w.mean_s),
            stack.all.wait.map_or(0.0, |w| w.p99_s)
        );
        y += 12.0;
        for (i, (upstream, _)) in stack.all.attempts.iter().enumerate() {
            let mut all = vec![0u64; BINS];
            let mut failed = vec![0u64; BINS];
            for a in stack.attempt_log.iter().filter(|a| a.upstream == i) {
                all[bin_of(a.t_s)] += 1;
                if a.failed {
                    failed[bin_of(a.t_s)] += 1;
                }
            }
            histogram(
                &mut body,
                &format!("{upstream} attempts"),
                &all,
                Some(&failed),
                y,
                bin_w,
                "#4a7bd0",
            );
            y += ROW;
            let changes: Vec<_> = stack
                .transitions
                .iter()
                .filter(|t| &t.upstream == upstream)
                .collect();
            if stack.name == "breaker" || stack.name == "failover" {
                let _ = writeln!(
                    body,
                    r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">breaker</text>"##,
                    LEFT - 6.0,
                    y + BAND - 1.0
                );
                let mut from = 0.0;
                let mut state = "closed";
                for t in changes.iter().map(|t| (t.t_s, t.to)).chain([(end, "")]) {
                    let _ = writeln!(
                        body,
                        r##"<rect x="{:.2}" y="{:.1}" width="{:.2}" height="{BAND}" fill="{}"><title>{} from {:.1} s</title></rect>"##,
                        x(from),
                        y,
                        // Keep short states (a half-open probe cycle) visible.
                        (x(t.0) - x(from)).max(if state == "closed" { 0.0 } else { 1.0 }),
                        state_colour(state),
                        state,
                        from
                    );
                    from = t.0;
                    state = t.1;
                }
                y += BAND + GAP;
            }
        }
        y += GAP * 2.0;
    }

    // Time axis.
    let step = nice_step(end);
    let mut t = 0.0;
    while t <= end + 1e-9 {
        let _ = writeln!(
            body,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="34" y2="{1:.1}" stroke="#ddd" stroke-width="0.5"/><text x="{0:.1}" y="{2:.1}" font-size="10" text-anchor="middle">{3} s</text>"##,
            x(t),
            y,
            y + 12.0,
            t
        );
        t += step;
    }
    y += 36.0;
    let legend = [
        ("#4a7bd0", "attempts"),
        ("#d04a4a", "failed attempts"),
        (state_colour("closed"), "closed"),
        (state_colour("open"), "open"),
        (state_colour("half-open"), "half-open"),
    ];
    let mut lx = LEFT;
    for (colour, label) in legend {
        let _ = writeln!(
            body,
            r##"<rect x="{lx:.1}" y="{:.1}" width="12" height="10" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="11">{label}</text>"##,
            y - 9.0,
            lx + 16.0,
            y
        );
        lx += 30.0 + label.len() as f64 * 6.5;
    }
    y += 12.0;

    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{:.0}" viewBox="0 0 {WIDTH} {:.0}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<g>
<line x1="{LEFT}" x2="{LEFT}" y1="34" y2="{:.1}" stroke="#999"/>
</g>
{body}</svg>
"##,
        y,
        y,
        y - 36.0
    )
}

/// One row of bars scaled to its own maximum, with that maximum printed.
fn histogram(
    out: &mut String,
    label: &str,
    counts: &[u64],
    over: Option<&[u64]>,
    y: f64,
    bin_w: f64,
    colour: &str,
) {
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let h = ROW - 8.0;
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text><text x="{:.1}" y="{:.1}" font-size="9" fill="#666" text-anchor="end">max {max}/bin</text>"##,
        LEFT - 6.0,
        y + h / 2.0,
        esc(label),
        LEFT - 6.0,
        y + h / 2.0 + 11.0
    );
    for (i, &n) in counts.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let bh = h * n as f64 / max as f64;
        let bx = LEFT + i as f64 * bin_w;
        let _ = writeln!(
            out,
            r##"<rect x="{bx:.2}" y="{:.2}" width="{:.2}" height="{bh:.2}" fill="{colour}"/>"##,
            y + h - bh,
            bin_w
        );
        if let Some(over) = over {
            let f = over[i];
            if f > 0 {
                let fh = h * f as f64 / max as f64;
                let _ = writeln!(
                    out,
                    r##"<rect x="{bx:.2}" y="{:.2}" width="{:.2}" height="{fh:.2}" fill="#d04a4a"/>"##,
                    y + h - fh,
                    bin_w
                );
            }
        }
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#bbb" stroke-width="0.5"/>"##,
        WIDTH - RIGHT,
        y + h,
        y + h
    );
}

fn state_colour(state: &str) -> &'static str {
    match state {
        "open" | "forced-open" => "#d04a4a",
        "half-open" => "#e8b13a",
        _ => "#5cb85c",
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
