//! Workers (engine replicas) and the registry that holds them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::breaker::{BreakerConfig, BreakerState, CircuitBreaker};
use crate::error::{Result, RouterError};

/// Canonical form of a worker URL: `http(s)://host[:port][/path]` without a trailing slash.
pub fn normalize_url(raw: &str) -> Result<String> {
    let invalid = |reason: &str| RouterError::InvalidWorkerUrl {
        url: raw.to_string(),
        reason: reason.to_string(),
    };
    let parsed = reqwest::Url::parse(raw.trim()).map_err(|e| invalid(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("a host is required"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("a query or fragment is not allowed"));
    }
    Ok(parsed.as_str().trim_end_matches('/').to_string())
}

/// One engine replica as the router sees it.
#[derive(Debug)]
pub struct Worker {
    url: Arc<str>,
    /// Requests in flight: from selection to the end of the response stream.
    load: AtomicUsize,
    /// Requests sent to this worker since it was added.
    processed: AtomicU64,
    healthy: AtomicBool,
    /// No health check has completed yet.
    pending: AtomicBool,
    health_failures: AtomicU32,
    health_successes: AtomicU32,
    /// A probe of a dead worker is in flight (at most one at a time).
    probing: AtomicBool,
    breaker: CircuitBreaker,
}

impl Worker {
    pub fn new(url: &str, breaker: BreakerConfig) -> Self {
        Self {
            url: url.into(),
            load: AtomicUsize::new(0),
            processed: AtomicU64::new(0),
            healthy: AtomicBool::new(false),
            pending: AtomicBool::new(true),
            health_failures: AtomicU32::new(0),
            health_successes: AtomicU32::new(0),
            probing: AtomicBool::new(false),
            breaker: CircuitBreaker::new(breaker),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn url_arc(&self) -> Arc<str> {
        self.url.clone()
    }

    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Healthy and its breaker would let a request through.
    pub fn is_available(&self) -> bool {
        self.is_healthy() && self.breaker.can_attempt()
    }

    /// Marks the worker healthy without a check (tests, benchmarks, trusted sources).
    pub fn mark_healthy(&self) {
        self.pending.store(false, Ordering::Release);
        self.healthy.store(true, Ordering::Release);
    }

    /// Marks the worker dead at once (its connection broke): it takes no request until a
    /// health check passes again. Returns whether it was healthy before.
    pub fn mark_down(&self) -> bool {
        self.health_successes.store(0, Ordering::Relaxed);
        self.pending.store(false, Ordering::Release);
        self.healthy.swap(false, Ordering::AcqRel)
    }

    /// Applies one health-check outcome; returns the change it caused, if any.
    pub fn record_health(
        &self,
        passed: bool,
        failure_threshold: u32,
        success_threshold: u32,
    ) -> Option<HealthChange> {
        let first = self.pending.swap(false, Ordering::AcqRel);
        if passed {
            self.health_failures.store(0, Ordering::Relaxed);
            let streak = self.health_successes.fetch_add(1, Ordering::Relaxed) + 1;
            if !self.is_healthy() && (first || streak >= success_threshold) {
                self.healthy.store(true, Ordering::Release);
                self.breaker.reset();
                return Some(HealthChange::BecameHealthy);
            }
        } else {
            self.health_successes.store(0, Ordering::Relaxed);
            let streak = self.health_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if self.is_healthy() && streak >= failure_threshold {
                self.healthy.store(false, Ordering::Release);
                return Some(HealthChange::BecameUnhealthy);
            }
        }
        None
    }

    /// Claims the right to probe this worker; `None` while another probe is in flight.
    pub fn begin_probe(self: &Arc<Self>) -> Option<ProbeGuard> {
        (!self.probing.swap(true, Ordering::AcqRel)).then(|| ProbeGuard(self.clone()))
    }

    /// Counts a request in flight until the returned guard is dropped.
    pub fn start_request(self: &Arc<Self>) -> LoadGuard {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.processed.fetch_add(1, Ordering::Relaxed);
        LoadGuard {
            worker: self.clone(),
            outcome_recorded: false,
        }
    }
}

/// A probe in flight; dropping it lets the next one start.
#[derive(Debug)]
pub struct ProbeGuard(Arc<Worker>);

impl ProbeGuard {
    pub fn worker(&self) -> &Arc<Worker> {
        &self.0
    }
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// A transition caused by health checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    BecameHealthy,
    BecameUnhealthy,
}

/// One request in flight on a worker. Dropping it ends the request: the load goes down,
/// and a breaker probe that never got an outcome is handed back.
#[derive(Debug)]
pub struct LoadGuard {
    worker: Arc<Worker>,
    outcome_recorded: bool,
}

impl LoadGuard {
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    pub fn succeeded(&mut self) {
        self.worker.breaker.record_success();
        self.outcome_recorded = true;
    }

    pub fn failed(&mut self) {
        self.worker.breaker.record_failure();
        self.outcome_recorded = true;
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.worker.load.fetch_sub(1, Ordering::Relaxed);
        if !self.outcome_recorded {
            self.worker.breaker.release();
        }
    }
}

/// The set of workers, in the order they were added.
#[derive(Debug)]
pub struct WorkerRegistry {
    workers: RwLock<Vec<Arc<Worker>>>,
    breaker: BreakerConfig,
}

impl WorkerRegistry {
    pub fn new(breaker: BreakerConfig) -> Self {
        Self {
            workers: RwLock::new(Vec::new()),
            breaker,
        }
    }

    /// Adds a worker (not healthy until its first check passes).
    pub fn add(&self, raw_url: &str) -> Result<Arc<Worker>> {
        let url = normalize_url(raw_url)?;
        let mut workers = self.workers.write();
        if workers.iter().any(|w| w.url() == url) {
            return Err(RouterError::WorkerExists(url));
        }
        let worker = Arc::new(Worker::new(&url, self.breaker.clone()));
        workers.push(worker.clone());
        Ok(worker)
    }

    pub fn remove(&self, raw_url: &str) -> Result<Arc<Worker>> {
        let url = normalize_url(raw_url)?;
        let mut workers = self.workers.write();
        let pos = workers
            .iter()
            .position(|w| w.url() == url)
            .ok_or_else(|| RouterError::WorkerNotFound(url.clone()))?;
        Ok(workers.remove(pos))
    }

    pub fn get(&self, url: &str) -> Option<Arc<Worker>> {
        self.workers.read().iter().find(|w| w.url() == url).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Worker>> {
        self.workers.read().clone()
    }

    pub fn len(&self) -> usize {
        self.workers.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Workers that could take a request now, leaving out `excluded` URLs unless that
    /// would leave none.
    pub fn available(&self, excluded: &[Arc<str>]) -> Vec<Arc<Worker>> {
        let all: Vec<Arc<Worker>> = self
            .workers
            .read()
            .iter()
            .filter(|w| w.is_available())
            .cloned()
            .collect();
        if excluded.is_empty() {
            return all;
        }
        let rest: Vec<Arc<Worker>> = all
            .iter()
            .filter(|w| !excluded.iter().any(|e| **e == *w.url()))
            .cloned()
            .collect();
        if rest.is_empty() { all } else { rest }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalized_and_validated() {
        assert_eq!(
            normalize_url("http://10.0.0.1:30000/").unwrap(),
            "http://10.0.0.1:30000"
        );
        assert_eq!(
            normalize_url(" https://engine.ns.svc ").unwrap(),
            "https://engine.ns.svc"
        );
        assert_eq!(
            normalize_url("http://h:1/prefix/").unwrap(),
            "http://h:1/prefix"
        );
        for bad in ["", "10.0.0.1:30000", "ftp://h", "http://", "http://h/?a=1"] {
            assert!(normalize_url(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn registry_rejects_duplicates_and_unknown_removals() {
        let reg = WorkerRegistry::new(BreakerConfig::default());
        reg.add("http://a:1").unwrap();
        assert!(matches!(
            reg.add("http://a:1/"),
            Err(RouterError::WorkerExists(_))
        ));
        assert!(matches!(
            reg.remove("http://b:1"),
            Err(RouterError::WorkerNotFound(_))
        ));
        assert_eq!(reg.remove("http://a:1").unwrap().url(), "http://a:1");
        assert!(reg.is_empty());
    }

    #[test]
    fn availability_needs_health_and_a_closed_breaker() {
        let reg = WorkerRegistry::new(BreakerConfig {
            failure_threshold: 1,
            ..BreakerConfig::default()
        });
        let a = reg.add("http://a:1").unwrap();
        let b = reg.add("http://b:1").unwrap();
        assert!(reg.available(&[]).is_empty(), "not checked yet");
        a.mark_healthy();
        b.mark_healthy();
        assert_eq!(reg.available(&[]).len(), 2);
        a.breaker().record_failure();
        let avail = reg.available(&[]);
        assert_eq!(avail.len(), 1);
        assert_eq!(avail[0].url(), "http://b:1");
        // Excluding the only available worker falls back to it.
        assert_eq!(reg.available(&[b.url_arc()]).len(), 1);
    }

    #[test]
    fn health_thresholds_gate_transitions() {
        let w = Worker::new("http://a:1", BreakerConfig::default());
        assert_eq!(
            w.record_health(true, 3, 2),
            Some(HealthChange::BecameHealthy),
            "first check"
        );
        assert_eq!(w.record_health(false, 3, 2), None);
        assert_eq!(w.record_health(false, 3, 2), None);
        assert_eq!(
            w.record_health(false, 3, 2),
            Some(HealthChange::BecameUnhealthy)
        );
        assert_eq!(w.record_health(true, 3, 2), None, "one success of two");
        assert_eq!(
            w.record_health(true, 3, 2),
            Some(HealthChange::BecameHealthy)
        );
        assert!(w.is_healthy());
        assert!(w.mark_down(), "was healthy");
        assert!(!w.mark_down(), "already down");
        assert!(!w.is_available());
        assert_eq!(w.record_health(true, 3, 2), None, "one success of two");
        assert_eq!(
            w.record_health(true, 3, 2),
            Some(HealthChange::BecameHealthy)
        );
    }

    #[test]
    fn one_probe_at_a_time() {
        let w = Arc::new(Worker::new("http://a:1", BreakerConfig::default()));
        let first = w.begin_probe().unwrap();
        assert!(w.begin_probe().is_none(), "a probe is in flight");
        drop(first);
        assert!(w.begin_probe().is_some(), "free again once it ends");
    }

    #[test]
    fn load_guard_counts_in_flight_requests() {
        let w = Arc::new(Worker::new("http://a:1", BreakerConfig::default()));
        let g1 = w.start_request();
        let g2 = w.start_request();
        assert_eq!(w.load(), 2);
        drop(g1);
        assert_eq!(w.load(), 1);
        drop(g2);
        assert_eq!((w.load(), w.processed()), (0, 2));
    }
}
