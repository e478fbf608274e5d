//! Fallback chosen by what went wrong: a rule table from [`ErrorKind`] to
//! the member that should take the request next.

use std::fmt;

use std::sync::Arc;

use super::select::Walk;
use super::Failover;
use crate::classify::ErrorKind;

/// Where a [`Failover::on_kind`](super::Failover::on_kind) rule sends a
/// request whose answer carried an [`ErrorKind`].
///
/// ```
/// use tower_circuit_breaker::failover::FallbackTo;
///
/// // The long-context model is the third member.
/// let long_context = FallbackTo::Member(2);
/// assert_ne!(long_context, FallbackTo::Next);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FallbackTo {
    /// The member with this index (0 is the primary), in the order the
    /// members were added.
    Member(usize),
    /// The next member in the walk (another key of the same provider).
    Next,
}

/// A rule of [`Failover::on_kind`](super::Failover::on_kind) that names a
/// member the failover does not have.
///
/// ```
/// use tower_circuit_breaker::classify::ErrorKind;
/// use tower_circuit_breaker::failover::{Failover, FallbackTo};
///
/// let upstream = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let err = Failover::<_, http::Request<String>>::new(upstream)
///     .on_kind(ErrorKind::ContextLength, FallbackTo::Member(3))
///     .unwrap_err();
/// assert_eq!(err.to_string(), "fallback rule names member 3 of a failover with 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    member: usize,
    members: usize,
}

impl RuleError {
    /// The member index the rule named.
    ///
    /// ```
    /// # use tower_circuit_breaker::classify::ErrorKind;
    /// # use tower_circuit_breaker::failover::{Failover, FallbackTo};
    /// # let upstream = tower::service_fn(|_req: http::Request<String>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let err = Failover::<_, http::Request<String>>::new(upstream)
    ///     .on_kind(ErrorKind::ContentPolicy, FallbackTo::Member(5))
    ///     .unwrap_err();
    /// assert_eq!(err.member(), 5);
    /// ```
    #[must_use]
    pub fn member(&self) -> usize {
        self.member
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fallback rule names member {} of a failover with {}",
            self.member, self.members
        )
    }
}

impl std::error::Error for RuleError {}

impl<S, Req, C> Failover<S, Req, C> {
    /// Sends a request whose answer carried `kind` in its extensions (put
    /// there by [`ReadKind`](crate::kind::ReadKind) around each member) on
    /// to the member `to` names, with no pause: a context-length error to a
    /// long-context member, a content-policy refusal to another provider,
    /// an exhausted quota or a refused key to the next key
    /// ([`FallbackTo::Next`]). One rule per kind; a later one replaces it.
    ///
    /// A rule is followed only forward in the walk (to a member not tried
    /// yet in this call); the answer that triggered it is returned if every
    /// member after it rejects the call. Kinds without a rule fail over (or
    /// not) as they would without one. What the breakers record does not
    /// change: the 400 that moved the request is still
    /// [`Ignored`](crate::Outcome::Ignored). A member index the failover
    /// does not have is a [`RuleError`].
    ///
    /// # Errors
    ///
    /// A [`RuleError`] when `to` names a member the failover does not have.
    ///
    /// ```
    /// use tower::ServiceExt;
    /// use tower_circuit_breaker::classify::ErrorKind;
    /// use tower_circuit_breaker::failover::{Failover, FallbackTo};
    /// use tower_circuit_breaker::kind::ReadKind;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let model = |status: u16, body: &'static str| {
    ///     tower::service_fn(move |_req: http::Request<String>| async move {
    ///         Ok::<_, std::convert::Infallible>(http::Response::builder().status(status).body(body.to_owned()).unwrap())
    ///     })
    /// };
    /// let long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#;
    /// let (small, large) = (Breaker::builder().build().unwrap(), Breaker::builder().build().unwrap());
    /// let failover = Failover::new(ReadKind::new(CircuitBreaker::new(model(400, long), small.clone())))
    ///     .fallback(ReadKind::new(CircuitBreaker::new(model(200, "answer"), large)))
    ///     .on_kind(ErrorKind::ContextLength, FallbackTo::Member(1))
    ///     .unwrap();
    /// let res = failover.oneshot(http::Request::new(String::new())).await.unwrap();
    /// assert_eq!(res.status(), 200);
    /// assert_eq!(small.snapshot().counters.failures, 0, "a 400 is no failure");
    /// # }
    /// ```
    pub fn on_kind(mut self, kind: ErrorKind, to: FallbackTo) -> Result<Self, RuleError> {
        let mut rules = self.rules.as_deref().cloned().unwrap_or_default();
        rules.set(kind, to, self.routes.len())?;
        self.rules = Some(Arc::new(rules));
        Ok(self)
    }
}

/// The rule table of a failover: at most one target per kind.
#[derive(Debug, Clone, Default)]
pub(super) struct Rules {
    rules: Vec<(ErrorKind, FallbackTo)>,
}

impl Rules {
    pub(super) fn set(
        &mut self,
        kind: ErrorKind,
        to: FallbackTo,
        members: usize,
    ) -> Result<(), RuleError> {
        if let FallbackTo::Member(member) = to
            && member >= members
        {
            return Err(RuleError { member, members });
        }
        self.rules.retain(|(k, _)| *k != kind);
        self.rules.push((kind, to));
        Ok(())
    }

    /// The position in `walk` a rule sends an answer of `kind` from
    /// `position` to, if any: only forward, to a member not tried yet.
    pub(super) fn target(
        &self,
        kind: ErrorKind,
        position: usize,
        walk: Walk,
        members: usize,
    ) -> Option<usize> {
        let to = self.rules.iter().find(|(k, _)| *k == kind)?.1;
        let target = match to {
            FallbackTo::Member(m) if m < members => walk.position(m),
            FallbackTo::Member(_) => return None,
            FallbackTo::Next => position + 1,
        };
        (target > position && target < members).then_some(target)
    }
}
