//! Scenario files: parsing and validation.
//!
//! Every key is required unless noted, unknown keys are errors, and every
//! error names the key and the line it is on. `scenarios/README.md` is the
//! format's reference.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use tower_circuit_breaker::testing::RateLimit;
use tower_circuit_breaker::testing::{self, Script, ScriptError};

/// What an upstream does with one attempt, and how its latency varies: the
/// scripted upstream's own words.
pub use tower_circuit_breaker::testing::{Answer as Kind, Latency};

/// Most requests a scenario may generate (rate × duration).
pub const MAX_REQUESTS: f64 = 2_000_000.0;
/// Most retries per request.
pub const MAX_RETRIES: u32 = 100;
/// The largest count window the breaker accepts.
pub const MAX_WINDOW: u32 = 1 << 20;
/// Most upstreams per scenario.
pub const MAX_UPSTREAMS: usize = 16;

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub seed: u64,
    pub duration: Duration,
    pub rate_per_s: f64,
    pub poisson: bool,
    pub client: Client,
    pub breaker: BreakerConfig,
    pub upstreams: Vec<Upstream>,
    pub billing: Billing,
    pub writeup: Option<Writeup>,
    /// Who sends the requests: empty, everything goes to the primary.
    pub traffic: Vec<Traffic>,
    /// Arrival rates from later times on (`rate_per_s` holds from 0).
    pub rates: Vec<(Duration, f64)>,
    /// Batches of requests on top of the arrivals.
    pub bursts: Vec<Burst>,
    /// Processes serving the traffic, each request by one of them in turn.
    pub replicas: u32,
    /// The `[sweep]` grid: breaker keys and the values to try.
    pub sweep: Vec<(String, Vec<String>)>,
    /// The `[hedge]` section: the `hedged` stack's policy.
    pub hedge: Option<HedgeConfig>,
    /// The `[failover]` table: selection and fallback by error kind.
    pub routing: Routing,
    /// The `[spend]` budget of the breaker stacks' breakers, if any.
    pub spend: Option<SpendConfig>,
}

/// When the `hedged` stack sends a second attempt (`[hedge]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HedgeConfig {
    pub delay: HedgeDelay,
    /// Hedges at most this percentage of first attempts over 10 s (`budget`).
    pub budget_percent: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeDelay {
    /// `delay_ms`.
    Fixed(Duration),
    /// `percentile` of the member's own time to first byte, `initial_ms`
    /// until it has samples.
    Percentile { percentile: f64, initial: Duration },
}

/// How the `failover-select` stack chooses the member it tries first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectPolicy {
    PeakEwma,
    Cheapest,
}

/// The `[failover]` table: with `select`, the `failover-select` and
/// `oracle` stacks; with a rule, the `failover-by-kind` stack.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    pub select: Option<SelectPolicy>,
    /// The peak-EWMA's decay (`decay_s`); `None`: the crate's default.
    pub decay: Option<Duration>,
    /// `on_context_length` and `on_content_policy`: the upstream each kind
    /// is sent on to.
    pub on_context_length: Option<usize>,
    pub on_content_policy: Option<usize>,
    /// `all_open = "last_resort"`: the `failover-last-resort` stack, the
    /// failover stack with `AllOpen::last_resort` over its breakers.
    pub last_resort: bool,
}

impl Routing {
    pub fn has_rules(&self) -> bool {
        self.on_context_length.is_some() || self.on_content_policy.is_some()
    }
}

/// A share of the traffic: which model it asks for, under which API key.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    pub p: f64,
    pub upstream: usize,
    pub api_key: Option<String>,
}

/// `requests` sent evenly over `over` from `at`, by `upstream` and
/// `api_key`, or drawn from the traffic mix when neither is given.
#[derive(Debug, Clone, PartialEq)]
pub struct Burst {
    pub at: Duration,
    pub requests: u32,
    pub over: Duration,
    pub source: Option<(usize, Option<String>)>,
}

/// What an upstream does with the attempts beyond its capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// Attempts served at once.
    pub concurrent: u32,
    /// Attempts that wait for a slot (first come, first served); beyond
    /// them, a 429.
    pub queue: u32,
    /// The 429's `Retry-After`.
    pub retry_after: Option<Duration>,
}

/// What keys the breakers of the `breaker` stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedBy {
    Model,
    ModelAndKey,
}

impl Scenario {
    /// The breaker settings of upstream `i`: its own `[upstream.breaker]`,
    /// or the scenario's.
    pub fn breaker_for(&self, i: usize) -> &BreakerConfig {
        self.upstreams[i].breaker.as_ref().unwrap_or(&self.breaker)
    }

    /// The ground truth of a class of traffic (`model` or `model/api_key`):
    /// its key's own script when it has one, else its upstream's; `None`
    /// when it names no upstream or its script never fails.
    pub fn class_failing_share(&self, class: &str) -> Option<f64> {
        let (model, key) = match class.split_once('/') {
            Some((m, k)) => (m, Some(k)),
            None => (class, None),
        };
        let u = self.upstreams.iter().find(|u| u.name == model)?;
        let phases = match key.and_then(|k| u.key(k)) {
            Some(k) => &u.keys[k].phases,
            None => &u.phases,
        };
        phases_failing_share(phases, self.answer_within(), self.client.attempt_timeout)
    }

    /// Whether requests go to more than the primary.
    pub fn has_mix(&self) -> bool {
        !self.traffic.is_empty() || self.bursts.iter().any(|b| b.source.is_some())
    }

    /// The stacks this scenario replays.
    pub fn stacks(&self) -> Vec<StackKind> {
        let mut kinds = vec![StackKind::NoBreaker, StackKind::Breaker];
        if GRADED_K.get().is_some() {
            kinds.push(StackKind::BreakerOpen);
        }
        if self.breaker.keyed_by.is_some() {
            kinds.push(StackKind::GlobalBreaker);
        }
        if self.replicas > 1 {
            kinds.push(StackKind::BreakerIndependent);
        }
        if self.upstreams.len() > 1 && !self.has_mix() {
            kinds.extend([StackKind::NaiveFailover, StackKind::Failover]);
            if self.replicas > 1 {
                kinds.push(StackKind::FailoverIndependent);
            }
            if self.hedge.is_some() {
                kinds.push(StackKind::Hedged);
            }
            if self.routing.last_resort {
                kinds.push(StackKind::FailoverLastResort);
            }
        }
        kinds.extend(self.routing_stacks());
        kinds
    }

    /// The stacks of the `[failover]` table.
    pub fn routing_stacks(&self) -> Vec<StackKind> {
        let mut kinds = Vec::new();
        if self.routing.select.is_some() {
            kinds.extend([StackKind::FailoverSelect, StackKind::Oracle]);
        }
        if self.routing.has_rules() {
            kinds.push(StackKind::FailoverByKind);
        }
        kinds
    }

    /// How fast a healthy answer comes: the slow threshold, or the attempt
    /// timeout when there is none.
    pub fn answer_within(&self) -> Duration {
        self.breaker
            .slow_call
            .map_or(self.client.attempt_timeout, |(threshold, _)| threshold)
    }

    /// Per upstream, when it healed: the start of the healthy phases that
    /// end the run, for an upstream that failed before them; `None` for one
    /// that never failed or never healed.
    pub fn heals(&self) -> Vec<Option<f64>> {
        let within = self.answer_within();
        self.upstreams
            .iter()
            .map(|u| {
                let from = u.failing_from(within)?;
                let heal = u.healed_at(within)?;
                (heal > from && heal < self.duration).then_some(heal.as_secs_f64())
            })
            .collect()
    }

    /// When the primary upstream is failing, from its first failing phase to
    /// its heal (or the end of the run); `None` when it never fails.
    pub fn outage(&self) -> Option<(Duration, Duration)> {
        let primary = &self.upstreams[0];
        let from = primary.failing_from(self.answer_within())?;
        let to = primary
            .healed_at(self.answer_within())
            .filter(|&heal| heal > from)
            .unwrap_or(self.duration);
        Some((from, to))
    }
}

/// With `--graded-k K`: every breaker but `breaker-open`'s grades with this
/// `K`, and the `breaker-open` stack is replayed beside them; without it,
/// every breaker has the crate's defaults (graded, `K` = 5).
pub static GRADED_K: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// The stacks a replay can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackKind {
    /// total timeout -> retry -> attempt timeout -> primary.
    NoBreaker,
    /// total timeout -> retry -> circuit breaker -> attempt timeout -> primary;
    /// graded admission (the crate's default, `TripMode::Graded`).
    Breaker,
    /// With `--graded-k`: the breaker stack opening all or nothing
    /// (`TripMode::Open`), for the comparison.
    BreakerOpen,
    /// total timeout -> retry -> try each upstream in order (attempt timeout each).
    NaiveFailover,
    /// total timeout -> retry -> failover -> per upstream: breaker -> attempt timeout.
    Failover,
    /// With `keyed_by`: the breaker stack with one breaker for all traffic.
    GlobalBreaker,
    /// With `replicas`: the breaker stack in every replica, each with
    /// breakers of its own (no sharing).
    BreakerIndependent,
    /// With `replicas`: the failover stack in every replica, unshared.
    FailoverIndependent,
    /// With `[hedge]`: the failover stack, hedging slow first attempts.
    Hedged,
    /// With `[failover] select`: the failover stack, its first member chosen
    /// by the selection.
    FailoverSelect,
    /// With `[failover] select`: each request to the upstream whose script
    /// is the faster at that moment, behind its breaker (replay only).
    Oracle,
    /// With a `[failover]` rule: the failover stack with the rule table,
    /// each member reading the kind of its error answers.
    FailoverByKind,
    /// With `[failover] all_open = "last_resort"`: the failover stack that,
    /// when every member rejected a call, lets it through to the upstream
    /// whose circuit opened longest ago, once per open period
    /// (`AllOpen::last_resort`).
    FailoverLastResort,
}

impl StackKind {
    const ALL: [StackKind; 4] = [
        StackKind::NoBreaker,
        StackKind::Breaker,
        StackKind::NaiveFailover,
        StackKind::Failover,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StackKind::NoBreaker => "no-breaker",
            StackKind::Breaker => "breaker",
            StackKind::BreakerOpen => "breaker-open",
            StackKind::NaiveFailover => "naive-failover",
            StackKind::Failover => "failover",
            StackKind::GlobalBreaker => "global-breaker",
            StackKind::BreakerIndependent => "breaker-independent",
            StackKind::FailoverIndependent => "failover-independent",
            StackKind::Hedged => "hedged",
            StackKind::FailoverSelect => "failover-select",
            StackKind::Oracle => "oracle",
            StackKind::FailoverByKind => "failover-by-kind",
            StackKind::FailoverLastResort => "failover-last-resort",
        }
    }

    /// The stacks replayed for a scenario with `upstreams` upstreams: the
    /// failover stacks need more than one.
    pub fn for_upstreams(upstreams: usize) -> &'static [StackKind] {
        &Self::ALL[..if upstreams > 1 { 4 } else { 2 }]
    }

    pub fn uses_fallbacks(self) -> bool {
        matches!(
            self,
            StackKind::NaiveFailover
                | StackKind::Failover
                | StackKind::FailoverIndependent
                | StackKind::Hedged
                | StackKind::FailoverSelect
                | StackKind::Oracle
                | StackKind::FailoverByKind
                | StackKind::FailoverLastResort
        )
    }

    /// Whether each replica has breakers of its own.
    pub fn independent(self) -> bool {
        matches!(
            self,
            StackKind::BreakerIndependent | StackKind::FailoverIndependent
        )
    }
}

/// What an upstream charges for one good answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cost {
    PerRequest {
        usd: f64,
    },
    /// The price of a good answer's input and output tokens.
    PerToken {
        input_usd: f64,
        output_usd: f64,
    },
}

/// Price of a request when a scenario gives none.
pub const DEFAULT_USD_PER_REQUEST: f64 = 0.01;

impl Cost {
    /// What an attempt costs when `generated` (0 to 1) of a good answer was
    /// generated for it: nothing when nothing was, the input in full as soon
    /// as generation started, the output (or the request's price) in
    /// proportion.
    pub fn billed(self, generated: f64) -> f64 {
        if generated <= 0.0 {
            return 0.0;
        }
        match self {
            Cost::PerRequest { usd } => usd * generated,
            Cost::PerToken {
                input_usd,
                output_usd,
            } => input_usd + output_usd * generated,
        }
    }
}

/// How much of a good answer the upstream generated (and bills) for
/// attempts that did not deliver one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Billing {
    /// An attempt that hung until a timeout ended it.
    pub hang: f64,
    /// A stream cut off by an error event after its 200 head.
    pub stream_error: f64,
    /// An error answer (a non-2xx status, a content filter, a reset).
    pub error: f64,
    /// A stream that stalled: what it generated until it went silent.
    pub stall: f64,
}

impl Default for Billing {
    fn default() -> Self {
        Billing {
            hang: 1.0,
            stream_error: 0.5,
            error: 0.0,
            stall: 0.5,
        }
    }
}

impl Billing {
    /// The share of a good answer generated for an attempt of `kind` that
    /// ran for `ran` (to its response head, or until it was given up).
    pub fn generated(&self, kind: Kind, ran: Duration) -> f64 {
        let share = |whole: Duration| (ran.as_secs_f64() / whole.as_secs_f64()).min(1.0);
        match kind {
            Kind::Ok { latency, stream } if ran < latency => share(latency + stream),
            Kind::Ok { .. } => 1.0,
            Kind::Status { code, latency, .. } if (200..300).contains(&code) => share(latency),
            Kind::Hang => self.hang,
            Kind::SseError { latency, .. } if ran >= latency => self.stream_error,
            Kind::SseError { .. } => 0.0,
            // Its tokens were generated whether or not anyone read them.
            Kind::Stall {
                latency,
                stall_after,
            } if ran >= latency && !stall_after.is_zero() => self.stall,
            Kind::Stall { .. } => 0.0,
            Kind::Status { .. } | Kind::Reset { .. } | Kind::ContentFilter { .. } => self.error,
            // Answers the format cannot write.
            _ => self.error,
        }
    }
}

/// A write-up's own table, printed beside the replay's figures for the
/// outage.
#[derive(Debug, Clone)]
pub struct Writeup {
    pub title: String,
    pub stacks: Vec<StackKind>,
    pub rows: Vec<WriteupRow>,
}

#[derive(Debug, Clone)]
pub struct WriteupRow {
    pub label: String,
    pub figure: Figure,
    /// What the write-up reports, one per stack.
    pub reported: Vec<String>,
}

/// A figure of the outage a write-up row can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    Requests,
    /// Requests that failed or were rejected.
    Errors,
    /// Attempts that reached the primary upstream.
    PrimaryAttempts,
    UserErrorRate,
    WaitMean,
    WaitP99,
    /// Arrival to the error, requests that got one.
    ErrorWaitMean,
    AnsweredWaitMean,
    AnsweredWaitP99,
    CostUsd,
    WastedCostUsd,
    /// Cost over what answering every request once at the primary's price
    /// would have cost.
    CostMultiple,
}

impl Figure {
    pub const NAMES: [(&'static str, Figure); 12] = [
        ("requests", Figure::Requests),
        ("errors", Figure::Errors),
        ("primary_attempts", Figure::PrimaryAttempts),
        ("user_error_rate", Figure::UserErrorRate),
        ("wait_mean_s", Figure::WaitMean),
        ("wait_p99_s", Figure::WaitP99),
        ("error_wait_mean_s", Figure::ErrorWaitMean),
        ("answered_wait_mean_s", Figure::AnsweredWaitMean),
        ("answered_wait_p99_s", Figure::AnsweredWaitP99),
        ("cost_usd", Figure::CostUsd),
        ("wasted_cost_usd", Figure::WastedCostUsd),
        ("cost_multiple", Figure::CostMultiple),
    ];
}

#[derive(Debug, Clone)]
pub struct Client {
    pub attempt_timeout: Duration,
    /// The first token's deadline, from the call (`ttft_timeout_s`).
    pub ttft_timeout: Option<Duration>,
    /// The longest gap between two body frames (`stall_timeout_s`).
    pub stall_timeout: Option<Duration>,
    /// Retries at most this percentage of first attempts over 10 s
    /// (`retry_budget_percent`).
    pub retry_budget_percent: Option<f64>,
    /// Whether the retry retries a graded admission's refusal
    /// (`retry_graded`, `RetryPolicy::retry_graded`).
    pub retry_graded: bool,
    pub total_timeout: Option<Duration>,
    pub max_retries: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// The share of users who give up, and after how long.
    pub cancel: Option<(f64, Duration)>,
    /// How long a user waits for an answer (`deadline_s`; by default the
    /// total timeout): an answer counts only when it came within it. `None`:
    /// every answer counts.
    pub deadline: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WindowConfig {
    Off,
    Count(u32),
    Time(Duration),
}

#[derive(Debug, Clone)]
pub struct BreakerConfig {
    pub window: WindowConfig,
    pub min_calls: u32,
    pub failure_rate: f64,
    pub consecutive_failures: Option<u32>,
    pub slow_call: Option<(Duration, f64)>,
    pub open: Duration,
    pub open_max: Duration,
    pub probes: u32,
    pub close_after: u32,
    /// A half-open probe's deadline; `None`: the core's default.
    pub probe_timeout: Option<Duration>,
    /// How often a health probe asks a circuit that is not closed; `None`:
    /// no health probes.
    pub health_probe_interval: Option<Duration>,
    /// A health probe's deadline (`health_probe_timeout_s`); `None`: the
    /// crate's prober default, one interval.
    pub health_probe_timeout: Option<Duration>,
    /// The volume guard: calls and period.
    pub volume_guard: Option<(u32, Duration)>,
    /// Quota gating (`quota_gate_s`): how long an `insufficient_quota`
    /// answer opens the circuit; `None`: off, the answer is neutral.
    pub quota_gate: Option<Duration>,
    /// Pacing on known rate limits (`pace_rate_limits`,
    /// `Builder::pace_rate_limits`).
    pub pace_rate_limits: bool,
    /// `trip_mode = "open"`: the breakers open all or nothing
    /// (`TripMode::Open`); `None` (or `"graded"`): the crate's default,
    /// graded admission.
    pub open_all_or_nothing: bool,
    /// Keyed breakers in the `breaker` stack.
    pub keyed_by: Option<KeyedBy>,
    /// The in-flight limit off (`no_in_flight_limit()`): the slow-call
    /// rule then looks at every call, with a fallback or not, as it did
    /// before the limit. Not read from the file; false unless a caller sets
    /// it.
    pub no_in_flight_limit: bool,
}

#[derive(Debug, Clone)]
pub struct Upstream {
    pub name: String,
    pub phases: Vec<Phase>,
    pub cost: Cost,
    /// What a health probe is billed: as the crate's ready-made probe asks
    /// (`max_tokens: 1`), the input and one output token, or one request's
    /// price under per-request pricing.
    pub probe_cost: Cost,
    /// Its own breaker settings (`[upstream.breaker]` over `[breaker]`).
    pub breaker: Option<BreakerConfig>,
    pub capacity: Option<Capacity>,
    /// Under per-token pricing: a good answer's input and output tokens,
    /// which its `usage` reports in a scenario with `[spend]`.
    pub tokens: Option<(u64, u64)>,
    /// Its request rate limit (`rate_limit`), announced in `x-ratelimit-*`
    /// headers.
    pub rate_limit: Option<RateLimit>,
    /// API keys with behaviour of their own (`[[upstream.key]]`): a request
    /// under one of them is answered by its phases, every other request by
    /// the upstream's.
    pub keys: Vec<KeyScript>,
}

/// One API key's own behaviour on an upstream (`[[upstream.key]]`).
#[derive(Debug, Clone)]
pub struct KeyScript {
    /// The API key, as the traffic's `api_key` names it.
    pub name: String,
    pub phases: Vec<Phase>,
    /// The key's own rate limit; absent: the upstream's (a window of its
    /// own).
    pub rate_limit: Option<RateLimit>,
}

impl KeyScript {
    /// The start of the key's first phase that is not healthy.
    pub fn failing_from(&self, within: Duration) -> Option<Duration> {
        phases_failing_from(&self.phases, within)
    }

    /// The start of the healthy phases that end the key's script.
    pub fn healed_at(&self, within: Duration) -> Option<Duration> {
        phases_healed_at(&self.phases, within)
    }
}

/// [`Upstream::failing_share`] of a list of phases (an upstream's own, or a
/// key's).
fn phases_failing_share(
    phases: &[Phase],
    within: Duration,
    attempt_timeout: Duration,
) -> Option<f64> {
    let from = phases_failing_from(phases, within)?;
    let to = phases_healed_at(phases, within)
        .filter(|&heal| heal > from)
        .or_else(|| phases.last().map(|p| p.until))?;
    let (mut failing, mut total) = (0.0, 0.0);
    for p in phases {
        let span = (p.until.min(to).saturating_sub(p.from.max(from))).as_secs_f64();
        if span > 0.0 {
            failing += span * p.failing_share(attempt_timeout);
            total += span;
        }
    }
    (total > 0.0).then(|| failing / total)
}

fn phases_failing_from(phases: &[Phase], within: Duration) -> Option<Duration> {
    phases
        .iter()
        .find(|p| !p.is_healthy(within))
        .map(|p| p.from)
}

fn phases_healed_at(phases: &[Phase], within: Duration) -> Option<Duration> {
    let sick = phases.iter().rposition(|p| !p.is_healthy(within));
    match sick {
        None => Some(Duration::ZERO),
        Some(i) => phases.get(i + 1).map(|p| p.from),
    }
}

#[derive(Debug, Clone)]
pub struct Phase {
    pub from: Duration,
    /// The start of the next phase, or the end of the run.
    pub until: Duration,
    pub responses: Vec<Response>,
}

#[derive(Debug, Clone)]
pub struct Response {
    pub p: f64,
    /// With the latency of a fixed answer; see `latency`.
    pub kind: Kind,
    pub latency: Latency,
}

impl Response {
    /// The share of its attempts that fail: all of a failure, else those
    /// whose head comes after `timeout`.
    pub fn failing_share(&self, timeout: Duration) -> f64 {
        if self.kind.is_failure() {
            return 1.0;
        }
        let Some(base) = self.kind.latency() else {
            return 1.0;
        };
        let (base, t) = (base.as_secs_f64(), timeout.as_secs_f64());
        match self.latency {
            Latency::Lognormal { sigma } if sigma > 0.0 => {
                // P(base · e^(σZ) > t) for a standard normal Z.
                0.5 * erfc((t / base).ln() / (sigma * std::f64::consts::SQRT_2))
            }
            Latency::Ramp { to } => {
                // Linear from `base` to `to` over the phase: the share of it
                // spent above `t`.
                let to = to.as_secs_f64();
                if (to - base).abs() < 1e-12 {
                    f64::from(u8::from(base > t))
                } else {
                    let crossing = ((t - base) / (to - base)).clamp(0.0, 1.0);
                    if to > base {
                        1.0 - crossing
                    } else {
                        crossing
                    }
                }
            }
            _ => f64::from(u8::from(base > t)),
        }
    }

    /// The slowest head it gives (the 99th percentile of a lognormal).
    pub fn slowest(&self) -> Option<Duration> {
        let base = self.kind.latency()?;
        Some(match self.latency {
            Latency::Fixed => base,
            Latency::Lognormal { sigma } => base.mul_f64((2.326 * sigma).exp()),
            Latency::Ramp { to } => base.max(to),
            _ => base,
        })
    }
}

/// The header that numbers a request, so that a retry is its next attempt.
pub const REQUEST_ID: &str = "x-request-id";

impl Upstream {
    /// The scripted upstream's script for upstream `index` of a scenario
    /// with `seed` that ends at `end`; with `tokens`, streams send their
    /// tokens.
    pub fn script(
        &self,
        seed: u64,
        index: usize,
        end: Duration,
        tokens: bool,
        usage: bool,
    ) -> Result<Script, ScriptError> {
        self.script_of(None, seed, index as u64, end, tokens, usage)
    }

    /// The script of its key `k` (`None`: the upstream's own phases), on
    /// draw stream `stream`.
    pub fn script_of(
        &self,
        k: Option<usize>,
        seed: u64,
        stream: u64,
        end: Duration,
        tokens: bool,
        usage: bool,
    ) -> Result<Script, ScriptError> {
        let (phases, rate_limit) = match k {
            None => (&self.phases, self.rate_limit),
            Some(k) => (
                &self.keys[k].phases,
                self.keys[k].rate_limit.or(self.rate_limit),
            ),
        };
        let mut script = Script::builder()
            .name(self.name.as_str())
            .seed(seed)
            .stream(stream)
            .ends_at(end)
            .stream_tokens(tokens)
            .request_id_header(http::HeaderName::from_static(REQUEST_ID));
        if let Some(limit) = rate_limit {
            script = script.rate_limit(limit);
        }
        for phase in phases {
            let mut p = testing::Phase::new(phase.from);
            for r in &phase.responses {
                p = p.answer_with(r.p, r.kind, r.latency);
            }
            script = script.phase(p);
        }
        if let Some(c) = self.capacity {
            let mut capacity = testing::Capacity::new(c.concurrent, c.queue);
            if let Some(wait) = c.retry_after {
                capacity = capacity.retry_after(wait);
            }
            script = script.capacity(capacity);
        }
        if usage && let Some((input, output)) = self.tokens {
            script = script.usage(input, output);
        }
        script.build()
    }

    /// The start of the first phase that is not healthy (its own, or any
    /// of its keys').
    pub fn failing_from(&self, within: Duration) -> Option<Duration> {
        std::iter::once(phases_failing_from(&self.phases, within))
            .chain(self.keys.iter().map(|k| k.failing_from(within)))
            .flatten()
            .min()
    }

    /// The start of the healthy phases that end the scenario (0 for an
    /// upstream that never fails); `None` when the last phase is not
    /// healthy. With keys, the latest of its own and its keys' heals
    /// (`None` when one of them never heals).
    pub fn healed_at(&self, within: Duration) -> Option<Duration> {
        std::iter::once(phases_healed_at(&self.phases, within))
            .chain(self.keys.iter().map(|k| k.healed_at(within)))
            .try_fold(Duration::ZERO, |acc, h| Some(acc.max(h?)))
    }

    /// The ground truth of its outage: the share of attempts its own phases
    /// fail by construction from the first unhealthy one to the heal (or the
    /// end of the run), weighted by each phase's duration; `None` when its
    /// own phases never fail. See [`Phase::failing_share`].
    pub fn failing_share(&self, within: Duration, attempt_timeout: Duration) -> Option<f64> {
        phases_failing_share(&self.phases, within, attempt_timeout)
    }

    /// Its key named `api_key`, when it has one.
    pub fn key(&self, api_key: &str) -> Option<usize> {
        self.keys.iter().position(|k| k.name == api_key)
    }
}

/// How an outage is classed by its ground truth ([`Upstream::failing_share`]):
/// partial at most half its attempts failing, dead at least nine in ten.
pub fn outage_class(failing_share: f64) -> &'static str {
    if failing_share <= 0.5 {
        "partial"
    } else if failing_share >= 0.9 {
        "dead"
    } else {
        "between"
    }
}

impl Phase {
    /// The share of its attempts that fail by construction: 5xx answers,
    /// hangs, resets, stalls and stream errors, and answers whose head comes
    /// after the attempt timeout. A 429 (an exhausted quota included) and
    /// any other 4xx do not fail.
    pub fn failing_share(&self, attempt_timeout: Duration) -> f64 {
        let total: f64 = self.responses.iter().map(|r| r.p).sum();
        if total <= 0.0 {
            return 0.0;
        }
        let failing: f64 = self
            .responses
            .iter()
            .map(|r| r.p * r.failing_share(attempt_timeout))
            .sum();
        failing / total
    }

    /// At most 1 % failures (an exhausted quota counts as one), and every
    /// answer's head within `within`.
    pub fn is_healthy(&self, within: Duration) -> bool {
        let mut failing = 0.0;
        for r in self.responses.iter().filter(|r| r.p > 0.0) {
            match r.kind {
                kind if kind.is_failure() => failing += r.p,
                // No failure of the upstream, but it serves nobody.
                Kind::QuotaExhausted { .. } => failing += r.p,
                Kind::Ok { .. } | Kind::Status { .. } | Kind::ContentFilter { .. }
                    if r.slowest().is_some_and(|l| l > within) =>
                {
                    return false
                }
                _ => {}
            }
        }
        failing <= 0.01 + 1e-12
    }
}

/// The complementary error function, to within 1.2e-7 (Numerical
/// Recipes' Chebyshev fit).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

// === errors ===

/// What is wrong with a scenario file, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ScenarioError {}

/// Turns byte spans into line numbers and messages into errors.
struct Source<'a> {
    text: &'a str,
    file: &'a str,
}

impl Source<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn at<T>(&self, spanned: &Spanned<T>, message: impl Into<String>) -> ScenarioError {
        ScenarioError {
            file: self.file.to_owned(),
            line: Some(self.line(spanned.span().start)),
            message: message.into(),
        }
    }
}

// === raw form ===

type S<T> = Spanned<T>;

/// A `[sweep]` table: breaker keys and their values.
type RawGrid = BTreeMap<S<String>, S<Vec<toml::Value>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: S<String>,
    seed: S<u64>,
    duration_s: S<f64>,
    rate_per_s: S<f64>,
    poisson: S<bool>,
    client: S<RawClient>,
    breaker: S<RawBreaker>,
    upstream: S<Vec<S<RawUpstream>>>,
    billing: Option<S<RawBilling>>,
    writeup: Option<S<RawWriteup>>,
    traffic: Option<S<Vec<S<RawTraffic>>>>,
    rate: Option<S<Vec<S<RawRate>>>>,
    burst: Option<S<Vec<S<RawBurst>>>>,
    replicas: Option<S<u32>>,
    sweep: Option<S<RawGrid>>,
    hedge: Option<S<RawHedge>>,
    failover: Option<S<RawFailover>>,
    spend: Option<S<RawSpend>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHedge {
    delay_ms: Option<S<u64>>,
    percentile: Option<S<f64>>,
    initial_ms: Option<S<u64>>,
    budget: S<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFailover {
    select: Option<S<String>>,
    decay_s: Option<S<f64>>,
    on_context_length: Option<S<String>>,
    on_content_policy: Option<S<String>>,
    all_open: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTraffic {
    p: S<f64>,
    model: Option<S<String>>,
    api_key: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    from_s: S<f64>,
    per_s: S<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBurst {
    at_s: S<f64>,
    requests: S<u32>,
    over_s: S<f64>,
    model: Option<S<String>>,
    api_key: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapacity {
    concurrent: S<u32>,
    queue: Option<S<u32>>,
    retry_after_s: Option<S<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    attempt_timeout_s: S<f64>,
    total_timeout_s: S<f64>,
    max_retries: S<u32>,
    backoff_base_ms: S<u64>,
    backoff_max_ms: S<u64>,
    cancel_p: Option<S<f64>>,
    cancel_after_s: Option<S<f64>>,
    ttft_timeout_s: Option<S<f64>>,
    stall_timeout_s: Option<S<f64>>,
    retry_budget_percent: Option<S<f64>>,
    retry_graded: Option<S<bool>>,
    deadline_s: Option<S<f64>>,
}

/// `[breaker]`, or an upstream's `breaker` over it (every key optional
/// there).
#[derive(Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    window: Option<S<u32>>,
    window_s: Option<S<f64>>,
    min_calls: Option<S<u32>>,
    failure_rate: Option<S<f64>>,
    consecutive_failures: Option<S<u32>>,
    slow_call_ms: Option<S<u64>>,
    slow_call_rate: Option<S<f64>>,
    open_s: Option<S<f64>>,
    open_max_s: Option<S<f64>>,
    probes: Option<S<u32>>,
    close_after: Option<S<u32>>,
    probe_timeout_s: Option<S<f64>>,
    health_probe_interval_s: Option<S<f64>>,
    health_probe_timeout_s: Option<S<f64>>,
    volume_limit: Option<S<u32>>,
    volume_period_s: Option<S<f64>>,
    quota_gate_s: Option<S<f64>>,
    pace_rate_limits: Option<S<bool>>,
    trip_mode: Option<S<String>>,
    keyed_by: Option<S<String>>,
}

impl RawBreaker {
    /// These settings with `over`'s keys in their place (a window given
    /// there replaces both window keys).
    fn with(&self, over: &RawBreaker) -> RawBreaker {
        fn pick<T: Clone>(base: &Option<S<T>>, over: &Option<S<T>>) -> Option<S<T>> {
            over.clone().or_else(|| base.clone())
        }
        let window_over = over.window.is_some() || over.window_s.is_some();
        let (window, window_s) = if window_over {
            (over.window.clone(), over.window_s.clone())
        } else {
            (self.window.clone(), self.window_s.clone())
        };
        RawBreaker {
            window,
            window_s,
            min_calls: pick(&self.min_calls, &over.min_calls),
            failure_rate: pick(&self.failure_rate, &over.failure_rate),
            consecutive_failures: pick(&self.consecutive_failures, &over.consecutive_failures),
            slow_call_ms: pick(&self.slow_call_ms, &over.slow_call_ms),
            slow_call_rate: pick(&self.slow_call_rate, &over.slow_call_rate),
            open_s: pick(&self.open_s, &over.open_s),
            open_max_s: pick(&self.open_max_s, &over.open_max_s),
            probes: pick(&self.probes, &over.probes),
            close_after: pick(&self.close_after, &over.close_after),
            probe_timeout_s: pick(&self.probe_timeout_s, &over.probe_timeout_s),
            health_probe_interval_s: pick(
                &self.health_probe_interval_s,
                &over.health_probe_interval_s,
            ),
            health_probe_timeout_s: pick(
                &self.health_probe_timeout_s,
                &over.health_probe_timeout_s,
            ),
            volume_limit: pick(&self.volume_limit, &over.volume_limit),
            volume_period_s: pick(&self.volume_period_s, &over.volume_period_s),
            quota_gate_s: pick(&self.quota_gate_s, &over.quota_gate_s),
            pace_rate_limits: pick(&self.pace_rate_limits, &over.pace_rate_limits),
            trip_mode: pick(&self.trip_mode, &over.trip_mode),
            keyed_by: self.keyed_by.clone(),
        }
    }
}

/// The breaker keys a `[sweep]` may vary.
pub const SWEEP_KEYS: [&str; 16] = [
    "window",
    "window_s",
    "min_calls",
    "failure_rate",
    "consecutive_failures",
    "slow_call_ms",
    "slow_call_rate",
    "open_s",
    "open_max_s",
    "probes",
    "close_after",
    "probe_timeout_s",
    "health_probe_interval_s",
    "health_probe_timeout_s",
    "volume_limit",
    "volume_period_s",
];

/// Most combinations a sweep replays.
pub const MAX_SWEEP: usize = 256;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    name: S<String>,
    phase: S<Vec<S<RawPhase>>>,
    cost: Option<S<RawCost>>,
    breaker: Option<S<RawBreaker>>,
    capacity: Option<S<RawCapacity>>,
    rate_limit: Option<S<RawRateLimit>>,
    key: Option<S<Vec<S<RawKey>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    name: S<String>,
    phase: S<Vec<S<RawPhase>>>,
    rate_limit: Option<S<RawRateLimit>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    requests: S<u32>,
    period_s: S<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCost {
    usd_per_request: Option<S<f64>>,
    usd_per_mtok_in: Option<S<f64>>,
    usd_per_mtok_out: Option<S<f64>>,
    tokens_in: Option<S<u64>>,
    tokens_out: Option<S<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBilling {
    hang: Option<S<f64>>,
    stream_error: Option<S<f64>>,
    error: Option<S<f64>>,
    stall: Option<S<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWriteup {
    title: S<String>,
    stacks: S<Vec<S<String>>>,
    row: S<Vec<S<RawRow>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRow {
    label: S<String>,
    figure: S<String>,
    reported: S<Vec<S<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    from_s: S<f64>,
    responses: S<Vec<S<RawResponse>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResponse {
    p: S<f64>,
    kind: S<String>,
    latency_ms: Option<S<u64>>,
    code: Option<S<u16>>,
    retry_after_s: Option<S<f64>>,
    stream_ms: Option<S<u64>>,
    latency_sigma: Option<S<f64>>,
    latency_to_ms: Option<S<u64>>,
    stall_after_ms: Option<S<u64>>,
    error: Option<S<String>>,
}

// === parsing ===

/// Reads and validates a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
        file: file.clone(),
        line: None,
        message: format!("cannot read the file: {e}"),
    })?;
    parse(&text, &file)
}

/// Parses and validates a scenario; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
    let src = Source { text, file };
    let raw: RawScenario = toml::from_str(text).map_err(|e| ScenarioError {
        file: file.to_owned(),
        line: e.span().map(|s| src.line(s.start)),
        message: e.message().trim().to_owned(),
    })?;

    let name = raw.name.get_ref().trim().to_owned();
    if name.is_empty() {
        return Err(src.at(&raw.name, "`name` is empty"));
    }
    let duration = seconds(&src, &raw.duration_s, "duration_s")?;
    let duration_s = positive(&src, &raw.duration_s, "duration_s")?;
    if duration.is_zero() {
        return Err(src.at(
            &raw.duration_s,
            format!("`duration_s` must be at least a nanosecond, got {duration_s}"),
        ));
    }
    let rate_per_s = positive(&src, &raw.rate_per_s, "rate_per_s")?;
    if duration_s * rate_per_s > MAX_REQUESTS {
        return Err(src.at(
            &raw.rate_per_s,
            format!(
                "`rate_per_s` × `duration_s` = {:.0} requests; at most {MAX_REQUESTS:.0}",
                duration_s * rate_per_s
            ),
        ));
    }
    let client = client(&src, raw.client.get_ref())?;
    let breaker = breaker(&src, &raw.breaker, raw.breaker.get_ref(), &client)?;

    let raw_upstreams = raw.upstream.get_ref();
    if raw_upstreams.is_empty() {
        return Err(src.at(&raw.upstream, "`upstream` needs at least one [[upstream]]"));
    }
    if raw_upstreams.len() > MAX_UPSTREAMS {
        return Err(src.at(
            &raw.upstream,
            format!(
                "at most {MAX_UPSTREAMS} upstreams, got {}",
                raw_upstreams.len()
            ),
        ));
    }
    let mut upstreams: Vec<Upstream> = Vec::with_capacity(raw_upstreams.len());
    for raw_upstream in raw_upstreams {
        let u = upstream(
            &src,
            raw_upstream.get_ref(),
            &raw.breaker,
            &client,
            duration,
        )?;
        if upstreams.iter().any(|o| o.name == u.name) {
            return Err(src.at(
                &raw_upstream.get_ref().name,
                format!("`name`: upstream {:?} is listed twice", u.name),
            ));
        }
        upstreams.push(u);
    }
    let billing = match &raw.billing {
        Some(b) => billing(&src, b.get_ref())?,
        None => Billing::default(),
    };
    let writeup = match &raw.writeup {
        Some(w) => Some(writeup(&src, w.get_ref(), upstreams.len())?),
        None => None,
    };

    let model = |v: &S<String>| {
        upstreams
            .iter()
            .position(|u| &u.name == v.get_ref())
            .ok_or_else(|| {
                src.at(
                    v,
                    format!(
                        "`model` {:?} is not an upstream of this scenario",
                        v.get_ref()
                    ),
                )
            })
    };
    let api_key = |v: &Option<S<String>>| match v {
        None => Ok(None),
        Some(k) => {
            let key = k.get_ref();
            if key.is_empty()
                || key.contains(['/', '#', '"', '\\'])
                || key.chars().any(char::is_control)
            {
                Err(src.at(
                    k,
                    "`api_key` must be non-empty, without `/`, `#`, quotes, backslashes or control characters",
                ))
            } else {
                Ok(Some(key.clone()))
            }
        }
    };
    let mut traffic = Vec::new();
    if let Some(t) = &raw.traffic {
        let mut sum = 0.0;
        for entry in t.get_ref() {
            let e = entry.get_ref();
            let p = *e.p.get_ref();
            if !(0.0..=1.0).contains(&p) {
                return Err(src.at(&e.p, format!("`p` must be between 0 and 1, got {p}")));
            }
            sum += p;
            let upstream = match &e.model {
                Some(m) => model(m)?,
                None => 0,
            };
            traffic.push(Traffic {
                p,
                upstream,
                api_key: api_key(&e.api_key)?,
            });
        }
        if traffic.is_empty() {
            return Err(src.at(t, "`traffic` is empty"));
        }
        if (sum - 1.0).abs() > 1e-9 {
            return Err(src.at(
                t,
                format!("`traffic`: the shares `p` add up to {sum}, not 1"),
            ));
        }
    }
    let mut rates: Vec<(Duration, f64)> = Vec::new();
    let mut total = duration_s * rate_per_s;
    if let Some(r) = &raw.rate {
        for entry in r.get_ref() {
            let e = entry.get_ref();
            let from = seconds(&src, &e.from_s, "from_s")?;
            let per_s = if *e.per_s.get_ref() == 0.0 {
                0.0
            } else {
                positive(&src, &e.per_s, "per_s")?
            };
            if from.is_zero() || from >= duration {
                return Err(src.at(
                    &e.from_s,
                    "`from_s`: a [[rate]] starts after 0 (`rate_per_s` holds from 0) and before `duration_s`",
                ));
            }
            if rates.last().is_some_and(|&(prev, _)| from <= prev) {
                return Err(src.at(
                    &e.from_s,
                    "`from_s`: [[rate]] tables must be listed in increasing order of `from_s`",
                ));
            }
            total += per_s * duration_s;
            if total > MAX_REQUESTS {
                return Err(src.at(
                    &e.per_s,
                    format!("`per_s`: more than {MAX_REQUESTS:.0} requests"),
                ));
            }
            rates.push((from, per_s));
        }
    }
    let mut bursts = Vec::new();
    if let Some(b) = &raw.burst {
        for entry in b.get_ref() {
            let e = entry.get_ref();
            let at = seconds(&src, &e.at_s, "at_s")?;
            let over = seconds(&src, &e.over_s, "over_s")?;
            if at + over > duration {
                return Err(src.at(&e.over_s, "`over_s`: the burst ends after `duration_s`"));
            }
            let requests = *e.requests.get_ref();
            total += f64::from(requests);
            if requests == 0 || total > MAX_REQUESTS {
                return Err(src.at(
                    &e.requests,
                    format!(
                        "`requests` must be 1 or more, and all requests at most {MAX_REQUESTS:.0}"
                    ),
                ));
            }
            let source = match (&e.model, &e.api_key) {
                (None, None) => None,
                (m, _) => Some((
                    match m {
                        Some(m) => model(m)?,
                        None => 0,
                    },
                    api_key(&e.api_key)?,
                )),
            };
            bursts.push(Burst {
                at,
                requests,
                over,
                source,
            });
        }
    }
    // A key with behaviour of its own must be sent some traffic.
    for (i, raw_upstream) in raw_upstreams.iter().enumerate() {
        let keys = raw_upstream.get_ref().key.as_ref();
        for k in keys.map_or(&[][..], |k| k.get_ref()) {
            let name = k.get_ref().name.get_ref();
            let sent = traffic
                .iter()
                .any(|t| t.upstream == i && t.api_key.as_deref() == Some(name))
                || bursts.iter().any(|b| {
                    b.source
                        .as_ref()
                        .is_some_and(|(u, key)| *u == i && key.as_deref() == Some(name))
                });
            if !sent {
                return Err(src.at(
                    &k.get_ref().name,
                    format!(
                        "`name`: no traffic is sent with key {name:?} to upstream {:?} \
                         (add `{{ p = …, model = {:?}, api_key = {name:?} }}` to `traffic`)",
                        upstreams[i].name, upstreams[i].name
                    ),
                ));
            }
        }
    }
    let replicas = match &raw.replicas {
        None => 1,
        Some(v) => match *v.get_ref() {
            n @ 1..=64 => n,
            n => return Err(src.at(v, format!("`replicas` must be 1 to 64, got {n}"))),
        },
    };
    let sweep = match &raw.sweep {
        None => Vec::new(),
        Some(t) => sweep_grid(&src, t)?,
    };
    let hedge = match &raw.hedge {
        None => None,
        Some(h) => Some(hedge(&src, h)?),
    };
    let routing = match &raw.failover {
        None => Routing::default(),
        Some(f) => routing(&src, f, &upstreams)?,
    };
    let spend = match &raw.spend {
        None => None,
        Some(t) => {
            if let Some(u) = upstreams.iter().find(|u| u.tokens.is_none()) {
                return Err(src.at(
                    t,
                    format!(
                        "`[spend]` prices each answer's usage by its upstream's per-token `cost`; \
                         upstream {:?} has none",
                        u.name
                    ),
                ));
            }
            Some(spend(&src, t)?)
        }
    };
    Ok(Scenario {
        hedge,
        spend,
        traffic,
        rates,
        bursts,
        replicas,
        sweep,
        routing,
        name,
        seed: *raw.seed.get_ref(),
        duration,
        rate_per_s,
        poisson: *raw.poisson.get_ref(),
        client,
        breaker,
        upstreams,
        billing,
        writeup,
    })
}

/// `[hedge]`: `delay_ms`, or `percentile` (with `initial_ms`, default
/// 1000), and `budget` (a percentage of first attempts).
fn hedge(src: &Source<'_>, raw: &Spanned<RawHedge>) -> Result<HedgeConfig, ScenarioError> {
    let h = raw.get_ref();
    let delay = match (&h.delay_ms, &h.percentile) {
        (Some(ms), None) => {
            if h.initial_ms.is_some() {
                return Err(src.at(raw, "`initial_ms` goes with `percentile`, not `delay_ms`"));
            }
            HedgeDelay::Fixed(Duration::from_millis(*ms.get_ref()))
        }
        (None, Some(p)) => {
            let percentile = *p.get_ref();
            if !(percentile > 0.0 && percentile <= 100.0) {
                return Err(src.at(
                    p,
                    format!("`percentile` must be in (0, 100], got {percentile}"),
                ));
            }
            let initial = h.initial_ms.as_ref().map_or(1000, |ms| *ms.get_ref());
            HedgeDelay::Percentile {
                percentile,
                initial: Duration::from_millis(initial),
            }
        }
        _ => return Err(src.at(raw, "`[hedge]` takes one of `delay_ms` and `percentile`")),
    };
    let budget_percent = *h.budget.get_ref();
    if !(0.0..=1000.0).contains(&budget_percent) {
        return Err(src.at(
            &h.budget,
            format!("`budget` is a percentage of first attempts, 0 to 1000, got {budget_percent}"),
        ));
    }
    Ok(HedgeConfig {
        delay,
        budget_percent,
    })
}

fn routing(
    src: &Source<'_>,
    spanned: &S<RawFailover>,
    upstreams: &[Upstream],
) -> Result<Routing, ScenarioError> {
    let raw = spanned.get_ref();
    if upstreams.len() < 2 {
        return Err(src.at(spanned, "`[failover]` needs more than one upstream"));
    }
    let select = match &raw.select {
        None => None,
        Some(v) => Some(match v.get_ref().as_str() {
            "peak_ewma" => SelectPolicy::PeakEwma,
            "cheapest" => SelectPolicy::Cheapest,
            other => {
                return Err(src.at(
                    v,
                    format!("`select` {other:?} is not one of \"peak_ewma\", \"cheapest\""),
                ))
            }
        }),
    };
    let decay = match &raw.decay_s {
        None => None,
        Some(v) => {
            if select != Some(SelectPolicy::PeakEwma) {
                return Err(src.at(v, "`decay_s` is a key of `select = \"peak_ewma\"`"));
            }
            positive(src, v, "decay_s")?;
            Some(seconds(src, v, "decay_s")?)
        }
    };
    let member = |v: &Option<S<String>>, key: &str| match v {
        None => Ok(None),
        Some(name) => match upstreams.iter().position(|u| &u.name == name.get_ref()) {
            Some(0) => Err(src.at(
                name,
                format!("`{key}`: the primary cannot be its own fallback"),
            )),
            Some(i) => Ok(Some(i)),
            None => Err(src.at(
                name,
                format!(
                    "`{key}`: {:?} is not an upstream of this scenario",
                    name.get_ref()
                ),
            )),
        },
    };
    let last_resort = match &raw.all_open {
        None => false,
        Some(v) => match v.get_ref().as_str() {
            "fail_fast" => false,
            "last_resort" => true,
            other => {
                return Err(src.at(
                    v,
                    format!("`all_open` {other:?} is not one of \"fail_fast\", \"last_resort\""),
                ))
            }
        },
    };
    Ok(Routing {
        last_resort,
        select,
        decay,
        on_context_length: member(&raw.on_context_length, "on_context_length")?,
        on_content_policy: member(&raw.on_content_policy, "on_content_policy")?,
    })
}

fn client(src: &Source<'_>, raw: &RawClient) -> Result<Client, ScenarioError> {
    let attempt = seconds(src, &raw.attempt_timeout_s, "attempt_timeout_s")?;
    if attempt.is_zero() {
        return Err(src.at(
            &raw.attempt_timeout_s,
            "`attempt_timeout_s` must be greater than 0",
        ));
    }
    let total = seconds(src, &raw.total_timeout_s, "total_timeout_s")?;
    if !total.is_zero() && total < attempt {
        return Err(src.at(
            &raw.total_timeout_s,
            "`total_timeout_s` is shorter than `attempt_timeout_s` (0 means no total timeout)",
        ));
    }
    let max_retries = *raw.max_retries.get_ref();
    if max_retries > MAX_RETRIES {
        return Err(src.at(
            &raw.max_retries,
            format!("`max_retries` is at most {MAX_RETRIES}, got {max_retries}"),
        ));
    }
    let base = Duration::from_millis(*raw.backoff_base_ms.get_ref());
    let max = Duration::from_millis(*raw.backoff_max_ms.get_ref());
    if base > max {
        return Err(src.at(
            &raw.backoff_max_ms,
            "`backoff_max_ms` is below `backoff_base_ms`",
        ));
    }
    let cancel = match (&raw.cancel_p, &raw.cancel_after_s) {
        (None, None) => None,
        (Some(p), Some(after)) => {
            let share = *p.get_ref();
            if !(0.0..=1.0).contains(&share) {
                return Err(src.at(p, format!("`cancel_p` must be in [0, 1], got {share}")));
            }
            let after_d = seconds(src, after, "cancel_after_s")?;
            if after_d.is_zero() {
                return Err(src.at(after, "`cancel_after_s` must be greater than 0"));
            }
            (share > 0.0).then_some((share, after_d))
        }
        (Some(v), None) => return Err(src.at(v, "`cancel_p` needs `cancel_after_s`")),
        (None, Some(v)) => return Err(src.at(v, "`cancel_after_s` needs `cancel_p`")),
    };
    let deadline = |v: &Option<S<f64>>, key: &str| -> Result<Option<Duration>, ScenarioError> {
        let Some(v) = v else { return Ok(None) };
        let d = seconds(src, v, key)?;
        if d.is_zero() {
            return Err(src.at(
                v,
                format!("`{key}` must be greater than 0 (leave it out for none)"),
            ));
        }
        Ok(Some(d))
    };
    let ttft_timeout = deadline(&raw.ttft_timeout_s, "ttft_timeout_s")?;
    let stall_timeout = deadline(&raw.stall_timeout_s, "stall_timeout_s")?;
    if let (Some(stall), Some(v)) = (stall_timeout, &raw.stall_timeout_s)
        && !total.is_zero()
        && stall > total
    {
        return Err(src.at(
            v,
            "`stall_timeout_s` is longer than `total_timeout_s`: the stall could never be seen",
        ));
    }
    let retry_budget_percent = match &raw.retry_budget_percent {
        None => None,
        Some(v) => {
            let x = *v.get_ref();
            if !(x.is_finite() && (0.0..=1000.0).contains(&x)) {
                return Err(src.at(
                    v,
                    format!("`retry_budget_percent` must be in [0, 1000], got {x}"),
                ));
            }
            Some(x)
        }
    };
    let deadline = match &raw.deadline_s {
        None => (!total.is_zero()).then_some(total),
        Some(v) => {
            let d = seconds(src, v, "deadline_s")?;
            if d.is_zero() {
                return Err(src.at(
                    v,
                    "`deadline_s` must be greater than 0 (leave it out for the total timeout)",
                ));
            }
            Some(d)
        }
    };
    Ok(Client {
        deadline,
        ttft_timeout,
        stall_timeout,
        retry_budget_percent,
        retry_graded: raw.retry_graded.as_ref().is_some_and(|b| *b.get_ref()),
        cancel,
        attempt_timeout: attempt,
        total_timeout: (!total.is_zero()).then_some(total),
        max_retries,
        backoff_base: base,
        backoff_max: max,
    })
}

fn need<'a, T>(
    src: &Source<'_>,
    table: &Spanned<RawBreaker>,
    v: &'a Option<S<T>>,
    key: &str,
) -> Result<&'a S<T>, ScenarioError> {
    v.as_ref()
        .ok_or_else(|| src.at(table, format!("[breaker] needs `{key}`")))
}

/// Validates breaker settings: `raw`, the `[breaker]` table `table` or an
/// upstream's keys over it.
fn breaker(
    src: &Source<'_>,
    table: &Spanned<RawBreaker>,
    raw: &RawBreaker,
    client: &Client,
) -> Result<BreakerConfig, ScenarioError> {
    let spanned = table;
    let min_calls_v = need(src, table, &raw.min_calls, "min_calls")?;
    let failure_rate_v = need(src, table, &raw.failure_rate, "failure_rate")?;
    let slow_call_rate_v = need(src, table, &raw.slow_call_rate, "slow_call_rate")?;
    let slow_call_ms_v = need(src, table, &raw.slow_call_ms, "slow_call_ms")?;
    let consecutive_failures_v = need(
        src,
        table,
        &raw.consecutive_failures,
        "consecutive_failures",
    )?;
    let open_s_v = need(src, table, &raw.open_s, "open_s")?;
    let open_max_s_v = need(src, table, &raw.open_max_s, "open_max_s")?;
    let probes_v = need(src, table, &raw.probes, "probes")?;
    let close_after_v = need(src, table, &raw.close_after, "close_after")?;
    let window = match (&raw.window, &raw.window_s) {
        (Some(n), None) => match *n.get_ref() {
            0 => WindowConfig::Off,
            calls if calls > MAX_WINDOW => {
                return Err(src.at(
                    n,
                    format!("`window` is at most {MAX_WINDOW} calls, got {calls}"),
                ));
            }
            calls => WindowConfig::Count(calls),
        },
        (None, Some(span)) => {
            let span_d = seconds(src, span, "window_s")?;
            if span_d.is_zero() {
                WindowConfig::Off
            } else if span_d < client.attempt_timeout * 2 {
                return Err(src.at(
                    span,
                    "`window_s` is shorter than two `attempt_timeout_s`: hanging calls would \
                     leave the window before their timeouts are counted",
                ));
            } else {
                WindowConfig::Time(span_d)
            }
        }
        (Some(_), Some(span)) => {
            return Err(src.at(span, "`window` and `window_s` are both set; keep one"));
        }
        (None, None) => {
            return Err(src.at(
                spanned,
                "[breaker] needs `window` (calls) or `window_s` (seconds); 0 turns the rate rules off",
            ));
        }
    };
    let min_calls = *min_calls_v.get_ref();
    if let WindowConfig::Count(n) = window
        && min_calls > n
    {
        return Err(src.at(
            min_calls_v,
            format!("`min_calls` ({min_calls}) is larger than `window` ({n})"),
        ));
    }
    let failure_rate = rate(src, failure_rate_v, "failure_rate")?;
    let slow_call_rate = rate(src, slow_call_rate_v, "slow_call_rate")?;
    let slow_call = match *slow_call_ms_v.get_ref() {
        0 => None,
        ms => {
            let threshold = Duration::from_millis(ms);
            if window == WindowConfig::Off {
                return Err(src.at(
                    slow_call_ms_v,
                    "`slow_call_ms` needs a window (`window` or `window_s` above 0)",
                ));
            }
            if threshold >= client.attempt_timeout {
                return Err(src.at(
                    slow_call_ms_v,
                    "`slow_call_ms` is not below `attempt_timeout_s`: no call could be slow",
                ));
            }
            Some((threshold, slow_call_rate))
        }
    };
    let consecutive_failures = match *consecutive_failures_v.get_ref() {
        0 => None,
        n => Some(n),
    };
    let open = seconds(src, open_s_v, "open_s")?;
    if open.is_zero() {
        return Err(src.at(open_s_v, "`open_s` must be greater than 0"));
    }
    let open_max = seconds(src, open_max_s_v, "open_max_s")?;
    if open_max < open {
        return Err(src.at(open_max_s_v, "`open_max_s` is below `open_s`"));
    }
    let probes = *probes_v.get_ref();
    if probes == 0 {
        return Err(src.at(probes_v, "`probes` must be at least 1"));
    }
    let close_after = *close_after_v.get_ref();
    if close_after == 0 || close_after > probes {
        return Err(src.at(
            close_after_v,
            format!("`close_after` must be between 1 and `probes` ({probes}), got {close_after}"),
        ));
    }
    let probe_timeout = match &raw.probe_timeout_s {
        Some(v) => match seconds(src, v, "probe_timeout_s")? {
            d if d.is_zero() => None,
            d if d > client.attempt_timeout => {
                return Err(src.at(
                    v,
                    "`probe_timeout_s` is longer than `attempt_timeout_s`: the attempt would \
                     time out first (0 turns it off)",
                ))
            }
            d => Some(d),
        },
        None => None,
    };
    let health_probe_interval = match &raw.health_probe_interval_s {
        Some(v) => Some(seconds(src, v, "health_probe_interval_s")?).filter(|d| !d.is_zero()),
        None => None,
    };
    let health_probe_timeout = match &raw.health_probe_timeout_s {
        Some(v) => match seconds(src, v, "health_probe_timeout_s")? {
            d if d.is_zero() => {
                return Err(src.at(
                    v,
                    "`health_probe_timeout_s` must be greater than 0 (leave it out for one \
                     interval, the prober's default)",
                ))
            }
            d => Some(d),
        },
        None => None,
    };
    let volume_guard = match (&raw.volume_limit, &raw.volume_period_s) {
        (None, None) => None,
        (Some(limit), Some(period)) => {
            let period_d = seconds(src, period, "volume_period_s")?;
            if period_d.is_zero() {
                return Err(src.at(period, "`volume_period_s` must be greater than 0"));
            }
            match *limit.get_ref() {
                0 => return Err(src.at(limit, "`volume_limit` must be at least 1")),
                n => Some((n, period_d)),
            }
        }
        (Some(v), None) => {
            return Err(src.at(v, "`volume_limit` needs `volume_period_s`"));
        }
        (None, Some(v)) => {
            return Err(src.at(v, "`volume_period_s` needs `volume_limit`"));
        }
    };
    let quota_gate = match &raw.quota_gate_s {
        Some(v) => match seconds(src, v, "quota_gate_s")? {
            d if d.is_zero() => {
                return Err(src.at(
                    v,
                    "`quota_gate_s` must be greater than 0 (leave it out for no quota gating)",
                ))
            }
            d => Some(d),
        },
        None => None,
    };
    let open_all_or_nothing = match &raw.trip_mode {
        None => false,
        Some(v) => match v.get_ref().as_str() {
            "graded" => false,
            "open" => true,
            other => {
                return Err(src.at(
                    v,
                    format!("`trip_mode` {other:?} is not \"graded\" or \"open\""),
                ))
            }
        },
    };
    let keyed_by = match &raw.keyed_by {
        None => None,
        Some(v) => match v.get_ref().as_str() {
            "model" => Some(KeyedBy::Model),
            "model+api_key" => Some(KeyedBy::ModelAndKey),
            other => {
                return Err(src.at(
                    v,
                    format!("`keyed_by` {other:?} is not \"model\" or \"model+api_key\""),
                ))
            }
        },
    };
    Ok(BreakerConfig {
        volume_guard,
        quota_gate,
        pace_rate_limits: raw.pace_rate_limits.as_ref().is_some_and(|v| *v.get_ref()),
        open_all_or_nothing,
        keyed_by,
        no_in_flight_limit: false,
        window,
        min_calls,
        failure_rate,
        consecutive_failures,
        slow_call,
        open,
        open_max,
        probes,
        close_after,
        probe_timeout,
        health_probe_interval,
        health_probe_timeout,
    })
}

fn upstream(
    src: &Source<'_>,
    raw: &RawUpstream,
    global: &Spanned<RawBreaker>,
    client: &Client,
    duration: Duration,
) -> Result<Upstream, ScenarioError> {
    let name = raw.name.get_ref().trim().to_owned();
    if name.is_empty() || name.contains(['"', '\\']) || name.chars().any(char::is_control) {
        return Err(src.at(
            &raw.name,
            "`name` must be non-empty, without quotes, backslashes or control characters",
        ));
    }
    let phases = parse_phases(
        src,
        &raw.phase,
        &format!("upstream {name:?}"),
        client,
        duration,
    )?;
    let rate_limit = match &raw.rate_limit {
        None => None,
        Some(r) => Some(parse_rate_limit(src, r)?),
    };
    let mut keys: Vec<KeyScript> = Vec::new();
    for k in raw.key.as_ref().map_or(&[][..], |k| k.get_ref()) {
        let k = k.get_ref();
        let key = k.name.get_ref();
        if key.is_empty()
            || key.contains(['/', '#', '"', '\\'])
            || key.chars().any(char::is_control)
        {
            return Err(src.at(
                &k.name,
                "`name` of an [[upstream.key]] must be non-empty, without `/`, `#`, quotes, backslashes or control characters",
            ));
        }
        if keys.iter().any(|o| o.name == *key) {
            return Err(src.at(
                &k.name,
                format!("`name`: key {key:?} of upstream {name:?} is listed twice"),
            ));
        }
        let phases = parse_phases(
            src,
            &k.phase,
            &format!("key {key:?} of upstream {name:?}"),
            client,
            duration,
        )?;
        let rate_limit = match &k.rate_limit {
            None => None,
            Some(r) => Some(parse_rate_limit(src, r)?),
        };
        keys.push(KeyScript {
            name: key.clone(),
            phases,
            rate_limit,
        });
    }
    let breaker = match &raw.breaker {
        None => None,
        Some(over) => {
            if let Some(k) = &over.get_ref().keyed_by {
                return Err(src.at(k, "`keyed_by` belongs in [breaker], not an upstream's"));
            }
            let merged = global.get_ref().with(over.get_ref());
            Some(breaker(src, global, &merged, client)?)
        }
    };
    let capacity = match &raw.capacity {
        None => None,
        Some(c) => {
            let c = c.get_ref();
            let concurrent = *c.concurrent.get_ref();
            if concurrent == 0 {
                return Err(src.at(&c.concurrent, "`concurrent` must be at least 1"));
            }
            let retry_after = match &c.retry_after_s {
                Some(v) => Some(seconds(src, v, "retry_after_s")?),
                None => None,
            };
            Some(Capacity {
                concurrent,
                queue: c.queue.as_ref().map_or(0, |q| *q.get_ref()),
                retry_after,
            })
        }
    };
    let cost = match &raw.cost {
        Some(c) => cost(src, c)?,
        None => Cost::PerRequest {
            usd: DEFAULT_USD_PER_REQUEST,
        },
    };
    let probe_cost = match cost {
        Cost::PerRequest { usd } => Cost::PerRequest { usd },
        Cost::PerToken {
            input_usd,
            output_usd,
        } => {
            let tokens_out = raw
                .cost
                .as_ref()
                .and_then(|c| c.get_ref().tokens_out.as_ref())
                .map_or(0, |n| *n.get_ref());
            Cost::PerToken {
                input_usd,
                output_usd: if tokens_out > 0 {
                    output_usd / tokens_out as f64
                } else {
                    0.0
                },
            }
        }
    };
    let tokens = raw.cost.as_ref().and_then(|c| {
        let c = c.get_ref();
        Some((
            *c.tokens_in.as_ref()?.get_ref(),
            *c.tokens_out.as_ref()?.get_ref(),
        ))
    });
    Ok(Upstream {
        name,
        phases,
        cost,
        probe_cost,
        breaker,
        capacity,
        tokens,
        rate_limit,
        keys,
    })
}

/// `rate_limit = { requests = N, period_s = D }`.
fn parse_rate_limit(
    src: &Source<'_>,
    spanned: &Spanned<RawRateLimit>,
) -> Result<RateLimit, ScenarioError> {
    let r = spanned.get_ref();
    let requests = *r.requests.get_ref();
    if requests == 0 {
        return Err(src.at(
            &r.requests,
            "`requests` of a `rate_limit` must be at least 1",
        ));
    }
    let period = seconds(src, &r.period_s, "period_s")?;
    if period.is_zero() {
        return Err(src.at(
            &r.period_s,
            "`period_s` of a `rate_limit` must be greater than 0",
        ));
    }
    Ok(RateLimit::new(requests, period))
}

/// The `[[…phase]]` tables of an upstream or a key (`what` names it).
fn parse_phases(
    src: &Source<'_>,
    spanned: &Spanned<Vec<S<RawPhase>>>,
    what: &str,
    client: &Client,
    duration: Duration,
) -> Result<Vec<Phase>, ScenarioError> {
    let name = what;
    let raw_phases = spanned.get_ref();
    if raw_phases.is_empty() {
        return Err(src.at(spanned, format!("{name} needs at least one phase")));
    }
    let mut phases: Vec<Phase> = Vec::with_capacity(raw_phases.len());
    for (i, spanned) in raw_phases.iter().enumerate() {
        let raw_phase = spanned.get_ref();
        let from = seconds(src, &raw_phase.from_s, "from_s")?;
        if i == 0 && !from.is_zero() {
            return Err(src.at(
                &raw_phase.from_s,
                format!("`from_s`: the first phase of {name} must start at 0"),
            ));
        }
        if let Some(prev) = phases.last()
            && from <= prev.from
        {
            return Err(src.at(
                &raw_phase.from_s,
                "`from_s`: phases must be listed in increasing order of `from_s`",
            ));
        }
        let mut responses = Vec::new();
        let mut sum = 0.0;
        for r in raw_phase.responses.get_ref() {
            let response = response(src, r)?;
            // A stalled stream ends only at a stall deadline or when its
            // user gives up.
            let ends =
                client.stall_timeout.is_some() || client.cancel.is_some_and(|(p, _)| p >= 1.0);
            if matches!(response.kind, Kind::Stall { .. }) && response.p > 0.0 && !ends {
                return Err(src.at(
                    &r.get_ref().kind,
                    "kind \"stall\" never ends: it needs `stall_timeout_s` in [client], or \
                     `cancel_p = 1` (every user gives up)",
                ));
            }
            sum += response.p;
            responses.push(response);
        }
        if responses.is_empty() {
            return Err(src.at(&raw_phase.responses, "`responses` is empty"));
        }
        if (sum - 1.0).abs() > 1e-9 {
            return Err(src.at(
                &raw_phase.responses,
                format!("`responses`: the probabilities `p` add up to {sum}, not 1"),
            ));
        }
        if let Some(prev) = phases.last_mut() {
            prev.until = from;
        }
        phases.push(Phase {
            from,
            until: duration.max(from),
            responses,
        });
    }
    Ok(phases)
}

fn cost(src: &Source<'_>, spanned: &Spanned<RawCost>) -> Result<Cost, ScenarioError> {
    let raw = spanned.get_ref();
    let usd = |v: &S<f64>, key: &str| {
        let x = *v.get_ref();
        if x.is_finite() && (0.0..=1e6).contains(&x) {
            Ok(x)
        } else {
            Err(src.at(
                v,
                format!("`{key}` must be a price in USD, 0 to 1e6, got {x}"),
            ))
        }
    };
    let tokens = [
        ("usd_per_mtok_in", raw.usd_per_mtok_in.as_ref()),
        ("usd_per_mtok_out", raw.usd_per_mtok_out.as_ref()),
    ];
    let counts = [
        ("tokens_in", raw.tokens_in.as_ref()),
        ("tokens_out", raw.tokens_out.as_ref()),
    ];
    let token_keys =
        tokens.iter().any(|(_, v)| v.is_some()) || counts.iter().any(|(_, v)| v.is_some());
    match (&raw.usd_per_request, token_keys) {
        (Some(v), false) => Ok(Cost::PerRequest {
            usd: usd(v, "usd_per_request")?,
        }),
        (Some(v), true) => Err(src.at(
            v,
            "`usd_per_request`: give a price per request or per token, not both",
        )),
        (None, _) => {
            let mut price = [0.0; 2];
            for (i, ((key, v), (count_key, n))) in tokens.into_iter().zip(counts).enumerate() {
                let (Some(v), Some(n)) = (v, n) else {
                    let missing = if v.is_none() { key } else { count_key };
                    return Err(src.at(
                        spanned,
                        format!(
                            "`cost` needs `usd_per_request`, or all of `usd_per_mtok_in`, \
                             `usd_per_mtok_out`, `tokens_in` and `tokens_out` (`{missing}` is \
                             missing)"
                        ),
                    ));
                };
                let tokens = *n.get_ref();
                if tokens > 10_000_000 {
                    return Err(src.at(
                        n,
                        format!("`{count_key}` is at most 10000000, got {tokens}"),
                    ));
                }
                price[i] = usd(v, key)? * tokens as f64 / 1e6;
            }
            Ok(Cost::PerToken {
                input_usd: price[0],
                output_usd: price[1],
            })
        }
    }
}

fn billing(src: &Source<'_>, raw: &RawBilling) -> Result<Billing, ScenarioError> {
    let mut billing = Billing::default();
    for (key, v, slot) in [
        ("hang", &raw.hang, &mut billing.hang),
        ("stream_error", &raw.stream_error, &mut billing.stream_error),
        ("error", &raw.error, &mut billing.error),
        ("stall", &raw.stall, &mut billing.stall),
    ] {
        if let Some(v) = v {
            let x = *v.get_ref();
            if !(0.0..=1.0).contains(&x) {
                return Err(src.at(v, format!("`{key}` must be in [0, 1], got {x}")));
            }
            *slot = x;
        }
    }
    Ok(billing)
}

fn writeup(src: &Source<'_>, raw: &RawWriteup, upstreams: usize) -> Result<Writeup, ScenarioError> {
    let known = StackKind::for_upstreams(upstreams);
    let mut stacks = Vec::new();
    for name in raw.stacks.get_ref() {
        let Some(&kind) = known.iter().find(|k| k.name() == name.get_ref()) else {
            let names: Vec<&str> = known.iter().map(|k| k.name()).collect();
            return Err(src.at(
                name,
                format!(
                    "`stacks`: {:?} is not a stack of this scenario ({})",
                    name.get_ref(),
                    names.join(", ")
                ),
            ));
        };
        stacks.push(kind);
    }
    if stacks.is_empty() {
        return Err(src.at(&raw.stacks, "`stacks` is empty"));
    }
    let mut rows = Vec::new();
    for row in raw.row.get_ref() {
        let row = row.get_ref();
        let Some(&(_, figure)) = Figure::NAMES
            .iter()
            .find(|(n, _)| n == row.figure.get_ref())
        else {
            let names: Vec<&str> = Figure::NAMES.iter().map(|(n, _)| *n).collect();
            return Err(src.at(
                &row.figure,
                format!(
                    "`figure` {:?} is not one of {}",
                    row.figure.get_ref(),
                    names.join(", ")
                ),
            ));
        };
        let reported: Vec<String> = row
            .reported
            .get_ref()
            .iter()
            .map(|r| r.get_ref().clone())
            .collect();
        if reported.len() != stacks.len() {
            return Err(src.at(
                &row.reported,
                format!(
                    "`reported` has {} values for {} stacks",
                    reported.len(),
                    stacks.len()
                ),
            ));
        }
        rows.push(WriteupRow {
            label: row.label.get_ref().clone(),
            figure,
            reported,
        });
    }
    Ok(Writeup {
        title: raw.title.get_ref().clone(),
        stacks,
        rows,
    })
}

fn response(src: &Source<'_>, spanned: &Spanned<RawResponse>) -> Result<Response, ScenarioError> {
    let raw = spanned.get_ref();
    let p = *raw.p.get_ref();
    if !(0.0..=1.0).contains(&p) {
        return Err(src.at(&raw.p, format!("`p` must be between 0 and 1, got {p}")));
    }
    let kind_name = raw.kind.get_ref().as_str();
    // Which optional keys each kind takes, and which it needs.
    const LAT: [&str; 3] = ["latency_ms", "latency_sigma", "latency_to_ms"];
    let (allowed, needed): (&[&str], &[&str]) = match kind_name {
        "ok" => (&[LAT[0], LAT[1], LAT[2], "stream_ms"], &["latency_ms"]),
        "reset" | "content_filter" | "context_length" => (&LAT, &["latency_ms"]),
        // With an `error` body the code may be left out: the body's own.
        "status" if raw.error.is_some() => {
            (&[LAT[0], LAT[1], LAT[2], "code", "error"], &["latency_ms"])
        }
        "status" => (
            &[LAT[0], LAT[1], LAT[2], "code", "retry_after_s"],
            &["latency_ms", "code"],
        ),
        "hang" => (&[], &[]),
        "sse_error" => (
            &[LAT[0], LAT[1], LAT[2], "stream_ms"],
            &["latency_ms", "stream_ms"],
        ),
        "stall" => (
            &[LAT[0], LAT[1], LAT[2], "stall_after_ms"],
            &["latency_ms", "stall_after_ms"],
        ),
        other => {
            return Err(src.at(
                &raw.kind,
                format!(
                    "`kind` {other:?} is not one of \"ok\", \"status\", \"hang\", \"reset\", \
                     \"sse_error\", \"content_filter\", \"context_length\", \"stall\""
                ),
            ))
        }
    };
    let present: [(&str, Option<usize>); 8] = [
        (
            "latency_sigma",
            raw.latency_sigma.as_ref().map(|s| s.span().start),
        ),
        (
            "latency_to_ms",
            raw.latency_to_ms.as_ref().map(|s| s.span().start),
        ),
        (
            "latency_ms",
            raw.latency_ms.as_ref().map(|s| s.span().start),
        ),
        ("code", raw.code.as_ref().map(|s| s.span().start)),
        (
            "retry_after_s",
            raw.retry_after_s.as_ref().map(|s| s.span().start),
        ),
        ("stream_ms", raw.stream_ms.as_ref().map(|s| s.span().start)),
        (
            "stall_after_ms",
            raw.stall_after_ms.as_ref().map(|s| s.span().start),
        ),
        ("error", raw.error.as_ref().map(|s| s.span().start)),
    ];
    for (key, at) in present {
        if let Some(at) = at {
            if !allowed.contains(&key) {
                return Err(ScenarioError {
                    file: src.file.to_owned(),
                    line: Some(src.line(at)),
                    message: format!("`{key}` is not a key of kind {kind_name:?}"),
                });
            }
        } else if needed.contains(&key) {
            return Err(src.at(spanned, format!("kind {kind_name:?} needs `{key}`")));
        }
    }
    let ms = |v: &Option<S<u64>>| Duration::from_millis(v.as_ref().map_or(0, |s| *s.get_ref()));
    let latency = ms(&raw.latency_ms);
    let kind = match kind_name {
        "ok" => Kind::Ok {
            latency,
            stream: ms(&raw.stream_ms),
        },
        "reset" => Kind::Reset { latency },
        "content_filter" => Kind::ContentFilter { latency },
        "context_length" => Kind::ContextLength { latency },
        "hang" => Kind::Hang,
        "sse_error" => Kind::SseError {
            latency,
            stream: ms(&raw.stream_ms),
        },
        "stall" => Kind::Stall {
            latency,
            stall_after: ms(&raw.stall_after_ms),
        },
        _ if raw.error.is_some() => error_body(src, raw, latency)?,
        _ => {
            let code_s = raw.code.as_ref().expect("checked above");
            let code = *code_s.get_ref();
            if !(200..=599).contains(&code) {
                return Err(src.at(code_s, format!("`code` must be 200..=599, got {code}")));
            }
            let retry_after = match &raw.retry_after_s {
                Some(s) => Some(seconds(src, s, "retry_after_s")?),
                None => None,
            };
            Kind::Status {
                code,
                latency,
                retry_after,
            }
        }
    };
    let latency = match (&raw.latency_sigma, &raw.latency_to_ms) {
        (None, None) => Latency::Fixed,
        (Some(sigma), None) => {
            let x = *sigma.get_ref();
            if !(x.is_finite() && (0.0..=3.0).contains(&x)) {
                return Err(src.at(sigma, format!("`latency_sigma` must be in [0, 3], got {x}")));
            }
            Latency::Lognormal { sigma: x }
        }
        (None, Some(to)) => Latency::Ramp {
            to: Duration::from_millis(*to.get_ref()),
        },
        (Some(_), Some(to)) => {
            return Err(src.at(
                to,
                "`latency_to_ms`: a latency is a ramp or lognormal (`latency_sigma`), not both",
            ))
        }
    };
    Ok(Response { p, kind, latency })
}

/// A `status` answer with an `error` body: the body the crate's
/// `LlmClassifier` reads, at the status that body comes with.
fn error_body(
    src: &Source<'_>,
    raw: &RawResponse,
    latency: Duration,
) -> Result<Kind, ScenarioError> {
    const ERRORS: &str = "\"insufficient_quota\" (429), \"context_length_exceeded\" (400), \
                          \"content_policy\" (400)";
    let Some(error) = raw.error.as_ref() else {
        return Err(src.at(&raw.kind, "an error body needs `error`"));
    };
    let (kind, status) = match error.get_ref().as_str() {
        "insufficient_quota" => (Kind::QuotaExhausted { latency }, 429),
        "context_length_exceeded" => (Kind::ContextLength { latency }, 400),
        "content_policy" => (Kind::ContentFilter { latency }, 400),
        other => return Err(src.at(error, format!("`error` {other:?} is not one of {ERRORS}"))),
    };
    if let Some(code) = &raw.code
        && *code.get_ref() != status
    {
        return Err(src.at(
            code,
            format!(
                "`code` {} does not fit `error` {:?}, which is answered with {status} \
                 (leave `code` out)",
                code.get_ref(),
                error.get_ref()
            ),
        ));
    }
    Ok(kind)
}

// === numbers ===

fn positive(src: &Source<'_>, v: &Spanned<f64>, key: &str) -> Result<f64, ScenarioError> {
    let x = *v.get_ref();
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(src.at(
            v,
            format!("`{key}` must be a number greater than 0, got {x}"),
        ))
    }
}

/// A non-negative number of seconds, at most ten years.
fn seconds(src: &Source<'_>, v: &Spanned<f64>, key: &str) -> Result<Duration, ScenarioError> {
    let x = *v.get_ref();
    if x.is_finite() && (0.0..=315_360_000.0).contains(&x) {
        Ok(Duration::from_secs_f64(x))
    } else {
        Err(src.at(
            v,
            format!("`{key}` must be a number of seconds, 0 or more, got {x}"),
        ))
    }
}

fn rate(src: &Source<'_>, v: &Spanned<f64>, key: &str) -> Result<f64, ScenarioError> {
    let x = *v.get_ref();
    if x > 0.0 && x <= 1.0 {
        Ok(x)
    } else {
        Err(src.at(v, format!("`{key}` must be in (0, 1], got {x}")))
    }
}

/// The `[sweep]` grid: every key a breaker key, every value a number.
fn sweep_grid(
    src: &Source<'_>,
    table: &Spanned<RawGrid>,
) -> Result<Vec<(String, Vec<String>)>, ScenarioError> {
    let mut grid = Vec::new();
    let mut combinations = 1usize;
    for (key, values) in table.get_ref() {
        if !SWEEP_KEYS.contains(&key.get_ref().as_str()) {
            return Err(src.at(
                key,
                format!(
                    "`{}` is not a breaker key a sweep can vary ({})",
                    key.get_ref(),
                    SWEEP_KEYS.join(", ")
                ),
            ));
        }
        let mut shown = Vec::new();
        for v in values.get_ref() {
            match v {
                toml::Value::Integer(i) if *i >= 0 => shown.push(i.to_string()),
                toml::Value::Float(x) if x.is_finite() && *x >= 0.0 => shown.push(format!("{x:?}")),
                other => {
                    return Err(src.at(
                        values,
                        format!(
                            "`{}`: sweep values are numbers, 0 or more, got {other}",
                            key.get_ref()
                        ),
                    ))
                }
            }
        }
        if shown.is_empty() {
            return Err(src.at(values, format!("`{}` has no values", key.get_ref())));
        }
        combinations = combinations.saturating_mul(shown.len());
        if combinations > MAX_SWEEP {
            return Err(src.at(
                values,
                format!("the sweep has more than {MAX_SWEEP} combinations"),
            ));
        }
        grid.push((key.get_ref().clone(), shown));
    }
    Ok(grid)
}

/// The grid of a `--grid key=v1,v2` argument, read as a `[sweep]` table.
pub fn parse_grid(args: &[String]) -> Result<Vec<(String, Vec<String>)>, ScenarioError> {
    let text: String = args
        .iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) => format!("{} = [{}]\n", k.trim(), v),
            None => format!("{a}\n"),
        })
        .collect();
    #[derive(Deserialize)]
    struct Grid {
        sweep: S<RawGrid>,
    }
    let text = format!("[sweep]\n{text}");
    let src = Source {
        text: &text,
        file: "--grid",
    };
    let grid: Grid = toml::from_str(&text).map_err(|e| ScenarioError {
        file: "--grid".to_owned(),
        line: None,
        message: e.message().trim().to_owned(),
    })?;
    sweep_grid(&src, &grid.sweep)
}

/// The scenario `text` with these `[breaker]` keys set to these values
/// (replacing the key's line, or added after `[breaker]`), validated as a
/// file of its own.
pub fn with_breaker(
    text: &str,
    file: &str,
    values: &[(&str, &str)],
) -> Result<Scenario, ScenarioError> {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let header = lines
        .iter()
        .position(|l| l.trim() == "[breaker]")
        .ok_or_else(|| ScenarioError {
            file: file.to_owned(),
            line: None,
            message: "no [breaker] table to sweep".to_owned(),
        })?;
    let is_key = |l: &String, key: &str| {
        l.trim_start()
            .strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    };
    for &(key, value) in values {
        // Setting one kind of window drops the other.
        let other = match key {
            "window" => "window_s",
            "window_s" => "window",
            _ => "",
        };
        let end = |lines: &[String]| {
            lines[header + 1..]
                .iter()
                .position(|l| l.trim_start().starts_with('['))
                .map_or(lines.len(), |e| header + 1 + e)
        };
        if !other.is_empty() {
            let e = end(&lines);
            if let Some(i) = lines[header + 1..e].iter().position(|l| is_key(l, other)) {
                lines.remove(header + 1 + i);
            }
        }
        let set = format!("{key} = {value}");
        let e = end(&lines);
        match lines[header + 1..e].iter().position(|l| is_key(l, key)) {
            Some(i) => lines[header + 1 + i] = set,
            None => lines.insert(header + 1, set),
        }
    }
    let mut edited = lines.join("\n");
    edited.push('\n');
    parse(&edited, file)
}

// === [spend] ===

/// A spend guard on every breaker of the breaker stacks (`breaker`,
/// `global-breaker`; with `keyed_by`, each key its own budget), priced by
/// each upstream's per-token `cost`, whose answers then report that `usage`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpendConfig {
    pub budget_usd: f64,
    pub period: tower_circuit_breaker::spend::Period,
    /// What a call whose usage never came is charged; absent: the running
    /// average.
    pub unknown_usd: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpend {
    budget_usd: S<f64>,
    period_s: Option<S<f64>>,
    period: Option<S<String>>,
    unknown_usd: Option<S<f64>>,
}

fn spend(src: &Source<'_>, spanned: &Spanned<RawSpend>) -> Result<SpendConfig, ScenarioError> {
    use tower_circuit_breaker::spend::Period;
    let raw = spanned.get_ref();
    let usd = |v: &S<f64>, key: &str| {
        let x = *v.get_ref();
        if x.is_finite() && x > 0.0 && x <= 1e9 {
            Ok(x)
        } else {
            Err(src.at(
                v,
                format!("`{key}` must be a positive amount in USD, at most 1e9, got {x}"),
            ))
        }
    };
    let period = match (&raw.period_s, &raw.period) {
        (Some(v), None) => {
            let d = seconds(src, v, "period_s")?;
            if d < Duration::from_secs(1) || d > Duration::from_secs(7 * 86_400) {
                return Err(src.at(v, "`period_s` must be between 1 and 604800 (a week)"));
            }
            Period::Rolling(d)
        }
        (None, Some(v)) => match v.get_ref().as_str() {
            "utc_hour" => Period::UtcHour,
            "utc_day" => Period::UtcDay,
            other => {
                return Err(src.at(
                    v,
                    format!("`period` {other:?} is not \"utc_hour\" or \"utc_day\""),
                ))
            }
        },
        (Some(v), Some(_)) => {
            return Err(src.at(
                v,
                "`[spend]`: give `period_s` (rolling) or `period`, not both",
            ))
        }
        (None, None) => return Err(src.at(
            spanned,
            "`[spend]` needs `period_s` (a rolling period) or `period` (\"utc_hour\", \"utc_day\")",
        )),
    };
    Ok(SpendConfig {
        budget_usd: usd(&raw.budget_usd, "budget_usd")?,
        period,
        unknown_usd: match &raw.unknown_usd {
            Some(v) => Some(usd(v, "unknown_usd")?),
            None => None,
        },
    })
}
