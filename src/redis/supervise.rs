//! Keeps an attachment's sync task alive: whatever ends it early (a panic in
//! the task, in a listener it runs, anywhere below it) is logged and the task
//! starts again, with backoff, so a replica never leaves shared mode for good.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Runs the task `start` makes until it returns (it was stopped) or `stop`
/// closes; restarts it whenever it ends any other way, waiting `backoff.0`,
/// doubling up to `backoff.1`, and from `backoff.0` again once a run has
/// lasted longer than `backoff.1`.
///
/// Each run is a task of its own, so its panic ends at its `JoinHandle`
/// instead of here. The run is aborted if this future is dropped.
pub(super) async fn supervise<F, Fut>(
    mut start: F,
    mut stop: watch::Receiver<()>,
    backoff: (Duration, Duration),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut delay = backoff.0;
    let mut restarts: u64 = 0;
    loop {
        let started = Instant::now();
        let mut run = AbortOnDrop(tokio::spawn(start()));
        let err = match (&mut run.0).await {
            Ok(()) => return,
            // Aborted: only when the runtime shuts down, which ends us too.
            Err(e) if e.is_cancelled() => return,
            Err(e) => e,
        };
        if stop.has_changed().is_err() {
            // Detached while it was failing: nothing left to restart for.
            return;
        }
        if started.elapsed() > backoff.1 {
            delay = backoff.0;
        }
        restarts += 1;
        // The payload is not logged: the panic hook has shown it already.
        tracing::error!(
            target: "tower_circuit_breaker",
            restarts,
            panicked = err.is_panic(),
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "redis sync task died; breakers are local until it restarts"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
        delay = delay.saturating_mul(2).min(backoff.1);
    }
}

/// A run's handle that aborts the run when dropped, so that dropping the
/// supervisor leaves no run behind.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_run_that_panics_is_started_again_with_backoff() {
        let runs = Arc::new(AtomicU32::new(0));
        let (stop_tx, stop) = watch::channel(());
        let r = runs.clone();
        let start = move || {
            let r = r.clone();
            async move {
                // Panics on its first three runs, then runs until stopped.
                if r.fetch_add(1, Ordering::SeqCst) < 3 {
                    panic!("a bug anywhere in the task");
                }
                std::future::pending::<()>().await;
            }
        };
        let began = Instant::now();
        let task = tokio::spawn(supervise(
            start,
            stop,
            (Duration::from_millis(100), Duration::from_secs(1)),
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            4,
            "three panics, three restarts"
        );
        // This run never returns, so only dropping the supervisor ends it.
        drop(stop_tx);
        task.abort();
        let _ = task.await;
        assert!(began.elapsed() >= Duration::from_millis(100 + 200 + 400));
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_that_returns_is_not_started_again() {
        let runs = Arc::new(AtomicU32::new(0));
        let (_stop_tx, stop) = watch::channel(());
        let r = runs.clone();
        supervise(
            move || {
                r.fetch_add(1, Ordering::SeqCst);
                async {}
            },
            stop,
            (Duration::from_millis(100), Duration::from_secs(1)),
        )
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_supervisor_aborts_its_run() {
        let (_stop_tx, stop) = watch::channel(());
        let alive = Arc::new(());
        let a = alive.clone();
        let task = tokio::spawn(supervise(
            move || {
                let a = a.clone();
                async move {
                    let _a = a;
                    std::future::pending::<()>().await;
                }
            },
            stop,
            (Duration::from_millis(100), Duration::from_secs(1)),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            Arc::strong_count(&alive),
            3,
            "ours, the factory's and the run's"
        );
        task.abort();
        let _ = task.await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(Arc::strong_count(&alive), 1, "the run was aborted");
    }
}
