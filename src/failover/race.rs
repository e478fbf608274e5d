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
    }
}

impl<S: Service<Req>, Req> Race<S, Req> {
    pub(super) fn new(hedging: &Hedging, member: usize, first: Oneshot<S, Req>) -> Self {
        let now = Instant::now();
        Race {
            first: Some(first),
            first_at: member,
            first_since: now,
            second: None,
            second_at: member,
            second_since: now,
            second_fresh: false,
            timer: Some(tokio::time::sleep(hedging.delay(member))),
            sent: false,
            failed: None,
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
                let judged = guard::judge(classifier, &result);
                if judged != Judged::Rejected {
                    if !*this.sent {
                        *this.sent = true;
                        hedging.policy.budget.deposit();
                    }
                    hedging.finished(*this.first_at, *this.first_since, &result);
                }
                if this.second.is_none() || settles(judged) {
                    if this.second.is_some() {
                        this.second.set(None);
                        hedging.lost(*this.second_at, *this.second_since);
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
                    hedging.finished(*self.second_at, *self.second_since, &result);
                }
                if self.first.is_none() || settles(judged) {
                    if self.first.is_some() {
                        self.first.set(None);
                        hedging.lost(*self.first_at, *self.first_since);
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
        let (Some(route), Some(request)) = (routes.get(from), request) else {
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
        true
    }
}
