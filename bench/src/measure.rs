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
    /// Every call is rejected by the breaker.
    Rejected,
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

/// Makes `n` calls one after the other; returns how many succeeded.
pub async fn call_loop<S>(svc: &mut S, n: u64) -> u64
where
    S: Service<Request>,
{
    let mut ok = 0;
    for _ in 0..n {
        let result = match svc.ready().await {
            Ok(svc) => svc.call(()).await,
            Err(e) => Err(e),
        };
        ok += u64::from(result.is_ok());
        drop(black_box(result));
    }
    ok
}

fn check(expect: Expect, ok: u64, calls: u64) -> Result<(), String> {
    let want = match expect {
        Expect::Admitted => calls,
        Expect::Rejected => 0,
    };
    if ok == want {
        Ok(())
    } else {
        Err(format!(
            "expected {want} of {calls} calls to succeed ({expect:?}), got {ok}"
        ))
    }
}

async fn one_task<S>(mut svc: S, expect: Expect, mode: Mode) -> Result<f64, String>
where
    S: Service<Request>,
{
    check(expect, call_loop(&mut svc, WARM_UP).await, WARM_UP)?;
    match mode {
        Mode::Time { calls } => {
            let start = Instant::now();
            let ok = call_loop(&mut svc, calls).await;
            let elapsed = start.elapsed();
            check(expect, ok, calls)?;
            Ok(elapsed.as_nanos() as f64 / calls as f64)
        }
        Mode::Allocs => {
            let before = alloc::start();
            let ok = call_loop(&mut svc, ALLOC_CALLS).await;
            let n = alloc::stop(before);
            check(expect, ok, ALLOC_CALLS)?;
            Ok(n as f64 / ALLOC_CALLS as f64)
        }
    }
}

/// Runs `per_task` calls on each clone, each clone in its own task.
async fn fan_out<S>(clones: Vec<S>, per_task: u64) -> u64
where
    S: Service<Request> + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
{
    let tasks: Vec<_> = clones
        .into_iter()
        .map(|mut svc| tokio::spawn(async move { call_loop(&mut svc, per_task).await }))
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += task.await.expect("a benchmark task panicked");
    }
    ok
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
{
    let warm = WARM_UP / TASKS;
    check(expect, fan_out(clones(&svc), warm).await, warm * TASKS)?;
    match mode {
        Mode::Time { calls } => {
            let per_task = (calls / TASKS).max(1);
            let clones = clones(&svc);
            let start = Instant::now();
            let ok = fan_out(clones, per_task).await;
            let elapsed = start.elapsed();
            check(expect, ok, per_task * TASKS)?;
            Ok(elapsed.as_nanos() as f64 / (per_task * TASKS) as f64)
        }
        Mode::Allocs => {
            // Spawning the tasks allocates too; count that alone and take it
            // off.
            let per_task = ALLOC_CALLS / TASKS;
            let (idle, busy) = (clones(&svc), clones(&svc));
            let before = alloc::start();
            fan_out(idle, 0).await;
            let spawning = alloc::stop(before);
            let before = alloc::start();
            let ok = fan_out(busy, per_task).await;
            let n = alloc::stop(before);
            check(expect, ok, per_task * TASKS)?;
            Ok(n.saturating_sub(spawning) as f64 / (per_task * TASKS) as f64)
        }
    }
}
