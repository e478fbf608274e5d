//! Instructions per call of `tower_circuit_breaker_bench::callgrind::http_json`,
//! alone in its binary; see `bench/callgrind.sh`.

tower_circuit_breaker_bench::callgrind_main!(
    tower_circuit_breaker_bench::callgrind::http_json,
    tower_circuit_breaker_bench::rows::Path::HttpJson
);
