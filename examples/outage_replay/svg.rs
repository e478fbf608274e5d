//! The post-mortem figure (`--svg`): one panel per quantity, each on its
//! own scale, with the outage and heal marked across every panel.
//!
//! Per upstream the ground truth the script sets; per stack its requests by
//! how they ended (answers by the upstream that gave them), its attempts per
//! upstream (attempts an upstream refused for load while its script says it
//! answers are drawn apart), its answered p50 and p99 wait (a gap where no
//! request of the bin was answered) and its breakers' states; the
//! cumulative cost of every stack. Every label is measured before it is
//! placed (`Label`): one that would overlap another or leave the picture is
//! moved or left out.

use std::fmt::Write as _;
use std::time::Duration;

use crate::engine::{AttemptRecord, Fate, Replay, StackRun};
use crate::figures::belongs;
use crate::scenario::{Kind, Phase, Upstream};

// === palette ===
//
// Okabe and Ito's colour-blind safe colours, and greys: healthy (green) and
// a closed breaker (light grey) are far apart, failed (vermillion) and
// rejected (grey) differ in hue and lightness.

/// An answer, from the first upstream.
pub const OK: &str = "#0072b2";
/// Answers by the second, third and fourth upstream.
pub const ANSWERED_BY: [&str; 4] = [OK, "#56b4e9", "#a9d5f0", "#2b4f6e"];
pub const FAILED: &str = "#d55e00";
pub const RATE_LIMITED: &str = "#e69f00";
pub const REJECTED: &str = "#9a9a9a";
/// An attempt the upstream did not fail.
pub const ATTEMPT: &str = "#8cb0cf";
/// An attempt refused for load while the script says the upstream answers.
pub const REFUSED_BY_LOAD: &str = "#000000";
pub const CLOSED: &str = "#e4e4e4";
pub const OPEN: &str = "#7b3294";
pub const HALF_OPEN: &str = "#f0e442";
pub const HEALTHY: &str = "#009e73";
pub const FAILING: &str = "#6e2c00";
pub const SLOW: &str = "#cc79a7";
const STACK_COLOURS: [&str; 8] = [
    "#000000", "#e69f00", "#0072b2", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#7b3294",
];
const MARKER: &str = "#333333";

// === geometry ===

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 215.0;
/// Height of a stack's request bars.
const BARS: f64 = 56.0;
/// Height of one upstream's attempt bars.
const ATTEMPTS: f64 = 20.0;
/// Height of a stack's wait chart.
const WAITS: f64 = 48.0;
const BAND: f64 = 10.0;
const GAP: f64 = 8.0;
const COST: f64 = 80.0;
/// Most breaker state rows drawn per stack (keys, replicas).
const MAX_BANDS: usize = 8;
/// A state shorter than this many pixels is drawn this wide.
const MIN_STATE_PX: f64 = 3.0;
/// Width of a character as a share of the font size: DejaVu Sans's widest
/// common glyphs (digits, most lower case) are 0.61 to 0.64 em; bold ones
/// 0.70.
const CHAR_EM: f64 = 0.64;
const BOLD_CHAR_EM: f64 = 0.72;

/// Where a text label was drawn: its box, as estimated from its length and
/// font size.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub text: String,
    pub x0: f64,
    pub y0: f64,
    pub x1: f64,
    pub y1: f64,
}

impl Label {
    pub fn overlaps(&self, other: &Label) -> bool {
        self.x0 < other.x1 && other.x0 < self.x1 && self.y0 < other.y1 && other.y0 < self.y1
    }
}

/// One panel: a quantity over time, on its own scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The stack it belongs to (`None`: every stack's).
    pub stack: Option<String>,
    pub quantity: &'static str,
    pub y0: f64,
    pub y1: f64,
}

/// One wait line as drawn: runs of adjacent bins with answers.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitLine {
    pub stack: String,
    pub p: f64,
    /// Each run, as its bins' indices.
    pub runs: Vec<Vec<usize>>,
}

/// Where everything was drawn, for checks on the rendered picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub width: f64,
    pub height: f64,
    /// Each stack's request bars (top and bottom y).
    pub bars: Vec<(String, f64, f64)>,
    /// Where the legend starts: everything above it is data.
    pub legend: f64,
    pub panels: Vec<Panel>,
    pub labels: Vec<Label>,
    pub waits: Vec<WaitLine>,
    /// The width of a bin, in seconds and in pixels.
    pub bin_s: f64,
    pub bin_px: f64,
}

/// The post-mortem figure.
pub fn svg(replay: &Replay) -> String {
    svg_with_layout(replay).0
}

/// Estimated width of `text` at `size`.
pub fn text_width(text: &str, size: f64, bold: bool) -> f64 {
    text.chars().count() as f64 * size * if bold { BOLD_CHAR_EM } else { CHAR_EM }
}

#[derive(Clone, Copy, PartialEq)]
enum Anchor {
    Start,
    Middle,
    End,
}

/// The figure being drawn: its SVG and the labels placed so far.
struct Canvas {
    body: String,
    labels: Vec<Label>,
}

impl Canvas {
    /// The box `text` would take with its baseline at `y`.
    fn measure(text: &str, x: f64, y: f64, size: f64, anchor: Anchor, bold: bool) -> Label {
        let w = text_width(text, size, bold);
        let x0 = match anchor {
            Anchor::Start => x,
            Anchor::Middle => x - w / 2.0,
            Anchor::End => x - w,
        };
        Label {
            text: text.to_owned(),
            x0,
            y0: y - size * 0.95,
            x1: x0 + w,
            y1: y + size * 0.25,
        }
    }

    fn fits(&self, label: &Label) -> bool {
        label.x0 >= 0.0
            && label.x1 <= WIDTH
            && label.y0 >= 0.0
            && !self.labels.iter().any(|l| l.overlaps(label))
    }

    /// Draws the label if it fits: inside the picture, over no other.
    fn text(&mut self, text: &str, x: f64, y: f64, size: f64, anchor: Anchor, style: &str) -> bool {
        let bold = style.contains("bold");
        let label = Canvas::measure(text, x, y, size, anchor, bold);
        if !self.fits(&label) {
            return false;
        }
        let anchor = match anchor {
            Anchor::Start => "",
            Anchor::Middle => r#" text-anchor="middle""#,
            Anchor::End => r#" text-anchor="end""#,
        };
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}"{anchor}{style}>{}</text>"#,
            esc(text)
        );
        self.labels.push(label);
        true
    }

    /// A label at the left of a row, shrunk until it fits.
    fn row_label(&mut self, text: &str, y: f64, size: f64, style: &str) {
        let mut size = size;
        while size >= 7.0 {
            if self.text(text, LEFT - 6.0, y, size, Anchor::End, style) {
                return;
            }
            size -= 1.0;
        }
    }

    fn raw(&mut self, s: std::fmt::Arguments<'_>) {
        let _ = self.body.write_fmt(s);
        self.body.push('\n');
    }
}

/// What an upstream's phase is, as the figure's ground truth.
fn truth(phase: &Phase, within: Duration) -> (&'static str, &'static str) {
    let live = || phase.responses.iter().filter(|r| r.p > 0.0);
    let failing: f64 = live().filter(|r| r.kind.is_failure()).map(|r| r.p).sum();
    if failing > 0.01 + 1e-12 {
        ("failing", FAILING)
    } else if !phase.is_healthy(within) {
        ("slow", SLOW)
    } else if scripted_429(phase) > 0.01 + 1e-12 {
        ("rate limited", RATE_LIMITED)
    } else {
        ("healthy", HEALTHY)
    }
}

fn scripted_429(phase: &Phase) -> f64 {
    phase
        .responses
        .iter()
        .filter(|r| r.p > 0.0 && matches!(r.kind, Kind::Status { code: 429, .. }))
        .map(|r| r.p)
        .sum()
}

fn phase_at(u: &Upstream, t: f64) -> Option<&Phase> {
    u.phases.iter().rfind(|p| p.from.as_secs_f64() <= t)
}

/// Whether the attempt failed for load: the upstream has a capacity, its
/// script says it answers (healthy) at the time, and the attempt did not
/// answer: it waited in the queue until given up, got a 429 the script does
/// not send, or was given up while its answer was on its way.
pub fn refused_by_load(u: &Upstream, within: Duration, a: &AttemptRecord) -> bool {
    if u.capacity.is_none() || a.probe || a.answered {
        return false;
    }
    let Some(phase) = phase_at(u, a.t_s) else {
        return false;
    };
    if !phase.is_healthy(within) {
        return false;
    }
    match a.kind {
        Kind::Status { code: 429, .. } => scripted_429(phase) == 0.0,
        Kind::Ok { .. } => true,
        _ => !a.served,
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

/// The figure and where its panels, labels and wait lines are.
pub fn svg_with_layout(replay: &Replay) -> (String, Layout) {
    let setup = &replay.setup;
    let end = replay
        .stacks
        .iter()
        .flat_map(|s| s.transitions.iter().map(|t| t.t_s))
        .fold(replay.duration_s, f64::max)
        .max(1.0);
    // The right margin holds the cost labels.
    let cost_labels: Vec<String> = replay
        .stacks
        .iter()
        .map(|s| format!("{} ${:.2}", s.name, s.all.cost_usd))
        .collect();
    let right = cost_labels
        .iter()
        .map(|l| text_width(l, 10.0, false))
        .fold(60.0, f64::max)
        + 14.0;
    let plot = WIDTH - LEFT - right;
    let x = |t: f64| LEFT + plot * (t / end).clamp(0.0, 1.0);
    let width = bin_width(end);
    let bins = (end / width).ceil() as usize;
    let bin_of = |t: f64| ((t / width) as usize).min(bins - 1);
    let bin_px = plot * width / end;

    let mut c = Canvas {
        body: String::new(),
        labels: Vec::new(),
    };
    let mut layout = Layout {
        width: WIDTH,
        height: 0.0,
        bars: Vec::new(),
        legend: 0.0,
        panels: Vec::new(),
        labels: Vec::new(),
        waits: Vec::new(),
        bin_s: width,
        bin_px,
    };
    c.text(
        &format!(
            "outage replay: {} (seed {}), {} requests over {:.0} s",
            replay.scenario,
            replay.seed,
            replay.arrivals_s.len(),
            replay.duration_s
        ),
        8.0,
        20.0,
        15.0,
        Anchor::Start,
        r#" font-weight="bold""#,
    );
    c.text(
        &format!(
            "bin width {} s; each panel on its own scale; requests by arrival bin and how they ended; dashed lines: an upstream failing or healing",
            fmt_num(width)
        ),
        8.0,
        36.0,
        10.0,
        Anchor::Start,
        r##" fill="#444""##,
    );
    // Two rows for the markers' labels.
    let marker_rows = [50.0, 62.0];
    let top = 68.0;
    let mut y = top;

    // === ground truth ===
    let within = setup.answer_within();
    let y0 = y;
    c.text(
        "ground truth (the script)",
        8.0,
        y + 9.0,
        11.0,
        Anchor::Start,
        r#" font-weight="bold""#,
    );
    y += 14.0;
    for u in &setup.upstreams {
        let label = match u.capacity {
            Some(cap) => format!(
                "{} ({} slots + {} queue)",
                u.name, cap.concurrent, cap.queue
            ),
            None => u.name.clone(),
        };
        c.row_label(&label, y + BAND - 1.0, 10.0, "");
        for phase in &u.phases {
            let (what, colour) = truth(phase, within);
            let from = phase.from.as_secs_f64();
            let to = u
                .phases
                .iter()
                .find(|p| p.from > phase.from)
                .map_or(end, |p| p.from.as_secs_f64());
            c.raw(format_args!(
                r##"<rect x="{:.2}" y="{y:.1}" width="{:.2}" height="{BAND}" fill="{colour}"><title>{} {what} from {from:.1} s</title></rect>"##,
                x(from),
                (x(to) - x(from)).max(MIN_STATE_PX),
                esc(&u.name)
            ));
        }
        y += BAND + 3.0;
    }
    layout.panels.push(Panel {
        stack: None,
        quantity: "ground truth",
        y0,
        y1: y,
    });
    y += GAP;

    // One scale for every stack's requests: they are the same arrivals.
    let mut arrivals = vec![0u64; bins];
    for &t in &replay.arrivals_s {
        arrivals[bin_of(t)] += 1;
    }
    let most = arrivals.iter().copied().max().unwrap_or(1).max(1) as f64;
    for stack in &replay.stacks {
        y = draw_stack(
            &mut c,
            &mut layout,
            replay,
            stack,
            (y, most, bins),
            &x,
            &bin_of,
        );
    }

    // === cost ===
    let y0 = y;
    c.text(
        "cumulative cost",
        8.0,
        y + 10.0,
        11.0,
        Anchor::Start,
        r#" font-weight="bold""#,
    );
    y += 14.0;
    let most_cost = replay
        .stacks
        .iter()
        .map(|s| s.all.cost_usd)
        .fold(0.0, f64::max)
        .max(0.01);
    c.row_label(
        &format!("$0 to ${most_cost:.2}"),
        y + COST / 2.0,
        9.0,
        r##" fill="#666""##,
    );
    c.raw(format_args!(
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#bbb" stroke-width="0.5"/>"##,
        LEFT + plot,
        y + COST,
        y + COST
    ));
    let mut ends = Vec::new();
    for (si, stack) in replay.stacks.iter().enumerate() {
        let mut per = vec![0.0; bins];
        for a in &stack.attempt_log {
            per[bin_of(a.t_s)] += a.cost_usd;
        }
        let mut sum = 0.0;
        let mut points = vec![format!("{LEFT:.1},{:.1}", y + COST)];
        for (b, cost) in per.iter().enumerate() {
            sum += cost;
            points.push(format!(
                "{:.1},{:.1}",
                LEFT + (b as f64 + 1.0) * bin_px,
                y + COST - COST * sum / most_cost
            ));
        }
        let colour = STACK_COLOURS[si % STACK_COLOURS.len()];
        c.raw(format_args!(
            r##"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"##,
            points.join(" ")
        ));
        ends.push((y + COST - COST * sum / most_cost + 3.5, si));
    }
    // End labels in the order of their lines, pushed apart to one line of
    // text each, and kept inside the panel.
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let step = 12.0;
    let mut placed: Vec<(f64, usize)> = Vec::new();
    for (want, si) in ends {
        let at = placed.last().map_or(want, |(p, _)| want.max(p + step));
        placed.push((at, si));
    }
    let bottom = y + COST + 4.0;
    let over = placed.last().map_or(0.0, |(p, _)| p - bottom).max(0.0);
    for (at, si) in placed {
        let colour = STACK_COLOURS[si % STACK_COLOURS.len()];
        c.text(
            &cost_labels[si],
            LEFT + plot + 4.0,
            at - over,
            10.0,
            Anchor::Start,
            &format!(r#" fill="{colour}""#),
        );
    }
    y += COST + 6.0;
    layout.panels.push(Panel {
        stack: None,
        quantity: "cost",
        y0,
        y1: y,
    });

    // === markers, across every panel ===
    let mut marks: Vec<(f64, String)> = Vec::new();
    for (i, u) in setup.upstreams.iter().enumerate() {
        let heal = setup.heals().get(i).copied().flatten();
        if let Some(from) = u.failing_from(within) {
            let from = from.as_secs_f64();
            if from > 0.0 && from < end {
                marks.push((from, format!("{} fails {} s", u.name, fmt_num(from))));
            }
        }
        if let Some(heal) = heal {
            marks.push((heal, format!("{} heals {} s", u.name, fmt_num(heal))));
        }
    }
    marks.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (t, what) in &marks {
        c.raw(format_args!(
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="{MARKER}" stroke-width="0.9" stroke-dasharray="4,3"/>"##,
            x(*t),
            top,
            y
        ));
        // A label with no room in either row is left out; its line shows.
        let _ = marker_rows.iter().any(|&row| {
            c.text(
                what,
                x(*t) + 2.0,
                row,
                9.0,
                Anchor::Start,
                r##" fill="#333""##,
            ) || c.text(
                what,
                x(*t) - 2.0,
                row,
                9.0,
                Anchor::End,
                r##" fill="#333""##,
            )
        });
    }

    // === time axis ===
    let tick = nice_step(end);
    let mut t = 0.0;
    while t <= end + 1e-9 {
        c.raw(format_args!(
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="#ddd" stroke-width="0.5"/>"##,
            x(t),
            top,
            y
        ));
        c.text(
            &format!("{} s", fmt_num(t)),
            x(t),
            y + 12.0,
            10.0,
            Anchor::Middle,
            "",
        );
        t += tick;
    }
    y += 32.0;

    // === legend ===
    layout.legend = y - 14.0;
    let mut legend: Vec<(&str, String)> = Vec::new();
    let answering = answering_upstreams(replay);
    for (i, name) in setup.upstreams.iter().map(|u| &u.name).enumerate() {
        if answering.contains(&i) {
            legend.push((
                ANSWERED_BY[i % ANSWERED_BY.len()],
                format!("answered by {name}"),
            ));
        }
    }
    for (colour, label) in [
        (FAILED, "failed"),
        (RATE_LIMITED, "rate limited (429)"),
        (REJECTED, "rejected (open or shedding)"),
        (ATTEMPT, "attempt not failed"),
        (REFUSED_BY_LOAD, "refused for load (script: answers)"),
        (CLOSED, "closed (or shedding)"),
        (OPEN, "open"),
        (HALF_OPEN, "half-open"),
        (HEALTHY, "healthy"),
        (SLOW, "slow"),
        (FAILING, "failing"),
    ] {
        legend.push((colour, label.to_owned()));
    }
    let mut lx = 8.0;
    for (colour, label) in legend {
        let w = 16.0 + text_width(&label, 10.0, false) + 12.0;
        if lx + w > WIDTH - 8.0 {
            lx = 8.0;
            y += 16.0;
        }
        c.raw(format_args!(
            r##"<rect x="{lx:.1}" y="{:.1}" width="12" height="10" fill="{colour}" stroke="#999" stroke-width="0.3"/>"##,
            y - 9.0
        ));
        c.text(&label, lx + 16.0, y, 10.0, Anchor::Start, "");
        lx += w;
    }
    y += 16.0;
    let w0 = 8.0;
    c.raw(format_args!(
        r##"<line x1="{w0}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#555" stroke-width="1" stroke-dasharray="3,2"/><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#000" stroke-width="1.2"/>"##,
        w0 + 20.0,
        y - 4.0,
        y - 4.0,
        w0 + 140.0,
        w0 + 160.0,
        y - 4.0,
        y - 4.0
    ));
    c.text("answered wait p50", w0 + 24.0, y, 10.0, Anchor::Start, "");
    c.text("answered wait p99", w0 + 164.0, y, 10.0, Anchor::Start, "");
    c.raw(format_args!(
        r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="{MARKER}" stroke-width="0.9" stroke-dasharray="4,3"/>"##,
        w0 + 300.0,
        y - 10.0,
        y + 1.0
    ));
    c.text(
        "the script: an upstream starts failing, or is healed",
        w0 + 306.0,
        y,
        10.0,
        Anchor::Start,
        "",
    );
    y += 10.0;
    layout.height = y;
    layout.labels = c.labels;
    let svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y:.0}" viewBox="0 0 {WIDTH} {y:.0}" font-family="DejaVu Sans, Verdana, sans-serif">
<rect width="100%" height="100%" fill="white"/>
{}</svg>
"##,
        c.body
    );
    (svg, layout)
}

/// The upstreams that answered a request of some stack.
fn answering_upstreams(replay: &Replay) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for s in &replay.stacks {
        for a in s.attempt_log.iter().filter(|a| a.answered && !a.probe) {
            if !out.contains(&a.upstream) {
                out.push(a.upstream);
            }
        }
    }
    out.sort_unstable();
    out
}

/// Per request, the upstream whose answer reached its user.
fn answered_by(stack: &StackRun) -> Vec<Option<usize>> {
    let mut by = vec![None; stack.requests.len()];
    for a in stack.attempt_log.iter().filter(|a| a.answered && !a.probe) {
        if let Some(slot) = by.get_mut(a.request) {
            *slot = Some(a.upstream);
        }
    }
    by
}

/// One stack's panels, from `y`; returns where the next starts.
fn draw_stack(
    c: &mut Canvas,
    layout: &mut Layout,
    replay: &Replay,
    stack: &StackRun,
    (mut y, most, bins): (f64, f64, usize),
    x: &dyn Fn(f64) -> f64,
    bin_of: &dyn Fn(f64) -> usize,
) -> f64 {
    let setup = &replay.setup;
    let bin_px = layout.bin_px;
    let name = stack.name.to_owned();
    let panel = |layout: &mut Layout, quantity, y0, y1| {
        layout.panels.push(Panel {
            stack: Some(name.clone()),
            quantity,
            y0,
            y1,
        })
    };
    let after_heal = stack
        .after_heal
        .as_ref()
        .map(|f| format!(", {} rejected after the heal", f.rejected))
        .unwrap_or_default();
    c.text(
        stack.name,
        8.0,
        y + 10.0,
        12.0,
        Anchor::Start,
        r#" font-weight="bold""#,
    );
    let summary = format!(
        "{} ok, {} failed ({} rate limited, {} given up), {} rejected{after_heal}; cost ${:.2}, wasted ${:.2}",
        stack.all.succeeded,
        stack.all.failed,
        stack.all.rate_limited,
        stack.all.cancelled,
        stack.all.rejected,
        stack.all.cost_usd,
        stack.all.wasted_cost_usd
    );
    let _ = c.text(
        &summary,
        LEFT,
        y + 10.0,
        10.0,
        Anchor::Start,
        r##" fill="#444""##,
    ) || c.text(
        &summary,
        LEFT,
        y + 10.0,
        8.0,
        Anchor::Start,
        r##" fill="#444""##,
    );
    y += 16.0;

    // === requests, by how they ended ===
    let by = answered_by(stack);
    let k = setup.upstreams.len().max(1);
    // ok by upstream (k), failed, rate limited, rejected.
    let mut counts = vec![vec![0u64; k + 3]; bins];
    for (r, by) in stack.requests.iter().zip(&by) {
        let which = match r.fate {
            Fate::Succeeded => by.unwrap_or(r.upstream).min(k - 1),
            Fate::Failed if r.rate_limited => k + 1,
            Fate::Failed => k,
            Fate::Rejected => k + 2,
        };
        counts[bin_of(r.arrival_s)][which] += 1;
    }
    let mut colours: Vec<&str> = (0..k).map(|i| ANSWERED_BY[i % ANSWERED_BY.len()]).collect();
    colours.extend([FAILED, RATE_LIMITED, REJECTED]);
    c.row_label("requests per bin", y + BARS / 2.0, 10.0, "");
    c.row_label(
        &format!("0 to {most:.0} per bin"),
        y + BARS / 2.0 + 12.0,
        9.0,
        r##" fill="#666""##,
    );
    for (b, counts) in counts.iter().enumerate() {
        let mut top = y + BARS;
        for (n, colour) in counts.iter().zip(&colours) {
            if *n == 0 {
                continue;
            }
            let h = BARS * *n as f64 / most;
            top -= h;
            c.raw(format_args!(
                r##"<rect x="{:.2}" y="{top:.2}" width="{:.2}" height="{h:.2}" fill="{colour}"/>"##,
                LEFT + b as f64 * bin_px,
                bin_px
            ));
        }
    }
    layout.bars.push((name.clone(), y, y + BARS));
    panel(layout, "requests", y, y + BARS);
    y += BARS + 6.0;

    // === attempts, per upstream ===
    let users: Vec<&AttemptRecord> = stack.attempt_log.iter().filter(|a| !a.probe).collect();
    let probes = stack.attempt_log.len() - users.len();
    let called: Vec<usize> = (0..k)
        .filter(|&i| stack.attempt_log.iter().any(|a| a.upstream == i))
        .collect();
    // not failed, failed, rate limited, refused for load.
    let mut per = vec![vec![[0u64; 4]; bins]; k];
    let mut refused = 0u64;
    for a in &stack.attempt_log {
        let u = &setup.upstreams[a.upstream.min(k - 1)];
        let which = if refused_by_load(u, setup.answer_within(), a) {
            refused += 1;
            3
        } else if a.failed {
            1
        } else if matches!(a.kind, Kind::Status { code: 429, .. }) {
            2
        } else {
            0
        };
        per[a.upstream.min(k - 1)][bin_of(a.t_s)][which] += 1;
    }
    let most_attempts = called
        .iter()
        .flat_map(|&i| per[i].iter().map(|b| b.iter().sum::<u64>()))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let y0 = y;
    let per_request = if stack.requests.is_empty() {
        0.0
    } else {
        users.len() as f64 / stack.requests.len() as f64
    };
    let probes = if probes > 0 {
        format!(" and {probes} health probes")
    } else {
        String::new()
    };
    let load = if refused > 0 {
        format!("; {refused} refused for load while the script says the upstream answers")
    } else {
        String::new()
    };
    c.row_label("attempts per bin", y + 9.0, 10.0, "");
    let head = format!(
        "0 to {most_attempts:.0} per bin: {} attempts ({per_request:.2} per request){probes}{load}",
        users.len()
    );
    let _ = c.text(
        &head,
        LEFT,
        y + 9.0,
        9.0,
        Anchor::Start,
        r##" fill="#444""##,
    ) || c.text(
        &head,
        LEFT,
        y + 9.0,
        7.5,
        Anchor::Start,
        r##" fill="#444""##,
    );
    y += 12.0;
    for &i in &called {
        c.row_label(
            &format!("to {}", setup.upstreams[i].name),
            y + ATTEMPTS - 5.0,
            9.0,
            "",
        );
        c.raw(format_args!(
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ccc" stroke-width="0.5"/>"##,
            LEFT + bin_px * bins as f64,
            y + ATTEMPTS,
            y + ATTEMPTS
        ));
        for (b, counts) in per[i].iter().enumerate() {
            let mut top = y + ATTEMPTS;
            for (n, colour) in counts
                .iter()
                .zip([ATTEMPT, FAILED, RATE_LIMITED, REFUSED_BY_LOAD])
            {
                if *n == 0 {
                    continue;
                }
                let h = ATTEMPTS * *n as f64 / most_attempts;
                top -= h;
                c.raw(format_args!(
                    r##"<rect x="{:.2}" y="{top:.2}" width="{:.2}" height="{h:.2}" fill="{colour}"/>"##,
                    LEFT + b as f64 * bin_px,
                    bin_px
                ));
            }
        }
        y += ATTEMPTS + 3.0;
    }
    panel(layout, "attempts", y0, y);
    y += 4.0;

    // === answered waits, on this stack's own scale ===
    let answered_p = |p: f64| -> Vec<Option<f64>> {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); bins];
        for r in stack.requests.iter().filter(|r| r.fate == Fate::Succeeded) {
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
    let p99 = answered_p(0.99);
    let p50 = answered_p(0.5);
    // A log scale from the decade below the fastest p50 to the decade above
    // the slowest p99: a failover's 1 s to 3 s reads beside its 100 s spike.
    let fastest = p50.iter().flatten().copied().fold(f64::INFINITY, f64::min);
    let slowest = p99.iter().flatten().copied().fold(0.0, f64::max);
    let lo = if fastest.is_finite() {
        fastest.max(0.01).log10().floor()
    } else {
        -1.0
    };
    let hi = slowest.max(0.01).log10().ceil().max(lo + 1.0);
    let wait_y = |v: f64| {
        let v = v.max(10f64.powf(lo)).log10();
        y + WAITS - WAITS * (v - lo) / (hi - lo)
    };
    c.row_label("answered wait p50, p99", y + WAITS / 2.0 - 2.0, 10.0, "");
    c.row_label(
        &format!(
            "log scale, {} to {} s",
            fmt_num(10f64.powf(lo)),
            fmt_num(10f64.powf(hi))
        ),
        y + WAITS / 2.0 + 10.0,
        9.0,
        r##" fill="#666""##,
    );
    c.raw(format_args!(
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#bbb" stroke-width="0.5"/>"##,
        LEFT + bin_px * bins as f64,
        y + WAITS,
        y + WAITS,
    ));
    let mut decade = lo;
    while decade <= hi + 1e-9 {
        let at = wait_y(10f64.powf(decade));
        c.raw(format_args!(
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{at:.1}" y2="{at:.1}" stroke="#e8e8e8" stroke-width="0.5"/>"##,
            LEFT + bin_px * bins as f64,
        ));
        c.text(
            &format!("{} s", fmt_num(10f64.powf(decade))),
            LEFT + bin_px * bins as f64 + 4.0,
            at + 3.0,
            8.0,
            Anchor::Start,
            r##" fill="#666""##,
        );
        decade += 1.0;
    }
    if p99.iter().all(Option::is_none) {
        c.text(
            "no request answered",
            LEFT + 6.0,
            y + WAITS / 2.0 + 4.0,
            10.0,
            Anchor::Start,
            r##" fill="#666""##,
        );
    }
    for (p, values, colour, dash) in [
        (0.5, p50, "#555555", r#" stroke-dasharray="3,2""#),
        (0.99, p99, "#000000", ""),
    ] {
        let runs = runs_of(&values);
        for run in &runs {
            let at = |b: usize| wait_y(values[b].unwrap_or(0.0));
            // A run of one bin is drawn across its bin, so it shows.
            let points: Vec<String> = if run.len() == 1 {
                let b = run[0];
                vec![
                    format!("{:.1},{:.1}", LEFT + b as f64 * bin_px, at(b)),
                    format!("{:.1},{:.1}", LEFT + (b as f64 + 1.0) * bin_px, at(b)),
                ]
            } else {
                run.iter()
                    .map(|&b| format!("{:.1},{:.1}", LEFT + (b as f64 + 0.5) * bin_px, at(b)))
                    .collect()
            };
            c.raw(format_args!(
                r##"<polyline class="wait" points="{}" fill="none" stroke="{colour}" stroke-width="1"{dash}/>"##,
                points.join(" ")
            ));
        }
        layout.waits.push(WaitLine {
            stack: name.clone(),
            p,
            runs,
        });
    }
    panel(layout, "answered wait", y, y + WAITS);
    y += WAITS + 6.0;

    // === breaker states ===
    // Every breaker that changed state, and every upstream's breaker that
    // never did (closed throughout).
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
    let y0 = y;
    let end = replay
        .stacks
        .iter()
        .flat_map(|s| s.transitions.iter().map(|t| t.t_s))
        .fold(replay.duration_s, f64::max)
        .max(1.0);
    for label in labels.iter().take(MAX_BANDS) {
        c.row_label(&format!("breaker {label}"), y + BAND - 1.0, 10.0, "");
        let mut from = 0.0;
        let mut state = "closed";
        let changes = stack.transitions.iter().filter(|t| t.upstream == *label);
        // Half-open periods last, so the state after a short one does not
        // cover the width it was widened to.
        let mut rects = Vec::new();
        for (t, to) in changes.map(|t| (t.t_s, t.to)).chain([(end, "")]) {
            let w = (x(t) - x(from)).max(if state == "closed" { 0.0 } else { MIN_STATE_PX });
            rects.push((
                state == "half-open",
                format!(
                    r##"<rect x="{:.2}" y="{y:.1}" width="{w:.2}" height="{BAND}" fill="{}"><title>{state} from {from:.1} s</title></rect>"##,
                    x(from),
                    state_colour(state)
                ),
            ));
            from = t;
            state = to;
        }
        rects.sort_by_key(|(on_top, _)| *on_top);
        for (_, rect) in rects {
            c.raw(format_args!("{rect}"));
        }
        y += BAND + 3.0;
    }
    if labels.len() > MAX_BANDS {
        c.row_label(
            &format!("(+{} more breakers)", labels.len() - MAX_BANDS),
            y + 9.0,
            10.0,
            "",
        );
        y += 13.0;
    }
    if y > y0 {
        panel(layout, "breaker state", y0, y);
    }
    y + GAP * 1.5
}

/// Runs of adjacent bins that have a value: a line never joins across a
/// bin without one.
pub fn runs_of(values: &[Option<f64>]) -> Vec<Vec<usize>> {
    let mut runs: Vec<Vec<usize>> = Vec::new();
    let mut run: Vec<usize> = Vec::new();
    for (b, v) in values.iter().enumerate() {
        if v.is_some() {
            run.push(b);
        } else if !run.is_empty() {
            runs.push(std::mem::take(&mut run));
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

fn fmt_num(x: f64) -> String {
    let r = (x * 100.0).round() / 100.0;
    if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r}")
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
