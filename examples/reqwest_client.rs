//! The breaker in front of a `reqwest::Client`, as a tower stack, against a
//! local OpenAI-compatible server that fails, then heals.
//!
//! ```text
//! cargo run --example reqwest_client --features reqwest
//! ```

#[path = "../tests/support_openai/mod.rs"]
mod openai_server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use openai_server::{Mode, OpenAiServer};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::reqwest::ReqwestService;
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, CircuitOpen, TripMode};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = OpenAiServer::start(Mode::ServerError(503)).await;

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
    let mut client = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(10)) // attempt timeout: inside, so it counts
        .service(ReqwestService::new(reqwest::Client::new()));
    let flush = || {
        for line in transitions.lock().unwrap().drain(..) {
            println!("{line}");
        }
    };

    let request = || {
        http::Request::post(server.chat_url())
            .header("content-type", "application/json")
            .body(r#"{"model":"gpt-test","messages":[{"role":"user","content":"ping"}]}"#)
    };

    println!("upstream down:");
    let mut retry_after = Duration::ZERO;
    for i in 1..=5 {
        match client.ready().await?.call(request()?).await {
            Ok(res) => println!("call {i}: {}", res.status()),
            Err(err) => {
                let err: BoxError = err.into();
                let open = CircuitOpen::find(&*err).ok_or("not a rejection")?;
                retry_after = open.retry_after().unwrap_or_default();
                // `circuit 'chat' open; next probe in 281 ms`
                println!("call {i}: rejected: {open}");
            }
        }
        flush();
    }
    println!("server saw {} requests", server.hits());

    println!("upstream healed; waiting for the next probe");
    server.set(Mode::Json);
    tokio::time::sleep(retry_after).await;
    for i in 6..=7 {
        let res = client.ready().await?.call(request()?).await?;
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        println!("call {i}: {status} {} bytes", body.len());
        flush();
    }

    // A refused connection stays a reqwest::Error, inside the breaker's error.
    let closed = openai_server::closed_port();
    let request = http::Request::get(format!("http://{closed}/v1/models")).body("")?;
    let err = client.oneshot(request).await.unwrap_err();
    let err = err
        .inner()
        .and_then(|e| e.downcast_ref::<reqwest::Error>())
        .ok_or("not a reqwest error")?;
    println!("refused connection: is_connect() = {}", err.is_connect());
    Ok(())
}
