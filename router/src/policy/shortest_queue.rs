//! Shortest queue: send to the worker with the fewest requests in flight; ties rotate.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Decision, LoadBalancingPolicy};
use crate::worker::Worker;

#[derive(Debug, Default)]
pub struct ShortestQueuePolicy {
    rotation: AtomicUsize,
}

impl LoadBalancingPolicy for ShortestQueuePolicy {
    fn name(&self) -> &'static str {
        "shortest_queue"
    }

    fn select(&self, workers: &[Arc<Worker>], _text: Option<&str>) -> Option<Decision> {
        let n = workers.len();
        if n == 0 {
            return None;
        }
        let start = self.rotation.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&i| workers[i].load())
            .map(Decision::plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{busy, workers};

    #[test]
    fn picks_the_least_loaded_and_rotates_ties() {
        let p = ShortestQueuePolicy::default();
        let ws = workers(3);
        let _a = busy(&ws[0], 2);
        let _b = busy(&ws[1], 1);
        let _c = busy(&ws[2], 3);
        for _ in 0..5 {
            assert_eq!(p.select(&ws, None).unwrap().index, 1);
        }
        drop(_a);
        drop(_c);
        // Now 0 and 2 are idle: both get picked over a few calls.
        let picks: std::collections::HashSet<usize> =
            (0..6).map(|_| p.select(&ws, None).unwrap().index).collect();
        assert_eq!(picks, [0, 2].into_iter().collect());
    }
}
