use http::{HeaderMap, HeaderValue, StatusCode};

use super::*;
use crate::classify::LlmClassifier;

fn sse_usage(stream: &str) -> Option<Usage> {
    read_usage(b"", stream.as_bytes()).1
}

fn metered(status: u16, sse: bool, body: &[&str], prices: Prices) -> (Charge, Outcome) {
    let mut headers = HeaderMap::new();
    if sse {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    }
    let meter = Meter::new(LlmClassifier::new(), prices);
    match meter.classify_response(StatusCode::from_u16(status).unwrap(), &headers) {
        Verdict::Defer(mut stream) => {
            let mut decided = None;
            for chunk in body {
                decided = decided.or(stream.on_data(chunk.as_bytes()));
            }
            let charge = stream.charge();
            (charge, decided.unwrap_or_else(|| stream.on_end()))
        }
        Verdict::Done(outcome) => (Charge::Free, outcome),
    }
}

// === JSON answers ===

#[test]
fn openai_chat_json_counts_cached_prompt_tokens_apart() {
    let body = br#"{"id":"x","object":"chat.completion","model":"gpt-4o-mini",
        "choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":999}}"}}],
        "usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,
          "prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},
          "completion_tokens_details":{"reasoning_tokens":0}}}"#;
    let u = Usage::from_json(body).unwrap();
    assert_eq!((u.input(), u.cached_input(), u.output()), (86, 1920, 300));
    assert_eq!(u.model(), Some("gpt-4o-mini"));
}

#[test]
fn openai_responses_json_reads_input_tokens_details() {
    let body = br#"{"id":"resp_1","object":"response","model":"o3",
        "usage":{"input_tokens":500,"input_tokens_details":{"cached_tokens":100},
          "output_tokens":70,"output_tokens_details":{"reasoning_tokens":40}}}"#;
    let u = Usage::from_json(body).unwrap();
    assert_eq!((u.input(), u.cached_input(), u.output()), (400, 100, 70));
}

#[test]
fn anthropic_json_counts_cache_reads_and_writes() {
    let body = br#"{"id":"msg_1","type":"message","model":"claude-sonnet-4-5",
        "content":[{"type":"text","text":"hi"}],
        "usage":{"input_tokens":10,"cache_creation_input_tokens":200,
          "cache_read_input_tokens":3000,"output_tokens":50}}"#;
    let u = Usage::from_json(body).unwrap();
    assert_eq!((u.input(), u.cached_input(), u.output()), (210, 3000, 50));
    assert_eq!(u.model(), Some("claude-sonnet-4-5"));
}

#[test]
fn gemini_json_reads_usage_metadata() {
    let body = br#"{"candidates":[{"content":{"parts":[{"text":"hi"}]}}],
        "usageMetadata":{"promptTokenCount":1000,"cachedContentTokenCount":600,
          "candidatesTokenCount":80,"thoughtsTokenCount":20,"totalTokenCount":1100},
        "modelVersion":"gemini-2.5-flash"}"#;
    let u = Usage::from_json(body).unwrap();
    assert_eq!((u.input(), u.cached_input(), u.output()), (400, 600, 100));
    assert_eq!(u.model(), Some("gemini-2.5-flash"));
}

#[test]
fn a_usage_nested_in_content_is_not_the_answers() {
    let body =
        br#"{"model":"m","choices":[{"message":{"tool_calls":[{"usage":{"prompt_tokens":5}}]}}]}"#;
    assert_eq!(Usage::from_json(body), None);
}

// === streams ===

#[test]
fn openai_stream_usage_comes_in_the_last_chunk() {
    let stream = "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
                  data: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7}}\n\n\
                  data: [DONE]\n\n";
    let u = sse_usage(stream).unwrap();
    assert_eq!((u.input(), u.output()), (12, 7));
    assert_eq!(u.model(), Some("gpt-4o"));
}

#[test]
fn openai_stream_without_include_usage_has_none() {
    let stream = "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
    assert_eq!(sse_usage(stream), None);
}

#[test]
fn anthropic_stream_merges_message_start_and_message_delta() {
    let stream = "event: message_start\n\
        data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-opus-4\",\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n\
        event: content_block_delta\n\
        data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"\\\"usage\\\"\"}}\n\n\
        event: message_delta\n\
        data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n\
        event: message_stop\n\
        data: {\"type\":\"message_stop\"}\n\n";
    let u = sse_usage(stream).unwrap();
    assert_eq!((u.input(), u.cached_input(), u.output()), (25, 5, 15));
    assert_eq!(u.model(), Some("claude-opus-4"));
}

#[test]
fn gemini_stream_keeps_the_last_totals() {
    let stream = "data: {\"candidates\":[],\"usageMetadata\":{\"promptTokenCount\":9,\"candidatesTokenCount\":2},\"modelVersion\":\"gemini-2.5-pro\"}\r\n\r\n\
                  data: {\"candidates\":[],\"usageMetadata\":{\"promptTokenCount\":9,\"candidatesTokenCount\":30},\"modelVersion\":\"gemini-2.5-pro\"}\r\n\r\n";
    let u = sse_usage(stream).unwrap();
    assert_eq!((u.input(), u.output()), (9, 30));
}

#[test]
fn responses_stream_reads_response_completed() {
    let stream = "event: response.completed\n\
        data: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-5\",\"usage\":{\"input_tokens\":40,\"output_tokens\":4}}}\n\n";
    let u = sse_usage(stream).unwrap();
    assert_eq!((u.input(), u.output()), (40, 4));
    assert_eq!(u.model(), Some("gpt-5"));
}

// === malformed usage ===

#[test]
fn malformed_usage_never_panics_and_reads_as_none() {
    let cases: &[&[u8]] = &[
        b"",
        b"{",
        b"{\"usage\":",
        b"{\"usage\":{\"prompt_tokens\":-5}}",
        b"{\"usage\":{\"prompt_tokens\":1.5e3}}",
        b"{\"usage\":{\"prompt_tokens\":\"12\"}}",
        b"{\"usage\":[1,2,3]}",
        b"]]]]}}}}",
        b"{\"model\":\"\\u0000\\\"\",\"usage\":null}",
        b"{\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":{\"g\":{\"h\":{\"i\":{\"usage\":{\"prompt_tokens\":1}}}}}}}}}}}",
    ];
    for case in cases {
        assert_eq!(
            Usage::from_json(case),
            None,
            "{}",
            String::from_utf8_lossy(case)
        );
        let _ = read_usage(case, case);
    }
    let huge = br#"{"usage":{"prompt_tokens":99999999999999999999999999}}"#;
    assert_eq!(Usage::from_json(huge).unwrap().input(), u64::MAX);
}

// === the meter ===

fn gpt() -> Prices {
    Prices::new().model(
        "gpt-4o",
        Price::per_million(2.5, 10.0, 1.25).unknown_cost(5_000),
    )
}

#[test]
fn a_json_answer_is_held_for_its_usage_and_keeps_its_outcome() {
    let body = [
        r#"{"model":"gpt-4o","usage":{"prompt_"#,
        r#"tokens":1000,"completion_tokens":100}}"#,
    ];
    assert_eq!(
        metered(200, false, &body, gpt()),
        (Charge::Observed(3_500), Outcome::Success)
    );
}

#[test]
fn a_stream_without_usage_pays_its_models_unknown_cost() {
    let body = [
        "data: {\"model\":\"gpt-4o-2024\",\"choices\":[]}\n\n",
        "data: [DONE]\n\n",
    ];
    assert_eq!(
        metered(200, true, &body, gpt()),
        (Charge::Estimated(5_000), Outcome::Success)
    );
}

#[test]
fn malformed_usage_is_charged_as_unknown() {
    let body = [r#"{"usage":{"prompt_tokens":"#];
    assert_eq!(metered(200, false, &body, gpt()).0, Charge::Unknown);
    let body = [r#"{"model":"gpt-4o","usage":{"prompt_tokens":"x"}}"#];
    assert_eq!(
        metered(200, false, &body, gpt()).0,
        Charge::Estimated(5_000)
    );
}

#[test]
fn an_error_answer_is_free() {
    assert_eq!(
        metered(500, false, &[], gpt()),
        (Charge::Free, Outcome::Failure)
    );
    let (charge, _) = metered(429, false, &["{}"], gpt());
    assert_eq!(charge, Charge::Free);
}

#[test]
fn a_body_over_the_limit_is_charged_as_unknown() {
    let meter = Meter::new(LlmClassifier::new(), gpt()).max_body(8);
    let Verdict::Defer(mut stream) = meter.classify_response(StatusCode::OK, &HeaderMap::new())
    else {
        unreachable!()
    };
    stream.on_data(br#"{"model":"gpt-4o","usage":{"prompt_tokens":1}}"#);
    assert_eq!(stream.charge(), Charge::Unknown);
}

#[test]
fn a_panicking_price_closure_is_contained() {
    let prices = Prices::new().otherwise(|_: &Usage| panic!("no price"));
    assert_eq!(prices.cost(&Usage::new(1, 0, 1)), None);
}

#[test]
fn the_longest_prefix_prices_a_model() {
    let prices = Prices::new()
        .model("gpt-4o", Price::per_million(2.5, 10.0, 1.25))
        .model("gpt-4o-mini", Price::per_million(0.15, 0.6, 0.075));
    let usage = Usage::new(1_000_000, 0, 0).with_model("gpt-4o-mini-2024-07-18");
    assert_eq!(prices.cost(&usage), Some(150_000));
    assert_eq!(
        prices.cost(&Usage::new(1, 0, 0)),
        None,
        "no model, no closure"
    );
}
