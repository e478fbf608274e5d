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
//! the breaker has seen enough calls to fill its window. The services are
//! the report's own (`src/rows.rs`), and every call is checked as the
//! report checks it: the binary fails if a call did not end as its path
//! says.

use std::convert::Infallible;

use http::StatusCode;
use tower::Service;

use crate::measure::{poll_calls, Judge, Request, Tally};
use crate::rows::{self, Tr, NAME, WINDOW};

/// `main` of a callgrind binary: `$name <calls>` runs `$run` that many
/// times, checks every call against `$path`'s expectation and prints how
/// they ended.
#[macro_export]
macro_rules! callgrind_main {
    ($run:path, $path:expr) => {
        fn main() {
            let n: u64 = std::env::args()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| {
                    eprintln!("usage: {} <calls>", env!("CARGO_BIN_NAME"));
                    std::process::exit(2)
                });
            let path: $crate::rows::Path = $path;
            let checked = $crate::callgrind::in_runtime(|| $run(n))
                .and_then(|tally| tally.check(path.expect()).map(|()| tally));
            match checked {
                Ok(t) => println!(
                    "{}: {} calls, {} admitted, {} failed",
                    env!("CARGO_BIN_NAME"),
                    t.calls,
                    t.admitted,
                    t.failed
                ),
                Err(e) => {
                    eprintln!("{}: {e}", env!("CARGO_BIN_NAME"));
                    std::process::exit(1)
                }
            }
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

/// Warms `svc` up with a window's worth of calls, then makes `n` and
/// returns how they ended.
#[inline]
fn warm_then<S>(svc: Result<S, String>, n: u64) -> Result<Tally, String>
where
    S: Service<Request>,
    Result<S::Response, S::Error>: Judge,
{
    let mut svc = svc?;
    poll_calls(&mut svc, u64::from(WINDOW));
    Ok(poll_calls(&mut svc, n))
}

/// Defines one loop per line: `name => the service`.
macro_rules! loops {
    ($($(#[$doc:meta])* $name:ident => $svc:expr;)*) => {
        $(
            $(#[$doc])*
            #[inline]
            pub fn $name(n: u64) -> Result<Tally, String> {
                warm_then($svc, n)
            }
        )*
    };
}

loops! {
    /// The inner service alone, answering at once.
    bare => Ok(rows::upstream::<Infallible>(StatusCode::OK));
    /// A service failing at once with a zero-sized error.
    failing => Ok(rows::failing());
    /// The inner service alone, every 50th answer a 503.
    bare_5xx => Ok(rows::failing_every::<Infallible>());
    /// The inner service alone, answering a JSON 200.
    bare_json => Ok(rows::json_upstream());
    /// `MapResponse` doing nothing over the inner service.
    passthrough => Ok(rows::passthrough());
    /// `MapResponse` rebuilding the response around a wrapped body.
    passthrough_wrapped => Ok(rows::passthrough_wrapped());
    /// This crate, closed.
    closed => rows::ours_closed();
    /// This crate, closed, shared with a live Redis backend.
    #[cfg(feature = "redis")]
    closed_shared => rows::ours_closed_shared();
    /// This crate, closed, every 50th call a 503.
    closed_5xx => rows::ours_closed_failing();
    /// This crate, closed, `HttpClassifier` on a JSON 200.
    http_json => rows::ours_http_json();
    /// This crate, closed, `LlmClassifier` on a JSON 200.
    llm_json => rows::ours_llm_json();
    /// This crate, closed, the slow-call rule on.
    slow => rows::ours_slow();
    /// This crate, closed, a time window.
    window => rows::ours_time_window();
    /// This crate, closed, the classical breaker.
    classic => rows::ours_classic();
    /// This crate, closed, a spend guard on.
    spend => rows::ours_spend();
    /// A failover of two of this crate's breakers.
    failover => rows::ours_failover(rows::FailoverWith::Nothing);
    /// The same, peak-EWMA selection on.
    failover_selection => rows::ours_failover(rows::FailoverWith::Selection);
    /// The same, hedging on.
    failover_hedge => rows::ours_failover(rows::FailoverWith::Hedge);
    /// This crate, open: every call rejected.
    open => rows::ours_open(None);
    /// This crate, open, the breaker named.
    open_named => rows::ours_open(Some(NAME));
    /// `stack::Stack` over a closed circuit.
    stack_closed => rows::stack_closed();
    /// `stack::Stack` over an open circuit.
    stack_open => rows::stack_open();
    /// This crate, closed, one hot key of 10,000.
    keyed_hot => rows::keyed_set().map(rows::keyed_service);
    /// This crate, closed, unkeyed, behind the keyed rows' rotation.
    closed_rotating => Ok(rows::closed_rotating());
    /// This crate, closed, rotating over 10,000 keys.
    keyed_rotating => rows::keyed_set().map(rows::keyed_rotating);
    /// This crate, keyed, the one key called open.
    keyed_open => rows::keyed_open();
    /// recloser, closed.
    recloser_closed => Ok(rows::recloser_closed(rows::upstream::<Infallible>(StatusCode::OK)));
    /// recloser, closed, every 50th call a 503 (seen as an `Err`).
    recloser_5xx => Ok(rows::recloser_closed(rows::fails_on_5xx(rows::failing_every())));
    /// recloser, open: every call rejected.
    recloser_open => rows::recloser_open();
    /// failsafe, closed (its window is a time window).
    failsafe_closed => Ok(rows::failsafe_closed(rows::upstream::<Infallible>(StatusCode::OK)));
    /// failsafe, closed, every 50th call a 503 (seen as an `Err`).
    failsafe_5xx => Ok(rows::failsafe_closed(rows::fails_on_5xx(rows::failing_every())));
    /// failsafe, open.
    failsafe_open => rows::failsafe_open();
    /// tower-resilience, closed.
    tower_resilience_closed => Ok(rows::tower_resilience(Tr::default(), rows::upstream(StatusCode::OK)));
    /// tower-resilience, closed, every 50th call a 503.
    tower_resilience_5xx => Ok(rows::tower_resilience(Tr::default(), rows::failing_every()));
    /// tower-resilience, closed, the slow-call rule on.
    tower_resilience_slow => Ok(rows::tower_resilience(Tr::SLOW, rows::upstream(StatusCode::OK)));
    /// tower-resilience, open.
    tower_resilience_open => rows::tower_resilience_open(Tr::default());
    /// tower-resilience, open, the breaker named.
    tower_resilience_open_named => rows::tower_resilience_open(Tr::NAMED);
    /// seatbelt, closed (its window is a time window).
    seatbelt_closed => Ok(rows::seatbelt("bench", rows::upstream(StatusCode::OK)));
    /// seatbelt, closed, every 50th call a 503.
    seatbelt_5xx => Ok(rows::seatbelt("bench", rows::failing_every()));
    /// seatbelt, open (seatbelt names every breaker).
    seatbelt_open => rows::seatbelt_open(NAME);
}
