//! The rows of the report: which breaker, which path, and how to set it up.
//!
//! Every breaker gets the same configuration, as far as it can express it:
//! the last [`WINDOW`] calls, opening at [`FAILURE_RATE`] failures once the
//! window is full, open for [`OPEN`], [`PROBES`] half-open probes. Where a
//! peer has no count window it gets its closest time-based equivalent over
//! [`OPEN`] with a minimum of [`WINDOW`] calls (said on its builder below).
//! Breakers are built and, for the open rows, tripped before anything is
//! timed; the timed loop only calls.
//!
//! The services are built by the `pub fn`s below, which the callgrind loops
//! (`src/callgrind.rs`) share; call them inside a Tokio runtime's context.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};
use tower::util::{MapResult, ServiceFn};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::failover::{Hedge, Selection};
use tower_circuit_breaker::keyed::{self, Key, KeyedBreakers};
use tower_circuit_breaker::spend::{Period, SpendGuard};
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, Failover, Outcome, State, TripMode};

use crate::adapters;
use crate::measure::{now_or_never, poll_calls, Expect, Plan, Request};

/// Calls in the window.
pub const WINDOW: u32 = 20;
/// Failure rate that opens the circuit.
pub const FAILURE_RATE: f64 = 0.5;
/// How long the circuit stays open (long enough to outlast any run); also
/// the span of the time windows.
pub const OPEN: Duration = Duration::from_secs(30);
/// Half-open probes.
pub const PROBES: u32 = 3;
/// Buckets of this crate's time window.
pub const BUCKETS: u32 = 20;
/// The slow-call threshold: far above the calls' time, so no call is slow.
pub const SLOW: Duration = Duration::from_secs(60);
/// One call in this many fails on the failing rows (2 %).
pub const FAIL_EVERY: u64 = 50;
/// The name of the named breakers.
pub const NAME: &str = "gpt-4o";
/// Keys live in the set while the timed calls run.
pub const KEYS: usize = 10_000;
/// The key of the hot-key rows.
pub const HOT_KEY: &str = "model-4242";

/// The service type every builder below returns: called with `()`,
/// answering an `http::Response`, erring with `$err`.
macro_rules! bench_service {
    ($err:ty) => {
        impl Service<
                Request,
                Response = Response<impl Send + 'static>,
                Error = $err,
                Future = impl Send + 'static,
            > + Clone
            + Send
            + 'static
    };
}

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
    /// The inner service alone, answering 503 on every 50th call: the floor
    /// under the 2 % rows.
    BareFailing,
    /// The inner service alone, answering a 200 with
    /// `content-type: application/json`: the floor under the classifier
    /// rows (the header map allocates).
    BareJson,
    /// Closed circuit, healthy upstream: admit, call, record a success.
    Closed,
    /// Closed circuit, every 50th call answered with a 503 (recorded as a
    /// failure; the circuit stays closed).
    ClosedFailing,
    /// Closed, `HttpClassifier` on a JSON 200.
    HttpJson,
    /// Closed, `LlmClassifier` on a JSON 200.
    LlmJson,
    /// Closed, with the slow-call rule on at [`SLOW`]: no call is slow.
    SlowRule,
    /// Closed, with a time window of [`OPEN`] in [`BUCKETS`] buckets.
    TimeWindow,
    /// Closed, the classical breaker: opening outright, no in-flight
    /// limit, no ramp ([`ours_classic`]).
    Classic,
    /// Closed, a spend guard on and never reached ([`ours_spend`]).
    Spend,
    /// The recommended `stack::Stack` (retry → breaker → attempt timeout)
    /// over a closed circuit ([`stack_closed`]).
    StackClosed,
    /// A failover of two closed breakers, the primary answering
    /// ([`ours_failover`]).
    Failover,
    /// [`Failover`](Path::Failover) with peak-EWMA selection.
    FailoverSelection,
    /// [`Failover`](Path::Failover) hedging after [`SLOW`]: no hedge sent.
    FailoverHedge,
    /// Open circuit: reject without calling the inner service.
    Open,
    /// Open circuit of a breaker named [`NAME`].
    OpenNamed,
    /// The recommended `stack::Stack` (retry → breaker → attempt timeout)
    /// over an open circuit: rejected, the retry stops, the error boxed.
    StackOpen,
    /// Half-open with every probe slot taken: reject.
    HalfOpenFull,
    /// Half-open with a free slot: admit a probe, call, record. The upstream
    /// answers 400 (ignored), so each probe gives its slot back and the
    /// circuit stays half-open.
    HalfOpenProbe,
    /// Closed circuit, keyed breakers holding 10,000 keys, every call on
    /// the same key: take the key, look its breaker up, admit, call, record.
    KeyedHot,
    /// Closed, keyed breakers holding 10,000 keys, calls rotating over all
    /// of them.
    KeyedRotating,
    /// Keyed breakers holding 10,000 keys, every call on the one key that
    /// is open: rejected.
    KeyedOpen,
    /// Closed, with a health prober spawned on the same runtime for the
    /// breaker: what a configured prober costs the closed path.
    ClosedProber,
    /// Open, with a health prober spawned (its next probe is a minute away):
    /// what it costs the open path.
    OpenProber,
}

impl Path {
    /// Short description, as in the report.
    pub const fn label(self) -> &'static str {
        match self {
            Path::Bare => "answering at once",
            Path::BareErr => "failing at once",
            Path::BareFailing => "answering, every 50th a 503",
            Path::BareJson => "answering a JSON 200",
            Path::Closed => "closed",
            Path::ClosedFailing => "closed, 2 % failing (every 50th a 503)",
            Path::HttpJson => "closed, HttpClassifier, JSON 200",
            Path::LlmJson => "closed, LlmClassifier, JSON 200",
            Path::SlowRule => "closed, slow-call rule on (60 s)",
            Path::TimeWindow => "closed, time window (30 s)",
            Path::Classic => "closed, classical (no grading, limit, ramp)",
            Path::Spend => "closed, spend guard on",
            Path::StackClosed => "closed, through stack::Stack",
            Path::Failover => "failover of two, primary answering",
            Path::FailoverSelection => "failover of two, peak-EWMA selection",
            Path::FailoverHedge => "failover of two, hedging (none sent)",
            Path::Open => "open",
            Path::OpenNamed => "open, named breaker",
            Path::StackOpen => "open, through stack::Stack",
            Path::HalfOpenFull => "half-open, all probes out",
            Path::HalfOpenProbe => "half-open, probe admitted",
            Path::KeyedHot => "closed, keyed, one hot key of 10,000",
            Path::KeyedRotating => "closed, keyed, rotating over 10,000 keys",
            Path::KeyedOpen => "open, keyed, one open key of 10,000",
            Path::ClosedProber => "closed, health prober spawned",
            Path::OpenProber => "open, health prober spawned",
        }
    }

    /// What every call on this path must end in.
    pub const fn expect(self) -> Expect {
        match self {
            Path::BareErr
            | Path::Open
            | Path::OpenNamed
            | Path::StackOpen
            | Path::HalfOpenFull
            | Path::KeyedOpen
            | Path::OpenProber => Expect::Rejected,
            Path::BareFailing | Path::ClosedFailing => {
                Expect::AdmittedFailing { every: FAIL_EVERY }
            }
            _ => Expect::Admitted,
        }
    }

    /// The bare service this path's "added" figures are measured over:
    /// what the breaker adds to the same inner service (for the rejecting
    /// paths, to a service failing at once). `None` for the floors.
    pub const fn floor(self) -> Option<Path> {
        match self {
            Path::Bare | Path::BareErr | Path::BareFailing | Path::BareJson => None,
            Path::ClosedFailing => Some(Path::BareFailing),
            Path::HttpJson | Path::LlmJson => Some(Path::BareJson),
            Path::Open
            | Path::OpenNamed
            | Path::StackOpen
            | Path::HalfOpenFull
            | Path::KeyedOpen
            | Path::OpenProber => Some(Path::BareErr),
            _ => Some(Path::Bare),
        }
    }

    /// Another path of this crate the budget compares this one with (what
    /// the feature costs over the plain path), if any.
    pub const fn over(self) -> Option<Path> {
        match self {
            Path::LlmJson => Some(Path::HttpJson),
            Path::SlowRule
            | Path::TimeWindow
            | Path::Classic
            | Path::Spend
            | Path::StackClosed
            | Path::Failover
            | Path::KeyedHot
            | Path::KeyedRotating
            | Path::ClosedProber => Some(Path::Closed),
            Path::OpenNamed | Path::KeyedOpen | Path::OpenProber => Some(Path::Open),
            Path::FailoverSelection | Path::FailoverHedge => Some(Path::Failover),
            _ => None,
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

/// Builds a service with `build` inside the plan's runtime context (outside
/// any timed section), then measures it on `path`.
fn built<S>(
    plan: &Plan<'_>,
    path: Path,
    build: impl FnOnce() -> Result<S, String>,
) -> Result<f64, String>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Result<S::Response, S::Error>: crate::measure::Judge,
{
    let svc = {
        let _runtime = plan.rt.enter();
        build()?
    };
    plan.drive(svc, path.expect())
}

/// A row function measuring `$build()` on `$path`.
macro_rules! row {
    ($breaker:ident, $path:ident, $build:expr) => {
        Row::new(Breaker::$breaker, Path::$path, |plan| {
            built(plan, Path::$path, $build)
        })
    };
}

/// Every row, in report order.
pub fn all() -> Vec<Row> {
    vec![
        row!(Bare, Bare, || Ok(upstream::<Infallible>(StatusCode::OK))),
        row!(Bare, BareErr, || Ok(failing())),
        row!(Bare, BareFailing, || Ok(failing_every::<Infallible>())),
        row!(Bare, BareJson, || Ok(json_upstream())),
        // === this crate ===
        row!(Ours, Closed, ours_closed),
        row!(Ours, ClosedFailing, ours_closed_failing),
        row!(Ours, HttpJson, ours_http_json),
        row!(Ours, LlmJson, ours_llm_json),
        row!(Ours, SlowRule, ours_slow),
        row!(Ours, TimeWindow, ours_time_window),
        row!(Ours, Classic, ours_classic),
        row!(Ours, Spend, ours_spend),
        row!(Ours, StackClosed, stack_closed),
        row!(Ours, Failover, || ours_failover(FailoverWith::Nothing)),
        row!(Ours, FailoverSelection, || ours_failover(
            FailoverWith::Selection
        )),
        row!(Ours, FailoverHedge, || ours_failover(FailoverWith::Hedge)),
        row!(Ours, Open, || ours_open(None)),
        row!(Ours, OpenNamed, || ours_open(Some(NAME))),
        row!(Ours, StackOpen, stack_open),
        Row::new(Breaker::Ours, Path::HalfOpenFull, ours_half_open_full),
        Row::new(Breaker::Ours, Path::HalfOpenProbe, ours_half_open_probe),
        Row::new(Breaker::Ours, Path::ClosedProber, |plan| {
            ours_with_prober(plan, false)
        }),
        Row::new(Breaker::Ours, Path::OpenProber, |plan| {
            ours_with_prober(plan, true)
        }),
        // === keyed breakers ===
        row!(Ours, KeyedHot, || Ok(keyed_service(keyed_set()?))),
        row!(Ours, KeyedRotating, || Ok(keyed_rotating(keyed_set()?))),
        row!(Ours, KeyedOpen, keyed_open),
        // === peers ===
        row!(Failsafe, Closed, || Ok(failsafe_closed(upstream::<
            Infallible,
        >(
            StatusCode::OK
        )))),
        row!(Failsafe, ClosedFailing, || Ok(failsafe_closed(
            fails_on_5xx(failing_every())
        ))),
        // failsafe has only time windows: its closed row already is one.
        row!(Failsafe, TimeWindow, || Ok(failsafe_closed(upstream::<
            Infallible,
        >(
            StatusCode::OK
        )))),
        row!(Failsafe, Open, failsafe_open),
        row!(Recloser, Closed, || Ok(recloser_closed(upstream::<
            Infallible,
        >(
            StatusCode::OK
        )))),
        row!(Recloser, ClosedFailing, || Ok(recloser_closed(
            fails_on_5xx(failing_every())
        ))),
        row!(Recloser, Open, recloser_open),
        row!(TowerResilience, Closed, || Ok(tower_resilience(
            Tr::default(),
            upstream(StatusCode::OK)
        ))),
        row!(TowerResilience, ClosedFailing, || Ok(tower_resilience(
            Tr::default(),
            failing_every()
        ))),
        row!(TowerResilience, SlowRule, || Ok(tower_resilience(
            Tr::SLOW,
            upstream(StatusCode::OK)
        ))),
        row!(TowerResilience, TimeWindow, || Ok(tower_resilience(
            Tr::TIME_WINDOW,
            upstream(StatusCode::OK)
        ))),
        row!(TowerResilience, Open, || tower_resilience_open(
            Tr::default()
        )),
        row!(TowerResilience, OpenNamed, || tower_resilience_open(
            Tr::NAMED
        )),
        row!(Seatbelt, Closed, || Ok(seatbelt(
            "bench",
            upstream(StatusCode::OK)
        ))),
        row!(Seatbelt, ClosedFailing, || Ok(seatbelt(
            "bench",
            failing_every()
        ))),
        // seatbelt has only time windows: its closed row already is one.
        row!(Seatbelt, TimeWindow, || Ok(seatbelt(
            "bench",
            upstream(StatusCode::OK)
        ))),
        row!(Seatbelt, Open, || seatbelt_open("bench")),
        // seatbelt names every breaker; the same path under our name.
        row!(Seatbelt, OpenNamed, || seatbelt_open(NAME)),
    ]
}

// === the inner services ===

/// The trivial upstream every row wraps: a `service_fn` answering `status`
/// at once, with an empty body (an empty `String` does not allocate).
pub fn upstream<E>(
    status: StatusCode,
) -> ServiceFn<impl Fn(Request) -> Ready<Result<Response<String>, E>> + Clone + Send + Sync + 'static>
{
    upstream_for::<Request, E>(status)
}

/// [`upstream`] for requests of type `R`.
pub fn upstream_for<R, E>(
    status: StatusCode,
) -> ServiceFn<impl Fn(R) -> Ready<Result<Response<String>, E>> + Clone + Send + Sync + 'static> {
    service_fn(move |_req: R| {
        let mut res = Response::new(String::new());
        *res.status_mut() = status;
        ready(Ok(res))
    })
}

/// [`upstream`] behind tower's `MapResponse` doing nothing: the cost of a
/// middleware with a future of its own, and no logic. A reference for the
/// callgrind table (what wrapping the call costs before any breaker work).
pub fn passthrough() -> bench_service!(Infallible) {
    upstream::<Infallible>(StatusCode::OK).map_response(|res: Response<String>| res)
}

/// A body wrapped in a struct the size of this crate's response body
/// wrapper (the body and a 40-byte permit), doing nothing with it.
#[derive(Debug)]
pub struct Wrapped<B> {
    /// The inner body.
    pub inner: B,
    /// Stands for the permit a deferred verdict keeps.
    pub held: [u64; 5],
}

/// [`passthrough`], rebuilding the response around a [`Wrapped`] body: the
/// moves a middleware that changes the body type makes, and no logic.
pub fn passthrough_wrapped() -> bench_service!(Infallible) {
    upstream::<Infallible>(StatusCode::OK).map_response(|res: Response<String>| {
        res.map(|inner| Wrapped {
            inner,
            held: [0; 5],
        })
    })
}

/// A service failing at once with a zero-sized error.
pub fn failing() -> bench_service!(Rejected) {
    service_fn(|_req: Request| ready(Err::<Response<String>, Rejected>(Rejected)))
}

/// [`upstream`] answering 503 on every [`FAIL_EVERY`]th call made on its
/// thread, 200 otherwise. The count is per thread, not per service:
/// tower-resilience clones the inner service for every call, and a shared
/// counter would be one more contended cache line in the 16-task shape.
pub fn failing_every<E>(
) -> ServiceFn<impl Fn(Request) -> Ready<Result<Response<String>, E>> + Clone + Send + Sync + 'static>
{
    thread_local! {
        static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    service_fn(|_req: Request| {
        let calls = CALLS.with(|c| {
            let n = c.get() + 1;
            c.set(n);
            n
        });
        let mut res = Response::new(String::new());
        if calls.is_multiple_of(FAIL_EVERY) {
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        ready(Ok(res))
    })
}

/// [`upstream`] answering a 200 with `content-type: application/json`, as
/// a chat completion that is not streamed. The body is not read by anyone
/// here; both classifiers judge such an answer on its head.
pub fn json_upstream() -> ServiceFn<
    impl Fn(Request) -> Ready<Result<Response<String>, Infallible>> + Clone + Send + Sync + 'static,
> {
    service_fn(|_req: Request| {
        let mut res = Response::new(String::new());
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        ready(Ok::<_, Infallible>(res))
    })
}

/// A 5xx answer turned into an `Err`, for the peers that see only
/// `Ok`/`Err` (recloser and failsafe): how their users make them count one.
/// It keeps the status only; the answer is dropped.
#[derive(Debug, Clone, Copy)]
pub struct ServerError(pub StatusCode);

impl From<Infallible> for ServerError {
    fn from(e: Infallible) -> Self {
        match e {}
    }
}

type Fails5xx = fn(Result<Response<String>, Infallible>) -> Result<Response<String>, ServerError>;

/// `svc` with its 5xx answers turned into [`ServerError`]s.
pub fn fails_on_5xx<S>(svc: S) -> MapResult<S, Fails5xx>
where
    S: Service<Request, Response = Response<String>, Error = Infallible>,
{
    svc.map_result(|result| match result {
        Ok(res) if res.status().is_server_error() => Err(ServerError(res.status())),
        Ok(res) => Ok(res),
        Err(e) => match e {},
    })
}

// === this crate ===

/// This crate's builder with the common configuration, open for `open`.
pub fn ours_builder(open: Duration) -> tower_circuit_breaker::Builder<CircuitBreakerLayer> {
    CircuitBreakerLayer::builder()
        .count_window(WINDOW)
        .min_calls(WINDOW)
        .failure_rate(FAILURE_RATE)
        .open_duration(open)
        .probes(PROBES)
        .close_after(2)
        // Held probes must not reach their deadline in the middle of a run.
        .probe_timeout(Duration::from_secs(3600))
}

/// This crate with the common configuration, open for `open`.
pub fn ours_layer(open: Duration) -> CircuitBreakerLayer {
    ours_builder(open).build().expect("a valid configuration")
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

/// Closed, healthy upstream.
pub fn ours_closed() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    Ok(ours_layer(OPEN).layer(upstream::<Infallible>(StatusCode::OK)))
}

/// Closed, the breaker named and in shared mode with a live Redis backend
/// (`REDIS_URL`, by default `redis://127.0.0.1:6379/`), whose task runs on
/// a runtime of its own. Its exchanges are an hour apart, so the loops
/// measure the calls alone: an exchange costs per flush, not per call.
///
/// # Errors
///
/// When Redis does not answer, or the backend does not reach shared mode
/// within 10 s.
#[cfg(feature = "redis")]
pub fn ours_closed_shared() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    use tower_circuit_breaker::redis::{Backend, Client};
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let layer = ours_builder(OPEN)
        .name(format!("bench-shared-{}", std::process::id()))
        .build()
        .map_err(|e| e.to_string())?;
    let client = Client::open(url.as_str()).map_err(|e| format!("{url}: {e}"))?;
    let hour = Duration::from_secs(3600);
    let backend = Backend::builder(client)
        .prefix("tcb-bench")
        .flush_interval(hour)
        .resync_interval(hour)
        .build()
        .map_err(|e| e.to_string())?;
    // The backend's task lives as long as the process.
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?,
    ));
    let attachment = {
        let _in = rt.enter();
        backend.attach(layer.breaker()).map_err(|e| e.to_string())?
    };
    let shared = rt.block_on(async {
        for _ in 0..1000 {
            if attachment.is_shared() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    });
    if !shared {
        return Err(format!("no shared state through {url} within 10 s"));
    }
    std::mem::forget(attachment);
    Ok(layer.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// Closed, every 50th call a 503.
pub fn ours_closed_failing() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    Ok(ours_layer(OPEN).layer(failing_every::<Infallible>()))
}

/// Closed, `HttpClassifier` (the default) on a JSON 200.
pub fn ours_http_json() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    Ok(ours_layer(OPEN).layer(json_upstream()))
}

/// Closed, `LlmClassifier` on a JSON 200.
pub fn ours_llm_json() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    Ok(ours_layer(OPEN)
        .with_classifier(LlmClassifier::new())
        .layer(json_upstream()))
}

/// Closed, slow-call rule on at [`SLOW`] (50 % of the window): no call is
/// slow.
pub fn ours_slow() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    let layer = ours_builder(OPEN)
        .slow_call(SLOW, FAILURE_RATE)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(layer.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// Closed, a time window of [`OPEN`] in [`BUCKETS`] buckets (instead of
/// the count window), at least [`WINDOW`] calls.
pub fn ours_time_window() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    let layer = ours_builder(OPEN)
        .time_window(OPEN, BUCKETS)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(layer.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// Closed, the classical breaker: a trip rule that fires opens the circuit
/// outright ([`TripMode::Open`] instead of graded admission), no in-flight
/// limit, no ramp after recovery. What this crate's defaults (graded
/// admission, the in-flight limit, the ramp) cost the closed path is
/// [`ours_closed`] over this.
pub fn ours_classic() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    let layer = ours_builder(OPEN)
        .trip_mode(TripMode::Open)
        .no_in_flight_limit()
        .ramp(Duration::ZERO)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(layer.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// Closed, with a spend guard that is never reached: [`SPEND_BUDGET`] per
/// rolling hour, every call charged [`UNKNOWN_COST`] as it completes (the
/// `HttpClassifier` reads no usage, so each call costs what one of unknown
/// usage is charged).
pub fn ours_spend() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    let guard = SpendGuard::micro_dollars(SPEND_BUDGET, Period::Rolling(Duration::from_secs(3600)))
        .unknown_cost(UNKNOWN_COST);
    let layer = ours_builder(OPEN)
        .spend_guard(guard)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(layer.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// The spend rows' budget, in millionths of a dollar: $1 billion an hour,
/// which no run reaches.
pub const SPEND_BUDGET: u64 = 1_000_000_000_000_000;
/// What the spend rows charge a call: 20 cents.
pub const UNKNOWN_COST: u64 = 200_000;

/// A request that carries the fallback mark, as an `http::Request` does in
/// its extensions: what a [`Failover`] hands its members, marking every
/// one but the last.
#[derive(Debug, Clone, Copy, Default)]
pub struct Call {
    fallback: bool,
}

impl tower_circuit_breaker::Fallback for Call {
    #[inline]
    fn has_fallback(&self) -> bool {
        self.fallback
    }

    #[inline]
    fn mark_fallback(&mut self) {
        self.fallback = true;
    }
}

/// What a failover row adds to a plain failover of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverWith {
    /// Nothing: the primary is tried first, then the fallback.
    Nothing,
    /// Peak-EWMA selection of the member tried first.
    Selection,
    /// Hedging after [`SLOW`], which no call reaches.
    Hedge,
}

/// A [`Failover`] of two closed breakers of the common configuration, each
/// over a healthy upstream: every call is answered by the member tried
/// first, admitted with a fallback. With `with`, selection or hedging on.
pub fn ours_failover(
    with: FailoverWith,
) -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    let (a, b) = (ours_layer(OPEN), ours_layer(OPEN));
    let failover =
        Failover::<_, Call>::new(a.layer(upstream_for::<Call, Infallible>(StatusCode::OK)))
            .fallback(b.layer(upstream_for::<Call, Infallible>(StatusCode::OK)));
    let failover = match with {
        FailoverWith::Nothing => failover,
        FailoverWith::Selection => failover
            .select(Selection::peak_ewma([
                a.breaker().clone(),
                b.breaker().clone(),
            ]))
            .map_err(|e| e.to_string())?,
        FailoverWith::Hedge => failover.hedge(Hedge::after(SLOW)),
    };
    Ok(failover.map_request(|(): Request| Call::default()))
}

/// Open, tripped with real failures; named `name` if given.
pub fn ours_open(
    name: Option<&str>,
) -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    let builder = ours_builder(OPEN);
    let builder = match name {
        Some(name) => builder.name(name),
        None => builder,
    };
    let layer = builder.build().map_err(|e| e.to_string())?;
    trip(layer.breaker())?;
    if layer.breaker().name() != name {
        return Err(format!("the breaker is named {:?}", layer.breaker().name()));
    }
    Ok(layer.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// The recommended stack (retry → breaker → attempt timeout, defaults but
/// for the common breaker configuration), its breaker tripped: every call
/// rejected, the retry stopping at once, the error a `BoxError`.
pub fn stack_open() -> Result<bench_service!(BoxError), String> {
    let layer = stack_layer()?;
    trip(layer.breaker())?;
    Ok(layer.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// [`stack_open`]'s stack, closed over a healthy upstream: each call goes
/// through the retry policy (with no retry budget, the default), is
/// admitted, sent under the attempt timeout and recorded.
pub fn stack_closed() -> Result<bench_service!(BoxError), String> {
    Ok(stack_layer()?.layer(upstream::<Infallible>(StatusCode::OK)))
}

/// The recommended stack with the common breaker configuration.
fn stack_layer() -> Result<tower_circuit_breaker::StackLayer, String> {
    Stack::builder()
        .breaker(
            tower_circuit_breaker::Breaker::builder()
                .count_window(WINDOW)
                .min_calls(WINDOW)
                .failure_rate(FAILURE_RATE)
                .open_duration(OPEN)
                .probes(PROBES)
                .close_after(2),
        )
        .build()
        .map_err(|e| e.to_string())
}

/// A breaker of its own open duration, tripped and waited out on the plan's
/// runtime, so that the next admission starts a half-open cycle. The wait is
/// real time, spent in set-up.
fn ours_half_open(plan: &Plan<'_>) -> Result<CircuitBreakerLayer, String> {
    let open = Duration::from_millis(2);
    let layer = ours_layer(open);
    {
        let _runtime = plan.rt.enter();
        trip(layer.breaker())?;
    }
    plan.block_on(async { tokio::time::sleep(open * 10).await });
    Ok(layer)
}

/// The closed or open row, with a health prober for the breaker spawned on
/// the plan's runtime for the whole measurement.
fn ours_with_prober(plan: &Plan<'_>, open: bool) -> Result<f64, String> {
    use tower_circuit_breaker::classify::HttpClassifier;
    use tower_circuit_breaker::health::HealthProbe;
    let layer = ours_layer(OPEN);
    if open {
        trip(layer.breaker())?;
    }
    let probed = tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, Infallible>(http::Response::new(String::new()))
    });
    let prober = HealthProbe::builder(Duration::from_secs(60))
        .build(
            probed,
            HttpClassifier,
            |_: &tower_circuit_breaker::Breaker| http::Request::new(String::new()),
        )
        .map_err(|e| e.to_string())?;
    let task = plan.rt.spawn(prober.run(layer.breaker().clone()));
    let path = if open {
        Path::OpenProber
    } else {
        Path::ClosedProber
    };
    let result = plan.drive(
        layer.layer(upstream::<Infallible>(StatusCode::OK)),
        path.expect(),
    );
    task.abort();
    result
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
    let result = plan.drive(svc, Path::HalfOpenFull.expect());
    drop(probes);
    result
}

fn ours_half_open_probe(plan: &Plan<'_>) -> Result<f64, String> {
    let layer = ours_half_open(plan)?;
    let breaker = layer.breaker().clone();
    let svc = layer.layer(upstream::<Infallible>(StatusCode::BAD_REQUEST));
    let result = plan.drive(svc, Path::HalfOpenProbe.expect())?;
    match breaker.state() {
        State::HalfOpen => Ok(result),
        other => Err(format!("expected to stay half-open, got {other}")),
    }
}

// === keyed breakers ===

/// The [`KEYS`] key names, `model-0` to `model-9999`, made once.
pub fn key_names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| (0..KEYS).map(|i| format!("model-{i}")).collect())
}

/// A keyed set holding [`KEYS`] keys, each of which has seen [`WINDOW`]
/// successes: every key's window is full before anything is timed, as the
/// unkeyed closed rows' is after their first calls, so the rotating rows
/// measure the lookup and not 10,000 windows filling up.
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
    for _ in 0..WINDOW {
        for name in key_names() {
            let permit = set
                .admit(name)
                .map_err(|e| format!("a healthy key was rejected: {e}"))?;
            permit.record(Outcome::Success);
        }
    }
    if set.len() != KEYS {
        return Err(format!("the set holds {} keys, not {KEYS}", set.len()));
    }
    Ok(set)
}

/// The upstream behind `set`, every call looking up [`HOT_KEY`] (the
/// request carries none, so the key function names it).
pub fn keyed_service(set: KeyedBreakers) -> bench_service!(tower_circuit_breaker::Error) {
    let key = keyed::from_fn(|_: &Request| Some(Key::from(HOT_KEY)));
    CircuitBreakerLayer::keyed(set, key).layer(upstream::<Infallible>(StatusCode::OK))
}

/// A key name as the request: what [`Rotate`] hands the keyed layer.
#[derive(Debug, Clone, Copy)]
pub struct KeyName(&'static str);

/// A bare key name has no fallback.
impl tower_circuit_breaker::Fallback for KeyName {
    #[inline]
    fn has_fallback(&self) -> bool {
        false
    }

    #[inline]
    fn mark_fallback(&mut self) {}
}

fn key_of(name: &KeyName) -> Option<Key<'_>> {
    Some(Key::from(name.0))
}

/// The upstream behind `set`, the calls rotating over all [`KEYS`] keys:
/// [`Rotate`] hands each call the next key name, borrowed.
pub fn keyed_rotating(set: KeyedBreakers) -> bench_service!(tower_circuit_breaker::Error) {
    let layer = CircuitBreakerLayer::keyed(set, keyed::from_fn(key_of));
    Rotate::new(layer.layer(upstream_for::<KeyName, Infallible>(StatusCode::OK)))
}

/// [`ours_closed`]'s breaker, unkeyed, behind the same [`Rotate`] as
/// [`keyed_rotating`]: what handing each call the next key name costs
/// without any keys, so that the keyed row can be read over it.
pub fn closed_rotating() -> bench_service!(tower_circuit_breaker::Error) {
    Rotate::new(ours_layer(OPEN).layer(upstream_for::<KeyName, Infallible>(StatusCode::OK)))
}

/// [`keyed_service`] with [`HOT_KEY`] tripped: every call rejected.
pub fn keyed_open() -> Result<bench_service!(tower_circuit_breaker::Error), String> {
    let set = keyed_set()?;
    // The key's window is full of successes: it opens within a window.
    for _ in 0..WINDOW {
        match set.admit(HOT_KEY) {
            Ok(permit) => permit.record(Outcome::Failure),
            Err(_) => break,
        }
    }
    match set.get(HOT_KEY).map(|b| b.state()) {
        Some(State::Open) => Ok(keyed_service(set)),
        other => Err(format!("the tripped key is {other:?}, not open")),
    }
}

/// Calls `inner` with the key names in turn, one per call. A clone starts
/// [`Rotate::STRIDE`] names after the one it was cloned from, so clones on
/// different tasks do not walk the keys in step.
#[derive(Debug)]
pub struct Rotate<S> {
    inner: S,
    names: &'static [String],
    next: usize,
}

impl<S> Rotate<S> {
    /// How far apart clones start.
    pub const STRIDE: usize = 617;

    /// Wraps `inner`, starting at the first key.
    pub fn new(inner: S) -> Self {
        Rotate {
            inner,
            names: key_names(),
            next: 0,
        }
    }
}

impl<S: Clone> Clone for Rotate<S> {
    fn clone(&self) -> Self {
        Rotate {
            inner: self.inner.clone(),
            names: self.names,
            next: (self.next + Self::STRIDE) % self.names.len(),
        }
    }
}

impl<S: Service<KeyName>> Service<Request> for Rotate<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, (): Request) -> S::Future {
        let name = self.names[self.next].as_str();
        self.next += 1;
        if self.next == self.names.len() {
            self.next = 0;
        }
        self.inner.call(KeyName(name))
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

/// failsafe over `inner`, closed.
pub fn failsafe_closed<S, E>(inner: S) -> bench_service!(failsafe::Error<E>)
where
    S: Service<Request, Response = Response<String>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Send + 'static,
{
    adapters::Failsafe::new(inner, failsafe_breaker())
}

/// failsafe, open.
pub fn failsafe_open() -> Result<bench_service!(failsafe::Error<Infallible>), String> {
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
    Ok(adapters::Failsafe::new(
        upstream::<Infallible>(StatusCode::OK),
        breaker,
    ))
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

/// recloser over `inner`, closed.
pub fn recloser_closed<S, E>(inner: S) -> bench_service!(recloser::Error<E>)
where
    S: Service<Request, Response = Response<String>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Send + 'static,
{
    adapters::Recloser::new(inner, recloser_breaker())
}

/// recloser, tripped with real failures.
pub fn recloser_open() -> Result<bench_service!(recloser::Error<Infallible>), String> {
    let breaker = recloser_breaker();
    for _ in 0..WINDOW * 2 {
        let _ = now_or_never(breaker.call(ready(Err::<(), ()>(()))));
    }
    Ok(adapters::Recloser::new(
        upstream::<Infallible>(StatusCode::OK),
        breaker,
    ))
}

// === tower-resilience-circuitbreaker 0.14 ===

/// What tower-resilience is configured with beyond the common settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tr {
    /// A time window of [`OPEN`] instead of the count window.
    pub time_window: bool,
    /// The slow-call rule at [`SLOW`], 50 %.
    pub slow: bool,
    /// The breaker's name.
    pub name: Option<&'static str>,
}

impl Tr {
    /// A time window.
    pub const TIME_WINDOW: Tr = Tr {
        time_window: true,
        slow: false,
        name: None,
    };
    /// The slow-call rule on.
    pub const SLOW: Tr = Tr {
        time_window: false,
        slow: true,
        name: None,
    };
    /// Named [`NAME`].
    pub const NAMED: Tr = Tr {
        time_window: false,
        slow: false,
        name: Some(NAME),
    };
}

/// tower-resilience over `inner`, classifying 5xx answers as failures.
pub fn tower_resilience<S>(
    tr: Tr,
    inner: S,
) -> bench_service!(tower_resilience_circuitbreaker::CircuitBreakerError<Infallible>)
where
    S: Service<Request, Response = Response<String>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let mut builder = tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(FAILURE_RATE)
        .sliding_window_size(WINDOW as usize)
        .minimum_number_of_calls(WINDOW as usize)
        .wait_duration_in_open(OPEN)
        .permitted_calls_in_half_open(PROBES as usize);
    if tr.time_window {
        builder = builder
            .sliding_window_type(tower_resilience_circuitbreaker::SlidingWindowType::TimeBased)
            .sliding_window_duration(OPEN);
    }
    if tr.slow {
        builder = builder
            .slow_call_duration_threshold(SLOW)
            .slow_call_rate_threshold(FAILURE_RATE);
    }
    if let Some(name) = tr.name {
        builder = builder.name(name);
    }
    builder
        .classify_response(|res: &Response<String>| res.status().is_server_error())
        .build()
        .expect("a valid configuration")
        .layer(inner)
}

/// tower-resilience, tripped with real failures (the upstream answers 503).
pub fn tower_resilience_open(
    tr: Tr,
) -> Result<bench_service!(tower_resilience_circuitbreaker::CircuitBreakerError<Infallible>), String>
{
    let mut svc = tower_resilience(tr, upstream(StatusCode::SERVICE_UNAVAILABLE));
    poll_calls(&mut svc, u64::from(WINDOW) * 2);
    Ok(svc)
}

// === seatbelt 0.11 ===
//
// No count window: failure rate over a time window with a minimum
// throughput of WINDOW calls. It runs on a `tick` clock driven by Tokio.

/// seatbelt makes the rejection itself, so the error type must be one it can
/// make (without allocating).
#[derive(Debug, Clone, Copy)]
pub struct Rejected;

/// seatbelt over `inner`, named `name`, classifying 5xx answers as failures.
pub fn seatbelt<S>(name: &'static str, inner: S) -> bench_service!(Rejected)
where
    S: Service<Request, Response = Response<String>, Error = Rejected>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let clock = tick::Clock::new_tokio();
    let context =
        seatbelt::ResilienceContext::<Request, Result<Response<String>, Rejected>>::new(&clock);
    seatbelt::breaker::Breaker::layer(name, &context)
        .recovery_with(|res: &Result<Response<String>, Rejected>, _| match res {
            Ok(res) if !res.status().is_server_error() => seatbelt::RecoveryInfo::never(),
            _ => seatbelt::RecoveryInfo::retry(),
        })
        .rejected_input_error(|_, _| Rejected)
        .failure_threshold(FAILURE_RATE as f32)
        .min_throughput(WINDOW)
        .sampling_duration(OPEN)
        .break_duration(OPEN)
        .layer(inner)
}

/// seatbelt, tripped with real failures (the upstream answers 503).
pub fn seatbelt_open(name: &'static str) -> Result<bench_service!(Rejected), String> {
    let mut svc = seatbelt(name, upstream(StatusCode::SERVICE_UNAVAILABLE));
    poll_calls(&mut svc, u64::from(WINDOW) * 2);
    Ok(svc)
}
