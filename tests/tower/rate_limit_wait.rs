//! `max_rate_limit_wait`: the longest one announced wait paces or
//! quota-gates a circuit, over a real connection and at its bounds.

use std::time::Duration;

use tower::{Service, ServiceExt};
use tower_circuit_breaker::classify::{LlmClassifier, MAX_RETRY_AFTER};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, ConfigError, Outcome, Rejection};

use crate::support::{get_req, http_client, serve_raw};

const WEEK_429: &[u8] =
    b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 604800\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

#[tokio::test(start_paused = true)]
async fn a_week_long_retry_after_gates_a_key_for_the_setting_then_the_upstream_is_asked_again() {
    let (addr, hits) = serve_raw(WEEK_429.to_vec()).await;
    let layer = CircuitBreakerLayer::builder()
        .pace_rate_limits(true)
        .max_rate_limit_wait(Duration::from_secs(300))
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let mut client = tower::Layer::layer(&layer, http_client());

    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/"))
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    let open = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/"))
        .await
        .unwrap_err();
    let open = open.circuit_open().expect("paced");
    assert_eq!(open.reason(), Rejection::RateLimited);
    assert_eq!(open.retry_after(), Some(Duration::from_secs(300)));

    tokio::time::advance(Duration::from_secs(299)).await;
    assert!(breaker.admit().is_err(), "still paced a second before");
    tokio::time::advance(Duration::from_secs(1)).await;
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/"))
        .await
        .unwrap();
    assert_eq!(res.status(), 429, "asked again after 5 minutes, not a week");
    assert_eq!(hits.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_setting_caps_an_announced_quota_reset_too() {
    const WEEK_402: &[u8] = b"HTTP/1.1 402 Payment Required\r\nretry-after: 604800\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    let (addr, hits) = serve_raw(WEEK_402.to_vec()).await;
    let layer = CircuitBreakerLayer::builder()
        .quota_gate(Duration::from_secs(60))
        .max_rate_limit_wait(Duration::from_secs(600))
        .build()
        .unwrap()
        .with_classifier(LlmClassifier::new());
    let mut client = tower::Layer::layer(&layer, http_client());
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/"))
        .await
        .unwrap();
    assert_eq!(res.status(), 402);
    let err = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/"))
        .await
        .unwrap_err();
    let open = err.circuit_open().expect("quota-gated");
    assert_eq!(open.reason(), Rejection::Quota);
    assert_eq!(
        open.retry_after(),
        Some(Duration::from_secs(600)),
        "the announced week, capped"
    );
    assert_eq!(hits.get(), 1);
}

/// How long `wait` paces a breaker built with `max_rate_limit_wait(max)`.
fn paced_for(max: Duration, wait: Duration) -> Result<Option<Duration>, ConfigError> {
    let b = Breaker::builder()
        .pace_rate_limits(true)
        .max_rate_limit_wait(max)
        .build()?;
    b.admit().unwrap().record(Outcome::RateLimited {
        retry_after: Some(wait),
    });
    Ok(b.admit().err().and_then(|open| open.retry_after()))
}

#[tokio::test(start_paused = true)]
async fn the_setting_at_zero_one_nanosecond_large_and_max() {
    let week = MAX_RETRY_AFTER;
    assert!(matches!(
        paced_for(Duration::ZERO, week),
        Err(ConfigError::ZeroRateLimitWait)
    ));
    // 1 ns: the pacing ends as it begins.
    assert_eq!(
        paced_for(Duration::from_nanos(1), week).unwrap(),
        Some(Duration::from_nanos(1))
    );
    // Large and `MAX`: the announced week holds, as by default.
    for max in [Duration::from_secs(10 * 365 * 86_400), Duration::MAX] {
        assert_eq!(paced_for(max, week).unwrap(), Some(week), "{max:?}");
    }
    let default = Breaker::builder().pace_rate_limits(true).build().unwrap();
    default.admit().unwrap().record(Outcome::RateLimited {
        retry_after: Some(week),
    });
    assert_eq!(default.admit().unwrap_err().retry_after(), Some(week));
    // A wait under the setting is the wait.
    assert_eq!(
        paced_for(Duration::from_secs(300), Duration::from_secs(7)).unwrap(),
        Some(Duration::from_secs(7))
    );
}
