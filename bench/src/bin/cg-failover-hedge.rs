//! Instructions per call of `tower_circuit_breaker_bench::callgrind::failover_hedge`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::failover_hedge,
    tower_circuit_breaker_bench::rows::Path::FailoverHedge
);
