//! One breaker guarding a reqwest-middleware client and a tower stack at
//! once, against a local OpenAI-compatible server that fails, then heals.
//!
//! ```text
//! cargo run --example reqwest_middleware_client --features reqwest,reqwest-middleware
//! ```

#[path = "../tests/support_openai/mod.rs"]
mod openai_server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openai_server::{Mode, OpenAiServer};
use reqwest_middleware::ClientBuilder;
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::reqwest::ReqwestService;
use tower_circuit_breaker::reqwest_middleware::CircuitBreakerMiddleware;
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, CircuitOpen, TripMode};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = OpenAiServer::start(Mode::ServerError(500)).await;

    // Transitions are printed after the line of the call that caused them.
    let transitions = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = transitions.clone();
    // All or nothing, to show the circuit opening: by default a call
    // without a fallback is graded instead (`TripMode::Graded`).
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .name("chat")
        .consecutive_failures(3)
        .open_duration(Duration::from_millis(300))
        .probes(1)
        .close_after(1)
        .on_transition(move |t| {
            let line = format!("  breaker: {} -> {} ({})", t.from, t.to, t.reason);
            log.lock().unwrap().push(line);
        })
        .build()?
        .with_classifier(LlmClassifier::new());

    // The same breaker in both clients.
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(CircuitBreakerMiddleware::from(&layer))
        .build();
    let tower = layer.layer(ReqwestService::new(reqwest::Client::new()));
    let flush = || {
        for line in transitions.lock().unwrap().drain(..) {
            println!("{line}");
        }
    };

    println!("upstream down:");
    for i in 1..=2 {
        let res = client.post(server.chat_url()).body("{}").send().await?;
        println!("middleware call {i}: {}", res.status());
        flush();
    }
    let req = http::Request::post(server.chat_url()).body("{}")?;
    println!("tower call: {}", tower.clone().oneshot(req).await?.status());
    flush();

    let err = client
        .post(server.chat_url())
        .body("{}")
        .send()
        .await
        .unwrap_err();
    let retry_after = match &err {
        reqwest_middleware::Error::Middleware(e) => {
            let open = e.downcast_ref::<CircuitOpen>().ok_or("not a rejection")?;
            open.retry_after().unwrap_or_default()
        }
        reqwest_middleware::Error::Reqwest(e) => return Err(format!("unexpected: {e}").into()),
    };
    // `circuit 'chat' open; next probe in 297 ms`: the wait is in the message.
    println!("middleware call: rejected: {err}");
    println!("server saw {} requests", server.hits());

    println!("upstream healed; waiting for the next probe");
    server.set(Mode::Json);
    tokio::time::sleep(retry_after).await;
    let res = client.post(server.chat_url()).body("{}").send().await?;
    println!("probe: {} {}", res.status(), res.text().await?);
    flush();
    let req = http::Request::post(server.chat_url()).body("{}")?;
    println!("tower call: {}", tower.oneshot(req).await?.status());
    flush();
    Ok(())
}
