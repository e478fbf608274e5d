//! `--sweep`: the scenario replayed over a grid of breaker settings, ranked
//! on a stated objective, with the Pareto front and a recommendation.
//!
//! Only the stack the settings are for is replayed: `failover` when the
//! scenario has one, `breaker` otherwise. Every combination is the scenario
//! file with those `[breaker]` keys set, validated like any file (an
//! upstream's own `breaker` keys keep their values).

use std::cmp::Ordering;
use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::engine::{self, StackKind, StackRun};
use crate::figures::Figures;
use crate::scenario::{self, Scenario};

/// The grid when neither the scenario (`[sweep]`) nor `--grid` gives one.
pub const DEFAULT_GRID: [(&str, &[&str]); 3] = [
    ("failure_rate", &["0.25", "0.5", "0.75"]),
    ("open_s", &["10", "30", "60"]),
    ("health_probe_interval_s", &["0", "5"]),
];

/// How the rows are ranked, as printed.
pub const OBJECTIVE: &str = "lexicographic over the whole run: fewest user errors (to 0.1 \
                             percentage point), then lowest answered p99 (to 0.1 s), then least \
                             wasted cost (to $0.01), then shortest recovery lag (to 1 s; never \
                             closing is worst); ties keep the grid's order";

/// One combination of settings and what it did.
#[derive(Debug, Clone)]
pub struct Row {
    pub settings: Vec<(String, String)>,
    pub figures: Figures,
    /// Heal to closed for good, the slowest of the stack's breakers (0 when
    /// none had to recover); `None`: one is not closed at the end.
    pub recovery_lag_s: Option<f64>,
    pub pareto: bool,
}

impl Row {
    fn of(settings: Vec<(String, String)>, run: &StackRun) -> Row {
        let lags: Option<Vec<f64>> = run
            .recovery
            .iter()
            .filter(|r| r.healed_at_s.unwrap_or(0.0) > 0.0)
            .map(|r| r.recovery_lag_s)
            .collect();
        Row {
            settings,
            figures: run.all.clone(),
            recovery_lag_s: lags.map(|l| l.into_iter().fold(0.0, f64::max)),
            pareto: false,
        }
    }

    /// The four objectives, each lower is better.
    pub fn objectives(&self) -> [f64; 4] {
        let f = &self.figures;
        [
            f.user_error_rate.unwrap_or(1.0),
            f.answered_wait.map_or(f64::INFINITY, |w| w.p99_s),
            f.wasted_cost_usd,
            self.recovery_lag_s.unwrap_or(f64::INFINITY),
        ]
    }

    /// The objectives at the resolution the ranking reads them.
    pub fn rank_key(&self) -> [f64; 4] {
        let [e, p, w, l] = self.objectives();
        let at = |x: f64, step: f64| {
            if x.is_finite() {
                (x / step).round()
            } else {
                f64::INFINITY
            }
        };
        [at(e, 0.001), at(p, 0.1), at(w, 0.01), at(l, 1.0)]
    }
}

/// A sweep's outcome: rows best first.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub scenario: String,
    pub stack: &'static str,
    pub keys: Vec<String>,
    pub rows: Vec<Row>,
    /// Combinations the format rejects, with why.
    pub skipped: Vec<(Vec<(String, String)>, String)>,
}

impl Sweep {
    pub fn recommended(&self) -> Option<&Row> {
        self.rows.first()
    }
}

/// The grid to sweep: `--grid`'s, else the scenario's `[sweep]`, else
/// [`DEFAULT_GRID`].
pub fn grid(scenario: &Scenario, cli: Vec<(String, Vec<String>)>) -> Vec<(String, Vec<String>)> {
    if !cli.is_empty() {
        return cli;
    }
    if !scenario.sweep.is_empty() {
        return scenario.sweep.clone();
    }
    DEFAULT_GRID
        .iter()
        .map(|(k, vs)| (k.to_string(), vs.iter().map(|v| v.to_string()).collect()))
        .collect()
}

/// Replays the scenario `text` (named `file`) at every combination of
/// `grid`.
pub fn run(text: &str, file: &str, grid: &[(String, Vec<String>)]) -> Result<Sweep, String> {
    let base = scenario::parse(text, file).map_err(|e| e.to_string())?;
    let kind = if base.stacks().contains(&StackKind::Failover) {
        StackKind::Failover
    } else {
        StackKind::Breaker
    };
    let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (key, values) in grid {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((key.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    if combos.len() > scenario::MAX_SWEEP {
        return Err(format!(
            "the sweep has {} combinations; at most {}",
            combos.len(),
            scenario::MAX_SWEEP
        ));
    }
    let replay_one = |combo: &Vec<(String, String)>| -> Result<Row, String> {
        let values: Vec<(&str, &str)> = combo
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let s = scenario::with_breaker(text, file, &values).map_err(|e| e.message)?;
        let replay = engine::replay_stacks(&s, &[kind])?;
        Ok(Row::of(combo.clone(), &replay.stacks[0]))
    };
    // Two combinations at a time: each replay is one thread.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
    let mut outcomes: Vec<Result<Row, String>> = Vec::with_capacity(combos.len());
    for chunk in combos.chunks(threads) {
        let done: Vec<Result<Row, String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|c| scope.spawn(move || replay_one(c)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a replay thread panicked".to_owned()))
                })
                .collect()
        });
        outcomes.extend(done);
    }
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for (combo, outcome) in combos.into_iter().zip(outcomes) {
        match outcome {
            Ok(row) => rows.push(row),
            Err(why) => skipped.push((combo, why)),
        }
    }
    // A stable sort: ties keep the grid's order.
    rows.sort_by(|a, b| compare(&a.rank_key(), &b.rank_key()));
    let objectives: Vec<[f64; 4]> = rows.iter().map(Row::objectives).collect();
    for (i, row) in rows.iter_mut().enumerate() {
        row.pareto = !objectives
            .iter()
            .enumerate()
            .any(|(j, o)| j != i && dominates(o, &objectives[i]));
    }
    Ok(Sweep {
        scenario: base.name,
        stack: kind.name(),
        keys: grid.iter().map(|(k, _)| k.clone()).collect(),
        rows,
        skipped,
    })
}

fn compare(a: &[f64; 4], b: &[f64; 4]) -> Ordering {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.total_cmp(y))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// `a` is no worse than `b` in every objective and better in one.
pub fn dominates(a: &[f64; 4], b: &[f64; 4]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y) && a.iter().zip(b).any(|(x, y)| x < y)
}

fn lag(x: Option<f64>) -> String {
    x.map_or_else(|| "never".to_owned(), |x| format!("{x:.1}s"))
}

fn p99(f: &Figures) -> String {
    f.answered_wait
        .map_or_else(|| "—".to_owned(), |w| format!("{:.2}s", w.p99_s))
}

fn errors(f: &Figures) -> String {
    f.user_error_rate
        .map_or_else(|| "—".to_owned(), |x| format!("{:.1}%", x * 100.0))
}

/// The ranked table, the Pareto front marked `*`, and the recommendation.
pub fn table(sweep: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sweep: {}, stack {}, {} settings replayed",
        sweep.scenario,
        sweep.stack,
        sweep.rows.len()
    );
    let _ = writeln!(out, "objective: {OBJECTIVE}; * = on the Pareto front");
    let widths: Vec<usize> = sweep.keys.iter().map(|k| k.len().max(6)).collect();
    let _ = write!(out, "{:>5} ", "rank");
    for (k, w) in sweep.keys.iter().zip(&widths) {
        let _ = write!(out, " {k:>w$}");
    }
    let _ = writeln!(
        out,
        "  {:>7} {:>12} {:>9} {:>8}",
        "errors", "answered p99", "wasted $", "lag"
    );
    for (i, row) in sweep.rows.iter().enumerate() {
        let _ = write!(out, "{:>4}{} ", i + 1, if row.pareto { "*" } else { " " });
        for ((_, v), w) in row.settings.iter().zip(&widths) {
            let _ = write!(out, " {v:>w$}");
        }
        let _ = writeln!(
            out,
            "  {:>7} {:>12} {:>9.2} {:>8}",
            errors(&row.figures),
            p99(&row.figures),
            row.figures.wasted_cost_usd,
            lag(row.recovery_lag_s)
        );
    }
    for (combo, why) in &sweep.skipped {
        let _ = writeln!(out, "skipped {}: {why}", settings(combo));
    }
    if let Some(best) = sweep.recommended() {
        let _ = writeln!(
            out,
            "recommended: {} (errors {}, answered p99 {}, wasted ${:.2}, recovery lag {})",
            settings(&best.settings),
            errors(&best.figures),
            p99(&best.figures),
            best.figures.wasted_cost_usd,
            lag(best.recovery_lag_s)
        );
    }
    out.lines().fold(String::new(), |mut text, line| {
        text.push_str(line.trim_end());
        text.push('\n');
        text
    })
}

fn settings(combo: &[(String, String)]) -> String {
    combo
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

fn row_json(row: &Row, rank: usize) -> Value {
    let f = &row.figures;
    let settings: Map<String, Value> = row
        .settings
        .iter()
        .map(|(k, v)| {
            let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()));
            (k.clone(), value)
        })
        .collect();
    json!({
        "rank": rank,
        "pareto": row.pareto,
        "settings": settings,
        "user_error_rate": f.user_error_rate.map(|x| round(x, 6)),
        "answered_wait_p99_s": f.answered_wait.map(|w| round(w.p99_s, 3)),
        "wasted_cost_usd": round(f.wasted_cost_usd, 6),
        "recovery_lag_s": row.recovery_lag_s.map(|x| round(x, 3)),
        "requests": f.requests,
        "cost_usd": round(f.cost_usd, 6),
    })
}

/// The sweep as one JSON object: the ranked rows and the recommendation.
pub fn json(sweep: &Sweep) -> String {
    let ranked: Vec<Value> = sweep
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| row_json(r, i + 1))
        .collect();
    let skipped: Vec<Value> = sweep
        .skipped
        .iter()
        .map(|(combo, why)| json!({ "settings": settings(combo), "reason": why }))
        .collect();
    let doc = json!({
        "scenario": sweep.scenario,
        "stack": sweep.stack,
        "objective": OBJECTIVE,
        "ranked": ranked,
        "skipped": skipped,
        "recommended": sweep.recommended().map(|r| row_json(r, 1)),
    });
    doc.to_string()
}
