//! Property tests: random request traffic against a pool and a tree, with the ownership and
//! tree invariants checked after every step.

use std::collections::HashMap;

use proptest::prelude::*;

use super::{KvPool, NodeId, RadixCache};

/// A running request as the scheduler holds it.
#[derive(Debug)]
struct Req {
    /// Tokens whose KV is computed.
    tokens: Vec<u32>,
    /// One slot per token; `slots[..cached]` belong to the tree, the rest to the request.
    slots: Vec<u32>,
    /// Locked node ending `tokens[..cached]`.
    node: NodeId,
    cached: usize,
}

#[derive(Debug, Clone)]
enum Op {
    /// A request arrives with this prompt and is prefilled.
    Arrive(Vec<u32>),
    /// A running request hands its computed tokens to the tree (`cache_unfinished_request`).
    Checkpoint(usize),
    /// A running request decodes these tokens.
    Decode(usize, Vec<u32>),
    /// A running request finishes (`cache_finished_request`).
    Finish(usize),
    /// A lookup without lock (splits edges, refreshes access times).
    Match(Vec<u32>),
    /// Look up a previously inserted key and compare with what was inserted.
    MatchHistory(usize),
    Evict(usize),
    Reset,
}

fn tokens(max_len: usize) -> impl Strategy<Value = Vec<u32>> {
    // A 3-token alphabet so prompts share prefixes often.
    prop::collection::vec(0u32..3, 1..max_len)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => tokens(10).prop_map(Op::Arrive),
        2 => any::<usize>().prop_map(Op::Checkpoint),
        3 => (any::<usize>(), tokens(4)).prop_map(|(i, t)| Op::Decode(i, t)),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => tokens(10).prop_map(Op::Match),
        1 => any::<usize>().prop_map(Op::MatchHistory),
        1 => (0usize..16).prop_map(Op::Evict),
        1 => Just(Op::Reset),
    ]
}

struct Sim {
    pool: KvPool,
    cache: RadixCache,
    reqs: Vec<Req>,
    /// Slot the tree was given for each token prefix, recorded when the tree took it.
    model: HashMap<Vec<u32>, u32>,
    history: Vec<Vec<u32>>,
}

impl Sim {
    fn new(capacity: usize, disabled: bool) -> Self {
        Self {
            pool: KvPool::new(capacity),
            cache: RadixCache::new(disabled),
            reqs: Vec::new(),
            model: HashMap::new(),
            history: Vec::new(),
        }
    }

    /// Evict if the pool lacks `n` free slots, then allocate (or not).
    fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        let available = self.pool.available();
        if available < n {
            let freed = self.cache.evict(n - available, &mut self.pool);
            assert_eq!(
                self.pool.available(),
                available + freed,
                "evict frees to the pool"
            );
        }
        self.pool.alloc(n)
    }

    /// The tree takes `tokens[already_cached..]` with the request's slots.
    fn record_insert(&mut self, tokens: &[u32], slots: &[u32], already_cached: usize) {
        if self.cache.is_disabled() {
            return;
        }
        for i in already_cached..tokens.len() {
            self.model.insert(tokens[..=i].to_vec(), slots[i]);
        }
        self.history.push(tokens.to_vec());
        if self.history.len() > 24 {
            self.history.remove(0);
        }
    }

    fn check_against_model(&self, key: &[u32], slots: &[u32]) {
        for (i, slot) in slots.iter().enumerate() {
            assert_eq!(
                self.model.get(&key[..=i]),
                Some(slot),
                "slot of prefix {:?}",
                &key[..=i]
            );
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Arrive(prompt) => {
                let m = self.cache.match_prefix(&prompt);
                self.check_against_model(&prompt, &m.slots);
                self.cache.inc_lock_ref(m.last_node);
                let Some(new) = self.alloc(prompt.len() - m.slots.len()) else {
                    self.cache.dec_lock_ref(m.last_node);
                    return;
                };
                let cached = m.slots.len();
                let slots = [m.slots, new].concat();
                self.reqs.push(Req {
                    tokens: prompt,
                    slots,
                    node: m.last_node,
                    cached,
                });
            }
            Op::Checkpoint(i) if !self.reqs.is_empty() => {
                let i = i % self.reqs.len();
                let r = &self.reqs[i];
                let already = self.cache.peek_prefix_len(&r.tokens);
                let (tokens, slots) = (r.tokens.clone(), r.slots.clone());
                let res = self
                    .cache
                    .cache_unfinished_request(&tokens, &slots, r.node, &mut self.pool)
                    .expect("consistent request");
                self.record_insert(&tokens, &slots, already);
                let r = &mut self.reqs[i];
                if self.cache.is_disabled() {
                    assert_eq!(res.slots, r.slots);
                } else {
                    assert_eq!(res.slots[already..], r.slots[already..]);
                    r.cached = r.tokens.len();
                }
                r.slots = res.slots;
                r.node = res.last_node;
            }
            Op::Decode(i, new_tokens) if !self.reqs.is_empty() => {
                let i = i % self.reqs.len();
                if let Some(new) = self.alloc(new_tokens.len()) {
                    self.reqs[i].tokens.extend(new_tokens);
                    self.reqs[i].slots.extend(new);
                }
            }
            Op::Finish(i) if !self.reqs.is_empty() => {
                let r = self.reqs.swap_remove(i % self.reqs.len());
                let already = self.cache.peek_prefix_len(&r.tokens);
                let got = self
                    .cache
                    .cache_finished_request(&r.tokens, &r.slots, r.node, &mut self.pool)
                    .expect("consistent request");
                if !self.cache.is_disabled() {
                    assert_eq!(got, already);
                }
                self.record_insert(&r.tokens, &r.slots, already);
            }
            Op::Match(key) => {
                let m = self.cache.match_prefix(&key);
                self.check_against_model(&key, &m.slots);
            }
            Op::MatchHistory(i) if !self.history.is_empty() => {
                let key = self.history[i % self.history.len()].clone();
                let m = self.cache.match_prefix(&key);
                assert_eq!(m.slots.len(), self.cache.peek_prefix_len(&key));
                self.check_against_model(&key, &m.slots);
            }
            Op::Evict(n) => {
                let before = self.pool.available();
                let evictable = self.cache.evictable_size();
                let freed = self.cache.evict(n, &mut self.pool);
                assert_eq!(self.pool.available(), before + freed);
                assert!(freed >= n.min(evictable) && freed <= evictable);
            }
            Op::Reset => {
                let locked = self.cache.protected_size() > 0;
                let tree = self.cache.total_size();
                let before = self.pool.available();
                let res = self.cache.reset(&mut self.pool);
                assert_eq!(res.is_err(), locked);
                if !locked {
                    assert_eq!(self.pool.available(), before + tree);
                    assert_eq!(self.cache.total_size(), 0);
                }
            }
            _ => {}
        }
    }

    fn check(&self) {
        self.cache.check_invariants().expect("tree invariants");
        let c = &self.cache;
        assert_eq!(c.evictable_size() + c.protected_size(), c.total_size());

        // Every slot is in exactly one place: free list, tree, or a request's own part.
        let mut owners = vec![0u32; self.pool.capacity()];
        for s in 0..self.pool.capacity() as u32 {
            owners[s as usize] += u32::from(self.pool.is_free(s));
        }
        for s in c.all_slots() {
            owners[s as usize] += 1;
        }
        for r in &self.reqs {
            assert_eq!(r.tokens.len(), r.slots.len());
            for &s in &r.slots[r.cached..] {
                owners[s as usize] += 1;
            }
            // Locked prefixes survive everything, with the same slots.
            assert!(c.contains(r.node), "locked node evicted");
            assert_eq!(c.node_slots(r.node).expect("live"), r.slots[..r.cached]);
            assert_eq!(c.node_prefix_len(r.node), Ok(r.cached));
            assert!(c.peek_prefix_len(&r.tokens) >= r.cached);
        }
        if let Some(s) = owners.iter().position(|&n| n != 1) {
            panic!("slot {s} has {} owners", owners[s]);
        }
        assert_eq!(
            self.pool.used(),
            c.total_size()
                + self
                    .reqs
                    .iter()
                    .map(|r| r.slots.len() - r.cached)
                    .sum::<usize>()
        );
    }

    fn drain(&mut self) {
        while let Some(r) = self.reqs.pop() {
            self.cache
                .cache_finished_request(&r.tokens, &r.slots, r.node, &mut self.pool)
                .expect("consistent request");
        }
        assert_eq!(self.cache.protected_size(), 0);
        let total = self.cache.total_size();
        assert_eq!(self.cache.evict(usize::MAX, &mut self.pool), total);
        assert_eq!(self.cache.total_size(), 0);
        assert_eq!(self.cache.node_count(), 1);
        assert_eq!(self.pool.available(), self.pool.capacity());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_traffic_keeps_slots_and_tree_consistent(
        capacity in 4usize..48,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut sim = Sim::new(capacity, false);
        for op in ops {
            sim.step(op);
            sim.check();
        }
        sim.drain();
        sim.check();
    }

    #[test]
    fn disabled_cache_returns_every_slot(
        capacity in 4usize..32,
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut sim = Sim::new(capacity, true);
        for op in ops {
            sim.step(op);
            sim.check();
            prop_assert_eq!(sim.cache.total_size(), 0);
        }
        sim.drain();
    }
}
