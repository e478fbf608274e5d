//! The wait before a retry, ended early by the watched breakers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::breaker::{Breaker, Changed, State};

pin_project! {
    /// The wait before a retry: a timer that ends early when every watched
    /// breaker is open.
    ///
    /// When the watched breakers are already open as the wait begins, it is
    /// over at once, so the retry meets the rejection without delay.
    pub struct Backoff {
        #[pin]
        sleep: Sleep,
        watch: Arc<[Breaker]>,
        changed: Vec<Pin<Box<Changed>>>,
        over: bool,
    }
}

impl Backoff {
    pub(super) fn new(wait: Duration, watch: Arc<[Breaker]>) -> Self {
        // Subscribe before looking at the states, so that a transition in
        // between is not missed.
        let changed = watch.iter().map(|b| Box::pin(b.changed())).collect();
        Backoff {
            sleep: tokio::time::sleep(wait),
            over: all_open(&watch),
            watch,
            changed,
        }
    }
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("deadline", &self.sleep.deadline())
            .field("watched", &self.watch.len())
            .finish()
    }
}

impl Future for Backoff {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if *this.over {
            return Poll::Ready(());
        }
        let mut fired = false;
        for (changed, breaker) in this.changed.iter_mut().zip(this.watch.iter()) {
            // Re-subscribe after each transition, and poll the new future so
            // that it registers this task.
            while changed.as_mut().poll(cx).is_ready() {
                fired = true;
                *changed = Box::pin(breaker.changed());
            }
        }
        if fired && all_open(this.watch) {
            *this.over = true;
            return Poll::Ready(());
        }
        this.sleep.poll(cx)
    }
}

/// Whether every watched breaker would reject a call now (and there is at
/// least one).
fn all_open(watch: &[Breaker]) -> bool {
    !watch.is_empty()
        && watch.iter().all(|b| {
            // A breaker in shadow mode reports open but admits every call.
            matches!(b.state(), State::Open | State::ForcedOpen) && !b.is_metrics_only()
        })
}
