//! A thousand concurrent callers through the tower service, in paused time,
//! over an upstream that breaks, heals and breaks again.
//!
//! The upstream answers 200, 500/503, 400 or 429 at random, or hangs until
//! the attempt timeout inside the breaker gives up; callers give up on some
//! calls early (dropping the response future) and some are aborted outright.
//! Checked: never more than `probes` probes in flight while half-open, the
//! circuit closes again after every heal, and the lifetime counters balance.

use std::cell::Cell;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_circuit_breaker::{CircuitBreakerLayer, ResponseBody, State};

type Client =
    BoxCloneService<Request<String>, Response<ResponseBody<String>>, tower_circuit_breaker::Error>;

const CALLERS: usize = 1_000;
const PROBES: u32 = 3;
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Phases of the upstream: (broken?, length).
const PHASES: [(bool, u64); 5] = [
    (false, 10),
    (true, 25),
    (false, 20),
    (true, 25),
    (false, 20),
];

thread_local! {
    static RNG: Cell<u64> = const { Cell::new(0x2545_f491_4f6c_dd1d) };
}

/// A number in `0..n` (xorshift; the runtime is single-threaded, so runs
/// repeat).
fn rand(n: u64) -> u64 {
    RNG.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x % n
    })
}

#[derive(Default)]
struct Upstream {
    broken: AtomicBool,
    calls: AtomicU64,
    /// Probes (calls admitted while half-open) not yet finished.
    probes_in_flight: AtomicUsize,
    max_probes_in_flight: AtomicUsize,
}

/// Decrements the probe gauge when the call ends, however it ends (answer,
/// attempt timeout, caller gave up, task aborted).
struct ProbeGuard(Arc<Upstream>);

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        self.0.probes_in_flight.fetch_sub(1, SeqCst);
    }
}

fn reply(code: u16) -> Response<String> {
    let mut r = Response::new(String::new());
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap();
    if code == 429 {
        r.headers_mut().insert("retry-after", "1".parse().unwrap());
    }
    r
}

#[tokio::test(start_paused = true)]
async fn a_thousand_callers_through_repeated_open_half_open_cycles() {
    let transitions = Arc::new(Mutex::new(Vec::new()));
    let log = transitions.clone();
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .count_window(50)
        .min_calls(20)
        .failure_rate(0.5)
        .open_duration(Duration::from_secs(2))
        .max_open_duration(Duration::from_secs(8))
        .seed(7)
        .probes(PROBES)
        .close_after(2)
        // Longer than the attempt timeout: every probe ends (one way or
        // another) before its deadline could come.
        .probe_timeout(Duration::from_secs(30))
        .on_transition(move |t| log.lock().unwrap().push((t.at, t.from, t.to)))
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let upstream = Arc::new(Upstream::default());

    let up = upstream.clone();
    let watched = breaker.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .timeout(ATTEMPT_TIMEOUT)
        .service(tower::service_fn(move |_req: Request<String>| {
            // Runs inside `CircuitBreaker::call`, right after admission, on
            // the only thread: the state now is the state that admitted it.
            up.calls.fetch_add(1, SeqCst);
            let guard = (watched.state() == State::HalfOpen).then(|| {
                let n = up.probes_in_flight.fetch_add(1, SeqCst) + 1;
                up.max_probes_in_flight.fetch_max(n, SeqCst);
                ProbeGuard(up.clone())
            });
            let broken = up.broken.load(SeqCst);
            let roll = rand(100);
            async move {
                let _guard = guard;
                let (code, hang) = match (broken, roll) {
                    (true, 0..=49) => (503, false),
                    (true, 50..=74) => (200, true),
                    (true, _) => (200, false),
                    (false, 0..=1) => (400, false),
                    (false, 2..=3) => (429, false),
                    (false, _) => (200, false),
                };
                if hang {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(rand(300))).await;
                Ok::<_, Infallible>(reply(code))
            }
        }));

    let svc: Client = BoxCloneService::new(svc);
    let start = Instant::now();
    let end = start + Duration::from_secs(PHASES.iter().map(|p| p.1).sum());
    let done = Arc::new(AtomicU64::new(0));
    let spawn_caller = |svc: Client| {
        let done = done.clone();
        tokio::spawn(async move {
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(rand(1_000))).await;
                let call = svc.clone().oneshot(Request::new(String::new()));
                if rand(20) == 0 {
                    // The caller gives up first: the future is dropped.
                    let patience = Duration::from_millis(rand(1_200));
                    let _ = tokio::time::timeout(patience, call).await;
                } else {
                    let _ = call.await;
                }
                done.fetch_add(1, SeqCst);
            }
        })
    };
    let mut callers: Vec<_> = (0..CALLERS).map(|_| spawn_caller(svc.clone())).collect();

    // The upstream's phases, with some callers aborted mid-call throughout.
    let mut phases = Vec::new();
    for (broken, secs) in PHASES {
        upstream.broken.store(broken, SeqCst);
        let from = Instant::now();
        let phase_end = from + Duration::from_secs(secs);
        while Instant::now() < phase_end {
            tokio::time::sleep(Duration::from_millis(250)).await;
            for _ in 0..5 {
                let i = rand(CALLERS as u64) as usize;
                callers[i].abort();
                callers[i] = spawn_caller(svc.clone());
            }
        }
        phases.push((broken, from, Instant::now(), breaker.state()));
    }
    for c in callers {
        let _ = c.await;
    }
    drop(svc);

    // Every call has ended: nothing is in flight any more.
    let s = breaker.snapshot();
    let c = s.counters;
    assert_eq!(
        c.admitted,
        c.successes + c.failures + c.ignored + c.rate_limited + c.dropped,
        "{c:?}"
    );
    assert_eq!(c.admitted, upstream.calls.load(SeqCst));
    assert_eq!(upstream.probes_in_flight.load(SeqCst), 0);
    let max = upstream.max_probes_in_flight.load(SeqCst);
    assert!(
        (1..=PROBES as usize).contains(&max),
        "{max} probes in flight at once"
    );
    assert!(c.rejected > 0 && c.dropped > 0 && c.rate_limited > 0 && c.ignored > 0);

    // Every broken phase opened the circuit and went through half-open
    // cycles; every healthy phase ended closed: nothing wedged it.
    let t = transitions.lock().unwrap();
    for (broken, from, to, state_at_end) in &phases {
        let during = |a: State, b: State| {
            t.iter()
                .filter(|x| x.0 >= *from && x.0 < *to && x.1 == a && x.2 == b)
                .count()
        };
        if *broken {
            assert!(
                during(State::Closed, State::Open) >= 1,
                "never opened: {t:?}"
            );
            assert!(
                during(State::HalfOpen, State::Open) >= 1,
                "never reopened: {t:?}"
            );
        } else {
            assert_eq!(*state_at_end, State::Closed, "wedged: {t:?}");
        }
    }
    assert_eq!(s.state, State::Closed);
    eprintln!(
        "{} calls in {:?} of paused time; {c:?}; {} transitions; at most {max} probes in flight",
        done.load(SeqCst),
        Instant::now() - start,
        t.len()
    );
}
