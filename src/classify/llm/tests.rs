use super::events::classify_llm_event;
use super::*;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, v.parse().unwrap());
    }
    h
}

fn head(status: u16, h: &HeaderMap) -> Verdict<LlmStream> {
    LlmClassifier::new().classify_response(StatusCode::from_u16(status).unwrap(), h)
}

fn done(status: u16) -> Outcome {
    match head(status, &HeaderMap::new()) {
        Verdict::Done(o) => o,
        Verdict::Defer(_) => panic!("{status} deferred"),
    }
}

/// The outcome of a deferred answer whose body is `body`, read to the end.
fn body(status: u16, h: &HeaderMap, body: &[u8]) -> Outcome {
    match head(status, h) {
        Verdict::Done(o) => panic!("{status} decided on the head: {o:?}"),
        Verdict::Defer(mut s) => s.on_data(body).unwrap_or_else(|| s.on_end()),
    }
}

#[test]
fn status_table() {
    for s in [200, 201, 204, 301, 304] {
        assert_eq!(done(s), Outcome::Success, "{s}");
    }
    for s in [400, 401, 403, 404, 408, 413, 422, 499] {
        assert_eq!(done(s), Outcome::Ignored, "{s}");
    }
    for s in [500, 502, 503, 504, 520, 529, 599] {
        assert_eq!(done(s), Outcome::Failure, "{s}");
    }
    assert_eq!(done(409), Outcome::RateLimited { retry_after: None });
    assert_eq!(done(402), Outcome::QuotaExhausted);
    assert!(matches!(head(429, &HeaderMap::new()), Verdict::Defer(_)));
}

#[test]
fn only_event_streams_are_read() {
    for ct in [
        "text/event-stream",
        "text/event-stream; charset=utf-8",
        "Text/Event-Stream",
        " text/event-stream ",
        "\ttext/event-stream",
        "text/event-stream ;charset=utf-8",
        "text/event-stream\t; x=y",
    ] {
        assert!(
            matches!(
                head(200, &headers(&[("content-type", ct)])),
                Verdict::Defer(_)
            ),
            "{ct}"
        );
    }
    // Not visible ASCII (as `HeaderValue::to_str` reads it): not a stream.
    for ct in [
        "application/json",
        "text/plain",
        "text/event-streamx",
        "text/event-stream x",
        "text/event",
        "",
        "text/event-stream; charset=\u{ff}",
    ] {
        assert!(
            matches!(
                head(200, &headers(&[("content-type", ct)])),
                Verdict::Done(Outcome::Success)
            ),
            "{ct}"
        );
    }
    let sse = headers(&[("content-type", "text/event-stream")]);
    assert!(matches!(head(503, &sse), Verdict::Done(Outcome::Failure)));
}

/// Headers as an answer brings them: `before` others, then each value of
/// `content_type`, then `after` more.
fn with_content_type(before: usize, content_type: &[&str], after: usize) -> HeaderMap {
    const OTHERS: [&str; 10] = [
        "date",
        "x-request-id",
        "server",
        "openai-version",
        "vary",
        "cf-ray",
        "x-ratelimit-limit-requests",
        "connection",
        "alt-svc",
        "x-other",
    ];
    let mut h = HeaderMap::new();
    for name in &OTHERS[..before] {
        h.append(*name, "1".parse().unwrap());
    }
    for ct in content_type {
        h.append(http::header::CONTENT_TYPE, ct.parse().unwrap());
    }
    for i in 0..after {
        let name = http::HeaderName::from_bytes(format!("x-after-{i}").as_bytes()).unwrap();
        h.append(name, "1".parse().unwrap());
    }
    h
}

fn deferred(status: u16, h: &HeaderMap) -> bool {
    matches!(head(status, h), Verdict::Defer(_))
}

#[test]
fn content_type_is_found_wherever_it_stands() {
    for before in 0..=10 {
        for after in [0, 3] {
            for (ct, stream) in [
                ("text/event-stream", true),
                ("text/event-stream; charset=utf-8", true),
                ("TEXT/Event-Stream;charset=UTF-8", true),
                ("application/json", false),
                ("application/json; charset=utf-8", false),
                ("text/event-stream x", false),
            ] {
                let h = with_content_type(before, &[ct], after);
                assert_eq!(deferred(200, &h), stream, "{ct} after {before} others");
                assert_eq!(deferred(201, &h), stream, "{ct} after {before} others");
            }
            let none = with_content_type(before, &[], after);
            assert!(matches!(head(200, &none), Verdict::Done(Outcome::Success)));
        }
    }
    // Names are case-insensitive on the wire; the map holds them lowercased.
    let mut h = with_content_type(2, &[], 0);
    let name = http::HeaderName::from_bytes(b"Content-Type").unwrap();
    h.append(name, "text/event-stream".parse().unwrap());
    assert!(deferred(200, &h));
}

#[test]
fn the_first_content_type_value_decides() {
    // As `HeaderMap::get` reads it: the first value, wherever the others are.
    for before in 0..=10 {
        let h = with_content_type(before, &["text/event-stream", "application/json"], 2);
        assert!(deferred(200, &h), "after {before} others");
        let h = with_content_type(before, &["application/json", "text/event-stream"], 2);
        assert!(!deferred(200, &h), "after {before} others");
        let mut h = with_content_type(before, &["application/json"], 3);
        h.append(
            http::header::CONTENT_TYPE,
            "text/event-stream".parse().unwrap(),
        );
        assert!(!deferred(200, &h), "after {before} others");
        let mut h = with_content_type(before, &["text/event-stream"], 3);
        h.append(
            http::header::CONTENT_TYPE,
            "application/json".parse().unwrap(),
        );
        assert!(deferred(200, &h), "after {before} others");
    }
}

#[test]
fn an_event_stream_type_does_not_change_error_statuses() {
    for before in [0, 1, 6] {
        let sse = with_content_type(before, &["text/event-stream"], 2);
        assert!(matches!(head(529, &sse), Verdict::Done(Outcome::Failure)));
        assert!(matches!(
            head(402, &sse),
            Verdict::Done(Outcome::QuotaExhausted)
        ));
        assert!(matches!(head(400, &sse), Verdict::Done(Outcome::Ignored)));
        // A 429 reads its error body, not an event stream.
        assert_eq!(
            body(
                429,
                &sse,
                br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#
            ),
            Outcome::QuotaExhausted
        );
        assert_eq!(
            body(429, &sse, b"event: error\ndata: {}\n\n"),
            Outcome::RateLimited { retry_after: None }
        );
        // A 200 event stream is read for its events.
        let overloaded = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
        assert_eq!(body(200, &sse, overloaded), Outcome::Failure);
        assert_eq!(body(200, &sse, b"data: [DONE]\n\n"), Outcome::Success);
    }
}

#[test]
fn the_deferred_state_is_one_pointer() {
    // Every response body carries it, also when the head decided and it is
    // never made: a JSON answer would move a scanner's worth of bytes.
    assert_eq!(
        std::mem::size_of::<LlmStream>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn provider_error_bodies() {
    let none = HeaderMap::new();
    // Refused requests: the caller's problem, whatever the body says.
    assert_eq!(done(400), Outcome::Ignored);
    // OpenAI transient 429 vs. quota.
    assert_eq!(
        body(
            429,
            &headers(&[("retry-after", "7")]),
            br#"{"error":{"message":"Rate limit reached for gpt-4o","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#
        ),
        Outcome::RateLimited {
            retry_after: Some(Duration::from_secs(7))
        }
    );
    assert_eq!(
        body(
            429,
            &headers(&[("retry-after", "7")]),
            br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#
        ),
        Outcome::QuotaExhausted
    );
    // Gemini 429 with RetryInfo and no header.
    assert_eq!(
        body(
            429,
            &none,
            br#"{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}"#
        ),
        Outcome::RateLimited {
            retry_after: Some(Duration::from_secs(20))
        }
    );
    // Anthropic 429.
    assert_eq!(
        body(
            429,
            &headers(&[("retry-after", "3")]),
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#
        ),
        Outcome::RateLimited {
            retry_after: Some(Duration::from_secs(3))
        }
    );
    // Not JSON at all.
    assert_eq!(
        body(429, &none, b"<html>Too Many Requests</html>"),
        Outcome::RateLimited { retry_after: None }
    );
    assert_eq!(
        body(429, &none, b""),
        Outcome::RateLimited { retry_after: None }
    );
}

#[test]
fn unread_or_broken_429_bodies_stay_rate_limited() {
    let h = headers(&[("retry-after-ms", "250")]);
    let wait = Outcome::RateLimited {
        retry_after: Some(Duration::from_millis(250)),
    };
    let Verdict::Defer(s) = head(429, &h) else {
        panic!()
    };
    assert_eq!(s.on_drop(), wait);
    let Verdict::Defer(mut s) = head(429, &h) else {
        panic!()
    };
    assert_eq!(s.on_data(br#"{"error":{"code":"insuff"#), None);
    assert_eq!(s.on_error(), wait);
}

#[test]
fn a_long_429_body_is_decided_without_reading_it_all() {
    let Verdict::Defer(mut s) = head(429, &HeaderMap::new()) else {
        panic!()
    };
    let mut decided = None;
    let mut chunks = 0;
    let mut body = br#"{"error":{"code":"insufficient_quota","message":""#.to_vec();
    body.resize(100_000, b'x');
    for chunk in body.chunks(1000) {
        chunks += 1;
        if let Some(o) = s.on_data(chunk) {
            decided = Some(o);
            break;
        }
    }
    assert_eq!(decided, Some(Outcome::QuotaExhausted));
    assert!(chunks <= MAX_ERROR_BODY / 1000 + 1, "{chunks}");
}

fn event(name: &str, data: &str) -> Option<Outcome> {
    classify_llm_event(name, data.as_bytes())
}

#[test]
fn stream_event_table() {
    let failure = Some(Outcome::Failure);
    // Anthropic.
    assert_eq!(
        event(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
        ),
        failure
    );
    assert_eq!(
        event("error", r#"{"type":"error","error":{"type":"api_error"}}"#),
        failure
    );
    assert_eq!(
        event(
            "error",
            r#"{"type":"error","error":{"type":"rate_limit_error"}}"#
        ),
        Some(Outcome::RateLimited { retry_after: None })
    );
    assert_eq!(
        event("message_stop", r#"{"type":"message_stop"}"#),
        Some(Outcome::Success)
    );
    assert_eq!(
        event(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"refusal"}}"#
        ),
        Some(Outcome::Ignored)
    );
    assert_eq!(
        event(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#
        ),
        None
    );
    assert_eq!(event("ping", r#"{"type": "ping"}"#), None);
    // OpenAI chat completions.
    assert_eq!(event("message", "[DONE]"), Some(Outcome::Success));
    assert_eq!(event("message", " [DONE] "), Some(Outcome::Success));
    assert_eq!(
        event(
            "message",
            r#"{"error": {"message": "The server had an error", "type": "server_error", "param": null, "code": null}}"#
        ),
        failure
    );
    assert_eq!(
        event(
            "message",
            r#"{"error":{"type":"invalid_request_error","code":"context_length_exceeded"}}"#
        ),
        Some(Outcome::Ignored)
    );
    assert_eq!(
        event(
            "message",
            r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#
        ),
        Some(Outcome::QuotaExhausted)
    );
    assert_eq!(
        event(
            "message",
            r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#
        ),
        Some(Outcome::Ignored)
    );
    assert_eq!(
        event(
            "message",
            r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
        ),
        None
    );
    // Text that talks about errors is text.
    assert_eq!(
        event(
            "message",
            r#"{"choices":[{"delta":{"content":"{\"error\": {\"type\": \"server_error\"}} and finish_reason: content_filter"}}]}"#
        ),
        None
    );
    // A tool's error deep inside an item is not the upstream's.
    assert_eq!(
        event(
            "response.output_item.done",
            r#"{"type":"response.output_item.done","item":{"type":"mcp_call","error":"tool crashed"}}"#
        ),
        None
    );
    // OpenAI Responses API.
    assert_eq!(
        event(
            "response.created",
            r#"{"type":"response.created","response":{"id":"r","error":null}}"#
        ),
        None
    );
    assert_eq!(
        event(
            "response.completed",
            r#"{"type":"response.completed","response":{"error":null}}"#
        ),
        Some(Outcome::Success)
    );
    assert_eq!(
        event(
            "response.failed",
            r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"}}}"#
        ),
        failure
    );
    assert_eq!(
        event(
            "response.incomplete",
            r#"{"type":"response.incomplete","response":{"incomplete_details":{"reason":"content_filter"}}}"#
        ),
        Some(Outcome::Ignored)
    );
    assert_eq!(
        event(
            "error",
            r#"{"type":"error","code":"rate_limit_exceeded","message":"slow down"}"#
        ),
        Some(Outcome::RateLimited { retry_after: None })
    );
    // Gemini.
    assert_eq!(
        event(
            "message",
            r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#
        ),
        failure
    );
    assert_eq!(
        event(
            "message",
            r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"retryDelay":"1.5s"}]}}"#
        ),
        Some(Outcome::RateLimited {
            retry_after: Some(Duration::from_millis(1500))
        })
    );
    assert_eq!(
        event(
            "message",
            r#"{"candidates":[{"content":{"parts":[]},"finishReason":"SAFETY"}]}"#
        ),
        Some(Outcome::Ignored)
    );
    assert_eq!(
        event(
            "message",
            r#"{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"}}"#
        ),
        Some(Outcome::Ignored)
    );
    assert_eq!(
        event(
            "message",
            r#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{}}"#
        ),
        None
    );
    // Azure's content filter error and unknown errors.
    assert_eq!(
        event(
            "message",
            r#"{"error":{"code":"content_filter","status":400}}"#
        ),
        Some(Outcome::Ignored)
    );
    assert_eq!(event("error", "upstream connect error"), failure);
    assert_eq!(event("message", r#"{"error":"proxy timeout"}"#), failure);
    assert_eq!(event("message", r#"{"error":null,"choices":[]}"#), None);
    assert_eq!(
        event(
            "error",
            r#"{"type":"error","error":{"type":"brand_new_error"}}"#
        ),
        failure
    );
}

#[test]
fn json_scan_survives_garbage() {
    let inputs: &[&[u8]] = &[
        b"",
        b"{",
        b"}}}]]]",
        b"\"",
        b"{\"error\":",
        b"{\"error\":{\"type\":\"overl",
        b"{\"a\":\"\\",
        b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[{\"error\":{}}]]]]",
        b"{\"error\":{\"code\":99999999999999999999999999}}",
        b"{::,,\"error\"::{\"type\"\"x\"}}",
        b"\xff\xfe{\"error\":{\"type\":\"\xff\"}}",
    ];
    for input in inputs {
        let _ = json::scan(input);
        let _ = classify_llm_event("error", input);
        let _ = classify_llm_event("message", input);
    }
    // Truncated, but the error and its type arrived.
    assert_eq!(
        classify_llm_event("message", br#"{"error":{"type":"overloaded_error","mess"#),
        Some(Outcome::Failure)
    );
    let f = json::scan(br#"{"error":{"type":"overloaded_error","mess"#);
    assert_eq!(f.error.and_then(|e| e.ty), Some(&b"overloaded_error"[..]));
}

#[test]
fn rate_limit_reset_formats() {
    let ok = [
        ("1s", Duration::from_secs(1)),
        ("6m0s", Duration::from_secs(360)),
        ("20ms", Duration::from_millis(20)),
        ("1h2m3.5s", Duration::from_millis(3_723_500)),
        ("59.9s", Duration::from_millis(59_900)),
        ("2m59.56s", Duration::from_millis(179_560)),
        ("0s", Duration::ZERO),
        ("0", Duration::ZERO),
        ("150us", Duration::from_micros(150)),
        ("150\u{b5}s", Duration::from_micros(150)),
        ("7ns", Duration::from_nanos(7)),
        (" 12 ", Duration::from_secs(12)),
        ("0.25", Duration::from_millis(250)),
    ];
    for (s, d) in ok {
        let got = parse_rate_limit_reset(s).unwrap_or_else(|| panic!("{s:?}"));
        assert!(
            got.abs_diff(d) < Duration::from_micros(1),
            "{s:?}: {got:?} != {d:?}"
        );
    }
    for bad in [
        "", "s", "-1s", "1x", "1.2.3s", ".s", "1e3s", "soon", "1s2", "ms", "inf", "NaN",
        "9999999h", "1 s", "1S",
    ] {
        assert_eq!(parse_rate_limit_reset(bad), None, "{bad:?}");
    }
}

#[test]
fn rate_limit_reset_headers_pick_the_exhausted_limit() {
    let h = headers(&[
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-remaining-tokens", "100"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ]);
    assert_eq!(LlmClassifier::retry_after(&h), Some(Duration::from_secs(1)));
    let h = headers(&[
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-reset-tokens", "20ms"),
    ]);
    assert_eq!(LlmClassifier::retry_after(&h), Some(Duration::from_secs(1)));
    // The standard headers win.
    let h = headers(&[("retry-after", "7"), ("x-ratelimit-reset-requests", "1s")]);
    assert_eq!(LlmClassifier::retry_after(&h), Some(Duration::from_secs(7)));
    // Garbage everywhere: no wait, no panic.
    let h = headers(&[
        ("retry-after", "soon"),
        ("retry-after-ms", "-20"),
        ("x-ratelimit-reset-requests", "later"),
    ]);
    assert_eq!(LlmClassifier::retry_after(&h), None);
    assert_eq!(
        done(409),
        Outcome::RateLimited { retry_after: None },
        "409 without headers"
    );
}
