//! The shard tables of a keyed set: finding a key's breaker, making one
//! within the cap on keys, sweeping idle keys away.

use super::*;

impl Inner {
    pub(super) fn get(&self, key: &str) -> Option<Breaker> {
        let hash = self.hash(key);
        read(self.shard(hash))
            .find(hash, |e| same_key(&e.key, key))
            .map(|e| e.breaker.clone())
    }

    /// A call whose key function panicked: it has no key, and sending it to
    /// the `(unkeyed)` breaker would mix it with calls that truly carry none,
    /// so it shares the overflow breaker, as keys do that find no room.
    #[cold]
    #[inline(never)]
    pub(super) fn key_fn_panicked(&self, fallback: bool) -> Result<Permit, CircuitOpen> {
        let panics = self.key_fn_panics.fetch_add(1, Ordering::Relaxed) + 1;
        // Once, then at every power of two: a key function that panics on
        // every call must not flood the log. The panic's message is left to
        // the panic hook, which has already shown it; repeating it here could
        // carry request data into the log.
        if panics.is_power_of_two() {
            tracing::error!(
                target: "tower_circuit_breaker",
                panics,
                "keyed breakers: the key function panicked; the call goes to the overflow breaker"
            );
        }
        self.overflow.admit_marked(|| fallback)
    }

    /// The hash of `key`, which picks its shard and its place in the table.
    ///
    /// Keys can come from request headers, so an attacker who could make
    /// many keys hash alike would turn every lookup in their shard into a
    /// scan. The hasher is foldhash (hashbrown's), a fast hash for short
    /// strings that is seeded but makes no claim against such attacks, and
    /// in this build draws its seed from address-space layout alone; so the
    /// state it starts from is first folded with 128 bits the operating
    /// system's randomness gave this set, which an attacker never sees.
    /// The cap on keys and the overflow breaker bound what is left, and
    /// credentials should be keyed by [`header_hashed`], whose SipHash under
    /// a secret no one outside can steer. A lone string needs no terminator
    /// (`str`'s `Hash` adds one, to keep keys made of several fields
    /// apart), which saves a round of mixing.
    #[inline]
    pub(super) fn hash(&self, key: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u128(self.seed);
        h.write(key.as_bytes());
        h.finish()
    }

    #[inline]
    pub(super) fn shard(&self, hash: u64) -> &RwLock<HashTable<Arc<Entry>>> {
        // Top bits pick the shard; the table uses the low ones.
        &self.shards[(hash >> 60) as usize % SHARDS]
    }

    /// Admits a call for a key the set does not hold yet.
    #[cold]
    #[inline(never)]
    pub(super) fn admit_new(
        &self,
        key: &str,
        hash: u64,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        self.insert(key, hash).admit_marked(|| fallback)
    }

    #[cold]
    pub(super) fn insert(&self, key: &str, hash: u64) -> Breaker {
        self.sweep_if_due(false);
        if let Some(b) = self.try_insert(key, hash) {
            return b;
        }
        // Full: make room if a sweep is due, else share the overflow breaker.
        self.sweep_if_due(true);
        self.try_insert(key, hash).unwrap_or_else(|| {
            tracing::warn!(
                target: "tower_circuit_breaker",
                max_keys = self.max_keys,
                "keyed breakers full; new keys share the overflow breaker"
            );
            self.overflow.clone()
        })
    }

    pub(super) fn try_insert(&self, key: &str, hash: u64) -> Option<Breaker> {
        let mut table = write(self.shard(hash));
        if let Some(e) = table.find(hash, |e| same_key(&e.key, key)) {
            return Some(e.breaker.clone());
        }
        // Reserve a place first, so racing inserts cannot pass the cap.
        let reserved = self
            .len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_keys).then_some(n + 1)
            });
        reserved.ok()?;
        let config = self
            .overrides
            .iter()
            .find(|(k, _)| &**k == key)
            .map_or_else(|| self.config.clone(), |(_, c)| c.clone());
        let name: Arc<str> = key.into();
        let breaker = Breaker::with_config(config, Some(name.clone()));
        if let Some(cap) = &self.open_cap {
            cap.added(&name, &breaker);
        }
        table.insert_unique(
            hash,
            Arc::new(Entry {
                key: name,
                breaker: breaker.clone(),
                marks: touched::Marks::new(),
            }),
            |e| self.hash(&e.key),
        );
        // Under the shard's lock: a reader that sees the new count and
        // then reads the shard finds the key.
        self.members.fetch_add(1, Ordering::AcqRel);
        Some(breaker)
    }

    /// Evicts closed keys unused since the previous sweep, at most once per
    /// idle timeout. With `full`, also when the set is at its cap.
    pub(super) fn sweep_if_due(&self, full: bool) {
        let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let due = last.is_none_or(|at| now.saturating_duration_since(at) >= self.idle);
        if !due || (!full && self.len.load(Ordering::Relaxed) == 0) {
            return;
        }
        *last = Some(now);
        let mut evicted = 0;
        for shard in self.shards.iter() {
            write(shard).retain(|e| {
                let used = e.marks.take_used();
                let keep = used || e.breaker.state() != State::Closed;
                evicted += usize::from(!keep);
                if !keep && let Some(cap) = &self.open_cap {
                    // Under the shard's lock, as it was added: a key that
                    // comes back is registered after it left.
                    cap.evicted(&e.key);
                }
                keep
            });
        }
        self.len.fetch_sub(evicted, Ordering::AcqRel);
        if evicted > 0 {
            // Entries cached by threads may be gone: make them look again.
            self.version.store(last::next_version(), Ordering::Release);
            self.members.fetch_add(1, Ordering::AcqRel);
        }
        if evicted > 0 {
            tracing::debug!(target: "tower_circuit_breaker", evicted, "evicted idle keyed breakers");
        }
        drop(last);
        if evicted > 0
            && let Some(cap) = &self.open_cap
        {
            // Fewer keys, so fewer may be open.
            cap.enforce(self);
        }
    }
}

pub(super) fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// 128 bits from the operating system's randomness: std's `RandomState`
/// keys SipHash with them, and two hashes under two of its keys are
/// unpredictable without them.
pub(super) fn os_random_seed() -> u128 {
    let draw = || std::collections::hash_map::RandomState::new().hash_one(0u8);
    (u128::from(draw()) << 64) | u128::from(draw())
}
