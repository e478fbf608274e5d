//! User callbacks run isolated: a key function or a classifier closure that
//! panics never fails the request it was called for.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::Attempt;
use tower_circuit_breaker::keyed::{self, Key, KeyedBreakers};
use tower_circuit_breaker::{CircuitBreakerLayer, Outcome, State};

fn upstream(
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    })
}

fn request(model: &str) -> Request<String> {
    Request::get("/v1/chat")
        .header("x-model", model)
        .body(String::new())
        .unwrap()
}

/// A key function that panics for the model `boom` (a bug in user code,
/// triggered by what a request carries).
fn model_key(req: &Request<String>) -> Option<Key<'_>> {
    let model = req.headers().get("x-model")?.to_str().ok()?;
    assert_ne!(model, "boom", "user key function bug");
    Some(Key::from(model))
}

#[tokio::test(start_paused = true)]
async fn a_panicking_key_function_sends_the_call_to_the_overflow_breaker() {
    let breakers = KeyedBreakers::builder()
        .no_window()
        .consecutive_failures(3)
        .build()
        .unwrap();
    let layer = CircuitBreakerLayer::keyed(breakers.clone(), keyed::from_fn(model_key));
    let mut svc = ServiceBuilder::new().layer(layer).service(upstream());

    let (mut answered, mut panicked) = (0, 0);
    for i in 0..1_000u32 {
        let model = if i % 7 == 3 { "boom" } else { "gpt-4o" };
        panicked += u64::from(model == "boom");
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request(model))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        answered += 1;
    }
    assert_eq!(
        answered, 1_000,
        "no request failed because its key function panicked"
    );
    assert_eq!(panicked, 143);
    assert_eq!(breakers.key_fn_panics(), panicked);
    let overflow = breakers
        .snapshots()
        .into_iter()
        .find(|s| s.key.as_deref() == Some("(overflow)"))
        .expect("the overflow breaker took the calls");
    assert_eq!(overflow.counters.admitted, panicked);
    assert_eq!(overflow.counters.successes, panicked);
    assert_eq!(
        breakers.get("gpt-4o").unwrap().snapshot().counters.admitted,
        1_000 - panicked
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_classifier_closure_records_ignored() {
    let layer = CircuitBreakerLayer::builder()
        .no_window()
        .consecutive_failures(1)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let classify = |attempt: Attempt<'_>| match attempt {
        Attempt::Response { headers, .. } if headers.contains_key("x-boom") => {
            panic!("user classifier bug")
        }
        Attempt::Response { status, .. } if status.is_server_error() => Outcome::Failure,
        Attempt::Response { .. } => Outcome::Success,
        Attempt::Error(_) => Outcome::Failure,
    };
    let upstream = tower::service_fn(|req: Request<String>| async move {
        let mut res = Response::new(String::new());
        if req.headers().contains_key("x-boom") {
            res.headers_mut().insert("x-boom", "1".parse().unwrap());
            // Even a 503: the classifier never said so, so it must not count.
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        Ok::<_, Infallible>(res)
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer.with_classifier(classify))
        .service(upstream);

    let (mut answered, mut panicked) = (0, 0);
    for i in 0..500u32 {
        let mut req = request("gpt-4o");
        if i % 5 == 0 {
            req.headers_mut().insert("x-boom", "1".parse().unwrap());
            panicked += 1;
        }
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        assert!(res.status() == StatusCode::OK || res.status() == StatusCode::SERVICE_UNAVAILABLE);
        answered += 1;
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    assert_eq!(
        answered, 500,
        "no request failed because its classifier panicked"
    );
    assert_eq!(panicked, 100);
    let c = breaker.snapshot().counters;
    assert_eq!(c.ignored, panicked);
    assert_eq!(c.successes, 500 - panicked);
    assert_eq!(c.failures, 0);
    assert_eq!(breaker.state(), State::Closed);
}
