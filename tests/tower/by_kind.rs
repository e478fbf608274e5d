//! Fallback by error kind over real connections: a hyper-util client, each
//! member a `ReadKind` around a breaker with the LLM classifier, against
//! three hyper servers on 127.0.0.1:0.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Uri};
use http_body_util::Empty;
use tower::ServiceExt;
use tower_circuit_breaker::classify::{ErrorKind, LlmClassifier};
use tower_circuit_breaker::failover::{Failover, FallbackTo};
use tower_circuit_breaker::kind::ReadKind;
use tower_circuit_breaker::{Breaker, CircuitBreaker};

use crate::support::{http_client, json, read_all, serve, Hits, HttpClient};

const TOO_LONG: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#;
const REFUSED: &str = r#"{"error":{"code":"content_policy_violation","message":"Your request was rejected as a result of our safety system.","param":null,"type":"invalid_request_error"}}"#;

/// The small model: a context-length 400 for `x-long`, a content refusal
/// for `x-unsafe`, a plain 400 with a 20 KiB body for `x-bad`, otherwise a
/// 200.
async fn small(hits: Hits) -> SocketAddr {
    let app = Router::new().route(
        "/v1/messages",
        get(move |headers: HeaderMap| {
            hits.hit();
            async move {
                if headers.contains_key("x-long") {
                    json(StatusCode::BAD_REQUEST, &[], TOO_LONG)
                } else if headers.contains_key("x-unsafe") {
                    json(StatusCode::BAD_REQUEST, &[], REFUSED)
                } else if headers.contains_key("x-bad") {
                    json(StatusCode::BAD_REQUEST, &[], big_bad_request())
                } else {
                    json(StatusCode::OK, &[], "small")
                }
            }
        }),
    );
    serve(app).await
}

fn big_bad_request() -> &'static str {
    static BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BODY.get_or_init(|| {
        let pad = "x".repeat(20 * 1024);
        format!(r#"{{"error":{{"message":"Invalid value for 'temperature'.","type":"invalid_request_error","pad":"{pad}"}}}}"#)
    })
}

async fn answering(name: &'static str, hits: Hits) -> SocketAddr {
    let app = Router::new().route(
        "/v1/messages",
        get(move || {
            hits.hit();
            async move { json(StatusCode::OK, &[], name) }
        }),
    );
    serve(app).await
}

fn breaker(name: &str) -> Breaker {
    Breaker::builder()
        .name(name)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(3600))
        .jitter(0.0)
        .build()
        .unwrap()
}

type Member = ReadKind<CircuitBreaker<HttpClient, LlmClassifier>>;

fn member(breaker: &Breaker) -> Member {
    ReadKind::new(CircuitBreaker::with_classifier(
        http_client(),
        breaker.clone(),
        LlmClassifier::new(),
    ))
}

fn to(addr: SocketAddr) -> impl Fn(&mut Request<Empty<Bytes>>) + Send + Sync + 'static {
    move |req| {
        *req.uri_mut() = Uri::try_from(format!("http://{addr}/v1/messages")).unwrap();
    }
}

fn request(addr: SocketAddr, header: Option<&'static str>) -> Request<Empty<Bytes>> {
    let mut req = Request::get(format!("http://{addr}/v1/messages"));
    if let Some(h) = header {
        req = req.header(h, "1");
    }
    req.body(Empty::new()).unwrap()
}

struct Setup {
    failover: Failover<Member, Request<Empty<Bytes>>, LlmClassifier>,
    small: SocketAddr,
    hits: [Hits; 3],
    breakers: [Breaker; 3],
}

async fn setup() -> Setup {
    let hits = [Hits::default(), Hits::default(), Hits::default()];
    let small_addr = small(hits[0].clone()).await;
    let other = answering("other-provider", hits[1].clone()).await;
    let long = answering("long-context", hits[2].clone()).await;
    let breakers = [breaker("small"), breaker("other"), breaker("long")];
    let failover = Failover::new(member(&breakers[0]))
        .fallback_with(member(&breakers[1]), to(other))
        .fallback_with(member(&breakers[2]), to(long))
        .with_classifier(LlmClassifier::new())
        .jitter(Duration::ZERO, Duration::ZERO)
        .on_kind(ErrorKind::ContextLength, FallbackTo::Member(2))
        .unwrap()
        .on_kind(ErrorKind::ContentPolicy, FallbackTo::Member(1))
        .unwrap();
    Setup {
        failover,
        small: small_addr,
        hits,
        breakers,
    }
}

#[tokio::test]
async fn a_context_length_400_goes_to_the_long_context_member_and_counts_as_no_failure() {
    let s = setup().await;
    for _ in 0..5 {
        let res = s
            .failover
            .clone()
            .oneshot(request(s.small, Some("x-long")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(read_all(res.into_body()).await.unwrap(), "long-context");
    }
    assert_eq!(s.hits.iter().map(Hits::get).collect::<Vec<_>>(), [5, 0, 5]);
    for b in &s.breakers {
        let c = b.snapshot().counters;
        assert_eq!(c.failures, 0, "{:?}", b.name());
    }
    assert_eq!(
        s.breakers[0].snapshot().counters.ignored,
        5,
        "the 400s are ignored"
    );
    assert_eq!(s.breakers[2].snapshot().counters.successes, 5);
}

#[tokio::test]
async fn a_content_refusal_goes_to_the_other_provider_and_trips_nothing() {
    let s = setup().await;
    for _ in 0..3 {
        let res = s
            .failover
            .clone()
            .oneshot(request(s.small, Some("x-unsafe")))
            .await
            .unwrap();
        assert_eq!(read_all(res.into_body()).await.unwrap(), "other-provider");
    }
    assert_eq!(s.hits.iter().map(Hits::get).collect::<Vec<_>>(), [3, 3, 0]);
    assert_eq!(s.breakers[0].snapshot().counters.failures, 0);
    assert_eq!(s.breakers[0].state(), tower_circuit_breaker::State::Closed);
}

#[tokio::test]
async fn a_plain_bad_request_is_returned_with_its_whole_body() {
    let s = setup().await;
    let res = s
        .failover
        .clone()
        .oneshot(request(s.small, Some("x-bad")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        res.extensions().get::<ErrorKind>(),
        Some(&ErrorKind::BadRequest)
    );
    let body = read_all(res.into_body()).await.unwrap();
    assert_eq!(
        body,
        big_bad_request().as_bytes(),
        "20 KiB, of which 4 were read for the kind"
    );
    assert_eq!(s.hits.iter().map(Hits::get).collect::<Vec<_>>(), [1, 0, 0]);

    // A 200 passes with no kind and its body untouched.
    let res = s
        .failover
        .clone()
        .oneshot(request(s.small, None))
        .await
        .unwrap();
    assert!(res.extensions().get::<ErrorKind>().is_none());
    assert_eq!(read_all(res.into_body()).await.unwrap(), "small");
}

// === the walk, over mocks ===

type Mock = tower::util::BoxCloneSyncService<
    Request<String>,
    http::Response<String>,
    std::convert::Infallible,
>;

/// A member that answers `status` with `body` and counts its calls.
fn mock(status: u16, body: &'static str, hits: &Hits) -> ReadKind<CircuitBreaker<Mock>> {
    let hits = hits.clone();
    let svc = Mock::new(tower::service_fn(move |_req: Request<String>| {
        hits.hit();
        async move {
            Ok(http::Response::builder()
                .status(status)
                .body(body.to_owned())
                .unwrap())
        }
    }));
    ReadKind::new(CircuitBreaker::new(svc, breaker("mock")))
}

#[tokio::test(start_paused = true)]
async fn a_refused_key_moves_to_the_next_key_only_with_a_rule() {
    let (a, b) = (Hits::default(), Hits::default());
    let keys = || {
        Failover::new(mock(401, r#"{"error":{"code":"invalid_api_key"}}"#, &a))
            .fallback(mock(200, "answer", &b))
            .jitter(Duration::ZERO, Duration::ZERO)
    };
    let res = keys().oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNAUTHORIZED,
        "no rule: the 401 is returned"
    );
    let res = keys()
        .on_kind(ErrorKind::Auth, FallbackTo::Next)
        .unwrap()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!((a.get(), b.get()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_rule_is_followed_only_forward_and_an_open_target_returns_the_answer() {
    let (a, b) = (Hits::default(), Hits::default());
    // The rule names the member that answered: not followed.
    let backward = Failover::new(mock(400, TOO_LONG, &a))
        .fallback(mock(200, "answer", &b))
        .on_kind(ErrorKind::ContextLength, FallbackTo::Member(0))
        .unwrap();
    let res = backward.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(b.get(), 0);

    // The long-context member is open: the caller gets the 400, with its
    // body, not a rejection.
    let long = mock(200, "answer", &b);
    long.get_ref().breaker().force_open();
    let failover = Failover::new(mock(400, TOO_LONG, &a))
        .fallback(long)
        .on_kind(ErrorKind::ContextLength, FallbackTo::Member(1))
        .unwrap();
    let res = failover.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(read_all(res.into_body()).await.unwrap(), TOO_LONG);
    assert_eq!(b.get(), 0);
}
