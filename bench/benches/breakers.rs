//! The report's rows under criterion: `cargo bench -p tower-circuit-breaker-bench`.
//!
//! Each sample builds the row's service (and trips it, for the open rows),
//! warms it up, then times `iters` calls in the row's shape; only the calls
//! are timed. `bench-report` prints the same rows as one table, with
//! allocations and ratios.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tower_circuit_breaker_bench::measure::{Mode, Plan, Shape};
use tower_circuit_breaker_bench::rows;

fn breakers(c: &mut Criterion) {
    for shape in Shape::ALL {
        let mut group = c.benchmark_group(shape.label());
        for row in rows::all() {
            group.bench_function(BenchmarkId::from_parameter(row.name()), |b| {
                b.iter_custom(|iters| {
                    let rt = shape.runtime();
                    let plan = Plan {
                        rt: &rt,
                        shape,
                        mode: Mode::Time { calls: iters },
                    };
                    let ns = row
                        .run(&plan)
                        .unwrap_or_else(|e| panic!("{} ({}): {e}", row.name(), shape.label()));
                    Duration::from_secs_f64(ns * iters as f64 / 1e9)
                })
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = breakers
}
criterion_main!(benches);
