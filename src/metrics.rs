//! Metrics through the [`metrics`] facade: calls by outcome,
//! rejections by reason, transitions, the state as a gauge and the time to
//! first byte as a histogram, for Prometheus (`metrics-exporter-prometheus`),
//! OpenTelemetry bridges or any other recorder.
//!
//! Metrics are off unless a breaker, keyed set or layer is built with
//! [`Builder::metrics`] (or [`Builder::metrics_switch`], to turn them on and
//! off at run time with a [`MetricsSwitch`]).
//!
//! # Example
//!
//! ```
//! use tower_circuit_breaker::metrics::MetricsSwitch;
//! use tower_circuit_breaker::{Breaker, Outcome};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // Install a recorder (metrics-exporter-prometheus, say) at any time,
//! // before or after the breakers are built.
//! let switch = MetricsSwitch::new(true);
//! let breaker = Breaker::builder()
//!     .name("gpt-4o")
//!     .consecutive_failures(3)
//!     .metrics_switch(&switch)
//!     .build()
//!     .unwrap();
//! breaker.admit().unwrap().record(Outcome::Success);
//!
//! switch.set(false); // nothing is reported from here on
//! breaker.admit().unwrap().record(Outcome::Success);
//! # }
//! ```
//!
//! # What is reported
//!
//! Every series carries the labels `breaker` (the breaker's name; for a
//! keyed set, the name given to its builder) and `key` (a keyed breaker's
//! key as the set stores it, so a key made by
//! [`header_hashed`](crate::keyed::header_hashed) stays hashed; empty for
//! a breaker that is not keyed).
//!
//! | name | kind | more labels |
//! | --- | --- | --- |
//! | `circuit_breaker_calls_total` | counter | `outcome`: `success`, `failure`, `ignored`, `rate_limited`, `quota_exhausted`, `dropped` |
//! | `circuit_breaker_rejections_total` | counter | `reason`: [`Rejection::as_str`] (`open`, `half_open_full`, `forced_open`, `volume_guard`) |
//! | `circuit_breaker_transitions_total` | counter | `from`, `to`: [`State::as_str`] |
//! | `circuit_breaker_state` | gauge | the state: 0 closed, 1 open, 2 half-open, 3 forced open, 4 disabled |
//! | `circuit_breaker_spend_warnings_total` | counter | (a spend guard's spend reached its [warning threshold](crate::spend::SpendGuard::warn_at)) |
//! | `circuit_breaker_time_to_first_byte_seconds` | histogram | (time from admission to the response head, for calls through a layer or an integration; to the microsecond, and a wait over 71 minutes wraps around; [buckets](#time-to-first-byte-buckets) for LLM answers) |
//!
//! # Time-to-first-byte buckets
//!
//! The facade records each time to first byte as a value; the buckets are
//! the exporter's to set. [`TIME_TO_FIRST_BYTE_BUCKETS`] are chosen for an
//! LLM's time to first token, 50 ms to 2 minutes (most answers start within
//! 0.25–5 s; a long reasoning model can take a minute). With
//! `metrics-exporter-prometheus`, give them to the builder, or it reports
//! the metric as a `summary` of quantiles instead of a histogram:
//!
//! ```
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//! use tower_circuit_breaker::metrics::{TIME_TO_FIRST_BYTE, TIME_TO_FIRST_BYTE_BUCKETS};
//!
//! let builder = PrometheusBuilder::new()
//!     .set_buckets_for_metric(
//!         Matcher::Full(TIME_TO_FIRST_BYTE.to_string()),
//!         TIME_TO_FIRST_BYTE_BUCKETS,
//!     )
//!     .expect("the buckets are not empty");
//! # let _ = builder;
//! ```
//!
//! The state gauge is set at each transition and when a breaker first
//! reports anything. Calls in shadow mode that would have been rejected are
//! calls, not rejections. [`describe`] gives the recorder each metric's help
//! text and unit.
//!
//! # Cost
//!
//! Built without the `metrics` feature, nothing is compiled in. Built with
//! it, a breaker built without metrics reports nothing and pays nothing
//! measurable; one built with a switch that is off checks it at admission,
//! at the response head and at the outcome, and reports nothing. On, every
//! report is one lookup of the current recorder and one call into it, with
//! the series' name and labels built once per breaker (when it first
//! reports): so a recorder installed after the breaker was built is used from
//! then on, and with no recorder installed the facade's no-op recorder does
//! nothing.
//!
//! # Label cardinality and evicted keys
//!
//! A keyed set holds at most [`max_keys`](crate::Builder::max_keys) keys plus
//! its `(overflow)` and `(unkeyed)` breakers, so at any moment at most that
//! many `key` values report, each with at most 6 + 4 + 20 + 1 + 1 series
//! (outcomes, reasons, transitions, state, histogram). The `metrics` facade
//! has no way to delete a series, so the series of a key that the set
//! evicted stay in the recorder until the recorder drops them itself: with
//! `metrics-exporter-prometheus`, set
//! `PrometheusBuilder::idle_timeout(MetricKindMask::ALL, Some(..))` to a
//! period longer than the set's [`idle_timeout`](crate::Builder::idle_timeout),
//! so that the recorder forgets what the set forgot and the number of live
//! series stays bounded by the cap. Without it they add up: 20,000 keys
//! churned through `max_keys(1000)` leave about 20,000 call series in the
//! recorder while the set holds a handful (`cargo test --all-features
//! --test observe evicted`). The crate cannot do it for the recorder: the
//! facade's `Recorder` has no call that removes a series. Keys come from requests: key by names
//! the service controls (a model, a region), or hash credentials, never a
//! raw credential header.
//!
//! [`metrics`]: https://docs.rs/metrics/0.24/metrics/

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::time::Instant;

use ::metrics::{Key, Label, Level, Metadata, SharedString, Unit};

use crate::breaker::{
    Build, Builder, MakeObserver, Observe, Outcome, Rejection, State, Transition,
};

const CALLS: &str = "circuit_breaker_calls_total";
const REJECTIONS: &str = "circuit_breaker_rejections_total";
const TRANSITIONS: &str = "circuit_breaker_transitions_total";
const STATE: &str = "circuit_breaker_state";
const TTFB: &str = TIME_TO_FIRST_BYTE;
const SPEND_WARNINGS: &str = "circuit_breaker_spend_warnings_total";

/// The name of the time-to-first-byte histogram, in seconds, for an
/// exporter's per-metric settings (see [the buckets](self#time-to-first-byte-buckets)).
///
/// ```
/// use tower_circuit_breaker::metrics::TIME_TO_FIRST_BYTE;
///
/// assert_eq!(TIME_TO_FIRST_BYTE, "circuit_breaker_time_to_first_byte_seconds");
/// ```
pub const TIME_TO_FIRST_BYTE: &str = "circuit_breaker_time_to_first_byte_seconds";

/// Bucket bounds, in seconds, for [`TIME_TO_FIRST_BYTE`]: an LLM's time to
/// first token, from 50 ms to 2 minutes, closer together where most
/// answers start (0.25–5 s). See [the buckets](self#time-to-first-byte-buckets)
/// for how to give them to `metrics-exporter-prometheus`.
///
/// ```
/// use tower_circuit_breaker::metrics::TIME_TO_FIRST_BYTE_BUCKETS;
///
/// assert!(TIME_TO_FIRST_BYTE_BUCKETS.windows(2).all(|w| w[0] < w[1]));
/// assert_eq!(TIME_TO_FIRST_BYTE_BUCKETS.first(), Some(&0.05));
/// assert_eq!(TIME_TO_FIRST_BYTE_BUCKETS.last(), Some(&120.0));
/// ```
pub const TIME_TO_FIRST_BYTE_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
];

static METADATA: Metadata<'static> =
    Metadata::new("tower_circuit_breaker", Level::INFO, Some(module_path!()));

/// Gives the current recorder the help text and unit of every metric the
/// crate reports. Call it once the recorder is installed; reporting works
/// without it.
///
/// ```
/// tower_circuit_breaker::metrics::describe();
/// ```
pub fn describe() {
    ::metrics::describe_counter!(CALLS, "Calls admitted by a circuit breaker, by outcome.");
    ::metrics::describe_counter!(
        REJECTIONS,
        "Calls a circuit breaker rejected without calling the upstream, by reason."
    );
    ::metrics::describe_counter!(TRANSITIONS, "Circuit state changes.");
    ::metrics::describe_gauge!(
        STATE,
        "Circuit state: 0 closed, 1 open, 2 half-open, 3 forced open, 4 disabled."
    );
    ::metrics::describe_histogram!(
        TTFB,
        Unit::Seconds,
        "Time from admission to the response head."
    );
}

// === MetricsSwitch ===

/// Turns the metrics of every breaker built with it on and off at run time.
///
/// Cheap to clone; clones share the switch.
///
/// ```
/// use tower_circuit_breaker::keyed::KeyedBreakers;
/// use tower_circuit_breaker::metrics::MetricsSwitch;
///
/// let switch = MetricsSwitch::new(false);
/// let set = KeyedBreakers::builder().metrics_switch(&switch).build().unwrap();
/// assert!(!switch.is_on());
/// switch.set(true); // every key of `set` reports from now on
/// # let _ = set;
/// ```
#[derive(Clone)]
pub struct MetricsSwitch(Arc<AtomicBool>);

impl MetricsSwitch {
    /// A switch, on or off.
    ///
    /// ```
    /// use tower_circuit_breaker::metrics::MetricsSwitch;
    ///
    /// let switch = MetricsSwitch::new(true);
    /// assert!(switch.is_on());
    /// ```
    #[must_use]
    pub fn new(on: bool) -> Self {
        MetricsSwitch(Arc::new(AtomicBool::new(on)))
    }

    /// Turns reporting on or off.
    ///
    /// ```
    /// use tower_circuit_breaker::metrics::MetricsSwitch;
    ///
    /// let switch = MetricsSwitch::new(true);
    /// let clone = switch.clone();
    /// clone.set(false); // during an incident review, say, to cut the noise
    /// assert!(!switch.is_on(), "clones share the switch");
    /// ```
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    /// Whether reporting is on.
    ///
    /// ```
    /// use tower_circuit_breaker::metrics::MetricsSwitch;
    ///
    /// assert!(!MetricsSwitch::new(false).is_on());
    /// ```
    #[must_use]
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for MetricsSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MetricsSwitch").field(&self.is_on()).finish()
    }
}

impl<T: Build> Builder<T> {
    /// Reports metrics through the [`metrics`](::metrics) facade (see
    /// [`crate::metrics`]); off by default. For a keyed set, every key
    /// reports, labelled by its key.
    ///
    /// ```
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// let layer = CircuitBreakerLayer::builder().name("gpt-4o").metrics(true).build().unwrap();
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn metrics(mut self, on: bool) -> Self {
        self.config.observer = on.then(|| Arc::new(MetricsSwitch::new(true)) as _);
        self
    }

    /// Reports metrics while `switch` is on.
    ///
    /// ```
    /// use tower_circuit_breaker::metrics::MetricsSwitch;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let switch = MetricsSwitch::new(true);
    /// let a = Breaker::builder().name("a").metrics_switch(&switch).build().unwrap();
    /// let b = Breaker::builder().name("b").metrics_switch(&switch).build().unwrap();
    /// switch.set(false); // both stop reporting
    /// # let _ = (a, b);
    /// ```
    #[must_use]
    pub fn metrics_switch(mut self, switch: &MetricsSwitch) -> Self {
        self.config.observer = Some(Arc::new(switch.clone()));
        self
    }
}

impl MakeObserver for MetricsSwitch {
    fn make(
        &self,
        set: Option<&Arc<str>>,
        name: Option<&Arc<str>>,
        keyed: bool,
    ) -> Box<dyn Observe> {
        Box::new(Meter::new(self.clone(), set, name, keyed))
    }
}

// === Meter ===

/// One breaker's reporting: its switch and its series, built when it first
/// reports.
struct Meter {
    switch: MetricsSwitch,
    breaker: SharedString,
    key: SharedString,
    series: OnceLock<Box<Series>>,
    epoch: Instant,
}

/// Reasons whose series are built ahead; any other is built when it comes.
const REASONS: [Rejection; 4] = [
    Rejection::Open,
    Rejection::HalfOpenFull,
    Rejection::ForcedOpen,
    Rejection::VolumeGuard,
];

/// Outcomes in the order of [`Series::calls`].
const OUTCOMES: [&str; 6] = [
    "success",
    "failure",
    "ignored",
    "rate_limited",
    "quota_exhausted",
    "dropped",
];

struct Series {
    calls: [Key; 6],
    rejections: [Key; 4],
    ttfb: Key,
    state: Key,
}

impl Meter {
    /// `keyed`: `name` is a key of a keyed set whose builder was named
    /// `breaker`; else `name` is the breaker's own.
    fn new(
        switch: MetricsSwitch,
        breaker: Option<&Arc<str>>,
        name: Option<&Arc<str>>,
        keyed: bool,
    ) -> Self {
        let label =
            |s: Option<&Arc<str>>| s.map_or(SharedString::const_str(""), |s| s.clone().into());
        Meter {
            switch,
            breaker: label(if keyed { breaker } else { name }),
            key: label(if keyed { name } else { None }),
            series: OnceLock::new(),
            epoch: Instant::now(),
        }
    }

    /// Whether this breaker reports now.
    #[inline]
    fn is_on(&self) -> bool {
        self.switch.is_on()
    }

    fn labels(&self, more: &[(&'static str, &'static str)]) -> Vec<Label> {
        let mut labels = Vec::with_capacity(2 + more.len());
        labels.push(Label::new("breaker", self.breaker.clone()));
        labels.push(Label::new("key", self.key.clone()));
        labels.extend(more.iter().map(|&(k, v)| Label::from_static_parts(k, v)));
        labels
    }

    /// The series, built on first use; the state gauge starts at `state`.
    #[cold]
    fn build(&self, state: State) -> &Series {
        self.series.get_or_init(|| {
            let series = Box::new(Series {
                calls: OUTCOMES.map(|o| Key::from_parts(CALLS, self.labels(&[("outcome", o)]))),
                rejections: REASONS
                    .map(|r| Key::from_parts(REJECTIONS, self.labels(&[("reason", r.as_str())]))),
                ttfb: Key::from_parts(TTFB, self.labels(&[])),
                state: Key::from_parts(STATE, self.labels(&[])),
            });
            set_state(&series.state, state);
            series
        })
    }

    #[inline]
    fn series(&self, state: impl FnOnce() -> State) -> &Series {
        match self.series.get() {
            Some(series) => series,
            None => self.build(state()),
        }
    }

    #[cold]
    /// Microseconds since the meter was made, wrapped to 32 bits.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "wrapping to 32 bits is the point: only differences are read"
    )]
    fn micros(&self) -> u32 {
        Instant::now()
            .saturating_duration_since(self.epoch)
            .as_micros() as u32
    }
}

impl Observe for Meter {
    /// A call finished with `outcome` (or was `dropped` unrecorded).
    fn outcome(&self, outcome: Outcome, dropped: bool, state: State) {
        if !self.is_on() {
            return;
        }
        let i = match outcome {
            _ if dropped => 5,
            Outcome::Success => 0,
            Outcome::Failure => 1,
            Outcome::Ignored => 2,
            Outcome::RateLimited { .. } => 3,
            Outcome::QuotaExhausted => 4,
        };
        increment(&self.series(|| state).calls[i]);
    }

    /// A call was rejected.
    fn rejected(&self, reason: Rejection, state: State) {
        if !self.is_on() {
            return;
        }
        let series = self.series(|| state);
        match REASONS.iter().position(|&r| r == reason) {
            Some(i) => increment(&series.rejections[i]),
            None => increment(&Key::from_parts(
                REJECTIONS,
                self.labels(&[("reason", reason.as_str())]),
            )),
        }
    }

    /// When a call admitted now starts, if it is to be timed: the low 32
    /// bits of the microseconds since the meter was made, the lowest bit
    /// set so that it is never 0; else 0. 32 bits rather than an
    /// `Option<Instant>`, so that it fits in a permit's padding: the
    /// difference of two such tokens is the time between them (to a
    /// microsecond) up to 71 minutes, far beyond any wait for a head.
    fn start(&self) -> u32 {
        if self.is_on() {
            self.micros() | 1
        } else {
            0
        }
    }

    /// The response head of a call that started at `start` (see
    /// [`start`](Self::start)) came; `probe`: the call is a half-open probe.
    #[cold]
    fn spend_warning(&self) {
        if self.is_on() {
            increment(&Key::from_parts(SPEND_WARNINGS, self.labels(&[])));
        }
    }

    fn head(&self, start: u32, probe: bool) {
        let state = if probe {
            State::HalfOpen
        } else {
            State::Closed
        };
        let series = self.series(|| state);
        let elapsed = f64::from((self.micros() | 1).wrapping_sub(start)) / 1e6;
        ::metrics::with_recorder(|r| {
            r.register_histogram(&series.ttfb, &METADATA)
                .record(elapsed)
        });
    }

    /// The circuit changed state.
    fn transition(&self, t: &Transition) {
        if !self.is_on() {
            return;
        }
        let series = self.series(|| t.to);
        increment(&Key::from_parts(
            TRANSITIONS,
            self.labels(&[("from", t.from.as_str()), ("to", t.to.as_str())]),
        ));
        set_state(&series.state, t.to);
    }
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter").field("on", &self.is_on()).finish()
    }
}

/// The current recorder, looked up on every report.
#[inline]
fn increment(key: &Key) {
    ::metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

fn set_state(key: &Key, state: State) {
    let value = match state {
        State::Closed => 0.0,
        State::Open => 1.0,
        State::HalfOpen => 2.0,
        State::ForcedOpen => 3.0,
        State::Disabled => 4.0,
    };
    ::metrics::with_recorder(|r| r.register_gauge(key, &METADATA).set(value));
}
