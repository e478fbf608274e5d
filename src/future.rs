//! Future types

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;
use crate::breaker::CircuitOpen;
use crate::classify::Classify;
use crate::guard::Guard;
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
            guard: Guard,
            classifier: C,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(future: F, guard: Guard, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                guard,
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
                guard,
                classifier,
            } => {
                assert!(!guard.is_finished(), "polled after completion");
                let (head, body) = match ready!(future.poll(cx)) {
                    Ok(response) => response.into_parts(),
                    Err(error) => {
                        let error = error.into();
                        guard.on_error(classifier, &*error);
                        return Poll::Ready(Err(Error::from_inner(error)));
                    }
                };
                let body = match guard.on_head(classifier, head.status, &head.headers) {
                    None => ResponseBody::decided(body),
                    Some(pending) => ResponseBody::guarded(body, pending),
                };
                Poll::Ready(Ok(Response::from_parts(head, body)))
            }
            KindProj::Rejected { error } => Poll::Ready(Err(Error::open(
                error.take().expect("polled after completion"),
            ))),
        }
    }
}
