//! The spend guard's usage parsing on arbitrary bytes and on the providers'
//! `usage` shapes with arbitrary values: never a panic, a stream's usage the
//! same however it is chunked, and a body without a usage that parses
//! charged as a call of unknown usage.
#![no_main]

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower_circuit_breaker::classify::{Classify, ClassifyStream, LlmClassifier, Verdict};
use tower_circuit_breaker::spend::{read_usage, Charge, Meter, Price, Prices, Usage};
use tower_circuit_breaker_fuzz::split;

#[derive(Debug, Arbitrary)]
enum Body {
    Raw(Vec<u8>),
    /// OpenAI Chat Completions, values put in as they are.
    OpenAi { model: String, prompt: String, completion: String, cached: String },
    /// Anthropic's stream: `message_start`, then `message_delta`.
    Anthropic { model: String, input: String, output: String },
    /// Gemini's `usageMetadata`.
    Gemini { prompt: String, candidates: String, cached: String },
}

impl Body {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Body::Raw(b) => b.clone(),
            Body::OpenAi { model, prompt, completion, cached } => format!(
                r#"{{"model":"{model}","usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"prompt_tokens_details":{{"cached_tokens":{cached}}}}}}}"#
            )
            .into_bytes(),
            Body::Anthropic { model, input, output } => format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"model\":\"{model}\",\"usage\":{{\"input_tokens\":{input}}}}}}}\n\n\
                 event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{output}}}}}\n\n"
            )
            .into_bytes(),
            Body::Gemini { prompt, candidates, cached } => format!(
                r#"{{"usageMetadata":{{"promptTokenCount":{prompt},"candidatesTokenCount":{candidates},"cachedContentTokenCount":{cached}}}}}"#
            )
            .into_bytes(),
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    body: Body,
    sse: bool,
    cuts: Vec<u16>,
}

fn charge(sse: bool, chunks: &[&[u8]]) -> Charge {
    let mut headers = HeaderMap::new();
    if sse {
        headers.insert("content-type", HeaderValue::from_static("text/event-stream"));
    }
    let prices = Prices::new()
        .model("", Price::per_million(f64::MAX, 1e300, -1.0))
        .otherwise(|u: &Usage| Some(u.total()));
    let meter = Meter::new(LlmClassifier::new(), prices);
    let Verdict::Defer(mut stream) = meter.classify_response(StatusCode::OK, &headers) else {
        panic!("a 2xx answer is read for its usage");
    };
    for chunk in chunks {
        if stream.on_data(chunk).is_some() {
            break;
        }
    }
    stream.charge()
}

fuzz_target!(|input: Input| {
    let body = input.body.bytes();
    let (json, sse) = read_usage(&body, &body);
    if let Some(u) = json {
        let _ = (u.total(), u.model());
    }
    let _ = sse.map(|u| u.model().map(str::len));
    // A stream's usage does not depend on how its bytes arrive.
    let chunks = split(&body, &input.cuts);
    let whole = charge(true, &[&body]);
    let mut decided_early = false;
    {
        let llm = LlmClassifier::new();
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/event-stream"));
        if let Verdict::Defer(mut s) = llm.classify_response(StatusCode::OK, &h) {
            decided_early = chunks.iter().any(|c| s.on_data(c).is_some());
        }
    }
    if !decided_early {
        assert_eq!(charge(true, &chunks), whole, "{chunks:?}");
    }
    // A JSON body without a usage is charged as a call of unknown usage.
    let json_charge = charge(false, &chunks);
    match Usage::from_json(&body) {
        Some(_) => assert!(matches!(json_charge, Charge::Observed(_)), "{json_charge:?}"),
        None => assert_eq!(json_charge, Charge::Unknown),
    }
    let _ = input.sse;
});
