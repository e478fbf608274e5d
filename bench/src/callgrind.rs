//! The loops `bench/callgrind.sh` counts instructions of, one binary per
//! loop (`src/bin/cg-*.rs`).
//!
//! Each binary holds only its own loop: the compiler inlines a function
//! called from one place more readily than one called from several, so a
//! binary with every loop in it counts a path differently depending on
//! which other paths were compiled beside it.
//!
//! Every loop polls each call's future directly, with no executor, inside a
//! current-thread runtime's context (as a service's calls would be), after
//! the breaker has seen enough calls to fill its window.

use std::convert::Infallible;
use std::future::{ready, Future};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{Response, StatusCode};
use tower::{Layer, Service};

use crate::adapters;
use crate::measure::Request;
use crate::rows::{
    keyed_service, keyed_set, ours_layer, recloser_breaker, trip, upstream, Rejected, OPEN, WINDOW,
};

/// `main` of a callgrind binary: `$name <calls>` runs `$run` that many
/// times and prints how many calls succeeded.
#[macro_export]
macro_rules! callgrind_main {
    ($run:path) => {
        fn main() {
            let n: u64 = std::env::args()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| {
                    eprintln!("usage: {} <calls>", env!("CARGO_BIN_NAME"));
                    std::process::exit(2)
                });
            let ok = $crate::callgrind::in_runtime(|| $run(n));
            println!("{}: {ok} of {n} calls succeeded", env!("CARGO_BIN_NAME"));
        }
    };
}

/// Runs `f` inside a current-thread runtime's context: the breaker arms
/// its timers there when it opens.
pub fn in_runtime<T>(f: impl FnOnce() -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let _runtime = rt.enter();
    f()
}

/// Polls a future that must be ready at once.
#[inline(always)]
fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the benchmark futures are ready at once"),
    }
}

/// The measured loop, kept out of line so callgrind shows it by name.
#[inline(never)]
pub fn calls<S: Service<Request>>(svc: &mut S, n: u64) -> u64 {
    let mut cx = Context::from_waker(Waker::noop());
    let mut ok = 0;
    for _ in 0..n {
        let Poll::Ready(ready) = svc.poll_ready(&mut cx) else {
            panic!("the benchmark services are ready at once")
        };
        let result = match ready {
            Ok(()) => now_or_never(svc.call(())),
            Err(e) => Err(e),
        };
        ok += u64::from(result.is_ok());
        drop(black_box(result));
    }
    ok
}

/// Warms `svc` up with a window's worth of calls, then makes `n`.
#[inline]
fn warm_then<S: Service<Request>>(mut svc: S, n: u64) -> u64 {
    calls(&mut svc, u64::from(WINDOW));
    calls(&mut svc, n)
}

/// The inner service alone, answering at once.
#[inline]
pub fn bare(n: u64) -> u64 {
    warm_then(upstream::<Infallible>(StatusCode::OK), n)
}

/// A service failing at once with a zero-sized error.
#[inline]
pub fn failing(n: u64) -> u64 {
    warm_then(
        tower::service_fn(|()| ready(Err::<Response<String>, Rejected>(Rejected))),
        n,
    )
}

/// This crate, closed.
#[inline]
pub fn closed(n: u64) -> u64 {
    warm_then(
        ours_layer(OPEN).layer(upstream::<Infallible>(StatusCode::OK)),
        n,
    )
}

/// This crate, open: every call rejected.
#[inline]
pub fn open(n: u64) -> u64 {
    let layer = ours_layer(OPEN);
    trip(layer.breaker()).unwrap_or_else(|e| panic!("{e}"));
    warm_then(layer.layer(upstream::<Infallible>(StatusCode::OK)), n)
}

/// This crate, closed, one key of 10,000.
#[inline]
pub fn keyed(n: u64) -> u64 {
    warm_then(
        keyed_service(keyed_set().unwrap_or_else(|e| panic!("{e}"))),
        n,
    )
}

/// recloser, closed.
#[inline]
pub fn recloser_closed(n: u64) -> u64 {
    warm_then(
        adapters::Recloser::new(upstream::<Infallible>(StatusCode::OK), recloser_breaker()),
        n,
    )
}

/// recloser, open: every call rejected.
#[inline]
pub fn recloser_open(n: u64) -> u64 {
    let breaker = recloser_breaker();
    for _ in 0..WINDOW * 2 {
        let _ = now_or_never(breaker.call(ready(Err::<(), ()>(()))));
    }
    warm_then(
        adapters::Recloser::new(upstream::<Infallible>(StatusCode::OK), breaker),
        n,
    )
}
