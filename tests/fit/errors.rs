//! `?` into anyhow and boxes, and `CircuitOpen::find` through the stack,
//! tower's retry, timeout and buffer, and nested breakers, over a real
//! connection (a hyper-util client against an axum server on 127.0.0.1:0).

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::{BoxError, Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen};

use crate::support::{get_req, http_client, serve, HttpClient};

/// A server that answers `status` to every request.
async fn server(status: StatusCode) -> std::net::SocketAddr {
    serve(Router::new().route("/", get(move || async move { status }))).await
}

/// What most LLM-calling code looks like: `anyhow::Result` and `?`.
async fn status_of(
    client: &mut CircuitBreaker<HttpClient>,
    addr: std::net::SocketAddr,
) -> anyhow::Result<u16> {
    let res = client.ready().await?.call(get_req(addr, "/")).await?;
    Ok(res.status().as_u16())
}

/// The same with std's boxes.
async fn status_boxed(
    client: &mut CircuitBreaker<HttpClient>,
    addr: std::net::SocketAddr,
) -> Result<u16, Box<dyn std::error::Error>> {
    let res = client.ready().await?.call(get_req(addr, "/")).await?;
    Ok(res.status().as_u16())
}

async fn status_send_sync(
    client: &mut CircuitBreaker<HttpClient>,
    addr: std::net::SocketAddr,
) -> Result<u16, BoxError> {
    let res = client.ready().await?.call(get_req(addr, "/")).await?;
    Ok(res.status().as_u16())
}

#[tokio::test(start_paused = true)]
async fn question_mark_goes_into_anyhow_and_find_sees_the_rejection() {
    let addr = server(StatusCode::OK).await;
    let breaker = Breaker::builder().name("gpt").build().unwrap();
    let mut client = CircuitBreaker::new(http_client(), breaker.clone());
    assert_eq!(status_of(&mut client, addr).await.unwrap(), 200);

    breaker.force_open();
    let err = status_of(&mut client, addr).await.unwrap_err();
    let open = CircuitOpen::find(&*err).expect("a rejection inside the anyhow::Error");
    assert_eq!(open.key(), Some("gpt"));
    assert!(CircuitOpen::find(err.as_ref()).is_some());
    // anyhow's chain reads as one sentence, the rejection as the cause.
    assert_eq!(
        format!("{err:#}"),
        "rejected by the circuit breaker: circuit 'gpt' forced open"
    );
    // anyhow's own downcast reaches the crate's error, no box in between.
    assert!(err
        .downcast_ref::<tower_circuit_breaker::Error>()
        .is_some_and(tower_circuit_breaker::Error::is_circuit_open));

    let err = status_boxed(&mut client, addr).await.unwrap_err();
    assert_eq!(
        CircuitOpen::find(&*err).and_then(CircuitOpen::key),
        Some("gpt")
    );
    let err = status_send_sync(&mut client, addr).await.unwrap_err();
    assert_eq!(
        CircuitOpen::find(&*err).and_then(CircuitOpen::key),
        Some("gpt")
    );
}

#[tokio::test(start_paused = true)]
async fn an_inner_error_keeps_its_own_words_and_is_no_rejection() {
    // A port with nothing listening: the connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let breaker = Breaker::builder().build().unwrap();
    let mut client = CircuitBreaker::new(http_client(), breaker);
    let err = status_of(&mut client, closed).await.unwrap_err();
    assert!(CircuitOpen::find(&*err).is_none());
    let inner = err
        .downcast_ref::<tower_circuit_breaker::Error>()
        .and_then(tower_circuit_breaker::Error::inner)
        .expect("the client's error");
    assert!(inner.is::<hyper_util::client::legacy::Error>());
    assert_eq!(err.to_string(), inner.to_string());
}

#[tokio::test(start_paused = true)]
async fn find_sees_through_the_stack_and_anyhow_from_boxed() {
    let addr = server(StatusCode::OK).await;
    for total in [None, Some(Duration::from_secs(600))] {
        let mut builder = Stack::builder().breaker(Breaker::builder().name("stack"));
        if let Some(total) = total {
            builder = builder.total_timeout(total);
        }
        let layer = builder.build().unwrap();
        let stack = layer.layer(http_client());
        let res = stack.clone().oneshot(get_req(addr, "/")).await.unwrap();
        assert_eq!(res.status(), 200);

        layer.breaker().force_open();
        let err: BoxError = stack.oneshot(get_req(addr, "/")).await.unwrap_err();
        assert_eq!(
            CircuitOpen::find(&*err).and_then(CircuitOpen::key),
            Some("stack")
        );

        // A `BoxError` into anyhow takes one call; the rejection is still found.
        let err = anyhow::Error::from_boxed(err);
        assert_eq!(
            CircuitOpen::find(&*err).and_then(CircuitOpen::key),
            Some("stack")
        );
        let err = anyhow::anyhow!(Box::<dyn std::error::Error + Send + Sync>::from(
            err.to_string()
        ));
        assert!(
            CircuitOpen::find(&*err).is_none(),
            "a message is no rejection"
        );
    }
}

/// An outer breaker around a keyed set, around the client: the inner key's
/// rejection is found from outside, and the outer breaker ignores it.
#[tokio::test(start_paused = true)]
async fn find_sees_a_nested_breaker_through_towers_retry_timeout_and_buffer() {
    let addr = server(StatusCode::OK).await;
    let inner = Breaker::builder().name("inner").build().unwrap();
    let outer = CircuitBreakerLayer::builder()
        .name("outer")
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .buffer(8)
        .timeout(Duration::from_secs(60))
        .retry(tower_circuit_breaker::RetryPolicy::new())
        .layer(outer.clone())
        .service(CircuitBreaker::new(http_client(), inner.clone()));
    let res = svc.clone().oneshot(get_req(addr, "/")).await.unwrap();
    assert_eq!(res.status(), 200);

    inner.force_open();
    let err: BoxError = svc.clone().oneshot(get_req(addr, "/")).await.unwrap_err();
    // buffer's ServiceError → timeout's box → the outer Error → the inner Error.
    assert_eq!(
        CircuitOpen::find(&*err).and_then(CircuitOpen::key),
        Some("inner")
    );
    let err = anyhow::Error::from_boxed(err);
    assert_eq!(
        CircuitOpen::find(&*err).and_then(CircuitOpen::key),
        Some("inner")
    );
    // The retry saw the rejection and stopped; the outer circuit did not
    // count it against the upstream.
    assert_eq!(inner.snapshot().counters.rejected, 1);
    assert_eq!(outer.breaker().snapshot().counters.failures, 0);

    // A timeout is not a rejection.
    let err: BoxError = "deadline".into();
    let elapsed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
    assert!(CircuitOpen::find(&*err).is_none());
    assert!(CircuitOpen::find(&*elapsed).is_none());
}
