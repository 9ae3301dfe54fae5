//! The router's shared state: workers, policy, metrics and the HTTP client, with the
//! operations that keep them consistent (adding, removing and checking workers).

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::config::RouterConfig;
use crate::error::{Result, RouterError};
use crate::metrics::Metrics;
use crate::policy::{self, Decision, LoadBalancingPolicy};
use crate::queue::WaitQueue;
use crate::retry::RetryConfig;
use crate::worker::{
    FULL_RETRY_AFTER_SECS, FleetSlot, Full, HealthChange, LoadGuard, Worker, WorkerRegistry,
};

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
    /// Generation requests in flight through the router, counted while
    /// `--max-concurrent-requests` bounds them.
    pub in_flight: Arc<AtomicUsize>,
}

/// A worker chosen for a request, with the request already counted on it.
pub struct Chosen {
    pub worker: Arc<Worker>,
    pub decision: Decision,
    pub guard: LoadGuard,
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
            in_flight: Arc::new(AtomicUsize::new(0)),
        })))
    }

    /// Chooses a worker for a request that no bound applies to (any route but generation),
    /// claims its breaker slot and counts the request on it. Workers in `excluded` are
    /// skipped unless no other is available. `Ok(None)`: no worker is available.
    pub fn select(&self, text: Option<&str>, excluded: &[Arc<str>]) -> Result<Option<Chosen>> {
        self.select_within_bounds(text, excluded, false)
    }

    /// [`Self::select`], for a generation request when `bounded`.
    ///
    /// A generation request (`bounded`) goes only to a worker with room: below the bound of
    /// requests it reported (see [`Self::read_bounds`]) and not refusing requests (it
    /// answered the last one 429 or 503 with `Retry-After`, and none of ours has left it
    /// since). When every available worker is full, or the router holds
    /// `--max-concurrent-requests`, the request is refused at once with
    /// [`RouterError::Overloaded`], as the engines would refuse it, without a round trip.
    pub fn select_within_bounds(
        &self,
        text: Option<&str>,
        excluded: &[Arc<str>],
        bounded: bool,
    ) -> Result<Option<Chosen>> {
        let start = Instant::now();
        let mut candidates = self.workers.available(excluded);
        if candidates.is_empty() {
            return Ok(None);
        }
        let mut fleet = if bounded {
            self.claim_fleet_slot()?
        } else {
            None
        };
        let mut full: Vec<(Arc<Worker>, Full)> = Vec::new();
        if bounded {
            candidates.retain(|w| match w.full() {
                Some(f) => {
                    full.push((w.clone(), f));
                    false
                }
                None => true,
            });
        }
        while !candidates.is_empty() {
            let Some(decision) = self.policy.select(&candidates, text) else {
                break;
            };
            let Some(worker) = candidates.get(decision.index).cloned() else {
                break;
            };
            if !worker.breaker().try_acquire() {
                // Another request took the half-open probe first: choose among the rest.
                candidates.remove(decision.index);
                continue;
            }
            let guard = if bounded {
                match worker.try_start_request() {
                    Ok(guard) => guard,
                    Err(f) => {
                        // Filled up since the check above, by a concurrent request.
                        worker.breaker().release();
                        if let (Some(text), Some(recorded)) = (text, decision.recorded) {
                            self.policy.on_refused(text, worker.url(), recorded);
                        }
                        full.push((worker, f));
                        candidates.remove(decision.index);
                        continue;
                    }
                }
            } else {
                worker.start_request()
            };
            self.metrics
                .routing_latency
                .observe(start.elapsed().as_secs_f64());
            if let Some(outcome) = decision.cache {
                self.metrics.record_cache_outcome(outcome);
            }
            return Ok(Some(Chosen {
                worker,
                decision,
                guard: guard.with_fleet_slot(fleet.take()),
            }));
        }
        if full.is_empty() {
            Ok(None)
        } else {
            Err(shed(&full))
        }
    }

    /// A place among the router's generation requests in flight, when
    /// `--max-concurrent-requests` bounds them.
    fn claim_fleet_slot(&self) -> Result<Option<FleetSlot>> {
        let Some(max) = self.config.max_concurrent() else {
            return Ok(None);
        };
        FleetSlot::claim(&self.in_flight, max)
            .map(Some)
            .map_err(|n| RouterError::Overloaded {
                message: format!(
                    "the router holds {n} requests in flight (--max-concurrent-requests); \
                     retry later"
                ),
                status: StatusCode::TOO_MANY_REQUESTS,
                retry_after: FULL_RETRY_AFTER_SECS,
            })
    }

    /// Like `select`, but when no worker is available the request waits in the queue for
    /// one (see [`crate::queue`]); refused with `QueueFull` or `QueueTimeout`. A request
    /// that finds every worker full is refused at once, queued or not: waiting in the
    /// router would only add to the engines' own queues.
    pub async fn select_or_wait(
        &self,
        text: Option<&str>,
        excluded: &[Arc<str>],
        bounded: bool,
    ) -> Result<Chosen> {
        if let Some(chosen) = self.select_within_bounds(text, excluded, bounded)? {
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
            if let Some(chosen) = self.select_within_bounds(text, excluded, bounded)? {
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
        if passed && worker.is_healthy() && !worker.bounds_read() {
            self.read_bounds(worker).await;
        }
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

    /// Reads the worker's bounds from its `/get_server_info`: it holds at most
    /// `max_running_requests` running and `max_queued_requests` waiting (the engine's
    /// admission bound, which the engine resolves from its KV cache when the flag is
    /// absent, and reports resolved). A worker that reports neither (another server, an
    /// older engine) is unbounded here and sheds on its own. A failed read is tried again
    /// at the next health check.
    pub async fn read_bounds(&self, worker: &Worker) {
        let mut req = self
            .client
            .get(format!("{}/get_server_info", worker.url()))
            .timeout(Duration::from_secs(self.config.health_check_timeout_secs));
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        let info = match req.send().await {
            Ok(resp) if resp.status().is_success() => resp.json::<serde_json::Value>().await,
            Ok(resp) => {
                tracing::debug!(worker = worker.url(), status = %resp.status(), "no server info");
                return;
            }
            Err(e) => Err(e),
        };
        let info = match info {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(worker = worker.url(), error = %e, "server info unreadable");
                return;
            }
        };
        let field = |name: &str| {
            info.get(name)
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
        };
        let capacity = match (field("max_running_requests"), field("max_queued_requests")) {
            (Some(running), Some(queued)) => {
                Some(running.saturating_add(queued)).filter(|&n| n > 0)
            }
            _ => None,
        };
        worker.set_capacity(capacity);
        match capacity {
            Some(n) => tracing::info!(
                worker = worker.url(),
                max_in_flight = n,
                "worker bounds read"
            ),
            None => tracing::info!(
                worker = worker.url(),
                "worker reports no admission bound; the router does not shed for it"
            ),
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

/// The router's answer when every worker it could use is full: a 429 when one of them is at
/// its bound of requests (a place frees as soon as one ends), else the workers' own refusal
/// that ends first (a 503 of an engine's queue deadline keeps its status and its advice).
fn shed(full: &[(Arc<Worker>, Full)]) -> RouterError {
    let pick = full
        .iter()
        .filter(|(_, f)| f.status == StatusCode::TOO_MANY_REQUESTS)
        .min_by_key(|(_, f)| f.retry_after)
        .or_else(|| full.iter().min_by_key(|(_, f)| f.retry_after));
    let Some((worker, f)) = pick else {
        return RouterError::NoHealthyWorker;
    };
    RouterError::Overloaded {
        message: format!(
            "every available worker is full ({} of them; {}: {}); retry later",
            full.len(),
            worker.url(),
            f.reason
        ),
        status: f.status,
        retry_after: f.retry_after,
    }
}
