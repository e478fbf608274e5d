//! `--seeds N`: one scenario over N seeds (the file's seed, then seed + 1,
//! seed + 2, …), each figure's median and range, and the breakers that
//! closed again after the heal as a count of seeds.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

use crate::engine::{self, Replay, StackKind, StackRun};
use crate::figures::Figures;
use crate::report::{self, Window};
use crate::scenario::Scenario;

/// Seeds the replay runs when none is asked for: the documented figures
/// are over these many.
pub const DEFAULT_SEEDS: u32 = 11;

/// The seeds of a multi-seed run: the scenario's own, then the next ones.
pub fn sequence(first: u64, n: u32) -> Vec<u64> {
    (0..u64::from(n)).map(|k| first.wrapping_add(k)).collect()
}

/// The scenario replayed at every seed of `seeds`, two seeds at a time (the
/// machine's cores; each replay runs its stacks on threads of its own), in
/// the order of `seeds`.
pub fn replay_seeds(
    scenario: &Scenario,
    kinds: &[StackKind],
    seeds: &[u64],
) -> Result<Vec<Replay>, String> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 2)
        .min(seeds.len().max(1));
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<Replay, String>>>> =
        Mutex::new((0..seeds.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { break };
                let mut s = scenario.clone();
                s.seed = seed;
                let r = engine::replay_stacks(&s, kinds);
                done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    done.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a seed's replay did not finish".to_owned())))
        .collect()
}

/// Whether every breaker of the stack whose upstream failed and healed is
/// closed at the end (always, for a stack without breakers); `None` when no
/// upstream it calls healed.
pub fn closed_at_end(run: &StackRun) -> Option<bool> {
    let healed: Vec<_> = run
        .recovery
        .iter()
        .filter(|r| r.healed_at_s.is_some_and(|h| h > 0.0))
        .collect();
    (!healed.is_empty()).then(|| healed.iter().all(|r| r.recovery_lag_s.is_some()))
}

/// The slowest recovery lag of the stack's healed upstreams; `None` when one
/// is not closed at the end (or none healed).
pub fn slowest_lag(run: &StackRun) -> Option<f64> {
    let lags: Option<Vec<f64>> = run
        .recovery
        .iter()
        .filter(|r| r.healed_at_s.is_some_and(|h| h > 0.0))
        .map(|r| r.recovery_lag_s)
        .collect();
    lags.filter(|l| !l.is_empty())
        .map(|l| l.into_iter().fold(0.0, f64::max))
}

/// With health probes, the lag bound of the healed upstream whose lag is
/// the slowest (`slowest_lag`'s); `None` when one is not closed at the end
/// or has no bound.
pub fn slowest_lag_bound(run: &StackRun) -> Option<f64> {
    let slowest = slowest_lag(run)?;
    run.recovery
        .iter()
        .filter(|r| r.healed_at_s.is_some_and(|h| h > 0.0))
        .find(|r| r.recovery_lag_s == Some(slowest))?
        .lag_bound_s
}

/// Median (of an even count: the mean of the middle two), least and most.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// How many seeds had the figure.
    pub n: usize,
}

impl Spread {
    pub fn of(mut xs: Vec<f64>) -> Option<Spread> {
        if xs.is_empty() {
            return None;
        }
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        let median = if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: xs[0],
            max: xs[n - 1],
            n,
        })
    }

    fn json(s: Option<Spread>, digits: i32) -> Value {
        let r = |x: f64| {
            let m = 10f64.powi(digits);
            (x * m).round() / m
        };
        s.map_or(
            Value::Null,
            |s| json!({ "median": r(s.median), "min": r(s.min), "max": r(s.max), "seeds": s.n }),
        )
    }
}

/// The figures a multi-seed run reports, by name, with how each is read
/// from one seed's stack and how it is printed.
type Pick = fn(&Replay, &StackRun) -> Option<f64>;

const FIGURES: [(&str, Pick, &str); 20] = [
    ("user_error_rate", |_, s| s.all.user_error_rate, "%"),
    ("answered", |_, s| Some(s.all.answered as f64), "n"),
    (
        "answers_vs_no_breaker",
        |r, s| window_vs(r, s, None, Window::Whole),
        "x",
    ),
    (
        "outage_answered",
        |_, s| answered_in(s, None, Window::Outage),
        "n",
    ),
    (
        "outage_answers_vs_no_breaker",
        |r, s| window_vs(r, s, None, Window::Outage),
        "x",
    ),
    (
        "after_heal_answered",
        |_, s| answered_in(s, None, Window::AfterHeal),
        "n",
    ),
    (
        "after_heal_answers_vs_no_breaker",
        |r, s| window_vs(r, s, None, Window::AfterHeal),
        "x",
    ),
    (
        "answered_wait_p99_s",
        |_, s| s.all.answered_wait.map(|w| w.p99_s),
        "s",
    ),
    (
        "answered_wait_max_s",
        |_, s| s.all.answered_wait.map(|w| w.max_s),
        "s",
    ),
    (
        "outage_answered_wait_p99_s",
        |_, s| s.outage.as_ref()?.answered_wait.map(|w| w.p99_s),
        "s",
    ),
    ("wasted_cost_usd", |_, s| Some(s.all.wasted_cost_usd), "$"),
    (
        "wasted_cost_usd_hangs_unbilled",
        |_, s| Some(s.all.wasted_cost_usd_hangs_unbilled),
        "$",
    ),
    ("recovery_lag_s", |_, s| slowest_lag(s), "s"),
    // Last, so that the documented tables above them stay as they were.
    ("cost_usd", |_, s| Some(s.all.cost_usd), "$"),
    ("amplification", |_, s| s.all.amplification, "x"),
    ("rejected", |_, s| Some(s.all.rejected as f64), "n"),
    ("attempts", |_, s| Some(attempts(&s.all)), "n"),
    (
        "outage_user_error_rate",
        |_, s| s.outage.as_ref()?.user_error_rate,
        "%",
    ),
    (
        "outage_attempts",
        |_, s| s.outage.as_ref().map(attempts),
        "n",
    ),
    ("recovery_lag_bound_s", |_, s| slowest_lag_bound(s), "s"),
];

fn attempts(f: &Figures) -> f64 {
    f.attempts.iter().map(|(_, n)| *n as f64).sum()
}

/// The figures of one class of traffic (`by_key`), read from one seed's
/// stack and the class's index.
type KeyPick = fn(&Replay, &StackRun, usize) -> Option<f64>;

const KEY_FIGURES: [(&str, KeyPick, &str); 11] = [
    (
        "user_error_rate",
        |_, s, c| s.by_class.get(c)?.all.user_error_rate,
        "%",
    ),
    (
        "rejected",
        |_, s, c| Some(s.by_class.get(c)?.all.rejected as f64),
        "n",
    ),
    (
        "answered",
        |_, s, c| Some(s.by_class.get(c)?.all.answered as f64),
        "n",
    ),
    (
        "answers_vs_no_breaker",
        |r, s, c| window_vs(r, s, Some(c), Window::Whole),
        "x",
    ),
    (
        "outage_answered",
        |_, s, c| answered_in(s, Some(c), Window::Outage),
        "n",
    ),
    (
        "outage_answers_vs_no_breaker",
        |r, s, c| window_vs(r, s, Some(c), Window::Outage),
        "x",
    ),
    (
        "after_heal_answered",
        |_, s, c| answered_in(s, Some(c), Window::AfterHeal),
        "n",
    ),
    (
        "after_heal_answers_vs_no_breaker",
        |r, s, c| window_vs(r, s, Some(c), Window::AfterHeal),
        "x",
    ),
    (
        "answered_wait_p99_s",
        |_, s, c| s.by_class.get(c)?.all.answered_wait.map(|w| w.p99_s),
        "s",
    ),
    (
        "cost_usd",
        |_, s, c| Some(s.by_class.get(c)?.all.cost_usd),
        "$",
    ),
    (
        "attempts",
        |_, s, c| Some(attempts(&s.by_class.get(c)?.all)),
        "n",
    ),
];

/// What one class of traffic (or, `None`, the whole stack) answered in
/// window `w`.
fn answered_in(s: &StackRun, class: Option<usize>, w: Window) -> Option<f64> {
    report::stack_window(s, class, w).map(|f| f.answered as f64)
}

/// Answered in window `w` ÷ no breaker's answered in the same window.
fn window_vs(replay: &Replay, s: &StackRun, class: Option<usize>, w: Window) -> Option<f64> {
    let f = report::stack_window(s, class, w)?;
    report::vs_no_breaker(f.answered, report::no_breaker_answered(replay, class, w))
}

/// One stack over the seeds.
#[derive(Debug, Clone)]
pub struct StackSpread {
    pub name: &'static str,
    pub figures: Vec<(&'static str, &'static str, Option<Spread>)>,
    /// Seeds whose run ended with every breaker of the stack closed after
    /// its upstream's heal, of the seeds in which an upstream healed.
    pub closed_at_end: (usize, usize),
    /// With more than one class of traffic: per model (or `model/api_key`),
    /// its own figures over the seeds.
    pub by_key: Vec<KeySpread>,
}

/// One class of traffic of one stack over the seeds.
#[derive(Debug, Clone)]
pub struct KeySpread {
    pub key: String,
    pub figures: Vec<(&'static str, &'static str, Option<Spread>)>,
}

/// A scenario over several seeds.
#[derive(Debug, Clone)]
pub struct Seeds {
    pub scenario: String,
    pub seeds: Vec<u64>,
    pub stacks: Vec<StackSpread>,
}

pub fn summarize(replays: &[Replay]) -> Seeds {
    let first = &replays[0];
    let stacks = first
        .stacks
        .iter()
        .map(|s| {
            let runs: Vec<(&Replay, &StackRun)> = replays
                .iter()
                .filter_map(|r| Some((r, r.stack(s.name)?)))
                .collect();
            let figures = FIGURES
                .iter()
                .map(|(name, pick, unit)| {
                    let xs = runs.iter().filter_map(|(r, s)| pick(r, s)).collect();
                    (*name, *unit, Spread::of(xs))
                })
                .collect();
            let closed: Vec<bool> = runs.iter().filter_map(|(_, s)| closed_at_end(s)).collect();
            let by_key = if first.classes.len() > 1 {
                first
                    .classes
                    .iter()
                    .enumerate()
                    .map(|(c, key)| KeySpread {
                        key: key.clone(),
                        figures: KEY_FIGURES
                            .iter()
                            .map(|(name, pick, unit)| {
                                let xs = runs
                                    .iter()
                                    .filter(|(r, _)| r.classes.get(c) == Some(key))
                                    .filter_map(|(r, s)| pick(r, s, c))
                                    .collect();
                                (*name, *unit, Spread::of(xs))
                            })
                            .collect(),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            StackSpread {
                name: s.name,
                figures,
                closed_at_end: (closed.iter().filter(|c| **c).count(), closed.len()),
                by_key,
            }
        })
        .collect();
    Seeds {
        scenario: first.scenario.clone(),
        seeds: replays.iter().map(|r| r.seed).collect(),
        stacks,
    }
}

fn show(unit: &str, x: f64) -> String {
    match unit {
        "%" => format!("{:.1}%", x * 100.0),
        "n" => format!("{x:.0}"),
        "x" => format!("{x:.3}"),
        "$" => format!("${x:.2}"),
        _ => format!("{x:.2}s"),
    }
}

/// What a seed sequence is, in words.
pub fn describe(seeds: &[u64]) -> String {
    match (seeds.first(), seeds.last()) {
        (Some(a), Some(b)) if seeds.len() > 1 => {
            format!(
                "{} seeds, {a} to {b} (the file's seed, then each next one)",
                seeds.len()
            )
        }
        (Some(a), _) => format!("1 seed, {a}"),
        _ => "no seeds".to_owned(),
    }
}

/// Per stack, each figure's median and range over the seeds.
pub fn table(s: &Seeds) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "outage replay over seeds: {}, {}",
        s.scenario,
        describe(&s.seeds)
    );
    let _ = writeln!(
        out,
        "each figure: median [least – most] over the seeds that have it (of {}); closed at the \
         end: seeds whose every breaker re-closed after its upstream's heal, of the seeds with a heal",
        s.seeds.len()
    );
    for stack in &s.stacks {
        let _ = writeln!(out);
        let (closed, of) = stack.closed_at_end;
        let _ = writeln!(
            out,
            "{}: closed at the end in {closed} of {of} seeds",
            stack.name
        );
        for (name, unit, spread) in &stack.figures {
            // Only a breaker with health probes has a lag bound.
            if *name == "recovery_lag_bound_s" && spread.is_none() {
                continue;
            }
            let _ = writeln!(out, "  {name:<34} {}", cell(unit, *spread, s.seeds.len()));
        }
        for key in &stack.by_key {
            let _ = writeln!(out, "  {} by key {}:", stack.name, key.key);
            for (name, unit, spread) in &key.figures {
                let _ = writeln!(out, "    {name:<32} {}", cell(unit, *spread, s.seeds.len()));
            }
        }
    }
    out
}

/// A figure's median and range, with the count of seeds that had it when
/// some did not.
fn cell(unit: &str, spread: Option<Spread>, seeds: usize) -> String {
    spread.map_or_else(
        || "—".to_owned(),
        |x| {
            let missing = if x.n < seeds {
                format!(" ({} seeds)", x.n)
            } else {
                String::new()
            };
            format!(
                "{} [{} – {}]{missing}",
                show(unit, x.median),
                show(unit, x.min),
                show(unit, x.max)
            )
        },
    )
}

pub fn json(s: &Seeds) -> String {
    let stacks: Vec<Value> = s
        .stacks
        .iter()
        .map(|st| {
            let mut m = serde_json::Map::new();
            m.insert("name".into(), json!(st.name));
            m.insert(
                "closed_at_end".into(),
                json!({ "seeds": st.closed_at_end.0, "of": st.closed_at_end.1 }),
            );
            for (name, unit, spread) in &st.figures {
                let digits = if *unit == "n" { 0 } else { 6 };
                m.insert((*name).into(), Spread::json(*spread, digits));
            }
            if !st.by_key.is_empty() {
                let keys: serde_json::Map<String, Value> = st
                    .by_key
                    .iter()
                    .map(|k| {
                        let figures: serde_json::Map<String, Value> = k
                            .figures
                            .iter()
                            .map(|(name, unit, spread)| {
                                let digits = if *unit == "n" { 0 } else { 6 };
                                ((*name).to_owned(), Spread::json(*spread, digits))
                            })
                            .collect();
                        (k.key.clone(), Value::Object(figures))
                    })
                    .collect();
                m.insert("by_key".into(), Value::Object(keys));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "scenario": s.scenario,
        "seeds": s.seeds,
        "seed_sequence": "the file's seed, then seed + 1, seed + 2, …",
        "stacks": stacks,
    })
    .to_string()
}
