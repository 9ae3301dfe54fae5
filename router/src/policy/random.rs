//! Random: each request goes to a uniformly chosen worker.

use std::sync::Arc;

use rand::Rng;

use super::{Decision, LoadBalancingPolicy};
use crate::worker::Worker;

#[derive(Debug, Default)]
pub struct RandomPolicy;

impl LoadBalancingPolicy for RandomPolicy {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(&self, workers: &[Arc<Worker>], _text: Option<&str>) -> Option<Decision> {
        if workers.is_empty() {
            return None;
        }
        Some(Decision::plain(rand::rng().random_range(0..workers.len())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::workers;

    #[test]
    fn spreads_over_all_workers() {
        let p = RandomPolicy;
        let ws = workers(4);
        let mut counts = [0usize; 4];
        for _ in 0..4_000 {
            counts[p.select(&ws, None).unwrap().index] += 1;
        }
        // Each expects 1000; a 5-sigma band is about +-140.
        for c in counts {
            assert!((800..1_200).contains(&c), "{counts:?}");
        }
        assert_eq!(p.select(&[], None), None);
    }
}
