//! The axum example, end to end over real connections: once the upstream is
//! down, the app answers 503 with `Retry-After` without calling it.

#[path = "../../examples/axum_app.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn chat(client: &HttpClient, app: std::net::SocketAddr) -> (StatusCode, Option<u64>, Bytes) {
    let req = Request::post(format!("http://{app}/chat"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","stream":true}"#,
        )))
        .unwrap();
    let res = client.request(req).await.unwrap();
    let status = res.status();
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().expect("whole seconds"));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, body)
}

#[tokio::test]
async fn once_the_upstream_is_down_the_app_answers_503_without_calling_it() {
    let (upstream_addr, upstream) = example::spawn_upstream().await;
    let breaker = example::breaker(Duration::from_secs(60));
    let handle = breaker.breaker().clone();
    let app = example::serve(example::app(upstream_addr, breaker)).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    for _ in 0..2 {
        let (status, retry_after, body) = chat(&client, app).await;
        assert_eq!((status, retry_after), (StatusCode::OK, None));
        assert!(
            body.ends_with(b"data: [DONE]\n\n"),
            "the stream is proxied whole"
        );
    }

    upstream.set_down(true);
    for _ in 0..3 {
        // The upstream's own 503, passed through: no Retry-After.
        let (status, retry_after, body) = chat(&client, app).await;
        assert_eq!(
            (status, retry_after),
            (StatusCode::SERVICE_UNAVAILABLE, None)
        );
        assert!(String::from_utf8_lossy(&body).contains("upstream is down"));
    }
    assert_eq!(upstream.hits(), 5);
    assert_eq!(handle.state(), tower_circuit_breaker::State::Open);

    for _ in 0..20 {
        let (status, retry_after, body) = chat(&client, app).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let secs = retry_after.expect("the app's own 503 says when to come back");
        assert!((1..=60).contains(&secs), "{secs}");
        assert!(body.is_empty());
    }
    assert_eq!(
        upstream.hits(),
        5,
        "the upstream saw no call while the circuit was open"
    );
    assert_eq!(handle.snapshot().counters.rejected, 20);
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_until_the_circuit_opens() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = listener.local_addr().unwrap();
    drop(listener);
    let app = example::serve(example::app(
        nowhere,
        example::breaker(Duration::from_secs(60)),
    ))
    .await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    for _ in 0..3 {
        let (status, retry_after, _) = chat(&client, app).await;
        assert_eq!((status, retry_after), (StatusCode::BAD_GATEWAY, None));
    }
    let (status, retry_after, _) = chat(&client, app).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after.is_some());
}
