//! [`Changed`]: a future that completes at the breaker's next state change.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::futures::OwnedNotified;
use tokio::time::Sleep;

use super::Shared;

pin_project_lite::pin_project! {
    /// Completes at the next state change; see
    /// [`Breaker::changed`](crate::Breaker::changed).
    ///
    /// State changes that come with time alone (the end of the open period,
    /// a half-open probe's deadline) happen when the breaker is next
    /// touched. A waiter with no traffic around touches it itself: while a
    /// deadline is pending, it sleeps until then in its own task (so it
    /// needs a runtime with timers, as any Tokio sleep does).
    pub struct Changed {
        #[pin]
        notified: OwnedNotified,
        shared: Arc<Shared>,
        // Boxed so `Changed` stays `Unpin`-friendly to hold; made only while
        // a deadline is pending.
        sleep: Option<(u64, Pin<Box<Sleep>>)>,
    }
}

impl Changed {
    pub(super) fn new(shared: &Arc<Shared>) -> Self {
        Changed {
            notified: Arc::clone(&shared.changes).notified_owned(),
            shared: Arc::clone(shared),
            sleep: None,
        }
    }
}

impl fmt::Debug for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changed").finish_non_exhaustive()
    }
}

impl Future for Changed {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            if this.notified.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            let due = this.shared.next_deadline();
            if due == u64::MAX {
                *this.sleep = None;
                return Poll::Pending;
            }
            if this.shared.now() >= due {
                // Applies what came due; a change wakes `notified` above.
                this.shared.touch();
                if this.notified.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                if this.shared.next_deadline() == due {
                    // Nothing moved (a shared-state backend holds the cycle).
                    return Poll::Pending;
                }
                continue;
            }
            if this.sleep.as_ref().is_none_or(|(at, _)| *at != due) {
                let at = this.shared.deadline(due).instant();
                *this.sleep = Some((due, Box::pin(tokio::time::sleep_until(at))));
            }
            let (_, sleep) = this.sleep.as_mut().expect("set above");
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}
