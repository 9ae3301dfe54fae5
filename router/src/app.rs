//! The router's shared state: workers, policy, metrics and the HTTP client, with the
//! operations that keep them consistent (adding, removing and checking workers).

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::RouterConfig;
use crate::error::{Result, RouterError};
use crate::metrics::Metrics;
use crate::policy::{self, Decision, LoadBalancingPolicy};
use crate::queue::WaitQueue;
use crate::retry::RetryConfig;
use crate::worker::{HealthChange, Worker, WorkerRegistry};

/// Cheap to clone: every clone shares one state.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub config: RouterConfig,
    pub workers: WorkerRegistry,
    pub policy: Arc<dyn LoadBalancingPolicy>,
    pub metrics: Metrics,
    pub client: reqwest::Client,
    pub retry: RetryConfig,
    /// Requests waiting for a worker to become available.
    pub queue: WaitQueue,
}

impl Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// How often a worker that is not healthy is probed: a restarted engine should take
/// requests again within seconds, whatever `--health-check-interval-secs` is.
pub const DOWN_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Longest wait for a TCP connection to a worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl AppState {
    /// Validates `config` and registers its `--worker-urls` (unchecked: see `check_all`).
    pub fn new(config: RouterConfig) -> Result<Self> {
        config.validate()?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .connect_timeout(CONNECT_TIMEOUT)
            // Below the engine's idle-connection timeout (30 s), so that the router, not
            // the engine, closes an idle pooled connection: a request is never written to a
            // connection the engine is closing at that moment.
            .pool_idle_timeout(Duration::from_secs(20))
            .build()
            .map_err(|e| crate::RouterError::Config(format!("HTTP client: {e}")))?;
        let workers = WorkerRegistry::new(config.breaker());
        for url in &config.worker_urls {
            workers.add(url)?;
        }
        let policy = policy::build(config.policy, config.cache_aware());
        Ok(Self(Arc::new(Inner {
            retry: config.retry(),
            queue: WaitQueue::new(config.queue_size, config.queue_timeout()),
            config,
            workers,
            policy,
            metrics: Metrics::new(),
            client,
        })))
    }

    /// Chooses a worker for a request and claims its breaker slot. Workers in `excluded`
    /// are skipped unless no other is available.
    pub fn select(
        &self,
        text: Option<&str>,
        excluded: &[Arc<str>],
    ) -> Option<(Arc<Worker>, Decision)> {
        let start = Instant::now();
        let mut candidates = self.workers.available(excluded);
        while !candidates.is_empty() {
            let decision = self.policy.select(&candidates, text)?;
            let worker = candidates.get(decision.index)?.clone();
            if worker.breaker().try_acquire() {
                self.metrics
                    .routing_latency
                    .observe(start.elapsed().as_secs_f64());
                if let Some(outcome) = decision.cache {
                    self.metrics.record_cache_outcome(outcome);
                }
                return Some((worker, decision));
            }
            // Another request took the half-open probe first: choose among the rest.
            candidates.remove(decision.index);
        }
        None
    }

    /// Like `select`, but when no worker is available the request waits in the queue for
    /// one (see [`crate::queue`]); refused with `QueueFull` or `QueueTimeout`.
    pub async fn select_or_wait(
        &self,
        text: Option<&str>,
        excluded: &[Arc<str>],
    ) -> Result<(Arc<Worker>, Decision)> {
        if let Some(chosen) = self.select(text, excluded) {
            return Ok(chosen);
        }
        if self.queue.capacity() == 0 {
            return Err(RouterError::NoHealthyWorker);
        }
        let Some(_ticket) = self.queue.try_enter() else {
            return Err(RouterError::QueueFull {
                size: self.queue.capacity(),
            });
        };
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.queue.timeout();
        loop {
            let ready = self.queue.ready();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(chosen) = self.select(text, excluded) {
                self.metrics
                    .queue_wait
                    .observe(started.elapsed().as_secs_f64());
                return Ok(chosen);
            }
            if tokio::time::timeout_at(deadline, ready).await.is_err() {
                self.metrics
                    .queue_wait
                    .observe(started.elapsed().as_secs_f64());
                return Err(RouterError::QueueTimeout {
                    secs: self.queue.timeout().as_secs(),
                });
            }
        }
    }

    /// Registers a worker and checks its health at once.
    pub async fn add_worker(&self, url: &str) -> Result<Arc<Worker>> {
        let worker = self.workers.add(url)?;
        tracing::info!(worker = worker.url(), "worker added");
        self.check_worker(&worker).await;
        Ok(worker)
    }

    /// Unregisters a worker and forgets its cache entries. Requests in flight finish.
    pub fn remove_worker(&self, url: &str) -> Result<Arc<Worker>> {
        let worker = self.workers.remove(url)?;
        self.policy.on_worker_removed(worker.url());
        tracing::info!(worker = worker.url(), "worker removed");
        Ok(worker)
    }

    /// One health check of `worker`; a worker found dead has its tree entries dropped.
    pub async fn check_worker(&self, worker: &Worker) -> Option<HealthChange> {
        let passed = self.probe(worker.url()).await;
        let change = worker.record_health(
            passed,
            self.config.health_failure_threshold,
            self.config.health_success_threshold,
        );
        match change {
            Some(HealthChange::BecameHealthy) => {
                tracing::info!(worker = worker.url(), "worker is healthy");
                self.queue.notify_ready();
            }
            Some(HealthChange::BecameUnhealthy) => {
                tracing::warn!(
                    worker = worker.url(),
                    "worker failed its health checks; marked dead"
                );
                self.policy.on_worker_removed(worker.url());
            }
            None if !passed => {
                tracing::debug!(worker = worker.url(), "health check failed");
            }
            None => {}
        }
        change
    }

    /// Takes a worker out of rotation at once, without waiting for its health checks to
    /// fail, and forgets its cache entries; health checks bring it back.
    pub fn mark_down(&self, worker: &Worker, reason: &str) {
        if worker.mark_down() {
            tracing::warn!(worker = worker.url(), reason, "worker marked dead");
            self.policy.on_worker_removed(worker.url());
        }
    }

    /// Checks every worker concurrently (at start).
    pub async fn check_all(&self) {
        let workers = self.workers.all();
        futures::future::join_all(workers.iter().map(|w| self.check_worker(w))).await;
    }

    /// The periodic round (`--health-check-interval-secs`): checks the healthy workers
    /// concurrently, so that those that stop answering are marked dead. Dead ones are
    /// [`Self::probe_down_workers`]'s.
    pub async fn check_healthy(&self) {
        let workers: Vec<_> = self
            .workers
            .all()
            .into_iter()
            .filter(|w| w.is_healthy())
            .collect();
        futures::future::join_all(workers.iter().map(|w| self.check_worker(w))).await;
        // An open breaker's timeout may have passed too: queued requests look again.
        if self.queue.pending() > 0 {
            self.queue.notify_ready();
        }
    }

    /// Probes every worker that is not healthy (marked dead, or not checked yet), each on
    /// its own task and at most one probe per worker at a time, so that a restarted engine
    /// is back within seconds (`--health-success-threshold` probes, [`DOWN_PROBE_INTERVAL`]
    /// apart) and a frozen one, whose probe waits out its timeout, delays no other.
    pub fn probe_down_workers(&self) {
        for worker in self.workers.all() {
            if worker.is_healthy() {
                continue;
            }
            let Some(probe) = worker.begin_probe() else {
                continue;
            };
            let state = self.clone();
            tokio::spawn(async move {
                state.check_worker(probe.worker()).await;
            });
        }
    }

    /// One request to `url`'s health endpoint: whether it answered 2xx within
    /// `--health-check-timeout-secs`.
    pub async fn probe(&self, url: &str) -> bool {
        let mut req = self
            .client
            .get(format!("{url}{}", self.config.health_check_endpoint))
            .timeout(Duration::from_secs(self.config.health_check_timeout_secs));
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        match req.send().await {
            Ok(resp) => resp.status().is_success(),
            Err(_) => false,
        }
    }
}
