//! What a failover does when every member rejected the call: [`AllOpen`],
//! and the circuits a last-resort call may go to.

use super::*;

/// What a [`Failover`] does when every upstream rejected the call.
///
/// - [`FailFast`](AllOpen::FailFast) (the default): the caller gets the
///   rejection whose circuit admits a call soonest
///   ([`CircuitOpen::retry_at`](crate::CircuitOpen::retry_at)).
/// - [`last_resort`](AllOpen::last_resort) (Envoy's panic threshold in
///   spirit: better to try than to serve nobody): once per open period of
///   the circuit that opened longest ago, the call is let through to that
///   upstream anyway. The circuits are given in the order of the upstreams
///   (the primary's first): a [`Breaker`], or for an upstream that is a key
///   of a keyed set, [`LastResortCircuit::key`], which finds the key's
///   breaker as the set holds it at the moment of the call (a handle from
///   [`KeyedBreakers::get`] goes stale once the key is evicted while idle
///   and created again). The call counts in the open
///   period's generation, where no trip rule runs: a failure changes
///   nothing (not the window, not the backoff); a success ends that open
///   period as a healthy health probe does (half-open, with
///   [`Reason::LastResort`](crate::Reason::LastResort)), so real traffic
///   confirms. Circuits open for an exhausted quota, forced open, or
///   half-open with their probes out, are never let through; a breaker in
///   metrics-only mode never rejects, so the policy never meets it.
///
/// ```
/// use std::time::Duration;
/// use tower::{Service, ServiceExt};
/// use tower_circuit_breaker::failover::{AllOpen, Failover};
/// use tower_circuit_breaker::{Breaker, CircuitBreaker, Outcome, TripMode};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let ok = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// // Recorded on the breakers directly, the failures open them.
/// let open_on_failure = || Breaker::builder().consecutive_failures(1).trip_mode(TripMode::Open).jitter(0.0);
/// let (a, b) = (open_on_failure().build().unwrap(), open_on_failure().build().unwrap());
/// a.admit().unwrap().record(Outcome::Failure);
/// tokio::time::advance(Duration::from_secs(1)).await;
/// b.admit().unwrap().record(Outcome::Failure);
///
/// let mut svc = Failover::new(CircuitBreaker::new(ok.clone(), a.clone()))
///     .fallback(CircuitBreaker::new(ok, b.clone()))
///     .when_all_open(AllOpen::last_resort([a.clone(), b.clone()]));
/// // Both are open; `a` opened first, so it gets the one call.
/// let res = svc.ready().await.unwrap().call(http::Request::new(String::new())).await.unwrap();
/// assert_eq!(res.status(), 200);
/// assert_eq!(a.state(), tower_circuit_breaker::State::HalfOpen);
/// # }
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum AllOpen {
    /// Return the rejection that admits soonest.
    #[default]
    FailFast,
    /// Let one call per open period through to the upstream whose circuit
    /// opened longest ago; the circuits, in the order of the upstreams.
    LastResort(Arc<[LastResortCircuit]>),
}

/// One upstream's circuit in an [`AllOpen::last_resort`] list: a breaker
/// (`From<Breaker>`), or a key of a keyed set, looked up when every upstream
/// has rejected a call. A key the set does not hold then (never admitted,
/// or evicted) is closed, so it is no candidate.
///
/// ```
/// use tower_circuit_breaker::failover::{AllOpen, LastResortCircuit};
/// use tower_circuit_breaker::keyed::KeyedBreakers;
/// use tower_circuit_breaker::Breaker;
///
/// let primary = Breaker::builder().build().unwrap();
/// let models = KeyedBreakers::builder().build().unwrap();
/// // The primary's breaker, then the key "small" of `models`, whatever
/// // breaker the set holds for it when the last-resort call is made.
/// let policy = AllOpen::last_resort([
///     LastResortCircuit::from(primary),
///     LastResortCircuit::key(&models, "small"),
/// ]);
/// assert!(matches!(policy, AllOpen::LastResort(ref c) if c.len() == 2));
/// ```
#[derive(Clone, Debug)]
pub struct LastResortCircuit(Circuit);

#[derive(Clone, Debug)]
enum Circuit {
    Breaker(Breaker),
    Key(KeyedBreakers, Arc<str>),
}

impl LastResortCircuit {
    /// The breaker of `key` in `set`, found at each last-resort call.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::LastResortCircuit;
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    ///
    /// let models = KeyedBreakers::builder().build().unwrap();
    /// let circuit = LastResortCircuit::key(&models, "gpt-4o-mini");
    /// # let _ = circuit;
    /// ```
    #[must_use]
    pub fn key(set: &KeyedBreakers, key: &str) -> Self {
        LastResortCircuit(Circuit::Key(set.clone(), key.into()))
    }

    /// The breaker now, if there is one.
    pub(crate) fn breaker(&self) -> Option<Breaker> {
        match &self.0 {
            Circuit::Breaker(breaker) => Some(breaker.clone()),
            Circuit::Key(set, key) => set.get(key),
        }
    }
}

impl From<Breaker> for LastResortCircuit {
    fn from(breaker: Breaker) -> Self {
        LastResortCircuit(Circuit::Breaker(breaker))
    }
}

impl AllOpen {
    /// [`AllOpen::LastResort`] over `circuits` (breakers, or
    /// [keys of a set](LastResortCircuit::key)), in the order of the
    /// upstreams.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::AllOpen;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let primary = Breaker::builder().name("gpt-4o").build().unwrap();
    /// let fallback = Breaker::builder().name("gpt-4o-mini").build().unwrap();
    /// let policy = AllOpen::last_resort([primary, fallback]);
    /// assert!(matches!(policy, AllOpen::LastResort(ref b) if b.len() == 2));
    /// ```
    pub fn last_resort<I>(circuits: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<LastResortCircuit>,
    {
        AllOpen::LastResort(circuits.into_iter().map(Into::into).collect())
    }
}
