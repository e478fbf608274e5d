//! Prints the benchmark table and writes `target/bench-report.json`.
//!
//! ```text
//! cargo run --release -p tower-circuit-breaker-bench --bin bench-report -- \
//!     [--runs N] [--target-ms MS] [--filter TEXT|TEXT] [--shape 1-task|16-tasks]
//! ```

use std::time::Duration;

use tower_circuit_breaker_bench::alloc::{self, CountingAlloc};
use tower_circuit_breaker_bench::measure::Shape;
use tower_circuit_breaker_bench::{report, rows};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn usage() -> ! {
    eprintln!(
        "usage: bench-report [--runs N] [--target-ms MS] [--filter TEXT|TEXT] [--shape 1-task|16-tasks]"
    );
    std::process::exit(2)
}

fn main() {
    let mut settings = report::Settings::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--runs" => settings.runs = value().parse().unwrap_or_else(|_| usage()),
            "--target-ms" => {
                let ms = value().parse().unwrap_or_else(|_| usage());
                settings.target = Duration::from_millis(ms);
            }
            "--filter" => settings.filter = Some(value()),
            "--shape" => {
                settings.shapes = vec![Shape::from_label(&value()).unwrap_or_else(|| usage())];
            }
            _ => usage(),
        }
    }
    if settings.runs == 0 {
        usage();
    }
    assert!(
        alloc::installed(),
        "the counting allocator is not installed"
    );
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build; run with --release for figures worth reading");
    }

    let all = report::run(&rows::all(), &settings, |msg| eprintln!("{msg}"));
    println!("{}", report::table(&all, &settings));
    println!("Budget (DESIGN.md) and peers, same run:");
    println!("{}", report::budget(&all));

    let path = report::target_dir().join("bench-report.json");
    match std::fs::write(&path, report::json(&all)) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}
