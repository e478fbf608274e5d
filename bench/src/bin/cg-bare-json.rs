//! Instructions per call of `tower_circuit_breaker_bench::callgrind::bare_json`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::bare_json,
    tower_circuit_breaker_bench::rows::Path::BareJson
);
