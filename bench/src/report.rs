//! Runs the rows, and prints and writes the report.

use std::fmt::Write as _;
use std::path::Path as FsPath;
use std::time::Duration;

use crate::measure::{Mode, Plan, Shape};
use crate::rows::{Breaker, Path, Row};

/// How long to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Timed runs of every row; the report gives their median.
    pub runs: usize,
    /// Wall time each timed run aims at.
    pub target: Duration,
    /// Only rows whose name contains one of these `|`-separated texts.
    pub filter: Option<String>,
    /// The shapes to run.
    pub shapes: Vec<Shape>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            runs: 7,
            target: Duration::from_millis(60),
            filter: None,
            shapes: Shape::ALL.to_vec(),
        }
    }
}

/// The figures of one row in one shape.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The row.
    pub row: Row,
    /// The shape.
    pub shape: Shape,
    /// Nanoseconds per call of every timed run, in run order.
    pub runs: Vec<f64>,
    /// Allocations per call.
    pub allocs: f64,
}

impl Measured {
    /// Median nanoseconds per call.
    pub fn ns(&self) -> f64 {
        median(&self.runs)
    }

    /// (max - min) / median of the runs.
    pub fn spread(&self) -> f64 {
        let lo = self.runs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self.runs.iter().copied().fold(0.0, f64::max);
        (hi - lo) / self.ns()
    }
}

/// Median of `xs` (mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn one(row: &Row, shape: Shape, mode: Mode) -> f64 {
    let rt = shape.runtime();
    let plan = Plan {
        rt: &rt,
        shape,
        mode,
    };
    row.run(&plan)
        .unwrap_or_else(|e| panic!("{} ({}): {e}", row.name(), shape.label()))
}

/// Measures every selected row in every selected shape. Timed runs go round
/// the rows (run 1 of every row, then run 2...), so a slow patch of the
/// machine spreads over all rows instead of landing on one.
pub fn run(rows: &[Row], settings: &Settings, mut progress: impl FnMut(&str)) -> Vec<Measured> {
    let picked = |r: &Row| {
        let name = r.name();
        settings
            .filter
            .as_ref()
            .is_none_or(|f| f.split('|').any(|part| name.contains(part)))
    };
    // The floors of the picked rows come along, so "added" is always shown.
    let floors: Vec<Path> = rows
        .iter()
        .filter(|r| picked(r))
        .filter_map(|r| r.path.floor())
        .collect();
    let rows: Vec<Row> = rows
        .iter()
        .filter(|r| picked(r) || (r.breaker == Breaker::Bare && floors.contains(&r.path)))
        .copied()
        .collect();
    let mut out = Vec::new();
    for &shape in &settings.shapes {
        // Calibrate: calls per run so that each run takes about `target`.
        let mut calls = Vec::new();
        for row in &rows {
            progress(&format!("calibrating {} ({})", row.name(), shape.label()));
            let pilot = 20_000;
            let ns = one(row, shape, Mode::Time { calls: pilot }).max(0.5);
            let n = (settings.target.as_nanos() as f64 / ns) as u64;
            calls.push(n.clamp(20_000, 100_000_000));
            let allocs = one(row, shape, Mode::Allocs);
            out.push(Measured {
                row: *row,
                shape,
                runs: Vec::new(),
                allocs,
            });
        }
        let first = out.len() - rows.len();
        for r in 0..settings.runs {
            progress(&format!(
                "{} run {}/{}",
                shape.label(),
                r + 1,
                settings.runs
            ));
            for (i, row) in rows.iter().enumerate() {
                let ns = one(row, shape, Mode::Time { calls: calls[i] });
                out[first + i].runs.push(ns);
            }
        }
    }
    out
}

fn find(all: &[Measured], shape: Shape, breaker: Breaker, path: Path) -> Option<&Measured> {
    all.iter()
        .find(|m| m.shape == shape && m.row.breaker == breaker && m.row.path == path)
}

/// The table, as printed: one line per row, the shapes side by side.
pub fn table(all: &[Measured], settings: &Settings) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "ns = ns per call, median of {} runs of about {} ms each (±: (max - min) / median);",
        settings.runs,
        settings.target.as_millis()
    );
    let _ = writeln!(
        s,
        "added = ns over the row's floor: the bare service on the same upstream (rejecting rows: the service failing at once);"
    );
    let _ = writeln!(
        s,
        "alloc = allocations per call; ours/it = our ns on the same path / this row's ns."
    );
    let shapes: Vec<Shape> = settings
        .shapes
        .iter()
        .copied()
        .filter(|&shape| all.iter().any(|m| m.shape == shape))
        .collect();
    let _ = write!(s, "{:<48}", "");
    for shape in &shapes {
        let _ = write!(s, " | {:<35}", shape.label());
    }
    let _ = writeln!(s);
    let _ = write!(s, "{:<48}", "row");
    for _ in &shapes {
        let _ = write!(
            s,
            " | {:>7} {:>4} {:>7} {:>5} {:>7}",
            "ns", "±", "added", "alloc", "ours/it"
        );
    }
    let _ = writeln!(s);
    let mut seen: Vec<(Breaker, Path)> = Vec::new();
    for m in all {
        if seen.contains(&(m.row.breaker, m.row.path)) {
            continue;
        }
        seen.push((m.row.breaker, m.row.path));
        let _ = write!(s, "{:<48}", m.row.name());
        for &shape in &shapes {
            match find(all, shape, m.row.breaker, m.row.path) {
                Some(m) => {
                    let _ = write!(s, " | {}", cells(all, m));
                }
                None => {
                    let _ = write!(s, " | {:<35}", "");
                }
            }
        }
        let _ = writeln!(s);
    }
    s
}

/// The row of the same shape this row's "added" figures are measured over
/// (its path's floor), if measured.
fn floor_of<'a>(all: &'a [Measured], m: &Measured) -> Option<&'a Measured> {
    match m.row.breaker {
        Breaker::Bare => None,
        _ => find(all, m.shape, Breaker::Bare, m.row.path.floor()?),
    }
}

/// Allocations per call the breaker adds over its floor's.
fn allocs_added(all: &[Measured], m: &Measured) -> f64 {
    m.allocs - floor_of(all, m).map_or(0.0, |f| f.allocs)
}

/// Our ns / the peer's ns, run by run (the runs go round the rows, so run
/// `i` of both was taken in the same round).
pub fn per_run_ratios(ours: &Measured, peer: &Measured) -> Vec<f64> {
    ours.runs
        .iter()
        .zip(&peer.runs)
        .map(|(o, p)| o / p)
        .collect()
}

/// ns, spread, added, allocations and our ratio for one row in one shape.
fn cells(all: &[Measured], m: &Measured) -> String {
    let ns = m.ns();
    let added = floor_of(all, m).map_or("-".to_string(), |b| format!("{:.1}", ns - b.ns()));
    let ratio = match m.row.breaker {
        Breaker::Bare | Breaker::Ours => "-".to_string(),
        _ => find(all, m.shape, Breaker::Ours, m.row.path)
            .map_or("-".to_string(), |ours| format!("{:.2}", ours.ns() / ns)),
    };
    format!(
        "{:>7.1} {:>3.0}% {:>7} {:>5.2} {:>7}",
        ns,
        m.spread() * 100.0,
        added,
        m.allocs,
        ratio
    )
}

/// How this crate's rows fare against the performance budget and the peers.
pub fn budget(all: &[Measured]) -> String {
    let mut s = String::new();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    use Path::Closed;
    let (one, many) = (Shape::OneTask, Shape::ManyTasks);
    // DESIGN.md states the instruction budgets (bench/callgrind.sh checks
    // them); wall time gives what each path adds over its floor.
    for m in all.iter().filter(|m| m.row.breaker == Breaker::Ours) {
        if let Some(floor) = floor_of(all, m) {
            let _ = writeln!(
                s,
                "  {:<8} {:<40} {:>7.1} ns over {}",
                m.shape.label(),
                m.row.path.label(),
                m.ns() - floor.ns(),
                floor.row.name()
            );
        }
    }
    // What a feature costs over the plain path, both of this crate.
    for m in all.iter().filter(|m| m.row.breaker == Breaker::Ours) {
        if let Some(plain) = m
            .row
            .path
            .over()
            .and_then(|p| find(all, m.shape, Breaker::Ours, p))
        {
            let _ = writeln!(
                s,
                "  {:<8} {:<40} {:>7.1} ns over {}",
                m.shape.label(),
                m.row.path.label(),
                m.ns() - plain.ns(),
                plain.row.path.label()
            );
        }
    }
    // Wall time against recloser, as the budget states it: the median of
    // the per-run ratios.
    for path in [Closed, Path::ClosedFailing] {
        for shape in [one, many] {
            if let (Some(o), Some(r)) = (
                find(all, shape, Breaker::Ours, path),
                find(all, shape, Breaker::Recloser, path),
            ) {
                let ratios = per_run_ratios(o, r);
                let (lo, hi) = min_max(&ratios);
                let med = median(&ratios);
                let _ = writeln!(
                    s,
                    "  {:<8} {:<40} ours/recloser {med:.2} ({lo:.2}-{hi:.2} over {} runs; budget <= 1.00: {})",
                    shape.label(),
                    path.label(),
                    ratios.len(),
                    verdict(med <= 1.0)
                );
            }
        }
    }
    let allocating: Vec<String> = all
        .iter()
        .filter(|m| m.row.breaker == Breaker::Ours && allocs_added(all, m) > 0.0)
        .map(|m| {
            format!(
                "{} ({}) {:.3}",
                m.row.name(),
                m.shape.label(),
                allocs_added(all, m)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "  zero allocations added on every path of ours: {}",
        if allocating.is_empty() {
            "met".to_string()
        } else {
            format!("MISSED: {}", allocating.join(", "))
        }
    );
    for m in all.iter().filter(|m| m.row.breaker == Breaker::Ours) {
        let peers: Vec<&Measured> = Breaker::PEERS
            .iter()
            .filter_map(|&p| find(all, m.shape, p, m.row.path))
            .collect();
        if let Some(fastest) = peers.iter().min_by(|a, b| a.ns().total_cmp(&b.ns())) {
            let _ = writeln!(
                s,
                "  fastest, {:<8} {:<30} ours {:>7.1} ns, best peer {} {:.1} ns: {}",
                m.shape.label(),
                m.row.path.label(),
                m.ns(),
                fastest.row.breaker.label(),
                fastest.ns(),
                verdict(m.ns() < fastest.ns())
            );
        }
    }
    s
}

fn min_max(xs: &[f64]) -> (f64, f64) {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn list(xs: &[f64]) -> String {
    let xs: Vec<String> = xs.iter().map(|x| format!("{x:.3}")).collect();
    format!("[{}]", xs.join(","))
}

/// The report as JSON, one row or ratio a line (`bench/compare.sh` reads
/// it): `{"rows":[{"name", "shape", "ns_per_call" (median), "spread",
/// "runs" (ns per call of each run), "allocs_per_call", "added_ns" (over
/// the floor, or null)}], "ratios":[{"path", "shape", "peer", "ratio" (our
/// median / the peer's), "per_run" (run by run), "per_run_median",
/// "per_run_min", "per_run_max"}]}`.
pub fn json(all: &[Measured]) -> String {
    let rows: Vec<String> = all
        .iter()
        .map(|m| {
            let added =
                floor_of(all, m).map_or("null".to_string(), |f| format!("{:.3}", m.ns() - f.ns()));
            format!(
                "{{\"name\":{},\"shape\":{},\"ns_per_call\":{:.3},\"spread\":{:.4},\"runs\":{},\"allocs_per_call\":{:.4},\"added_ns\":{}}}",
                quote(&m.row.name()),
                quote(m.shape.label()),
                m.ns(),
                m.spread(),
                list(&m.runs),
                m.allocs,
                added
            )
        })
        .collect();
    let mut ratios = Vec::new();
    for ours in all.iter().filter(|m| m.row.breaker == Breaker::Ours) {
        for &peer in &Breaker::PEERS {
            let Some(p) = find(all, ours.shape, peer, ours.row.path) else {
                continue;
            };
            let per_run = per_run_ratios(ours, p);
            let (lo, hi) = min_max(&per_run);
            ratios.push(format!(
                "{{\"path\":{},\"shape\":{},\"peer\":{},\"ratio\":{:.4},\"per_run\":{},\"per_run_median\":{:.4},\"per_run_min\":{:.4},\"per_run_max\":{:.4}}}",
                quote(ours.row.path.label()),
                quote(ours.shape.label()),
                quote(peer.label()),
                ours.ns() / p.ns(),
                list(&per_run),
                median(&per_run),
                lo,
                hi
            ));
        }
    }
    format!(
        "{{\"rows\":[\n  {}\n],\n\"ratios\":[\n  {}\n]}}\n",
        rows.join(",\n  "),
        ratios.join(",\n  ")
    )
}

fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(q, "\\u{:04x}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// The target directory of the running binary (`<target>/release/<bin>`), so
/// the report lands in the workspace's `target/` or `$CARGO_TARGET_DIR`.
pub fn target_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the path of this binary");
    exe.parent()
        .and_then(FsPath::parent)
        .map(FsPath::to_path_buf)
        .unwrap_or_else(|| std::path::PathBuf::from("target"))
}
