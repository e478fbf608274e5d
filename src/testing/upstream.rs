//! [`ScriptedUpstream`]: a tower service that answers as its [`Script`]
//! says, and logs what reached it.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower_service::Service;

use super::body::respond;
use super::rate_limit::set_headers;
use super::{Answer, Script, ScriptedBody};
use crate::BoxError;

/// A stand-in for an LLM API that answers by its [`Script`]: the phases of
/// an outage in (paused) time, a capacity, deterministic draws. Put it
/// under your own stack, or behind your own handler, as the client it
/// replaces.
///
/// Time 0 of the script is when the upstream is made: make it after
/// pausing time (`#[tokio::test(start_paused = true)]`), then every latency,
/// hang and stream runs on Tokio's paused clock. Clones share the upstream:
/// its clock, its queue and its [`AttemptLog`].
///
/// See the [module docs](super) for an example.
#[derive(Clone)]
pub struct ScriptedUpstream {
    shared: Arc<Shared>,
}

struct Shared {
    script: Script,
    start: Instant,
    /// Service slots, with a capacity.
    slots: Option<Arc<Semaphore>>,
    log: AttemptLog,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Attempts so far, per request.
    tries: HashMap<u64, u32>,
    /// Calls without a request id so far.
    unnamed: u64,
    /// Attempts waiting for a slot.
    waiting: u32,
    /// With a rate limit: the current window, and the calls it let in.
    window: (u64, u32),
}

impl ScriptedUpstream {
    /// An upstream following `script` from now, with an attempt log of its
    /// own.
    pub fn new(script: Script) -> Self {
        ScriptedUpstream::with_log(script, AttemptLog::new())
    }

    /// An upstream following `script` from now that logs its attempts to
    /// `log`, which other upstreams may share (a failover's members, say),
    /// keeping their order.
    pub fn with_log(script: Script, log: AttemptLog) -> Self {
        // Jitter nobody seeded, first drawn on this thread from now on,
        // follows the script's seed (see the module docs).
        crate::rng::script::set(script.seed);
        let slots = script
            .capacity
            .map(|c| Arc::new(Semaphore::new(c.concurrent as usize)));
        ScriptedUpstream {
            shared: Arc::new(Shared {
                script,
                start: Instant::now(),
                slots,
                log,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Its attempt log.
    #[must_use]
    pub fn log(&self) -> &AttemptLog {
        &self.shared.log
    }

    /// Its script.
    #[must_use]
    pub fn script(&self) -> &Script {
        &self.shared.script
    }

    /// When its script began.
    #[must_use]
    pub fn started(&self) -> Instant {
        self.shared.start
    }
}

impl fmt::Debug for ScriptedUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedUpstream")
            .field("name", &self.shared.script.name())
            .field("phases", &self.shared.script.phases())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request a call belongs to.
    fn request_of<B>(&self, request: &Request<B>) -> u64 {
        let id = self.script.request_id.as_ref().and_then(|name| {
            request
                .headers()
                .get(name)?
                .to_str()
                .ok()?
                .parse::<u64>()
                .ok()
        });
        id.unwrap_or_else(|| {
            let mut state = self.state();
            state.unnamed += 1;
            state.unnamed - 1
        })
    }

    /// Starts the next attempt of `request`: decides what it gets (`over`,
    /// or a draw from the script) and logs it.
    fn begin(&self, request: u64, over: Option<Answer>) -> (Answer, usize) {
        let at = Instant::now() - self.start;
        let n = {
            let mut state = self.state();
            let tries = state.tries.entry(request).or_insert(0);
            *tries += 1;
            *tries - 1
        };
        let answer = over.unwrap_or_else(|| {
            let (u, v, w) = self.script.draws(request, n);
            self.script.answer_at(at, u, v, w)
        });
        let index = self.log.push(Attempt {
            upstream: Arc::clone(&self.script.name),
            at,
            request,
            n,
            answer,
            served: false,
            ran: Duration::ZERO,
        });
        (answer, index)
    }
}

impl<B> Service<Request<B>> for ScriptedUpstream {
    type Response = Response<ScriptedBody>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> ResponseFuture {
        let shared = &self.shared;
        let id = shared.request_of(&request);
        let limited = shared.take_rate_limit();
        let inner = shared.call(id, limited.and_then(|l| l.over));
        match limited {
            None => inner,
            Some(l) => ResponseFuture::new(async move {
                let mut response = inner.await?;
                let reset = l.reset_at.saturating_duration_since(Instant::now());
                set_headers(response.headers_mut(), l.limit, l.remaining, reset);
                Ok(response)
            }),
        }
    }
}

/// What a call's rate limit says: the calls left in its window, the
/// window's end, and the 429 of a call beyond it.
#[derive(Clone, Copy)]
struct Limited {
    limit: u32,
    remaining: u32,
    reset_at: Instant,
    over: Option<Answer>,
}

impl Shared {
    /// Counts a call against the rate limit, if there is one.
    fn take_rate_limit(&self) -> Option<Limited> {
        let limit = self.script.rate_limit?;
        let at = Instant::now() - self.start;
        let w = limit.window(at);
        let mut state = self.state();
        if state.window.0 != w {
            state.window = (w, 0);
        }
        let over = state.window.1 >= limit.requests;
        if !over {
            state.window.1 += 1;
        }
        Some(Limited {
            limit: limit.requests,
            remaining: limit.requests - state.window.1,
            reset_at: self.start + limit.window_end(w),
            over: over.then_some(Answer::too_many_requests(None)),
        })
    }

    /// A call of request `id`, answered `over` when given, else by the
    /// script.
    fn call(self: &Arc<Self>, id: u64, over: Option<Answer>) -> ResponseFuture {
        let shared = self;
        let tokens = shared.script.stream_tokens;
        let usage = shared.script.usage.clone();
        if over.is_some() {
            let (answer, attempt) = shared.begin(id, over);
            let ran = Ran::start(shared, attempt);
            return ResponseFuture::new(async move {
                let _ran = ran;
                respond(answer, tokens, usage.as_deref()).await
            });
        }
        let (Some(capacity), Some(slots)) = (shared.script.capacity, shared.slots.clone()) else {
            let (answer, attempt) = shared.begin(id, None);
            let ran = Ran::start(shared, attempt);
            return ResponseFuture::new(async move {
                let _ran = ran;
                respond(answer, tokens, usage.as_deref()).await
            });
        };
        // Over capacity: wait for a slot while the queue has room, else a
        // 429 at once.
        let permit = Arc::clone(&slots).try_acquire_owned().ok();
        let queued = permit.is_none() && {
            let mut state = shared.state();
            let room = state.waiting < capacity.queue;
            if room {
                state.waiting += 1;
            }
            room
        };
        if permit.is_none() && !queued {
            let limited = Answer::too_many_requests(capacity.retry_after);
            let (answer, attempt) = shared.begin(id, Some(limited));
            let ran = Ran::start(shared, attempt);
            return ResponseFuture::new(async move {
                let _ran = ran;
                respond(answer, tokens, usage.as_deref()).await
            });
        }
        let (answer, attempt) = shared.begin(id, None);
        let shared = Arc::clone(shared);
        ResponseFuture::new(async move {
            let permit = match permit {
                Some(p) => p,
                None => {
                    let _left = Waiting(&shared);
                    slots
                        .acquire_owned()
                        .await
                        .map_err(|_| BoxError::from("the upstream's slots are closed"))?
                }
            };
            let _ran = Ran::start(&shared, attempt);
            let answer = respond(answer, tokens, usage.as_deref()).await;
            drop(permit);
            answer
        })
    }
}

/// Notes that an attempt got its slot, and how long it ran when its future
/// finishes or is dropped (a timeout gave up on it).
struct Ran {
    shared: Arc<Shared>,
    attempt: usize,
    since: Instant,
}

impl Ran {
    fn start(shared: &Arc<Shared>, attempt: usize) -> Ran {
        shared.log.update(attempt, |a| a.served = true);
        Ran {
            shared: Arc::clone(shared),
            attempt,
            since: Instant::now(),
        }
    }
}

impl Drop for Ran {
    fn drop(&mut self) {
        let ran = self.since.elapsed();
        self.shared.log.update(self.attempt, |a| a.ran = ran);
    }
}

/// An attempt in the queue, until it gets a slot or is given up.
struct Waiting<'a>(&'a Shared);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.state().waiting -= 1;
    }
}

// === ResponseFuture ===

/// Response future of [`ScriptedUpstream`].
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<Response<ScriptedBody>, BoxError>> + Send>>,
}

impl ResponseFuture {
    fn new(
        future: impl Future<Output = Result<Response<ScriptedBody>, BoxError>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<ScriptedBody>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

// === AttemptLog ===

/// One call that reached a [`ScriptedUpstream`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Attempt {
    /// The upstream's [name](super::ScriptBuilder::name).
    pub upstream: Arc<str>,
    /// When it came, since the upstream was made.
    pub at: Duration,
    /// Its request: the request id, or the call's number.
    pub request: u64,
    /// How many attempts of its request this upstream saw before it.
    pub n: u32,
    /// What it got (a 429 when it found no room).
    pub answer: Answer,
    /// Whether it got a slot (always, without a capacity).
    pub served: bool,
    /// How long it ran after getting its slot: to its response head, its
    /// error, or the moment its caller gave up.
    pub ran: Duration,
}

/// The attempts one or more [`ScriptedUpstream`]s saw, in the order they
/// came. Cheap to clone; clones share the log.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceExt;
/// use tower_circuit_breaker::testing::{Answer, AttemptLog, Phase, Script, ScriptedUpstream};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let log = AttemptLog::new();
/// let script = |name: &'static str, answer| {
///     Script::builder().name(name).phase(Phase::new(Duration::ZERO).answer(1.0, answer)).build().unwrap()
/// };
/// let primary = ScriptedUpstream::with_log(script("primary", Answer::status(503)), log.clone());
/// let fallback = ScriptedUpstream::with_log(script("fallback", Answer::ok()), log.clone());
/// primary.oneshot(http::Request::new(())).await.unwrap();
/// fallback.oneshot(http::Request::new(())).await.unwrap();
/// let who: Vec<_> = log.attempts().iter().map(|a| a.upstream.to_string()).collect();
/// assert_eq!(who, ["primary", "fallback"]);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct AttemptLog {
    inner: Arc<Mutex<LogInner>>,
}

#[derive(Default)]
struct LogInner {
    attempts: Vec<Attempt>,
    /// Attempts per request, over every upstream logging here.
    per_request: HashMap<u64, u32>,
}

impl AttemptLog {
    /// An empty log.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Every attempt so far.
    #[must_use]
    pub fn attempts(&self) -> Vec<Attempt> {
        self.lock().attempts.clone()
    }

    /// How many attempts there were.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().attempts.len()
    }

    /// Whether no call came yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many attempts of `request` came, over every upstream logging
    /// here.
    #[must_use]
    pub fn attempts_of(&self, request: u64) -> u32 {
        self.lock().per_request.get(&request).copied().unwrap_or(0)
    }

    fn push(&self, attempt: Attempt) -> usize {
        let mut log = self.lock();
        *log.per_request.entry(attempt.request).or_insert(0) += 1;
        log.attempts.push(attempt);
        log.attempts.len() - 1
    }

    fn update(&self, index: usize, f: impl FnOnce(&mut Attempt)) {
        if let Some(a) = self.lock().attempts.get_mut(index) {
            f(a);
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for AttemptLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptLog")
            .field("attempts", &self.len())
            .finish()
    }
}
