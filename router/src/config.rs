//! Router flags: one struct, with SGLang's router names and defaults, validated once.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use crate::breaker::BreakerConfig;
use crate::error::{Result, RouterError};
use crate::policy::CacheAwareConfig;
use crate::retry::RetryConfig;

/// Which load-balancing policy picks the worker for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    CacheAware,
    RoundRobin,
    Random,
    PowerOfTwo,
    ShortestQueue,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CacheAware => "cache_aware",
            Self::RoundRobin => "round_robin",
            Self::Random => "random",
            Self::PowerOfTwo => "power_of_two",
            Self::ShortestQueue => "shortest_queue",
        }
    }
}

/// All router settings. Flag names and defaults follow SGLang's router.
#[derive(Debug, Clone, Args)]
pub struct RouterConfig {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free port (the bound address is printed on stdout).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Engine URLs to route to, e.g. http://10.0.0.5:30000.
    #[arg(long, num_args = 1..)]
    pub worker_urls: Vec<String>,
    /// Load-balancing policy.
    #[arg(long, value_enum, default_value_t = PolicyKind::CacheAware)]
    pub policy: PolicyKind,

    /// Cache-aware: minimum prefix match rate (0..1) to route to the matching worker.
    #[arg(long, default_value_t = 0.5)]
    pub cache_threshold: f64,
    /// Cache-aware: load is imbalanced when max - min exceeds this (requests in flight)...
    #[arg(long, default_value_t = 32)]
    pub balance_abs_threshold: usize,
    /// ...and max exceeds min times this.
    #[arg(long, default_value_t = 1.0001)]
    pub balance_rel_threshold: f64,
    /// Cache-aware: seconds between evictions of the prefix tree.
    #[arg(long, default_value_t = 60)]
    pub eviction_interval_secs: u64,
    /// Cache-aware: characters each worker may hold in the prefix tree after eviction.
    #[arg(long, default_value_t = 1 << 24)]
    pub max_tree_size: usize,

    /// Largest request body accepted, in bytes (the engine's limit: a larger body would only
    /// be refused by the worker after the router had read and kept all of it).
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_payload_size: usize,
    /// Time limit for one request to a worker, its whole response body included.
    #[arg(long, default_value_t = 600)]
    pub request_timeout_secs: u64,
    /// Time a worker has to send the status line of its answer to one attempt (a stream's
    /// comes at once; a non-streaming answer's when it is done). Past it the worker's
    /// health endpoint is probed: a worker that does not answer within
    /// --health-check-timeout-secs is frozen, is marked dead, and the request, of which the
    /// client has received nothing yet, is retried on another worker; a worker that answers
    /// is busy generating, and is probed again every time this passes. 0 turns it off.
    #[arg(long, default_value_t = 30)]
    pub first_byte_timeout_secs: u64,
    /// Longest silence between two chunks of a worker's response body once its status line
    /// has been accepted (a stream frozen mid-way: the engine hung, stopped or lost). Past it
    /// the client's stream is ended (an SSE stream with an error event, then `[DONE]`), the
    /// connection to the worker is dropped, which aborts the request there, and the worker's
    /// health is probed. Engines send a keep-alive line every 5 s while a stream waits, so a
    /// queued request is not silent. 0 turns it off.
    #[arg(long, default_value_t = 60)]
    pub stream_idle_timeout_secs: u64,
    /// API key: clients must send `Authorization: Bearer <key>` (except to /health and
    /// /metrics), and the router sends it to the workers.
    #[arg(long, env = "SGL_ROUTER_API_KEY")]
    pub api_key: Option<String>,

    /// Seconds between health checks of each worker.
    #[arg(long, default_value_t = 10)]
    pub health_check_interval_secs: u64,
    /// Time limit of one health check.
    #[arg(long, default_value_t = 5)]
    pub health_check_timeout_secs: u64,
    /// Consecutive failed checks that mark a worker dead (its tree entries are dropped).
    #[arg(long, default_value_t = 3)]
    pub health_failure_threshold: u32,
    /// Consecutive passed checks that bring a dead worker back.
    #[arg(long, default_value_t = 2)]
    pub health_success_threshold: u32,
    /// Path probed by health checks.
    #[arg(long, default_value = "/health")]
    pub health_check_endpoint: String,

    /// Retries after the first attempt (connection errors, 502, 503, 504).
    #[arg(long, default_value_t = 5)]
    pub retry_max_retries: u32,
    /// Backoff before the first retry.
    #[arg(long, default_value_t = 50)]
    pub retry_initial_backoff_ms: u64,
    /// Upper bound of one backoff.
    #[arg(long, default_value_t = 30_000)]
    pub retry_max_backoff_ms: u64,
    /// Growth of the backoff per retry.
    #[arg(long, default_value_t = 1.5)]
    pub retry_backoff_multiplier: f64,
    /// Random spread of each backoff, as a fraction of it (0..1).
    #[arg(long, default_value_t = 0.2)]
    pub retry_jitter_factor: f64,
    /// Send each request once.
    #[arg(long)]
    pub disable_retries: bool,

    /// Consecutive failures that open a worker's circuit breaker.
    #[arg(long, default_value_t = 10)]
    pub cb_failure_threshold: u32,
    /// Consecutive successful probes that close a half-open breaker.
    #[arg(long, default_value_t = 3)]
    pub cb_success_threshold: u32,
    /// Seconds an open breaker waits before letting a probe through.
    #[arg(long, default_value_t = 60)]
    pub cb_timeout_duration_secs: u64,
    /// Never open circuit breakers.
    #[arg(long)]
    pub disable_circuit_breaker: bool,

    /// Find workers by watching Kubernetes Pods (needs --selector).
    #[arg(long)]
    pub service_discovery: bool,
    /// Label selector of worker Pods, as key=value pairs.
    #[arg(long, num_args = 1..)]
    pub selector: Vec<String>,
    /// Port of the engine on each discovered Pod.
    #[arg(long, default_value_t = 80)]
    pub service_discovery_port: u16,
    /// Namespace to watch; all namespaces when absent.
    #[arg(long)]
    pub service_discovery_namespace: Option<String>,

    /// Requests that may wait for a worker while none can take them (none registered or
    /// healthy, e.g. a service scaled to zero while its first engine starts); 0 refuses them
    /// at once. Beyond this, requests are answered 503 with `Retry-After`.
    #[arg(long, default_value_t = 100)]
    pub queue_size: usize,
    /// Longest wait for a worker in that queue, after which the request is answered 503
    /// with `Retry-After`.
    #[arg(long, default_value_t = 60)]
    pub queue_timeout_secs: u64,

    /// Generation requests the router holds in flight across all workers; beyond it a
    /// request is answered 429 with `Retry-After` at once. -1: no router-wide bound. Each
    /// worker is bounded in any case by what its `/get_server_info` reports
    /// (`max_running_requests` + `max_queued_requests`): when every available worker is at
    /// its bound, or refused the last request (429, or 503 with `Retry-After`) and none has
    /// left it since, the router answers as the engine would, 429 (or that 503) with
    /// `Retry-After`, without contacting one; an engine's own 429 or 503 with `Retry-After`
    /// is passed to the client, never retried on another worker.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub max_concurrent_requests: i64,

    /// Log filter (error, warn, info, debug, trace or a tracing directive).
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

#[derive(Parser)]
struct DefaultsOnly {
    #[command(flatten)]
    config: RouterConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        // The defaults live in the flag attributes; parsing no flags yields them.
        match DefaultsOnly::try_parse_from(["sgl-router"]) {
            Ok(d) => d.config,
            Err(e) => unreachable!("flag defaults must parse: {e}"),
        }
    }
}

impl RouterConfig {
    /// Checks ranges and combinations; call once before starting.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(RouterError::Config(msg));
        if !(0.0..=1.0).contains(&self.cache_threshold) {
            return bad(format!(
                "--cache-threshold must be within 0..1, got {}",
                self.cache_threshold
            ));
        }
        if self.balance_rel_threshold.is_nan() || self.balance_rel_threshold < 1.0 {
            return bad(format!(
                "--balance-rel-threshold must be at least 1.0, got {}",
                self.balance_rel_threshold
            ));
        }
        if self.max_payload_size == 0 {
            return bad("--max-payload-size must be positive".into());
        }
        if self.request_timeout_secs == 0 || self.health_check_timeout_secs == 0 {
            return bad("timeouts must be positive".into());
        }
        if self.queue_size > 0 && self.queue_timeout_secs == 0 {
            return bad("--queue-timeout-secs must be positive (or --queue-size 0)".into());
        }
        if self.max_concurrent_requests == 0 || self.max_concurrent_requests < -1 {
            return bad(format!(
                "--max-concurrent-requests must be positive, or -1 for no router-wide bound; \
                 got {}",
                self.max_concurrent_requests
            ));
        }
        if self.health_check_interval_secs == 0 || self.eviction_interval_secs == 0 {
            return bad("intervals must be positive".into());
        }
        if self.health_failure_threshold == 0 || self.health_success_threshold == 0 {
            return bad("health thresholds must be positive".into());
        }
        if !self.health_check_endpoint.starts_with('/') {
            return bad("--health-check-endpoint must start with '/'".into());
        }
        if self.retry_backoff_multiplier.is_nan() || self.retry_backoff_multiplier < 1.0 {
            return bad("--retry-backoff-multiplier must be at least 1.0".into());
        }
        if !(0.0..=1.0).contains(&self.retry_jitter_factor) {
            return bad("--retry-jitter-factor must be within 0..1".into());
        }
        if self.cb_success_threshold == 0 {
            return bad("--cb-success-threshold must be positive".into());
        }
        if self.service_discovery && self.selector.is_empty() {
            return bad("--service-discovery needs --selector key=value".into());
        }
        self.selector_map()?;
        for url in &self.worker_urls {
            crate::worker::normalize_url(url)?;
        }
        Ok(())
    }

    /// `--selector` as a map; each item must be `key=value`.
    pub fn selector_map(&self) -> Result<BTreeMap<String, String>> {
        self.selector
            .iter()
            .map(|item| match item.split_once('=') {
                Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                _ => Err(RouterError::Config(format!(
                    "--selector items must be key=value, got `{item}`"
                ))),
            })
            .collect()
    }

    pub fn cache_aware(&self) -> CacheAwareConfig {
        CacheAwareConfig {
            cache_threshold: self.cache_threshold,
            balance_abs_threshold: self.balance_abs_threshold,
            balance_rel_threshold: self.balance_rel_threshold,
            max_tree_size: self.max_tree_size,
        }
    }

    pub fn retry(&self) -> RetryConfig {
        RetryConfig {
            max_retries: if self.disable_retries {
                0
            } else {
                self.retry_max_retries
            },
            initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
            multiplier: self.retry_backoff_multiplier,
            jitter: self.retry_jitter_factor,
        }
    }

    pub fn breaker(&self) -> BreakerConfig {
        BreakerConfig {
            failure_threshold: if self.disable_circuit_breaker {
                0
            } else {
                self.cb_failure_threshold
            },
            success_threshold: self.cb_success_threshold,
            open_duration: Duration::from_secs(self.cb_timeout_duration_secs),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    /// `--first-byte-timeout-secs`, unless turned off.
    pub fn first_byte_timeout(&self) -> Option<Duration> {
        (self.first_byte_timeout_secs > 0)
            .then(|| Duration::from_secs(self.first_byte_timeout_secs))
    }

    /// `--stream-idle-timeout-secs`, unless turned off.
    pub fn stream_idle_timeout(&self) -> Option<Duration> {
        (self.stream_idle_timeout_secs > 0)
            .then(|| Duration::from_secs(self.stream_idle_timeout_secs))
    }

    /// `--max-concurrent-requests`, unless -1.
    pub fn max_concurrent(&self) -> Option<usize> {
        usize::try_from(self.max_concurrent_requests)
            .ok()
            .filter(|&n| n > 0)
    }

    pub fn queue_timeout(&self) -> Duration {
        Duration::from_secs(self.queue_timeout_secs)
    }

    pub fn eviction_interval(&self) -> Duration {
        Duration::from_secs(self.eviction_interval_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<RouterConfig, clap::Error> {
        let mut all = vec!["sgl-router"];
        all.extend_from_slice(args);
        DefaultsOnly::try_parse_from(all).map(|d| d.config)
    }

    #[test]
    fn defaults_are_sglangs() {
        let c = RouterConfig::default();
        assert_eq!(c.policy, PolicyKind::CacheAware);
        assert_eq!(c.cache_threshold, 0.5);
        assert_eq!(c.balance_abs_threshold, 32);
        assert_eq!(c.balance_rel_threshold, 1.0001);
        assert_eq!(c.eviction_interval_secs, 60);
        assert_eq!(c.max_tree_size, 16_777_216);
        assert_eq!((c.queue_size, c.queue_timeout_secs), (100, 60));
        assert_eq!((c.max_concurrent_requests, c.max_concurrent()), (-1, None));
        assert_eq!(c.first_byte_timeout(), Some(Duration::from_secs(30)));
        assert_eq!(c.stream_idle_timeout(), Some(Duration::from_secs(60)));
        c.validate().unwrap();
    }

    #[test]
    fn parses_flags_and_rejects_bad_values() {
        let c = parse(&[
            "--worker-urls",
            "http://a:1",
            "http://b:2/",
            "--policy",
            "power_of_two",
            "--selector",
            "app=sglang",
            "tier=gpu",
        ])
        .unwrap();
        assert_eq!(c.worker_urls.len(), 2);
        assert_eq!(c.policy, PolicyKind::PowerOfTwo);
        assert_eq!(c.selector_map().unwrap().len(), 2);
        c.validate().unwrap();

        assert!(parse(&["--policy", "fastest"]).is_err());
        let c = parse(&["--cache-threshold", "1.5"]).unwrap();
        assert!(matches!(c.validate(), Err(RouterError::Config(_))));
        let c = parse(&["--service-discovery"]).unwrap();
        assert!(c.validate().is_err(), "discovery without a selector");
        let c = parse(&["--selector", "novalue"]).unwrap();
        assert!(c.validate().is_err());
        let c = parse(&["--queue-timeout-secs", "0"]).unwrap();
        assert!(c.validate().is_err(), "a queue that never waits");
        let c = parse(&["--queue-size", "0", "--queue-timeout-secs", "0"]).unwrap();
        c.validate().unwrap();
        let c = parse(&["--worker-urls", "ftp://x"]).unwrap();
        assert!(c.validate().is_err());
        let c = parse(&["--disable-retries", "--disable-circuit-breaker"]).unwrap();
        assert_eq!(c.retry().max_retries, 0);
        assert_eq!(c.breaker().failure_threshold, 0);
        let c = parse(&["--max-concurrent-requests", "8"]).unwrap();
        assert_eq!(c.max_concurrent(), Some(8));
        for bad in ["0", "-2"] {
            let c = parse(&["--max-concurrent-requests", bad]).unwrap();
            assert!(c.validate().is_err(), "--max-concurrent-requests {bad}");
        }
        let c = parse(&["--first-byte-timeout-secs", "0"]).unwrap();
        assert_eq!(c.first_byte_timeout(), None, "0 turns it off");
        let c = parse(&["--stream-idle-timeout-secs", "0"]).unwrap();
        assert_eq!(c.stream_idle_timeout(), None, "0 turns it off");
    }
}
