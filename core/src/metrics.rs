//! Prometheus metrics with SGLang's names (`sglang:*`), labelled with `model_name`.
//!
//! Counters are what dashboards and autoscalers should use: a windowed prefix-cache hit rate
//! is `rate(sglang:cached_tokens_total[w]) / rate(sglang:prompt_tokens_total[w])`. The
//! `sglang:cache_hit_rate` gauge stays for compatibility, but it is the average since the
//! process started, so it says little about the traffic of the last minutes.

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

/// All engine metrics. The scheduler thread updates them; `/metrics` encodes them.
pub struct Metrics {
    registry: Registry,
    model_name: String,
    /// Prompt tokens of every request admitted, counted at its first admission with its cached
    /// tokens: a windowed hit rate then compares the same requests (counted on arrival, the
    /// prompts still waiting lowered it while a queue grew).
    pub prompt_tokens_total: IntCounterVec,
    /// Prompt tokens found in the radix cache, counted at a request's first admission: the
    /// `cached_tokens` its response reports.
    pub cached_tokens_total: IntCounterVec,
    pub generation_tokens_total: IntCounterVec,
    /// Requests that finished normally (stop, length, ...).
    pub num_requests_total: IntCounterVec,
    pub time_to_first_token: HistogramVec,
    pub time_per_output_token: HistogramVec,
    pub e2e_request_latency: HistogramVec,
    /// Submission to first event (prefill included) of the requests that started.
    pub queue_time: HistogramVec,
    pub num_running_reqs: GaugeVec,
    pub num_used_tokens: GaugeVec,
    pub token_usage: GaugeVec,
    pub gen_throughput: GaugeVec,
    pub num_queue_reqs: GaugeVec,
    pub cache_hit_rate: GaugeVec,
    /// How long a request arriving now would wait before it starts: the waiting requests over
    /// the rate at which they start (what admission refuses on; 0 until that rate is measured).
    pub estimated_queue_time: GaugeVec,
}

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 25.0, 30.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5,
];
const E2E_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
];

impl Metrics {
    pub fn new(model_name: &str) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let labels = &["model_name"];
        let counter = |name: &str, help: &str| -> Result<IntCounterVec, prometheus::Error> {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> Result<GaugeVec, prometheus::Error> {
            let g = GaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let histogram =
            |name: &str, help: &str, buckets: &[f64]| -> Result<HistogramVec, prometheus::Error> {
                let h = HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                    labels,
                )?;
                registry.register(Box::new(h.clone()))?;
                Ok(h)
            };
        let m = Metrics {
            prompt_tokens_total: counter(
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
            )?,
            cached_tokens_total: counter(
                "sglang:cached_tokens_total",
                "Number of cached prompt tokens.",
            )?,
            generation_tokens_total: counter(
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
            )?,
            num_requests_total: counter(
                "sglang:num_requests_total",
                "Number of requests processed.",
            )?,
            time_to_first_token: histogram(
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            )?,
            time_per_output_token: histogram(
                "sglang:time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                TPOT_BUCKETS,
            )?,
            e2e_request_latency: histogram(
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                E2E_BUCKETS,
            )?,
            queue_time: histogram(
                "sglang:queue_time_seconds",
                "Histogram of queueing time in seconds (until the first token).",
                E2E_BUCKETS,
            )?,
            num_running_reqs: gauge("sglang:num_running_reqs", "The number of running requests.")?,
            num_used_tokens: gauge("sglang:num_used_tokens", "The number of used tokens.")?,
            token_usage: gauge("sglang:token_usage", "The token usage.")?,
            gen_throughput: gauge(
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
            )?,
            num_queue_reqs: gauge(
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
            )?,
            cache_hit_rate: gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")?,
            estimated_queue_time: gauge(
                "sglang:estimated_queue_time_seconds",
                "Estimated wait before a request arriving now starts (waiting requests / start rate).",
            )?,
            registry,
            model_name: model_name.to_string(),
        };
        // Touch every labelled series so that it is exported (with zero) from the start.
        for c in [
            &m.prompt_tokens_total,
            &m.cached_tokens_total,
            &m.generation_tokens_total,
            &m.num_requests_total,
        ] {
            c.with_label_values(&[&m.model_name]).inc_by(0);
        }
        for g in [
            &m.num_running_reqs,
            &m.num_used_tokens,
            &m.token_usage,
            &m.gen_throughput,
            &m.num_queue_reqs,
            &m.cache_hit_rate,
            &m.estimated_queue_time,
        ] {
            g.with_label_values(&[&m.model_name]).set(0.0);
        }
        for h in [
            &m.time_to_first_token,
            &m.time_per_output_token,
            &m.e2e_request_latency,
            &m.queue_time,
        ] {
            let _ = h.with_label_values(&[&m.model_name]);
        }
        Ok(m)
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn label(&self) -> [&str; 1] {
        [self.model_name.as_str()]
    }

    /// Prometheus text exposition format.
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}
