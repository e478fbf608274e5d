//! The `metrics` feature: what a recorder sees, and the Prometheus example's
//! scrape over a real connection.
//!
//! Only the scrape test installs the global recorder; the others set a
//! Prometheus recorder as the thread's local one, on a current-thread
//! runtime with time paused.

#[path = "../../examples/prometheus/app.rs"]
mod app;

use crate::runner::{Rt, Trial};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http_body_util::{BodyExt, Empty};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::keyed::{self, KeyFn, KeySecret, KeyedBreakers};
use tower_circuit_breaker::metrics::{
    MetricsSwitch, TIME_TO_FIRST_BYTE, TIME_TO_FIRST_BYTE_BUCKETS,
};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Outcome, State};

fn failing() -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = std::convert::Infallible,
> + Clone {
    tower::service_fn(|_: http::Request<String>| async {
        Ok(http::Response::builder()
            .status(503)
            .body(String::new())
            .unwrap())
    })
}

/// The sample of the series whose name and labels start with `series`.
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn the_scrape_over_a_real_connection_shows_a_tripped_breakers_state_and_counts() {
    // Built first: the recorder installed afterwards is the one it reports to.
    let mut client = app::breaker_layer().layer(failing());
    let breaker = client.breaker().clone();
    let handle = app::install_recorder();

    for _ in 0..3 {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(String::new()))
            .await;
        assert_eq!(res.unwrap().status(), 503);
    }
    assert_eq!(breaker.state(), State::Open);
    for _ in 0..2 {
        let err = client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(String::new()))
            .await;
        assert!(err.unwrap_err().is_circuit_open());
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(app::serve_metrics(listener, handle));
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let res = http
        .get(format!("http://{addr}/metrics").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let scrape = String::from_utf8(body.to_vec()).unwrap();

    let labels = r#"breaker="gpt-4o",key="""#;
    let at = |series: &str| {
        sample(&scrape, series).unwrap_or_else(|| panic!("no {series} in the scrape:\n{scrape}"))
    };
    assert_eq!(
        at(&format!("circuit_breaker_state{{{labels}}}")),
        1.0,
        "open"
    );
    assert_eq!(
        at(&format!(
            r#"circuit_breaker_calls_total{{{labels},outcome="failure"}}"#
        )),
        3.0
    );
    assert_eq!(
        at(&format!(
            r#"circuit_breaker_rejections_total{{{labels},reason="open"}}"#
        )),
        2.0
    );
    assert_eq!(
        at(&format!(
            r#"circuit_breaker_transitions_total{{{labels},from="closed",to="open"}}"#
        )),
        1.0
    );
    assert_eq!(
        at(&format!(
            "circuit_breaker_time_to_first_byte_seconds_count{{{labels}}}"
        )),
        3.0
    );
    assert!(scrape.contains("# HELP circuit_breaker_state "), "{scrape}");
    assert!(
        scrape.contains("# TYPE circuit_breaker_time_to_first_byte_seconds histogram"),
        "{scrape}"
    );
    let buckets: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("circuit_breaker_time_to_first_byte_seconds_bucket{"))
        .collect();
    assert_eq!(
        buckets.len(),
        TIME_TO_FIRST_BYTE_BUCKETS.len() + 1,
        "one line a bound, and +Inf:\n{scrape}"
    );
    assert_eq!(
        at(&format!(
            r#"circuit_breaker_time_to_first_byte_seconds_bucket{{{labels},le="+Inf"}}"#
        )),
        3.0
    );
}

/// Runs `f` with a Prometheus recorder as this thread's, and renders it.
fn with_recorder(f: impl FnOnce()) -> String {
    let recorder: PrometheusRecorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, f);
    handle.render()
}

async fn each_outcome_is_counted_under_its_own_label() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("outcomes")
        .metrics(true)
        .build()
        .unwrap();
    let scrape = with_recorder(|| {
        breaker.admit().unwrap().record(Outcome::Success);
        breaker.admit().unwrap().record(Outcome::Success);
        breaker.admit().unwrap().record(Outcome::Ignored);
        breaker
            .admit()
            .unwrap()
            .record(Outcome::RateLimited { retry_after: None });
        drop(breaker.admit().unwrap());
    });
    let calls = |o: &str| {
        sample(
            &scrape,
            &format!(r#"circuit_breaker_calls_total{{breaker="outcomes",key="",outcome="{o}"}}"#),
        )
    };
    assert_eq!(calls("success"), Some(2.0), "{scrape}");
    assert_eq!(calls("ignored"), Some(1.0));
    assert_eq!(calls("rate_limited"), Some(1.0));
    assert_eq!(calls("dropped"), Some(1.0));
    assert_eq!(calls("failure"), None, "never reported, never created");
    assert_eq!(
        sample(
            &scrape,
            r#"circuit_breaker_state{breaker="outcomes",key=""}"#
        ),
        Some(0.0)
    );
}

async fn the_volume_guard_is_its_own_reason() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("volume")
        .volume_guard(1, Duration::from_secs(60))
        .metrics(true)
        .build()
        .unwrap();
    let scrape = with_recorder(|| {
        breaker.admit().unwrap().record(Outcome::Success);
        assert!(breaker.admit().is_err());
    });
    let series =
        r#"circuit_breaker_rejections_total{breaker="volume",key="",reason="volume_guard"}"#;
    assert_eq!(sample(&scrape, series), Some(1.0), "{scrape}");
    assert!(!scrape.contains(r#"reason="open""#), "{scrape}");
    assert_eq!(
        sample(&scrape, r#"circuit_breaker_state{breaker="volume",key=""}"#),
        Some(0.0),
        "the circuit stays closed"
    );
}

async fn a_spend_guard_counts_its_warning_and_its_rejections() {
    use tower_circuit_breaker::spend::{Charge, Period, SpendGuard};
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("agent")
        .spend_guard(SpendGuard::tokens(100, Period::UtcDay).warn_at(0.8))
        .metrics(true)
        .build()
        .unwrap();
    let call = |tokens| {
        let mut permit = breaker.admit().unwrap();
        permit.charge(Charge::Observed(tokens));
        permit.record(Outcome::Success);
    };
    let scrape = with_recorder(|| {
        call(50);
        call(30); // 80 %: the warning
        call(5); // no second one in the period
        call(15); // 100: spent
        assert!(breaker.admit().is_err());
        assert!(breaker.admit().is_err());
    });
    assert_eq!(
        sample(
            &scrape,
            r#"circuit_breaker_spend_warnings_total{breaker="agent",key=""}"#
        ),
        Some(1.0),
        "{scrape}"
    );
    let series =
        r#"circuit_breaker_rejections_total{breaker="agent",key="",reason="spend_exceeded"}"#;
    assert_eq!(sample(&scrape, series), Some(2.0), "{scrape}");
}

async fn keyed_series_carry_the_stored_key_and_a_hashed_key_stays_hashed() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .name("chat")
        .consecutive_failures(1)
        .metrics(true)
        .build()
        .unwrap();
    let secret = KeySecret::new("0123456789abcdef0123456789abcdef").unwrap();
    let request = http::Request::builder()
        .header("x-api-key", "sk-live-very-secret")
        .body(())
        .unwrap();
    let hashed = keyed::header_hashed("x-api-key", &secret)
        .key(&request)
        .unwrap();
    let scrape = with_recorder(|| {
        set.admit(hashed.as_str()).unwrap().record(Outcome::Failure);
        assert!(set.admit(hashed.as_str()).is_err());
        set.admit("gpt-4o").unwrap().record(Outcome::Success);
    });
    assert!(!scrape.contains("sk-live"), "{scrape}");
    let key = hashed.as_str();
    assert_eq!(
        sample(
            &scrape,
            &format!(r#"circuit_breaker_state{{breaker="chat",key="{key}"}}"#)
        ),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(
        sample(
            &scrape,
            r#"circuit_breaker_state{breaker="chat",key="gpt-4o"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &scrape,
            &format!(
                r#"circuit_breaker_rejections_total{{breaker="chat",key="{key}",reason="open"}}"#
            )
        ),
        Some(1.0)
    );
}

async fn the_switch_turns_reporting_off_and_on_at_run_time() {
    let switch = MetricsSwitch::new(true);
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .name("switched")
        .metrics_switch(&switch)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let scrape = with_recorder(|| {
        breaker.admit().unwrap().record(Outcome::Success);
        switch.set(false);
        breaker.admit().unwrap().record(Outcome::Success);
        breaker.admit().unwrap().record(Outcome::Success);
        switch.set(true);
        breaker.admit().unwrap().record(Outcome::Success);
    });
    let series = r#"circuit_breaker_calls_total{breaker="switched",key="",outcome="success"}"#;
    assert_eq!(sample(&scrape, series), Some(2.0), "{scrape}");
    assert_eq!(breaker.snapshot().counters.successes, 4);
}

async fn a_breaker_built_without_metrics_reports_nothing() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("quiet")
        .consecutive_failures(1)
        .build()
        .unwrap();
    let scrape = with_recorder(|| {
        breaker.admit().unwrap().record(Outcome::Failure);
        assert!(breaker.admit().is_err());
    });
    assert!(!scrape.contains("quiet"), "{scrape}");
}

async fn time_to_first_byte_is_measured_from_admission_to_the_head() {
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .name("ttfb")
        .metrics(true)
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(|_: http::Request<String>| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    }));
    let recorder: PrometheusRecorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(TIME_TO_FIRST_BYTE.to_string()),
            TIME_TO_FIRST_BYTE_BUCKETS,
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(http::Request::new(String::new()))
        .await;
    assert_eq!(res.unwrap().status(), 200);
    let scrape = handle.render();
    assert_eq!(
        sample(
            &scrape,
            r#"circuit_breaker_time_to_first_byte_seconds_sum{breaker="ttfb",key=""}"#
        ),
        Some(1.5),
        "{scrape}"
    );
    // 1.5 s falls in the bucket that ends at 1.5 s, not the one below.
    let bucket = |le: &str| {
        sample(
            &scrape,
            &format!(
                r#"circuit_breaker_time_to_first_byte_seconds_bucket{{breaker="ttfb",key="",le="{le}"}}"#
            ),
        )
    };
    assert_eq!(bucket("1"), Some(0.0), "{scrape}");
    assert_eq!(bucket("1.5"), Some(1.0), "{scrape}");
    assert_eq!(bucket("+Inf"), Some(1.0), "{scrape}");
}

/// The facade cannot delete a series: a key the set evicted keeps its
/// series in the recorder until the recorder drops them (the module docs say
/// how to bound them with `metrics-exporter-prometheus`'s idle timeout,
/// whose clock a test cannot pause).
async fn an_evicted_keys_series_stay_in_the_recorder_until_it_drops_them() {
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .name("churn")
        .max_keys(1000)
        .idle_timeout(Duration::from_secs(1))
        .metrics(true)
        .build()
        .unwrap();
    let recorder: PrometheusRecorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    for batch in 0..20 {
        for k in 0..1000 {
            set.admit(&format!("k{batch}-{k}"))
                .unwrap()
                .record(Outcome::Success);
        }
        // A sweep marks the batch idle, the next one evicts it (sweeps run
        // when new keys come, at most once per idle timeout).
        for sweep in 0..2 {
            tokio::time::advance(Duration::from_secs(1)).await;
            set.admit(&format!("sweep{batch}-{sweep}"))
                .unwrap()
                .record(Outcome::Success);
        }
    }
    let scrape = handle.render();
    let series = scrape
        .lines()
        .filter(|l| l.starts_with("circuit_breaker_calls_total{"))
        .count();
    println!(
        "20,000 keys through max_keys(1000): {} keys held, {series} call series in the recorder",
        set.len()
    );
    assert!(set.len() <= 1000);
    assert!(series > 20_000, "{series}");
}

/// This module's tests, for the runner.
pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio(
            "metrics::an_evicted_keys_series_stay_in_the_recorder_until_it_drops_them",
            Rt::Paused,
            an_evicted_keys_series_stay_in_the_recorder_until_it_drops_them,
        ),
        Trial::tokio(
            "metrics::the_scrape_over_a_real_connection_shows_a_tripped_breakers_state_and_counts",
            Rt::Current,
            the_scrape_over_a_real_connection_shows_a_tripped_breakers_state_and_counts,
        ),
        Trial::tokio(
            "metrics::each_outcome_is_counted_under_its_own_label",
            Rt::Paused,
            each_outcome_is_counted_under_its_own_label,
        ),
        Trial::tokio(
            "metrics::a_spend_guard_counts_its_warning_and_its_rejections",
            Rt::Paused,
            a_spend_guard_counts_its_warning_and_its_rejections,
        ),
        Trial::tokio(
            "metrics::the_volume_guard_is_its_own_reason",
            Rt::Paused,
            the_volume_guard_is_its_own_reason,
        ),
        Trial::tokio(
            "metrics::keyed_series_carry_the_stored_key_and_a_hashed_key_stays_hashed",
            Rt::Paused,
            keyed_series_carry_the_stored_key_and_a_hashed_key_stays_hashed,
        ),
        Trial::tokio(
            "metrics::the_switch_turns_reporting_off_and_on_at_run_time",
            Rt::Paused,
            the_switch_turns_reporting_off_and_on_at_run_time,
        ),
        Trial::tokio(
            "metrics::a_breaker_built_without_metrics_reports_nothing",
            Rt::Paused,
            a_breaker_built_without_metrics_reports_nothing,
        ),
        Trial::tokio(
            "metrics::time_to_first_byte_is_measured_from_admission_to_the_head",
            Rt::Paused,
            time_to_first_byte_is_measured_from_admission_to_the_head,
        ),
    ]
}
