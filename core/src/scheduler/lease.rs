//! A request's hold on KV memory: the slots of the tokens it has computed (or is computing)
//! and the radix node it holds locked.
//!
//! The first `node_prefix_len(node)` slots belong to the radix cache (the cached prefix the
//! request matched or handed over); the rest are the request's own. The lease moves through
//! the cache's ownership rule (each slot in the pool, the tree or one request) in four ways:
//! [`KvLease::admit`] locks a cached prefix, [`KvLease::grow`] adds slots taken from the pool,
//! [`KvLease::cache_computed`] hands computed tokens to the tree, and [`KvLease::release`]
//! gives everything back (a finished, aborted or retracted request).

use crate::cache::{CacheError, KvPool, NodeId, RadixCache};

#[derive(Debug)]
pub(super) struct KvLease {
    /// KV slots of the request's first `slots.len()` tokens.
    slots: Vec<u32>,
    /// The radix node held locked; the root when the lease holds nothing.
    node: NodeId,
}

impl KvLease {
    /// A lease that holds nothing (`root` is the radix cache's root).
    pub fn new(root: NodeId) -> Self {
        KvLease {
            slots: Vec::new(),
            node: root,
        }
    }

    /// Slots held: tokens with KV computed, cached or being computed.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// Whether the lease holds no slot (the scheduler tests' bookkeeping checks).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The radix node held locked (the scheduler tests' bookkeeping checks).
    #[cfg(test)]
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Lock the longest cached prefix of `key` and take its slots. Returns its length.
    pub fn admit(&mut self, cache: &mut RadixCache, key: &[u32]) -> usize {
        let m = cache.match_prefix(key);
        cache.inc_lock_ref(m.last_node);
        self.slots = m.slots;
        self.node = m.last_node;
        self.slots.len()
    }

    /// Undo an admission before any slot was added.
    pub fn unlock(&mut self, cache: &mut RadixCache) {
        cache.dec_lock_ref(self.node);
        self.slots.clear();
        self.node = cache.root();
    }

    /// Add the slots of the next tokens.
    pub fn grow(&mut self, new: &[u32]) {
        self.slots.extend_from_slice(new);
    }

    /// Give the slots from position `len` on back to the pool (undo a [`Self::grow`]).
    pub fn shrink(&mut self, len: usize, pool: &mut KvPool) -> Result<(), CacheError> {
        let extra = self.slots.split_off(len.min(self.slots.len()));
        pool.free(&extra)
    }

    /// Hand the KV of `tokens` (the first `tokens.len()` positions, all computed) to the radix
    /// cache so that other requests can share it, and lock the node that now ends them. Slots
    /// the tree already held for the same tokens replace the request's own (which go back to
    /// the pool); slots past `tokens` stay as they are.
    pub fn cache_computed(
        &mut self,
        tokens: &[u32],
        cache: &mut RadixCache,
        pool: &mut KvPool,
    ) -> Result<(), CacheError> {
        let n = tokens.len();
        let own = self.slots.get(..n).ok_or(CacheError::LengthMismatch {
            tokens: n,
            slots: self.slots.len(),
        })?;
        let m = cache.cache_unfinished_request(tokens, own, self.node, pool)?;
        let later = self.slots.split_off(n);
        self.slots = m.slots;
        self.slots.extend_from_slice(&later);
        self.node = m.last_node;
        Ok(())
    }

    /// Give everything back: the KV of `tokens` (the first `tokens.len()` positions) to the
    /// radix cache (or the pool with the cache off), the slots past them to the pool, and the
    /// lock. A slot past the known tokens holds the KV of a token still being sampled by a
    /// pass in flight: the pass writes it before any later pass that could be given it runs.
    /// The lease holds nothing afterwards, even when the cache reports an error.
    pub fn release(
        &mut self,
        tokens: &[u32],
        cache: &mut RadixCache,
        pool: &mut KvPool,
    ) -> Result<(), CacheError> {
        let n = tokens.len().min(self.slots.len());
        let cached = cache.cache_finished_request(&tokens[..n], &self.slots[..n], self.node, pool);
        let freed = pool.free(&self.slots[n..]);
        self.slots.clear();
        self.node = cache.root();
        cached.and(freed)
    }
}
