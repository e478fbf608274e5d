//! Inputs the fuzz targets in `fuzz/` found failing, replayed through the
//! public API. Each test names the target and gives the input as it was
//! minimized.

use tower_circuit_breaker::classify::{ClassifyStream, SseEvent, SseScanner, SseStream};
use tower_circuit_breaker::Outcome;

/// The events a scanner dispatches for `chunks` (name, data, truncated), and
/// whether the stream stopped inside an event.
fn scan(max_line: usize, chunks: &[&[u8]]) -> (Vec<(String, Vec<u8>, bool)>, bool) {
    let mut scanner = SseScanner::with_max_line(max_line);
    let mut seen = Vec::new();
    let mut record = |ev: &SseEvent<'_>| {
        seen.push((
            ev.event().to_owned(),
            ev.data().to_vec(),
            ev.is_data_truncated(),
        ));
        None
    };
    for chunk in chunks {
        assert_eq!(scanner.feed(chunk, &mut record), None);
    }
    let mid = scanner.is_mid_event();
    scanner.finish(&mut record);
    (seen, mid)
}

fn verdict(max_line: usize, chunks: &[&[u8]]) -> Outcome {
    let mut stream = SseStream::new().max_line(max_line);
    for chunk in chunks {
        if let Some(outcome) = stream.on_data(chunk) {
            return outcome;
        }
    }
    stream.on_end()
}

/// Every way to cut `body` in two, and byte by byte.
fn chunkings(body: &[u8]) -> Vec<Vec<&[u8]>> {
    let mut all: Vec<Vec<&[u8]>> = (0..=body.len())
        .map(|i| vec![&body[..i], &body[i..]])
        .collect();
    all.push(body.chunks(1).collect());
    all
}

/// `sse_stream`: `max_line: 0, body: [0xEF, 0xFF, b':', b':']`, fed whole
/// and byte by byte. A first line that is too long is thrown away, and the
/// scanner must still tell a comment from a field. It took any line starting
/// with 0xEF for a byte-order mark, and looked past it for the `:` only if
/// that byte had arrived before the line outgrew `max_line`: fed whole this
/// unterminated field line was a comment (a clean end, `Success`), fed byte
/// by byte a field (a truncated stream, `Failure`).
#[test]
fn sse_stream_overlong_first_line_starting_with_0xef() {
    let body = b"\xEF\xFF::";
    for max_line in 0..=3 {
        for chunks in chunkings(body) {
            assert_eq!(scan(max_line, &chunks), (vec![], true), "{chunks:?}");
            assert_eq!(verdict(max_line, &chunks), Outcome::Failure, "{chunks:?}");
        }
    }
    // Closed by a blank line, it is an event whose data was lost.
    let body = b"\xEF\xFF::\n\n";
    for chunks in chunkings(body) {
        let events = vec![("message".to_owned(), vec![], true)];
        assert_eq!(scan(1, &chunks), (events, false), "{chunks:?}");
    }
}

/// `sse_stream`: a stream opening with a byte-order mark and a comment,
/// with `max_line` 1 (the input before minimizing: the mark in one chunk,
/// a comment in later ones). The comment is too long and thrown away; it
/// must stay a comment however the mark arrives, and the stream ends
/// cleanly.
#[test]
fn sse_stream_overlong_comment_after_a_byte_order_mark() {
    let body = b"\xEF\xBB\xBF: keep-alive\n";
    for max_line in 0..=3 {
        for chunks in chunkings(body) {
            assert_eq!(scan(max_line, &chunks), (vec![], false), "{chunks:?}");
            assert_eq!(verdict(max_line, &chunks), Outcome::Success, "{chunks:?}");
        }
    }
}
