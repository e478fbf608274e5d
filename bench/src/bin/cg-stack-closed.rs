//! Instructions per call of `tower_circuit_breaker_bench::callgrind::stack_closed`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::stack_closed,
    tower_circuit_breaker_bench::rows::Path::StackClosed
);
