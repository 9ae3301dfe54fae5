//! Power of two choices: sample two distinct workers, send to the less loaded one.

use std::sync::Arc;

use rand::Rng;

use super::{Decision, LoadBalancingPolicy};
use crate::worker::Worker;

#[derive(Debug, Default)]
pub struct PowerOfTwoPolicy;

impl LoadBalancingPolicy for PowerOfTwoPolicy {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, workers: &[Arc<Worker>], _text: Option<&str>) -> Option<Decision> {
        let n = workers.len();
        if n <= 1 {
            return (n == 1).then(|| Decision::plain(0));
        }
        let mut rng = rand::rng();
        let a = rng.random_range(0..n);
        let b = (a + rng.random_range(1..n)) % n;
        let pick = if workers[b].load() < workers[a].load() {
            b
        } else {
            a
        };
        Some(Decision::plain(pick))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{busy, workers};

    #[test]
    fn never_picks_the_most_loaded_of_many() {
        let p = PowerOfTwoPolicy;
        let ws = workers(3);
        let _g = busy(&ws[1], 5);
        for _ in 0..500 {
            assert_ne!(p.select(&ws, None).unwrap().index, 1);
        }
    }

    #[test]
    fn with_two_workers_always_picks_the_idle_one() {
        let p = PowerOfTwoPolicy;
        let ws = workers(2);
        let _g = busy(&ws[0], 1);
        for _ in 0..100 {
            assert_eq!(p.select(&ws, None).unwrap().index, 1);
        }
        assert_eq!(p.select(&ws[..1], None).unwrap().index, 0);
        assert_eq!(p.select(&[], None), None);
    }
}
