//! Small `tower::Service` adapters for the breakers that don't ship one.
//!
//! Both go through the breaker's own future API, the way its documentation
//! shows: the call's future is wrapped, and the breaker is asked on its first
//! poll.

use std::task::{Context, Poll};

use failsafe::futures::CircuitBreaker as _;
use tower::Service;

/// `inner` behind a [`failsafe`] state machine.
#[derive(Debug)]
pub struct Failsafe<S, P> {
    inner: S,
    breaker: failsafe::StateMachine<P, ()>,
}

impl<S: Clone, P> Clone for Failsafe<S, P> {
    fn clone(&self) -> Self {
        Failsafe {
            inner: self.inner.clone(),
            breaker: self.breaker.clone(),
        }
    }
}

impl<S, P> Failsafe<S, P> {
    /// Wraps `inner`; clones share `breaker`.
    pub fn new(inner: S, breaker: failsafe::StateMachine<P, ()>) -> Self {
        Failsafe { inner, breaker }
    }
}

impl<S, P, Req> Service<Req> for Failsafe<S, P>
where
    S: Service<Req>,
    P: failsafe::FailurePolicy + Send + Sync,
{
    type Response = S::Response;
    type Error = failsafe::Error<S::Error>;
    type Future = failsafe::futures::ResponseFuture<S::Future, P, (), failsafe::Any>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(failsafe::Error::Inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.breaker.call(self.inner.call(req))
    }
}

/// `inner` behind a [`recloser`] breaker.
#[derive(Debug, Clone)]
pub struct Recloser<S> {
    inner: S,
    breaker: recloser::AsyncRecloser,
}

impl<S> Recloser<S> {
    /// Wraps `inner`; clones share `breaker`.
    pub fn new(inner: S, breaker: recloser::AsyncRecloser) -> Self {
        Recloser { inner, breaker }
    }
}

impl<S, Req, T, E> Service<Req> for Recloser<S>
where
    S: Service<Req, Response = T, Error = E>,
{
    type Response = T;
    type Error = recloser::Error<E>;
    type Future = recloser::RecloserFuture<S::Future, recloser::AnyError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(recloser::Error::Inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.breaker.call(self.inner.call(req))
    }
}
