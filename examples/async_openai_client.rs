//! An async-openai client with the breaker in its HTTP stack, against a local
//! OpenAI-compatible server that fails, then heals and streams.
//!
//! ```text
//! cargo run --example async_openai_client --features async-openai
//! ```

#[path = "../tests/support_openai/mod.rs"]
mod openai_server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use async_openai::Client;
use futures::StreamExt;
use openai_server::{Mode, OpenAiServer};
use tower_circuit_breaker::async_openai::{circuit_open, http_service};
use tower_circuit_breaker::{BoxError, Breaker, TripMode};

fn request() -> Result<CreateChatCompletionRequest, OpenAIError> {
    CreateChatCompletionRequestArgs::default()
        .model("gpt-test")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("ping")
            .build()?
            .into()])
        .build()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = OpenAiServer::start(Mode::ServerError(503)).await;

    // Transitions are printed after the line of the call that caused them.
    let transitions = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = transitions.clone();
    // All or nothing, to show the circuit opening: by default a call
    // without a fallback is graded instead (`TripMode::Graded`).
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("gpt-test")
        .consecutive_failures(3)
        // Longer than async-openai's backoff (0.1 + 0.2 + 0.4 s), so its
        // fourth attempt finds the circuit open.
        .open_duration(Duration::from_secs(1))
        .probes(1)
        .close_after(1)
        .on_transition(move |t| {
            let line = format!("  breaker: {} -> {} ({})", t.from, t.to, t.reason);
            log.lock().unwrap().push(line);
        })
        .build()?;
    let config = OpenAIConfig::new()
        .with_api_base(server.api_base())
        .with_api_key("sk-local");
    // async-openai's retry outside, the breaker inside, reqwest below.
    let client = Client::with_config(config)
        .with_http_service(http_service(reqwest::Client::new(), breaker.clone()));
    let flush = || {
        for line in transitions.lock().unwrap().drain(..) {
            println!("{line}");
        }
    };

    println!("upstream down:");
    let mut retry_after = Duration::ZERO;
    for i in 1..=2 {
        match client.chat().create(request()?).await {
            Ok(_) => println!("call {i}: answered"),
            Err(err) => match circuit_open(&err) {
                Some(open) => {
                    retry_after = open.retry_after().unwrap_or_default();
                    // `circuit 'gpt-test' open; next probe in 588 ms`
                    println!("call {i}: rejected: {open}");
                }
                None => println!("call {i}: {err}"),
            },
        }
        flush();
    }
    println!(
        "server saw {} requests (async-openai retried; the breaker cut it short)",
        server.hits()
    );

    println!("upstream healed; waiting for the next probe");
    server.set(Mode::Stream);
    tokio::time::sleep(retry_after).await;
    let mut stream = client.chat().create_stream(request()?).await?;
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        if let Some(delta) = chunk?.choices.first().and_then(|c| c.delta.content.clone()) {
            text.push_str(&delta);
        }
    }
    println!("streamed: {text:?}; breaker is {}", breaker.state());
    flush();
    Ok(())
}
