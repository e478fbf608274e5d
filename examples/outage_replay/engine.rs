//! The replay engine: simulated upstreams behind the real tower stacks, in
//! virtual time.
//!
//! Every stack runs on its own current-thread runtime with the clock paused,
//! so an 18-minute outage replays in seconds and every timer (attempt
//! timeouts, backoff, open durations, upstream latency) is exact. Requests
//! go through the crate's real layers: `tower::timeout`, `tower::retry` with
//! [`RetryPolicy`], [`CircuitBreaker`] via the [`Stack`] helper, and
//! [`Failover`].
//!
//! Stacks face the same requests (the same arrival times) and the same
//! upstream behaviour, request by request: what an upstream does with the
//! n-th attempt of request r is a pure function of the seed, the upstream,
//! r and n, so it does not depend on what other requests did.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::timeout::{Timeout, TimeoutLayer};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::deadline::StreamDeadlines;
use tower_circuit_breaker::failover::{AllOpen, Failover, Hedge};
use tower_circuit_breaker::health::HealthProbe;
use tower_circuit_breaker::keyed::{self, KeyedBreakers};
use tower_circuit_breaker::retry::{RetryBudget, RetryPolicy};
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::testing::{AttemptLog, ScriptedBody, ScriptedUpstream};
use tower_circuit_breaker::{
    BoxError, Breaker, Build, Builder, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, State,
    Transition, TripMode,
};

use crate::figures::{Figures, Recovery};

#[path = "routing.rs"]
mod routing;
// `context_length_wave` is for tests/outage_replay.rs.
#[allow(unused_imports)]
pub use self::routing::{context_length_wave, table as routing_table};
pub use crate::scenario::StackKind;
use crate::scenario::{
    BreakerConfig, HedgeDelay, KeyedBy, Kind, Scenario, WindowConfig, REQUEST_ID,
};

/// Buckets of a time window (`window_s`).
pub const TIME_BUCKETS: u32 = 20;
/// The longest `Retry-After` a retry waits out (capped further by half the
/// total timeout, when there is one).
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(20);
/// Pause before a fallback in the `failover` stack.
pub const FAILOVER_JITTER: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_millis(200));

// === results ===

/// One replayed scenario.
#[derive(Debug, Clone)]
pub struct Replay {
    pub scenario: String,
    pub seed: u64,
    pub duration_s: f64,
    pub upstreams: Vec<String>,
    /// Arrival times, the same for every stack.
    pub arrivals_s: Vec<f64>,
    /// Who sent the requests: a model, or a model and an API key.
    pub classes: Vec<String>,
    /// The scenario replayed.
    pub setup: Arc<Scenario>,
    pub stacks: Vec<StackRun>,
}

impl Replay {
    // The queries below serve tests/outage_replay.rs.
    #[allow(dead_code)]
    pub fn stack(&self, name: &str) -> Option<&StackRun> {
        self.stacks.iter().find(|s| s.name == name)
    }
}

/// What one stack did.
#[derive(Debug, Clone)]
pub struct StackRun {
    pub name: &'static str,
    /// Every request.
    pub all: Figures,
    /// The requests that arrived during the outage.
    pub outage: Option<Figures>,
    /// The requests that arrived after their upstream's heal, to the end
    /// (`None`: no upstream failed and healed).
    pub after_heal: Option<Figures>,
    /// Per class of traffic, when there is more than one.
    pub by_class: Vec<ClassRun>,
    /// Per upstream the stack calls.
    pub recovery: Vec<Recovery>,
    pub transitions: Vec<TransitionRecord>,
    /// Every upstream attempt, in the order they started.
    pub attempt_log: Vec<AttemptRecord>,
    /// Every request, in the order they arrived.
    pub requests: Vec<RequestRecord>,
    /// The failures its breakers counted, for the `[failover]` stacks.
    pub breaker_failures: Option<u64>,
}

/// What one stack did for one class of traffic, in each window.
#[derive(Debug, Clone)]
pub struct ClassRun {
    pub all: Figures,
    pub outage: Option<Figures>,
    pub after_heal: Option<Figures>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TransitionRecord {
    pub t_s: f64,
    pub upstream: String,
    pub to: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttemptRecord {
    pub t_s: f64,
    pub upstream: usize,
    pub request: usize,
    /// Whether the upstream failed this attempt (5xx, hang, reset, stream error).
    pub failed: bool,
    pub kind: Kind,
    /// How long it ran: to its response head, or until it was given up.
    ran: Duration,
    /// What the upstream billed for it.
    pub cost_usd: f64,
    /// The same with hangs unbilled (`[billing] hang = 0`).
    pub cost_hangs_unbilled_usd: f64,
    /// A health probe (a one-token completion), not a user's attempt.
    pub probe: bool,
    /// Whether its answer reached the user.
    pub answered: bool,
    /// Whether the upstream started on it (not still queued when it was
    /// given up).
    pub served: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestRecord {
    /// When it was sent.
    pub arrival_s: f64,
    /// To the end of the answer, or to the error.
    pub wait_s: f64,
    /// To the response head (a stream's first token), or to the error.
    pub first_byte_s: f64,
    pub fate: Fate,
    /// Which of the replay's `classes` sent it.
    pub class: usize,
    /// The upstream it asked for.
    pub upstream: usize,
    /// Its answer, or its last attempt's, was a 429.
    pub rate_limited: bool,
    /// Its user gave up waiting (a failure for the user, counted in
    /// `failed`).
    pub cancelled: bool,
}

/// How one request ended for its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Succeeded,
    /// An error or an unsuccessful answer reached the user after upstream work.
    Failed,
    /// Failed fast by an open circuit, without any upstream attempt.
    Rejected,
}

// === replay ===

/// Replays every stack of the scenario, in parallel threads (one paused
/// runtime each).
pub fn replay(scenario: &Scenario) -> Result<Replay, String> {
    replay_stacks(scenario, &scenario.stacks())
}

/// One request as it arrives: when, to which upstream, with which breaker
/// key, from which class of traffic.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub at: Duration,
    pub upstream: usize,
    pub key: Arc<str>,
    pub class: usize,
    /// The API key the request is sent with, if any.
    pub api_key: Option<Arc<str>>,
}

/// The requests of a scenario, the same for every stack, and the names of
/// the classes of traffic that send them.
pub fn requests(scenario: &Scenario) -> (Vec<Arrival>, Vec<String>) {
    let primary = &scenario.upstreams[0].name;
    let mut times: Vec<(Duration, Option<usize>)> =
        arrivals(scenario).into_iter().map(|t| (t, None)).collect();
    let mut classes: Vec<(usize, Option<String>)> = scenario
        .traffic
        .iter()
        .map(|t| (t.upstream, t.api_key.clone()))
        .collect();
    if classes.is_empty() {
        classes.push((0, None));
    }
    for b in &scenario.bursts {
        let class = b.source.clone().map(|source| {
            classes
                .iter()
                .position(|c| *c == source)
                .unwrap_or_else(|| {
                    classes.push(source);
                    classes.len() - 1
                })
        });
        for k in 0..b.requests {
            let t = b.at + b.over.mul_f64(f64::from(k) / f64::from(b.requests));
            times.push((t, class));
        }
    }
    if !scenario.bursts.is_empty() {
        times.sort_by_key(|&(t, _)| t);
    }
    let label = |(upstream, key): &(usize, Option<String>)| {
        let model = &scenario.upstreams[*upstream].name;
        key.as_ref()
            .map_or_else(|| model.clone(), |k| format!("{model}/{k}"))
    };
    let labels: Vec<String> = classes.iter().map(label).collect();
    let api_keys: Vec<Option<Arc<str>>> = classes
        .iter()
        .map(|c| c.1.as_deref().map(Arc::from))
        .collect();
    let breaker_keys: Vec<Arc<str>> = classes
        .iter()
        .map(|c| match scenario.breaker.keyed_by {
            Some(KeyedBy::ModelAndKey) => label(c).into(),
            _ => scenario.upstreams[c.0].name.as_str().into(),
        })
        .collect();
    let shares: Vec<f64> = scenario.traffic.iter().map(|t| t.p).collect();
    let arrivals = times
        .into_iter()
        .enumerate()
        .map(|(id, (at, class))| {
            let class = class.unwrap_or_else(|| {
                let u = unit(mix(mix(scenario.seed ^ 0x7aff_1c00) ^ id as u64));
                let mut acc = 0.0;
                let last = shares.iter().rposition(|&p| p > 0.0).unwrap_or(0);
                shares
                    .iter()
                    .position(|&p| {
                        acc += p;
                        p > 0.0 && u < acc
                    })
                    .unwrap_or(last)
            });
            Arrival {
                at,
                upstream: classes[class].0,
                key: Arc::clone(&breaker_keys[class]),
                class,
                api_key: api_keys[class].clone(),
            }
        })
        .collect();
    let _ = primary;
    (arrivals, labels)
}

/// Replays the given stacks.
pub fn replay_stacks(scenario: &Scenario, kinds: &[StackKind]) -> Result<Replay, String> {
    let scenario = Arc::new(scenario.clone());
    let (arrivals, classes) = requests(&scenario);
    let arrivals: Arc<[Arrival]> = arrivals.into();
    let runs = std::thread::scope(|scope| {
        let handles: Vec<_> = kinds
            .iter()
            .map(|&kind| {
                let scenario = Arc::clone(&scenario);
                let arrivals = Arc::clone(&arrivals);
                scope.spawn(move || run_stack(scenario, arrivals, kind))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a replay thread panicked".to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    Ok(Replay {
        scenario: scenario.name.clone(),
        seed: scenario.seed,
        duration_s: scenario.duration.as_secs_f64(),
        upstreams: scenario.upstreams.iter().map(|u| u.name.clone()).collect(),
        arrivals_s: arrivals.iter().map(|a| a.at.as_secs_f64()).collect(),
        classes,
        setup: Arc::clone(&scenario),
        stacks: runs,
    })
}

/// Request arrival times in `[0, duration)`: evenly spaced, or a Poisson
/// process drawn from the seed.
pub fn arrivals(scenario: &Scenario) -> Vec<Duration> {
    let duration = scenario.duration.as_secs_f64();
    let mut segments = vec![(0.0, scenario.rate_per_s)];
    segments.extend(scenario.rates.iter().map(|&(t, r)| (t.as_secs_f64(), r)));
    let mut out = Vec::with_capacity((duration * scenario.rate_per_s * 1.1) as usize + 16);
    let mut state = mix(scenario.seed ^ 0x5eed_a771_7a15_0000);
    for (i, &(from, rate)) in segments.iter().enumerate() {
        let end = segments.get(i + 1).map_or(duration, |s| s.0);
        if rate <= 0.0 {
            continue;
        }
        if scenario.poisson {
            // Memoryless: a new rate starts a new process at its start.
            let mut t = from;
            loop {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                t += -(1.0 - unit(mix(state))).ln() / rate;
                if t >= end {
                    break;
                }
                out.push(Duration::from_secs_f64(t));
            }
        } else {
            for i in 0u64.. {
                let t = from + i as f64 / rate;
                if t >= end {
                    break;
                }
                out.push(Duration::from_secs_f64(t));
            }
        }
    }
    out
}

pub type TransitionLog = Arc<Mutex<Vec<(Instant, Arc<str>, State)>>>;

fn run_stack(
    scenario: Arc<Scenario>,
    arrivals: Arc<[Arrival]>,
    kind: StackKind,
) -> Result<StackRun, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    ALL_OR_NOTHING.set(kind == StackKind::BreakerOpen);
    runtime.block_on(async move {
        let sim = Arc::new(Sim::new(Arc::clone(&scenario), &arrivals)?);
        let log = TransitionLog::default();
        let replicas = if kind.independent() {
            scenario.replicas
        } else {
            1
        };
        // One stack per replica, each with breakers of its own.
        let keyed = scenario.breaker.keyed_by.is_some();
        let requests = match kind {
            StackKind::NoBreaker => drive(vec![no_breaker(&sim)?], &sim, &arrivals).await?,
            StackKind::Breaker | StackKind::BreakerOpen | StackKind::BreakerIndependent
                if keyed =>
            {
                let stacks: Result<Vec<_>, String> = (0..replicas)
                    .map(|r| keyed_breaker(&sim, &log, r))
                    .collect();
                drive(stacks?, &sim, &arrivals).await?
            }
            StackKind::Breaker
            | StackKind::BreakerOpen
            | StackKind::BreakerIndependent
            | StackKind::GlobalBreaker => {
                let stacks: Result<Vec<_>, String> =
                    (0..replicas).map(|r| breaker(&sim, &log, r)).collect();
                drive(stacks?, &sim, &arrivals).await?
            }
            StackKind::NaiveFailover => drive(vec![naive_failover(&sim)?], &sim, &arrivals).await?,
            StackKind::Failover | StackKind::FailoverIndependent => {
                let stacks: Result<Vec<_>, String> =
                    (0..replicas).map(|r| failover(&sim, &log, r)).collect();
                drive(stacks?, &sim, &arrivals).await?
            }
            StackKind::Hedged => drive(vec![hedged(&sim, &log)?], &sim, &arrivals).await?,
            StackKind::FailoverLastResort => {
                drive(
                    vec![failover_all_open(&sim, &log, 0, None, true)?],
                    &sim,
                    &arrivals,
                )
                .await?
            }
            StackKind::FailoverSelect => {
                drive(vec![routing::failover_select(&sim, &log)?], &sim, &arrivals).await?
            }
            StackKind::Oracle => drive(vec![routing::oracle(&sim, &log)?], &sim, &arrivals).await?,
            StackKind::FailoverByKind => {
                drive(
                    vec![routing::failover_by_kind(&sim, &log)?],
                    &sim,
                    &arrivals,
                )
                .await?
            }
        };

        Ok(summarize(kind, &sim, requests, &log))
    })
}

// === the stacks ===

fn client(sim: &Arc<Sim>) -> SimClient {
    SimClient(Arc::clone(sim))
}

/// With `health_probe_interval_s`: a prober for upstream `i`'s breaker,
/// spawned on the stack's runtime. Its probe is a chat request like any
/// other (the faithful probe: a completion), under the request id after the
/// last user request, classified like real calls.
fn spawn_health_probe(sim: &Arc<Sim>, i: usize, breaker: &Breaker) {
    let Some(interval) = sim.scenario.breaker_for(i).health_probe_interval else {
        return;
    };
    let probe_id = sim.probe_id();
    let model = sim.scenario.upstreams[i].name.clone();
    let mut prober =
        HealthProbe::builder(interval).seed(mix(sim.scenario.seed ^ 0x4ea1 ^ i as u64));
    if let Some(timeout) = sim.scenario.breaker_for(i).health_probe_timeout {
        prober = prober.timeout(timeout);
    }
    let prober = prober
        .build(client(sim), LlmClassifier::new(), move |_: &Breaker| {
            chat_request(probe_id, &model, &model, None)
        })
        .expect("a positive interval");
    tokio::spawn(prober.run(breaker.clone()));
}

/// The same for a keyed set: one prober for every key that is not closed,
/// asking the key's model.
fn spawn_keyed_health_probe(sim: &Arc<Sim>, set: &KeyedBreakers) {
    let Some(interval) = sim.scenario.breaker.health_probe_interval else {
        return;
    };
    let probe_id = sim.probe_id();
    let mut prober = HealthProbe::builder(interval).seed(mix(sim.scenario.seed ^ 0x4ea1));
    if let Some(timeout) = sim.scenario.breaker.health_probe_timeout {
        prober = prober.timeout(timeout);
    }
    let prober = prober
        .build(client(sim), LlmClassifier::new(), move |b: &Breaker| {
            let key = b.name().unwrap_or_default();
            let model = key.split('/').next().unwrap_or(key);
            let api_key = key.split_once('/').map(|(_, k)| k);
            chat_request(probe_id, model, key, api_key)
        })
        .expect("a positive interval");
    tokio::spawn(prober.run_keyed(set.clone()));
}

/// The client's retry: with `retry_budget_percent`, a budget of its own
/// (one per stack and replica, made on the stack's paused clock).
fn retry_policy(scenario: &Scenario) -> RetryPolicy<LlmClassifier> {
    let c = &scenario.client;
    let mut policy = RetryPolicy::new()
        .max_retries(c.max_retries)
        .backoff(c.backoff_base, c.backoff_max)
        .retry_after_cap(retry_after_cap(scenario))
        .retry_graded(c.retry_graded)
        .seed(scenario.seed);
    if let Some(percent) = c.retry_budget_percent {
        let budget = RetryBudget::new(percent).expect("the parser checked the percentage");
        policy = policy.budget(budget);
    }
    policy.with_classifier(LlmClassifier::new())
}

/// The client's stream deadlines (`ttft_timeout_s`, `stall_timeout_s`),
/// when it sets any.
pub fn stream_deadlines(scenario: &Scenario) -> Option<StreamDeadlines> {
    let c = &scenario.client;
    let mut d = StreamDeadlines::new();
    if let Some(t) = c.ttft_timeout {
        d = d.first_frame(t);
    }
    if let Some(t) = c.stall_timeout {
        d = d.stall(t);
    }
    (!d.is_empty()).then_some(d)
}

/// Every stack, boxed: with stream deadlines and without, the stacks have
/// different types.
pub type SimStack = BoxCloneService<Request<String>, Response<StackBody>, BoxError>;
pub type StackBody = UnsyncBoxBody<Bytes, BoxError>;

fn boxed<S, B>(service: S) -> SimStack
where
    S: Service<Request<String>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    BoxCloneService::new(
        service
            .map_response(|r: Response<B>| r.map(|b| b.map_err(Into::into).boxed_unsync()))
            .map_err(Into::into),
    )
}

/// The stream deadlines on a stack without a breaker: the crate keeps them
/// in its breaker's body wrapper, so a breaker that is disabled (it admits
/// every call and records nothing) carries them, and nothing else.
fn deadlines_only<S>(
    inner: S,
    deadlines: StreamDeadlines,
) -> Result<CircuitBreaker<S, LlmClassifier, Breaker, StreamDeadlines>, String> {
    let breaker = Breaker::builder()
        .build()
        .map_err(|e| format!("cannot build a deadline carrier: {e}"))?;
    breaker.disable();
    CircuitBreaker::with_classifier(inner, breaker, LlmClassifier::new())
        .stream_deadlines(deadlines)
        .map_err(|e| format!("the stream deadlines do not fit: {e}"))
}

fn retry_after_cap(scenario: &Scenario) -> Duration {
    match scenario.client.total_timeout {
        Some(total) => RETRY_AFTER_CAP.min(total / 2),
        None => RETRY_AFTER_CAP,
    }
}

/// Replica `r`'s name suffix: none for the first.
fn replica_suffix(r: u32) -> String {
    if r == 0 {
        String::new()
    } else {
        format!("#{}", r + 1)
    }
}

/// The scenario's breaker configuration for upstream `i` in replica `r`.
pub fn breaker_builder(
    scenario: &Scenario,
    i: usize,
    r: u32,
    log: &TransitionLog,
) -> Builder<Breaker> {
    let label: Arc<str> = format!("{}{}", scenario.upstreams[i].name, replica_suffix(r)).into();
    let seed = mix(scenario.seed ^ (i as u64 + 1)).wrapping_add(u64::from(r) << 32);
    let builder = configure(Breaker::builder(), scenario.breaker_for(i))
        .pace_rate_limits(scenario.breaker_for(i).pace_rate_limits)
        .name(&*label)
        .seed(seed);
    let log = Arc::clone(log);
    builder.on_transition(move |t: &Transition| lock(&log).push((t.at, Arc::clone(&label), t.to)))
}

thread_local! {
    /// The stack this thread builds opens all or nothing (`breaker-open`);
    /// every other stack grades.
    static ALL_OR_NOTHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Breaker settings on any builder (one breaker, or a keyed set).
fn configure<T: Build>(builder: Builder<T>, b: &BreakerConfig) -> Builder<T> {
    let mut builder = builder;
    if ALL_OR_NOTHING.get() || b.open_all_or_nothing {
        builder = builder.trip_mode(TripMode::Open);
    } else if let Some(&k) = crate::scenario::GRADED_K.get() {
        builder = builder.trip_mode(TripMode::Graded).graded_k(k);
    }
    let mut builder = builder
        .open_duration(b.open)
        .max_open_duration(b.open_max)
        .probes(b.probes)
        .close_after(b.close_after);
    if let Some((limit, period)) = b.volume_guard {
        builder = builder.volume_guard(limit, period);
    }
    if let Some(open_for) = b.quota_gate {
        builder = builder.quota_gate(open_for);
    }
    if let Some(timeout) = b.probe_timeout {
        builder = builder.probe_timeout(timeout);
    }
    builder = match b.window {
        WindowConfig::Off => builder.no_window(),
        WindowConfig::Count(n) => builder
            .count_window(n)
            .min_calls(b.min_calls)
            .failure_rate(b.failure_rate),
        WindowConfig::Time(span) => builder
            .time_window(span, TIME_BUCKETS)
            .min_calls(b.min_calls)
            .failure_rate(b.failure_rate),
    };
    if let Some(n) = b.consecutive_failures {
        builder = builder.consecutive_failures(n);
    }
    if let Some((threshold, rate)) = b.slow_call {
        builder = builder.slow_call(threshold, rate);
    }
    if b.no_in_flight_limit {
        builder = builder.no_in_flight_limit();
    }
    builder
}

fn no_breaker(sim: &Arc<Sim>) -> Result<SimStack, String> {
    let c = &sim.scenario.client;
    let attempt = Timeout::new(client(sim), c.attempt_timeout);
    let outer = ServiceBuilder::new()
        .option_layer(c.total_timeout.map(TimeoutLayer::new))
        .layer(RetryLayer::new(retry_policy(&sim.scenario)));
    Ok(match stream_deadlines(&sim.scenario) {
        None => boxed(outer.service(attempt)),
        Some(d) => boxed(
            outer
                .map_err(|e: tower_circuit_breaker::Error| BoxError::from(e))
                .service(deadlines_only(attempt, d)?),
        ),
    })
}

fn breaker(sim: &Arc<Sim>, log: &TransitionLog, replica: u32) -> Result<SimStack, String> {
    match &sim.scenario.spend {
        None => breaker_with(sim, log, replica, LlmClassifier::new()),
        Some(_) => breaker_with(sim, log, replica, crate::budget::meter(&sim.scenario)),
    }
}

fn breaker_with<C>(
    sim: &Arc<Sim>,
    log: &TransitionLog,
    replica: u32,
    classifier: C,
) -> Result<SimStack, String>
where
    C: crate::budget::SimClassifier,
{
    let scenario = &sim.scenario;
    let c = &scenario.client;
    let mut builder = Stack::builder()
        .attempt_timeout(c.attempt_timeout)
        .breaker(crate::budget::guard(
            breaker_builder(scenario, 0, replica, log),
            scenario,
        ))
        .max_retries(c.max_retries)
        .backoff(c.backoff_base, c.backoff_max)
        .retry_after_cap(retry_after_cap(scenario))
        .seed(scenario.seed)
        .classifier(classifier);
    if let Some(total) = c.total_timeout {
        builder = builder.total_timeout(total);
    }
    if c.retry_budget_percent.is_some() || c.retry_graded {
        builder = builder.retry(retry_policy(scenario));
    }
    let refused = |e| format!("the breaker stack does not accept this scenario: {e}");
    Ok(match stream_deadlines(scenario) {
        None => {
            let layer = builder.build().map_err(refused)?;
            spawn_health_probe(sim, 0, layer.breaker());
            boxed(layer.layer(client(sim)))
        }
        Some(d) => {
            let layer = builder.stream_deadlines(d).build().map_err(refused)?;
            spawn_health_probe(sim, 0, layer.breaker());
            boxed(layer.layer(client(sim)))
        }
    })
}

/// The breaker stack with keyed breakers: one per model (or model and API
/// key), each upstream's own settings for its keys.
fn keyed_breaker(sim: &Arc<Sim>, log: &TransitionLog, replica: u32) -> Result<SimStack, String> {
    match &sim.scenario.spend {
        None => keyed_breaker_with(sim, log, replica, LlmClassifier::new()),
        Some(_) => keyed_breaker_with(sim, log, replica, crate::budget::meter(&sim.scenario)),
    }
}

fn keyed_breaker_with<C>(
    sim: &Arc<Sim>,
    log: &TransitionLog,
    replica: u32,
    classifier: C,
) -> Result<SimStack, String>
where
    C: crate::budget::SimClassifier,
{
    let scenario = &sim.scenario;
    let c = &scenario.client;
    let suffix = replica_suffix(replica);
    let listener_log = Arc::clone(log);
    let mut builder = crate::budget::guard(
        configure(KeyedBreakers::builder(), &scenario.breaker)
            .pace_rate_limits(scenario.breaker.pace_rate_limits),
        scenario,
    )
    .seed(mix(scenario.seed ^ 1).wrapping_add(u64::from(replica) << 32))
    .on_transition(move |t: &Transition| {
        let key = t.key.as_deref().unwrap_or("(unkeyed)");
        lock(&listener_log).push((t.at, format!("{key}{suffix}").into(), t.to));
    });
    for (key, upstream) in &sim.keys {
        if scenario.upstreams[*upstream].breaker.is_some() {
            let config = scenario.breaker_for(*upstream).clone();
            builder = builder.override_key(key, move |b| {
                let pace = config.pace_rate_limits;
                configure(b, &config).pace_rate_limits(pace)
            });
        }
    }
    let set = builder
        .build()
        .map_err(|e| format!("the keyed breakers do not accept this scenario: {e}"))?;
    spawn_keyed_health_probe(sim, &set);
    // A request's backoff ends the moment its own key opens; the retry
    // after it is then rejected at once.
    let policy = retry_policy(scenario).watch_keyed(set.clone(), keyed::header(BREAKER_KEY));
    let outer = ServiceBuilder::new()
        .option_layer(c.total_timeout.map(TimeoutLayer::new))
        .map_err(|e: tower_circuit_breaker::Error| BoxError::from(e))
        .layer(RetryLayer::new(policy));
    let breakers =
        CircuitBreakerLayer::keyed(set, keyed::header(BREAKER_KEY)).with_classifier(classifier);
    let attempt = Timeout::new(client(sim), c.attempt_timeout);
    Ok(match stream_deadlines(scenario) {
        None => boxed(outer.layer(breakers).service(attempt)),
        Some(d) => {
            let breakers = breakers
                .stream_deadlines(d)
                .map_err(|e| format!("the stream deadlines do not fit: {e}"))?;
            boxed(outer.layer(breakers).service(attempt))
        }
    })
}

fn naive_failover(sim: &Arc<Sim>) -> Result<SimStack, String> {
    let scenario = &sim.scenario;
    let c = &scenario.client;
    let attempt = |sim: &Arc<Sim>| Timeout::new(client(sim), c.attempt_timeout);
    // The same chain of upstreams, each attempt wrapped by `route`.
    macro_rules! chain {
        ($route:expr) => {{
            let route = $route;
            let mut failover = Failover::new(route(attempt(sim))?)
                .jitter(Duration::ZERO, Duration::ZERO)
                .with_classifier(LlmClassifier::new());
            for upstream in &scenario.upstreams[1..] {
                let model = upstream.name.clone();
                failover = failover
                    .fallback_with(route(attempt(sim))?, move |req: &mut Request<String>| {
                        *req.body_mut() = chat_body(&model)
                    });
            }
            failover
        }};
    }
    let outer = ServiceBuilder::new()
        .option_layer(c.total_timeout.map(TimeoutLayer::new))
        .layer(RetryLayer::new(retry_policy(scenario)));
    Ok(match stream_deadlines(scenario) {
        None => boxed(outer.service(chain!(Ok::<_, String>))),
        Some(d) => boxed(
            outer
                .map_err(|e: tower_circuit_breaker::Error| BoxError::from(e))
                .service(chain!(|a| deadlines_only(a, d))),
        ),
    })
}

fn failover(sim: &Arc<Sim>, log: &TransitionLog, replica: u32) -> Result<SimStack, String> {
    failover_hedging(sim, log, replica, None)
}

fn failover_hedging(
    sim: &Arc<Sim>,
    log: &TransitionLog,
    replica: u32,
    hedge: Option<Hedge>,
) -> Result<SimStack, String> {
    failover_all_open(sim, log, replica, hedge, false)
}

/// The `hedged` stack: the failover stack with the scenario's `[hedge]`
/// policy (one per stack, made on the stack's paused clock).
fn hedged(sim: &Arc<Sim>, log: &TransitionLog) -> Result<SimStack, String> {
    let h = sim
        .scenario
        .hedge
        .ok_or("the `hedged` stack needs a `[hedge]` section")?;
    let policy = match h.delay {
        HedgeDelay::Fixed(delay) => Hedge::after(delay),
        HedgeDelay::Percentile {
            percentile,
            initial,
        } => Hedge::at_percentile(percentile, initial).map_err(|e| e.to_string())?,
    };
    let policy = policy
        .budget_percent(h.budget_percent)
        .map_err(|e| e.to_string())?;
    failover_hedging(sim, log, 0, Some(policy))
}

/// The failover stack; with `last_resort`, `AllOpen::last_resort` over its
/// breakers when every member rejected a call.
fn failover_all_open(
    sim: &Arc<Sim>,
    log: &TransitionLog,
    replica: u32,
    hedge: Option<Hedge>,
    last_resort: bool,
) -> Result<SimStack, String> {
    let scenario = &sim.scenario;
    let c = &scenario.client;
    let mut policy = retry_policy(scenario);
    let mut breakers = Vec::new();
    for i in 0..scenario.upstreams.len() {
        let breaker = breaker_builder(scenario, i, replica, log)
            .build()
            .map_err(|e| format!("the breaker does not accept this scenario: {e}"))?;
        policy = policy.watch_breaker(breaker.clone());
        spawn_health_probe(sim, i, &breaker);
        breakers.push(breaker);
    }
    let all_open = if last_resort {
        AllOpen::last_resort(breakers.clone())
    } else {
        AllOpen::FailFast
    };
    let outer = ServiceBuilder::new()
        .option_layer(c.total_timeout.map(TimeoutLayer::new))
        .map_err(|e: tower_circuit_breaker::Error| BoxError::from(e))
        .layer(RetryLayer::new(policy));
    // Each upstream behind its breaker, made a route by `route`.
    macro_rules! chain {
        ($route:expr) => {{
            let route = $route;
            let mut routes = Vec::new();
            for breaker in breakers {
                let attempt = Timeout::new(client(sim), c.attempt_timeout);
                routes.push(route(CircuitBreaker::with_classifier(
                    attempt,
                    breaker,
                    LlmClassifier::new(),
                ))?);
            }
            let mut routes = routes.into_iter();
            let primary = routes.next().expect("a scenario has an upstream");
            let mut failover = Failover::new(primary)
                .jitter(FAILOVER_JITTER.0, FAILOVER_JITTER.1)
                .seed(mix(scenario.seed ^ 0xfa11))
                .with_classifier(LlmClassifier::new());
            for (route, upstream) in routes.zip(&scenario.upstreams[1..]) {
                let model = upstream.name.clone();
                failover = failover.fallback_with(route, move |req: &mut Request<String>| {
                    *req.body_mut() = chat_body(&model)
                });
            }
            if let Some(hedge) = hedge.clone() {
                failover = failover.hedge(hedge);
            }
            failover.when_all_open(all_open.clone())
        }};
    }
    Ok(match stream_deadlines(scenario) {
        None => boxed(outer.service(chain!(Ok::<_, String>))),
        Some(d) => boxed(outer.service(chain!(|b: CircuitBreaker<_, _>| {
            b.stream_deadlines(d)
                .map_err(|e| format!("the stream deadlines do not fit: {e}"))
        }))),
    })
}

// === driving requests ===

async fn drive<S, B>(
    stacks: Vec<S>,
    sim: &Arc<Sim>,
    arrivals: &[Arrival],
) -> Result<Vec<RequestRecord>, String>
where
    S: Service<Request<String>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send,
    B: Body + Send + 'static,
    B::Data: Send,
{
    let start = sim.start;
    let scenario = &sim.scenario;
    let mut tasks = Vec::with_capacity(arrivals.len());
    for (id, arrival) in arrivals.iter().enumerate() {
        tokio::time::sleep_until(start + arrival.at).await;
        // The timer wheel wakes on whole milliseconds; a request arrives when
        // the driver actually sends it.
        let arrived = Instant::now();
        // Each replica serves every n-th request.
        let svc = stacks[id % stacks.len()].clone();
        let sim = Arc::clone(sim);
        let request = chat_request(
            id as u64,
            &scenario.upstreams[arrival.upstream].name,
            &arrival.key,
            arrival.api_key.as_deref(),
        );
        let class = arrival.class;
        let upstream = arrival.upstream;
        let patience = scenario.client.cancel.and_then(|(p, after)| {
            let u = unit(mix(mix(scenario.seed ^ 0xca9c_e100) ^ id as u64));
            (u < p).then_some(after)
        });
        tasks.push(tokio::spawn(async move {
            let call = async {
                match svc.oneshot(request).await {
                    Ok(response) => {
                        let head = Instant::now();
                        let ok = response.status().is_success();
                        let limited = response.status() == StatusCode::TOO_MANY_REQUESTS;
                        let body = response.into_body().collect().await.map(|b| b.to_bytes());
                        match body {
                            Ok(body) if ok && !contains(&body, b"event: error") => {
                                (Fate::Succeeded, head, false)
                            }
                            _ => (Fate::Failed, head, limited),
                        }
                    }
                    Err(error) => {
                        let error: BoxError = error.into();
                        if CircuitOpen::find(&*error).is_some() && sim.tries_of(id) == 0 {
                            (Fate::Rejected, Instant::now(), false)
                        } else {
                            (Fate::Failed, Instant::now(), false)
                        }
                    }
                }
            };
            // A user who gives up drops the call (and its body).
            let (fate, head, rate_limited, cancelled) = match patience {
                None => {
                    let (f, h, l) = call.await;
                    (f, h, l, false)
                }
                Some(after) => match tokio::time::timeout(after, call).await {
                    Ok((f, h, l)) => (f, h, l, false),
                    Err(_) => (Fate::Failed, Instant::now(), false, true),
                },
            };
            RequestRecord {
                arrival_s: (arrived - sim.start).as_secs_f64(),
                wait_s: (Instant::now() - arrived).as_secs_f64(),
                first_byte_s: (head - arrived).as_secs_f64(),
                fate,
                class,
                upstream,
                rate_limited,
                cancelled,
            }
        }));
    }
    let mut fates = Vec::with_capacity(tasks.len());
    for task in tasks {
        fates.push(
            task.await
                .map_err(|e| format!("a request task failed: {e}"))?,
        );
    }
    Ok(fates)
}

fn summarize(
    kind: StackKind,
    sim: &Sim,
    requests: Vec<RequestRecord>,
    log: &TransitionLog,
) -> StackRun {
    let scenario = &sim.scenario;
    let upstreams = &scenario.upstreams;
    let reachable = if kind.uses_fallbacks() || scenario.has_mix() {
        upstreams.len()
    } else {
        1
    };
    let names: Vec<String> = upstreams[..reachable]
        .iter()
        .map(|u| u.name.clone())
        .collect();
    let mut attempts = sim.attempts();
    // Attempts of one request run one after the other: the answer a user
    // got came from the request's last attempt.
    let mut last = vec![None; requests.len()];
    for (i, a) in attempts.iter_mut().enumerate() {
        // An attempt that waited in a queue and never started generates
        // nothing.
        let generated = if a.served {
            scenario.billing.generated(a.kind, a.ran)
        } else {
            0.0
        };
        // A health probe asks for one token: billed as the input and one
        // token (one request's price under per-request pricing).
        a.probe = a.request >= requests.len();
        let price = if a.probe {
            upstreams[a.upstream].probe_cost
        } else {
            upstreams[a.upstream].cost
        };
        a.cost_usd = price.billed(generated);
        a.cost_hangs_unbilled_usd = if matches!(a.kind, Kind::Hang) {
            0.0
        } else {
            a.cost_usd
        };
        if let Some(slot) = last.get_mut(a.request) {
            *slot = Some(i);
        }
    }
    if kind == StackKind::Hedged {
        hedge_winners(&attempts, &mut last);
    }
    for (r, i) in requests.iter().zip(last) {
        if let (Fate::Succeeded, Some(i)) = (r.fate, i) {
            attempts[i].answered = true;
        }
    }
    let transitions: Vec<TransitionRecord> = lock(log)
        .iter()
        .map(|(at, label, to)| TransitionRecord {
            t_s: (*at - sim.start).as_secs_f64(),
            upstream: label.to_string(),
            to: to.as_str(),
        })
        .collect();
    let deadline = scenario.client.deadline.map(|d| d.as_secs_f64());
    let heals = scenario.heals();
    let outage = scenario
        .outage()
        .map(|(from, to)| (from.as_secs_f64(), to.as_secs_f64()));
    let within = scenario.answer_within();
    let windows = |class: Option<usize>| {
        let of = |w| Figures::of_class(&names, &requests, &attempts, w, class, deadline);
        // A class answered by a key's own script has that key's outage and
        // heal.
        let own = class.and_then(|c| sim.class_keys.get(c).copied().flatten());
        let (outage, heals) = match own {
            None => (outage, heals.clone()),
            Some((u, k)) => {
                let key = &upstreams[u].keys[k];
                let outage = key.failing_from(within).map(|from| {
                    let to = key
                        .healed_at(within)
                        .filter(|&heal| heal > from)
                        .unwrap_or(scenario.duration);
                    (from.as_secs_f64(), to.as_secs_f64())
                });
                let mut heals = heals.clone();
                heals[u] = key.failing_from(within).and_then(|from| {
                    let heal = key.healed_at(within)?;
                    (heal > from && heal < scenario.duration).then_some(heal.as_secs_f64())
                });
                (outage, heals)
            }
        };
        ClassRun {
            all: of((0.0, f64::INFINITY)),
            outage: outage.map(of),
            after_heal: Figures::after_heal(&names, &requests, &attempts, &heals, class, deadline),
        }
    };
    let classes = requests.iter().map(|r| r.class + 1).max().unwrap_or(0);
    let whole = windows(None);
    StackRun {
        by_class: if classes > 1 {
            (0..classes).map(|c| windows(Some(c))).collect()
        } else {
            Vec::new()
        },
        requests: requests.clone(),
        name: kind.name(),
        all: whole.all,
        outage: whole.outage,
        after_heal: whole.after_heal,
        recovery: (0..reachable)
            .map(|i| {
                let r = Recovery::of(scenario, i, &transitions);
                let probed = !matches!(kind, StackKind::NoBreaker | StackKind::NaiveFailover);
                match (
                    probed,
                    scenario.breaker_for(i).health_probe_interval,
                    r.healed_at_s,
                ) {
                    (true, Some(interval), Some(heal)) => {
                        r.with_bound(interval, verdicts_after(&attempts, i, heal))
                    }
                    _ => r,
                }
            })
            .collect(),
        transitions,
        attempt_log: attempts,
        breaker_failures: routing::breaker_failures(),
    }
}

/// The times to a verdict (the response head) of the users' attempts on
/// upstream `i` that started at or after its heal and were answered.
fn verdicts_after(attempts: &[AttemptRecord], i: usize, heal: f64) -> Vec<f64> {
    attempts
        .iter()
        .filter(|a| a.upstream == i && !a.probe && a.served && !a.failed && a.t_s >= heal)
        .map(|a| a.ran.as_secs_f64())
        .collect()
}

/// In the `hedged` stack two attempts of a request overlap, and the one
/// that answered is the one whose head came (the other was cancelled before
/// its own), not always the last to start.
fn hedge_winners(attempts: &[AttemptRecord], last: &mut [Option<usize>]) {
    let head_came = |a: &AttemptRecord| a.kind.latency().is_some_and(|l| a.served && a.ran >= l);
    let ends = |a: &AttemptRecord| a.t_s + a.ran.as_secs_f64();
    // Per request, the attempt whose head came last (a fallback's answer
    // after the primary's 503).
    let mut heads: Vec<Option<usize>> = vec![None; last.len()];
    for (i, a) in attempts.iter().enumerate() {
        if let (true, Some(slot)) = (head_came(a), heads.get_mut(a.request))
            && slot.is_none_or(|j| ends(&attempts[j]) <= ends(a))
        {
            *slot = Some(i);
        }
    }
    for (slot, head) in last.iter_mut().zip(heads) {
        if head.is_some() {
            *slot = head;
        }
    }
}

// === the simulated upstreams ===

/// The upstreams of one replay: the crate's scripted upstreams, one per
/// scenario upstream, logging to one log.
struct Sim {
    scenario: Arc<Scenario>,
    start: Instant,
    upstreams: Vec<ScriptedUpstream>,
    /// Per upstream, its keys' own scripted upstreams (`[[upstream.key]]`),
    /// in the order of its keys.
    keyed: Vec<Vec<ScriptedUpstream>>,
    /// Per class of traffic, the upstream and key whose own script answers
    /// it, if any: its ground truth is that key's.
    class_keys: Vec<Option<(usize, usize)>>,
    log: AttemptLog,
    /// How many requests the traffic sends; the health probes use the id
    /// after the last.
    requests: usize,
    /// Every breaker key of the traffic, with its upstream.
    keys: Vec<(String, usize)>,
}

impl Sim {
    fn new(scenario: Arc<Scenario>, arrivals: &[Arrival]) -> Result<Self, String> {
        let tokens = stream_deadlines(&scenario).is_some();
        let log = AttemptLog::new();
        let upstreams = scenario
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let script = u
                    .script(
                        scenario.seed,
                        i,
                        scenario.duration,
                        tokens,
                        scenario.spend.is_some(),
                    )
                    .map_err(|e| format!("upstream {:?} cannot be scripted: {e}", u.name))?;
                Ok(ScriptedUpstream::with_log(script, log.clone()))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let keyed = scenario
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| {
                (0..u.keys.len())
                    .map(|k| {
                        let stream = i as u64 + ((k as u64 + 1) << 16);
                        let script = u
                            .script_of(
                                Some(k),
                                scenario.seed,
                                stream,
                                scenario.duration,
                                tokens,
                                scenario.spend.is_some(),
                            )
                            .map_err(|e| {
                                format!(
                                    "key {:?} of upstream {:?} cannot be scripted: {e}",
                                    u.keys[k].name, u.name
                                )
                            })?;
                        Ok(ScriptedUpstream::with_log(script, log.clone()))
                    })
                    .collect::<Result<Vec<_>, String>>()
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut class_keys: Vec<Option<(usize, usize)>> = Vec::new();
        for a in arrivals {
            if class_keys.len() <= a.class {
                class_keys.resize(a.class + 1, None);
            }
            class_keys[a.class] = a
                .api_key
                .as_deref()
                .and_then(|k| scenario.upstreams[a.upstream].key(k))
                .map(|k| (a.upstream, k));
        }
        let mut keys: Vec<(String, usize)> = Vec::new();
        for a in arrivals {
            if !keys.iter().any(|(k, _)| **k == *a.key) {
                keys.push((a.key.to_string(), a.upstream));
            }
        }
        Ok(Sim {
            start: Instant::now(),
            upstreams,
            keyed,
            class_keys,
            log,
            requests: arrivals.len(),
            keys,
            scenario,
        })
    }

    /// The request id of the health probes: the one after the last request.
    /// Each probe is that request's next attempt, drawn like any other.
    fn probe_id(&self) -> u64 {
        self.requests as u64
    }

    /// Attempts of `request` that reached any upstream.
    fn tries_of(&self, request: usize) -> u32 {
        self.log.attempts_of(request as u64)
    }

    /// Every attempt, as the report reads them.
    fn attempts(&self) -> Vec<AttemptRecord> {
        self.log
            .attempts()
            .into_iter()
            .map(|a| AttemptRecord {
                served: a.served,
                t_s: a.at.as_secs_f64(),
                upstream: self
                    .scenario
                    .upstreams
                    .iter()
                    .position(|u| *u.name == *a.upstream)
                    .unwrap_or(0),
                request: a.request as usize,
                failed: a.answer.is_failure(),
                kind: a.answer,
                ran: a.ran,
                cost_usd: 0.0,
                cost_hangs_unbilled_usd: 0.0,
                probe: false,
                answered: false,
            })
            .collect()
    }
}

/// The HTTP client of the replay: it routes by the `model` in the request
/// body to that upstream, so a fallback to another upstream is a request
/// rewrite on the same client.
#[derive(Clone)]
struct SimClient(Arc<Sim>);

type SimBody = ScriptedBody;
type SimFuture = Pin<Box<dyn Future<Output = Result<Response<SimBody>, BoxError>> + Send>>;

impl Service<Request<String>> for SimClient {
    type Response = Response<SimBody>;
    type Error = BoxError;
    type Future = SimFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<String>) -> SimFuture {
        let sim = &self.0;
        let known = request
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|id| id <= sim.requests);
        let upstream = model_of(request.body())
            .and_then(|m| sim.scenario.upstreams.iter().position(|u| u.name == m));
        match (known, upstream) {
            (true, Some(upstream)) => {
                let own = api_key_of(&request)
                    .and_then(|k| sim.scenario.upstreams[upstream].key(k))
                    .map(|k| &sim.keyed[upstream][k]);
                let target = own.unwrap_or(&sim.upstreams[upstream]);
                Box::pin(target.clone().call(request))
            }
            _ => Box::pin(async {
                let mut response = Response::new(ScriptedBody::from(Bytes::from_static(
                    br#"{"error":"unknown model"}"#,
                )));
                *response.status_mut() = StatusCode::NOT_FOUND;
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                Ok(response)
            }),
        }
    }
}

/// The API key a request is sent with (`authorization: Bearer KEY`).
fn api_key_of<B>(request: &Request<B>) -> Option<&str> {
    request
        .headers()
        .get(AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// The header that carries a request's breaker key.
const BREAKER_KEY: &str = "x-breaker-key";

/// A chat completion request for `model`, numbered `id`, with its breaker
/// key.
fn chat_request(id: u64, model: &str, key: &str, api_key: Option<&str>) -> Request<String> {
    let mut request = Request::new(chat_body(model));
    if let Ok(key) = HeaderValue::from_str(key) {
        request.headers_mut().insert(BREAKER_KEY, key);
    }
    if let Some(Ok(auth)) = api_key.map(|k| HeaderValue::from_str(&format!("Bearer {k}"))) {
        request.headers_mut().insert(AUTHORIZATION, auth);
    }
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static("http://llm.invalid/v1/chat/completions");
    request
        .headers_mut()
        .insert(REQUEST_ID, HeaderValue::from(id));
    request
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    request
}

fn chat_body(model: &str) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"Summarise this chapter."}}]}}"#
    )
}

fn model_of(body: &str) -> Option<&str> {
    let rest = body.split_once(r#""model":""#)?.1;
    rest.split_once('"').map(|(model, _)| model)
}

// === helpers ===

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

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
