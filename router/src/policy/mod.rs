//! Load-balancing policies: each picks one worker among the available ones.

use std::sync::Arc;

use crate::config::PolicyKind;
use crate::tree::{InsertReceipt, PrefixTree};
use crate::worker::Worker;

mod cache_aware;
mod power_of_two;
mod random;
mod round_robin;
mod shortest_queue;

pub use cache_aware::{CacheAwareConfig, CacheAwarePolicy};
pub use power_of_two::PowerOfTwoPolicy;
pub use random::RandomPolicy;
pub use round_robin::RoundRobinPolicy;
pub use shortest_queue::ShortestQueuePolicy;

/// How the cache-aware policy reached its choice (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The prefix match rate was above the threshold: sent to the matching worker.
    Hit,
    /// Match too short: sent to the least loaded worker.
    Miss,
    /// Load was imbalanced: sent to the least loaded worker regardless of the cache.
    Imbalanced,
}

/// A policy's choice: an index into the candidate slice it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub index: usize,
    pub cache: Option<CacheOutcome>,
    /// The request's text was recorded in the prefix tree under the chosen worker; hand
    /// this back to [`LoadBalancingPolicy::on_refused`] if the worker refuses the request.
    pub recorded: Option<InsertReceipt>,
}

impl Decision {
    pub fn plain(index: usize) -> Self {
        Self {
            index,
            cache: None,
            recorded: None,
        }
    }
}

pub trait LoadBalancingPolicy: Send + Sync {
    fn name(&self) -> &'static str;

    /// Picks one of `workers` (never empty) for a request whose text is `text`.
    fn select(&self, workers: &[Arc<Worker>], text: Option<&str>) -> Option<Decision>;

    /// The worker was removed or found dead: forget what is known about it.
    fn on_worker_removed(&self, _url: &str) {}

    /// The worker chosen by a decision refused the request or failed it: take back what
    /// the decision recorded (a refused request must not stay in the prefix tree).
    fn on_refused(&self, _text: &str, _url: &str, _recorded: InsertReceipt) {}

    /// Periodic upkeep (the cache-aware policy evicts its tree here).
    fn maintain(&self) {}

    /// The prefix tree, for policies that keep one.
    fn tree(&self) -> Option<&PrefixTree> {
        None
    }
}

pub fn build(kind: PolicyKind, cache_aware: CacheAwareConfig) -> Arc<dyn LoadBalancingPolicy> {
    match kind {
        PolicyKind::CacheAware => Arc::new(CacheAwarePolicy::new(cache_aware)),
        PolicyKind::RoundRobin => Arc::new(RoundRobinPolicy::default()),
        PolicyKind::Random => Arc::new(RandomPolicy),
        PolicyKind::PowerOfTwo => Arc::new(PowerOfTwoPolicy),
        PolicyKind::ShortestQueue => Arc::new(ShortestQueuePolicy::default()),
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use std::sync::Arc;

    use crate::breaker::BreakerConfig;
    use crate::worker::{LoadGuard, Worker};

    /// `n` healthy workers named http://w0 .. http://w{n-1}.
    pub fn workers(n: usize) -> Vec<Arc<Worker>> {
        (0..n)
            .map(|i| {
                let w = Arc::new(Worker::new(
                    &format!("http://w{i}"),
                    BreakerConfig::default(),
                ));
                w.mark_healthy();
                w
            })
            .collect()
    }

    /// Puts `load` requests in flight on `w`; they end when the guards drop.
    pub fn busy(w: &Arc<Worker>, load: usize) -> Vec<LoadGuard> {
        (0..load).map(|_| w.start_request()).collect()
    }
}
