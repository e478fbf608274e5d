//! Benchmarks of `tower-circuit-breaker` side by side with other circuit
//! breakers, measured in one run on one machine.
//!
//! Every breaker gets the same configuration (a window of the last 20 calls,
//! opening at 50 % failures once the window is full, 30 s open), is built
//! outside the timed loop, and wraps the same trivial `tower::service_fn`.
//! Each row is driven in two shapes: one task calling and awaiting in a loop
//! on a current-thread runtime, and 16 tasks on a 2-worker multi-thread
//! runtime, sharing one breaker.
//!
//! - `cargo run --release -p tower-circuit-breaker-bench --bin bench-report`
//!   prints the table and writes `target/bench-report.json`.
//! - `cargo bench -p tower-circuit-breaker-bench` runs the same rows under
//!   criterion.
//! - `bench/callgrind.sh` counts the instructions the closed path adds per
//!   call.

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod adapters;
pub mod alloc;
pub mod callgrind;
pub mod measure;
pub mod report;
pub mod rows;
