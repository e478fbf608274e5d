//! Answers to send back when the circuit is open.
//!
//! A server whose handler calls an upstream through a breaker should tell its
//! own clients when and for how long that upstream is off limits:
//! [`service_unavailable`] builds a `503 Service Unavailable` with
//! `Retry-After`, and [`grpc_unavailable`] the gRPC equivalent. Both are
//! plain [`http::Response`]s with any body type that has a `Default`, so they
//! work with axum, hyper or tonic without this crate depending on them.
//!
//! # Example
//!
//! In axum, the breaker's error reaches a `HandleErrorLayer`:
//!
//! ```
//! use std::time::Duration;
//! use axum::error_handling::HandleErrorLayer;
//! use axum::response::{IntoResponse, Response};
//! use axum::Router;
//! use http::StatusCode;
//! use tower::ServiceBuilder;
//! use tower_circuit_breaker::{response::service_unavailable, CircuitBreakerLayer};
//!
//! async fn on_error(err: tower_circuit_breaker::Error) -> Response {
//!     match err.circuit_open() {
//!         // 503 with `Retry-After: <seconds until the next probe>`.
//!         Some(open) => service_unavailable(open),
//!         None => (StatusCode::BAD_GATEWAY, err.to_string()).into_response(),
//!     }
//! }
//!
//! # fn main() -> Result<(), tower_circuit_breaker::ConfigError> {
//! // The route forwards to an upstream (here, one that is always down).
//! let upstream = tower::service_fn(|_req: http::Request<axum::body::Body>| async {
//!     Ok::<_, std::convert::Infallible>(
//!         http::Response::builder().status(503).body(axum::body::Body::empty()).unwrap(),
//!     )
//! });
//! let breaker = CircuitBreakerLayer::builder()
//!     .consecutive_failures(5)
//!     .open_duration(Duration::from_secs(30))
//!     .build()?;
//! let app: Router = Router::new().route_service(
//!     "/v1/chat",
//!     ServiceBuilder::new()
//!         .layer(HandleErrorLayer::new(on_error))
//!         .layer(breaker)
//!         .service(upstream),
//! );
//! # let _ = app; Ok(()) }
//! ```
//!
//! A handler that holds the client itself does the same with the error it
//! gets back:
//!
//! ```
//! use tower_circuit_breaker::{response::service_unavailable, Breaker};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let breaker = Breaker::builder().open_duration(std::time::Duration::from_secs(30)).build().unwrap();
//! breaker.force_open();
//! let open = breaker.admit().unwrap_err();
//! let res: http::Response<String> = service_unavailable(&open);
//! assert_eq!(res.status(), 503);
//! assert!(res.headers().get("retry-after").is_none()); // forced open: no known end
//! # }
//! ```
//!
//! [`http::Response`]: https://docs.rs/http/1/http/response/struct.Response.html

use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::error::CircuitOpen;

/// A `503 Service Unavailable` for a call the circuit rejected, with an empty
/// body and `Retry-After` set to the time until the next probe, in whole
/// seconds rounded up (so a client that waits that long finds the circuit
/// ready to probe). `Retry-After` is left out when the wait is not known
/// (half-open with every probe out, or forced open).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{response::service_unavailable, Breaker, Outcome, TripMode};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let breaker = Breaker::builder()
///     .trip_mode(TripMode::Open)
///     .consecutive_failures(1)
///     .open_duration(Duration::from_millis(7_500))
///     .jitter(0.0)
///     .build()
///     .unwrap();
/// breaker.admit().unwrap().record(Outcome::Failure);
/// let open = breaker.admit().unwrap_err();
///
/// let res: http::Response<String> = service_unavailable(&open);
/// assert_eq!(res.status(), 503);
/// assert_eq!(res.headers()["retry-after"], "8"); // 7.5 s, rounded up
/// # }
/// ```
pub fn service_unavailable<B: Default>(open: &CircuitOpen) -> Response<B> {
    let mut res = Response::new(B::default());
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    if let Some(wait) = open.retry_after() {
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
    }
    res
}

/// A trailers-only gRPC answer for a call the circuit rejected: HTTP 200 with
/// `grpc-status: 14` (`UNAVAILABLE`), `grpc-message: circuit open`, and
/// `grpc-retry-pushback-ms` when the wait until the next probe is known.
///
/// A gRPC client (tonic included) reads it as `Status::unavailable`, which
/// its retry policy understands. A server can return it from a handler; a
/// client stack can map a rejection into it so that callers see
/// `UNAVAILABLE` instead of `UNKNOWN`.
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::{response::grpc_unavailable, Breaker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().build().unwrap();
/// breaker.force_open();
/// let res: http::Response<()> = grpc_unavailable(&breaker.admit().unwrap_err());
/// assert_eq!(res.status(), 200);
/// assert_eq!(res.headers()["grpc-status"], "14");
/// assert_eq!(res.headers()["content-type"], "application/grpc");
/// # }
/// ```
pub fn grpc_unavailable<B: Default>(open: &CircuitOpen) -> Response<B> {
    let mut res = Response::new(B::default());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static("14"));
    headers.insert("grpc-message", HeaderValue::from_static("circuit open"));
    if let Some(wait) = open.retry_after() {
        // Rounded up, like `Retry-After`: never invite a call too early.
        let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
    }
    res
}

/// The answer for a call the circuit rejected: [`payment_required`] when a
/// spend budget is spent ([`Rejection::SpendExceeded`](crate::Rejection::SpendExceeded)),
/// else [`service_unavailable`]. Never a 429 or a 503 for a spent budget: the
/// common SDKs retry those, and a retry only spends on.
///
/// ```
/// use tower_circuit_breaker::{response::rejected, Breaker};
///
/// let breaker = Breaker::builder().build().unwrap();
/// breaker.force_open();
/// let res: http::Response<String> = rejected(&breaker.admit().unwrap_err());
/// assert_eq!(res.status(), 503);
/// ```
#[must_use]
pub fn rejected<B: From<String>>(open: &CircuitOpen) -> Response<B> {
    if open.spend().is_some() {
        return payment_required(open);
    }
    let res: Response<()> = service_unavailable(open);
    res.map(|()| B::from(String::new()))
}

/// A `402 Payment Required` for a call a spend guard rejected, with
/// `x-should-retry: false` (read by the OpenAI and Anthropic SDKs) and a
/// JSON body in the shape of an API error:
///
/// ```text
/// {"error":{"type":"spend_exceeded","code":"spend_exceeded","message":"...",
///           "budget":1000000,"spent":1050000,"unit":"usd_micros","resets_in_ms":3600000}}
/// ```
///
/// The common SDKs retry 408, 409, 429 and 5xx answers, not a 402. For a
/// rejection of another kind, the same body without the budget's fields.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::response::payment_required;
/// use tower_circuit_breaker::spend::{Charge, Period, SpendGuard};
/// use tower_circuit_breaker::{Breaker, Outcome};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let breaker = Breaker::builder()
///     .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::Rolling(Duration::from_secs(60))))
///     .build()
///     .unwrap();
/// let mut permit = breaker.admit().unwrap();
/// permit.charge(Charge::Observed(1_000_000));
/// permit.record(Outcome::Success);
/// let res: http::Response<String> = payment_required(&breaker.admit().unwrap_err());
/// assert_eq!(res.status(), 402);
/// assert_eq!(res.headers()["x-should-retry"], "false");
/// assert!(res.body().contains(r#""spent":1000000,"unit":"usd_micros","resets_in_ms":60000"#));
/// # }
/// ```
pub fn payment_required<B: From<String>>(open: &CircuitOpen) -> Response<B> {
    use std::fmt::Write;
    let mut body =
        String::from(r#"{"error":{"type":"spend_exceeded","code":"spend_exceeded","message":""#);
    for c in open.to_string().chars() {
        match c {
            '"' => body.push_str("\\\""),
            '\\' => body.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(body, "\\u{:04x}", c as u32);
            }
            c => body.push(c),
        }
    }
    body.push('"');
    if let Some(spend) = open.spend() {
        let ms = open.retry_after().map_or(0, |d| {
            u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        });
        let _ = write!(
            body,
            r#","budget":{},"spent":{},"unit":"{}","resets_in_ms":{}"#,
            spend.budget(),
            spend.spent(),
            spend.unit().as_str(),
            ms
        );
    }
    body.push_str("}}");
    let mut res = Response::new(B::from(body));
    *res.status_mut() = StatusCode::PAYMENT_REQUIRED;
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("x-should-retry", HeaderValue::from_static("false"));
    res
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(7)), 7);
        assert_eq!(whole_seconds(Duration::from_millis(29_999)), 30);
        assert_eq!(whole_seconds(Duration::MAX), u64::MAX);
    }
}
