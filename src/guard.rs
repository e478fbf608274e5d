//! The one protocol every adapter follows: admit -> call -> classify ->
//! record.
//!
//! The tower service and its body, the reqwest-middleware and async-openai
//! adapters, and the head verdicts of [`RetryPolicy`](crate::RetryPolicy) and
//! [`Failover`](crate::Failover) all go through this file, so a rule about
//! outcomes is written once:
//!
//! - an inner breaker's rejection (a [`CircuitOpen`] anywhere in the inner
//!   error's chain) is [`Outcome::Ignored`]: the upstream was not called, so
//!   the call says nothing about it, and the caller still sees a rejection;
//! - an error goes to [`Classify::classify_error`], a response head to
//!   [`Classify::classify_response`]; a deferred verdict moves the permit into
//!   a [`BodyGuard`] that the end of the body settles;
//! - where an attempt is judged on its head alone (retry, failover) and the
//!   classifier defers, its [`Classify::head_outcome`] decides.
//!
//! Adapters only shuffle types: which error the classifier sees, how a
//! rejection is reported, how a body is wrapped.

use std::error::Error as StdError;
use std::mem::ManuallyDrop;
use std::time::Duration;

use bytes::Buf;
use http::{HeaderMap, Response, StatusCode};
use http_body::Frame;

use crate::breaker::{CircuitOpen, Outcome, Permit, Signal};
use crate::classify::{Classify, ClassifyStream, ErrorRef, Verdict};
use crate::deadline::StreamElapsed;
use crate::spend::Charge;

mod attempt;
mod select;

pub use self::attempt::AttemptError;
pub use self::select::Select;

// === the rules ===

/// The rejection inside `error`: see [`CircuitOpen::find`].
pub(crate) fn rejection<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a CircuitOpen> {
    CircuitOpen::find(error)
}

/// The error a transparent wrapper holds. Such a wrapper forwards `source()`
/// to the held error's own source, so a plain walk of the chain would step
/// over the held error (a rejection included).
#[allow(unused_variables)]
pub(crate) fn transparent<'a>(
    error: &'a (dyn StdError + 'static),
) -> Option<&'a (dyn StdError + 'static)> {
    #[cfg(feature = "reqwest-middleware")]
    if let Some(::reqwest_middleware::Error::Middleware(inner)) = error.downcast_ref() {
        let inner: &(dyn StdError + 'static) = inner.as_ref();
        return Some(inner);
    }
    #[cfg(feature = "async-openai")]
    if let Some(::async_openai::error::OpenAIError::Boxed(inner)) = error.downcast_ref() {
        let inner: &(dyn StdError + 'static) = &**inner;
        return Some(inner);
    }
    None
}

/// What an inner error says about the upstream. A passed stream deadline
/// is a failure whatever the classifier says of errors.
#[inline]
pub(crate) fn error_outcome<C: Classify>(classifier: &C, error: ErrorRef<'_>) -> Outcome {
    if rejection(error).is_some() {
        Outcome::Ignored
    } else if error.is::<StreamElapsed>() {
        Outcome::Failure
    } else {
        classifier.classify_error(error)
    }
}

/// What a finished attempt said, judged on its head: for the layers that
/// look at an attempt the breaker has recorded already (retry, failover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judged {
    /// A breaker rejected it, this one or one nested inside.
    Rejected,
    /// The upstream answered, or failed, with this outcome.
    Said(Outcome),
    /// The error cannot be looked into.
    Opaque,
}

/// Judges a finished attempt on its head.
pub(crate) fn judge<C, B, E>(classifier: &C, result: &Result<Response<B>, E>) -> Judged
where
    C: Classify,
    E: AttemptError,
{
    match result {
        Ok(response) => {
            let (status, headers) = (response.status(), response.headers());
            Judged::Said(match classifier.classify_response(status, headers) {
                Verdict::Done(outcome) => outcome,
                Verdict::Defer(_) => classifier.head_outcome(status, headers),
            })
        }
        Err(error) if error.circuit_open().is_some() => Judged::Rejected,
        Err(error) => match error.as_error() {
            Some(inner) => Judged::Said(error_outcome(classifier, inner)),
            None => Judged::Opaque,
        },
    }
}

/// Whether an attempt's error is its timeout (tower's or tokio's), an
/// overload signal for the in-flight limit.
fn timed_out(error: ErrorRef<'_>) -> bool {
    let mut e: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(err) = e {
        if err.is::<tower::timeout::error::Elapsed>() || err.is::<tokio::time::error::Elapsed>() {
            return true;
        }
        e = err.source();
    }
    false
}

// === Guard ===

/// One admitted call: the permit, from admission until an outcome is
/// recorded. Dropped unrecorded (the caller gave up), it records
/// [`Outcome::Ignored`].
#[derive(Debug)]
pub(crate) struct Guard {
    // Empty once the call has finished or handed its permit to the body.
    permit: Permit,
}

impl Guard {
    /// Asks `select` to admit `request`.
    #[inline]
    pub(crate) fn admit<P, R>(select: &P, request: &R) -> Result<Guard, CircuitOpen>
    where
        P: Select<R>,
    {
        select.admit(request).map(|permit| {
            #[cfg(feature = "metrics")]
            let mut permit = permit;
            #[cfg(feature = "metrics")]
            permit.time_head();
            Guard { permit }
        })
    }

    /// Whether the outcome is recorded (or the body holds the permit).
    #[inline]
    pub(crate) fn is_finished(&self) -> bool {
        self.permit.is_finished()
    }

    /// The inner service failed with `error`.
    #[inline]
    pub(crate) fn on_error<C: Classify>(&mut self, classifier: &C, error: ErrorRef<'_>) {
        if timed_out(error) {
            self.permit.signal(Signal::Timeout);
        }
        self.permit.finish(error_outcome(classifier, error));
    }

    /// The call failed on the caller's side, before or instead of reaching
    /// the upstream.
    #[inline]
    pub(crate) fn on_caller_error(&mut self) {
        self.permit.finish(Outcome::Ignored);
    }

    /// The response head came. Returns the guard the body must carry when the
    /// classifier waits for the end of the body.
    #[inline]
    pub(crate) fn on_head<C: Classify>(
        &mut self,
        classifier: &C,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<BodyGuard<C::Stream>> {
        self.permit.head_came(|| classifier.pacing_wait(headers));
        match status.as_u16() {
            200..=299 => {}
            429 => {
                self.permit.signal(Signal::Throttled);
                self.waive();
            }
            503 => {
                self.permit.signal(Signal::Unavailable);
                self.waive();
            }
            _ => self.waive(),
        }
        #[cfg(feature = "metrics")]
        self.permit.report_head();
        match classifier.classify_response(status, headers) {
            Verdict::Done(outcome) => {
                self.permit
                    .finish_announced(outcome, &|| classifier.announced_wait(headers));
                None
            }
            Verdict::Defer(stream) => Some(BodyGuard::pending(self.permit.take(), stream)),
        }
    }

    /// The response head came, to a body under stream deadlines: a verdict
    /// on the head other than a success is recorded now; a success, or a
    /// verdict deferred to the body, stays with the body until it ends, so
    /// a deadline that passes can still fail the call. With `at_first_frame`
    /// the head counts as come (for the slow rule and a probe's deadline)
    /// only once the first body frame does
    /// ([`BodyGuard::first_frame`]).
    pub(crate) fn on_timed_head<C: Classify>(
        &mut self,
        classifier: &C,
        status: StatusCode,
        headers: &HeaderMap,
        at_first_frame: bool,
    ) -> BodyGuard<Held<C::Stream>> {
        if at_first_frame {
            // Pacing reads the head now; time to head waits for a frame.
            if let Some(wait) = classifier.pacing_wait(headers) {
                self.permit.pace_for(wait);
            }
        } else {
            self.permit.head_came(|| classifier.pacing_wait(headers));
        }
        if !status.is_success() {
            self.waive();
        }
        match classifier.classify_response(status, headers) {
            Verdict::Done(Outcome::Success) => {
                BodyGuard::pending(self.permit.take(), Held::Decided(Outcome::Success))
            }
            Verdict::Done(outcome) => {
                self.permit
                    .finish_announced(outcome, &|| classifier.announced_wait(headers));
                BodyGuard::decided()
            }
            Verdict::Defer(stream) => BodyGuard::pending(self.permit.take(), Held::Stream(stream)),
        }
    }

    /// An answer that is not a 2xx costs nothing: providers bill answers,
    /// not errors.
    #[inline]
    fn waive(&mut self) {
        if self.permit.is_metered() {
            self.permit.charge(Charge::Free);
        }
    }

    /// The call ended at a stream deadline before its head came.
    pub(crate) fn on_deadline(&mut self) {
        self.permit.finish(Outcome::Failure);
    }
}

// === Held ===

/// The verdict a body under stream deadlines waits to settle: the stream
/// classifier's, or a success the head gave, which holds until the body
/// ends so that a deadline can still fail the call.
#[derive(Debug)]
pub(crate) enum Held<S> {
    Stream(S),
    Decided(Outcome),
}

impl<S: ClassifyStream> ClassifyStream for Held<S> {
    #[inline]
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        match self {
            Held::Stream(s) => s.on_data(chunk),
            Held::Decided(_) => None,
        }
    }

    fn on_trailers(&mut self, trailers: &HeaderMap) -> Option<Outcome> {
        match self {
            Held::Stream(s) => s.on_trailers(trailers),
            Held::Decided(_) => None,
        }
    }

    fn on_end(self) -> Outcome {
        match self {
            Held::Stream(s) => s.on_end(),
            Held::Decided(o) => o,
        }
    }

    /// A body that breaks after a successful head is a failure, as a
    /// stream that breaks is.
    fn on_error(self) -> Outcome {
        match self {
            Held::Stream(s) => s.on_error(),
            Held::Decided(_) => Outcome::Failure,
        }
    }

    fn announced_reset(&self) -> Option<Duration> {
        match self {
            Held::Stream(s) => s.announced_reset(),
            Held::Decided(_) => None,
        }
    }

    /// The caller's own drop: what the stream classifier says of it, or the
    /// head's verdict.
    fn on_drop(self) -> Outcome {
        match self {
            Held::Stream(s) => s.on_drop(),
            Held::Decided(o) => o,
        }
    }

    fn charge(&mut self) -> Charge {
        match self {
            Held::Stream(s) => s.charge(),
            Held::Decided(_) => Charge::Unknown,
        }
    }
}

// === reading a body ===

/// How a body's stream came to a verdict (see [`read_frame`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    /// A frame decided the call.
    Decided(Outcome),
    /// The body failed.
    Broke,
    /// The body ended.
    Ended,
}

impl End {
    /// The call's outcome: the deciding frame's, or what `stream` says of a
    /// body that failed or ended.
    #[inline]
    pub(crate) fn outcome<S: ClassifyStream>(self, stream: S) -> Outcome {
        match self {
            End::Decided(outcome) => outcome,
            End::Broke => stream.on_error(),
            End::Ended => stream.on_end(),
        }
    }
}

/// Shows `stream` what one poll of a body gave (a data frame, trailers, an
/// error or the end) and says whether the call is decided; `ended` says
/// whether the body has nothing more to give. The one reading of a body:
/// the [`BodyGuard`] of a call and a health probe's body both go through
/// it.
#[inline]
pub(crate) fn read_frame<S: ClassifyStream, D: Buf, E>(
    stream: &mut S,
    frame: &Option<Result<Frame<D>, E>>,
    ended: impl FnOnce() -> bool,
) -> Option<End> {
    let decided = match frame {
        Some(Ok(frame)) => {
            if let Some(data) = frame.data_ref() {
                stream.on_data(data.chunk())
            } else if let Some(trailers) = frame.trailers_ref() {
                stream.on_trailers(trailers)
            } else {
                None
            }
        }
        Some(Err(_)) => return Some(End::Broke),
        None => return Some(End::Ended),
    };
    match decided {
        Some(outcome) => Some(End::Decided(outcome)),
        None if ended() => Some(End::Ended),
        None => None,
    }
}

// === BodyGuard ===

/// The permit and stream classifier of a call whose verdict waits for the
/// end of the body. Dropped undecided (the caller dropped the body), it
/// records what the classifier says of a body dropped early.
///
/// The contents are dropped by hand (by [`settle`](Self::settle), which
/// takes them), so that a guard whose stream type cannot exist, such as
/// [`NeverDefer`](crate::classify::NeverDefer)'s, drops as nothing at all.
pub(crate) struct BodyGuard<S: ClassifyStream>(ManuallyDrop<Option<(Permit, S)>>);

impl<S: ClassifyStream> BodyGuard<S> {
    /// Whether `S` has no values: then no guard is ever pending, and the
    /// checks below fold away. `Option<S>` takes no room exactly when its
    /// `Some` cannot be built.
    const NEVER: bool = size_of::<Option<S>>() == 0;

    /// A guard with nothing to decide.
    #[inline]
    pub(crate) const fn decided() -> Self {
        BodyGuard(ManuallyDrop::new(None))
    }

    /// A guard that holds `permit` until `stream` decides.
    #[inline]
    pub(crate) fn pending(permit: Permit, stream: S) -> Self {
        BodyGuard(ManuallyDrop::new(Some((permit, stream))))
    }

    /// Whether the outcome is still to be decided.
    #[inline]
    pub(crate) fn is_pending(&self) -> bool {
        !Self::NEVER && self.0.is_some()
    }

    /// The body turned out to be over before it was polled.
    #[inline]
    pub(crate) fn on_end(&mut self) {
        self.settle(S::on_end);
    }

    /// Sees what one poll of the body gave; `ended` says whether the body has
    /// nothing more to give.
    #[inline]
    pub(crate) fn on_frame<D: Buf, E>(
        &mut self,
        frame: &Option<Result<Frame<D>, E>>,
        ended: impl FnOnce() -> bool,
    ) {
        if Self::NEVER {
            return;
        }
        let Some((_, stream)) = self.0.as_mut() else {
            return;
        };
        if let Some(end) = read_frame(stream, frame, ended) {
            self.settle(|stream| end.outcome(stream));
        }
    }

    /// A stream deadline passed: the call failed.
    pub(crate) fn on_deadline(&mut self) {
        self.settle(|_| Outcome::Failure);
    }

    /// The first body frame came: under a first-frame deadline, this is
    /// when the head counts as come.
    pub(crate) fn first_frame(&mut self) {
        if let Some((permit, _)) = self.0.as_mut() {
            permit.head_received();
        }
    }

    fn settle(&mut self, f: impl FnOnce(S) -> Outcome) {
        if let Some((mut permit, mut stream)) = self.0.take() {
            if permit.is_metered() {
                charge(&mut permit, &mut stream);
            }
            let reset = stream.announced_reset();
            permit.finish_announced(f(stream), &|| reset);
        }
    }
}

/// Charges a metered call what its stream read (apart, so that a body
/// guard without a spend guard stays small enough to inline).
#[cold]
#[inline(never)]
fn charge<S: ClassifyStream>(permit: &mut Permit, stream: &mut S) {
    permit.charge(stream.charge());
}

impl<S: ClassifyStream> Drop for BodyGuard<S> {
    #[inline]
    fn drop(&mut self) {
        // Most bodies were decided on their heads, or have ended. Settling
        // takes the contents, so nothing is left to drop afterwards.
        if self.is_pending() {
            self.abandon();
        }
    }
}

impl<S: ClassifyStream> BodyGuard<S> {
    /// The caller dropped the body before its verdict came.
    #[cold]
    fn abandon(&mut self) {
        self.settle(S::on_drop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    #[derive(Debug)]
    struct Wrapped(CircuitOpen);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[derive(Debug)]
    struct Cycle;

    impl fmt::Display for Cycle {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("cycle")
        }
    }

    impl StdError for Cycle {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(self)
        }
    }

    fn open() -> CircuitOpen {
        let breaker = crate::Breaker::builder().name("inner").build().unwrap();
        breaker.force_open();
        breaker.admit().unwrap_err()
    }

    #[tokio::test]
    async fn a_rejection_is_found_anywhere_in_the_chain() {
        let wrapped = Wrapped(open());
        assert_eq!(
            rejection(&wrapped).and_then(CircuitOpen::key),
            Some("inner")
        );
        assert_eq!(
            error_outcome(&crate::classify::HttpClassifier, &wrapped),
            Outcome::Ignored
        );
    }

    #[test]
    fn a_cyclic_chain_ends_the_search() {
        assert!(rejection(&Cycle).is_none());
        let io = std::io::Error::other("reset");
        assert_eq!(
            error_outcome(&crate::classify::HttpClassifier, &io),
            Outcome::Failure
        );
    }

    /// Defers every head to the body, and says a 400 is the upstream's
    /// failure: the layers that judge on the head take its word.
    struct Strict;

    struct ToTheEnd;

    impl ClassifyStream for ToTheEnd {
        fn on_end(self) -> Outcome {
            Outcome::Success
        }
    }

    impl Classify for Strict {
        type Stream = ToTheEnd;

        fn classify_response(&self, _: StatusCode, _: &HeaderMap) -> Verdict<Self::Stream> {
            Verdict::Defer(ToTheEnd)
        }

        fn classify_error(&self, _: ErrorRef<'_>) -> Outcome {
            Outcome::Failure
        }

        fn head_outcome(&self, status: StatusCode, _: &HeaderMap) -> Outcome {
            match status.as_u16() {
                400.. => Outcome::Failure,
                _ => Outcome::Success,
            }
        }
    }

    /// Only a stream type without values skips the guard's checks: every
    /// stream that can be built is seen to its end.
    #[test]
    fn only_a_stream_that_cannot_exist_skips_the_guard() {
        use crate::classify::{LlmStream, NeverDefer};
        let never = [
            ("NeverDefer", BodyGuard::<NeverDefer>::NEVER),
            ("a unit stream", BodyGuard::<ToTheEnd>::NEVER),
            ("LlmStream", BodyGuard::<LlmStream>::NEVER),
            ("a held success", BodyGuard::<Held<NeverDefer>>::NEVER),
            ("a held unit stream", BodyGuard::<Held<ToTheEnd>>::NEVER),
        ];
        let skipped: Vec<_> = never.iter().filter(|(_, n)| *n).map(|(s, _)| *s).collect();
        assert_eq!(skipped, ["NeverDefer"]);
        // A guard that can be pending still records a body dropped early.
        struct HungUp;
        impl ClassifyStream for HungUp {
            fn on_end(self) -> Outcome {
                Outcome::Success
            }
            fn on_drop(self) -> Outcome {
                Outcome::Failure
            }
        }
        let breaker = crate::Breaker::builder()
            .trip_mode(crate::TripMode::Open)
            .consecutive_failures(1)
            .build()
            .unwrap();
        let guard = BodyGuard::pending(breaker.admit().unwrap(), HungUp);
        assert!(guard.is_pending());
        drop(guard);
        assert_eq!(breaker.state(), crate::State::Open, "the drop was recorded");
    }

    #[test]
    fn a_deferred_head_is_judged_by_the_classifiers_own_head_rule() {
        let bad = Response::builder().status(400).body(()).unwrap();
        let result: Result<_, crate::BoxError> = Ok(bad);
        assert_eq!(judge(&Strict, &result), Judged::Said(Outcome::Failure));
        // The default rule ignores a 400.
        let ok: Result<_, crate::BoxError> = Ok(Response::builder().status(400).body(()).unwrap());
        assert_eq!(
            judge(&crate::classify::LlmClassifier::default(), &ok),
            Judged::Said(Outcome::Ignored)
        );
    }
}

#[cfg(test)]
mod sizes {
    use std::convert::Infallible;
    use std::future::Ready;
    use std::mem::size_of;

    use http::Response;

    use crate::body::ResponseBody;
    use crate::classify::HttpClassifier;
    use crate::future::ResponseFuture;

    type Answer = Ready<Result<Response<String>, Infallible>>;

    /// What a call through a breaker moves, on top of what it would move
    /// without one: every call moves its future and its response's body
    /// wrapper, and their sizes are a good part of the closed path's cost.
    #[test]
    fn a_call_moves_a_permit_of_four_words_at_most() {
        let permit = size_of::<crate::breaker::Permit>();
        let body = size_of::<ResponseBody<String>>() - size_of::<String>();
        let future = size_of::<ResponseFuture<Answer, HttpClassifier>>() - size_of::<Answer>();
        // The observer's token for the time to first byte takes a word of
        // its own.
        let most = if cfg!(feature = "metrics") { 40 } else { 32 };
        assert!(permit <= most, "a permit of {permit} bytes");
        assert!(body <= most, "the body wrapper adds {body} bytes");
        assert!(future <= most, "the future adds {future} bytes");
    }
}
