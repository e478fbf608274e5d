//! `SseScanner`, `SseStream` and `LlmEvents` on arbitrary bytes cut at
//! arbitrary points: never a panic, memory bounded by `max_line`, and the
//! same events and the same verdict however the body is chunked.
#![no_main]

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower_circuit_breaker::classify::{
    Classify, ClassifyEvent, ClassifyStream, LlmClassifier, LlmEvents, SseEvent, SseScanner,
    SseStream, Verdict, DEFAULT_MAX_LINE,
};
use tower_circuit_breaker::Outcome;
use tower_circuit_breaker_fuzz::split;

#[derive(Debug, Arbitrary)]
struct Input {
    /// 0..=200 as it is (0 is taken as 1), above that the default.
    max_line: u8,
    require_final: bool,
    cuts: Vec<u16>,
    body: Vec<u8>,
}

/// One dispatched event: name, data, truncated, complete.
type Event = (String, Vec<u8>, bool, bool);

fn record(seen: &mut Vec<Event>) -> impl FnMut(&SseEvent<'_>) -> Option<Outcome> + '_ {
    |ev| {
        seen.push((
            ev.event().to_owned(),
            ev.data().to_vec(),
            ev.is_data_truncated(),
            ev.is_complete(),
        ));
        None
    }
}

/// Every event of the stream, whether it stopped mid-event, and the most
/// memory the scanner held at any point.
fn scan(chunks: &[&[u8]], max_line: usize) -> (Vec<Event>, bool) {
    // A partial line, the data and the event name, each at most `max_line`
    // bytes; a `Vec` at most doubles its capacity past what it holds, and
    // allocates at least 8 bytes.
    let bound = 3 * (2 * max_line.max(3) + 8);
    let mut scanner = SseScanner::with_max_line(max_line);
    let mut seen = Vec::new();
    for chunk in chunks {
        assert_eq!(scanner.feed(chunk, record(&mut seen)), None);
        let held = scanner.buffered_capacity();
        assert!(held <= bound, "{held} bytes buffered, max_line {max_line}");
    }
    let mid = scanner.is_mid_event();
    assert_eq!(scanner.finish(record(&mut seen)), None);
    assert!(scanner.buffered_capacity() <= bound);
    (seen, mid)
}

fn verdict<S: ClassifyStream>(mut stream: S, chunks: &[&[u8]]) -> Outcome {
    for chunk in chunks {
        if let Some(outcome) = stream.on_data(chunk) {
            return outcome;
        }
    }
    stream.on_end()
}

fuzz_target!(|input: Input| {
    let max_line = match input.max_line {
        m @ 0..=200 => usize::from(m),
        _ => DEFAULT_MAX_LINE,
    };
    let whole: &[&[u8]] = &[&input.body];
    let chunks = split(&input.body, &input.cuts);

    // The scanner: the same events, however the bytes arrive.
    let (events, mid) = scan(whole, max_line);
    assert_eq!(scan(&chunks, max_line), (events.clone(), mid), "{chunks:?}");
    let bytewise: Vec<&[u8]> = input.body.chunks(1).collect();
    assert_eq!(scan(&bytewise, max_line), (events.clone(), mid));

    // The stream classifier: the same verdict, however the bytes arrive.
    let stream = || {
        SseStream::new()
            .max_line(max_line)
            .require_final_event(input.require_final)
    };
    let outcome = verdict(stream(), whole);
    assert_eq!(verdict(stream(), &chunks), outcome, "{chunks:?}");

    // It is what `LlmEvents` says of the first event that decides, or the
    // documented end-of-stream rule when none does.
    let decided = events
        .iter()
        .find_map(|(name, data, _, _)| LlmEvents.classify_event(&SseEvent::new(name, data)));
    let expected = decided.unwrap_or(if mid || input.require_final {
        Outcome::Failure
    } else {
        Outcome::Success
    });
    assert_eq!(outcome, expected, "{events:?}");

    // `LlmClassifier` reads a 200 event stream the same way.
    let mut head = HeaderMap::new();
    head.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    let llm = LlmClassifier::new()
        .max_line(max_line)
        .require_final_event(input.require_final);
    match llm.classify_response(StatusCode::OK, &head) {
        Verdict::Defer(s) => assert_eq!(verdict(s, &chunks), outcome),
        Verdict::Done(o) => panic!("an event stream is read, got {o:?}"),
    }
});
