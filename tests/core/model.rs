//! The breaker against a reference model of its documented semantics.
//!
//! `Model` below is a single-threaded, deliberately plain transcription of
//! the rules in the design notes: a count window of the last `n` calls,
//! `min_calls`, the failure rate, consecutive failures, open durations with
//! capped exponential backoff (no jitter), half-open probe budgets with
//! `close_after` and reopening, probe deadlines (a probe with no response
//! head by then is a failed probe, at that moment) and leases (which free a
//! slot once the head came), deadlines applied at the moment they came
//! whenever the breaker is next touched, dropped permits, neutral
//! ignored and rate-limited outcomes, generations (an outcome counts only in
//! the period that admitted its call), and metrics-only mode (what would be
//! rejected is admitted and counted, and nothing else changes). Random sequences of admissions,
//! outcomes for any outstanding permit in any order, manual control and time
//! advances drive both; they must agree on every admission and every state.
//!
//! More cases: `PROPTEST_CASES=100000 cargo test --release --test model`.

use std::collections::VecDeque;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use proptest::prelude::*;
use proptest::sample::Index;
use tower_circuit_breaker::{Breaker, Outcome, Permit, State};

const TICK: u64 = 500_000; // 0.5 ms, in ns

// === the reference model ===

#[derive(Debug, Clone)]
struct Cfg {
    window: usize,
    min_calls: u64,
    /// Failure-rate threshold in percent.
    rate: Option<u64>,
    consecutive: Option<u64>,
    open: u64,
    open_max: u64,
    multiplier: u64,
    probes: u32,
    close_after: u32,
    /// The probe deadline; `None`: the open duration.
    probe_timeout: Option<u64>,
    /// Never shorter than the deadline.
    lease: Option<u64>,
}

impl Cfg {
    fn deadline(&self) -> u64 {
        self.probe_timeout.unwrap_or(self.open)
    }
}

/// A probe in flight.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: u64,
    /// Failed if no head by then; `None` once the head came.
    verdict_at: Option<u64>,
    /// Freed without a verdict then.
    lease_at: Option<u64>,
}

impl Lease {
    fn due(&self) -> u64 {
        self.verdict_at
            .unwrap_or(u64::MAX)
            .min(self.lease_at.unwrap_or(u64::MAX))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mp {
    Closed { generation: u64 },
    Probe { generation: u64, id: u64 },
    Passive,
}

#[derive(Debug, Clone, Copy)]
enum Fin {
    Success,
    Failure,
    Ignored,
    RateLimited,
    Drop,
}

#[derive(Debug, Default)]
struct Counts {
    admitted: u64,
    rejected: u64,
    would_reject: u64,
    successes: u64,
    failures: u64,
    ignored: u64,
    rate_limited: u64,
    dropped: u64,
}

#[derive(Debug)]
struct Model {
    cfg: Cfg,
    now: u64,
    state: State,
    generation: u64,
    open_until: u64,
    reopens: u32,
    /// The last `window` calls of this closed period; `true` = failed.
    window: VecDeque<bool>,
    streak: u64,
    /// The window that tripped the circuit (calls, failures).
    tripped: (u64, u64),
    /// Half-open: outstanding probes, successes, failures.
    leases: Vec<Lease>,
    successes: u32,
    failures: u32,
    next_id: u64,
    metrics_only: bool,
    counts: Counts,
}

impl Model {
    fn new(cfg: Cfg) -> Self {
        Model {
            cfg,
            now: 0,
            state: State::Closed,
            generation: 0,
            open_until: 0,
            reopens: 0,
            window: VecDeque::new(),
            streak: 0,
            tripped: (0, 0),
            leases: Vec::new(),
            successes: 0,
            failures: 0,
            next_id: 0,
            metrics_only: false,
            counts: Counts::default(),
        }
    }

    /// `open * multiplier^reopens`, capped.
    fn open_for(&self) -> u64 {
        let mut d = self.cfg.open;
        for _ in 0..self.reopens {
            d = d.saturating_mul(self.cfg.multiplier);
            if d >= self.cfg.open_max {
                break;
            }
        }
        d.min(self.cfg.open_max)
    }

    /// The window as the rules see it: calls and failures.
    fn stats(&self) -> (u64, u64) {
        if self.cfg.rate.is_none() {
            return (0, 0); // no rate rule, no window
        }
        let failures = self.window.iter().filter(|f| **f).count() as u64;
        (self.window.len() as u64, failures)
    }

    /// Applies every deadline that came by `now`, at the moment it came.
    fn catch_up(&mut self) {
        loop {
            match self.state {
                State::Open if self.now >= self.open_until => {
                    self.go_at(State::HalfOpen, self.open_until);
                }
                State::HalfOpen => {
                    let Some(i) = (0..self.leases.len()).min_by_key(|&i| self.leases[i].due())
                    else {
                        return;
                    };
                    let l = self.leases[i];
                    if l.due() > self.now {
                        return;
                    }
                    self.leases.swap_remove(i);
                    if l.verdict_at == Some(l.due()) {
                        self.failures += 1;
                        self.decide(l.due());
                    }
                }
                _ => return,
            }
        }
    }

    fn decide(&mut self, at: u64) {
        if self.successes >= self.cfg.close_after {
            self.go_at(State::Closed, at);
        } else if self.cfg.probes - self.failures < self.cfg.close_after {
            self.go_at(State::Open, at);
        }
    }

    fn go(&mut self, to: State) {
        self.go_at(to, self.now);
    }

    fn go_at(&mut self, to: State, at: u64) {
        let from = self.state;
        self.generation += 1;
        self.leases.clear();
        self.successes = 0;
        self.failures = 0;
        match to {
            State::Open => {
                if from == State::HalfOpen {
                    self.reopens += 1;
                }
                self.open_until = at + self.open_for();
            }
            State::Closed => {
                self.reopens = 0;
                self.tripped = (0, 0);
                self.window.clear();
                self.streak = 0;
            }
            State::ForcedOpen | State::Disabled if from == State::Closed => {
                self.tripped = self.stats();
            }
            _ => {}
        }
        self.state = to;
    }

    /// `Ok(is_probe)` or `Err(retry_after)`.
    fn admit(&mut self) -> Result<Mp, Option<u64>> {
        self.catch_up();
        let r = match self.state {
            State::Closed => Ok(Mp::Closed {
                generation: self.generation,
            }),
            State::Disabled => Ok(Mp::Passive),
            State::ForcedOpen => Err(None),
            State::Open => Err(Some(self.open_until - self.now)),
            State::HalfOpen => {
                let now = self.now;
                let live = self.leases.len() as u32;
                if live + self.successes + self.failures < self.cfg.probes {
                    let id = self.next_id;
                    self.next_id += 1;
                    self.leases.push(Lease {
                        id,
                        // Held exactly its deadline or lease, a probe is
                        // still in flight: each comes a nanosecond later.
                        verdict_at: Some(now + self.cfg.deadline() + 1),
                        lease_at: self.cfg.lease.map(|l| now + l + 1),
                    });
                    Ok(Mp::Probe {
                        generation: self.generation,
                        id,
                    })
                } else {
                    Err(None)
                }
            }
            s => unreachable!("{s:?}"),
        };
        match r {
            Ok(_) => self.counts.admitted += 1,
            Err(_) if self.metrics_only => {
                // Admitted instead, and recorded nowhere but the counters.
                self.counts.would_reject += 1;
                self.counts.admitted += 1;
                return Ok(Mp::Passive);
            }
            Err(_) => self.counts.rejected += 1,
        }
        r
    }

    fn record(&mut self, permit: Mp, fin: Fin) {
        let c = &mut self.counts;
        match fin {
            Fin::Success => c.successes += 1,
            Fin::Failure => c.failures += 1,
            Fin::Ignored => c.ignored += 1,
            Fin::RateLimited => c.rate_limited += 1,
            Fin::Drop => c.dropped += 1,
        }
        match permit {
            Mp::Passive => {}
            Mp::Closed { generation } => {
                if self.state != State::Closed || generation != self.generation {
                    return; // from an older period
                }
                let failed = match fin {
                    Fin::Success => false,
                    Fin::Failure => true,
                    _ => return, // neutral: no window, streak goes on
                };
                self.streak = if failed { self.streak + 1 } else { 0 };
                if self.cfg.rate.is_some() {
                    self.window.push_back(failed);
                    if self.window.len() > self.cfg.window {
                        self.window.pop_front();
                    }
                }
                let (calls, failures) = self.stats();
                let by_streak = self.cfg.consecutive.is_some_and(|n| self.streak >= n);
                let by_rate = calls > 0
                    && calls >= self.cfg.min_calls
                    && self.cfg.rate.is_some_and(|r| failures * 100 >= r * calls);
                if by_streak || by_rate {
                    self.tripped = (calls, failures);
                    self.go(State::Open);
                }
            }
            Mp::Probe { generation, id } => {
                self.catch_up();
                if self.state != State::HalfOpen || generation != self.generation {
                    return; // from an older cycle
                }
                let Some(i) = self.leases.iter().position(|l| l.id == id) else {
                    return; // decided by its deadline or freed by its lease: dropped
                };
                self.leases.swap_remove(i);
                match fin {
                    Fin::Success => self.successes += 1,
                    Fin::Failure => self.failures += 1,
                    // The slot comes back.
                    Fin::Ignored | Fin::RateLimited | Fin::Drop => {}
                }
                self.decide(self.now);
            }
        }
    }

    /// The probe's response head came: its deadline no longer applies.
    fn head(&mut self, permit: Mp) {
        self.catch_up();
        if let Mp::Probe { generation, id } = permit
            && self.state == State::HalfOpen
            && generation == self.generation
            && let Some(l) = self.leases.iter_mut().find(|l| l.id == id)
        {
            l.verdict_at = None;
        }
    }

    fn manual(&mut self, to: State) {
        self.go(to);
    }
}

// === the harness ===

#[derive(Debug, Clone)]
enum Op {
    Admit,
    Finish(u16, Fin),
    Head(u16),
    Advance(u64),
    Reset,
    ForceOpen,
    Disable,
    MetricsOnly(bool),
}

fn breaker(cfg: &Cfg) -> Breaker {
    let mut b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .count_window(cfg.window as u32)
        .min_calls(cfg.min_calls as u32)
        .open_duration(Duration::from_nanos(cfg.open))
        .max_open_duration(Duration::from_nanos(cfg.open_max))
        .backoff_multiplier(cfg.multiplier as f64)
        .jitter(0.0)
        .probes(cfg.probes)
        .close_after(cfg.close_after)
        .counter_stripes(1);
    b = match cfg.rate {
        Some(pct) => b.failure_rate(pct as f64 / 100.0),
        None => b.no_failure_rate(),
    };
    if let Some(n) = cfg.consecutive {
        b = b.consecutive_failures(n as u32);
    }
    if let Some(t) = cfg.probe_timeout {
        b = b.probe_timeout(Duration::from_nanos(t));
    }
    if let Some(lease) = cfg.lease {
        b = b.probe_lease(Duration::from_nanos(lease));
    }
    b.build().expect("generated configurations are valid")
}

/// Runs `ops` against the breaker and the model in paused time; panics at the
/// first disagreement. Returns the states the model went through.
fn run(cfg: Cfg, ops: Vec<Op>) -> Vec<State> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let b = breaker(&cfg);
        let mut m = Model::new(cfg);
        let mut held: Vec<(Permit, Mp)> = Vec::new();
        let mut seen = vec![State::Closed];
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Admit => match (b.admit(), m.admit()) {
                    (Ok(p), Ok(mp)) => {
                        assert_eq!(
                            p.is_probe(),
                            matches!(mp, Mp::Probe { .. }),
                            "step {step}: probe?"
                        );
                        held.push((p, mp));
                    }
                    (Err(e), Err(retry)) => {
                        assert_eq!(
                            e.retry_after(),
                            retry.map(Duration::from_nanos),
                            "step {step}: retry_after"
                        );
                    }
                    (real, model) => panic!(
                        "step {step}: breaker {:?}, model {model:?}, {m:?}",
                        real.map(|p| p.is_probe())
                    ),
                },
                Op::Finish(i, fin) => {
                    if held.is_empty() {
                        continue;
                    }
                    let (p, mp) = held.swap_remove(usize::from(i) % held.len());
                    match fin {
                        Fin::Success => p.record(Outcome::Success),
                        Fin::Failure => p.record(Outcome::Failure),
                        Fin::Ignored => p.record(Outcome::Ignored),
                        Fin::RateLimited => p.record(Outcome::RateLimited {
                            retry_after: Some(Duration::from_secs(1)),
                        }),
                        Fin::Drop => drop(p),
                    }
                    m.record(mp, fin);
                }
                Op::Head(i) => {
                    if held.is_empty() {
                        continue;
                    }
                    let at = usize::from(i) % held.len();
                    let (p, mp) = &mut held[at];
                    p.head_received();
                    m.head(*mp);
                }
                Op::Advance(ticks) => {
                    tokio::time::advance(Duration::from_nanos(ticks * TICK)).await;
                    m.now += ticks * TICK;
                }
                Op::Reset => {
                    b.reset();
                    m.manual(State::Closed);
                }
                Op::ForceOpen => {
                    b.force_open();
                    m.manual(State::ForcedOpen);
                }
                Op::Disable => {
                    b.disable();
                    m.manual(State::Disabled);
                }
                Op::MetricsOnly(on) => {
                    b.set_metrics_only(on);
                    m.metrics_only = on;
                }
            }
            // A snapshot touches the breaker: deadlines that came apply.
            m.catch_up();
            compare(&b, &m, step);
            if seen.last() != Some(&m.state) {
                seen.push(m.state);
            }
        }
        let n = held.len() as u64;
        drop(held);
        let c = b.snapshot().counters;
        assert_eq!(c.dropped, m.counts.dropped + n);
        assert_eq!(
            c.admitted,
            c.successes + c.failures + c.ignored + c.rate_limited + c.dropped
        );
        seen
    })
}

fn compare(b: &Breaker, m: &Model, step: usize) {
    let s = b.snapshot();
    let ctx = || format!("step {step}: breaker {s:?}\nmodel {m:?}");
    assert_eq!(s.state, m.state, "state; {}", ctx());
    let window = if m.state == State::Closed {
        m.stats()
    } else {
        m.tripped
    };
    assert_eq!(
        (s.window.calls, s.window.failures),
        window,
        "window; {}",
        ctx()
    );
    assert_eq!(s.consecutive_failures, m.streak, "streak; {}", ctx());
    assert_eq!(s.reopens, m.reopens, "reopens; {}", ctx());
    let retry_in =
        (m.state == State::Open).then(|| Duration::from_nanos(m.open_until.saturating_sub(m.now)));
    assert_eq!(s.retry_in, retry_in, "retry_in; {}", ctx());
    let c = s.counters;
    let k = &m.counts;
    assert_eq!(
        (
            c.admitted,
            c.rejected,
            c.would_reject,
            c.successes,
            c.failures,
            c.ignored,
            c.rate_limited,
            c.dropped
        ),
        (
            k.admitted,
            k.rejected,
            k.would_reject,
            k.successes,
            k.failures,
            k.ignored,
            k.rate_limited,
            k.dropped
        ),
        "counters; {}",
        ctx()
    );
}

// === strategies ===

fn cfg() -> impl Strategy<Value = Cfg> {
    (
        1usize..=6,
        any::<Index>(),
        prop_oneof![
            1 => Just(None),
            4 => prop::sample::select(vec![25u64, 50, 75, 100]).prop_map(Some)
        ],
        prop_oneof![2 => Just(None), 1 => (1u64..=4).prop_map(Some)],
        1u64..=6,
        prop::sample::select(vec![1u64, 2, 4, 8]),
        prop::sample::select(vec![1u64, 2, 3]),
        1u32..=4,
        any::<Index>(),
        prop_oneof![1 => Just(None), 2 => (1u64..=8).prop_map(Some)],
        prop_oneof![1 => Just(None), 2 => (0u64..=8).prop_map(Some)],
    )
        .prop_map(
            |(window, min, rate, consecutive, open, cap, mult, probes, close, timeout, extra)| {
                let probe_timeout = timeout.map(|t| t * TICK);
                let deadline = probe_timeout.unwrap_or(open * 2 * TICK);
                Cfg {
                    window,
                    min_calls: min.index(window) as u64 + 1,
                    rate,
                    consecutive,
                    open: open * 2 * TICK,
                    open_max: open * 2 * TICK * cap,
                    multiplier: mult,
                    probes,
                    close_after: close.index(probes as usize) as u32 + 1,
                    probe_timeout,
                    lease: extra.map(|l| deadline + l * TICK),
                }
            },
        )
}

fn fin() -> impl Strategy<Value = Fin> {
    prop_oneof![
        4 => Just(Fin::Success),
        4 => Just(Fin::Failure),
        1 => Just(Fin::Ignored),
        1 => Just(Fin::RateLimited),
        2 => Just(Fin::Drop),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => Just(Op::Admit),
        40 => (any::<u16>(), fin()).prop_map(|(i, f)| Op::Finish(i, f)),
        10 => any::<u16>().prop_map(Op::Head),
        20 => (0u64..=12).prop_map(Op::Advance),
        2 => Just(Op::Reset),
        1 => Just(Op::ForceOpen),
        1 => Just(Op::Disable),
        2 => any::<bool>().prop_map(Op::MetricsOnly),
    ]
}

proptest! {
    #[test]
    fn breaker_agrees_with_the_model(cfg in cfg(), ops in prop::collection::vec(op(), 1..120)) {
        run(cfg, ops);
    }
}

// === the harness itself reaches every part of the cycle ===

#[test]
fn a_scripted_run_goes_through_trip_reopen_backoff_and_close() {
    let cfg = Cfg {
        window: 4,
        min_calls: 2,
        rate: Some(50),
        consecutive: None,
        open: 4 * TICK,
        open_max: 16 * TICK,
        multiplier: 2,
        probes: 2,
        close_after: 2,
        probe_timeout: None,
        lease: Some(20 * TICK),
    };
    let ops = vec![
        Op::Admit,
        Op::Admit,
        Op::Finish(0, Fin::Failure),
        Op::Finish(0, Fin::Failure), // 2 of 2 failed: open for 4 ticks
        Op::Advance(4),
        Op::Admit,                   // half-open
        Op::Finish(0, Fin::Failure), // reopen, now for 8 ticks
        Op::Advance(7),
        Op::Admit, // still open
        Op::Advance(1),
        Op::Admit,
        Op::Admit,
        Op::Finish(0, Fin::Success),
        Op::Finish(0, Fin::Success), // closed
    ];
    let seen = run(cfg, ops);
    assert_eq!(
        seen,
        [
            State::Closed,
            State::Open,
            State::HalfOpen,
            State::Open,
            State::HalfOpen,
            State::Closed
        ]
    );
}

// === regressions found by the model ===

#[test]
fn a_probe_past_its_deadline_has_its_late_outcome_dropped() {
    // The deadline defaults to the open duration (2 ticks). The probe's
    // success arrives a tick after its deadline, with no admission in
    // between: it failed at the deadline, and the success must not close
    // the circuit.
    let cfg = Cfg {
        window: 1,
        min_calls: 1,
        rate: Some(25),
        consecutive: None,
        open: 2 * TICK,
        open_max: 2 * TICK,
        multiplier: 1,
        probes: 1,
        close_after: 1,
        probe_timeout: None,
        lease: None,
    };
    let ops = vec![
        Op::Admit,
        Op::Finish(0, Fin::Failure),
        Op::Advance(2),
        Op::Admit,
        Op::Advance(3),
        Op::Finish(0, Fin::Success),
        // Reopened at the deadline for 2 ticks; then the next caller probes.
        Op::Advance(2),
        Op::Admit,
        Op::Finish(0, Fin::Success),
    ];
    assert_eq!(
        run(cfg, ops),
        [
            State::Closed,
            State::Open,
            State::HalfOpen,
            State::Open,
            State::HalfOpen,
            State::Closed
        ]
    );
}

#[test]
fn a_probe_whose_head_came_is_freed_by_its_lease_without_a_verdict() {
    let cfg = Cfg {
        window: 1,
        min_calls: 1,
        rate: Some(25),
        consecutive: None,
        open: 2 * TICK,
        open_max: 2 * TICK,
        multiplier: 1,
        probes: 1,
        close_after: 1,
        probe_timeout: Some(TICK),
        lease: Some(3 * TICK),
    };
    let ops = vec![
        Op::Admit,
        Op::Finish(0, Fin::Failure),
        Op::Advance(2),
        Op::Admit,
        Op::Head(0),
        Op::Advance(3),
        // The slot is free: a new probe closes the circuit; the first one's
        // late failure is dropped.
        Op::Admit,
        Op::Finish(1, Fin::Success),
        Op::Finish(0, Fin::Failure),
    ];
    assert_eq!(
        run(cfg, ops),
        [State::Closed, State::Open, State::HalfOpen, State::Closed]
    );
}

// === outside the model: the slow-call rule ===

#[tokio::test(start_paused = true)]
async fn a_slow_success_breaks_a_failure_streak() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .count_window(10)
        .min_calls(10)
        .no_failure_rate()
        .slow_call(Duration::from_secs(1), 1.0)
        .consecutive_failures(3)
        .build()
        .unwrap();
    b.admit_with_fallback().unwrap().record(Outcome::Failure);
    b.admit_with_fallback().unwrap().record(Outcome::Failure);
    let slow = b.admit_with_fallback().unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    slow.record(Outcome::Success);
    assert_eq!(b.snapshot().counters.slow, 1);
    assert_eq!(
        b.snapshot().consecutive_failures,
        0,
        "a success, slow or not"
    );
    b.admit_with_fallback().unwrap().record(Outcome::Failure);
    assert_eq!(
        b.state(),
        State::Closed,
        "failures 1, 2, success, 3 are not 3 in a row"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_crossing_the_slow_threshold_does_not_break_a_failure_streak() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .count_window(10)
        .min_calls(10)
        .no_failure_rate()
        .slow_call(Duration::from_secs(1), 1.0)
        .consecutive_failures(2)
        .build()
        .unwrap();
    let hanging = b.admit_with_fallback().unwrap();
    b.admit_with_fallback().unwrap().record(Outcome::Failure);
    tokio::time::advance(Duration::from_secs(2)).await;
    // This admission counts the hanging call as slow: it has not finished,
    // so it says nothing about the streak.
    let next = b.admit_with_fallback().unwrap();
    assert_eq!(b.snapshot().counters.slow, 1);
    assert_eq!(b.snapshot().consecutive_failures, 1);
    next.record(Outcome::Failure);
    assert_eq!(b.state(), State::Open);
    drop(hanging);
}
