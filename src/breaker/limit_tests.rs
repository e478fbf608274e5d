use super::*;

#[test]
fn bins_are_exact_then_logarithmic() {
    assert_eq!(bin(0), 0);
    assert_eq!(bin(31), 31);
    assert_eq!(bin(32), 32);
    assert_eq!(bin(48), 36);
    assert_eq!(bin(64), 40);
    assert_eq!(bin(240), 32 + 2 * 8 + 7);
    assert_eq!(bin(u64::MAX), BINS - 1);
}

/// A watch and its window's calls.
struct W {
    watch: Box<Watch>,
    bins: Box<Bins>,
}

impl W {
    fn new() -> Self {
        W {
            watch: Watch::new(0),
            bins: Bins::new(),
        }
    }

    fn load_dependent(&self, k: usize, min_signals: u64) -> bool {
        self.watch.load_dependent(&self.bins, k, min_signals)
    }

    fn judge(&self, k: usize, min_signals: u64, limited: bool) -> Judged {
        self.watch.judge(&self.bins, k, min_signals, limited)
    }

    fn roll(&mut self, now: u64, half_ns: u64) {
        self.watch.roll(&self.bins, now, half_ns);
    }

    fn calls(&self) -> u64 {
        (0..2)
            .flat_map(|h| (0..BINS).map(move |b| (h, b)))
            .map(|(h, b)| self.bins.calls(h, b))
            .sum()
    }
}

fn fill(w: &mut W, f: u64, calls: u32, signals: u32) {
    for i in 0..calls {
        let s = if i < signals {
            Signal::Unavailable
        } else {
            Signal::None
        };
        w.watch.observe(&w.bins, f, s);
    }
}

#[test]
fn a_share_that_does_not_grow_with_load_does_not_count() {
    let mut w = W::new();
    // 35 % at every load.
    for f in 1..20 {
        fill(&mut w, f, 20, 7);
    }
    assert!(!w.load_dependent(2, 5));
}

#[test]
fn a_few_points_more_under_load_keep_a_limit_down_but_do_not_start_it() {
    // 30 % of the quieter calls, 50 % of the busier: what a failing
    // model among healthy ones, whose hangs hold calls in flight, can
    // show without any load dependence.
    let mut w = W::new();
    for f in 1..9 {
        fill(&mut w, f, 40, 12);
    }
    for f in 9..17 {
        fill(&mut w, f, 40, 20);
    }
    assert_eq!(w.judge(2, 5, false), Judged::No, "not enough to start");
    assert_eq!(w.judge(2, 5, true), Judged::Grows, "enough to go on");
}

#[test]
fn a_share_that_grows_with_load_counts() {
    let mut w = W::new();
    for f in 1..8 {
        fill(&mut w, f, 10, 0);
    }
    for f in 8..16 {
        fill(&mut w, f, 10, 6);
    }
    assert!(w.load_dependent(2, 5));
    assert!(!w.load_dependent(0, 5), "each kind on its own");
}

#[test]
fn signals_at_one_level_of_load_cannot_be_told_apart() {
    let mut w = W::new();
    fill(&mut w, 240, 100, 40);
    assert_eq!(w.judge(2, 5, false), Judged::Unknown);
    // A lower limit tells: no signal at fewer calls in flight.
    fill(&mut w, 192, 100, 0);
    assert_eq!(w.judge(2, 5, false), Judged::Grows);
    let mut quiet = W::new();
    fill(&mut quiet, 240, 100, 5);
    assert_eq!(
        quiet.judge(2, 5, false),
        Judged::No,
        "a small share is no overload"
    );
}

#[test]
fn a_half_the_window_moved_past_is_forgotten() {
    let mut w = W::new();
    fill(&mut w, 3, 10, 5);
    w.roll(10, 10);
    fill(&mut w, 4, 10, 0);
    assert_eq!(w.calls(), 20);
    w.roll(20, 10);
    assert_eq!(w.calls(), 10);
    w.roll(100, 10);
    assert_eq!(w.calls(), 0);
}

#[test]
fn the_watch_is_calm_until_the_first_moment_the_locked_path_would_act() {
    let l = Limiter::new(Some(InFlightLimit::default()), Duration::ZERO).unwrap();
    let (window, step) = (l.window_ns, l.step_ns);
    let mut inner = Inner::default();
    assert_eq!(l.calm(&inner), 0, "no watch: every admission locks");
    inner.watch = Some(Watch::new(1_000));
    // Unbounded: until the watch would end.
    assert_eq!(l.calm(&inner), 1_000 + window);
    // Bounded: until the limit would grow a step.
    l.limit.store(10, Ordering::Relaxed);
    let w = inner.watch.as_deref_mut().unwrap();
    (w.last_change, w.last_counted) = (2_000, window);
    assert_eq!(l.calm(&inner), window + step);
    // A trial to undo comes first if it is due sooner.
    inner.watch.as_deref_mut().unwrap().probe = Some((step - 1, 20));
    assert_eq!(l.calm(&inner), window + step - 1);
    // A ramp: every admission locks.
    inner.ramp = Some(Ramp {
        start: 0,
        end: 1,
        owed: 0.0,
    });
    assert_eq!(l.calm(&inner), 0);
}

#[test]
fn a_watch_on_rare_signals_ends_and_waits_for_them_to_come_more_often() {
    use crate::{Breaker, Outcome};
    let breaker = Breaker::builder().seed(3).build().unwrap();
    let shared = breaker.shared.clone();
    // One call; every `every`th (from `n`) ends with a 503.
    let call = |n: u64, every: u64| {
        let mut permit = breaker.admit().unwrap();
        if n.is_multiple_of(every) {
            permit.overloaded();
            permit.record(Outcome::Failure);
        } else {
            permit.record(Outcome::Success);
        }
    };
    call(0, 50);
    assert!(shared.is_guarded(), "the first signal starts a watch");
    // A 2 % share: the watch ends at the first signal after its window
    // holds 1,000 calls.
    for n in 1..=1_050 {
        call(n, 50);
    }
    assert!(
        !shared.is_guarded(),
        "signals on 1 call in 50 are too rare to watch"
    );
    for n in 1_051..=4_000 {
        call(n, 50);
        assert!(!shared.is_guarded(), "still rare at call {n}");
    }
    // One in 10: once the signals since the watch ended come on 1 call in
    // 20, a signal watches again.
    let watched = (1..=2_000u64).find(|&n| {
        call(n, 10);
        shared.is_guarded()
    });
    assert!(
        watched.is_some_and(|n| n > 100),
        "watched again after {watched:?} calls"
    );
    assert_eq!(breaker.state(), State::Closed);
}

#[test]
fn a_gate_opens_on_signals_of_one_call_in_twenty_over_two_steps_or_after_two_quiet_steps() {
    let step = 1_000;
    let mut gate = Gate::new(0, 100);
    // 4 signals over 100 calls: 1 in 25.
    for i in 1..=3 {
        assert!(!gate.opens(10 * i, 100 + 25 * i, step));
    }
    // The 5th at 1 in 20 (5 × 20 = 100 calls).
    assert!(!gate.opens(40, 200, step));
    assert!(gate.opens(50, 200, step));
    // A new step keeps the one before: its signals still count.
    let mut gate = Gate::new(0, 0);
    assert!(!gate.opens(500, 100, step));
    assert!(!gate.opens(1_200, 200, step), "2 signals over 200 calls");
    assert_eq!((gate.base, gate.mid, gate.prev, gate.cur), (0, 200, 1, 1));
    // Two steps without a signal: the next one watches.
    assert!(gate.opens(3_200, 10_000, step));
}
