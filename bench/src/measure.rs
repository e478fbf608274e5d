//! How a row is driven: the two shapes, the call loop, timing and
//! allocation counting.

use std::future::Future;
use std::hint::black_box;
use std::time::Instant;

use tokio::runtime::Runtime;
use tower::{Service, ServiceExt};

use crate::alloc;

/// The request every row sends. The breakers never look at it, and building
/// an `http::Request` would add the same hundred-odd instructions to every
/// row alike, blurring the differences this report is about.
pub type Request = ();

/// Tasks in the many-task shape.
pub const TASKS: u64 = 16;
/// Worker threads of the many-task shape's runtime.
pub const WORKERS: usize = 2;
/// Calls made before anything is timed or counted (split across tasks).
pub const WARM_UP: u64 = 4_096;
/// Calls over which allocations are counted (split across tasks).
pub const ALLOC_CALLS: u64 = 16_384;

/// How the calls are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One task calls and awaits in a loop on a current-thread runtime.
    OneTask,
    /// [`TASKS`] tasks, each with its own clone of the service (one shared
    /// breaker), on a multi-thread runtime with [`WORKERS`] workers. The
    /// figure is wall time divided by the calls of all tasks.
    ManyTasks,
}

impl Shape {
    /// Both shapes, in report order.
    pub const ALL: [Shape; 2] = [Shape::OneTask, Shape::ManyTasks];

    /// `"1-task"` or `"16-tasks"`, as in the report.
    pub const fn label(self) -> &'static str {
        match self {
            Shape::OneTask => "1-task",
            Shape::ManyTasks => "16-tasks",
        }
    }

    /// Parses a [`label`](Self::label).
    pub fn from_label(s: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|shape| shape.label() == s)
    }

    /// A fresh runtime of this shape, with the time driver on.
    pub fn runtime(self) -> Runtime {
        let mut builder = match self {
            Shape::OneTask => tokio::runtime::Builder::new_current_thread(),
            Shape::ManyTasks => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(WORKERS);
                b
            }
        };
        builder.enable_time().build().expect("a tokio runtime")
    }
}

/// What a row's calls must end in; checked on every run, so a row that
/// silently measured the wrong path fails instead of reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Every call reaches the inner service and succeeds.
    Admitted,
    /// Every call reaches the inner service; one call in `every` (the
    /// inner service counts its own calls) ends in a failure: a 5xx answer,
    /// or the error a peer that sees only `Ok`/`Err` was given for it.
    AdmittedFailing {
        /// One call in this many fails.
        every: u64,
    },
    /// Every call is rejected by the breaker.
    Rejected,
}

/// How one call ended, as its caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Admitted, and answered with a status below 500.
    Succeeded,
    /// Admitted, and failed: a 5xx answer or the inner service's error.
    Failed,
    /// Rejected by the breaker; the inner service was not called.
    Rejected,
}

/// Tells how a call ended from its result.
pub trait Judge {
    /// How the call that returned `self` ended.
    fn ended(&self) -> Ended;
}

/// Tells a rejection from an inner failure in a service's error.
pub trait Refusal {
    /// [`Ended::Rejected`] or [`Ended::Failed`].
    fn ended(&self) -> Ended;
}

impl<B, E: Refusal> Judge for Result<http::Response<B>, E> {
    #[inline]
    fn ended(&self) -> Ended {
        match self {
            Ok(res) if res.status().is_server_error() => Ended::Failed,
            Ok(_) => Ended::Succeeded,
            Err(e) => e.ended(),
        }
    }
}

impl Refusal for std::convert::Infallible {
    fn ended(&self) -> Ended {
        match *self {}
    }
}

/// The zero-sized error of the service failing at once, and the rejection
/// seatbelt is told to make: a rejection either way.
impl Refusal for crate::rows::Rejected {
    #[inline]
    fn ended(&self) -> Ended {
        Ended::Rejected
    }
}

impl Refusal for tower_circuit_breaker::Error {
    #[inline]
    fn ended(&self) -> Ended {
        if self.is_circuit_open() {
            Ended::Rejected
        } else {
            Ended::Failed
        }
    }
}

/// The error of `stack::Stack`: a box holding a rejection (the crate's
/// `Error` around a `CircuitOpen`, found as users find it) is a rejection.
impl Refusal for tower_circuit_breaker::BoxError {
    #[inline]
    fn ended(&self) -> Ended {
        if tower_circuit_breaker::CircuitOpen::find(&**self).is_some() {
            Ended::Rejected
        } else {
            Ended::Failed
        }
    }
}

impl<E> Refusal for recloser::Error<E> {
    #[inline]
    fn ended(&self) -> Ended {
        match self {
            recloser::Error::Rejected => Ended::Rejected,
            recloser::Error::Inner(_) => Ended::Failed,
        }
    }
}

impl<E> Refusal for failsafe::Error<E> {
    #[inline]
    fn ended(&self) -> Ended {
        match self {
            failsafe::Error::Rejected => Ended::Rejected,
            failsafe::Error::Inner(_) => Ended::Failed,
        }
    }
}

impl<E> Refusal for tower_resilience_circuitbreaker::CircuitBreakerError<E> {
    #[inline]
    fn ended(&self) -> Ended {
        if self.is_circuit_open() {
            Ended::Rejected
        } else {
            Ended::Failed
        }
    }
}

/// How a run of calls ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Calls made.
    pub calls: u64,
    /// Calls the breaker admitted (succeeded or failed).
    pub admitted: u64,
    /// Admitted calls that failed.
    pub failed: u64,
}

impl Tally {
    /// Counts one call.
    #[inline(always)]
    pub fn count(&mut self, ended: Ended) {
        self.calls += 1;
        self.admitted += u64::from(ended != Ended::Rejected);
        self.failed += u64::from(ended == Ended::Failed);
    }

    /// Whether these calls (consecutive calls on one thread) ended as
    /// `expect` says.
    pub fn check(&self, expect: Expect) -> Result<(), String> {
        self.check_within(expect, 0)
    }

    /// Whether these calls ended as `expect` says, when they were made on
    /// up to `slack + 1` threads (each thread's upstream counts its own
    /// calls, so the failures may be off by one a thread).
    pub fn check_within(&self, expect: Expect, slack: u64) -> Result<(), String> {
        let Tally {
            calls,
            admitted,
            failed,
        } = *self;
        let ok = match expect {
            Expect::Admitted => admitted == calls && failed == 0,
            Expect::Rejected => admitted == 0,
            // A run of consecutive calls from any starting count holds
            // either floor or ceil of calls / every failures.
            Expect::AdmittedFailing { every } => {
                admitted == calls
                    && failed + slack >= calls / every
                    && failed <= calls.div_ceil(every) + slack
            }
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "expected {expect:?}; of {calls} calls {admitted} were admitted and {failed} failed"
            ))
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nanoseconds per call, over `calls` calls.
    Time {
        /// Calls to time, across all tasks.
        calls: u64,
    },
    /// Allocations per call, over [`ALLOC_CALLS`] calls.
    Allocs,
}

/// One measurement of one row: the runtime to run on, the shape and what to
/// measure. Rows build their service (outside any timed or counted section)
/// and hand it to [`Plan::drive`].
#[derive(Debug)]
pub struct Plan<'a> {
    /// The runtime of `shape`; build services inside `rt.enter()` if they
    /// need one.
    pub rt: &'a Runtime,
    /// How the calls are made.
    pub shape: Shape,
    /// What is measured.
    pub mode: Mode,
}

impl Plan<'_> {
    /// Warms `svc` up, then measures it: nanoseconds or allocations per call.
    ///
    /// Fails if any call did not end as `expect` says.
    pub fn drive<S>(&self, svc: S, expect: Expect) -> Result<f64, String>
    where
        S: Service<Request> + Clone + Send + 'static,
        S::Future: Send,
        S::Response: Send,
        S::Error: Send,
        Result<S::Response, S::Error>: Judge,
    {
        match self.shape {
            Shape::OneTask => self.rt.block_on(one_task(svc, expect, self.mode)),
            Shape::ManyTasks => self.rt.block_on(many_tasks(svc, expect, self.mode)),
        }
    }

    /// Runs `future` to completion on the plan's runtime (for set-up).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.rt.block_on(future)
    }
}

/// Makes `n` calls one after the other; returns how they ended.
pub async fn call_loop<S>(svc: &mut S, n: u64) -> Tally
where
    S: Service<Request>,
    Result<S::Response, S::Error>: Judge,
{
    let mut tally = Tally::default();
    for _ in 0..n {
        let result = match svc.ready().await {
            Ok(svc) => svc.call(()).await,
            Err(e) => Err(e),
        };
        tally.count(result.ended());
        drop(black_box(result));
    }
    tally
}

async fn one_task<S>(mut svc: S, expect: Expect, mode: Mode) -> Result<f64, String>
where
    S: Service<Request>,
    Result<S::Response, S::Error>: Judge,
{
    call_loop(&mut svc, WARM_UP).await.check(expect)?;
    match mode {
        Mode::Time { calls } => {
            let start = Instant::now();
            let tally = call_loop(&mut svc, calls).await;
            let elapsed = start.elapsed();
            tally.check(expect)?;
            Ok(elapsed.as_nanos() as f64 / calls as f64)
        }
        Mode::Allocs => {
            let before = alloc::start();
            let tally = call_loop(&mut svc, ALLOC_CALLS).await;
            let n = alloc::stop(before);
            tally.check(expect)?;
            Ok(n as f64 / ALLOC_CALLS as f64)
        }
    }
}

/// Runs `per_task` calls on each clone, each clone in its own task; checks
/// the calls against `expect` and returns how many were made.
async fn fan_out<S>(clones: Vec<S>, per_task: u64, expect: Expect) -> Result<u64, String>
where
    S: Service<Request> + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Result<S::Response, S::Error>: Judge,
{
    let tasks: Vec<_> = clones
        .into_iter()
        .map(|mut svc| tokio::spawn(async move { call_loop(&mut svc, per_task).await }))
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        let tally = task.await.expect("a benchmark task panicked");
        all.calls += tally.calls;
        all.admitted += tally.admitted;
        all.failed += tally.failed;
    }
    all.check_within(expect, WORKERS as u64)?;
    Ok(all.calls)
}

fn clones<S: Clone>(svc: &S) -> Vec<S> {
    (0..TASKS).map(|_| svc.clone()).collect()
}

async fn many_tasks<S>(svc: S, expect: Expect, mode: Mode) -> Result<f64, String>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Result<S::Response, S::Error>: Judge,
{
    fan_out(clones(&svc), WARM_UP / TASKS, expect).await?;
    match mode {
        Mode::Time { calls } => {
            let per_task = (calls / TASKS).max(1);
            let clones = clones(&svc);
            let start = Instant::now();
            let made = fan_out(clones, per_task, expect).await;
            let elapsed = start.elapsed();
            Ok(elapsed.as_nanos() as f64 / made? as f64)
        }
        Mode::Allocs => {
            // Spawning the tasks allocates too; count that alone and take it
            // off.
            let per_task = ALLOC_CALLS / TASKS;
            let (idle, busy) = (clones(&svc), clones(&svc));
            let before = alloc::start();
            let idle = fan_out(idle, 0, expect).await;
            let spawning = alloc::stop(before);
            idle?;
            let before = alloc::start();
            let made = fan_out(busy, per_task, expect).await;
            let n = alloc::stop(before);
            Ok(n.saturating_sub(spawning) as f64 / made? as f64)
        }
    }
}

/// Polls a future that must be ready at once (every future of these rows
/// is), with no executor.
#[inline(always)]
pub fn now_or_never<F: std::future::Future>(f: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(f).poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("the benchmark futures are ready at once"),
    }
}

/// Makes `n` calls, polling each service and call future directly (for
/// set-up, and the callgrind loops); returns how they ended.
#[inline(never)]
pub fn poll_calls<S>(svc: &mut S, n: u64) -> Tally
where
    S: Service<Request>,
    Result<S::Response, S::Error>: Judge,
{
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut tally = Tally::default();
    for _ in 0..n {
        let std::task::Poll::Ready(ready) = svc.poll_ready(&mut cx) else {
            panic!("the benchmark services are ready at once")
        };
        let result = match ready {
            Ok(()) => now_or_never(svc.call(())),
            Err(e) => Err(e),
        };
        tally.count(result.ended());
        drop(black_box(result));
    }
    tally
}
