//! Makes N calls through one service, polling each ready future directly
//! (no runtime), for instruction counts under callgrind.
//!
//! ```text
//! callgrind-closed <bare|failing|closed|open|recloser-closed|recloser-open> <calls>
//! ```
//!
//! `bench/callgrind.sh` runs it under `valgrind --tool=callgrind` at two
//! call counts and prints the instructions per call, and what the breaker
//! adds over the bare service.

use std::convert::Infallible;
use std::future::{ready, Future};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{Response, StatusCode};
use tower::{Layer, Service};
use tower_circuit_breaker::{CircuitBreakerLayer, Outcome};
use tower_circuit_breaker_bench::adapters;
use tower_circuit_breaker_bench::measure::Request;
use tower_circuit_breaker_bench::rows::{
    recloser_breaker, upstream, Rejected, FAILURE_RATE, OPEN, WINDOW,
};

fn usage() -> ! {
    eprintln!(
        "usage: callgrind-closed <bare|failing|closed|open|recloser-closed|recloser-open> <calls>"
    );
    std::process::exit(2)
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
fn calls<S: Service<Request>>(svc: &mut S, n: u64) -> u64 {
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

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| usage());
    let n: u64 = args
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| usage());
    // Calls are polled directly, but inside a runtime's context, as in a
    // service: the breaker may use it when it trips.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let _runtime = rt.enter();
    let ok = match mode.as_str() {
        "bare" => calls(&mut upstream::<Infallible>(StatusCode::OK), n),
        "failing" => {
            let mut svc =
                tower::service_fn(|()| ready(Err::<Response<String>, Rejected>(Rejected)));
            calls(&mut svc, n)
        }
        "closed" | "open" => {
            let layer = CircuitBreakerLayer::builder()
                .count_window(WINDOW)
                .min_calls(WINDOW)
                .failure_rate(FAILURE_RATE)
                .open_duration(OPEN)
                .build()
                .expect("a valid configuration");
            if mode == "open" {
                for _ in 0..WINDOW {
                    layer
                        .breaker()
                        .admit()
                        .expect("closed")
                        .record(Outcome::Failure);
                }
            }
            let mut svc = layer.layer(upstream::<Infallible>(StatusCode::OK));
            // Fill the window first, as a breaker in service would have.
            calls(&mut svc, u64::from(WINDOW));
            calls(&mut svc, n)
        }
        "recloser-closed" | "recloser-open" => {
            let breaker = recloser_breaker();
            if mode == "recloser-open" {
                for _ in 0..WINDOW * 2 {
                    let _ = now_or_never(breaker.call(ready(Err::<(), ()>(()))));
                }
            }
            let mut svc = adapters::Recloser::new(upstream::<Infallible>(StatusCode::OK), breaker);
            calls(&mut svc, u64::from(WINDOW));
            calls(&mut svc, n)
        }
        _ => usage(),
    };
    println!("{mode}: {ok} of {n} calls succeeded");
}
