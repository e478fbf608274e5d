//! A status page for operators: every breaker and key, its state, window,
//! last transitions and next probe, as JSON and as a small self-contained
//! HTML page that refreshes itself.
//!
//! [`StatusPage`] is a `tower::Service` over `http::Request<B>` (any body,
//! unread), so it mounts in axum (`Router::nest_service`), in a hyper
//! server, or behind any tower stack. A `GET` serves the HTML page; a `GET`
//! with `?format=json` in the query serves the JSON, which the page polls.
//!
//! # What it shows
//!
//! For each breaker (or key): its state, when it probes next, its window
//! (calls, failures, slow calls and their rates) beside the trip rules
//! they are judged by ([`Snapshot::thresholds`]), the failures in a row,
//! its admitted and rejected calls, a spend guard's spend against its
//! budget, and its last transitions. With the `redis` feature,
//! `StatusPage::fleet` adds a backend's replicas alive and its quorum.
//! The page lays the breakers out as a table on a wide screen and as cards
//! on a narrow one; a long key wraps only after a separator (`/`, `:`,
//! `.`, `_`, `@`, `-`), and a run too long for its column ends in an
//! ellipsis, with the whole key in its title.
//!
//! [`Snapshot::thresholds`]: crate::Snapshot::thresholds
//!
//! # Mount it behind your own auth
//!
//! The page serves no secret: no header, body or URL of any request, only
//! the stored keys (a key made by
//! [`header_hashed`](crate::keyed::header_hashed) shows as its hash), and
//! the page escapes every key, since keys come from requests. But keys,
//! states and counts still tell an outsider which upstreams fail and which
//! tenants or models exist: mount the page behind the service's own
//! authentication, on an internal listener, never on a public route as it
//! is.
//!
//! # Example
//!
//! ```
//! use tower::ServiceExt;
//! use tower_circuit_breaker::keyed::KeyedBreakers;
//! use tower_circuit_breaker::status::StatusPage;
//! use tower_circuit_breaker::{Outcome, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let page = StatusPage::new();
//! let models = KeyedBreakers::builder()
//!     .trip_mode(TripMode::Open)
//!     .consecutive_failures(1)
//!     .on_transition(page.listener()) // for "last transitions"
//!     .build()
//!     .unwrap();
//! let page = page.keyed("models", &models);
//! models.admit("gpt-4o").unwrap().record(Outcome::Failure);
//!
//! // With axum: Router::new().nest_service("/breakers", page)
//! let request = http::Request::get("/breakers?format=json").body(()).unwrap();
//! let response = page.oneshot(request).await.unwrap();
//! assert_eq!(response.headers()["content-type"], "application/json");
//! let json = response.into_body();
//! assert!(json.contains(r#""breaker":"models","key":"gpt-4o","state":"open""#));
//! # }
//! ```

mod json;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Ready};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tower_service::Service;

use crate::breaker::{Breaker, Reason, State, Transition};
use crate::keyed::KeyedBreakers;

/// How many transitions the page remembers, across all its breakers.
const LOG_LEN: usize = 256;
/// How many of a breaker's last transitions the page shows.
const SHOWN: usize = 5;

/// The page, shared by every clone of the service.
const PAGE: &str = include_str!("page.html");

/// A `tower::Service` serving the state of a set of breakers as JSON and as
/// an HTML page that polls the JSON. See the [module docs](self).
///
/// Cheap to clone; clones serve the same breakers and share one log of
/// transitions.
///
/// ```
/// use tower::ServiceExt;
/// use tower_circuit_breaker::status::StatusPage;
/// use tower_circuit_breaker::Breaker;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().name("gpt-4o").build().unwrap();
/// breaker.force_open();
/// let page = StatusPage::new().breaker(&breaker);
/// let request = http::Request::get("/status.json").body(()).unwrap();
/// let response = page.clone().oneshot(request).await.unwrap();
/// assert_eq!(response.status(), http::StatusCode::OK);
/// assert!(page.to_json().contains("gpt-4o"));
/// # }
/// ```
#[derive(Clone)]
pub struct StatusPage {
    sources: Arc<Vec<Source>>,
    log: Arc<Mutex<VecDeque<Logged>>>,
    refresh: Duration,
}

#[derive(Clone)]
enum Source {
    Breaker(Breaker),
    Keyed(Arc<str>, KeyedBreakers),
    /// A Redis backend's fleet, under a name.
    #[cfg(feature = "redis")]
    Fleet(Arc<str>, FleetView),
}

/// Reads a Redis attachment's fleet and whether it shares state now.
#[cfg(feature = "redis")]
type FleetView = Arc<dyn Fn() -> (crate::redis::Fleet, bool) + Send + Sync>;

/// One transition as the page remembers it: no request data but the key.
struct Logged {
    key: Option<Arc<str>>,
    from: State,
    to: State,
    reason: Reason,
    at: Instant,
}

impl fmt::Debug for StatusPage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusPage")
            .field("sources", &self.sources.len())
            .field("refresh", &self.refresh)
            .finish()
    }
}

impl Default for StatusPage {
    fn default() -> Self {
        StatusPage::new()
    }
}

impl StatusPage {
    /// A page with no breakers yet, refreshing every 2 s.
    ///
    /// ```
    /// # use tower_circuit_breaker::status::StatusPage;
    /// let page = StatusPage::new();
    /// # let _ = page;
    /// ```
    #[must_use]
    pub fn new() -> Self {
        StatusPage {
            sources: Arc::new(Vec::new()),
            log: Arc::new(Mutex::new(VecDeque::with_capacity(LOG_LEN))),
            refresh: Duration::from_secs(2),
        }
    }

    /// Shows `breaker`, under its name.
    ///
    /// ```
    /// # use tower_circuit_breaker::{status::StatusPage, Breaker};
    /// let breaker = Breaker::builder().name("embeddings").build().unwrap();
    /// let page = StatusPage::new().breaker(&breaker);
    /// # let _ = page;
    /// ```
    #[must_use]
    pub fn breaker(mut self, breaker: &Breaker) -> Self {
        Arc::make_mut(&mut self.sources).push(Source::Breaker(breaker.clone()));
        self
    }

    /// Shows every key of `breakers`, under `name`.
    ///
    /// ```
    /// # use tower_circuit_breaker::{status::StatusPage, keyed::KeyedBreakers};
    /// let models = KeyedBreakers::builder().build().unwrap();
    /// let page = StatusPage::new().keyed("models", &models);
    /// # let _ = page;
    /// ```
    #[must_use]
    pub fn keyed(mut self, name: impl Into<Arc<str>>, breakers: &KeyedBreakers) -> Self {
        Arc::make_mut(&mut self.sources).push(Source::Keyed(name.into(), breakers.clone()));
        self
    }

    /// Shows the fleet of `attachment`'s backend, under `name`: the replicas
    /// alive on its prefix, how many of them must agree to open a shared
    /// circuit (see [`Attachment::fleet`]), and whether it shares state now
    /// ([`Attachment::is_shared`]). Quorum votes per breaker are kept in
    /// Redis alone and are not shown.
    ///
    /// [`Attachment::fleet`]: crate::redis::Attachment::fleet
    /// [`Attachment::is_shared`]: crate::redis::Attachment::is_shared
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    /// use tower_circuit_breaker::status::StatusPage;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Nothing listens on port 1: no heartbeat has counted anyone yet.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:1/")?).build()?;
    /// let breaker = Breaker::builder().name("chat").build()?;
    /// let attachment = backend.attach(&breaker)?;
    /// let page = StatusPage::new().breaker(&breaker).fleet("redis", &attachment);
    /// assert!(page
    ///     .to_json()
    ///     .contains(r#""fleets":[{"name":"redis","alive":0,"quorum":0,"shared":false}]"#));
    /// # attachment.detach().await;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn fleet(
        mut self,
        name: impl Into<Arc<str>>,
        attachment: &crate::redis::Attachment,
    ) -> Self {
        let view: FleetView = Arc::new(attachment.view());
        Arc::make_mut(&mut self.sources).push(Source::Fleet(name.into(), view));
        self
    }

    /// How often the HTML page polls the JSON (default 2 s, at least 100 ms).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_circuit_breaker::status::StatusPage;
    /// let page = StatusPage::new().refresh(Duration::from_secs(5));
    /// # let _ = page;
    /// ```
    #[must_use]
    pub fn refresh(mut self, every: Duration) -> Self {
        self.refresh = every.max(Duration::from_millis(100));
        self
    }

    /// A transition listener for [`Builder::on_transition`]: the page shows
    /// the last transitions of each breaker it heard of through one. A
    /// breaker's transitions are matched to it by its name (a keyed
    /// breaker's, by its key).
    ///
    /// [`Builder::on_transition`]: crate::Builder::on_transition
    ///
    /// ```
    /// # use tower_circuit_breaker::{status::StatusPage, Breaker};
    /// let page = StatusPage::new();
    /// let breaker = Breaker::builder().name("chat").on_transition(page.listener()).build().unwrap();
    /// let page = page.breaker(&breaker);
    /// # let _ = page;
    /// ```
    pub fn listener(&self) -> impl Fn(&Transition) + Send + Sync + 'static {
        let log = Arc::downgrade(&self.log);
        move |t: &Transition| {
            let Some(log) = log.upgrade() else {
                return;
            };
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            if log.len() == LOG_LEN {
                log.pop_front();
            }
            log.push_back(Logged {
                key: t.key.clone(),
                from: t.from,
                to: t.to,
                reason: t.reason,
                at: t.at,
            });
        }
    }

    /// The JSON the page polls: `{"refresh_ms": .., "fleets": [..],
    /// "breakers": [..]}`, the circuits that are not closed first.
    ///
    /// Each breaker has `breaker` (its name, or the keyed set's), `key`
    /// (empty unless keyed), `state`, `next_probe_ms` (while open), `window`
    /// (`calls`, `failures`, `slow`, `failure_rate`, `slow_rate`: see
    /// [`Snapshot::window`] for which window each state shows),
    /// `consecutive_failures`, `reopens`, `metrics_only`, `counters`,
    /// `thresholds` (the trip rules, each `null` when off: `window`
    /// (`{"calls"}` or `{"span_ms", "buckets"}`), `min_calls`,
    /// `failure_rate`, `slow_call_ms`, `slow_call_rate`,
    /// `consecutive_failures`), `spend` (with a spend guard: `budget`,
    /// `spent`, `unit`, `exceeded`, `period`, which is `"utc_hour"`,
    /// `"utc_day"` or `{"rolling_ms"}`; else `null`) and `transitions` (the
    /// last few, newest first: `from`, `to`, `reason`, `ago_ms`).
    ///
    /// Each fleet (see `StatusPage::fleet`; none without the `redis`
    /// feature) has `name`, `alive`, `quorum` and `shared`.
    ///
    /// [`Snapshot::window`]: crate::Snapshot::window
    ///
    /// ```
    /// # use tower_circuit_breaker::{status::StatusPage, Breaker};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let breaker = Breaker::builder().name("chat").build().unwrap();
    /// breaker.force_open();
    /// let json = StatusPage::new().breaker(&breaker).to_json();
    /// assert!(json.contains(r#""breaker":"chat","key":"","state":"forced-open""#));
    /// # }
    /// ```
    #[must_use]
    pub fn to_json(&self) -> String {
        let now = Instant::now();
        let mut rows = Vec::new();
        #[allow(unused_mut)]
        let mut fleets = Vec::new();
        for source in self.sources.iter() {
            match source {
                #[cfg(feature = "redis")]
                Source::Fleet(name, view) => {
                    let (fleet, shared) = view();
                    fleets.push(json::Fleet {
                        name: name.clone(),
                        alive: fleet.alive,
                        quorum: fleet.quorum,
                        shared,
                    });
                }
                Source::Breaker(b) => {
                    let snap = b.snapshot();
                    let name = snap.key.clone().unwrap_or_else(|| "".into());
                    rows.push(json::Row {
                        breaker: name,
                        key: "".into(),
                        snap,
                    });
                }
                Source::Keyed(name, set) => {
                    rows.extend(set.snapshots().into_iter().map(|snap| json::Row {
                        breaker: name.clone(),
                        key: snap.key.clone().unwrap_or_else(|| "".into()),
                        snap,
                    }));
                }
            }
        }
        rows.sort_by(|a, b| {
            (a.snap.state == State::Closed, &a.breaker, &a.key).cmp(&(
                b.snap.state == State::Closed,
                &b.breaker,
                &b.key,
            ))
        });
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        json::render(&rows, &fleets, self.refresh, |row| {
            // The transitions of a plain breaker carry its name; a keyed
            // one's, its key.
            let id = if row.key.is_empty() {
                &row.breaker
            } else {
                &row.key
            };
            log.iter()
                .rev()
                .filter(move |t| t.key.as_deref() == Some(&**id))
                .take(SHOWN)
                .map(move |t| json::Shown {
                    from: t.from,
                    to: t.to,
                    reason: t.reason,
                    ago: now.saturating_duration_since(t.at),
                })
        })
    }

    /// The HTML page: static, self-contained, with no data in it; its
    /// script fetches the JSON from its own path and fills the table.
    ///
    /// ```
    /// # use tower_circuit_breaker::status::StatusPage;
    /// let html = StatusPage::new().to_html();
    /// assert!(html.starts_with("<!doctype html>"));
    /// ```
    #[must_use]
    pub fn to_html(&self) -> String {
        PAGE.replace("__REFRESH_MS__", &self.refresh.as_millis().to_string())
    }

    fn respond<B>(&self, request: &Request<B>) -> Response<String> {
        let head_only = request.method() == Method::HEAD;
        if request.method() != Method::GET && !head_only {
            let mut res = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            res.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return res;
        }
        let wants_json = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "format=json"));
        let (body, kind) = if wants_json {
            (self.to_json(), "application/json")
        } else {
            (self.to_html(), "text/html; charset=utf-8")
        };
        let mut res = Response::new(if head_only { String::new() } else { body });
        let h = res.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        // The page loads nothing and talks to nothing but its own origin.
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
        );
        res
    }
}

fn plain(status: StatusCode, text: &str) -> Response<String> {
    let mut res = Response::new(text.to_owned());
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

impl<B> Service<Request<B>> for StatusPage {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    #[inline]
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        ready(Ok(self.respond(&request)))
    }
}
