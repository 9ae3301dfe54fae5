//! Unit tests of the radix cache, driven the way the scheduler drives it.

use super::{CacheError, KvPool, RadixCache};

/// Allocate slots for `tokens` and insert them, freeing the duplicates. Returns the slots
/// allocated (only those past the already-cached prefix stay in the tree).
fn put(cache: &mut RadixCache, pool: &mut KvPool, tokens: &[u32]) -> Vec<u32> {
    let slots = pool.alloc(tokens.len()).expect("pool has room");
    let cached = cache.insert(tokens, &slots);
    pool.free(&slots[..cached]).expect("duplicates are ours");
    slots
}

fn check(cache: &RadixCache) {
    cache.check_invariants().expect("tree invariants hold");
}

#[test]
fn exact_match_returns_inserted_slots() {
    let mut pool = KvPool::new(16);
    let mut cache = RadixCache::new(false);
    let slots = put(&mut cache, &mut pool, &[1, 2, 3]);
    let m = cache.match_prefix(&[1, 2, 3]);
    assert_eq!(m.slots, slots);
    assert_eq!(cache.node_prefix_len(m.last_node), Ok(3));
    // A longer key matches the cached part only.
    let m = cache.match_prefix(&[1, 2, 3, 4, 5]);
    assert_eq!(m.slots, slots);
    assert!(cache.match_prefix(&[9]).slots.is_empty());
    assert_eq!(cache.match_prefix(&[]).last_node, cache.root());
    assert_eq!(cache.total_size(), 3);
    check(&cache);
}

#[test]
fn match_ending_mid_edge_splits_the_node() {
    let mut pool = KvPool::new(16);
    let mut cache = RadixCache::new(false);
    let slots = put(&mut cache, &mut pool, &[1, 2, 3, 4]);
    assert_eq!(cache.node_count(), 2);
    assert_eq!(cache.peek_prefix_len(&[1, 2, 9]), 2);
    assert_eq!(cache.node_count(), 2, "peek does not split");
    let m = cache.match_prefix(&[1, 2, 9]);
    assert_eq!(m.slots, slots[..2]);
    assert_eq!(cache.node_count(), 3);
    assert_eq!(cache.node_prefix_len(m.last_node), Ok(2));
    assert_eq!(cache.node_slots(m.last_node), Ok(slots[..2].to_vec()));
    // The full key still matches across the split.
    assert_eq!(cache.match_prefix(&[1, 2, 3, 4]).slots, slots);
    assert_eq!(cache.total_size(), 4);
    check(&cache);
}

#[test]
fn insert_returns_already_cached_prefix_len() {
    let mut pool = KvPool::new(32);
    let mut cache = RadixCache::new(false);
    let a = pool.alloc(4).expect("room");
    assert_eq!(cache.insert(&[1, 2, 3, 4], &a), 0);
    let b = pool.alloc(5).expect("room");
    assert_eq!(cache.insert(&[1, 2, 3, 7, 8], &b), 3, "diverges mid-edge");
    pool.free(&b[..3]).expect("duplicates");
    let c = pool.alloc(2).expect("room");
    assert_eq!(
        cache.insert(&[1, 2], &c),
        2,
        "strict prefix of a cached key"
    );
    pool.free(&c).expect("duplicates");
    let d = pool.alloc(4).expect("room");
    assert_eq!(cache.insert(&[1, 2, 3, 4], &d), 4);
    pool.free(&d).expect("duplicates");
    assert_eq!(cache.total_size(), 6);
    assert_eq!(pool.used(), 6);
    assert_eq!(
        cache.match_prefix(&[1, 2, 3, 7, 8]).slots,
        [&a[..3], &b[3..]].concat()
    );
    check(&cache);
}

#[test]
fn lock_protects_node_and_ancestors() {
    let mut pool = KvPool::new(32);
    let mut cache = RadixCache::new(false);
    put(&mut cache, &mut pool, &[1, 2, 3]);
    put(&mut cache, &mut pool, &[1, 2, 3, 4, 5]);
    put(&mut cache, &mut pool, &[7, 8]);
    let m = cache.match_prefix(&[1, 2, 3, 4, 5]);
    let deep = m.slots.clone();
    assert_eq!(cache.inc_lock_ref(m.last_node), 5);
    assert_eq!(cache.protected_size(), 5);
    assert_eq!(cache.evictable_size(), 2);
    check(&cache);

    assert_eq!(cache.evict(100, &mut pool), 2, "only [7, 8] is evictable");
    assert_eq!(cache.match_prefix(&[1, 2, 3, 4, 5]).slots, deep);
    assert!(cache.match_prefix(&[7, 8]).slots.is_empty());

    // A second lock on an ancestor protects nothing new; unlocking the first leaves it held.
    let anc = cache.match_prefix(&[1, 2]).last_node;
    assert_eq!(cache.inc_lock_ref(anc), 0);
    assert_eq!(cache.dec_lock_ref(m.last_node), 3);
    assert_eq!(cache.evict(100, &mut pool), 3);
    assert_eq!(cache.match_prefix(&[1, 2, 3]).slots, deep[..2]);
    assert_eq!(cache.dec_lock_ref(anc), 2);
    assert_eq!(cache.evict(100, &mut pool), 2);
    assert_eq!(cache.total_size(), 0);
    assert_eq!(pool.available(), 32);
    check(&cache);
}

#[test]
fn eviction_follows_lru_order() {
    let mut pool = KvPool::new(32);
    let mut cache = RadixCache::new(false);
    put(&mut cache, &mut pool, &[1, 1]);
    put(&mut cache, &mut pool, &[2, 2]);
    put(&mut cache, &mut pool, &[3, 3]);
    cache.match_prefix(&[1, 1]); // [2, 2] is now the oldest
    assert_eq!(cache.evict(1, &mut pool), 2);
    assert_eq!(cache.peek_prefix_len(&[2, 2]), 0);
    assert_eq!(cache.peek_prefix_len(&[1, 1]), 2);
    assert_eq!(cache.evict(1, &mut pool), 2);
    assert_eq!(cache.peek_prefix_len(&[3, 3]), 0);
    assert_eq!(cache.peek_prefix_len(&[1, 1]), 2);
    check(&cache);
}

#[test]
fn leaves_go_before_their_parents() {
    let mut pool = KvPool::new(32);
    let mut cache = RadixCache::new(false);
    put(&mut cache, &mut pool, &[1, 2, 3]);
    put(&mut cache, &mut pool, &[1, 2, 4]);
    put(&mut cache, &mut pool, &[5]);
    cache.match_prefix(&[1, 2, 3]);
    // Oldest first: leaf [4], then [5], then leaf [3], then the shared [1, 2].
    assert_eq!(cache.evict(1, &mut pool), 1);
    assert_eq!(cache.peek_prefix_len(&[1, 2, 4]), 2);
    assert_eq!(cache.peek_prefix_len(&[5]), 1);
    assert_eq!(cache.evict(1, &mut pool), 1);
    assert_eq!(cache.peek_prefix_len(&[5]), 0);
    assert_eq!(cache.peek_prefix_len(&[1, 2, 3]), 3);
    assert_eq!(cache.evict(2, &mut pool), 3);
    assert_eq!(cache.total_size(), 0);
    check(&cache);
}

#[test]
fn evict_frees_exactly_the_tree_slots_to_the_pool() {
    let mut pool = KvPool::new(10);
    let mut cache = RadixCache::new(false);
    let a = put(&mut cache, &mut pool, &[1, 2, 3, 4]);
    let b = put(&mut cache, &mut pool, &[5, 6, 7]);
    assert_eq!(pool.available(), 3);
    assert_eq!(cache.evict(3, &mut pool), 4, "whole leaves are evicted");
    assert_eq!(pool.available(), 7);
    assert!(a.iter().all(|&s| pool.is_free(s)));
    assert!(b.iter().all(|&s| !pool.is_free(s)));
    assert_eq!(cache.evict(0, &mut pool), 0);
    assert_eq!(cache.evict(100, &mut pool), 3);
    assert_eq!(pool.available(), 10);
    assert_eq!(cache.evict(1, &mut pool), 0, "nothing left");
    check(&cache);
}

#[test]
fn reset_frees_everything_but_refuses_while_locked() {
    let mut pool = KvPool::new(16);
    let mut cache = RadixCache::new(false);
    put(&mut cache, &mut pool, &[1, 2, 3]);
    put(&mut cache, &mut pool, &[1, 4]);
    let m = cache.match_prefix(&[1, 4]);
    cache.inc_lock_ref(m.last_node);
    assert_eq!(
        cache.reset(&mut pool),
        Err(CacheError::Locked { protected: 2 })
    );
    assert_eq!(cache.total_size(), 4);
    cache.dec_lock_ref(m.last_node);
    cache.reset(&mut pool).expect("nothing locked");
    assert_eq!(cache.total_size(), 0);
    assert_eq!(cache.node_count(), 1);
    assert_eq!(pool.available(), 16);
    assert!(!cache.contains(m.last_node), "old handles are stale");
    assert_eq!(cache.inc_lock_ref(m.last_node), 0);
    check(&cache);
    put(&mut cache, &mut pool, &[1, 2]);
    assert_eq!(cache.peek_prefix_len(&[1, 2]), 2);
    check(&cache);
}

#[test]
fn stale_and_unlocked_handles_are_rejected() {
    let mut pool = KvPool::new(16);
    let mut cache = RadixCache::new(false);
    put(&mut cache, &mut pool, &[1, 2]);
    let m = cache.match_prefix(&[1, 2]);
    assert_eq!(
        cache.try_dec_lock_ref(m.last_node),
        Err(CacheError::NotLocked(m.last_node))
    );
    cache.evict(2, &mut pool);
    put(&mut cache, &mut pool, &[3, 4]); // reuses the arena entry
    assert_eq!(
        cache.try_inc_lock_ref(m.last_node),
        Err(CacheError::InvalidNode(m.last_node))
    );
    assert_eq!(cache.protected_size(), 0);
    check(&cache);
}

#[test]
fn request_flow_shares_prefixes_and_frees_duplicates() {
    let mut pool = KvPool::new(64);
    let mut cache = RadixCache::new(false);
    let prompt = [1, 2, 3, 4];

    // Request A: nothing cached, prefill the whole prompt.
    let ma = cache.match_prefix(&prompt);
    cache.inc_lock_ref(ma.last_node);
    let mut a_slots = pool.alloc(prompt.len()).expect("room");
    let a = cache
        .cache_unfinished_request(&prompt, &a_slots, ma.last_node, &mut pool)
        .expect("valid");
    assert_eq!(a.slots, a_slots);
    assert_eq!(cache.protected_size(), 4);

    // Request B: same prompt arrives before A is cached as finished.
    let mb = cache.match_prefix(&[1, 2, 3, 4, 5, 6]);
    assert_eq!(mb.slots, a_slots);
    cache.inc_lock_ref(mb.last_node);
    let b_new = pool.alloc(2).expect("room");
    let b_tokens = [1, 2, 3, 4, 5, 6];
    let b_slots = [mb.slots.clone(), b_new.clone()].concat();

    // A decodes two tokens, then finishes (tokens without the last sampled one).
    a_slots.extend(pool.alloc(2).expect("room"));
    let a_tokens = [1, 2, 3, 4, 5, 6];
    let used_before = pool.used();
    let cached = cache
        .cache_finished_request(&a_tokens, &a_slots, a.last_node, &mut pool)
        .expect("valid");
    assert_eq!(cached, 4);
    assert_eq!(pool.used(), used_before);

    // B finishes with the same tokens: its two new slots are duplicates and are freed.
    let cached = cache
        .cache_finished_request(&b_tokens, &b_slots, mb.last_node, &mut pool)
        .expect("valid");
    assert_eq!(cached, 6);
    assert!(b_new.iter().all(|&s| pool.is_free(s)));
    assert_eq!(cache.protected_size(), 0);
    assert_eq!(cache.total_size(), 6);
    assert_eq!(pool.used(), 6);
    assert_eq!(cache.match_prefix(&a_tokens).slots, a_slots);
    check(&cache);
}

#[test]
fn unfinished_request_gets_the_tree_slots_for_duplicates() {
    let mut pool = KvPool::new(64);
    let mut cache = RadixCache::new(false);
    // Two requests with the same prompt prefill concurrently (neither matched anything).
    let root = cache.root();
    cache.inc_lock_ref(root);
    cache.inc_lock_ref(root);
    let s1 = pool.alloc(3).expect("room");
    let s2 = pool.alloc(3).expect("room");
    let r1 = cache
        .cache_unfinished_request(&[1, 2, 3], &s1, root, &mut pool)
        .expect("valid");
    let r2 = cache
        .cache_unfinished_request(&[1, 2, 3], &s2, root, &mut pool)
        .expect("valid");
    assert_eq!(
        r2.slots, s1,
        "the second request now reads the first one's KV"
    );
    assert_eq!(r1.last_node, r2.last_node);
    assert!(s2.iter().all(|&s| pool.is_free(s)));
    assert_eq!(cache.protected_size(), 3);
    cache
        .cache_finished_request(&[1, 2, 3], &r1.slots, r1.last_node, &mut pool)
        .expect("valid");
    assert_eq!(
        cache.protected_size(),
        3,
        "still locked by the second request"
    );
    cache
        .cache_finished_request(&[1, 2, 3], &r2.slots, r2.last_node, &mut pool)
        .expect("valid");
    assert_eq!(cache.protected_size(), 0);
    assert_eq!(pool.used(), 3);
    check(&cache);
}

#[test]
fn request_helpers_reject_inconsistent_calls() {
    let mut pool = KvPool::new(16);
    let mut cache = RadixCache::new(false);
    let slots = put(&mut cache, &mut pool, &[1, 2]);
    let m = cache.match_prefix(&[1, 2]);
    assert_eq!(
        cache.cache_finished_request(&[1, 2], &slots, m.last_node, &mut pool),
        Err(CacheError::NotLocked(m.last_node))
    );
    cache.inc_lock_ref(m.last_node);
    assert_eq!(
        cache.cache_finished_request(&[1, 3], &slots, m.last_node, &mut pool),
        Err(CacheError::PrefixMismatch)
    );
    assert_eq!(
        cache.cache_finished_request(&[1, 2, 3], &slots, m.last_node, &mut pool),
        Err(CacheError::LengthMismatch {
            tokens: 3,
            slots: 2
        })
    );
    assert_eq!(cache.protected_size(), 2, "failed calls change nothing");
    assert_eq!(pool.used(), 2);
    check(&cache);
}

#[test]
fn disabled_cache_keeps_nothing() {
    let mut pool = KvPool::new(16);
    let mut cache = RadixCache::new(true);
    let slots = pool.alloc(3).expect("room");
    assert_eq!(cache.insert(&[1, 2, 3], &slots), 0);
    let m = cache.match_prefix(&[1, 2, 3]);
    assert!(m.slots.is_empty());
    assert_eq!(m.last_node, cache.root());
    assert_eq!(cache.inc_lock_ref(m.last_node), 0);
    let r = cache
        .cache_unfinished_request(&[1, 2, 3], &slots, m.last_node, &mut pool)
        .expect("valid");
    assert_eq!(r.slots, slots);
    cache
        .cache_finished_request(&[1, 2, 3], &slots, r.last_node, &mut pool)
        .expect("valid");
    assert_eq!(pool.available(), 16);
    assert_eq!(cache.total_size(), 0);
    assert_eq!(cache.evict(10, &mut pool), 0);
    cache.reset(&mut pool).expect("nothing locked");
}
