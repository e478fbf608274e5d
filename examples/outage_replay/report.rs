//! The replay's outputs: a table for people, JSON for programs, an SVG
//! timeline.

use std::fmt::Write as _;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::engine::{Replay, StackRun};

// === table ===

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
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<15} {:>8} {:>9} {:>8} {:>8}  {:>8} {:>7} {:>7} {:>7}  attempts per upstream",
        "stack", "requests", "succeeded", "failed", "rejected", "wait: mean", "p50", "p99", "max"
    );
    for s in &replay.stacks {
        let attempts = s
            .attempts
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "{:<15} {:>8} {:>9} {:>8} {:>8}  {:>9.2}s {:>6.2}s {:>6.2}s {:>6.2}s  {}",
            s.name,
            s.requests,
            s.succeeded,
            s.failed,
            s.rejected,
            s.wait_mean_s,
            s.wait_p50_s,
            s.wait_p99_s,
            s.wait_max_s,
            attempts
        );
    }
    let with_breakers: Vec<&StackRun> = replay
        .stacks
        .iter()
        .filter(|s| !s.transitions.is_empty())
        .collect();
    if !with_breakers.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "breaker state changes (time in s):");
    }
    for s in with_breakers {
        for upstream in &replay.upstreams {
            let changes: Vec<String> = s
                .transitions
                .iter()
                .filter(|t| &t.upstream == upstream)
                .map(|t| format!("{} {:.1}", t.to, t.t_s))
                .collect();
            if changes.is_empty() {
                continue;
            }
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
                "  {:<15} {:<18} {:>3}: {}",
                s.name,
                upstream,
                changes.len(),
                shown
            );
        }
    }
    out
}

// === JSON ===

#[derive(Serialize)]
struct JsonReplay<'a> {
    scenario: &'a str,
    stacks: Vec<JsonStack<'a>>,
}

#[derive(Serialize)]
struct JsonStack<'a> {
    name: &'a str,
    requests: u64,
    succeeded: u64,
    failed: u64,
    rejected: u64,
    attempts: Attempts<'a>,
    wait_mean_s: f64,
    wait_p50_s: f64,
    wait_p99_s: f64,
    wait_max_s: f64,
    transitions: Vec<JsonTransition<'a>>,
}

#[derive(Serialize)]
struct JsonTransition<'a> {
    t_s: f64,
    upstream: &'a str,
    to: &'a str,
}

/// Attempts by upstream, as an object that keeps the upstreams' order.
struct Attempts<'a>(&'a [(String, u64)]);

impl Serialize for Attempts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, n) in self.0 {
            map.serialize_entry(name, n)?;
        }
        map.end()
    }
}

/// Milliseconds are the resolution that matters; fewer digits read better.
fn ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub fn json(replay: &Replay) -> String {
    let doc = JsonReplay {
        scenario: &replay.scenario,
        stacks: replay
            .stacks
            .iter()
            .map(|s| JsonStack {
                name: s.name,
                requests: s.requests,
                succeeded: s.succeeded,
                failed: s.failed,
                rejected: s.rejected,
                attempts: Attempts(&s.attempts),
                wait_mean_s: ms(s.wait_mean_s),
                wait_p50_s: ms(s.wait_p50_s),
                wait_p99_s: ms(s.wait_p99_s),
                wait_max_s: ms(s.wait_max_s),
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
            stack.succeeded,
            stack.failed,
            stack.rejected,
            stack.wait_mean_s,
            stack.wait_p99_s
        );
        y += 12.0;
        for (i, (upstream, _)) in stack.attempts.iter().enumerate() {
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
