//! The tower service: readiness, rejection in `call`, shared state, and
//! half-open under heavy concurrency.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::keyed::{header, KeyedBreakers};
use tower_circuit_breaker::{
    BoxError, Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Error, Outcome,
    ResponseBody, State,
};
use tower_test::mock;

fn layer() -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(2)
        .open_duration(Duration::from_secs(30))
        .probes(3)
        .close_after(2)
        .jitter(0.0)
        .build()
        .unwrap()
}

fn status(code: u16) -> Response<String> {
    Response::builder()
        .status(code)
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn inner_not_ready_means_breaker_not_ready() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer());
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn open_circuit_is_ready_and_rejects_in_call_without_touching_the_inner_service() {
    let layer = layer();
    let breaker = layer.breaker().clone();
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer);
    for _ in 0..2 {
        handle.allow(1);
        assert_ready_ok!(svc.poll_ready());
        let fut = svc.call(Request::new(String::new()));
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(status(503));
        assert_eq!(fut.await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(breaker.state(), State::Open);

    handle.allow(1);
    assert_ready_ok!(
        svc.poll_ready(),
        "an open circuit never makes the service unready"
    );
    let err = svc.call(Request::new(String::new())).await.unwrap_err();
    assert!(err.is_circuit_open());
    // The inner service saw no request.
    assert!(futures::poll!(Box::pin(handle.next_request())).is_pending());

    let boxed: BoxError = err.into();
    let open = tower_circuit_breaker::CircuitOpen::find(&*boxed).expect("downcasts to CircuitOpen");
    assert_eq!(open.state(), State::Open);
    assert_eq!(open.retry_after(), Some(Duration::from_secs(30)));
}

#[tokio::test(start_paused = true)]
async fn inner_errors_are_failures_and_stay_downcastable() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<String>, Response<String>, _>(layer());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = svc.call(Request::new(String::new()));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "reset",
    ));
    let err: BoxError = fut.await.unwrap_err().into_box();
    assert_eq!(
        err.downcast_ref::<std::io::Error>().unwrap().kind(),
        std::io::ErrorKind::ConnectionReset
    );
    assert_eq!(svc.get_ref().breaker().snapshot().counters.failures, 1);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeouts_inside_the_breaker_are_failures() {
    let layer = layer();
    let breaker = layer.breaker().clone();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(60))
        .service_fn(|_: Request<String>| async {
            std::future::pending::<Result<Response<String>, Infallible>>().await
        });
    for _ in 0..2 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap_err();
        let err: BoxError = err.into_box();
        assert!(err.is::<tower::timeout::error::Elapsed>());
    }
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn every_service_and_clone_from_one_layer_shares_one_breaker() {
    let layer = layer();
    let upstream =
        tower::service_fn(|_: Request<String>| async { Ok::<_, Infallible>(status(503)) });
    let mut a = layer.layer(upstream);
    let mut b = layer.layer(upstream);
    let mut c = a.clone();
    a.ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    b.ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    let err = c
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap_err();
    assert!(err.is_circuit_open());
    assert!(a.breaker().ptr_eq(layer.breaker()));
}

/// An upstream that counts its calls and answers only when allowed to.
#[derive(Clone)]
struct Gate {
    calls: Arc<AtomicUsize>,
    open: Arc<Semaphore>,
    status: u16,
}

impl Gate {
    fn new(status: u16) -> Self {
        Gate {
            calls: Arc::new(AtomicUsize::new(0)),
            open: Arc::new(Semaphore::new(0)),
            status,
        }
    }
}

impl Service<Request<String>> for Gate {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<String>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let open = self.open.clone();
        let code = self.status;
        Box::pin(async move {
            open.acquire().await.unwrap().forget();
            Ok(status(code))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_three_probes_among_1000_concurrent_callers() {
    let layer = layer();
    let breaker = layer.breaker().clone();
    breaker.force_open();
    breaker.reset();
    for _ in 0..2 {
        breaker.admit().unwrap().record(Outcome::Failure);
    }
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(Duration::from_secs(30)).await;

    let gate = Gate::new(200);
    let svc = layer.layer(gate.clone());
    let mut tasks = Vec::new();
    for _ in 0..1_000 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.oneshot(Request::new(String::new()))
                .await
                .map(|r| r.status())
        }));
    }
    // Let every task reach its decision.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        gate.calls.load(Ordering::SeqCst),
        3,
        "exactly `probes` reach the upstream"
    );

    // A dropped probe frees its slot at once.
    let probe = tasks.iter().position(|t| !t.is_finished()).unwrap();
    tasks.remove(probe).abort();
    tokio::task::yield_now().await;
    let mut late = layer.layer(gate.clone());
    let late = tokio::spawn(async move {
        late.ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .map(|r| r.status())
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(gate.calls.load(Ordering::SeqCst), 4);

    gate.open.add_permits(1_000);
    let mut ok = 0;
    let mut rejected = 0;
    for t in tasks.into_iter().chain([late]) {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.is_circuit_open() => rejected += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!((ok, rejected), (3, 997));
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn breaker_handle_works_without_tower() {
    let b = Breaker::builder()
        .trip_mode(TripMode::Open)
        .no_window()
        .consecutive_failures(1)
        .build()
        .unwrap();
    let permit = b.admit().unwrap();
    drop(permit);
    assert_eq!(b.snapshot().counters.dropped, 1);
    assert_eq!(b.state(), State::Closed);
}

// === nested breakers and errors ===

/// A keyed set (per model) in front of an upstream that always answers 200.
fn keyed_upstream() -> (
    KeyedBreakers,
    impl Service<Request<String>, Response = Response<ResponseBody<String>>, Error = Error> + Clone,
) {
    let breakers = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .jitter(0.0)
        .build()
        .unwrap();
    let layer = CircuitBreakerLayer::keyed(breakers.clone(), header("x-model"));
    let upstream = layer.layer(tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(status(200))
    }));
    (breakers, upstream)
}

fn for_model(model: &str) -> Request<String> {
    Request::builder()
        .header("x-model", model)
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_inner_breakers_rejection_is_ignored_by_the_outer_and_stays_a_rejection() {
    let (keyed, upstream) = keyed_upstream();
    let global = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("global")
        .consecutive_failures(1)
        .build()
        .unwrap();
    let mut svc = CircuitBreaker::new(upstream, global.clone());
    keyed.get_or_insert("big-model").force_open();

    let err = svc
        .ready()
        .await
        .unwrap()
        .call(for_model("big-model"))
        .await
        .unwrap_err();
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(err.circuit_open().unwrap().key(), Some("big-model"));
    assert_eq!(err.circuit_open().unwrap().state(), State::ForcedOpen);
    // One rejected model says nothing about the upstream as a whole.
    assert_eq!(global.state(), State::Closed);
    let counters = global.snapshot().counters;
    assert_eq!((counters.failures, counters.ignored), (0, 1));

    let res = svc
        .ready()
        .await
        .unwrap()
        .call(for_model("light-model"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // Boxed, it is the inner rejection itself.
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(for_model("big-model"))
        .await
        .unwrap_err();
    let boxed: BoxError = err.into();
    assert_eq!(CircuitOpen::find(&*boxed).unwrap().key(), Some("big-model"));
    assert_eq!(global.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn an_inner_rejection_behind_towers_timeout_is_ignored_too() {
    let (keyed, upstream) = keyed_upstream();
    let global = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .build()
        .unwrap();
    let mut svc = tower::ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(global.clone()))
        .timeout(Duration::from_secs(60))
        .service(upstream);
    keyed.get_or_insert("big-model").force_open();

    let err = svc
        .ready()
        .await
        .unwrap()
        .call(for_model("big-model"))
        .await
        .unwrap_err();
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(global.state(), State::Closed);
}

/// How code downstream of the crate uses it: `?` into `Box<dyn Error>`.
async fn send<S, B>(svc: &mut S, model: &str) -> Result<StatusCode, Box<dyn std::error::Error>>
where
    S: Service<Request<String>, Response = Response<B>, Error = Error>,
{
    let res = svc.ready().await?.call(for_model(model)).await?;
    Ok(res.status())
}

#[tokio::test(start_paused = true)]
async fn question_mark_converts_into_box_dyn_error_and_find_sees_the_rejection() {
    let (keyed, upstream) = keyed_upstream();
    let global = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("global")
        .build()
        .unwrap();
    let mut svc = CircuitBreaker::new(upstream, global.clone());
    assert_eq!(send(&mut svc, "big-model").await.unwrap(), StatusCode::OK);

    global.force_open();
    let err = send(&mut svc, "big-model").await.unwrap_err();
    assert_eq!(err.to_string(), "rejected by the circuit breaker");
    assert_eq!(
        err.source().unwrap().to_string(),
        "circuit 'global' forced open"
    );
    assert_eq!(CircuitOpen::find(&*err).unwrap().key(), Some("global"));

    global.reset();
    keyed.get_or_insert("big-model").force_open();
    let err = send(&mut svc, "big-model").await.unwrap_err();
    assert_eq!(CircuitOpen::find(&*err).unwrap().key(), Some("big-model"));

    // `Send` boxes take it as well.
    let err: Box<dyn std::error::Error + Send> = svc
        .ready()
        .await
        .unwrap()
        .call(for_model("big-model"))
        .await
        .unwrap_err()
        .into();
    assert!(CircuitOpen::find(&*err).is_some());
}

#[tokio::test(start_paused = true)]
async fn towers_timeout_around_the_breaker_keeps_circuit_open_downcastable() {
    let layer = layer();
    let breaker = layer.breaker().clone();
    let mut svc = tower::ServiceBuilder::new()
        .timeout(Duration::from_secs(60))
        .layer(layer)
        .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(status(200)) });
    breaker.force_open();
    let err: BoxError = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap_err();
    let open = tower_circuit_breaker::CircuitOpen::find(&*err)
        .expect("tower's timeout boxes the CircuitOpen itself");
    assert_eq!(open.state(), State::ForcedOpen);
}
