//! [`Script`]: the phases an upstream goes through, and how it draws each
//! call's answer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;

use super::{Answer, Latency, RateLimit};

/// One stretch of an upstream's life: from `from` (since the upstream was
/// made) until the next phase, each call gets one of the phase's answers,
/// drawn with the given probabilities.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::testing::{Answer, Phase};
///
/// // From the first minute on: 70 % of calls hang, 30 % get a slow 503.
/// let outage = Phase::new(Duration::from_secs(60))
///     .answer(0.7, Answer::Hang)
///     .answer(0.3, Answer::status(503).after(Duration::from_secs(2)));
/// # let _ = outage;
/// ```
#[derive(Debug, Clone)]
pub struct Phase {
    from: Duration,
    answers: Vec<Weighted>,
}

#[derive(Debug, Clone)]
struct Weighted {
    p: f64,
    answer: Answer,
    latency: Latency,
}

impl Phase {
    /// A phase that starts `from` after the upstream was made, with no
    /// answers yet.
    #[must_use]
    pub fn new(from: Duration) -> Phase {
        Phase {
            from,
            answers: Vec::new(),
        }
    }

    /// Gives `answer`, with its fixed latency, to a share `p` (0 to 1) of
    /// the calls.
    #[must_use]
    pub fn answer(self, p: f64, answer: Answer) -> Phase {
        self.answer_with(p, answer, Latency::Fixed)
    }

    /// Gives `answer`, its latency varying by `latency`, to a share `p` of
    /// the calls.
    #[must_use]
    pub fn answer_with(mut self, p: f64, answer: Answer, latency: Latency) -> Phase {
        self.answers.push(Weighted { p, answer, latency });
        self
    }

    /// When the phase starts.
    #[must_use]
    pub fn from(&self) -> Duration {
        self.from
    }
}

/// The behaviour of a [`ScriptedUpstream`](super::ScriptedUpstream): its
/// phases, how it draws, and its capacity. Built by [`Script::builder`].
///
/// What a call gets is a pure function of the seed, the stream, the
/// request (its id, or the call's number) and how many times that request
/// came before: two runs of a test see the same answers, and a request's
/// fate does not depend on how other requests interleave with it.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::testing::{Answer, Phase, Script, ScriptError};
///
/// let script = Script::builder()
///     .phase(Phase::new(Duration::ZERO).answer(1.0, Answer::ok()))
///     .phase(Phase::new(Duration::from_secs(60)).answer(1.0, Answer::status(503)))
///     .phase(Phase::new(Duration::from_secs(300)).answer(1.0, Answer::ok()))
///     .seed(7)
///     .build()?;
/// assert_eq!(script.phases(), 3);
///
/// let err = Script::builder()
///     .phase(Phase::new(Duration::ZERO).answer(0.5, Answer::ok()))
///     .build()
///     .unwrap_err();
/// assert!(matches!(err, ScriptError::ProbabilitySum { phase: 0, .. }));
/// # Ok::<_, ScriptError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Script {
    pub(super) name: Arc<str>,
    phases: Arc<[Compiled]>,
    pub(super) seed: u64,
    pub(super) stream: u64,
    pub(super) stream_tokens: bool,
    pub(super) capacity: Option<Capacity>,
    pub(super) rate_limit: Option<RateLimit>,
    pub(super) request_id: Option<HeaderName>,
    /// A good answer's `usage`, if it reports one.
    pub(super) usage: Option<Arc<super::body::UsageBodies>>,
}

#[derive(Debug)]
struct Compiled {
    from: Duration,
    /// The start of the next phase, or the end of the script.
    until: Duration,
    answers: Vec<Weighted>,
}

impl Script {
    /// A builder with no phase yet.
    #[must_use]
    pub fn builder() -> ScriptBuilder {
        ScriptBuilder::default()
    }

    /// How many phases it has.
    pub fn phases(&self) -> usize {
        self.phases.len()
    }

    /// The name it gives its attempts.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The answer a call at `t` (since the upstream was made) gets for the
    /// uniform draws `u` (which answer) and `v`, `w` (its latency), each in
    /// `[0, 1)`.
    pub(super) fn answer_at(&self, t: Duration, u: f64, v: f64, w: f64) -> Answer {
        let i = self.phases.partition_point(|p| p.from <= t);
        self.phases[i.saturating_sub(1)].draw(t, u, v, w)
    }

    /// The three draws of attempt `n` of `request`.
    pub(super) fn draws(&self, request: u64, n: u32) -> (f64, f64, f64) {
        (
            draw(self.seed, self.stream, request, n),
            draw(self.seed ^ 0x1a7e_0001, self.stream, request, n),
            draw(self.seed ^ 0x1a7e_0002, self.stream, request, n),
        )
    }
}

impl Compiled {
    /// The answer picked by a uniform draw `u` in `[0, 1)`.
    fn pick(&self, u: f64) -> &Weighted {
        let mut acc = 0.0;
        let mut last = &self.answers[0];
        for a in &self.answers {
            if a.p <= 0.0 {
                continue;
            }
            acc += a.p;
            last = a;
            if u < acc {
                return a;
            }
        }
        // Rounding: the probabilities add up to 1 within 1e-9.
        last
    }

    fn draw(&self, t: Duration, u: f64, v: f64, w: f64) -> Answer {
        let a = self.pick(u);
        let Some(base) = a.answer.latency() else {
            return a.answer;
        };
        match a.latency {
            Latency::Fixed => a.answer,
            Latency::Lognormal { sigma } => {
                // Box-Muller: a standard normal from two uniforms.
                let z = (-2.0 * (1.0 - v).ln()).sqrt() * (std::f64::consts::TAU * w).cos();
                let secs = (base.as_secs_f64() * (sigma * z).exp()).min(315_360_000.0);
                a.answer.after(Duration::from_secs_f64(secs))
            }
            Latency::Ramp { to } => {
                let span = self.until.saturating_sub(self.from).as_secs_f64();
                let x = if span > 0.0 {
                    (t.saturating_sub(self.from).as_secs_f64() / span).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let secs = base.as_secs_f64() + (to.as_secs_f64() - base.as_secs_f64()) * x;
                a.answer.after(Duration::from_secs_f64(secs.max(0.0)))
            }
        }
    }
}

// === ScriptBuilder ===

/// Builds a [`Script`]; [`build`](Self::build) checks it.
///
/// Defaults: named `upstream`, seed 0, stream 0, event streams sent as one
/// frame at their end, no capacity limit, every call a request of its own.
#[derive(Debug, Clone)]
pub struct ScriptBuilder {
    name: Arc<str>,
    phases: Vec<Phase>,
    end: Option<Duration>,
    seed: u64,
    stream: u64,
    stream_tokens: bool,
    capacity: Option<Capacity>,
    rate_limit: Option<RateLimit>,
    request_id: Option<HeaderName>,
    usage: Option<(u64, u64)>,
}

impl Default for ScriptBuilder {
    fn default() -> Self {
        ScriptBuilder {
            name: "upstream".into(),
            phases: Vec::new(),
            end: None,
            seed: 0,
            stream: 0,
            stream_tokens: false,
            capacity: None,
            rate_limit: None,
            request_id: None,
            usage: None,
        }
    }
}

impl ScriptBuilder {
    /// Adds a phase; phases must come in increasing order of their start.
    /// A call before the first phase starts is answered by the first.
    #[must_use]
    pub fn phase(mut self, phase: Phase) -> Self {
        self.phases.push(phase);
        self
    }

    /// The name in its [`Attempt`](super::Attempt)s, to tell upstreams apart
    /// in a shared [`AttemptLog`](super::AttemptLog).
    #[must_use]
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// When the last phase ends, for a [`Latency::Ramp`] in it. Default: a
    /// last phase that does not end (a ramp in it is refused).
    #[must_use]
    pub fn ends_at(mut self, end: Duration) -> Self {
        self.end = Some(end);
        self
    }

    /// Seeds the draws.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Draws from stream `stream` of the seed: upstreams of one test that
    /// share a seed draw independently when their streams differ.
    #[must_use]
    pub fn stream(mut self, stream: u64) -> Self {
        self.stream = stream;
        self
    }

    /// With `true`, an event stream sends a token every
    /// [`TOKEN_GAP`](super::TOKEN_GAP) from its head to its last event (what
    /// stall and first-frame deadlines see); with `false` (the default),
    /// only its last event, at its end. A [`Stall`](Answer::Stall) sends
    /// tokens either way.
    #[must_use]
    pub fn stream_tokens(mut self, on: bool) -> Self {
        self.stream_tokens = on;
        self
    }

    /// Good answers report a `usage` of `input` prompt tokens and `output`
    /// completion tokens, in the OpenAI shape, by the script's
    /// [`name`](Self::name) as the model: in a JSON completion, and as a
    /// last chunk before `data: [DONE]` in a stream (as OpenAI sends it with
    /// `stream_options.include_usage`). Off by default.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http_body_util::BodyExt;
    /// use tower::ServiceExt;
    /// use tower_circuit_breaker::spend::Usage;
    /// use tower_circuit_breaker::testing::{Answer, Phase, Script, ScriptedUpstream};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let script = Script::builder()
    ///     .name("gpt-4o")
    ///     .usage(3_000, 1_000)
    ///     .phase(Phase::new(Duration::ZERO).answer(1.0, Answer::ok()))
    ///     .build()
    ///     .unwrap();
    /// let res = ScriptedUpstream::new(script).oneshot(http::Request::new(String::new())).await.unwrap();
    /// let body = res.into_body().collect().await.unwrap().to_bytes();
    /// let usage = Usage::from_json(&body).unwrap();
    /// assert_eq!((usage.input(), usage.output(), usage.model()), (3_000, 1_000, Some("gpt-4o")));
    /// # }
    /// ```
    #[must_use]
    pub fn usage(mut self, input: u64, output: u64) -> Self {
        self.usage = Some((input, output));
        self
    }

    /// Serves at most `capacity`'s calls at once and queues some more;
    /// beyond them, a 429 at once.
    #[must_use]
    pub fn capacity(mut self, capacity: Capacity) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// Keeps a request rate limit, announced in every answer's
    /// `x-ratelimit-*` headers, with a 429 beyond it (see [`RateLimit`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::testing::{Answer, Phase, RateLimit, Script};
    ///
    /// let script = Script::builder()
    ///     .rate_limit(RateLimit::new(150, Duration::from_secs(60)))
    ///     .phase(Phase::new(Duration::ZERO).answer(1.0, Answer::ok()))
    ///     .build();
    /// assert!(script.is_ok());
    /// ```
    #[must_use]
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Takes each call's request id from the header `name` (a decimal
    /// number), so that a retry is the same request's next attempt: attempt
    /// `n` of request `r` gets the same answer in every run, whatever else
    /// is going on. Calls without the header are numbered in the order they
    /// come, from 0.
    #[must_use]
    pub fn request_id_header(mut self, name: HeaderName) -> Self {
        self.request_id = Some(name);
        self
    }

    /// Checks the phases and builds the script.
    ///
    /// # Errors
    ///
    /// A [`ScriptError`] when there is no phase, the phases are out of order,
    /// a phase has no answer, a probability is outside `0..=1`, or a rate
    /// limit allows no call or has no period.
    pub fn build(self) -> Result<Script, ScriptError> {
        if let Some(limit) = self.rate_limit
            && (limit.requests == 0 || limit.period.is_zero())
        {
            return Err(ScriptError::RateLimit);
        }
        let mut phases: Vec<Compiled> = Vec::with_capacity(self.phases.len());
        for (i, phase) in self.phases.into_iter().enumerate() {
            if let Some(prev) = phases.last_mut() {
                if phase.from <= prev.from {
                    return Err(ScriptError::OutOfOrder { phase: i });
                }
                prev.until = phase.from;
            }
            if phase.answers.is_empty() {
                return Err(ScriptError::NoAnswers { phase: i });
            }
            let mut sum = 0.0;
            for a in &phase.answers {
                if !(0.0..=1.0).contains(&a.p) {
                    return Err(ScriptError::Probability { phase: i, p: a.p });
                }
                if let Latency::Lognormal { sigma } = a.latency
                    && !(sigma.is_finite() && (0.0..=3.0).contains(&sigma))
                {
                    return Err(ScriptError::Sigma { phase: i, sigma });
                }
                sum += a.p;
            }
            if (sum - 1.0).abs() > 1e-9 {
                return Err(ScriptError::ProbabilitySum { phase: i, sum });
            }
            phases.push(Compiled {
                from: phase.from,
                until: self.end.map_or(Duration::MAX, |end| end.max(phase.from)),
                answers: phase.answers,
            });
        }
        let Some(last) = phases.last() else {
            return Err(ScriptError::NoPhases);
        };
        if self.end.is_none()
            && last
                .answers
                .iter()
                .any(|a| matches!(a.latency, Latency::Ramp { .. }))
        {
            return Err(ScriptError::RampWithoutEnd);
        }
        let usage = self
            .usage
            .map(|(i, o)| Arc::new(super::body::UsageBodies::new(&self.name, i, o)));
        Ok(Script {
            name: self.name,
            phases: phases.into(),
            seed: self.seed,
            stream: self.stream,
            stream_tokens: self.stream_tokens,
            capacity: self.capacity,
            rate_limit: self.rate_limit,
            request_id: self.request_id,
            usage,
        })
    }
}

// === Capacity ===

/// How many calls a [`ScriptedUpstream`](super::ScriptedUpstream) serves at
/// once, how many more wait for a slot (first come, first served), and what
/// the 429 beyond them asks for.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::testing::Capacity;
///
/// let capacity = Capacity::new(8, 32).retry_after(Duration::from_secs(1));
/// # let _ = capacity;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub(super) concurrent: u32,
    pub(super) queue: u32,
    pub(super) retry_after: Option<Duration>,
}

impl Capacity {
    /// `concurrent` calls at once, `queue` more waiting; a 429 without
    /// `Retry-After` beyond them.
    #[must_use]
    pub const fn new(concurrent: u32, queue: u32) -> Capacity {
        Capacity {
            concurrent,
            queue,
            retry_after: None,
        }
    }

    /// The 429's `Retry-After`.
    #[must_use]
    pub const fn retry_after(mut self, wait: Duration) -> Capacity {
        self.retry_after = Some(wait);
        self
    }
}

// === ScriptError ===

/// Why [`ScriptBuilder::build`] refused.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::testing::{Answer, Phase, Script, ScriptError};
///
/// let err = Script::builder().build().unwrap_err();
/// assert_eq!(err, ScriptError::NoPhases);
/// assert_eq!(err.to_string(), "a script needs at least one phase");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ScriptError {
    /// No phase was given.
    NoPhases,
    /// A phase starts no later than the one before it.
    OutOfOrder {
        /// The phase's index.
        phase: usize,
    },
    /// A phase has no answer.
    NoAnswers {
        /// The phase's index.
        phase: usize,
    },
    /// A probability outside `0..=1`.
    Probability {
        /// The phase's index.
        phase: usize,
        /// The probability given.
        p: f64,
    },
    /// A phase's probabilities do not add up to 1.
    ProbabilitySum {
        /// The phase's index.
        phase: usize,
        /// What they add up to.
        sum: f64,
    },
    /// A lognormal spread outside `0..=3`.
    Sigma {
        /// The phase's index.
        phase: usize,
        /// The spread given.
        sigma: f64,
    },
    /// A latency ramp in the last phase of a script with no end.
    RampWithoutEnd,
    /// A [`RateLimit`] of zero calls or over no time.
    RateLimit,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScriptError::NoPhases => f.write_str("a script needs at least one phase"),
            ScriptError::OutOfOrder { phase } => {
                write!(f, "phase {phase} does not start after the one before it")
            }
            ScriptError::NoAnswers { phase } => write!(f, "phase {phase} has no answer"),
            ScriptError::Probability { phase, p } => {
                write!(f, "phase {phase}: probability {p} is not within 0..=1")
            }
            ScriptError::ProbabilitySum { phase, sum } => {
                write!(f, "phase {phase}: the probabilities add up to {sum}, not 1")
            }
            ScriptError::Sigma { phase, sigma } => {
                write!(
                    f,
                    "phase {phase}: lognormal sigma {sigma} is not within 0..=3"
                )
            }
            ScriptError::RampWithoutEnd => {
                f.write_str("a latency ramp in the last phase needs the script's end (`ends_at`)")
            }
            ScriptError::RateLimit => {
                f.write_str("a rate limit needs at least one call and a period above zero")
            }
        }
    }
}

impl std::error::Error for ScriptError {}

// === draws ===

/// The splitmix64 finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// A uniform number in `[0, 1)` for attempt `n` of `request` on `stream`,
/// that depends on nothing else.
fn draw(seed: u64, stream: u64, request: u64, n: u32) -> f64 {
    unit(mix(mix(mix(mix(seed) ^ stream) ^ request) ^ u64::from(n)))
}
