//! Instructions per call of `tower_circuit_breaker_bench::callgrind::closed_rotating`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::closed_rotating,
    tower_circuit_breaker_bench::rows::Path::Closed
);
