//! `ResponseBody` and the `ClassifyStream` calls it makes, under arbitrary
//! chunking, trailers, body errors, pending polls and early drops: frames
//! pass through unchanged, the permit is recorded exactly once, and the
//! stream classifier sees exactly the calls the documented contract implies
//! (each data chunk and trailers until it decides; then nothing).
#![no_main]

use std::cell::RefCell;
use std::rc::Rc;

use http::{HeaderMap, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower_circuit_breaker::classify::{Classify, ClassifyStream, ErrorRef, Verdict};
use tower_circuit_breaker::Outcome;
use tower_circuit_breaker_fuzz::{drive, headers, Exchange, Step};

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Data(Vec<u8>),
    Trailers,
    End,
    Error,
    Drop,
}

type Log = Rc<RefCell<Vec<Call>>>;

/// Defers every response; decides early on a chunk holding `!` (failure)
/// or on trailers holding `x-other` (rate-limited).
#[derive(Clone, Default)]
struct Recorder(Log);

struct Stream(Log);

impl Classify for Recorder {
    type Stream = Stream;

    fn classify_response(&self, _: StatusCode, _: &HeaderMap) -> Verdict<Stream> {
        Verdict::Defer(Stream(self.0.clone()))
    }

    fn classify_error(&self, _: ErrorRef<'_>) -> Outcome {
        Outcome::Failure
    }
}

impl ClassifyStream for Stream {
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        self.0.borrow_mut().push(Call::Data(chunk.to_vec()));
        chunk.contains(&b'!').then_some(Outcome::Failure)
    }

    fn on_trailers(&mut self, trailers: &HeaderMap) -> Option<Outcome> {
        self.0.borrow_mut().push(Call::Trailers);
        trailers
            .contains_key("x-other")
            .then_some(Outcome::RateLimited { retry_after: None })
    }

    fn on_end(self) -> Outcome {
        self.0.borrow_mut().push(Call::End);
        Outcome::Success
    }

    fn on_error(self) -> Outcome {
        self.0.borrow_mut().push(Call::Error);
        Outcome::Failure
    }

    fn on_drop(self) -> Outcome {
        self.0.borrow_mut().push(Call::Drop);
        Outcome::Ignored
    }
}

/// The calls the contract implies, poll by poll: the body settles at a
/// verdict, at an error, at its end (as soon as it reports its end), or
/// when dropped.
fn expected(ex: &Exchange) -> (Vec<Call>, Outcome) {
    let mut calls = Vec::new();
    let mut steps: std::collections::VecDeque<_> = ex.steps.iter().collect();
    let mut outcome = None;
    if steps.is_empty() {
        calls.push(Call::End);
        outcome = Some(Outcome::Success);
    }
    let mut polls = 0u32;
    loop {
        if ex.drop_after.is_some_and(|n| u32::from(n) == polls) {
            break;
        }
        polls += 1;
        let Some(step) = steps.pop_front() else {
            if outcome.is_none() {
                calls.push(Call::End);
                outcome = Some(Outcome::Success);
            }
            break;
        };
        if outcome.is_some() {
            continue;
        }
        match step {
            Step::Pending => continue,
            Step::Data(d) => {
                calls.push(Call::Data(d.clone()));
                if d.contains(&b'!') {
                    outcome = Some(Outcome::Failure);
                }
            }
            Step::Trailers(t) => {
                calls.push(Call::Trailers);
                if headers(t).contains_key("x-other") {
                    outcome = Some(Outcome::RateLimited { retry_after: None });
                }
            }
            Step::Error => {
                calls.push(Call::Error);
                outcome = Some(Outcome::Failure);
            }
        }
        if outcome.is_none() && steps.is_empty() {
            calls.push(Call::End);
            outcome = Some(Outcome::Success);
        }
    }
    let outcome = outcome.unwrap_or_else(|| {
        calls.push(Call::Drop);
        Outcome::Ignored
    });
    (calls, outcome)
}

fuzz_target!(|ex: Exchange| {
    let recorder = Recorder::default();
    let (breaker, _) = drive(recorder.clone(), &ex);
    let (calls, outcome) = expected(&ex);
    assert_eq!(*recorder.0.borrow(), calls);
    let c = breaker.snapshot().counters;
    let got = match (c.successes, c.failures, c.ignored, c.rate_limited) {
        (1, 0, 0, 0) => Outcome::Success,
        (0, 1, 0, 0) => Outcome::Failure,
        (0, 0, 1, 0) => Outcome::Ignored,
        _ => Outcome::RateLimited { retry_after: None },
    };
    assert_eq!(got, outcome);
});
