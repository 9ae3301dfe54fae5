//! RadixAttention prefix cache (SGLang's `RadixCache`), page size 1.
//!
//! A radix tree keyed by token ids. Each edge holds a run of tokens and the KV slots of those
//! tokens (same length). A request looks up the longest cached prefix of its prompt
//! ([`RadixCache::match_prefix`]), locks the node that ends it so the prefix cannot be evicted
//! while it runs ([`RadixCache::inc_lock_ref`]), and hands its own slots to the tree when it
//! has computed them ([`RadixCache::cache_unfinished_request`],
//! [`RadixCache::cache_finished_request`]). When the pool runs short the scheduler evicts
//! least-recently-used unlocked leaves ([`RadixCache::evict`]).
//!
//! Representation:
//! - nodes live in an arena (`Vec<Node>` plus a free list); a [`NodeId`] carries the arena
//!   index and a generation, so a handle to an evicted node is detected rather than aliasing
//!   whatever node reuses its index;
//! - children are keyed by the first token of their edge;
//! - `lock_ref` counts the running requests whose locked node is this node or a descendant;
//!   a node with `lock_ref > 0` is protected, all others are evictable;
//! - `last_access` is a logical clock value; each lookup or insert stamps every node on its path,
//!   so a parent is never older than its children;
//! - `lru` holds `(last_access, index)` of exactly the unlocked leaves, so eviction pops the
//!   oldest in O(log n) and a parent becomes a candidate once its last child is gone.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::{CacheError, KvPool};

const ROOT: u32 = 0;

/// Handle to a tree node. Stays valid until the node is evicted or the cache is reset; a stale
/// handle is rejected, never mistaken for another node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId {
    index: u32,
    generation: u32,
}

/// Result of [`RadixCache::match_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchResult {
    /// KV slots of the longest cached prefix of the key, one per token.
    pub slots: Vec<u32>,
    /// The node that ends that prefix exactly (the root when nothing matched).
    pub last_node: NodeId,
}

/// Multiplicative hash for `u32` token keys; children maps are hot and need no DoS resistance
/// (keys are token ids of a fixed vocabulary).
#[derive(Default, Clone, Copy)]
struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Children = HashMap<u32, u32, BuildHasherDefault<TokenHasher>>;

#[derive(Debug, Default)]
struct Node {
    key: Vec<u32>,
    value: Vec<u32>,
    parent: u32,
    children: Children,
    lock_ref: u32,
    last_access: u64,
    generation: u32,
    live: bool,
    in_lru: bool,
}

/// The prefix cache. See the module documentation.
#[derive(Debug)]
pub struct RadixCache {
    disabled: bool,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    lru: BTreeSet<(u64, u32)>,
    clock: u64,
    evictable_size: usize,
    protected_size: usize,
    total_size: usize,
}

impl Default for RadixCache {
    fn default() -> Self {
        Self::new(false)
    }
}

fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl RadixCache {
    /// An empty cache. With `disabled` (SGLang's `--disable-radix-cache`) nothing is ever
    /// cached: lookups match nothing and the request helpers free a finished request's slots.
    pub fn new(disabled: bool) -> Self {
        let root = Node {
            live: true,
            ..Node::default()
        };
        Self {
            disabled,
            nodes: vec![root],
            free_nodes: Vec::new(),
            lru: BTreeSet::new(),
            clock: 0,
            evictable_size: 0,
            protected_size: 0,
            total_size: 0,
        }
    }

    pub fn is_disabled(&self) -> bool {
        self.disabled
    }

    pub fn root(&self) -> NodeId {
        self.id_of(ROOT)
    }

    /// Tokens held by unlocked nodes (all of them can be evicted).
    pub fn evictable_size(&self) -> usize {
        self.evictable_size
    }

    /// Tokens held by nodes locked by running requests.
    pub fn protected_size(&self) -> usize {
        self.protected_size
    }

    /// Tokens (and so KV slots) held by the tree.
    pub fn total_size(&self) -> usize {
        self.total_size
    }

    /// Number of nodes, the root included.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free_nodes.len()
    }

    /// Whether `node` still exists (was not evicted or reset away).
    pub fn contains(&self, node: NodeId) -> bool {
        self.resolve(node).is_some()
    }

    /// Number of tokens from the root to the end of `node`.
    pub fn node_prefix_len(&self, node: NodeId) -> Result<usize, CacheError> {
        let idx = self.resolve(node).ok_or(CacheError::InvalidNode(node))?;
        Ok(self.depth(idx))
    }

    /// KV slots from the root to the end of `node`, in token order.
    pub fn node_slots(&self, node: NodeId) -> Result<Vec<u32>, CacheError> {
        let idx = self.resolve(node).ok_or(CacheError::InvalidNode(node))?;
        let path = self.path_from_root(idx);
        Ok(path
            .iter()
            .flat_map(|&i| self.nodes[i as usize].value.iter().copied())
            .collect())
    }

    /// Length of the longest cached prefix of `key`, without stamping access times or
    /// splitting nodes (for scheduling decisions that must not disturb the LRU order).
    pub fn peek_prefix_len(&self, key: &[u32]) -> usize {
        if self.disabled {
            return 0;
        }
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let Some(&child) = self.nodes[node as usize].children.get(&key[pos]) else {
                break;
            };
            let edge = &self.nodes[child as usize].key;
            let m = common_prefix_len(edge, &key[pos..]);
            pos += m;
            if m < edge.len() {
                break;
            }
            node = child;
        }
        pos
    }

    /// Longest cached prefix of `key`. When it ends inside an edge, that edge is split so the
    /// returned node ends exactly at the prefix. Stamps the path as recently used.
    pub fn match_prefix(&mut self, key: &[u32]) -> MatchResult {
        let mut slots = Vec::new();
        if self.disabled || key.is_empty() {
            return MatchResult {
                slots,
                last_node: self.root(),
            };
        }
        let now = self.tick();
        self.set_access(ROOT, now);
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let Some(&child) = self.nodes[node as usize].children.get(&key[pos]) else {
                break;
            };
            let m = common_prefix_len(&self.nodes[child as usize].key, &key[pos..]);
            let child = if m < self.nodes[child as usize].key.len() {
                self.split(child, m)
            } else {
                child
            };
            self.set_access(child, now);
            slots.extend_from_slice(&self.nodes[child as usize].value);
            node = child;
            pos += m;
        }
        MatchResult {
            slots,
            last_node: self.id_of(node),
        }
    }

    /// Insert `key → slots`. Returns how many leading tokens were already cached: the caller's
    /// slots for those positions are duplicates that it must free (the tree keeps its own);
    /// the tree takes ownership of the rest.
    ///
    /// `key` and `slots` must have the same length; on a mismatch (a caller bug) the error is
    /// logged and only the common length is inserted.
    pub fn insert(&mut self, key: &[u32], slots: &[u32]) -> usize {
        if self.disabled {
            return 0;
        }
        if key.len() != slots.len() {
            tracing::error!(
                error = %CacheError::LengthMismatch { tokens: key.len(), slots: slots.len() },
                "radix insert with mismatched lengths"
            );
        }
        let n = key.len().min(slots.len());
        let now = self.tick();
        self.set_access(ROOT, now);
        let mut node = ROOT;
        let mut pos = 0;
        while pos < n {
            let Some(&child) = self.nodes[node as usize].children.get(&key[pos]) else {
                let leaf = self.new_node(key[pos..n].to_vec(), slots[pos..n].to_vec(), node, now);
                self.nodes[node as usize].children.insert(key[pos], leaf);
                self.evictable_size += n - pos;
                self.total_size += n - pos;
                self.update_lru(node);
                self.update_lru(leaf);
                return pos;
            };
            let m = common_prefix_len(&self.nodes[child as usize].key, &key[pos..n]);
            let child = if m < self.nodes[child as usize].key.len() {
                self.split(child, m)
            } else {
                child
            };
            self.set_access(child, now);
            node = child;
            pos += m;
        }
        pos
    }

    /// Lock `node` and its ancestors against eviction. Returns the number of tokens that
    /// became protected. A stale handle is logged and ignored (returns 0).
    pub fn inc_lock_ref(&mut self, node: NodeId) -> usize {
        self.try_inc_lock_ref(node).unwrap_or_else(|err| {
            tracing::error!(error = %err, "radix inc_lock_ref");
            0
        })
    }

    /// Undo one [`Self::inc_lock_ref`]. Returns the number of tokens that became evictable.
    /// A stale handle or an unlocked node is logged and ignored (returns 0).
    pub fn dec_lock_ref(&mut self, node: NodeId) -> usize {
        self.try_dec_lock_ref(node).unwrap_or_else(|err| {
            tracing::error!(error = %err, "radix dec_lock_ref");
            0
        })
    }

    pub fn try_inc_lock_ref(&mut self, node: NodeId) -> Result<usize, CacheError> {
        if self.disabled {
            return Ok(0);
        }
        let mut idx = self.resolve(node).ok_or(CacheError::InvalidNode(node))?;
        let mut newly_protected = 0;
        while idx != ROOT {
            let n = &mut self.nodes[idx as usize];
            if n.lock_ref == 0 {
                let len = n.key.len();
                self.evictable_size -= len;
                self.protected_size += len;
                newly_protected += len;
            }
            n.lock_ref += 1;
            let parent = n.parent;
            self.update_lru(idx);
            idx = parent;
        }
        Ok(newly_protected)
    }

    pub fn try_dec_lock_ref(&mut self, node: NodeId) -> Result<usize, CacheError> {
        if self.disabled {
            return Ok(0);
        }
        let mut idx = self.resolve(node).ok_or(CacheError::InvalidNode(node))?;
        // Ancestors hold at least the node's count, so checking the node covers the path.
        if idx != ROOT && self.nodes[idx as usize].lock_ref == 0 {
            return Err(CacheError::NotLocked(node));
        }
        let mut newly_evictable = 0;
        while idx != ROOT {
            let n = &mut self.nodes[idx as usize];
            n.lock_ref -= 1;
            if n.lock_ref == 0 {
                let len = n.key.len();
                self.evictable_size += len;
                self.protected_size -= len;
                newly_evictable += len;
            }
            let parent = n.parent;
            self.update_lru(idx);
            idx = parent;
        }
        Ok(newly_evictable)
    }

    /// Evict least-recently-used unlocked leaves until at least `num_tokens` slots are freed
    /// or nothing is evictable. Freed slots go back to `pool`. Returns the number freed (may
    /// exceed `num_tokens` by part of the last leaf).
    pub fn evict(&mut self, num_tokens: usize, pool: &mut KvPool) -> usize {
        let mut freed = 0;
        while freed < num_tokens {
            let Some((_, idx)) = self.lru.pop_first() else {
                break;
            };
            let node = &mut self.nodes[idx as usize];
            node.in_lru = false;
            let value = std::mem::take(&mut node.value);
            let (parent, first) = (node.parent, node.key[0]);
            if let Err(err) = pool.free(&value) {
                tracing::error!(error = %err, "evicted radix node held slots the pool rejected");
            }
            freed += value.len();
            self.evictable_size -= value.len();
            self.total_size -= value.len();
            self.nodes[parent as usize].children.remove(&first);
            self.release_node(idx);
            self.update_lru(parent);
        }
        freed
    }

    /// Drop every cached prefix and return its slots to `pool` (`/flush_cache`). Refused while
    /// any node is locked, i.e. while requests run.
    pub fn reset(&mut self, pool: &mut KvPool) -> Result<(), CacheError> {
        if self.protected_size > 0 {
            return Err(CacheError::Locked {
                protected: self.protected_size,
            });
        }
        for idx in 1..self.nodes.len() as u32 {
            if !self.nodes[idx as usize].live {
                continue;
            }
            let value = std::mem::take(&mut self.nodes[idx as usize].value);
            if let Err(err) = pool.free(&value) {
                tracing::error!(error = %err, "flushed radix node held slots the pool rejected");
            }
            self.nodes[idx as usize].in_lru = false;
            self.release_node(idx);
        }
        self.nodes[ROOT as usize].children.clear();
        self.lru.clear();
        self.evictable_size = 0;
        self.total_size = 0;
        Ok(())
    }

    /// Hand a finished request's KV slots to the tree and release its lock.
    ///
    /// `tokens` are the tokens whose KV was computed (prompt + output, without the last sampled
    /// token), `slots` their slots, `last_node` the node the request holds locked (its prefix
    /// `slots[..prefix]` is the tree's own). Slots duplicating tokens that someone else cached
    /// meanwhile are freed to `pool`; the tree keeps the rest. With the cache disabled all
    /// `slots` are freed. Returns how many leading tokens were already cached.
    pub fn cache_finished_request(
        &mut self,
        tokens: &[u32],
        slots: &[u32],
        last_node: NodeId,
        pool: &mut KvPool,
    ) -> Result<usize, CacheError> {
        if tokens.len() != slots.len() {
            return Err(CacheError::LengthMismatch {
                tokens: tokens.len(),
                slots: slots.len(),
            });
        }
        if self.disabled {
            pool.free(slots)?;
            return Ok(0);
        }
        let cached_before = self.check_request_prefix(tokens, slots, last_node)?;
        let already_cached = self.insert(tokens, slots);
        Self::free_duplicates(pool, slots.get(cached_before..already_cached));
        self.try_dec_lock_ref(last_node)?;
        Ok(already_cached)
    }

    /// Hand a running request's computed KV slots to the tree (after its prompt, or a chunk
    /// of it, is prefilled) and move its lock to the node that now ends its tokens.
    ///
    /// Arguments as for [`Self::cache_finished_request`]. Returns the request's new slots for
    /// `tokens` (duplicates replaced by the tree's slots: the request must use these from now
    /// on) and its new locked node. With the cache disabled, returns `slots` unchanged and the
    /// root.
    pub fn cache_unfinished_request(
        &mut self,
        tokens: &[u32],
        slots: &[u32],
        last_node: NodeId,
        pool: &mut KvPool,
    ) -> Result<MatchResult, CacheError> {
        if tokens.len() != slots.len() {
            return Err(CacheError::LengthMismatch {
                tokens: tokens.len(),
                slots: slots.len(),
            });
        }
        if self.disabled {
            return Ok(MatchResult {
                slots: slots.to_vec(),
                last_node: self.root(),
            });
        }
        let cached_before = self.check_request_prefix(tokens, slots, last_node)?;
        let already_cached = self.insert(tokens, slots);
        Self::free_duplicates(pool, slots.get(cached_before..already_cached));
        let matched = self.match_prefix(tokens);
        self.try_inc_lock_ref(matched.last_node)?;
        self.try_dec_lock_ref(last_node)?;
        Ok(matched)
    }

    /// `duplicates` is `None` only if the tree lost part of a locked prefix (a bug).
    fn free_duplicates(pool: &mut KvPool, duplicates: Option<&[u32]>) {
        let Some(duplicates) = duplicates else {
            tracing::error!("radix insert matched less than the request's locked prefix");
            return;
        };
        if let Err(err) = pool.free(duplicates) {
            tracing::error!(error = %err, "freeing duplicate KV slots of a cached request");
        }
    }

    /// Check that `node` is locked (or the root) and that the path to it holds exactly
    /// `tokens[..len]` with `slots[..len]`. Returns that `len`.
    fn check_request_prefix(
        &self,
        tokens: &[u32],
        slots: &[u32],
        node: NodeId,
    ) -> Result<usize, CacheError> {
        let idx = self.resolve(node).ok_or(CacheError::InvalidNode(node))?;
        if idx != ROOT && self.nodes[idx as usize].lock_ref == 0 {
            return Err(CacheError::NotLocked(node));
        }
        let mut pos = 0;
        for i in self.path_from_root(idx) {
            let n = &self.nodes[i as usize];
            let end = pos + n.key.len();
            if end > tokens.len() || n.key != tokens[pos..end] || n.value != slots[pos..end] {
                return Err(CacheError::PrefixMismatch);
            }
            pos = end;
        }
        Ok(pos)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn id_of(&self, idx: u32) -> NodeId {
        NodeId {
            index: idx,
            generation: self.nodes[idx as usize].generation,
        }
    }

    fn resolve(&self, id: NodeId) -> Option<u32> {
        let n = self.nodes.get(id.index as usize)?;
        (n.live && n.generation == id.generation).then_some(id.index)
    }

    fn depth(&self, mut idx: u32) -> usize {
        let mut len = 0;
        while idx != ROOT {
            let n = &self.nodes[idx as usize];
            len += n.key.len();
            idx = n.parent;
        }
        len
    }

    /// Indices from the first node below the root down to `idx` (empty for the root).
    fn path_from_root(&self, mut idx: u32) -> Vec<u32> {
        let mut path = Vec::new();
        while idx != ROOT {
            path.push(idx);
            idx = self.nodes[idx as usize].parent;
        }
        path.reverse();
        path
    }

    fn new_node(&mut self, key: Vec<u32>, value: Vec<u32>, parent: u32, now: u64) -> u32 {
        let fresh = |generation| Node {
            key,
            value,
            parent,
            children: Children::default(),
            lock_ref: 0,
            last_access: now,
            generation,
            live: true,
            in_lru: false,
        };
        match self.free_nodes.pop() {
            Some(idx) => {
                let slot = &mut self.nodes[idx as usize];
                *slot = fresh(slot.generation);
                idx
            }
            None => {
                self.nodes.push(fresh(0));
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn release_node(&mut self, idx: u32) {
        debug_assert!(!self.nodes[idx as usize].in_lru);
        let n = &mut self.nodes[idx as usize];
        let generation = n.generation.wrapping_add(1);
        *n = Node {
            generation,
            ..Node::default()
        };
        self.free_nodes.push(idx);
    }

    /// Split `child`'s edge after `at` tokens: a new node takes the first `at` tokens and
    /// becomes `child`'s parent. `child` keeps its identity (and any lock held on it); the new
    /// node inherits its lock count and access time. Returns the new node.
    fn split(&mut self, child: u32, at: usize) -> u32 {
        let c = &mut self.nodes[child as usize];
        let key_tail = c.key.split_off(at);
        let value_tail = c.value.split_off(at);
        let key_head = std::mem::replace(&mut c.key, key_tail);
        let value_head = std::mem::replace(&mut c.value, value_tail);
        let (parent, lock_ref, last_access) = (c.parent, c.lock_ref, c.last_access);
        let (head_first, tail_first) = (key_head[0], c.key[0]);
        let mid = self.new_node(key_head, value_head, parent, last_access);
        let m = &mut self.nodes[mid as usize];
        m.lock_ref = lock_ref;
        m.children.insert(tail_first, child);
        self.nodes[child as usize].parent = mid;
        self.nodes[parent as usize].children.insert(head_first, mid);
        mid
    }

    fn set_access(&mut self, idx: u32, now: u64) {
        let n = &mut self.nodes[idx as usize];
        if n.in_lru {
            self.lru.remove(&(n.last_access, idx));
            self.lru.insert((now, idx));
        }
        n.last_access = now;
    }

    /// Put `idx` into the LRU index iff it is an unlocked, live, non-root leaf.
    fn update_lru(&mut self, idx: u32) {
        let n = &mut self.nodes[idx as usize];
        let evictable_leaf = idx != ROOT && n.live && n.children.is_empty() && n.lock_ref == 0;
        if evictable_leaf != n.in_lru {
            n.in_lru = evictable_leaf;
            if evictable_leaf {
                self.lru.insert((n.last_access, idx));
            } else {
                self.lru.remove(&(n.last_access, idx));
            }
        }
    }
}

#[cfg(test)]
impl RadixCache {
    /// Every slot the tree holds.
    pub(crate) fn all_slots(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|&(i, n)| i as u32 != ROOT && n.live)
            .flat_map(|(_, n)| n.value.iter().copied())
            .collect()
    }

    /// Structural checks: links, lock counts, access-time order, LRU index, size counters.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![ROOT];
        let (mut evictable, mut protected, mut leaves) = (0, 0, 0);
        while let Some(idx) = stack.pop() {
            let n = &self.nodes[idx as usize];
            if !n.live || std::mem::replace(&mut seen[idx as usize], true) {
                return Err(format!("node {idx} dead or reached twice"));
            }
            let mut child_locks = 0;
            for (&first, &c) in &n.children {
                let cn = &self.nodes[c as usize];
                if cn.parent != idx || cn.key.first() != Some(&first) {
                    return Err(format!("bad link {idx} -> {c}"));
                }
                if cn.last_access > n.last_access {
                    return Err(format!("child {c} newer than parent {idx}"));
                }
                child_locks += cn.lock_ref;
                stack.push(c);
            }
            if idx == ROOT {
                continue;
            }
            if n.key.is_empty() || n.key.len() != n.value.len() {
                return Err(format!("node {idx}: key {:?} value {:?}", n.key, n.value));
            }
            if n.lock_ref < child_locks {
                return Err(format!(
                    "node {idx}: lock {} < children {child_locks}",
                    n.lock_ref
                ));
            }
            if n.lock_ref > 0 {
                protected += n.key.len();
            } else {
                evictable += n.key.len();
            }
            let want_lru = n.children.is_empty() && n.lock_ref == 0;
            leaves += usize::from(want_lru);
            if n.in_lru != want_lru || want_lru != self.lru.contains(&(n.last_access, idx)) {
                return Err(format!("node {idx}: LRU membership wrong"));
            }
        }
        let live = self.nodes.iter().filter(|n| n.live).count();
        if live != seen.iter().filter(|&&s| s).count() || live != self.node_count() {
            return Err("unreachable live nodes or bad free list".into());
        }
        if leaves != self.lru.len() {
            return Err(format!(
                "LRU has {} entries, {leaves} evictable leaves",
                self.lru.len()
            ));
        }
        if (evictable, protected) != (self.evictable_size, self.protected_size)
            || evictable + protected != self.total_size
        {
            return Err(format!(
                "sizes: counted {evictable}+{protected}, recorded {}+{} (total {})",
                self.evictable_size, self.protected_size, self.total_size
            ));
        }
        Ok(())
    }
}
