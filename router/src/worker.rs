//! Workers (engine replicas) and the registry that holds them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use parking_lot::{Mutex, RwLock};

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
    /// Generation requests the worker holds at most (running plus waiting, as its
    /// `/get_server_info` reports them); 0 while unknown, which bounds nothing.
    capacity: AtomicUsize,
    /// Its `/get_server_info` was read since it last became healthy.
    bounds_read: AtomicBool,
    /// The worker's last overload answer, while it holds.
    refusal: Mutex<Option<Refusal>>,
}

/// An overload answer of a worker (429, or 503 with `Retry-After`), remembered so that the
/// next requests are answered the same way by the router until the worker has room again.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    status: StatusCode,
    /// When the worker's advice (`Retry-After`) ends.
    until: Instant,
    /// Requests of this router the worker held besides the refused one: it has room again
    /// once fewer are in flight (one of them started or ended), or once `until` passes.
    others: usize,
}

/// Why a worker takes no generation request now: the answer the router gives in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    /// 429 (at its bound of requests) or the status of the worker's own refusal.
    pub status: StatusCode,
    /// Seconds for `Retry-After`.
    pub retry_after: u64,
    pub reason: String,
}

/// `Retry-After` of a router's own 429 for a worker at its bound, as the engine's for its
/// full waiting queue before it has measured a rate: one place frees soon.
pub const FULL_RETRY_AFTER_SECS: u64 = 1;

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
            capacity: AtomicUsize::new(0),
            bounds_read: AtomicBool::new(false),
            refusal: Mutex::new(None),
        }
    }

    /// The most generation requests the worker holds, when it said.
    pub fn capacity(&self) -> Option<usize> {
        match self.capacity.load(Ordering::Acquire) {
            0 => None,
            n => Some(n),
        }
    }

    /// Sets what [`Self::capacity`] reports (`None`: unbounded) and notes the bounds as read.
    pub fn set_capacity(&self, capacity: Option<usize>) {
        self.capacity
            .store(capacity.unwrap_or(0), Ordering::Release);
        self.bounds_read.store(true, Ordering::Release);
    }

    /// Whether the bounds were read since the worker last became healthy.
    pub fn bounds_read(&self) -> bool {
        self.bounds_read.load(Ordering::Acquire)
    }

    /// Remembers an overload answer (`status` with `Retry-After: retry_after`) given while
    /// `load` requests (the refused one among them) were in flight on the worker.
    pub fn note_refusal(&self, status: StatusCode, retry_after: u64, load: usize) {
        let retry_after = retry_after.max(1);
        *self.refusal.lock() = Some(Refusal {
            status,
            until: Instant::now() + Duration::from_secs(retry_after),
            others: load.saturating_sub(1),
        });
    }

    /// Why the worker has no room for a generation request now, if it has none: at its
    /// capacity, or it refused one and nothing has left it since (and its advice holds).
    pub fn full(&self) -> Option<Full> {
        let load = self.load();
        if let Some(cap) = self.capacity()
            && load >= cap
        {
            return Some(Full {
                status: StatusCode::TOO_MANY_REQUESTS,
                retry_after: FULL_RETRY_AFTER_SECS,
                reason: format!("{load} requests in flight, its bound"),
            });
        }
        let mut refusal = self.refusal.lock();
        let r = (*refusal)?;
        let now = Instant::now();
        if now >= r.until || load < r.others {
            *refusal = None;
            return None;
        }
        Some(Full {
            status: r.status,
            retry_after: r.until.saturating_duration_since(now).as_secs().max(1),
            reason: format!(
                "it answered {} with {} requests in flight and none has left since",
                r.status.as_u16(),
                r.others + 1
            ),
        })
    }

    /// Counts a generation request in flight if the worker has room for it (below its
    /// capacity, atomically, so that concurrent requests never pass the bound together).
    pub fn try_start_request(self: &Arc<Self>) -> Result<LoadGuard, Full> {
        if let Some(full) = self.full() {
            return Err(full);
        }
        if let Some(cap) = self.capacity() {
            let claimed = self
                .load
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < cap).then_some(n + 1)
                });
            if let Err(load) = claimed {
                return Err(Full {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    retry_after: FULL_RETRY_AFTER_SECS,
                    reason: format!("{load} requests in flight, its bound"),
                });
            }
            self.processed.fetch_add(1, Ordering::Relaxed);
            return Ok(LoadGuard {
                worker: self.clone(),
                outcome_recorded: false,
                fleet: None,
            });
        }
        Ok(self.start_request())
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn url_arc(&self) -> Arc<str> {
        self.url.clone()
    }

    pub fn load(&self) -> usize {
        self.load.load(Ordering::Acquire)
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
                // A restarted engine may have other limits: read them again.
                self.bounds_read.store(false, Ordering::Release);
                *self.refusal.lock() = None;
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
        self.load.fetch_add(1, Ordering::AcqRel);
        self.processed.fetch_add(1, Ordering::Relaxed);
        LoadGuard {
            worker: self.clone(),
            outcome_recorded: false,
            fleet: None,
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

/// A place among the router's requests in flight (`--max-concurrent-requests`), given back
/// when dropped.
#[derive(Debug)]
pub struct FleetSlot(Arc<AtomicUsize>);

impl FleetSlot {
    /// Takes a place when fewer than `max` are taken; returns the count otherwise.
    pub fn claim(counter: &Arc<AtomicUsize>, max: usize) -> std::result::Result<Self, usize> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| FleetSlot(counter.clone()))
    }
}

impl Drop for FleetSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One request in flight on a worker. Dropping it ends the request: the load goes down,
/// and a breaker probe that never got an outcome is handed back.
#[derive(Debug)]
pub struct LoadGuard {
    worker: Arc<Worker>,
    outcome_recorded: bool,
    /// The router-wide place the request holds, if it needs one.
    fleet: Option<FleetSlot>,
}

impl LoadGuard {
    /// Holds `slot` as long as the request.
    pub fn with_fleet_slot(mut self, slot: Option<FleetSlot>) -> Self {
        self.fleet = slot;
        self
    }

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
        self.worker.load.fetch_sub(1, Ordering::AcqRel);
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
    fn a_worker_takes_no_more_than_its_capacity() {
        let w = Arc::new(Worker::new("http://a:1", BreakerConfig::default()));
        let unbounded: Vec<_> = (0..5).map(|_| w.try_start_request().unwrap()).collect();
        drop(unbounded);
        w.set_capacity(Some(2));
        let g1 = w.try_start_request().unwrap();
        let _g2 = w.try_start_request().unwrap();
        let full = w.try_start_request().unwrap_err();
        assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.retry_after, FULL_RETRY_AFTER_SECS);
        assert_eq!(w.load(), 2);
        drop(g1);
        assert!(w.full().is_none());
        let _g3 = w.try_start_request().unwrap();
        assert_eq!(w.processed(), 8);
    }

    #[test]
    fn a_refusal_holds_until_a_request_leaves_or_its_advice_passes() {
        let w = Arc::new(Worker::new("http://a:1", BreakerConfig::default()));
        let g1 = w.try_start_request().unwrap();
        let g2 = w.try_start_request().unwrap();
        let refused = w.try_start_request().unwrap();
        w.note_refusal(StatusCode::SERVICE_UNAVAILABLE, 7, w.load());
        drop(refused);
        let full = w.try_start_request().unwrap_err();
        assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!((1..=7).contains(&full.retry_after), "{full:?}");
        drop(g1);
        assert!(w.full().is_none(), "one of the two it held left");
        drop(g2);

        // Refused with nothing else in flight: full until the advice passes.
        w.note_refusal(StatusCode::TOO_MANY_REQUESTS, 0, 1);
        assert_eq!(w.full().unwrap().status, StatusCode::TOO_MANY_REQUESTS);
        let r = w.refusal.lock().take().unwrap();
        *w.refusal.lock() = Some(Refusal {
            until: Instant::now(),
            ..r
        });
        assert!(w.full().is_none());
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
