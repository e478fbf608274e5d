//! Glue shared by the client integrations (reqwest, reqwest-middleware,
//! async-openai).

/// The classifier the client integrations use unless told otherwise.
#[cfg(any(feature = "reqwest-middleware", feature = "async-openai"))]
pub(crate) type DefaultClassifier = crate::classify::LlmClassifier;

pub(crate) use self::reqwest_response::ReqwestAdapter;

#[cfg(feature = "reqwest")]
pub(crate) use self::reqwest_response::keep_url;

#[cfg(any(
    feature = "reqwest",
    feature = "reqwest-middleware",
    feature = "async-openai"
))]
mod reqwest_response {
    use ::reqwest::{ResponseBuilderExt, Url};
    use http::{HeaderMap, StatusCode};

    use crate::body::ResponseBody;
    use crate::classify::{ClassifyStream, ErrorRef};
    use crate::future::{Adapt, Adapter};

    /// An adapter whose calls answer a `reqwest::Response` (async-openai,
    /// reqwest-middleware, reqwest's own types): it says only what its
    /// errors are; the answer is shuffled the same way for all.
    pub trait ReqwestAdapter<E>: Adapt {
        /// What the caller gets for an error or a refusal.
        type Error;

        /// See [`Adapter::error`].
        fn error(error: E, judge: impl FnOnce(Option<ErrorRef<'_>>)) -> Self::Error;

        /// See [`Adapter::refused`].
        fn refused(refused: Self::Refused) -> Self::Error;
    }

    impl<A, E, S> Adapter<::reqwest::Response, E, S> for A
    where
        A: ReqwestAdapter<E>,
        S: ClassifyStream + Send + Sync + 'static,
    {
        type Body = ::reqwest::Body;
        type Response = ::reqwest::Response;
        type Error = <A as ReqwestAdapter<E>>::Error;

        /// reqwest keeps the body behind its own type, so a body that
        /// carries a verdict takes a detour: `reqwest::Response` ->
        /// `http::Response<reqwest::Body>` -> wrapped in [`ResponseBody`] ->
        /// `reqwest::Body::wrap` -> `reqwest::Response`.
        fn answer<P>(
            response: ::reqwest::Response,
            head: impl FnOnce(StatusCode, &HeaderMap) -> Option<P>,
            wrap: impl FnOnce(::reqwest::Body, P) -> ResponseBody<::reqwest::Body, S>,
        ) -> ::reqwest::Response {
            match head(response.status(), response.headers()) {
                None => response,
                Some(pending) => {
                    let url = response.url().clone();
                    let response: http::Response<::reqwest::Body> = response.into();
                    let mut response =
                        response.map(|body| ::reqwest::Body::wrap(wrap(body, pending)));
                    keep_url(&mut response, url);
                    ::reqwest::Response::from(response)
                }
            }
        }

        fn error(error: E, judge: impl FnOnce(Option<ErrorRef<'_>>)) -> Self::Error {
            <A as ReqwestAdapter<E>>::error(error, judge)
        }

        fn refused(refused: A::Refused) -> Self::Error {
            <A as ReqwestAdapter<E>>::refused(refused)
        }
    }

    /// reqwest keeps a response's final URL in an extension that only its
    /// response builder can set; put it back so that `Response::url` survives
    /// the trip through `http::Response`.
    pub(crate) fn keep_url<B>(response: &mut http::Response<B>, url: Url) {
        if let Ok(marker) = http::Response::builder().url(url).body(()) {
            response
                .extensions_mut()
                .extend(marker.into_parts().0.extensions);
        }
    }
}
