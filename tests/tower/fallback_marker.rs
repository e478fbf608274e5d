//! The fallback mark: `Failover` marks the request it sends to every member
//! but its last, and the last gets the caller's request as it came.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use tower::util::BoxCloneService;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::failover::Failover;
use tower_circuit_breaker::{Fallback, HasFallback};

type Seen = Arc<Mutex<Vec<(&'static str, bool)>>>;

/// An upstream that notes whether each request it gets is marked, and
/// answers `status`.
fn member(
    name: &'static str,
    status: u16,
    seen: &Seen,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + use<> {
    let seen = Arc::clone(seen);
    tower::service_fn(move |req: Request<String>| {
        seen.lock().unwrap().push((name, req.has_fallback()));
        async move {
            Ok(Response::builder()
                .status(status)
                .body(String::new())
                .unwrap())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn failover_marks_every_member_but_the_last() {
    let seen = Seen::default();
    let mut svc = Failover::new(member("a", 503, &seen))
        .fallback(member("b", 503, &seen))
        .fallback(member("c", 200, &seen));
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        *seen.lock().unwrap(),
        [("a", true), ("b", true), ("c", false)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_nested_failover_inherits_the_outer_mark() {
    let seen = Seen::default();
    let inner =
        Failover::new(member("inner-a", 503, &seen)).fallback(member("inner-b", 503, &seen));
    let mut outer = Failover::new(BoxCloneService::new(inner))
        .fallback(BoxCloneService::new(member("outer-b", 200, &seen)));
    outer
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [("inner-a", true), ("inner-b", true), ("outer-b", false)]
    );

    // Without an outer failover, the inner one's last member is unmarked;
    // a caller's own mark reaches it untouched.
    seen.lock().unwrap().clear();
    let mut alone = Failover::new(member("a", 503, &seen)).fallback(member("b", 503, &seen));
    let mut marked = Request::new(String::new());
    marked.extensions_mut().insert(HasFallback);
    alone.ready().await.unwrap().call(marked).await.unwrap();
    alone
        .ready()
        .await
        .unwrap()
        .call(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [("a", true), ("b", true), ("a", true), ("b", false)]
    );
}
