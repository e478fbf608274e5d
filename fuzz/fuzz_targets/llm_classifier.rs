//! `LlmClassifier` on arbitrary status codes, rate-limit headers and 429/400
//! error bodies: never a panic, the documented status table, waits within a
//! week, a 429 body judged the same however it is chunked, and the kind of
//! an error answer (`LlmClassifier::error_kind`, and `ReadKind` around the
//! breaker: the kind in the extensions, the body handed on whole).
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use http::StatusCode;
use libfuzzer_sys::fuzz_target;
use tower_circuit_breaker::classify::{
    Classify, ClassifyStream, ErrorKind, LlmClassifier, Verdict,
};
use tower_circuit_breaker::Outcome;
use tower_circuit_breaker_fuzz::{
    drive, headers, kind, recorded, split, Exchange, RawHeader, Step,
};

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Debug, Arbitrary)]
enum Body {
    Raw(Vec<u8>),
    /// OpenAI: `{"error":{"message":..,"type":..,"param":null,"code":..}}`.
    OpenAi {
        message: String,
        ty: String,
        code: String,
    },
    /// Anthropic: `{"type":"error","error":{"type":..,"message":..}}`.
    Anthropic {
        ty: String,
        message: String,
    },
    /// Gemini, with a `RetryInfo` detail.
    Gemini {
        code: String,
        status: String,
        retry_delay: String,
    },
    /// Gemini's error shape with a message of the fuzz's (a context-length
    /// or safety message, an invalid key).
    GeminiMessage {
        message: String,
        status: String,
    },
}

impl Body {
    /// The body, with the fuzz strings put in as they are (quotes and
    /// backslashes included, which breaks the JSON in arbitrary ways).
    fn bytes(&self) -> Vec<u8> {
        match self {
            Body::Raw(b) => b.clone(),
            Body::OpenAi { message, ty, code } => format!(
                r#"{{"error":{{"message":"{message}","type":"{ty}","param":null,"code":"{code}"}}}}"#
            )
            .into_bytes(),
            Body::Anthropic { ty, message } => format!(
                r#"{{"type":"error","error":{{"type":"{ty}","message":"{message}"}}}}"#
            )
            .into_bytes(),
            Body::Gemini { code, status, retry_delay } => format!(
                r#"{{"error":{{"code":{code},"message":"Resource has been exhausted","status":"{status}","details":[{{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"{retry_delay}"}}]}}}}"#
            )
            .into_bytes(),
            Body::GeminiMessage { message, status } => format!(
                r#"{{"error":{{"code":400,"message":"{message}","status":"{status}"}}}}"#
            )
            .into_bytes(),
        }
    }

    /// Whether the body is well-formed JSON that says the quota ran out.
    fn says_quota(&self) -> bool {
        let plain = |s: &str| !s.contains(['"', '\\']) && !s.chars().any(char::is_control);
        match self {
            Body::OpenAi { message, ty, code } => {
                plain(message) && plain(ty) && plain(code) && code == "insufficient_quota"
            }
            _ => false,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    status: u16,
    headers: Vec<RawHeader>,
    body: Body,
    /// Blanks before the body, to push it past the part a 429 body is read
    /// for (taken modulo 20,000).
    lead: u16,
    cuts: Vec<u16>,
}

fn body_outcome(llm: LlmClassifier, h: &http::HeaderMap, chunks: &[&[u8]]) -> Outcome {
    let Verdict::Defer(mut s) = llm.classify_response(StatusCode::TOO_MANY_REQUESTS, h) else {
        panic!("a 429 reads its body");
    };
    for chunk in chunks {
        if let Some(outcome) = s.on_data(chunk) {
            return outcome;
        }
    }
    s.on_end()
}

/// The kind `ReadKind` puts on an answer of `status` whose body comes in
/// `chunks`, and the body the caller then reads.
fn read_kind(status: StatusCode, chunks: &[&[u8]]) -> (Option<ErrorKind>, Vec<u8>) {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    use http_body::{Body as _, Frame};
    use tower_circuit_breaker::kind::ReadKind;
    use tower_service::Service;

    struct Chunks(std::collections::VecDeque<bytes::Bytes>);
    impl http_body::Body for Chunks {
        type Data = bytes::Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<bytes::Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
        }
    }
    let body = Chunks(chunks.iter().map(|c| bytes::Bytes::copy_from_slice(c)).collect());
    let response = http::Response::builder().status(status).body(body).unwrap();
    struct Once(Option<http::Response<Chunks>>);
    impl Service<()> for Once {
        type Response = http::Response<Chunks>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            std::future::ready(Ok(self.0.take().expect("one call")))
        }
    }
    let mut svc = ReadKind::new(Once(Some(response)));
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(res)) = pin!(svc.call(())).poll(&mut cx) else {
        panic!("a body that is always ready is read at once");
    };
    let kind = res.extensions().get::<ErrorKind>().copied();
    let mut body = pin!(res.into_body());
    let mut out = Vec::new();
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        if let Ok(data) = frame.unwrap().into_data() {
            out.extend_from_slice(&data);
        }
    }
    (kind, out)
}

fuzz_target!(|input: Input| {
    let status = StatusCode::from_u16(100 + input.status % 500).expect("100..=599");
    let h = headers(&input.headers);
    let llm = LlmClassifier::new();

    let wait = LlmClassifier::retry_after(&h);
    assert!(wait.is_none_or(|w| w <= WEEK), "{wait:?} from {h:?}");

    let mut body = vec![b' '; usize::from(input.lead) % 20_000];
    body.extend_from_slice(&input.body.bytes());

    // The head, per the documented table.
    let verdict = llm.classify_response(status, &h);
    match (status.as_u16(), &verdict) {
        (200..=299, Verdict::Defer(_)) => {
            let ct = h
                .get("content-type")
                .map(|v| v.as_bytes().to_ascii_lowercase());
            assert!(
                ct.is_some_and(|ct| ct.windows(17).any(|w| w == b"text/event-stream")),
                "only event streams are read: {h:?}"
            );
        }
        (100..=399, Verdict::Done(o)) => assert_eq!(*o, Outcome::Success),
        (429, Verdict::Defer(_)) => {}
        (409, Verdict::Done(o)) => assert_eq!(*o, Outcome::RateLimited { retry_after: wait }),
        (402, Verdict::Done(o)) => assert_eq!(*o, Outcome::QuotaExhausted),
        (400..=499, Verdict::Done(o)) => assert_eq!(*o, Outcome::Ignored),
        (500.., Verdict::Done(o)) => assert_eq!(*o, Outcome::Failure),
        (s, Verdict::Done(o)) => panic!("{s} decided {o:?}"),
        (s, Verdict::Defer(_)) => panic!("{s} deferred"),
    }
    // Whatever the head, the body goes through the breaker untouched and
    // the call is recorded once, as the classifier judged it.
    let chunks = split(&body, &input.cuts);
    let ex = Exchange {
        status: status.as_u16() - 100,
        headers: input.headers.clone(),
        steps: chunks.iter().map(|c| Step::Data(c.to_vec())).collect(),
        drop_after: None,
    };
    let (breaker, _) = drive(llm, &ex);
    let judged = match verdict {
        Verdict::Done(o) => o,
        Verdict::Defer(mut s) => chunks
            .iter()
            .find_map(|c| s.on_data(c))
            .unwrap_or_else(|| s.on_end()),
    };
    assert_eq!(recorded(&breaker), kind(judged));

    // A 429 body: rate-limited or out of quota, whatever it says and
    // however it arrives; the headers' wait wins over the body's.
    let outcome = body_outcome(llm, &h, &[&body]);
    assert_eq!(body_outcome(llm, &h, &chunks), outcome, "{chunks:?}");
    match outcome {
        Outcome::QuotaExhausted => {}
        Outcome::RateLimited { retry_after } => {
            assert!(retry_after.is_none_or(|w| w <= WEEK), "{retry_after:?}");
            if wait.is_some() {
                assert_eq!(retry_after, wait);
            }
        }
        other => panic!("a 429 body gave {other:?}"),
    }
    if input.body.says_quota() && body.len() < 1024 {
        assert_eq!(
            outcome,
            Outcome::QuotaExhausted,
            "{:?}",
            String::from_utf8_lossy(&body)
        );
    }
    // The kind of an error answer: never a panic, the status table, only
    // the first 4 KiB read.
    let kind = LlmClassifier::error_kind(status, &body);
    match status.as_u16() {
        401 | 403 => assert_eq!(kind, Some(ErrorKind::Auth)),
        402 => assert_eq!(kind, Some(ErrorKind::QuotaExhausted)),
        400 | 413 | 422 => assert!(kind.is_some()),
        429 => assert!(matches!(kind, None | Some(ErrorKind::QuotaExhausted)), "{kind:?}"),
        _ => assert_eq!(kind, None),
    }
    if body.len() >= 4096 {
        let mut longer = body.clone();
        longer.extend_from_slice(b" prompt is too long; API_KEY_INVALID");
        assert_eq!(LlmClassifier::error_kind(status, &longer), kind);
    }
    if input.body.says_quota() && body.len() < 1024 {
        assert_eq!(
            LlmClassifier::error_kind(StatusCode::TOO_MANY_REQUESTS, &body),
            Some(ErrorKind::QuotaExhausted)
        );
    }
    // Through `ReadKind` around the breaker, cut at the fuzz points: the
    // same kind in the extensions, and the body whole.
    let (read, body_out) = read_kind(status, &chunks);
    assert_eq!(read, kind, "{chunks:?}");
    assert_eq!(body_out, body);

    // Unread or broken off, a 429 is rate-limited with the headers' wait.
    let Verdict::Defer(s) = llm.classify_response(StatusCode::TOO_MANY_REQUESTS, &h) else {
        unreachable!()
    };
    assert_eq!(s.on_drop(), Outcome::RateLimited { retry_after: wait });
    let Verdict::Defer(mut s) = llm.classify_response(StatusCode::TOO_MANY_REQUESTS, &h) else {
        unreachable!()
    };
    if s.on_data(&body[..body.len() / 2]).is_none() {
        assert_eq!(s.on_error(), Outcome::RateLimited { retry_after: wait });
    }
});
