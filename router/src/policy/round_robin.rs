//! Round robin: each request goes to the next worker in turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Decision, LoadBalancingPolicy};
use crate::worker::Worker;

#[derive(Debug, Default)]
pub struct RoundRobinPolicy {
    next: AtomicUsize,
}

impl LoadBalancingPolicy for RoundRobinPolicy {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, workers: &[Arc<Worker>], _text: Option<&str>) -> Option<Decision> {
        if workers.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Some(Decision::plain(n % workers.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::workers;

    #[test]
    fn cycles_through_workers() {
        let p = RoundRobinPolicy::default();
        let ws = workers(3);
        let picks: Vec<usize> = (0..7).map(|_| p.select(&ws, None).unwrap().index).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(p.select(&[], None), None);
    }
}
