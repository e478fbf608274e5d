//! Instructions per call of `tower_circuit_breaker_bench::callgrind::tower_resilience_slow`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::tower_resilience_slow,
    tower_circuit_breaker_bench::rows::Path::SlowRule
);
