//! `--sweep`: the scenario replayed over a grid of breaker settings and a
//! run of seeds, every stack with a breaker ranked on one stated objective,
//! with the Pareto front and a recommendation.
//!
//! Every combination is the scenario file with those `[breaker]` keys set,
//! validated like any file (an upstream's own `breaker` keys keep their
//! values), replayed at each seed with every stack that has a breaker
//! (`breaker`, keyed or not, `global-breaker`, `failover`, the independent
//! replicas' stacks), beside `no-breaker`. A row is one combination and one
//! stack; its figures are medians over the seeds.

use std::cmp::Ordering;
use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::engine::StackKind;
use crate::scenario::{self, Scenario};
use crate::seeds::{self, Spread};

/// The grid when neither the scenario (`[sweep]`) nor `--grid` gives one.
pub const DEFAULT_GRID: [(&str, &[&str]); 3] = [
    ("failure_rate", &["0.25", "0.5", "0.75"]),
    ("open_s", &["10", "30", "60"]),
    ("health_probe_interval_s", &["0", "5"]),
];

/// One criterion of the objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Criterion {
    /// Most answers within the deadline.
    Answered,
    /// Fewest user errors.
    Errors,
    /// Lowest answered p99 wait.
    P99,
    /// Shortest recovery lag (not closed in every seed: worst).
    Lag,
    /// Least wasted cost.
    Wasted,
}

impl Criterion {
    const ALL: [(&'static str, Criterion); 5] = [
        ("answered", Criterion::Answered),
        ("errors", Criterion::Errors),
        ("p99", Criterion::P99),
        ("lag", Criterion::Lag),
        ("wasted", Criterion::Wasted),
    ];

    fn name(self) -> &'static str {
        Criterion::ALL
            .iter()
            .find(|(_, c)| *c == self)
            .map_or("", |(n, _)| n)
    }

    fn words(self) -> &'static str {
        match self {
            Criterion::Answered => "most answers within the deadline (to 1 request)",
            Criterion::Errors => "fewest user errors (to 0.1 percentage point)",
            Criterion::P99 => "lowest answered p99 (to 0.1 s)",
            Criterion::Lag => {
                "shortest recovery lag (to 1 s; not re-closed after the heal in every seed is worst)"
            }
            Criterion::Wasted => "least wasted cost (to $0.01, each upstream at its own price)",
        }
    }
}

/// The order the criteria are read in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Objective(pub Vec<Criterion>);

impl Objective {
    /// `--objective a,b,…`: any order of `answered`, `errors`, `p99`, `lag`,
    /// `wasted`; those left out follow in the default order.
    pub fn parse(text: Option<&str>) -> Result<Objective, String> {
        let mut order = Vec::new();
        for word in text
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
        {
            let c = Criterion::ALL
                .iter()
                .find(|(n, _)| *n == word)
                .map(|(_, c)| *c)
                .ok_or_else(|| {
                    format!(
                        "--objective: {word:?} is not one of answered, errors, p99, lag, wasted"
                    )
                })?;
            if order.contains(&c) {
                return Err(format!("--objective: {word:?} is given twice"));
            }
            order.push(c);
        }
        for (_, c) in Criterion::ALL {
            if !order.contains(&c) {
                order.push(c);
            }
        }
        Ok(Objective(order))
    }

    pub fn text(&self) -> String {
        format!(
            "lexicographic over the whole run, medians over the seeds: {}; ties keep the grid's \
             order; recommended: the first row whose breakers re-closed after the heal in every \
             seed",
            self.0
                .iter()
                .map(|c| c.words())
                .collect::<Vec<_>>()
                .join(", then ")
        )
    }
}

/// One combination of settings, one stack, over the seeds.
#[derive(Debug, Clone)]
pub struct Row {
    pub settings: Vec<(String, String)>,
    pub stack: &'static str,
    pub answered: Option<Spread>,
    pub user_error_rate: Option<Spread>,
    pub answered_p99_s: Option<Spread>,
    /// Over the seeds in which the breakers re-closed.
    pub recovery_lag_s: Option<Spread>,
    pub wasted_cost_usd: Option<Spread>,
    /// Seeds whose breakers all re-closed after the heal, of those with a
    /// heal.
    pub closed_at_end: (usize, usize),
    pub pareto: bool,
}

impl Row {
    /// Re-closed after the heal in every seed (or nothing healed).
    pub fn recloses(&self) -> bool {
        self.closed_at_end.0 == self.closed_at_end.1
    }

    fn value(&self, c: Criterion) -> f64 {
        let med = |s: Option<Spread>, none: f64| s.map_or(none, |s| s.median);
        match c {
            Criterion::Answered => -med(self.answered, 0.0),
            Criterion::Errors => med(self.user_error_rate, 1.0),
            Criterion::P99 => med(self.answered_p99_s, f64::INFINITY),
            Criterion::Lag if !self.recloses() => f64::INFINITY,
            Criterion::Lag => med(self.recovery_lag_s, 0.0),
            Criterion::Wasted => med(self.wasted_cost_usd, 0.0),
        }
    }

    /// The objectives in the default order, each lower is better.
    pub fn objectives(&self) -> [f64; 5] {
        Criterion::ALL.map(|(_, c)| self.value(c))
    }

    /// The objectives in `order`, at the resolution the ranking reads them.
    pub fn rank_key(&self, order: &Objective) -> Vec<f64> {
        order
            .0
            .iter()
            .map(|&c| {
                let step = match c {
                    Criterion::Answered => 1.0,
                    Criterion::Errors => 0.001,
                    Criterion::P99 => 0.1,
                    Criterion::Lag => 1.0,
                    Criterion::Wasted => 0.01,
                };
                let x = self.value(c);
                if x.is_finite() {
                    (x / step).round()
                } else {
                    f64::INFINITY
                }
            })
            .collect()
    }
}

/// A sweep's outcome: rows best first.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub scenario: String,
    pub stacks: Vec<&'static str>,
    pub keys: Vec<String>,
    pub seeds: Vec<u64>,
    pub objective: Objective,
    pub rows: Vec<Row>,
    /// Combinations the format rejects, with why.
    pub skipped: Vec<(Vec<(String, String)>, String)>,
}

impl Sweep {
    /// The first row whose breakers re-closed after the heal in every seed.
    pub fn recommended(&self) -> Option<&Row> {
        self.rows.iter().find(|r| r.recloses())
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

/// The stacks of `scenario` that have a breaker.
pub fn breaker_stacks(scenario: &Scenario) -> Vec<StackKind> {
    scenario
        .stacks()
        .into_iter()
        .filter(|k| !matches!(k, StackKind::NoBreaker | StackKind::NaiveFailover))
        .collect()
}

/// Replays the scenario `text` (named `file`) at every combination of
/// `grid` and every seed of `seeds`, ranked in `order`.
pub fn run(
    text: &str,
    file: &str,
    grid: &[(String, Vec<String>)],
    seeds: &[u64],
    order: &Objective,
) -> Result<Sweep, String> {
    let base = scenario::parse(text, file).map_err(|e| e.to_string())?;
    let kinds = breaker_stacks(&base);
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
    let mut with_plain = vec![StackKind::NoBreaker];
    with_plain.extend(&kinds);
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for combo in combos {
        let values: Vec<(&str, &str)> = combo
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let s = match scenario::with_breaker(text, file, &values) {
            Ok(s) => s,
            Err(e) => {
                skipped.push((combo, e.message));
                continue;
            }
        };
        let replays = match seeds::replay_seeds(&s, &with_plain, seeds) {
            Ok(r) => r,
            Err(e) => {
                skipped.push((combo, e));
                continue;
            }
        };
        let summary = seeds::summarize(&replays);
        for st in summary.stacks.iter().filter(|s| s.name != "no-breaker") {
            let fig = |name: &str| {
                st.figures
                    .iter()
                    .find(|(n, _, _)| *n == name)
                    .and_then(|(_, _, s)| *s)
            };
            rows.push(Row {
                settings: combo.clone(),
                stack: st.name,
                answered: fig("answered"),
                user_error_rate: fig("user_error_rate"),
                answered_p99_s: fig("answered_wait_p99_s"),
                recovery_lag_s: fig("recovery_lag_s"),
                wasted_cost_usd: fig("wasted_cost_usd"),
                closed_at_end: st.closed_at_end,
                pareto: false,
            });
        }
    }
    // A stable sort: ties keep the grid's order.
    rows.sort_by(|a, b| compare(&a.rank_key(order), &b.rank_key(order)));
    let objectives: Vec<[f64; 5]> = rows.iter().map(Row::objectives).collect();
    for (i, row) in rows.iter_mut().enumerate() {
        row.pareto = !objectives
            .iter()
            .enumerate()
            .any(|(j, o)| j != i && dominates(o, &objectives[i]));
    }
    Ok(Sweep {
        scenario: base.name,
        stacks: kinds.iter().map(|k| k.name()).collect(),
        keys: grid.iter().map(|(k, _)| k.clone()).collect(),
        seeds: seeds.to_vec(),
        objective: order.clone(),
        rows,
        skipped,
    })
}

fn compare(a: &[f64], b: &[f64]) -> Ordering {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.total_cmp(y))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// `a` is no worse than `b` in every objective and better in one.
pub fn dominates(a: &[f64], b: &[f64]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y) && a.iter().zip(b).any(|(x, y)| x < y)
}

fn med(s: Option<Spread>, f: impl Fn(f64) -> String) -> String {
    s.map_or_else(|| "—".to_owned(), |s| f(s.median))
}

fn lag(row: &Row) -> String {
    if !row.recloses() || row.closed_at_end.1 == 0 && row.recovery_lag_s.is_none() {
        if row.closed_at_end.1 == 0 {
            return "—".to_owned();
        }
        return "never".to_owned();
    }
    med(row.recovery_lag_s, |x| format!("{x:.1}s"))
}

/// The ranked table, the Pareto front marked `*`, and the recommendation.
pub fn table(sweep: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sweep: {}, stacks {}, {} rows, {}",
        sweep.scenario,
        sweep.stacks.join(", "),
        sweep.rows.len(),
        seeds::describe(&sweep.seeds)
    );
    let _ = writeln!(
        out,
        "objective: {}; * = on the Pareto front; closed: seeds whose breakers re-closed after the \
         heal",
        sweep.objective.text()
    );
    let widths: Vec<usize> = sweep.keys.iter().map(|k| k.len().max(6)).collect();
    let sw = sweep
        .stacks
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = write!(out, "{:>5}  {:<sw$}", "rank", "stack");
    for (k, w) in sweep.keys.iter().zip(&widths) {
        let _ = write!(out, " {k:>w$}");
    }
    let _ = writeln!(
        out,
        "  {:>8} {:>7} {:>12} {:>8} {:>9} {:>7}",
        "answered", "errors", "answered p99", "lag", "wasted $", "closed"
    );
    for (i, row) in sweep.rows.iter().enumerate() {
        let _ = write!(
            out,
            "{:>4}{}  {:<sw$}",
            i + 1,
            if row.pareto { "*" } else { " " },
            row.stack
        );
        for ((_, v), w) in row.settings.iter().zip(&widths) {
            let _ = write!(out, " {v:>w$}");
        }
        let _ = writeln!(
            out,
            "  {:>8} {:>7} {:>12} {:>8} {:>9} {:>7}",
            med(row.answered, |x| format!("{x:.0}")),
            med(row.user_error_rate, |x| format!("{:.1}%", x * 100.0)),
            med(row.answered_p99_s, |x| format!("{x:.2}s")),
            lag(row),
            med(row.wasted_cost_usd, |x| format!("{x:.2}")),
            format!("{}/{}", row.closed_at_end.0, row.closed_at_end.1)
        );
    }
    for (combo, why) in &sweep.skipped {
        let _ = writeln!(out, "skipped {}: {why}", settings(combo));
    }
    match sweep.recommended() {
        Some(best) => {
            let _ = writeln!(
                out,
                "recommended: {} with {} (answered {}, errors {}, answered p99 {}, recovery lag {}, \
                 wasted ${}; re-closed after the heal in {} of {} seeds)",
                best.stack,
                settings(&best.settings),
                med(best.answered, |x| format!("{x:.0}")),
                med(best.user_error_rate, |x| format!("{:.1}%", x * 100.0)),
                med(best.answered_p99_s, |x| format!("{x:.2}s")),
                lag(best),
                med(best.wasted_cost_usd, |x| format!("{x:.2}")),
                best.closed_at_end.0,
                best.closed_at_end.1
            );
        }
        None => {
            let _ = writeln!(
                out,
                "recommended: none (no row's breakers re-closed after the heal in every seed)"
            );
        }
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

fn spread_json(s: Option<Spread>, digits: i32) -> Value {
    let r = |x: f64| {
        let m = 10f64.powi(digits);
        (x * m).round() / m
    };
    s.map_or(
        Value::Null,
        |s| json!({ "median": r(s.median), "min": r(s.min), "max": r(s.max) }),
    )
}

fn row_json(row: &Row, rank: usize) -> Value {
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
        "stack": row.stack,
        "settings": settings,
        "answered": spread_json(row.answered, 1),
        "user_error_rate": spread_json(row.user_error_rate, 6),
        "answered_wait_p99_s": spread_json(row.answered_p99_s, 3),
        "recovery_lag_s": spread_json(row.recovery_lag_s, 3),
        "wasted_cost_usd": spread_json(row.wasted_cost_usd, 6),
        "closed_at_end": { "seeds": row.closed_at_end.0, "of": row.closed_at_end.1 },
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
    let recommended = sweep.rows.iter().position(Row::recloses);
    let doc = json!({
        "scenario": sweep.scenario,
        "stacks": sweep.stacks,
        "seeds": sweep.seeds,
        "objective": sweep.objective.text(),
        "objective_order": sweep.objective.0.iter().map(|c| c.name()).collect::<Vec<_>>(),
        "ranked": ranked,
        "skipped": skipped,
        "recommended": recommended.map(|i| row_json(&sweep.rows[i], i + 1)),
    });
    doc.to_string()
}
