//! The rows of the report: which breaker, which path, and how to set it up.
//!
//! Every breaker gets the same configuration, as far as it can express it:
//! the last [`WINDOW`] calls, opening at [`FAILURE_RATE`] failures once the
//! window is full, open for [`OPEN`], [`PROBES`] half-open probes. Where a
//! peer has no count window it gets its closest time-based equivalent over
//! [`OPEN`] with a minimum of [`WINDOW`] calls (said on its builder below).
//! Breakers are built and, for the open rows, tripped before anything is
//! timed; the timed loop only calls.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;

use http::{Response, StatusCode};
use tower::util::ServiceFn;
use tower::{service_fn, Layer, Service};
use tower_circuit_breaker::keyed::{self, Key, KeyedBreakers};
use tower_circuit_breaker::{CircuitBreakerLayer, Outcome, ResponseBody, State};

use crate::adapters;
use crate::measure::{call_loop, Expect, Plan, Request};

/// Calls in the window.
pub const WINDOW: u32 = 20;
/// Failure rate that opens the circuit.
pub const FAILURE_RATE: f64 = 0.5;
/// How long the circuit stays open (long enough to outlast any run).
pub const OPEN: Duration = Duration::from_secs(30);
/// Half-open probes.
pub const PROBES: u32 = 3;

/// Which breaker a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    /// No breaker: the inner `service_fn` alone.
    Bare,
    /// This crate.
    Ours,
    /// failsafe 1.3.
    Failsafe,
    /// recloser 1.4.
    Recloser,
    /// tower-resilience-circuitbreaker 0.14.
    TowerResilience,
    /// seatbelt 0.11.
    Seatbelt,
}

impl Breaker {
    /// The peers, in report order.
    pub const PEERS: [Breaker; 4] = [
        Breaker::Failsafe,
        Breaker::Recloser,
        Breaker::TowerResilience,
        Breaker::Seatbelt,
    ];

    /// Name and version, as in the report.
    pub const fn label(self) -> &'static str {
        match self {
            Breaker::Bare => "service_fn",
            Breaker::Ours => "tower-circuit-breaker",
            Breaker::Failsafe => "failsafe 1.3",
            Breaker::Recloser => "recloser 1.4",
            Breaker::TowerResilience => "tower-resilience 0.14",
            Breaker::Seatbelt => "seatbelt 0.11",
        }
    }
}

/// Which path through the breaker a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The inner service alone.
    Bare,
    /// A service failing at once with a zero-sized error: the floor under
    /// every rejecting row (the loop, the ready future, the `Err`).
    BareErr,
    /// Closed circuit, healthy upstream: admit, call, record a success.
    Closed,
    /// Open circuit: reject without calling the inner service.
    Open,
    /// Half-open with every probe slot taken: reject.
    HalfOpenFull,
    /// Half-open with a free slot: admit a probe, call, record. The upstream
    /// answers 400 (ignored), so each probe gives its slot back and the
    /// circuit stays half-open.
    HalfOpenProbe,
    /// Closed circuit, keyed breakers holding 10,000 keys: take the key,
    /// look its breaker up, admit, call, record.
    KeyedClosed,
}

impl Path {
    /// Short description, as in the report.
    pub const fn label(self) -> &'static str {
        match self {
            Path::Bare => "answering at once",
            Path::BareErr => "failing at once",
            Path::Closed => "closed",
            Path::Open => "open",
            Path::HalfOpenFull => "half-open, all probes out",
            Path::HalfOpenProbe => "half-open, probe admitted",
            Path::KeyedClosed => "closed, keyed (10,000 keys)",
        }
    }
}

/// One row: a breaker on one path.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The breaker measured.
    pub breaker: Breaker,
    /// The path measured.
    pub path: Path,
    run: fn(&Plan<'_>) -> Result<f64, String>,
}

impl Row {
    const fn new(breaker: Breaker, path: Path, run: fn(&Plan<'_>) -> Result<f64, String>) -> Row {
        Row { breaker, path, run }
    }

    /// `"<breaker>: <path>"`.
    pub fn name(&self) -> String {
        format!("{}: {}", self.breaker.label(), self.path.label())
    }

    /// Builds the row's service and measures it as `plan` says.
    pub fn run(&self, plan: &Plan<'_>) -> Result<f64, String> {
        (self.run)(plan)
    }
}

/// Every row, in report order.
pub fn all() -> Vec<Row> {
    use Breaker::*;
    vec![
        Row::new(Bare, Path::Bare, bare),
        Row::new(Bare, Path::BareErr, bare_err),
        // === this crate ===
        Row::new(Ours, Path::Closed, ours_closed),
        Row::new(Ours, Path::Open, ours_open),
        Row::new(Ours, Path::HalfOpenFull, ours_half_open_full),
        Row::new(Ours, Path::HalfOpenProbe, ours_half_open_probe),
        // === keyed breakers ===
        Row::new(Ours, Path::KeyedClosed, ours_keyed_closed),
        // === peers ===
        Row::new(Failsafe, Path::Closed, failsafe_closed),
        Row::new(Failsafe, Path::Open, failsafe_open),
        Row::new(Recloser, Path::Closed, recloser_closed),
        Row::new(Recloser, Path::Open, recloser_open),
        Row::new(TowerResilience, Path::Closed, tower_resilience_closed),
        Row::new(TowerResilience, Path::Open, tower_resilience_open),
        Row::new(Seatbelt, Path::Closed, seatbelt_closed),
        Row::new(Seatbelt, Path::Open, seatbelt_open),
    ]
}

// === the inner service ===

/// The trivial upstream every row wraps: a `service_fn` answering `status`
/// at once, with an empty body (an empty `String` does not allocate).
pub fn upstream<E>(
    status: StatusCode,
) -> ServiceFn<impl Fn(Request) -> Ready<Result<Response<String>, E>> + Clone + Send + Sync + 'static>
{
    service_fn(move |_req: Request| {
        let mut res = Response::new(String::new());
        *res.status_mut() = status;
        ready(Ok(res))
    })
}

fn bare(plan: &Plan<'_>) -> Result<f64, String> {
    plan.drive(upstream::<Infallible>(StatusCode::OK), Expect::Admitted)
}

fn bare_err(plan: &Plan<'_>) -> Result<f64, String> {
    let svc = service_fn(|_req: Request| ready(Err::<Response<String>, Rejected>(Rejected)));
    plan.drive(svc, Expect::Rejected)
}

// === this crate ===

/// This crate with the common configuration, open for `open`.
pub fn ours_layer(open: Duration) -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder()
        .count_window(WINDOW)
        .min_calls(WINDOW)
        .failure_rate(FAILURE_RATE)
        .open_duration(open)
        .probes(PROBES)
        .close_after(2)
        // Held probes must not run out of lease in the middle of a run.
        .probe_lease(Duration::from_secs(3600))
        .build()
        .expect("a valid configuration")
}

/// Trips the breaker with real failures through its own state machine,
/// inside the plan's runtime as a call's future would.
fn trip_ours(plan: &Plan<'_>, breaker: &tower_circuit_breaker::Breaker) -> Result<(), String> {
    let _runtime = plan.rt.enter();
    trip(breaker)
}

/// Trips the breaker with a window of real failures.
pub fn trip(breaker: &tower_circuit_breaker::Breaker) -> Result<(), String> {
    for _ in 0..WINDOW {
        let permit = breaker
            .admit()
            .map_err(|e| format!("closed breaker rejected: {e}"))?;
        permit.record(Outcome::Failure);
    }
    match breaker.state() {
        State::Open => Ok(()),
        other => Err(format!("tripped breaker is {other}, not open")),
    }
}

fn ours_closed(plan: &Plan<'_>) -> Result<f64, String> {
    let svc = ours_layer(OPEN).layer(upstream::<Infallible>(StatusCode::OK));
    plan.drive(svc, Expect::Admitted)
}

/// Keys live in the set while the timed calls run.
pub const KEYS: usize = 10_000;

/// A keyed set holding [`KEYS`] keys, each of which has seen one success.
pub fn keyed_set() -> Result<KeyedBreakers, String> {
    let set = KeyedBreakers::builder()
        .count_window(WINDOW)
        .min_calls(WINDOW)
        .failure_rate(FAILURE_RATE)
        .open_duration(OPEN)
        .probes(PROBES)
        .close_after(2)
        .max_keys(KEYS)
        .build()
        .map_err(|e| e.to_string())?;
    for i in 0..KEYS {
        let permit = set
            .admit(&format!("model-{i}"))
            .map_err(|e| format!("a fresh key was rejected: {e}"))?;
        permit.record(Outcome::Success);
    }
    if set.len() != KEYS {
        return Err(format!("the set holds {} keys, not {KEYS}", set.len()));
    }
    Ok(set)
}

/// The upstream behind `set`, every call looking up one of its keys (the
/// request carries none, so the key function names it).
pub fn keyed_service(
    set: KeyedBreakers,
) -> impl Service<
    Request,
    Response = Response<ResponseBody<String>>,
    Error = tower_circuit_breaker::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    let key = keyed::from_fn(|_: &Request| Some(Key::from("model-4242")));
    CircuitBreakerLayer::keyed(set, key).layer(upstream::<Infallible>(StatusCode::OK))
}

fn ours_keyed_closed(plan: &Plan<'_>) -> Result<f64, String> {
    let set = {
        let _runtime = plan.rt.enter();
        keyed_set()?
    };
    plan.drive(keyed_service(set), Expect::Admitted)
}

fn ours_open(plan: &Plan<'_>) -> Result<f64, String> {
    let layer = ours_layer(OPEN);
    trip_ours(plan, layer.breaker())?;
    let svc = layer.layer(upstream::<Infallible>(StatusCode::OK));
    plan.drive(svc, Expect::Rejected)
}

/// A breaker of its own open duration, tripped and waited out on the plan's
/// runtime, so that the next admission starts a half-open cycle. The wait is
/// real time, spent in set-up.
fn ours_half_open(plan: &Plan<'_>) -> Result<CircuitBreakerLayer, String> {
    let open = Duration::from_millis(2);
    let layer = ours_layer(open);
    trip_ours(plan, layer.breaker())?;
    plan.block_on(async { tokio::time::sleep(open * 10).await });
    Ok(layer)
}

fn ours_half_open_full(plan: &Plan<'_>) -> Result<f64, String> {
    let layer = ours_half_open(plan)?;
    let breaker = layer.breaker().clone();
    let probes: Vec<_> = (0..PROBES)
        .map(|_| breaker.admit().map_err(|e| format!("probe rejected: {e}")))
        .collect::<Result<_, _>>()?;
    if breaker.state() != State::HalfOpen {
        return Err(format!("expected half-open, got {}", breaker.state()));
    }
    let svc = layer.layer(upstream::<Infallible>(StatusCode::OK));
    let result = plan.drive(svc, Expect::Rejected);
    drop(probes);
    result
}

fn ours_half_open_probe(plan: &Plan<'_>) -> Result<f64, String> {
    let layer = ours_half_open(plan)?;
    let breaker = layer.breaker().clone();
    let svc = layer.layer(upstream::<Infallible>(StatusCode::BAD_REQUEST));
    let result = plan.drive(svc, Expect::Admitted)?;
    match breaker.state() {
        State::HalfOpen => Ok(result),
        other => Err(format!("expected to stay half-open, got {other}")),
    }
}

// === failsafe 1.3 ===
//
// No count window: the closest policy is its success rate (an exponentially
// weighted moving average) over a time window, with a minimum of WINDOW
// calls in it; it opens below a 50 % success rate.

type FailsafePolicy =
    failsafe::failure_policy::SuccessRateOverTimeWindow<failsafe::backoff::Constant>;

fn failsafe_breaker() -> failsafe::StateMachine<FailsafePolicy, ()> {
    let policy = failsafe::failure_policy::success_rate_over_time_window(
        1.0 - FAILURE_RATE,
        WINDOW,
        OPEN,
        failsafe::backoff::constant(OPEN),
    );
    failsafe::Config::new().failure_policy(policy).build()
}

fn failsafe_closed(plan: &Plan<'_>) -> Result<f64, String> {
    let svc = adapters::Failsafe::new(upstream::<Infallible>(StatusCode::OK), failsafe_breaker());
    plan.drive(svc, Expect::Admitted)
}

fn failsafe_open(plan: &Plan<'_>) -> Result<f64, String> {
    // The policy refuses to trip before one whole window has passed since it
    // was made. Build and trip it under failsafe's own frozen clock moved
    // past the window; the open circuit then runs on the real clock (its
    // `until` lies a window and an open duration ahead of real time).
    let breaker = failsafe::clock::freeze(|clock| {
        let breaker = failsafe_breaker();
        clock.advance(OPEN + Duration::from_secs(1));
        for _ in 0..WINDOW * 2 {
            breaker.on_error();
        }
        breaker
    });
    if breaker.is_call_permitted() {
        return Err("failsafe did not open".into());
    }
    let svc = adapters::Failsafe::new(upstream::<Infallible>(StatusCode::OK), breaker);
    plan.drive(svc, Expect::Rejected)
}

// === recloser 1.4 ===

/// recloser with the common configuration.
pub fn recloser_breaker() -> recloser::AsyncRecloser {
    recloser::Recloser::custom()
        .error_rate(FAILURE_RATE as f32)
        .closed_len(WINDOW as usize)
        .half_open_len(PROBES as usize)
        .open_wait(OPEN)
        .build()
        .into()
}

fn recloser_closed(plan: &Plan<'_>) -> Result<f64, String> {
    let svc = adapters::Recloser::new(upstream::<Infallible>(StatusCode::OK), recloser_breaker());
    plan.drive(svc, Expect::Admitted)
}

fn recloser_open(plan: &Plan<'_>) -> Result<f64, String> {
    let breaker = recloser_breaker();
    plan.block_on(async {
        for _ in 0..WINDOW * 2 {
            let _ = breaker.call(ready(Err::<(), ()>(()))).await;
        }
    });
    let svc = adapters::Recloser::new(upstream::<Infallible>(StatusCode::OK), breaker);
    plan.drive(svc, Expect::Rejected)
}

// === tower-resilience-circuitbreaker 0.14 ===

fn tower_resilience_service(
    status: StatusCode,
) -> impl tower::Service<Request, Response = Response<String>, Error = impl Send, Future = impl Send>
       + Clone
       + Send
       + 'static {
    tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(FAILURE_RATE)
        .sliding_window_size(WINDOW as usize)
        .minimum_number_of_calls(WINDOW as usize)
        .wait_duration_in_open(OPEN)
        .permitted_calls_in_half_open(PROBES as usize)
        .classify_response(|res: &Response<String>| res.status().is_server_error())
        .build()
        .expect("a valid configuration")
        .layer(upstream::<Infallible>(status))
}

fn tower_resilience_closed(plan: &Plan<'_>) -> Result<f64, String> {
    plan.drive(tower_resilience_service(StatusCode::OK), Expect::Admitted)
}

fn tower_resilience_open(plan: &Plan<'_>) -> Result<f64, String> {
    // Tripped with real failures: the upstream answers 503.
    let mut svc = tower_resilience_service(StatusCode::SERVICE_UNAVAILABLE);
    plan.block_on(call_loop(&mut svc, u64::from(WINDOW) * 2));
    plan.drive(svc, Expect::Rejected)
}

// === seatbelt 0.11 ===
//
// No count window: failure rate over a time window with a minimum
// throughput of WINDOW calls. It runs on a `tick` clock driven by Tokio.

/// seatbelt makes the rejection itself, so the error type must be one it can
/// make (without allocating).
#[derive(Debug, Clone, Copy)]
pub struct Rejected;

fn seatbelt_service(
    plan: &Plan<'_>,
    status: StatusCode,
) -> impl tower::Service<Request, Response = Response<String>, Error = Rejected, Future = impl Send>
       + Clone
       + Send
       + 'static {
    let _runtime = plan.rt.enter();
    let clock = tick::Clock::new_tokio();
    let context =
        seatbelt::ResilienceContext::<Request, Result<Response<String>, Rejected>>::new(&clock);
    seatbelt::breaker::Breaker::layer("bench", &context)
        .recovery_with(|res: &Result<Response<String>, Rejected>, _| match res {
            Ok(res) if !res.status().is_server_error() => seatbelt::RecoveryInfo::never(),
            _ => seatbelt::RecoveryInfo::retry(),
        })
        .rejected_input_error(|_, _| Rejected)
        .failure_threshold(FAILURE_RATE as f32)
        .min_throughput(WINDOW)
        .sampling_duration(OPEN)
        .break_duration(OPEN)
        .layer(upstream::<Rejected>(status))
}

fn seatbelt_closed(plan: &Plan<'_>) -> Result<f64, String> {
    plan.drive(seatbelt_service(plan, StatusCode::OK), Expect::Admitted)
}

fn seatbelt_open(plan: &Plan<'_>) -> Result<f64, String> {
    // Tripped with real failures: the upstream answers 503.
    let mut svc = seatbelt_service(plan, StatusCode::SERVICE_UNAVAILABLE);
    plan.block_on(call_loop(&mut svc, u64::from(WINDOW) * 2));
    plan.drive(svc, Expect::Rejected)
}
