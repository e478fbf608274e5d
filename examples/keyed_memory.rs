//! Mints a million distinct keys against a keyed breaker set capped at
//! 10,000 and prints the peak resident set, to show that unique keys cannot
//! grow memory without limit.
//!
//! ```text
//! cargo run --release --example keyed_memory
//! ```

use std::time::Duration;

use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::Outcome;

fn status(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_else(|| format!("{field} unavailable"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tokio::time::pause();
    let breakers = KeyedBreakers::builder()
        .max_keys(10_000)
        .idle_timeout(Duration::from_secs(60))
        .build()
        .expect("valid configuration");
    println!("before:  {}", status("VmRSS"));
    let mut key = String::new();
    for i in 0..1_000_000u32 {
        if i % 50_000 == 0 {
            // Time passes, so idle keys become evictable.
            tokio::time::advance(Duration::from_secs(61)).await;
        }
        key.clear();
        key.push_str("key-");
        key.push_str(&i.to_string());
        if let Ok(permit) = breakers.admit(&key) {
            permit.record(Outcome::Success);
        }
        if i == 9_999 {
            println!("at 10k:  {}  keys held {}", status("VmRSS"), breakers.len());
        }
    }
    println!("after 1M keys: keys held {} (cap 10,000)", breakers.len());
    println!("{}", status("VmRSS"));
    println!("{}", status("VmHWM"));
}
