//! Cache-aware routing: send a request where its prefix is most likely cached, unless that
//! would overload a worker.
//!
//! Each engine keeps a radix cache of the prompts it has served (RadixAttention), so a
//! request is cheapest on the worker that last saw the longest prefix of it. The router
//! cannot see those caches; it keeps one approximate radix tree over request text
//! ([`PrefixTree`], characters rather than tokens) in which every node remembers which
//! workers have seen it and when.
//!
//! For each request, with `load` = requests in flight per available worker:
//!
//! 1. Load check. The load is *imbalanced* when both
//!    `max_load - min_load > balance_abs_threshold` and
//!    `max_load > min_load * balance_rel_threshold`.
//!    Then the request goes to the least loaded worker, whatever the cache says; its text is
//!    still inserted under that worker, which will now hold it in its cache.
//! 2. Otherwise, match the text against the tree, restricted to available workers:
//!    `match_rate = matched_chars / total_chars`.
//!    - `match_rate > cache_threshold` (a *hit*): route to the least loaded of the workers
//!      that hold the deepest matched node.
//!    - else (a *miss*): route to the least loaded worker; ties go to the worker holding the
//!      fewest characters in the tree, so new prefix groups spread over idle workers.
//! 3. Insert the text under the chosen worker, refreshing its timestamps along the path.
//!
//! Parameters (SGLang's router flags and defaults):
//! - `cache_threshold` (0.5): minimum match rate for a cache hit.
//! - `balance_abs_threshold` (32) and `balance_rel_threshold` (1.0001): both must be
//!   exceeded for the load to count as imbalanced.
//! - `max_tree_size` (2^24): characters each worker may keep in the tree; every
//!   `eviction_interval_secs` (60) the tree evicts each worker's least recently used leaves
//!   down to this size (see [`PrefixTree::evict`]).
//!
//! A worker that is removed or declared dead has all its entries dropped from the tree, so
//! requests stop matching it at once. Requests without text (model listings, health) are
//! sent to the least loaded worker and not recorded.

use std::sync::Arc;

use super::{CacheOutcome, Decision, LoadBalancingPolicy};
use crate::tree::{InsertReceipt, PrefixTree};
use crate::worker::Worker;

/// Settings of the cache-aware policy (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareConfig {
    pub cache_threshold: f64,
    pub balance_abs_threshold: usize,
    pub balance_rel_threshold: f64,
    pub max_tree_size: usize,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            cache_threshold: 0.5,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.0001,
            max_tree_size: 1 << 24,
        }
    }
}

pub struct CacheAwarePolicy {
    config: CacheAwareConfig,
    tree: PrefixTree,
}

impl CacheAwarePolicy {
    pub fn new(config: CacheAwareConfig) -> Self {
        Self {
            config,
            tree: PrefixTree::new(),
        }
    }

    fn is_imbalanced(&self, min_load: usize, max_load: usize) -> bool {
        max_load - min_load > self.config.balance_abs_threshold
            && max_load as f64 > min_load as f64 * self.config.balance_rel_threshold
    }

    /// Index of the least loaded worker among `indices`; ties go to the smallest tree share.
    fn least_loaded(
        &self,
        workers: &[Arc<Worker>],
        indices: impl Iterator<Item = usize>,
    ) -> Option<usize> {
        indices.min_by_key(|&i| (workers[i].load(), self.tree.tenant_chars(workers[i].url())))
    }
}

impl LoadBalancingPolicy for CacheAwarePolicy {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn select(&self, workers: &[Arc<Worker>], text: Option<&str>) -> Option<Decision> {
        if workers.is_empty() {
            return None;
        }
        let loads: Vec<usize> = workers.iter().map(|w| w.load()).collect();
        let min_load = loads.iter().copied().min().unwrap_or(0);
        let max_load = loads.iter().copied().max().unwrap_or(0);
        let text = text.filter(|t| !t.is_empty());

        let Some(text) = text else {
            let index = self.least_loaded(workers, 0..workers.len())?;
            return Some(Decision::plain(index));
        };

        let (index, outcome) = if self.is_imbalanced(min_load, max_load) {
            let index = self.least_loaded(workers, 0..workers.len())?;
            (index, CacheOutcome::Imbalanced)
        } else {
            let urls: Vec<&str> = workers.iter().map(|w| w.url()).collect();
            let matched = self.tree.match_prefix(text, &urls);
            let holders =
                || (0..workers.len()).filter(|&i| matched.tenants.iter().any(|t| **t == *urls[i]));
            if matched.rate() > self.config.cache_threshold
                && let Some(index) = self.least_loaded(workers, holders())
            {
                (index, CacheOutcome::Hit)
            } else {
                let index = self.least_loaded(workers, 0..workers.len())?;
                (index, CacheOutcome::Miss)
            }
        };
        let recorded = self.tree.insert(text, workers[index].url());
        Some(Decision {
            index,
            cache: Some(outcome),
            recorded: Some(recorded),
        })
    }

    fn on_worker_removed(&self, url: &str) {
        self.tree.remove_tenant(url);
    }

    fn on_refused(&self, text: &str, url: &str, recorded: InsertReceipt) {
        self.tree.forget(text, url, recorded);
    }

    fn maintain(&self) {
        let evicted = self.tree.evict(self.config.max_tree_size);
        if evicted > 0 {
            tracing::debug!(
                evicted,
                nodes = self.tree.node_count(),
                "evicted prefix tree entries"
            );
        }
    }

    fn tree(&self) -> Option<&PrefixTree> {
        Some(&self.tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{busy, workers};

    fn policy(abs: usize, rel: f64) -> CacheAwarePolicy {
        CacheAwarePolicy::new(CacheAwareConfig {
            cache_threshold: 0.5,
            balance_abs_threshold: abs,
            balance_rel_threshold: rel,
            max_tree_size: 1 << 20,
        })
    }

    fn prompt(group: usize, i: usize) -> String {
        format!("System: you are assistant number {group}, answer briefly and well. User: q{i}")
    }

    #[test]
    fn each_prefix_group_sticks_to_one_worker_and_groups_spread() {
        let p = policy(32, 1.0001);
        let ws = workers(3);
        let mut owner = vec![None; 3];
        for round in 0..5 {
            for (g, slot) in owner.iter_mut().enumerate() {
                let d = p.select(&ws, Some(&prompt(g, round))).unwrap();
                let expected = if round == 0 {
                    CacheOutcome::Miss
                } else {
                    CacheOutcome::Hit
                };
                assert_eq!(d.cache, Some(expected), "group {g} round {round}");
                match slot {
                    None => *slot = Some(d.index),
                    Some(o) => assert_eq!(*o, d.index, "group {g} moved"),
                }
            }
        }
        let mut owners: Vec<usize> = owner.into_iter().flatten().collect();
        owners.sort();
        assert_eq!(owners, [0, 1, 2], "three groups on three idle workers");
    }

    #[test]
    fn a_short_match_is_a_miss_that_goes_to_the_least_loaded() {
        let p = policy(32, 1.0001);
        let ws = workers(2);
        let d = p.select(&ws, Some("abcdefghij")).unwrap();
        assert_eq!(d.index, 0);
        let _g = busy(&ws[0], 1);
        // Shares 3 of 10 characters with worker 0's entry: below the 0.5 threshold.
        let d = p.select(&ws, Some("abcXXXXXXX")).unwrap();
        assert_eq!((d.index, d.cache), (1, Some(CacheOutcome::Miss)));
        // Shares 6 of 10: a hit on worker 0 despite its load (not imbalanced).
        let d = p.select(&ws, Some("abcdefYYYY")).unwrap();
        assert_eq!((d.index, d.cache), (0, Some(CacheOutcome::Hit)));
    }

    #[test]
    fn imbalance_overrides_the_cache_but_still_records_the_text() {
        let p = policy(2, 1.5);
        let ws = workers(2);
        let text = "a long shared prompt that worker zero has already seen";
        assert_eq!(p.select(&ws, Some(text)).unwrap().index, 0);
        let g = busy(&ws[0], 3); // 3 - 0 > 2 and 3 > 0 * 1.5
        let d = p.select(&ws, Some(text)).unwrap();
        assert_eq!((d.index, d.cache), (1, Some(CacheOutcome::Imbalanced)));
        drop(g);
        // Balanced again: both hold the text, the tie goes to the least loaded.
        let _g = busy(&ws[1], 1);
        let d = p.select(&ws, Some(text)).unwrap();
        assert_eq!((d.index, d.cache), (0, Some(CacheOutcome::Hit)));
        let m = p.tree.match_prefix(text, &["http://w1"]);
        assert_eq!(
            m.matched_chars,
            text.chars().count(),
            "worker 1 recorded it"
        );
    }

    #[test]
    fn load_within_thresholds_is_not_imbalanced() {
        let p = policy(2, 1.5);
        let ws = workers(2);
        let text = "prompt held by worker zero";
        p.select(&ws, Some(text));
        // Difference 2 is not above the absolute threshold of 2.
        let _g = busy(&ws[0], 2);
        let d = p.select(&ws, Some(text)).unwrap();
        assert_eq!((d.index, d.cache), (0, Some(CacheOutcome::Hit)));
    }

    #[test]
    fn removed_worker_no_longer_matches() {
        let p = policy(32, 1.0001);
        let ws = workers(2);
        let text = "remember me on worker zero please";
        assert_eq!(p.select(&ws, Some(text)).unwrap().index, 0);
        p.on_worker_removed("http://w0");
        assert_eq!(p.tree.tenant_chars("http://w0"), 0);
        let d = p.select(&ws[1..], Some(text)).unwrap();
        assert_eq!(d.cache, Some(CacheOutcome::Miss));
    }

    #[test]
    fn only_available_workers_are_matched() {
        let p = policy(32, 1.0001);
        let ws = workers(2);
        let text = "a prompt that went to worker zero first";
        assert_eq!(p.select(&ws, Some(text)).unwrap().index, 0);
        // Worker 0 is not among the candidates (unhealthy or open breaker).
        let d = p.select(&ws[1..], Some(text)).unwrap();
        assert_eq!((d.index, d.cache), (0, Some(CacheOutcome::Miss)));
    }

    #[test]
    fn requests_without_text_go_to_the_least_loaded_and_leave_no_trace() {
        let p = policy(32, 1.0001);
        let ws = workers(3);
        let _g0 = busy(&ws[0], 2);
        let _g2 = busy(&ws[2], 1);
        assert_eq!(p.select(&ws, None), Some(Decision::plain(1)));
        assert_eq!(p.select(&ws, Some("")), Some(Decision::plain(1)));
        assert_eq!(p.tree.node_count(), 1);
    }

    #[test]
    fn maintain_evicts_past_max_tree_size() {
        let p = CacheAwarePolicy::new(CacheAwareConfig {
            max_tree_size: 100,
            ..CacheAwareConfig::default()
        });
        let ws = workers(1);
        for i in 0..50 {
            p.select(&ws, Some(&format!("{i:04} is a distinct prompt")));
        }
        assert!(p.tree.tenant_chars("http://w0") > 100);
        p.maintain();
        assert!(p.tree.tenant_chars("http://w0") <= 100);
        p.tree.check_invariants().unwrap();
    }
}
