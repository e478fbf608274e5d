//! `Failover` reads the body of a 429 it moves on from, through the member's
//! breaker, so a quota-gated breaker sees `insufficient_quota` and opens:
//! over a real connection.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::Empty;
use tower::ServiceExt;
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::failover::Failover;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Reason, State, TripMode};

use crate::support::{http_client, serve, Hits};

const QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;

fn breaker() -> Breaker {
    Breaker::builder()
        .quota_gate(Duration::from_secs(3600))
        .trip_mode(TripMode::Open)
        .jitter(0.0)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_quota_429_read_on_the_way_to_the_next_member_opens_the_primary() {
    let (primary_hits, second_hits) = (Hits::default(), Hits::default());
    let (p, s) = (primary_hits.clone(), second_hits.clone());
    let app = Router::new()
        .route(
            "/primary",
            get(move || {
                let p = p.clone();
                async move {
                    p.hit();
                    (
                        StatusCode::TOO_MANY_REQUESTS,
                        [("content-type", "application/json")],
                        QUOTA,
                    )
                }
            }),
        )
        .route(
            "/second",
            get(move || {
                let s = s.clone();
                async move {
                    s.hit();
                    "ok"
                }
            }),
        );
    let addr = serve(app).await;
    let (primary, second) = (breaker(), breaker());
    let failover = Failover::new(CircuitBreaker::with_classifier(
        http_client(),
        primary.clone(),
        LlmClassifier::new(),
    ))
    .fallback_with(
        CircuitBreaker::with_classifier(http_client(), second.clone(), LlmClassifier::new()),
        move |req: &mut Request<Empty<Bytes>>| {
            *req.uri_mut() = format!("http://{addr}/second").parse::<Uri>().unwrap();
        },
    )
    .with_classifier(LlmClassifier::new())
    .jitter(Duration::ZERO, Duration::ZERO);
    let request = || {
        Request::get(format!("http://{addr}/primary"))
            .body(Empty::<Bytes>::new())
            .unwrap()
    };

    let res = failover.clone().oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the second member answered");
    assert_eq!(primary.state(), State::Open, "the quota body was read");
    assert_eq!(primary.snapshot().reason, Some(Reason::QuotaExhausted));

    for _ in 0..4 {
        let res = failover.clone().oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(primary_hits.get(), 1, "later requests skip the primary");
    assert_eq!(second_hits.get(), 5);
    assert_eq!(second.state(), State::Closed);
}
