//! Whose turn it is to send a circuit's next health probe, when several
//! replicas share one circuit: the hook a shared-state backend installs so
//! that one replica probes for all.
//!
//! The breaker only keeps the hook; the backend decides. Nothing here is
//! touched by admission or recording: a prober asks once per interval.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::{Breaker, Remote};
use crate::sync::lock;

/// The answer to "may this replica send the next health probe?": `true` to
/// send it, `false` when another replica holds the turn.
pub(crate) type Turn = Pin<Box<dyn Future<Output = bool> + Send>>;

/// Hands out turns to probe one circuit across replicas.
pub(crate) trait Turns: Send + Sync {
    /// Asks for the turn, to be held for `hold` unless renewed. A backend
    /// that cannot tell (its store is unreachable, too slow) answers `true`:
    /// each replica then probes on its own.
    fn take(&self, hold: Duration) -> Turn;
}

impl Breaker {
    /// Whether this replica may send the circuit's next health probe; `true`
    /// unless a backend says another replica holds the turn for `hold`.
    pub(crate) async fn health_turn(&self, hold: Duration) -> bool {
        let turns = lock(&self.shared.control).turns.clone();
        match turns {
            Some(turns) => turns.take(hold).await,
            None => true,
        }
    }
}

impl Remote<'_> {
    /// Installs (or, with `None`, removes) the backend's hook deciding whose
    /// turn it is to send the health probe.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn set_turns(&self, turns: Option<Arc<dyn Turns>>) {
        lock(&self.shared.control).turns = turns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Grants every other turn, and counts the asks.
    struct Alternate(AtomicU32);

    impl Turns for Alternate {
        fn take(&self, _: Duration) -> Turn {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::ready(n.is_multiple_of(2)))
        }
    }

    #[tokio::test]
    async fn without_a_hook_every_turn_is_ours_and_with_one_the_hook_decides() {
        let breaker = Breaker::builder().build().unwrap();
        let hold = Duration::from_secs(1);
        assert!(breaker.health_turn(hold).await);
        let hook = Arc::new(Alternate(AtomicU32::new(0)));
        breaker.remote().set_turns(Some(hook.clone()));
        assert!(breaker.health_turn(hold).await);
        assert!(!breaker.health_turn(hold).await);
        assert_eq!(hook.0.load(Ordering::SeqCst), 2);
        breaker.remote().set_turns(None);
        assert!(breaker.health_turn(hold).await);
        assert_eq!(hook.0.load(Ordering::SeqCst), 2);
    }
}
