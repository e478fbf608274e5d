//! The figures a replay reports, from what each request and each attempt
//! did: for every request and for those that arrived during the outage.

use std::time::Duration;

use crate::engine::{AttemptRecord, Fate, RequestRecord, TransitionRecord};
use crate::scenario::{Figure, Scenario};

/// Mean, median, 99th percentile and maximum of some waits, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waits {
    pub mean_s: f64,
    pub p50_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
}

impl Waits {
    /// `None` when there is nothing to measure.
    pub fn of(mut xs: Vec<f64>) -> Option<Waits> {
        if xs.is_empty() {
            return None;
        }
        xs.sort_by(f64::total_cmp);
        let rank = |p: f64| xs[((p * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1];
        Some(Waits {
            mean_s: xs.iter().sum::<f64>() / xs.len() as f64,
            p50_s: rank(0.50),
            p99_s: rank(0.99),
            max_s: xs[xs.len() - 1],
        })
    }
}

/// What a stack did for the requests that arrived in `[from_s, to_s)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub from_s: f64,
    pub to_s: f64,
    pub requests: u64,
    pub succeeded: u64,
    /// Answers that came within the user's deadline (`[client]
    /// deadline_s`); every answer without one.
    pub answered: u64,
    pub failed: u64,
    pub rejected: u64,
    /// Attempts of these requests that reached each upstream the stack calls.
    pub attempts: Vec<(String, u64)>,
    /// (failed + rejected) / requests.
    pub user_error_rate: Option<f64>,
    /// Arrival to answer or error, every request.
    pub wait: Option<Waits>,
    /// Arrival to the end of the answer, answered requests.
    pub answered_wait: Option<Waits>,
    /// Arrival to the error, requests that got one (a rejection is one).
    pub error_wait: Option<Waits>,
    /// Arrival to the answer's first byte (its first token, for a stream).
    pub answered_ttft: Option<Waits>,
    /// Attempts per request.
    pub amplification: Option<f64>,
    pub cost_usd: f64,
    /// Spent on attempts whose answer the user did not get, hangs billed as
    /// `[billing] hang` says (in full by default).
    pub wasted_cost_usd: f64,
    /// The same with hangs unbilled.
    pub wasted_cost_usd_hangs_unbilled: f64,
    /// Users who gave up (counted in `failed`).
    pub cancelled: u64,
    /// Requests whose answer was a 429 (counted in `failed`).
    pub rate_limited: u64,
}

impl Figures {
    /// The same for the requests of one class of traffic (`None`: all),
    /// counting as answered the answers within `deadline_s`.
    pub fn of_class(
        upstreams: &[String],
        requests: &[RequestRecord],
        attempts: &[AttemptRecord],
        (from_s, to_s): (f64, f64),
        class: Option<usize>,
        deadline_s: Option<f64>,
    ) -> Figures {
        let inside = |r: &RequestRecord| r.arrival_s >= from_s && r.arrival_s < to_s;
        Figures::select(
            upstreams,
            requests,
            attempts,
            (from_s, to_s),
            class,
            deadline_s,
            inside,
        )
    }

    /// The requests after their upstream's heal: those that arrived at or
    /// after `heals[upstream]` (`None`: an upstream that did not fail and
    /// heal, whose requests are left out); health probes from the earliest
    /// heal on. `None` when no upstream healed.
    pub fn after_heal(
        upstreams: &[String],
        requests: &[RequestRecord],
        attempts: &[AttemptRecord],
        heals: &[Option<f64>],
        class: Option<usize>,
        deadline_s: Option<f64>,
    ) -> Option<Figures> {
        let from = heals.iter().flatten().copied().reduce(f64::min)?;
        let inside = |r: &RequestRecord| {
            heals
                .get(r.upstream)
                .copied()
                .flatten()
                .is_some_and(|heal| r.arrival_s >= heal)
        };
        Some(Figures::select(
            upstreams,
            requests,
            attempts,
            (from, f64::INFINITY),
            class,
            deadline_s,
            inside,
        ))
    }

    /// The requests `inside` picks (of `class`, when given); health probes
    /// count where they were sent, when within `[from_s, to_s)`.
    pub fn select(
        upstreams: &[String],
        requests: &[RequestRecord],
        attempts: &[AttemptRecord],
        (from_s, to_s): (f64, f64),
        class: Option<usize>,
        deadline_s: Option<f64>,
        inside: impl Fn(&RequestRecord) -> bool,
    ) -> Figures {
        let inside = |r: &RequestRecord| inside(r) && class.is_none_or(|c| r.class == c);
        let chosen: Vec<&RequestRecord> = requests.iter().filter(|r| inside(r)).collect();
        let count = |f: Fate| chosen.iter().filter(|r| r.fate == f).count() as u64;
        let answered = || chosen.iter().filter(|r| r.fate == Fate::Succeeded);
        // A health probe belongs to no request: it counts where it was sent.
        let theirs: Vec<&AttemptRecord> = attempts
            .iter()
            .filter(|a| match requests.get(a.request) {
                Some(r) => inside(r),
                None => class.is_none() && a.t_s >= from_s && a.t_s < to_s,
            })
            .collect();
        let n = chosen.len() as u64;
        let (failed, rejected) = (count(Fate::Failed), count(Fate::Rejected));
        let ratio = |x: f64| (n > 0).then(|| x / n as f64);
        Figures {
            from_s,
            to_s,
            requests: n,
            succeeded: count(Fate::Succeeded),
            answered: answered()
                .filter(|r| deadline_s.is_none_or(|d| r.wait_s <= d + 1e-9))
                .count() as u64,
            failed,
            rejected,
            attempts: upstreams
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let k = theirs.iter().filter(|a| a.upstream == i).count() as u64;
                    (name.clone(), k)
                })
                .collect(),
            user_error_rate: ratio((failed + rejected) as f64),
            wait: Waits::of(chosen.iter().map(|r| r.wait_s).collect()),
            answered_wait: Waits::of(answered().map(|r| r.wait_s).collect()),
            error_wait: Waits::of(
                chosen
                    .iter()
                    .filter(|r| r.fate != Fate::Succeeded)
                    .map(|r| r.wait_s)
                    .collect(),
            ),
            answered_ttft: Waits::of(answered().map(|r| r.first_byte_s).collect()),
            amplification: ratio(theirs.len() as f64),
            // A fold from +0: an empty f64 sum is -0.
            cost_usd: theirs.iter().fold(0.0, |sum, a| sum + a.cost_usd),
            wasted_cost_usd: theirs
                .iter()
                .filter(|a| !a.answered)
                .fold(0.0, |sum, a| sum + a.cost_usd),
            wasted_cost_usd_hangs_unbilled: theirs
                .iter()
                .filter(|a| !a.answered)
                .fold(0.0, |sum, a| sum + a.cost_hangs_unbilled_usd),
            cancelled: chosen.iter().filter(|r| r.cancelled).count() as u64,
            rate_limited: chosen.iter().filter(|r| r.rate_limited).count() as u64,
        }
    }

    /// A figure a write-up's table shows.
    pub fn figure(&self, figure: Figure, scenario: &Scenario) -> Option<f64> {
        let good_answer = scenario.upstreams[0].cost.billed(1.0);
        Some(match figure {
            Figure::Requests => self.requests as f64,
            Figure::Errors => (self.failed + self.rejected) as f64,
            Figure::PrimaryAttempts => self.attempts[0].1 as f64,
            Figure::UserErrorRate => self.user_error_rate?,
            Figure::WaitMean => self.wait?.mean_s,
            Figure::ErrorWaitMean => self.error_wait?.mean_s,
            Figure::WaitP99 => self.wait?.p99_s,
            Figure::AnsweredWaitMean => self.answered_wait?.mean_s,
            Figure::AnsweredWaitP99 => self.answered_wait?.p99_s,
            Figure::CostUsd => self.cost_usd,
            Figure::WastedCostUsd => self.wasted_cost_usd,
            Figure::CostMultiple => {
                let healthy = good_answer * self.requests as f64;
                (healthy > 0.0).then(|| self.cost_usd / healthy)?
            }
        })
    }
}

/// How one breaker (or, for a stack without one, the bare upstream) met an
/// upstream's failure and heal.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    pub upstream: String,
    /// The start of the healthy phases that end the scenario.
    pub healed_at_s: Option<f64>,
    /// From the heal to the circuit being closed for the rest of the run: 0
    /// when it was closed at the heal and stayed closed (always, without a
    /// breaker), `None` when it is not closed at the end.
    pub recovery_lag_s: Option<f64>,
    /// From the upstream's first failing phase to the circuit's first open.
    pub time_to_trip_s: Option<f64>,
    /// The outage's ground truth ([`Upstream::failing_share`](crate::scenario::Upstream::failing_share)).
    pub failing_share: Option<f64>,
    /// With health probes: what the recovery lag should stay within, the
    /// probe interval, twice the p99 time to a verdict of the stack's
    /// attempts on the healed upstream, and 1 s (see `with_bound`).
    pub lag_bound_s: Option<f64>,
}

impl Recovery {
    /// With several breakers for the upstream (one per key or per
    /// replica): the first trip and the last to close for good.
    pub fn of(scenario: &Scenario, upstream: usize, transitions: &[TransitionRecord]) -> Recovery {
        let u = &scenario.upstreams[upstream];
        let mut labels: Vec<&str> = Vec::new();
        for t in transitions.iter().filter(|t| belongs(&t.upstream, &u.name)) {
            if !labels.contains(&t.upstream.as_str()) {
                labels.push(&t.upstream);
            }
        }
        if labels.len() <= 1 {
            return Recovery::of_one(scenario, upstream, transitions, labels.first().copied());
        }
        let each: Vec<Recovery> = labels
            .iter()
            .map(|l| Recovery::of_one(scenario, upstream, transitions, Some(l)))
            .collect();
        let lags: Option<Vec<f64>> = each.iter().map(|r| r.recovery_lag_s).collect();
        Recovery {
            upstream: u.name.clone(),
            healed_at_s: each[0].healed_at_s,
            recovery_lag_s: lags.map(|l| l.into_iter().fold(0.0, f64::max)),
            time_to_trip_s: each
                .iter()
                .filter_map(|r| r.time_to_trip_s)
                .reduce(f64::min),
            failing_share: each[0].failing_share,
            lag_bound_s: None,
        }
    }

    fn of_one(
        scenario: &Scenario,
        upstream: usize,
        transitions: &[TransitionRecord],
        label: Option<&str>,
    ) -> Recovery {
        let u = &scenario.upstreams[upstream];
        let within = scenario.answer_within();
        let mine: Vec<&TransitionRecord> = transitions
            .iter()
            .filter(|t| Some(t.upstream.as_str()) == label)
            .collect();
        let healed_at_s = u.healed_at(within).map(|d| d.as_secs_f64());
        // Closed for good: the last change after the heal is a close, or
        // there is none and the circuit was closed at the heal.
        let recovery_lag_s = healed_at_s.and_then(|heal| {
            if mine.last().is_some_and(|t| t.to != "closed") {
                return None;
            }
            let last_change = mine.last().filter(|t| t.t_s > heal);
            Some(last_change.map_or(0.0, |t| t.t_s - heal))
        });
        let time_to_trip_s = u.failing_from(within).and_then(|from| {
            let from = from.as_secs_f64();
            mine.iter()
                .find(|t| t.t_s >= from && t.to == "open")
                .map(|t| t.t_s - from)
        });
        Recovery {
            upstream: u.name.clone(),
            healed_at_s,
            recovery_lag_s,
            time_to_trip_s,
            failing_share: u.failing_share(within, scenario.client.attempt_timeout),
            lag_bound_s: None,
        }
    }

    /// Sets the lag's bound for a breaker with health probes every
    /// `interval`: `interval + 2 × p99 + 1 s`, the p99 over `verdicts_s`, the
    /// times to a verdict of the attempts on the healed upstream. Nothing
    /// for an upstream that never failed or never healed, or without a
    /// verdict.
    pub fn with_bound(mut self, interval: Duration, mut verdicts_s: Vec<f64>) -> Recovery {
        if self.healed_at_s.is_none() || self.failing_share.is_none() || verdicts_s.is_empty() {
            return self;
        }
        verdicts_s.sort_by(f64::total_cmp);
        let rank = ((verdicts_s.len() as f64) * 0.99).ceil() as usize;
        let p99 = verdicts_s[rank.clamp(1, verdicts_s.len()) - 1];
        self.lag_bound_s = Some(interval.as_secs_f64() + 2.0 * p99 + 1.0);
        self
    }
}

/// Whether a breaker labelled `label` guards upstream `name`: its own, a
/// key of its model (`name/api-key`) or a replica's (`name#2`).
pub fn belongs(label: &str, name: &str) -> bool {
    match label.strip_prefix(name) {
        Some(rest) => rest.is_empty() || rest.starts_with(['/', '#']),
        None => false,
    }
}
