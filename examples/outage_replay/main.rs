//! Replays an upstream outage, in virtual time, against the same requests
//! with and without the breaker, and reports what each stack cost the users
//! and the upstream.
//!
//! ```text
//! cargo run --release --example outage_replay                      # scenarios/seed-000-night.toml
//! cargo run --release --example outage_replay -- FILE.toml
//! cargo run --release --example outage_replay -- --json FILE.toml  # one JSON object on stdout
//! cargo run --release --example outage_replay -- --svg out.svg FILE.toml
//! cargo run --release --example outage_replay -- --seeds 11 FILE.toml   # medians over 11 seeds
//! cargo run --release --example outage_replay -- --sweep FILE.toml       # rank breaker settings
//! ```
//!
//! Stacks replayed (outermost first):
//!
//! - `no-breaker`: total timeout -> retry -> attempt timeout -> primary;
//! - `breaker`: total timeout -> retry -> circuit breaker -> attempt timeout
//!   -> primary, built by `tower_circuit_breaker::stack`, grading as the
//!   crate does by default (`TripMode::Graded`); `--graded-k K` sets `K`
//! - `breaker-open` (with `--graded-k` only): the breaker stack opening all
//!   or nothing (`TripMode::Open`), for the comparison;
//! - `naive-failover` (more than one upstream): no breaker; each request
//!   tries the upstreams in order until one answers;
//! - `failover` (more than one upstream): each upstream behind its own
//!   breaker, tried in order, skipping open ones, with a 50–200 ms pause
//!   before a fallback.
//!
//! A scenario file (see `scenarios/README.md`) gives the seed, the arrival
//! rate, the client's timeouts and retries, the breaker's configuration, and
//! per upstream its price and a list of phases, each a mix of responses
//! (`ok`, `status`, `hang`, `reset`, `sse_error`, `content_filter`, ...; a
//! `status` may carry an `error` body such as `insufficient_quota`) whose
//! probabilities add up to 1. Keys are required unless the format gives a
//! default; unknown keys are errors that name the file, the key and the line.
//!
//! The report gives, per stack, for every request and for the requests that
//! arrived while the primary was failing: errors (a rejection is one),
//! answered and all waits, time to first byte, attempts per request, cost
//! and wasted cost; per upstream, the heal, the time to trip and the
//! recovery lag; and, when the scenario carries one, the write-up's own
//! table beside the replay's figures.
//!
//! Every breaker, retry and failover classifies answers with the crate's
//! `LlmClassifier`, so an `sse_error` stream is a failure once its error
//! event arrives and a `content_filter` answer counts for nothing.
//!
//! Choices the file does not make: a `Retry-After` is waited out up to 20 s
//! (and at most half the total timeout); a time window (`window_s`) has 20
//! buckets; without `probe_timeout_s`, a half-open probe's deadline is the
//! core's default (the open duration, or the slow threshold when shorter; the
//! `breaker` stack caps it at the attempt timeout).

mod budget;
mod engine;
mod figures;
mod report;
mod scenario;
mod seeds;
mod svg;
mod sweep;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: outage_replay [--json] [--seeds N] [--graded-k K] [--svg OUT.svg] [--sweep [--grid KEY=V1,V2 ...] [--objective ORDER]] [SCENARIO.toml]";

fn main() -> ExitCode {
    let mut json = false;
    let mut sweep = false;
    let mut grid = Vec::new();
    let mut svg = None;
    let mut file = None;
    let mut seeds: Option<u32> = None;
    let mut objective: Option<String> = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--json") => json = true,
            Some("--sweep") => sweep = true,
            Some("--seeds") => match args.next().and_then(|a| a.to_str()?.parse().ok()) {
                Some(n) if (1..=1000).contains(&n) => seeds = Some(n),
                _ => {
                    eprintln!("error: --seeds needs a count, 1 to 1000\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            Some("--objective") => match args.next().and_then(|a| a.into_string().ok()) {
                Some(o) => {
                    sweep = true;
                    objective = Some(o);
                }
                None => {
                    eprintln!("error: --objective needs an order, e.g. answered,errors,p99,lag,wasted\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            Some("--grid") => match args.next().and_then(|a| a.into_string().ok()) {
                Some(axis) => {
                    sweep = true;
                    grid.push(axis);
                }
                None => {
                    eprintln!("error: --grid needs KEY=V1,V2,...\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            Some("--graded-k") => match args.next().and_then(|a| a.to_str()?.parse().ok()) {
                Some(k) => {
                    let _ = scenario::GRADED_K.set(k);
                }
                None => {
                    eprintln!("error: --graded-k needs a number in [2.5, 10)\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            Some("--svg") => match args.next() {
                Some(path) => svg = Some(PathBuf::from(path)),
                None => {
                    eprintln!("error: --svg needs a file name\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            Some("-h" | "--help") => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            Some(flag) if flag.starts_with('-') => {
                eprintln!("error: unknown option {flag}\n{USAGE}");
                return ExitCode::from(2);
            }
            _ if file.is_some() => {
                eprintln!("error: one scenario file at a time\n{USAGE}");
                return ExitCode::from(2);
            }
            _ => file = Some(PathBuf::from(arg)),
        }
    }
    let file = file.unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/seed-000-night.toml"
        ))
    });

    let scenario = match scenario::load(&file) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if sweep {
        let grid = match scenario::parse_grid(&grid) {
            Ok(g) => sweep::grid(&scenario, g),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let order = match sweep::Objective::parse(objective.as_deref()) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let name = file.display().to_string();
        let n = seeds.unwrap_or(seeds::DEFAULT_SEEDS);
        let started = std::time::Instant::now();
        let outcome = sweep::run(
            &text,
            &name,
            &grid,
            &seeds::sequence(scenario.seed, n),
            &order,
        );
        eprintln!("swept in {:.1} s", started.elapsed().as_secs_f64());
        return match outcome {
            Ok(s) if json => {
                println!("{}", sweep::json(&s));
                ExitCode::SUCCESS
            }
            Ok(s) => {
                print!("{}", sweep::table(&s));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(n) = seeds {
        let started = std::time::Instant::now();
        let runs = seeds::replay_seeds(
            &scenario,
            &scenario.stacks(),
            &seeds::sequence(scenario.seed, n),
        );
        eprintln!(
            "replayed {n} seeds in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        return match runs {
            Ok(runs) => {
                let s = seeds::summarize(&runs);
                if json {
                    println!("{}", seeds::json(&s));
                } else {
                    print!("{}", seeds::table(&s));
                    print!("{}", engine::routing_table(&runs));
                    if scenario.spend.is_some() {
                        print!("{}", budget::by_traffic(&runs));
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {}: {e}", file.display());
                ExitCode::FAILURE
            }
        };
    }
    let replay = match engine::replay(&scenario) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    if json {
        println!("{}", report::json(&replay));
    } else {
        print!("{}", report::table(&replay));
        print!("{}", engine::routing_table(std::slice::from_ref(&replay)));
    }
    if let Some(path) = svg {
        if let Err(e) = std::fs::write(&path, svg::svg(&replay)) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("timeline written to {}", path.display());
    }
    ExitCode::SUCCESS
}
