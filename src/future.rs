//! Future types

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;
use crate::breaker::Permit;
use crate::classify::{Classify, Verdict};
use crate::error::CircuitOpen;
use crate::{BoxError, Error};

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker).
    ///
    /// Dropping it before it completes releases the call's permit as
    /// [`Ignored`](crate::Outcome::Ignored).
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Called {
            #[pin]
            future: F,
            // Empty once the call has finished.
            permit: Permit,
            classifier: C,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(future: F, permit: Permit, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                permit,
                classifier,
            },
        }
    }

    pub(crate) fn rejected(error: CircuitOpen) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl<F, C> std::fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, C, B, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
    E: Into<BoxError>,
    C: Classify,
{
    type Output = Result<Response<ResponseBody<B, C::Stream>>, Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called {
                future,
                permit,
                classifier,
            } => {
                assert!(!permit.is_finished(), "polled after completion");
                let result = ready!(future.poll(cx));
                let (head, body) = match result {
                    Ok(response) => response.into_parts(),
                    Err(error) => {
                        let error = error.into();
                        permit.finish(classifier.classify_error(&*error));
                        return Poll::Ready(Err(Error::from_inner(error)));
                    }
                };
                permit.head_received();
                let body = match classifier.classify_response(head.status, &head.headers) {
                    Verdict::Done(outcome) => {
                        permit.finish(outcome);
                        ResponseBody::decided(body)
                    }
                    Verdict::Defer(stream) => ResponseBody::deferred(body, permit.take(), stream),
                };
                Poll::Ready(Ok(Response::from_parts(head, body)))
            }
            KindProj::Rejected { error } => Poll::Ready(Err(Error::open(
                error.take().expect("polled after completion"),
            ))),
        }
    }
}
