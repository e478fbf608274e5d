//! Glue shared by the client integrations (reqwest, reqwest-middleware,
//! async-openai).

/// The classifier the client integrations use unless told otherwise.
#[cfg(any(feature = "reqwest-middleware", feature = "async-openai"))]
pub(crate) type DefaultClassifier = crate::classify::LlmClassifier;

pub(crate) use self::reqwest_response::record_response;

#[cfg(feature = "reqwest")]
pub(crate) use self::reqwest_response::keep_url;

#[cfg(any(
    feature = "reqwest",
    feature = "reqwest-middleware",
    feature = "async-openai"
))]
mod reqwest_response {
    use ::reqwest::{ResponseBuilderExt, Url};

    use crate::{body::ResponseBody, classify::Classify, guard::Guard};

    /// Records a response head and, when the classifier defers, hands the
    /// call's guard to the body so the end of the stream decides.
    ///
    /// reqwest keeps the body behind its own type, so the body takes a detour:
    /// `reqwest::Response` -> `http::Response<reqwest::Body>` -> wrapped in
    /// [`ResponseBody`] -> `reqwest::Body::wrap` -> `reqwest::Response`.
    pub(crate) fn record_response<C>(
        guard: &mut Guard,
        classifier: &C,
        response: ::reqwest::Response,
    ) -> ::reqwest::Response
    where
        C: Classify,
        C::Stream: Send + Sync + 'static,
    {
        match guard.on_head(classifier, response.status(), response.headers()) {
            None => response,
            Some(pending) => {
                let url = response.url().clone();
                let response: http::Response<::reqwest::Body> = response.into();
                let mut response = response
                    .map(|body| ::reqwest::Body::wrap(ResponseBody::guarded(body, pending)));
                keep_url(&mut response, url);
                ::reqwest::Response::from(response)
            }
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
