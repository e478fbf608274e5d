//! The response future of [`Failover`](super::Failover).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::util::{Oneshot, ServiceExt};
use tower_service::Service;

use tokio::time::Instant;

use super::by_kind::Rules;
use super::drain::Drained;
use super::hedge::Hedging;
use super::race::Race;
use super::select::{InFlight, Selection, Walk};
use super::then::{then, Then};
use super::{LastResortCircuit, Route};
use crate::breaker::Breaker;
use crate::classify::Classify;
use crate::classify::ErrorKind;
use crate::guard::{self, Judged};
use crate::retry::AttemptError;
use crate::rng::Rng;
use crate::Fallback;

pin_project! {
    /// Response future of [`Failover`](super::Failover).
    ///
    /// ```
    /// use tower::{Service, ServiceExt};
    /// use tower_circuit_breaker::failover::Failover;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let primary = Breaker::builder().build().unwrap();
    /// primary.force_open();
    /// let mut failover = Failover::new(CircuitBreaker::new(upstream.clone(), primary))
    ///     .fallback(CircuitBreaker::new(upstream, Breaker::builder().build().unwrap()));
    /// // The future skips the open primary without a pause and calls the fallback.
    /// let future = failover.ready().await.unwrap().call(http::Request::new(String::new()));
    /// assert_eq!(future.await.unwrap().status(), 200);
    /// # }
    /// ```
    pub struct ResponseFuture<S, Req, C>
    where
        S: Service<Req>,
    {
        routes: Arc<[Route<S, Req>]>,
        // The request as the caller sent it; the last upstream takes it.
        request: Option<Req>,
        // The breakers of the last-resort policy, until it has been tried.
        last_resort: Option<Arc<[LastResortCircuit]>>,
        next: usize,
        classifier: C,
        jitter: (Duration, Duration),
        rng: Rng,
        // The answer of the last upstream that was actually called.
        last: Option<Result<S::Response, S::Error>>,
        // How much of its body has been read (see `drain`).
        drained: Drained,
        // The rejection that admits soonest.
        rejected: Option<S::Error>,
        // Until the first attempt that reaches an upstream is sent.
        hedge: Option<Arc<Hedging>>,
        // A race is boxed: a failover that does not hedge keeps its future
        // the size it was (two attempts and a timer would double it).
        // Fallback by error kind, and selection of the first member.
        rules: Option<Arc<Rules>>,
        selection: Option<Selection>,
        walk: Walk,
        // When the attempt under way started, with a selection.
        started: Option<Instant>,
        // Counts that attempt in flight for the selection's cost.
        in_flight: Option<InFlight>,
        #[pin]
        state: Step<Oneshot<S, Req>, Pin<Box<Race<S, Req>>>>,
    }
}

pin_project! {
    #[project = StepProj]
    enum Step<F, R> {
        Start,
        Pausing {
            #[pin]
            sleep: Sleep,
        },
        Calling {
            #[pin]
            future: F,
        },
        Racing {
            #[pin]
            race: R,
        },
    }
}

impl<S: Service<Req>, Req, C> ResponseFuture<S, Req, C> {
    pub(super) fn new(
        routes: Arc<[Route<S, Req>]>,
        request: Req,
        last_resort: Option<Arc<[LastResortCircuit]>>,
        classifier: C,
        jitter: (Duration, Duration),
        rng: Rng,
        (hedge, rules, selection): (Option<Arc<Hedging>>, Option<Arc<Rules>>, Option<Selection>),
    ) -> Self {
        let walk = selection
            .as_ref()
            .map_or_else(Walk::default, |s| Walk::starting_at(s.choose(&rng)));
        ResponseFuture {
            routes,
            request: Some(request),
            last_resort,
            next: 0,
            classifier,
            jitter,
            rng,
            last: None,
            drained: Drained::default(),
            rejected: None,
            hedge,
            rules,
            selection,
            walk,
            started: None,
            in_flight: None,
            state: Step::Start,
        }
    }
}

impl<S, Req, C> fmt::Debug for ResponseFuture<S, Req, C>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("next", &self.next)
            .field("upstreams", &self.routes.len())
            .finish_non_exhaustive()
    }
}

impl<S, Req, C, B> Future for ResponseFuture<S, Req, C>
where
    S: Service<Req, Response = Response<B>> + Clone,
    B: http_body::Body + Unpin,
    S::Error: AttemptError,
    Req: Clone + Fallback,
    C: Classify,
{
    type Output = Result<Response<B>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StepProj::Start => {
                    let i = *this.next;
                    *this.next += 1;
                    let (route, mut request) = if i >= this.routes.len() {
                        // The last-resort call: every upstream rejected.
                        let route = &this.routes[i - this.routes.len()];
                        (route, this.request.take())
                    } else if *this.next == this.routes.len() && this.last_resort.is_none() {
                        (&this.routes[this.walk.member(i)], this.request.take())
                    } else {
                        (&this.routes[this.walk.member(i)], this.request.clone())
                    };
                    let mut request = request.take().expect("polled after completion");
                    // Every member but the last has one to go to; the last
                    // gets the request as it came, so a nested failover
                    // inherits the caller's mark.
                    if i + 1 < this.routes.len() {
                        request.mark_fallback();
                    }
                    if let Some(rewrite) = &route.rewrite {
                        rewrite(&mut request);
                    }
                    // A hedge goes to the walk's next member: the next in
                    // order, or the selection's second choice.
                    let hedged = this
                        .hedge
                        .as_deref()
                        .filter(|_| i + 1 < this.routes.len() && !request.is_retry());
                    if let Some(selection) = this.selection.as_ref().filter(|_| hedged.is_none()) {
                        *this.started = Some(Instant::now());
                        let member = i
                            .checked_sub(this.routes.len())
                            .unwrap_or_else(|| this.walk.member(i));
                        *this.in_flight = selection.start(member);
                    }
                    let future = route.service.clone().oneshot(request);
                    match hedged {
                        Some(hedging) => {
                            let race = Box::pin(Race::new(
                                hedging,
                                i,
                                future,
                                *this.walk,
                                this.selection.as_ref(),
                            ));
                            this.state.set(Step::Racing { race });
                        }
                        None => this.state.set(Step::Calling { future }),
                    }
                }
                StepProj::Pausing { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(Step::Start);
                }
                StepProj::Calling { .. } | StepProj::Racing { .. } => {
                    let result = match this.state.as_mut().project() {
                        StepProj::Racing { race } => {
                            let hedging = this.hedge.as_deref().expect("a race has its hedging");
                            let request = this.request.as_ref();
                            let raced = ready!(race.get_mut().as_mut().poll_race(
                                cx,
                                hedging,
                                this.routes,
                                request,
                                &*this.classifier
                            ));
                            // Hedged once, on the first attempt that was sent.
                            if raced.sent {
                                *this.hedge = None;
                            }
                            *this.next = raced.next;
                            raced.result
                        }
                        StepProj::Calling { future } => match future.poll(cx) {
                            Poll::Ready(result) => result,
                            Poll::Pending => {
                                // Under way: the answer kept from before is
                                // read meanwhile, so its breaker judges it.
                                this.drained.read(this.last, cx);
                                return Poll::Pending;
                            }
                        },
                        _ => unreachable!("matched above"),
                    };
                    let judged = guard::judge(&*this.classifier, &result);
                    *this.in_flight = None;
                    if judged != Judged::Rejected {
                        // An answer: the one kept from before is dropped.
                        this.drained.drop_kept(this.last, cx);
                    }
                    let (position, members) = (*this.next - 1, this.routes.len());
                    let member = match position.checked_sub(members) {
                        Some(last_resort) => last_resort,
                        None => this.walk.member(position),
                    };
                    if let (Some(selection), Some(at)) = (&*this.selection, this.started.take())
                        && judged != Judged::Rejected
                    {
                        selection.record_since(member, at);
                    }
                    if let Some(rules) = this.rules.as_deref()
                        && position < members
                        && let Ok(response) = &result
                        && let Some(&kind) = response.extensions().get::<ErrorKind>()
                        && let Some(to) = rules.target(kind, position, *this.walk, members)
                    {
                        // No pause: the member is not down, the request
                        // belongs elsewhere.
                        *this.last = Some(result);
                        *this.next = to;
                        this.state.set(Step::Start);
                        continue;
                    }
                    let then = match judged {
                        Judged::Said(outcome) => then(outcome),
                        // A spent budget is no outage: the next member would
                        // spend on, so the rejection is the answer.
                        Judged::Rejected if spent(&result) => Then::Return,
                        Judged::Rejected => Then::Skip,
                        Judged::Opaque => Then::Return,
                    };
                    let pause = match then {
                        Then::Return => return Poll::Ready(result),
                        Then::Skip => {
                            let error = result.err();
                            if soonest(error.as_ref(), this.rejected.as_ref()) {
                                *this.rejected = error;
                            }
                            false
                        }
                        Then::Fallback => {
                            *this.last = Some(result);
                            true
                        }
                    };
                    if *this.next >= this.routes.len() {
                        if this.last.is_none() && *this.next == this.routes.len() {
                            // Every upstream rejected the call.
                            if let Some(i) = this
                                .last_resort
                                .take()
                                .and_then(|b| grant(&b[..b.len().min(this.routes.len())]))
                            {
                                *this.next = this.routes.len() + i;
                                this.state.set(Step::Start);
                                continue;
                            }
                        }
                        let answer = match this.last.take() {
                            Some(last) => last,
                            None => Err(this.rejected.take().expect("an attempt was made")),
                        };
                        return Poll::Ready(answer);
                    }
                    let (low, high) = *this.jitter;
                    if pause && !high.is_zero() {
                        let sleep = tokio::time::sleep(this.rng.between(low, high));
                        this.state.set(Step::Pausing { sleep });
                    } else {
                        this.state.set(Step::Start);
                    }
                }
            }
        }
    }
}

/// Whether the attempt was rejected by a spend guard.
fn spent<R, E: AttemptError>(result: &Result<R, E>) -> bool {
    result
        .as_ref()
        .err()
        .and_then(AttemptError::circuit_open)
        .is_some_and(|open| open.reason() == crate::Rejection::SpendExceeded)
}

/// Whether rejection `new` admits sooner than `kept` (a known time beats
/// none).
fn soonest<E: AttemptError>(new: Option<&E>, kept: Option<&E>) -> bool {
    let at = |e: Option<&E>| e.and_then(|e| e.circuit_open()).and_then(|o| o.retry_at());
    match (at(new), at(kept)) {
        (_, None) => true,
        (Some(new), Some(kept)) => new < kept,
        (None, Some(_)) => false,
    }
}

/// Grants the last-resort call to the circuit that opened longest ago, if
/// any may have it; returns its upstream's index.
fn grant(circuits: &[LastResortCircuit]) -> Option<usize> {
    // A keyed circuit is looked up now: the breaker its key has at the moment.
    let breakers: Vec<Option<Breaker>> = circuits.iter().map(LastResortCircuit::breaker).collect();
    loop {
        let (i, _) = breakers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref()?.last_resort_candidate().map(|at| (i, at)))
            .min_by_key(|&(_, at)| at)?;
        if breakers[i].as_ref().is_some_and(Breaker::grant_last_resort) {
            return Some(i);
        }
    }
}
