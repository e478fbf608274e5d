//! Instructions per call of `tower_circuit_breaker_bench::callgrind::recloser_5xx`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::recloser_5xx,
    tower_circuit_breaker_bench::rows::Path::ClosedFailing
);
