//! Prometheus metrics, all named `sgl_router_*`.
//!
//! Counters and histograms are updated as requests flow; per-worker gauges (load, health,
//! breaker state, tree size) are refreshed from the live state at each scrape, so a removed
//! worker's series disappear with it.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::policy::{CacheOutcome, LoadBalancingPolicy};
use crate::worker::Worker;

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub errors: IntCounterVec,
    pub retries: IntCounterVec,
    pub worker_requests: IntCounterVec,
    pub cache_hits: IntCounter,
    pub prompt_tokens: IntCounter,
    pub cached_tokens: IntCounter,
    pub cache_misses: IntCounter,
    pub load_balancing_events: IntCounter,
    pub routing_latency: Histogram,
    pub request_duration: HistogramVec,
    /// Time requests spent waiting for a worker in the activator queue.
    pub queue_wait: Histogram,
    pending_requests: IntGauge,
    worker_load: IntGaugeVec,
    worker_healthy: IntGaugeVec,
    worker_breaker: IntGaugeVec,
    tree_size: IntGaugeVec,
    tree_nodes: IntGauge,
    active_workers: IntGauge,
    workers: IntGauge,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable!("static metric {name} is valid: {e}"));
    register(registry, Box::new(c.clone()));
    c
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable!("static metric {name} is valid: {e}"));
    register(registry, Box::new(g.clone()));
    g
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).unwrap_or_else(|e| unreachable!("{name}: {e}"));
    register(registry, Box::new(c.clone()));
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).unwrap_or_else(|e| unreachable!("{name}: {e}"));
    register(registry, Box::new(g.clone()));
    g
}

fn register(registry: &Registry, c: Box<dyn prometheus::core::Collector>) {
    if let Err(e) = registry.register(c) {
        // Names are static and registered once per registry.
        unreachable!("metric registration: {e}");
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let routing_latency = Histogram::with_opts(
            HistogramOpts::new(
                "sgl_router_routing_latency_seconds",
                "Time to choose a worker for a request (policy decision)",
            )
            .buckets(vec![
                1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2,
            ]),
        )
        .unwrap_or_else(|e| unreachable!("routing latency histogram: {e}"));
        register(&r, Box::new(routing_latency.clone()));
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "sgl_router_request_duration_seconds",
                "Time from receiving a request to the end of its response stream",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            &["route"],
        )
        .unwrap_or_else(|e| unreachable!("request duration histogram: {e}"));
        register(&r, Box::new(request_duration.clone()));
        let queue_wait = Histogram::with_opts(
            HistogramOpts::new(
                "sgl_router_queue_wait_seconds",
                "Time a request waited for an available worker (scale from zero, restarts)",
            )
            .buckets(vec![
                0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
            ]),
        )
        .unwrap_or_else(|e| unreachable!("queue wait histogram: {e}"));
        register(&r, Box::new(queue_wait.clone()));
        Self {
            requests: counter_vec(
                &r,
                "sgl_router_requests_total",
                "Requests received",
                &["route"],
            ),
            errors: counter_vec(
                &r,
                "sgl_router_request_errors_total",
                "Requests that ended in an error, by kind",
                &["route", "kind"],
            ),
            retries: counter_vec(
                &r,
                "sgl_router_retries_total",
                "Requests sent again to another worker after a retryable failure",
                &["route"],
            ),
            worker_requests: counter_vec(
                &r,
                "sgl_router_processed_requests_total",
                "Attempts sent to each worker",
                &["worker"],
            ),
            prompt_tokens: counter(
                &r,
                "sgl_router_prompt_tokens_total",
                "Prompt tokens of the generation responses served, as the engines reported them",
            ),
            cached_tokens: counter(
                &r,
                "sgl_router_cached_tokens_total",
                "Prompt tokens the engines found in their prefix cache, as their responses reported",
            ),
            cache_hits: counter(
                &r,
                "sgl_router_cache_hits_total",
                "Cache-aware decisions routed to the worker with the longest prefix match",
            ),
            cache_misses: counter(
                &r,
                "sgl_router_cache_misses_total",
                "Cache-aware decisions with too short a match, routed by load",
            ),
            load_balancing_events: counter(
                &r,
                "sgl_router_load_balancing_events_total",
                "Cache-aware decisions routed by load alone because load was imbalanced",
            ),
            routing_latency,
            request_duration,
            queue_wait,
            pending_requests: gauge(
                &r,
                "sgl_router_pending_requests",
                "Requests waiting for a worker to become available (the scale-from-zero signal)",
            ),
            worker_load: gauge_vec(
                &r,
                "sgl_router_worker_load",
                "Requests in flight on each worker",
                &["worker"],
            ),
            worker_healthy: gauge_vec(
                &r,
                "sgl_router_worker_health",
                "1 when the worker passes health checks, else 0",
                &["worker"],
            ),
            worker_breaker: gauge_vec(
                &r,
                "sgl_router_worker_circuit_state",
                "Circuit breaker state: 0 closed, 1 open, 2 half-open",
                &["worker"],
            ),
            tree_size: gauge_vec(
                &r,
                "sgl_router_tree_size",
                "Characters each worker holds in the cache-aware prefix tree",
                &["worker"],
            ),
            tree_nodes: gauge(&r, "sgl_router_tree_nodes", "Nodes in the prefix tree"),
            active_workers: gauge(
                &r,
                "sgl_router_active_workers",
                "Workers that can take requests now (healthy, breaker not open)",
            ),
            workers: gauge(&r, "sgl_router_workers", "Registered workers"),
            registry: r,
        }
    }

    pub fn record_usage(&self, usage: crate::usage::Usage) {
        self.prompt_tokens.inc_by(usage.prompt_tokens);
        self.cached_tokens.inc_by(usage.cached_tokens);
    }

    pub fn record_cache_outcome(&self, outcome: CacheOutcome) {
        match outcome {
            CacheOutcome::Hit => self.cache_hits.inc(),
            CacheOutcome::Miss => self.cache_misses.inc(),
            CacheOutcome::Imbalanced => self.load_balancing_events.inc(),
        }
    }

    /// Refreshes the gauges from live state and renders the text exposition format.
    pub fn render(
        &self,
        workers: &[std::sync::Arc<Worker>],
        policy: &dyn LoadBalancingPolicy,
        pending_requests: usize,
    ) -> String {
        self.pending_requests.set(pending_requests as i64);
        for g in [
            &self.worker_load,
            &self.worker_healthy,
            &self.worker_breaker,
            &self.tree_size,
        ] {
            g.reset();
        }
        for w in workers {
            let url = w.url();
            self.worker_load
                .with_label_values(&[url])
                .set(w.load() as i64);
            self.worker_healthy
                .with_label_values(&[url])
                .set(i64::from(w.is_healthy()));
            self.worker_breaker
                .with_label_values(&[url])
                .set(w.breaker_state().as_gauge());
        }
        if let Some(tree) = policy.tree() {
            for (tenant, chars) in tree.tenant_sizes() {
                self.tree_size
                    .with_label_values(&[&*tenant])
                    .set(chars as i64);
            }
            self.tree_nodes.set(tree.node_count() as i64);
        }
        self.active_workers
            .set(workers.iter().filter(|w| w.is_available()).count() as i64);
        self.workers.set(workers.len() as i64);

        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "failed to encode metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}
