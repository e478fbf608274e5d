//! Racing a first attempt against its hedge.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::util::{Oneshot, ServiceExt};
use tower_service::Service;

use super::hedge::Hedging;
use super::select::{InFlight, Selection, Walk};
use super::then::{then, Then};
use super::Route;
use crate::classify::Classify;
use crate::guard::{self, Judged};
use crate::retry::AttemptError;
use crate::Fallback;

/// What a race ended with.
pub(super) struct Raced<T> {
    pub(super) result: T,
    /// The member to go on with, if the failover goes on.
    pub(super) next: usize,
    /// Whether the first attempt reached its upstream (else the race is
    /// still to come, on the next member).
    pub(super) sent: bool,
}

pin_project! {
    /// A first attempt and, after the hedge's delay, a second one.
    #[project = RaceProj]
    pub(super) struct Race<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        first: Option<Oneshot<S, Req>>,
        // Positions in the walk (the members in order, or the selection's
        // choice first); `walk` turns them into members.
        first_at: usize,
        first_since: Instant,
        #[pin]
        second: Option<Oneshot<S, Req>>,
        second_at: usize,
        second_since: Instant,
        // Not polled yet: a rejection on its first poll was never sent.
        second_fresh: bool,
        #[pin]
        timer: Option<Sleep>,
        sent: bool,
        // The answer of the one that failed while the other runs.
        failed: Option<Result<S::Response, S::Error>>,
        walk: Walk,
        // With a selection: its estimates get each attempt's sample, and
        // count the attempts in flight.
        selection: Option<Selection>,
        first_flight: Option<InFlight>,
        second_flight: Option<InFlight>,
    }
}

impl<S: Service<Req>, Req> Race<S, Req> {
    pub(super) fn new(
        hedging: &Hedging,
        position: usize,
        first: Oneshot<S, Req>,
        walk: Walk,
        selection: Option<&Selection>,
    ) -> Self {
        let now = Instant::now();
        let member = walk.member(position);
        Race {
            first: Some(first),
            first_at: position,
            first_since: now,
            second: None,
            second_at: position,
            second_since: now,
            second_fresh: false,
            timer: Some(tokio::time::sleep(hedging.delay(member))),
            sent: false,
            failed: None,
            walk,
            selection: selection.cloned(),
            first_flight: selection.and_then(|s| s.start(member)),
            second_flight: None,
        }
    }
}

/// Whether an answer ends the race: anything the failover would return.
fn settles(judged: Judged) -> bool {
    match judged {
        Judged::Said(outcome) => matches!(then(outcome), Then::Return),
        Judged::Rejected => false,
        Judged::Opaque => true,
    }
}

impl<S, Req, B> Race<S, Req>
where
    S: Service<Req, Response = Response<B>> + Clone,
    S::Error: AttemptError,
    Req: Clone + Fallback,
{
    pub(super) fn poll_race<C: Classify>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        hedging: &Hedging,
        routes: &[Route<S, Req>],
        request: Option<&Req>,
        classifier: &C,
    ) -> Poll<Raced<Result<Response<B>, S::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(first) = this.first.as_mut().as_pin_mut() {
                let Poll::Ready(result) = first.poll(cx) else {
                    if !*this.sent {
                        // It reached its upstream: a first attempt, for the budget.
                        *this.sent = true;
                        hedging.policy.budget.deposit();
                    }
                    // Fall through to the hedge and its timer.
                    return this.poll_second(cx, hedging, routes, request, classifier);
                };
                this.first.set(None);
                this.timer.set(None);
                *this.first_flight = None;
                let judged = guard::judge(classifier, &result);
                if judged != Judged::Rejected {
                    if !*this.sent {
                        *this.sent = true;
                        hedging.policy.budget.deposit();
                    }
                    let member = this.walk.member(*this.first_at);
                    hedging.finished(member, *this.first_since, &result);
                    if let Some(selection) = this.selection.as_ref() {
                        selection.record_since(member, *this.first_since);
                    }
                }
                if this.second.is_none() || settles(judged) {
                    if this.second.is_some() {
                        this.second.set(None);
                        *this.second_flight = None;
                        let member = this.walk.member(*this.second_at);
                        lost(hedging, this.selection.as_ref(), member, *this.second_since);
                    }
                    return Poll::Ready(this.end(judged, result));
                }
                if judged != Judged::Rejected {
                    *this.failed = Some(result);
                }
                continue;
            }
            // The first failed; the hedge runs on.
            return this.poll_second(cx, hedging, routes, request, classifier);
        }
    }
}

impl<S, Req, B> RaceProj<'_, S, Req>
where
    S: Service<Req, Response = Response<B>> + Clone,
    S::Error: AttemptError,
    Req: Clone + Fallback,
{
    /// Polls the hedge, or its timer.
    fn poll_second<C: Classify>(
        &mut self,
        cx: &mut Context<'_>,
        hedging: &Hedging,
        routes: &[Route<S, Req>],
        request: Option<&Req>,
        classifier: &C,
    ) -> Poll<Raced<Result<Response<B>, S::Error>>> {
        loop {
            if let Some(second) = self.second.as_mut().as_pin_mut() {
                let fresh = std::mem::take(self.second_fresh);
                let Poll::Ready(result) = second.poll(cx) else {
                    return Poll::Pending;
                };
                self.second.set(None);
                *self.second_flight = None;
                let judged = guard::judge(classifier, &result);
                if judged == Judged::Rejected {
                    if fresh {
                        // Never sent: the budget gets it back, and the
                        // member after it may take the hedge.
                        hedging.policy.budget.refund();
                        hedging.policy.sent.fetch_sub(1, Ordering::Relaxed);
                        let from = *self.second_at + 1;
                        if self.first.is_some() && self.launch(hedging, routes, request, from) {
                            continue;
                        }
                    }
                } else {
                    let member = self.walk.member(*self.second_at);
                    hedging.finished(member, *self.second_since, &result);
                    if let Some(selection) = self.selection.as_ref() {
                        selection.record_since(member, *self.second_since);
                    }
                }
                if self.first.is_none() || settles(judged) {
                    if self.first.is_some() {
                        self.first.set(None);
                        *self.first_flight = None;
                        let member = self.walk.member(*self.first_at);
                        lost(hedging, self.selection.as_ref(), member, *self.first_since);
                    }
                    return Poll::Ready(self.end(judged, result));
                }
                if judged != Judged::Rejected {
                    *self.failed = Some(result);
                }
                // Back to waiting for the first.
                return Poll::Pending;
            }
            if self.first.is_none() {
                return Poll::Pending;
            }
            let Some(timer) = self.timer.as_mut().as_pin_mut() else {
                return Poll::Pending;
            };
            if timer.poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.timer.set(None);
            let from = *self.first_at + 1;
            if !self.launch(hedging, routes, request, from) {
                return Poll::Pending;
            }
        }
    }

    /// The race's answer: `result`, or the failure kept from the other
    /// attempt when `result` is a rejection.
    fn end(
        &mut self,
        judged: Judged,
        result: Result<Response<B>, S::Error>,
    ) -> Raced<Result<Response<B>, S::Error>> {
        let result = match (judged, self.failed.take()) {
            (Judged::Rejected, Some(failed)) => failed,
            _ => result,
        };
        Raced {
            result,
            next: (*self.first_at).max(*self.second_at) + 1,
            sent: *self.sent,
        }
    }

    /// Sends the hedge to member `from`, if the budget holds one.
    fn launch(
        &mut self,
        hedging: &Hedging,
        routes: &[Route<S, Req>],
        request: Option<&Req>,
        from: usize,
    ) -> bool {
        // The hedge goes to the walk's next position: the next member in
        // order, or with a selection the member it would try second.
        let member = self.walk.member(from);
        let (Some(route), Some(request)) =
            (routes.get(member).filter(|_| from < routes.len()), request)
        else {
            return false;
        };
        if !hedging.policy.budget.withdraw() {
            return false;
        }
        hedging.policy.sent.fetch_add(1, Ordering::Relaxed);
        let mut request = request.clone();
        if from + 1 < routes.len() {
            request.mark_fallback();
        }
        if let Some(rewrite) = &route.rewrite {
            rewrite(&mut request);
        }
        self.second
            .set(Some(route.service.clone().oneshot(request)));
        *self.second_at = from;
        *self.second_since = Instant::now();
        *self.second_fresh = true;
        *self.second_flight = self.selection.as_ref().and_then(|s| s.start(member));
        true
    }
}

/// A lost attempt's elapsed time, a censored sample for the member's
/// latency and the selection's estimate: it had no head after that long.
fn lost(hedging: &Hedging, selection: Option<&Selection>, member: usize, since: Instant) {
    hedging.lost(member, since);
    if let Some(selection) = selection {
        selection.record_at_least(member, since.elapsed());
    }
}
