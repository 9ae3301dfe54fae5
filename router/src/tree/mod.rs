//! An approximate radix tree over request text, shared by all workers.
//!
//! The router cannot see the workers' KV caches, so it keeps its own guess: every request's
//! text is inserted into one radix tree under the worker it was sent to. Each node holds an
//! edge label (a run of characters) and, for every worker ("tenant") that has seen the path
//! through it, the logical time of its last use. A worker's entries form a sub-tree that
//! contains the root: a tenant on a node is also on every ancestor.
//!
//! - `insert(text, worker)` walks the tree, splitting an edge where the text diverges,
//!   refreshes the worker's time on every node of the path and adds a leaf for the rest.
//! - `match_prefix(text, candidates)` walks as far as some candidate worker has been and
//!   returns the matched length in characters and the candidates present at the deepest
//!   node reached (a partial match into an edge counts its matched characters).
//! - `evict(max_chars)` trims every worker that holds more than `max_chars` characters by
//!   removing it from its least recently used leaves, one at a time; a node that no worker
//!   holds any more is deleted.
//! - `remove_tenant(worker)` drops a worker's entries at once (worker removed or dead).
//! - `forget(text, worker, receipt)` takes back one `insert` whose request the worker
//!   refused: the characters the worker did not hold before that insert are dropped, unless a
//!   later insert has used them since. A refused request leaves no text behind.
//!
//! Lengths are in characters, not tokens, and edges split only on character boundaries.
//! One reader-writer lock guards the tree: matches share it, inserts and evictions take it
//! alone. A match costs one hash lookup per edge plus a byte comparison of the text.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::RwLock;
use slab::Slab;

#[cfg(test)]
mod tests;

type NodeId = usize;
type TenantId = u32;

/// Hasher for `char` keys of child maps: one multiply instead of SipHash.
#[derive(Default)]
struct CharHasher(u64);

impl Hasher for CharHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type ChildMap = HashMap<char, NodeId, BuildHasherDefault<CharHasher>>;

struct Node {
    /// Edge label from the parent; empty only for the root.
    label: Box<str>,
    /// `label.chars().count()`.
    chars: usize,
    parent: NodeId,
    children: ChildMap,
    /// Workers that have seen this node, with the logical time of their last use.
    tenants: Vec<(TenantId, u64)>,
}

impl Node {
    fn new(label: &str, parent: NodeId) -> Self {
        Self {
            label: label.into(),
            chars: label.chars().count(),
            parent,
            children: ChildMap::default(),
            tenants: Vec::new(),
        }
    }

    fn tenant_time(&self, tenant: TenantId) -> Option<u64> {
        self.tenants
            .iter()
            .find(|(t, _)| *t == tenant)
            .map(|(_, time)| *time)
    }

    fn has_tenant(&self, tenant: TenantId) -> bool {
        self.tenants.iter().any(|(t, _)| *t == tenant)
    }
}

/// What one [`PrefixTree::insert`] changed, so that [`PrefixTree::forget`] can take it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertReceipt {
    /// The logical time the insert stamped on its path.
    time: u64,
    /// Characters of the text the tenant already held before the insert.
    held_before: usize,
}

/// Result of [`PrefixTree::match_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Characters of the text covered by the deepest node reached.
    pub matched_chars: usize,
    /// Characters in the whole text.
    pub total_chars: usize,
    /// Candidate workers that hold the deepest node reached (empty when nothing matched).
    pub tenants: Vec<Arc<str>>,
}

impl PrefixMatch {
    /// Matched characters over total characters, 0 for an empty text.
    pub fn rate(&self) -> f64 {
        if self.total_chars == 0 {
            0.0
        } else {
            self.matched_chars as f64 / self.total_chars as f64
        }
    }
}

struct Inner {
    nodes: Slab<Node>,
    root: NodeId,
    clock: u64,
    ids: HashMap<Arc<str>, TenantId>,
    names: HashMap<TenantId, Arc<str>>,
    next_id: TenantId,
    /// Characters held per tenant: the sum of `chars` over the nodes it is on.
    tenant_chars: HashMap<TenantId, usize>,
}

/// The shared approximate radix tree (see the module documentation).
pub struct PrefixTree {
    inner: RwLock<Inner>,
}

impl Default for PrefixTree {
    fn default() -> Self {
        Self::new()
    }
}

/// Length in bytes of the longest common prefix of `a` and `b` that ends on a character
/// boundary of both.
fn common_prefix_len(a: &str, b: &str) -> usize {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let mut k = ab.iter().zip(bb).take_while(|(x, y)| x == y).count();
    // Equal bytes up to k decode to equal characters, so a boundary of `a` at k is one of
    // `b` too; back off out of a character that differs only in a continuation byte.
    while !a.is_char_boundary(k) {
        k -= 1;
    }
    k
}

impl PrefixTree {
    pub fn new() -> Self {
        let mut nodes = Slab::new();
        let root = nodes.insert(Node::new("", 0));
        Self {
            inner: RwLock::new(Inner {
                nodes,
                root,
                clock: 0,
                ids: HashMap::new(),
                names: HashMap::new(),
                next_id: 0,
                tenant_chars: HashMap::new(),
            }),
        }
    }

    /// Records that `tenant` has seen `text`.
    pub fn insert(&self, text: &str, tenant: &str) -> InsertReceipt {
        let mut inner = self.inner.write();
        inner.insert(text, tenant)
    }

    /// Takes back the insert of `text` under `tenant` that returned `receipt` (the request was
    /// refused): drops what it added unless a later insert has used it since. Returns the
    /// characters dropped.
    pub fn forget(&self, text: &str, tenant: &str, receipt: InsertReceipt) -> usize {
        let mut inner = self.inner.write();
        inner.forget(text, tenant, receipt)
    }

    /// Longest prefix of `text` held by any worker in `candidates` (see module docs).
    pub fn match_prefix<S: AsRef<str>>(&self, text: &str, candidates: &[S]) -> PrefixMatch {
        let inner = self.inner.read();
        inner.match_prefix(text, candidates)
    }

    /// Drops every entry of `tenant`; nodes no one holds any more are deleted.
    pub fn remove_tenant(&self, tenant: &str) {
        let mut inner = self.inner.write();
        inner.remove_tenant(tenant);
    }

    /// Trims each worker to at most `max_chars` characters by evicting its least recently
    /// used leaves. Returns the number of characters evicted, over all workers.
    pub fn evict(&self, max_chars: usize) -> usize {
        let mut inner = self.inner.write();
        let over: Vec<TenantId> = inner
            .tenant_chars
            .iter()
            .filter(|&(_, &c)| c > max_chars)
            .map(|(&t, _)| t)
            .collect();
        over.into_iter()
            .map(|t| inner.evict_tenant(t, max_chars))
            .sum()
    }

    /// Characters held by `tenant` (0 when unknown).
    pub fn tenant_chars(&self, tenant: &str) -> usize {
        let inner = self.inner.read();
        inner
            .ids
            .get(tenant)
            .and_then(|id| inner.tenant_chars.get(id))
            .copied()
            .unwrap_or(0)
    }

    /// Characters held per worker, sorted by worker name.
    pub fn tenant_sizes(&self) -> Vec<(Arc<str>, usize)> {
        let inner = self.inner.read();
        let mut sizes: Vec<(Arc<str>, usize)> = inner
            .ids
            .iter()
            .map(|(name, id)| {
                (
                    name.clone(),
                    inner.tenant_chars.get(id).copied().unwrap_or(0),
                )
            })
            .collect();
        sizes.sort();
        sizes
    }

    /// Number of nodes, the root included.
    pub fn node_count(&self) -> usize {
        self.inner.read().nodes.len()
    }

    /// Checks every structural invariant; returns a description of the first broken one.
    /// Used by tests, and cheap enough to call after a stress run.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.read().check_invariants()
    }
}

impl Inner {
    fn tenant_id(&mut self, tenant: &str) -> TenantId {
        if let Some(&id) = self.ids.get(tenant) {
            return id;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let name: Arc<str> = tenant.into();
        self.ids.insert(name.clone(), id);
        self.names.insert(id, name);
        self.tenant_chars.insert(id, 0);
        id
    }

    /// Sets `tenant`'s time on `node`, adding it (and its characters) when new.
    fn touch(&mut self, node: NodeId, tenant: TenantId, now: u64) {
        let n = &mut self.nodes[node];
        if let Some(entry) = n.tenants.iter_mut().find(|(t, _)| *t == tenant) {
            entry.1 = now;
            return;
        }
        n.tenants.push((tenant, now));
        let chars = n.chars;
        *self.tenant_chars.entry(tenant).or_insert(0) += chars;
    }

    fn insert(&mut self, text: &str, tenant: &str) -> InsertReceipt {
        let tenant = self.tenant_id(tenant);
        self.clock += 1;
        let now = self.clock;
        let mut node = self.root;
        self.touch(node, tenant, now);
        // Characters of the path the tenant held before, while it held all of them.
        let mut held_before = 0;
        let mut holding = true;
        let mut rest = text;
        while let Some(first) = rest.chars().next() {
            let Some(&child) = self.nodes[node].children.get(&first) else {
                let leaf = self.nodes.insert(Node::new(rest, node));
                self.nodes[node].children.insert(first, leaf);
                self.touch(leaf, tenant, now);
                break;
            };
            let k = common_prefix_len(&self.nodes[child].label, rest);
            let next = if k < self.nodes[child].label.len() {
                self.split(child, k)
            } else {
                child
            };
            holding = holding && self.nodes[next].has_tenant(tenant);
            if holding {
                held_before += self.nodes[next].chars;
            }
            self.touch(next, tenant, now);
            node = next;
            rest = &rest[k..];
        }
        InsertReceipt {
            time: now,
            held_before,
        }
    }

    fn forget(&mut self, text: &str, tenant: &str, receipt: InsertReceipt) -> usize {
        let Some(&tenant) = self.ids.get(tenant) else {
            return 0;
        };
        // The path of `text`, with the characters before each node.
        let mut path: Vec<(NodeId, usize)> = Vec::new();
        let mut node = self.root;
        let mut offset = 0;
        let mut rest = text;
        while let Some(first) = rest.chars().next() {
            let Some(&child) = self.nodes[node].children.get(&first) else {
                break;
            };
            let c = &self.nodes[child];
            let k = common_prefix_len(&c.label, rest);
            if k < c.label.len() {
                break;
            }
            path.push((child, offset));
            offset += c.chars;
            node = child;
            rest = &rest[k..];
        }
        let before = self.tenant_chars.get(&tenant).copied().unwrap_or(0);
        for &(node, start) in path.iter().rev() {
            let untouched_since = self.nodes[node].tenant_time(tenant) == Some(receipt.time);
            if start < receipt.held_before || !untouched_since || !self.is_leaf_for(node, tenant) {
                break;
            }
            self.drop_from_node(node, tenant);
        }
        before.saturating_sub(self.tenant_chars.get(&tenant).copied().unwrap_or(0))
    }

    /// Splits `child`'s edge after `k` bytes; returns the new upper node, which holds the
    /// same tenants (so per-tenant character totals do not change).
    fn split(&mut self, child: NodeId, k: usize) -> NodeId {
        let (parent, head, tail, tenants) = {
            let c = &self.nodes[child];
            (
                c.parent,
                c.label[..k].to_owned(),
                c.label[k..].to_owned(),
                c.tenants.clone(),
            )
        };
        let mut mid = Node::new(&head, parent);
        mid.tenants = tenants;
        let mid_chars = mid.chars;
        let mid_id = self.nodes.insert(mid);
        if let Some(tail_first) = tail.chars().next() {
            self.nodes[mid_id].children.insert(tail_first, child);
        }
        if let Some(head_first) = head.chars().next() {
            self.nodes[parent].children.insert(head_first, mid_id);
        }
        let c = &mut self.nodes[child];
        c.label = tail.into();
        c.chars -= mid_chars;
        c.parent = mid_id;
        mid_id
    }

    fn match_prefix<S: AsRef<str>>(&self, text: &str, candidates: &[S]) -> PrefixMatch {
        let allowed: Vec<TenantId> = candidates
            .iter()
            .filter_map(|c| self.ids.get(c.as_ref()).copied())
            .collect();
        let total_chars = text.chars().count();
        let holds = |n: &Node| n.tenants.iter().any(|(t, _)| allowed.contains(t));
        let mut node = self.root;
        let mut matched_chars = 0;
        let mut rest = text;
        while let Some(first) = rest.chars().next() {
            let Some(&child) = self.nodes[node].children.get(&first) else {
                break;
            };
            let c = &self.nodes[child];
            if !holds(c) {
                break;
            }
            let k = common_prefix_len(&c.label, rest);
            node = child;
            if k < c.label.len() {
                matched_chars += rest[..k].chars().count();
                break;
            }
            matched_chars += c.chars;
            rest = &rest[k..];
        }
        let tenants = if matched_chars == 0 {
            Vec::new()
        } else {
            self.nodes[node]
                .tenants
                .iter()
                .filter(|(t, _)| allowed.contains(t))
                .filter_map(|(t, _)| self.names.get(t).cloned())
                .collect()
        };
        PrefixMatch {
            matched_chars,
            total_chars,
            tenants,
        }
    }

    /// True when `node` holds `tenant` and none of its children do.
    fn is_leaf_for(&self, node: NodeId, tenant: TenantId) -> bool {
        let n = &self.nodes[node];
        n.has_tenant(tenant)
            && n.children
                .values()
                .all(|&c| !self.nodes[c].has_tenant(tenant))
    }

    /// Removes `tenant` from `node`; deletes the node when no tenant is left.
    /// Returns the parent when the node was not the root.
    fn drop_from_node(&mut self, node: NodeId, tenant: TenantId) -> Option<NodeId> {
        let n = &mut self.nodes[node];
        let before = n.tenants.len();
        n.tenants.retain(|(t, _)| *t != tenant);
        if n.tenants.len() < before {
            let chars = n.chars;
            if let Some(total) = self.tenant_chars.get_mut(&tenant) {
                *total = total.saturating_sub(chars);
            }
        }
        if node == self.root {
            return None;
        }
        let n = &self.nodes[node];
        let parent = n.parent;
        if n.tenants.is_empty() && n.children.is_empty() {
            if let Some(first) = n.label.chars().next() {
                self.nodes[parent].children.remove(&first);
            }
            self.nodes.remove(node);
        }
        Some(parent)
    }

    fn evict_tenant(&mut self, tenant: TenantId, max_chars: usize) -> usize {
        let start = self.tenant_chars.get(&tenant).copied().unwrap_or(0);
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .nodes
            .iter()
            .filter(|&(id, _)| id != self.root && self.is_leaf_for(id, tenant))
            .filter_map(|(id, n)| n.tenant_time(tenant).map(|time| Reverse((time, id))))
            .collect();
        while self.tenant_chars.get(&tenant).copied().unwrap_or(0) > max_chars {
            let Some(Reverse((_, node))) = heap.pop() else {
                break;
            };
            let Some(parent) = self.drop_from_node(node, tenant) else {
                continue;
            };
            if parent != self.root
                && self.is_leaf_for(parent, tenant)
                && let Some(time) = self.nodes[parent].tenant_time(tenant)
            {
                heap.push(Reverse((time, parent)));
            }
        }
        start.saturating_sub(self.tenant_chars.get(&tenant).copied().unwrap_or(0))
    }

    fn remove_tenant(&mut self, tenant: &str) {
        let Some(id) = self.ids.remove(tenant) else {
            return;
        };
        self.names.remove(&id);
        self.tenant_chars.remove(&id);
        let root = self.root;
        let mut empty = Vec::new();
        for (node_id, node) in self.nodes.iter_mut() {
            node.tenants.retain(|(t, _)| *t != id);
            if node_id != root && node.tenants.is_empty() {
                empty.push(node_id);
            }
        }
        // A node without tenants has only tenant-less descendants, so every empty node
        // goes; unlink it from a parent that stays.
        for &node_id in &empty {
            let (parent, first) = {
                let n = &self.nodes[node_id];
                (n.parent, n.label.chars().next())
            };
            let parent_stays = parent == root || !self.nodes[parent].tenants.is_empty();
            if parent_stays && let Some(first) = first {
                self.nodes[parent].children.remove(&first);
            }
        }
        for node_id in empty {
            self.nodes.remove(node_id);
        }
    }

    fn check_invariants(&self) -> Result<(), String> {
        let mut sums: HashMap<TenantId, usize> = HashMap::new();
        for (id, node) in self.nodes.iter() {
            for (t, _) in &node.tenants {
                *sums.entry(*t).or_insert(0) += node.chars;
                if !self.names.contains_key(t) {
                    return Err(format!("node {id} holds unknown tenant {t}"));
                }
            }
            if node.chars != node.label.chars().count() {
                return Err(format!("node {id} has a stale character count"));
            }
            if id != self.root {
                if node.label.is_empty() {
                    return Err(format!("node {id} has an empty label"));
                }
                if node.tenants.is_empty() {
                    return Err(format!("node {id} is held by no tenant"));
                }
                let parent = self
                    .nodes
                    .get(node.parent)
                    .ok_or_else(|| format!("node {id} has a dangling parent"))?;
                let first = node.label.chars().next();
                if first.and_then(|f| parent.children.get(&f)) != Some(&id) {
                    return Err(format!("node {id} is not linked from its parent"));
                }
                for (t, _) in &node.tenants {
                    if !parent.has_tenant(*t) {
                        return Err(format!("tenant {t} is on node {id} but not its parent"));
                    }
                }
            }
            for (first, &child) in &node.children {
                let c = self
                    .nodes
                    .get(child)
                    .ok_or_else(|| format!("node {id} links a missing child"))?;
                if c.parent != id || !c.label.starts_with(*first) {
                    return Err(format!("child {child} of node {id} is mislinked"));
                }
            }
        }
        for (t, &chars) in &self.tenant_chars {
            if sums.get(t).copied().unwrap_or(0) != chars {
                return Err(format!(
                    "tenant {t} counts {chars} characters but holds {}",
                    sums.get(t).copied().unwrap_or(0)
                ));
            }
        }
        Ok(())
    }
}
