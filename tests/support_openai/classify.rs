//! A small SSE-aware classifier, so the tests can check that the adapters
//! hand deferred classification to the body, whatever classifier is used.

use http::{HeaderMap, StatusCode};
use tower_circuit_breaker::classify::{
    Classify, ClassifyStream, ErrorRef, HttpClassifier, Verdict,
};
use tower_circuit_breaker::Outcome;

/// Defers `text/event-stream` answers: `data: [DONE]` is a success, an
/// `event: error` a failure, an end without either a failure, a drop before
/// either says nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct SseDone;

#[derive(Debug, Default)]
pub struct SseDoneStream {
    seen: Vec<u8>,
}

impl Classify for SseDone {
    type Stream = SseDoneStream;

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<SseDoneStream> {
        let sse = headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if status.is_success() && sse {
            return Verdict::Defer(SseDoneStream::default());
        }
        match HttpClassifier.classify_response(status, headers) {
            Verdict::Done(outcome) => Verdict::Done(outcome),
            Verdict::Defer(never) => match never {},
        }
    }

    fn classify_error(&self, error: ErrorRef<'_>) -> Outcome {
        HttpClassifier.classify_error(error)
    }
}

impl ClassifyStream for SseDoneStream {
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        self.seen.extend_from_slice(chunk);
        let has = |needle: &[u8]| self.seen.windows(needle.len()).any(|w| w == needle);
        if has(b"event: error") {
            Some(Outcome::Failure)
        } else if has(b"data: [DONE]") {
            Some(Outcome::Success)
        } else {
            None
        }
    }

    fn on_end(self) -> Outcome {
        Outcome::Failure
    }
}
