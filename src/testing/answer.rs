//! What a scripted upstream answers: [`Answer`] and its [`Latency`].

use std::time::Duration;

/// What a [`ScriptedUpstream`](super::ScriptedUpstream) does with one call.
///
/// Every delay is a Tokio timer, so under `tokio::time::pause()` an answer
/// that takes a minute takes no time at all. Streams are `text/event-stream`
/// bodies in OpenAI's format.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::testing::Answer;
///
/// let slow_503 = Answer::status(503).after(Duration::from_secs(2));
/// assert_eq!(slow_503.latency(), Some(Duration::from_secs(2)));
/// assert!(slow_503.is_failure());
/// assert!(!Answer::too_many_requests(Some(Duration::from_secs(5))).is_failure());
/// assert_eq!(Answer::Hang.latency(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Answer {
    /// A good answer, its head after `latency`. With a `stream` of zero, a
    /// JSON chat completion; otherwise a 200 event stream that ends with
    /// `data: [DONE]` `stream` after its head.
    Ok {
        /// Time to the response head.
        latency: Duration,
        /// Time from the head to the end of the stream (zero: JSON).
        stream: Duration,
    },
    /// A JSON error answer with this status after `latency`, with
    /// `Retry-After` (whole seconds) or `retry-after-ms` when `retry_after`
    /// is set.
    Status {
        /// The status code; one that is not valid becomes 500.
        code: u16,
        /// Time to the response head.
        latency: Duration,
        /// The wait the answer asks for.
        retry_after: Option<Duration>,
    },
    /// No answer, ever: the call hangs until the caller gives up.
    Hang,
    /// The connection is reset after `latency`: the call fails with an
    /// `std::io::Error` of kind `ConnectionReset`.
    Reset {
        /// Time to the reset.
        latency: Duration,
    },
    /// A 200 event stream whose `event: error` (an Anthropic-style
    /// `overloaded_error`) comes `stream` after its head.
    SseError {
        /// Time to the response head.
        latency: Duration,
        /// Time from the head to the error event.
        stream: Duration,
    },
    /// A 400 content-filter answer (Azure OpenAI's), after `latency`.
    ContentFilter {
        /// Time to the response head.
        latency: Duration,
    },
    /// A 400 whose body says the request is longer than the model's
    /// context window (OpenAI's `context_length_exceeded`), after
    /// `latency`.
    ContextLength {
        /// Time to the response head.
        latency: Duration,
    },
    /// A 429 whose body says the account's quota is used up (OpenAI's
    /// `insufficient_quota`), with no `Retry-After`, after `latency`: the
    /// [`LlmClassifier`](crate::classify::LlmClassifier) reads it as
    /// [`ErrorKind::QuotaExhausted`](crate::classify::ErrorKind::QuotaExhausted),
    /// not as a rate limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::testing::Answer;
    ///
    /// let quota = Answer::QuotaExhausted { latency: Duration::ZERO }.after(Duration::from_millis(90));
    /// assert_eq!(quota.latency(), Some(Duration::from_millis(90)));
    /// assert!(!quota.is_failure());
    /// ```
    QuotaExhausted {
        /// Time to the response head.
        latency: Duration,
    },
    /// A 200 event stream that sends a token every
    /// [`TOKEN_GAP`](super::TOKEN_GAP) for `stall_after`, then nothing
    /// more, with the connection open: the body never ends.
    Stall {
        /// Time to the response head.
        latency: Duration,
        /// How long tokens come before the silence.
        stall_after: Duration,
    },
}

impl Answer {
    /// A JSON chat completion, at once.
    #[must_use]
    pub const fn ok() -> Answer {
        Answer::Ok {
            latency: Duration::ZERO,
            stream: Duration::ZERO,
        }
    }

    /// A 200 event stream whose `data: [DONE]` comes `stream` after its
    /// head.
    #[must_use]
    pub const fn stream(stream: Duration) -> Answer {
        Answer::Ok {
            latency: Duration::ZERO,
            stream,
        }
    }

    /// An error answer with status `code` (a 503, say), at once.
    #[must_use]
    pub const fn status(code: u16) -> Answer {
        Answer::Status {
            code,
            latency: Duration::ZERO,
            retry_after: None,
        }
    }

    /// A 429, at once, asking for `retry_after` when it is given.
    #[must_use]
    pub const fn too_many_requests(retry_after: Option<Duration>) -> Answer {
        Answer::Status {
            code: 429,
            latency: Duration::ZERO,
            retry_after,
        }
    }

    /// A connection reset, at once.
    #[must_use]
    pub const fn reset() -> Answer {
        Answer::Reset {
            latency: Duration::ZERO,
        }
    }

    /// The same answer with its head (or reset) after `latency`; a
    /// [`Hang`](Answer::Hang) stays a hang.
    #[must_use]
    pub const fn after(mut self, latency: Duration) -> Answer {
        match &mut self {
            Answer::Ok { latency: l, .. }
            | Answer::Status { latency: l, .. }
            | Answer::Reset { latency: l }
            | Answer::SseError { latency: l, .. }
            | Answer::Stall { latency: l, .. }
            | Answer::ContentFilter { latency: l }
            | Answer::ContextLength { latency: l }
            | Answer::QuotaExhausted { latency: l } => *l = latency,
            Answer::Hang => {}
        }
        self
    }

    /// The time to the response head (or the reset); `None` for a hang.
    #[must_use]
    pub const fn latency(&self) -> Option<Duration> {
        match *self {
            Answer::Ok { latency, .. }
            | Answer::Status { latency, .. }
            | Answer::Reset { latency }
            | Answer::SseError { latency, .. }
            | Answer::Stall { latency, .. }
            | Answer::ContentFilter { latency }
            | Answer::ContextLength { latency }
            | Answer::QuotaExhausted { latency } => Some(latency),
            Answer::Hang => None,
        }
    }

    /// Whether this is the upstream failing: a 5xx, a hang, a reset, an
    /// error event or a stall. A 4xx (429 included), a content filter, a
    /// context-length error and an exhausted quota are not.
    #[must_use]
    pub const fn is_failure(&self) -> bool {
        match self {
            Answer::Ok { .. }
            | Answer::ContentFilter { .. }
            | Answer::ContextLength { .. }
            | Answer::QuotaExhausted { .. } => false,
            Answer::Status { code, .. } => *code >= 500,
            Answer::Hang
            | Answer::Reset { .. }
            | Answer::SseError { .. }
            | Answer::Stall { .. } => true,
        }
    }
}

/// How an [`Answer`]'s latency varies from call to call within a
/// [`Phase`](super::Phase).
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::testing::{Answer, Latency, Phase};
///
/// // Around 800 ms, with a long tail; then slower and slower over the phase.
/// let phase = Phase::new(Duration::ZERO)
///     .answer_with(0.5, Answer::ok().after(Duration::from_millis(800)), Latency::Lognormal { sigma: 0.5 })
///     .answer_with(0.5, Answer::ok().after(Duration::from_secs(1)), Latency::Ramp { to: Duration::from_secs(20) });
/// # let _ = phase;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Latency {
    /// The answer's latency, every time.
    Fixed,
    /// Lognormal around a median of the answer's latency, with this spread
    /// (the standard deviation of its logarithm; 0 to 3).
    Lognormal {
        /// The spread.
        sigma: f64,
    },
    /// From the answer's latency at the phase's start to `to` at its end
    /// (the next phase's start, or the script's
    /// [`ends_at`](super::ScriptBuilder::ends_at)).
    Ramp {
        /// The latency at the phase's end.
        to: Duration,
    },
}
