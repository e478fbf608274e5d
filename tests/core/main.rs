//! The state machine and its settings: trip rules, configuration extremes,
//! time without timers, the reference model, threads and stress,
//! cancellation, keyed breakers, callbacks and hostile input.

#[path = "../support/mod.rs"]
mod support;

mod breaker_rules;
mod callbacks;
mod cancellation;
mod config;
mod deadlines;
mod fuzz_regressions;
mod hostile_input;
mod keyed;
mod limit;
mod model;
mod spend;
mod stress;
mod threads;
