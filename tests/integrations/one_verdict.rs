//! Every adapter judges a call the same way: the same answers of a real
//! OpenAI-compatible server on 127.0.0.1:0 (and a refused connection), sent
//! once through each of the tower service, `ReqwestClient`, the
//! reqwest-middleware middleware and the async-openai service, each with
//! its own breaker and the same classifier, leave the same counters.
//!
//! Time is paused; the reqwest clients have no pool-idle timer.

use crate::support_openai;

use async_openai::config::OpenAIConfig;
use async_openai::middleware::ReqwestService as OpenAiReqwest;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use http_body_util::BodyExt;
use support_openai::{closed_port, Mode, OpenAiServer};
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::reqwest::{ReqwestClient, ReqwestService};
use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Counters};

const BODY: &str = r#"{"model":"gpt-test","messages":[{"role":"user","content":"ping"}]}"#;

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

/// A breaker no single call can trip.
fn breaker(adapter: &str) -> Breaker {
    Breaker::builder().name(adapter).build().unwrap()
}

/// One call through the tower service over `ReqwestService`, body read to
/// its end.
async fn through_tower(base: &str, breaker: &Breaker) {
    let service = CircuitBreakerLayer::new(breaker.clone())
        .with_classifier(LlmClassifier::default())
        .layer(ReqwestService::new(reqwest_client()));
    let request = http::Request::post(format!("{base}/chat/completions"))
        .header("content-type", "application/json")
        .body(BODY.to_owned())
        .unwrap();
    if let Ok(response) = service.oneshot(request).await {
        let _ = response.into_body().collect().await;
    }
}

/// One call through `ReqwestClient`, body read to its end.
async fn through_reqwest_client(base: &str, breaker: &Breaker) {
    let http = reqwest_client();
    let client = ReqwestClient::with_select(http.clone(), breaker.clone(), LlmClassifier::new());
    let request = http
        .post(format!("{base}/chat/completions"))
        .header("content-type", "application/json")
        .body(BODY)
        .build()
        .unwrap();
    if let Ok(response) = client.execute(request).await {
        let _ = response.bytes().await;
    }
}

/// One call through the reqwest-middleware middleware, body read to its end.
async fn through_middleware(base: &str, breaker: &Breaker) {
    let client = reqwest_middleware::ClientBuilder::new(reqwest_client())
        .with(CircuitBreakerMiddleware::new(breaker.clone()))
        .build();
    let sent = client
        .post(format!("{base}/chat/completions"))
        .header("content-type", "application/json")
        .body(BODY)
        .send()
        .await;
    if let Ok(response) = sent {
        let _ = response.bytes().await;
    }
}

/// One chat completion through async-openai with the breaker as its HTTP
/// service (no retry layer, so one attempt).
async fn through_async_openai(base: &str, breaker: &Breaker) {
    let config = OpenAIConfig::new()
        .with_api_base(base)
        .with_api_key("sk-test");
    let client = async_openai::Client::with_config(config).with_http_service(
        OpenAiCircuitBreaker::new(OpenAiReqwest::new(reqwest_client()), breaker.clone()),
    );
    let request = CreateChatCompletionRequestArgs::default()
        .model("gpt-test")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("ping")
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap();
    let _ = client.chat().create(request).await;
}

/// What each adapter's breaker counted for one call to `base`.
async fn counted_by_each(base: &str) -> [(&'static str, Counters); 4] {
    let names = ["tower", "ReqwestClient", "middleware", "async-openai"];
    let [a, b, c, d] = names.map(breaker);
    through_tower(base, &a).await;
    through_reqwest_client(base, &b).await;
    through_middleware(base, &c).await;
    through_async_openai(base, &d).await;
    let counted = [a, b, c, d].map(|b| b.snapshot().counters);
    std::array::from_fn(|i| (names[i], counted[i]))
}

#[tokio::test(start_paused = true)]
async fn every_adapter_records_the_same_outcome_for_the_same_answer() {
    let server = OpenAiServer::start(Mode::Json).await;
    let modes = [
        Mode::Json,
        Mode::ServerError(500),
        Mode::ServerError(503),
        Mode::ContentFilter,
        Mode::RateLimited { retry_after: 1 },
        Mode::StreamError,
    ];
    let mut seen = Vec::new();
    for mode in modes {
        server.set(mode);
        seen.push((
            format!("{mode:?}"),
            counted_by_each(&server.api_base()).await,
        ));
    }
    let refused = format!("http://{}/v1", closed_port());
    seen.push(("refused connection".into(), counted_by_each(&refused).await));

    for (answer, counted) in &seen {
        let (_, reference) = counted[0];
        assert_eq!(reference.admitted, 1, "{answer}: one attempt each");
        assert_eq!(reference.in_flight, 0, "{answer}: decided");
        for (adapter, counters) in counted {
            assert_eq!(
                *counters, reference,
                "{answer}: {adapter} judged it otherwise than the tower service"
            );
        }
    }
    // The answers are told apart, so the comparison above means something.
    let outcome = |i: usize| {
        let c = seen[i].1[0].1;
        (c.successes, c.failures, c.ignored, c.rate_limited)
    };
    assert_eq!(outcome(0), (1, 0, 0, 0), "JSON 200");
    assert_eq!(outcome(1), (0, 1, 0, 0), "500");
    assert_eq!(outcome(3), (0, 0, 1, 0), "content filter");
    assert_eq!(outcome(4), (0, 0, 0, 1), "429");
    assert_eq!(outcome(5), (0, 1, 0, 0), "an error event in the stream");
    assert_eq!(outcome(6), (0, 1, 0, 0), "refused connection");
}
