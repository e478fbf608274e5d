//! [`ScriptedBody`]: the bodies a scripted upstream answers with, and how
//! each [`Answer`] becomes a response.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame};
use tokio::time::{Instant, Sleep};

use super::{Answer, TOKEN_GAP};
use crate::BoxError;

const TOKEN: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n";
const DONE: &[u8] = b"data: [DONE]\n\n";
const TOKEN_AND_DONE: &[u8] =
    b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n";
const OVERLOADED: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
const COMPLETION: &str = r#"{"choices":[{"message":{"role":"assistant","content":"ok"}}]}"#;
const UPSTREAM_ERROR: &str = r#"{"error":{"type":"upstream_error"}}"#;
const CONTEXT_LENGTH: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
const INSUFFICIENT_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
const CONTENT_FILTER: &str = r#"{"error":{"code":"content_filter","message":"The response was filtered due to the prompt triggering content management policy.","type":"invalid_request_error"}}"#;

/// The bodies of a good answer that reports its `usage` (see
/// [`ScriptBuilder::usage`](super::ScriptBuilder::usage)), made once per
/// script.
#[derive(Debug)]
pub(super) struct UsageBodies {
    /// The JSON completion.
    completion: Bytes,
    /// A stream's end: the usage chunk, then `data: [DONE]`.
    done: Bytes,
    /// A token, the usage chunk and `data: [DONE]`, in one frame.
    token_and_done: Bytes,
}

impl UsageBodies {
    pub(super) fn new(model: &str, input: u64, output: u64) -> Self {
        // A model name is a JSON string: only plain characters are kept.
        let model: String = model
            .chars()
            .filter(|c| c.is_ascii_graphic() && *c != '"' && *c != '\\')
            .collect();
        let usage = format!(
            r#""usage":{{"prompt_tokens":{input},"completion_tokens":{output},"total_tokens":{}}}"#,
            input.saturating_add(output)
        );
        let chunk = format!("data: {{\"model\":\"{model}\",\"choices\":[],{usage}}}\n\n");
        let done = format!("{chunk}data: [DONE]\n\n");
        UsageBodies {
            completion: Bytes::from(format!(
                r#"{{"model":"{model}","choices":[{{"message":{{"role":"assistant","content":"ok"}}}}],{usage}}}"#
            )),
            token_and_done: Bytes::from(format!(
                "{}{done}",
                std::str::from_utf8(TOKEN).unwrap_or("")
            )),
            done: Bytes::from(done),
        }
    }
}

/// Waits out `answer`'s latency and answers it. With `tokens`, an event
/// stream sends a token every [`TOKEN_GAP`] before its last event; without,
/// only its last event. With `usage`, a good answer reports it.
pub(super) async fn respond(
    answer: Answer,
    tokens: bool,
    usage: Option<&UsageBodies>,
) -> Result<Response<ScriptedBody>, BoxError> {
    match answer {
        Answer::Ok { latency, stream } if tokens && !stream.is_zero() => {
            tokio::time::sleep(latency).await;
            let done = usage.map_or(Bytes::from_static(DONE), |u| u.done.clone());
            Ok(token_stream(stream, Some(done)))
        }
        Answer::SseError { latency, stream } if tokens => {
            tokio::time::sleep(latency).await;
            Ok(token_stream(stream, Some(Bytes::from_static(OVERLOADED))))
        }
        Answer::Stall {
            latency,
            stall_after,
        } => {
            tokio::time::sleep(latency).await;
            Ok(token_stream(stall_after, None))
        }
        Answer::Ok { latency, stream } if !stream.is_zero() => {
            tokio::time::sleep(latency).await;
            let events = usage.map_or(Bytes::from_static(TOKEN_AND_DONE), |u| {
                u.token_and_done.clone()
            });
            Ok(sse(stream, events))
        }
        Answer::Ok { latency, .. } => {
            tokio::time::sleep(latency).await;
            Ok(match usage {
                Some(u) => json_bytes(StatusCode::OK, u.completion.clone()),
                None => json(StatusCode::OK, COMPLETION),
            })
        }
        Answer::Status {
            code,
            latency,
            retry_after,
        } => {
            tokio::time::sleep(latency).await;
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = json(status, UPSTREAM_ERROR);
            if let Some(wait) = retry_after {
                set_retry_after(response.headers_mut(), wait);
            }
            Ok(response)
        }
        Answer::Hang => std::future::pending().await,
        Answer::Reset { latency } => {
            tokio::time::sleep(latency).await;
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection reset by peer",
            )
            .into())
        }
        Answer::SseError { latency, stream } => {
            tokio::time::sleep(latency).await;
            Ok(sse(stream, Bytes::from_static(OVERLOADED)))
        }
        Answer::ContentFilter { latency } => {
            tokio::time::sleep(latency).await;
            Ok(json(StatusCode::BAD_REQUEST, CONTENT_FILTER))
        }
        Answer::ContextLength { latency } => {
            tokio::time::sleep(latency).await;
            Ok(json(StatusCode::BAD_REQUEST, CONTEXT_LENGTH))
        }
        Answer::QuotaExhausted { latency } => {
            tokio::time::sleep(latency).await;
            Ok(json(StatusCode::TOO_MANY_REQUESTS, INSUFFICIENT_QUOTA))
        }
    }
}

/// A 200 event stream that sends a token every [`TOKEN_GAP`] from now for
/// `tokens_for`, then `last` at `tokens_for`, or (without `last`) nothing
/// ever again, with the connection open.
fn token_stream(tokens_for: Duration, last: Option<Bytes>) -> Response<ScriptedBody> {
    let head = Instant::now();
    let count =
        u32::try_from(tokens_for.as_nanos().div_ceil(TOKEN_GAP.as_nanos())).unwrap_or(u32::MAX);
    event_stream(Kind::Tokens {
        head,
        sent: 0,
        count,
        last_at: head + tokens_for,
        last,
        next: Box::pin(tokio::time::sleep_until(head)),
        ended: false,
    })
}

/// A 200 event stream that sends `events` after `delay`.
fn sse(delay: Duration, events: Bytes) -> Response<ScriptedBody> {
    event_stream(Kind::Sse {
        delay: Box::pin(tokio::time::sleep(delay)),
        event: Some(events),
    })
}

fn event_stream(kind: Kind) -> Response<ScriptedBody> {
    let mut response = Response::new(ScriptedBody(kind));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

fn set_retry_after(headers: &mut HeaderMap, wait: Duration) {
    if wait.subsec_nanos() == 0 {
        headers.insert(RETRY_AFTER, HeaderValue::from(wait.as_secs()));
    } else {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        headers.insert("retry-after-ms", HeaderValue::from(ms));
    }
}

fn json(status: StatusCode, body: &'static str) -> Response<ScriptedBody> {
    json_bytes(status, Bytes::from_static(body.as_bytes()))
}

fn json_bytes(status: StatusCode, body: Bytes) -> Response<ScriptedBody> {
    let mut response = Response::new(ScriptedBody::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

// === ScriptedBody ===

/// The response body of a [`ScriptedUpstream`](super::ScriptedUpstream): a
/// whole JSON document, or an event stream whose frames come on Tokio's
/// clock. It never fails; a stream that stalls simply stops sending.
///
/// ```
/// use http_body_util::BodyExt;
/// use tower_circuit_breaker::testing::ScriptedBody;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let body = ScriptedBody::from(bytes::Bytes::from_static(b"{}"));
/// assert_eq!(body.collect().await.unwrap().to_bytes(), "{}");
/// # }
/// ```
pub struct ScriptedBody(Kind);

enum Kind {
    Full(Option<Bytes>),
    Sse {
        delay: Pin<Box<Sleep>>,
        event: Option<Bytes>,
    },
    /// Tokens from `head`, `count` of them, then `last` (or silence).
    Tokens {
        head: Instant,
        sent: u32,
        count: u32,
        last_at: Instant,
        last: Option<Bytes>,
        next: Pin<Box<Sleep>>,
        ended: bool,
    },
}

impl From<Bytes> for ScriptedBody {
    fn from(bytes: Bytes) -> Self {
        ScriptedBody(Kind::Full(Some(bytes)))
    }
}

impl Default for ScriptedBody {
    /// An empty body.
    fn default() -> Self {
        ScriptedBody(Kind::Full(None))
    }
}

impl fmt::Debug for ScriptedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            Kind::Full(_) => "full",
            Kind::Sse { .. } => "event stream",
            Kind::Tokens { .. } => "token stream",
        };
        f.debug_tuple("ScriptedBody").field(&kind).finish()
    }
}

impl Body for ScriptedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().0 {
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Sse { delay, event } => {
                if event.is_none() {
                    return Poll::Ready(None);
                }
                match delay.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(event.take().map(|d| Ok(Frame::data(d)))),
                    Poll::Pending => Poll::Pending,
                }
            }
            Kind::Tokens {
                head,
                sent,
                count,
                last_at,
                last,
                next,
                ended,
            } => {
                if *ended {
                    return Poll::Ready(None);
                }
                let due = if *sent < *count {
                    *head + TOKEN_GAP * *sent
                } else if last.is_some() {
                    *last_at
                } else {
                    // Stalled: silent, and never done.
                    return Poll::Pending;
                };
                if next.deadline() != due {
                    next.as_mut().reset(due);
                }
                if next.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if *sent < *count {
                    *sent += 1;
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(TOKEN)))));
                }
                *ended = true;
                Poll::Ready(last.take().map(|d| Ok(Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Full(data) => data.is_none(),
            Kind::Sse { event, .. } => event.is_none(),
            Kind::Tokens { ended, .. } => *ended,
        }
    }
}
