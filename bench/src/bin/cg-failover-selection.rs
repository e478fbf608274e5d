//! Instructions per call of `tower_circuit_breaker_bench::callgrind::failover_selection`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::failover_selection,
    tower_circuit_breaker_bench::rows::Path::FailoverSelection
);
