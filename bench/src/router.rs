//! `sgl-bench router`: routing decision time, proxy overhead, and the shared-prefix
//! workload under cache-aware routing against round robin. Each part prints its workload,
//! the peer it is compared with, and the ratio.

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use sgl_router::app::AppState;
use sgl_router::config::{PolicyKind, RouterConfig};
use sgl_router::error::{Result, RouterError};
use sgl_router::launch::launch;
use sgl_router::sim::{SimConfig, SimWorker};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchPart {
    All,
    Routing,
    Proxy,
    Workload,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Which measurement to run.
    #[arg(value_enum, default_value_t = BenchPart::All)]
    pub part: BenchPart,
    /// Routing: requests inserted into the prefix tree before timing.
    #[arg(long, default_value_t = 100_000)]
    pub tree_entries: usize,
    /// Routing: timed decisions.
    #[arg(long, default_value_t = 20_000)]
    pub decisions: usize,
    /// Routing: workers the policy chooses among.
    #[arg(long, default_value_t = 8)]
    pub routing_workers: usize,
    /// Proxy: timed requests on each path (direct and through the router).
    #[arg(long, default_value_t = 2_000)]
    pub proxy_requests: usize,
    /// Workload: prefix groups (e.g. distinct system prompts).
    #[arg(long, default_value_t = 32)]
    pub groups: usize,
    /// Workload: requests per group.
    #[arg(long, default_value_t = 16)]
    pub per_group: usize,
    /// Workload: requests in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Workload: characters of each group's shared prefix.
    #[arg(long, default_value_t = 1_000)]
    pub prefix_chars: usize,
    /// Workload: simulated workers (when no --worker-urls).
    #[arg(long, default_value_t = 4)]
    pub sim_workers: usize,
    /// Workload: simulated prefill cost per uncached character, in microseconds.
    #[arg(long, default_value_t = 10)]
    pub prefill_us_per_char: u64,
    /// Workload: run against these engines instead of simulated workers.
    #[arg(long, num_args = 1..)]
    pub worker_urls: Vec<String>,
    /// Workload against engines: max_new_tokens of each request.
    #[arg(long, default_value_t = 8)]
    pub max_new_tokens: u32,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

pub async fn run(args: BenchArgs) -> Result<()> {
    let all = args.part == BenchPart::All;
    if all || args.part == BenchPart::Routing {
        routing(&args)?;
    }
    if all || args.part == BenchPart::Proxy {
        proxy(&args).await?;
    }
    if all || args.part == BenchPart::Workload {
        workload(&args).await?;
    }
    Ok(())
}

/// Lower-case words of random letters, `chars` characters long in all.
fn random_text(rng: &mut StdRng, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 8);
    while s.len() < chars {
        let len = rng.random_range(2..9);
        for _ in 0..len {
            s.push(char::from(b'a' + rng.random_range(0..26u8)));
        }
        s.push(' ');
    }
    s.truncate(chars);
    s
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A router state with `n` healthy placeholder workers (never contacted).
fn offline_state(policy: PolicyKind, n: usize) -> Result<AppState> {
    let config = RouterConfig {
        policy,
        worker_urls: (0..n)
            .map(|i| format!("http://10.255.0.{}:30000", i + 1))
            .collect(),
        ..RouterConfig::default()
    };
    let state = AppState::new(config)?;
    for w in state.workers.all() {
        w.mark_healthy();
    }
    Ok(state)
}

/// Times `AppState::select` for each text; returns sorted durations.
fn time_decisions(state: &AppState, texts: &[String]) -> Vec<Duration> {
    let mut times: Vec<Duration> = texts
        .iter()
        .map(|t| {
            let start = Instant::now();
            let picked = state.select(Some(t), &[]);
            let elapsed = start.elapsed();
            let _ = std::hint::black_box(picked);
            elapsed
        })
        .collect();
    times.sort();
    times
}

fn routing(args: &BenchArgs) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let groups = (args.tree_entries / 100).max(1);
    let prefixes: Vec<String> = (0..groups)
        .map(|_| {
            let n = rng.random_range(200..600);
            random_text(&mut rng, n)
        })
        .collect();
    let request = |rng: &mut StdRng| {
        let g = rng.random_range(0..groups);
        let n = rng.random_range(20..120);
        format!("{}{}", prefixes[g], random_text(rng, n))
    };
    let fill: Vec<String> = (0..args.tree_entries).map(|_| request(&mut rng)).collect();
    // Timed requests: 80% continue a known group, 20% start a new one.
    let queries: Vec<String> = (0..args.decisions)
        .map(|_| {
            if rng.random_bool(0.8) {
                request(&mut rng)
            } else {
                let n = rng.random_range(200..700);
                random_text(&mut rng, n)
            }
        })
        .collect();

    let cache_aware = offline_state(PolicyKind::CacheAware, args.routing_workers)?;
    let start = Instant::now();
    for t in &fill {
        let _ = cache_aware.select(Some(t), &[]);
    }
    let fill_time = start.elapsed();
    let tree = cache_aware
        .policy
        .tree()
        .ok_or_else(|| RouterError::Config("cache-aware policy without a tree".into()))?;
    let nodes = tree.node_count();
    let chars: usize = tree.tenant_sizes().iter().map(|(_, c)| c).sum();
    let ca = time_decisions(&cache_aware, &queries);
    let rr_state = offline_state(PolicyKind::RoundRobin, args.routing_workers)?;
    let rr = time_decisions(&rr_state, &queries);

    let avg_len = queries.iter().map(|q| q.len()).sum::<usize>() / queries.len().max(1);
    println!("== routing decision time");
    println!(
        "workload: {} requests in the tree ({groups} prefix groups, {nodes} nodes, {chars} chars over \
         {} workers, filled in {:.2} s); {} timed decisions, avg {avg_len} chars, 80% known groups",
        args.tree_entries,
        args.routing_workers,
        fill_time.as_secs_f64(),
        queries.len()
    );
    for (name, t) in [("cache_aware", &ca), ("round_robin", &rr)] {
        println!(
            "{name:>12}: p50 {:7.2} us  p99 {:7.2} us  p99.9 {:7.2} us  max {:8.2} us",
            micros(percentile(t, 0.5)),
            micros(percentile(t, 0.99)),
            micros(percentile(t, 0.999)),
            micros(percentile(t, 1.0))
        );
    }
    let p99 = micros(percentile(&ca, 0.99));
    println!(
        "peer: goal p99 < 50 us -> ratio p99/goal {:.3} ({}); cache_aware/round_robin p50 ratio {:.1}x",
        p99 / 50.0,
        if p99 < 50.0 { "met" } else { "MISSED" },
        micros(percentile(&ca, 0.5)) / micros(percentile(&rr, 0.5)).max(1e-3)
    );
    Ok(())
}

async fn timed_post(c: &reqwest::Client, url: &str, body: &Value) -> Result<Duration> {
    let start = Instant::now();
    let resp = c
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| RouterError::Upstream {
            url: url.to_string(),
            message: e.to_string(),
        })?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| RouterError::Upstream {
        url: url.to_string(),
        message: e.to_string(),
    })?;
    if !status.is_success() {
        return Err(RouterError::Upstream {
            url: url.to_string(),
            message: format!("{status}: {}", String::from_utf8_lossy(&bytes)),
        });
    }
    Ok(start.elapsed())
}

fn bench_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .build()
        .map_err(|e| RouterError::Config(format!("HTTP client: {e}")))
}

async fn start_router(
    policy: PolicyKind,
    urls: Vec<String>,
) -> Result<sgl_router::launch::RunningRouter> {
    let config = RouterConfig {
        port: 0,
        policy,
        worker_urls: urls,
        log_level: "warn".into(),
        ..RouterConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    launch(config, listener).await
}

async fn proxy(args: &BenchArgs) -> Result<()> {
    let worker = SimWorker::spawn(SimConfig {
        name: "direct".into(),
        ..SimConfig::default()
    })?;
    let router = start_router(PolicyKind::CacheAware, vec![worker.url()]).await?;
    let c = bench_client()?;
    let direct_url = format!("{}/generate", worker.url());
    let routed_url = format!("{}/generate", router.url());
    let body = json!({"text": "The quick brown fox jumps over the lazy dog.", "sampling_params": {"max_new_tokens": 4}});
    for _ in 0..200 {
        timed_post(&c, &direct_url, &body).await?;
        timed_post(&c, &routed_url, &body).await?;
    }
    let mut direct = Vec::with_capacity(args.proxy_requests);
    let mut routed = Vec::with_capacity(args.proxy_requests);
    // Interleaved, so both paths see the same machine conditions.
    for _ in 0..args.proxy_requests {
        direct.push(timed_post(&c, &direct_url, &body).await?);
        routed.push(timed_post(&c, &routed_url, &body).await?);
    }
    direct.sort();
    routed.sort();
    router.shutdown().await?;
    let (d50, r50) = (percentile(&direct, 0.5), percentile(&routed, 0.5));
    let added = r50.saturating_sub(d50);
    println!("== proxy overhead (non-streaming /generate, loopback, sequential)");
    println!(
        "workload: {} requests per path after 200 warm-up, simulated worker with no delay",
        args.proxy_requests
    );
    for (name, t) in [("direct", &direct), ("via router", &routed)] {
        println!(
            "{name:>12}: p50 {:8.1} us  p99 {:8.1} us",
            micros(percentile(t, 0.5)),
            micros(percentile(t, 0.99))
        );
    }
    println!(
        "peer: direct call -> added p50 {:.1} us (goal < 1000 us: {}), routed/direct p50 ratio {:.2}x",
        micros(added),
        if added < Duration::from_millis(1) {
            "met"
        } else {
            "MISSED"
        },
        r50.as_secs_f64() / d50.as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// One run of the workload: (wall time, prompt units, cached units).
async fn run_workload(
    router_url: &str,
    prompts: &[String],
    args: &BenchArgs,
) -> Result<(Duration, u64, u64)> {
    let c = bench_client()?;
    let url = format!("{router_url}/generate");
    let start = Instant::now();
    let results: Vec<Result<Value>> = futures::stream::iter(prompts.iter().map(|p| {
        let c = c.clone();
        let url = url.clone();
        let body = json!({"text": p, "sampling_params": {"max_new_tokens": args.max_new_tokens, "temperature": 0}});
        async move {
            let resp = c.post(&url).json(&body).send().await.map_err(|e| RouterError::Upstream {
                url: url.clone(),
                message: e.to_string(),
            })?;
            resp.json::<Value>().await.map_err(|e| RouterError::Upstream {
                url,
                message: e.to_string(),
            })
        }
    }))
    .buffer_unordered(args.concurrency.max(1))
    .collect()
    .await;
    let wall = start.elapsed();
    let (mut prompt, mut cached) = (0u64, 0u64);
    for r in results {
        let v = r?;
        let meta = &v["meta_info"];
        prompt += meta["prompt_tokens"].as_u64().unwrap_or(0);
        cached += meta["cached_tokens"].as_u64().unwrap_or(0);
    }
    Ok((wall, prompt, cached))
}

async fn workload(args: &BenchArgs) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let prefixes: Vec<String> = (0..args.groups)
        .map(|_| random_text(&mut rng, args.prefix_chars))
        .collect();
    let mut prompts: Vec<String> = (0..args.groups * args.per_group)
        .map(|i| {
            let n = rng.random_range(30..80);
            format!(
                "{} Question {i}: {}",
                prefixes[i % args.groups],
                random_text(&mut rng, n)
            )
        })
        .collect();
    prompts.shuffle(&mut rng);
    let real = !args.worker_urls.is_empty();
    let workers_desc = if real {
        format!("{} engines", args.worker_urls.len())
    } else {
        format!(
            "{} simulated workers (prefill {} us/uncached char, one prefill at a time, LRU cache of {} chars each)",
            args.sim_workers,
            args.prefill_us_per_char,
            sim_cache_chars(args)
        )
    };
    println!("== shared-prefix workload: cache_aware vs round_robin");
    println!(
        "workload: {} groups x {} requests, {}-char shared prefix, concurrency {}, {workers_desc}",
        args.groups, args.per_group, args.prefix_chars, args.concurrency
    );
    let mut outcomes = Vec::new();
    for policy in [PolicyKind::CacheAware, PolicyKind::RoundRobin] {
        // Fresh workers (or flushed engines) for each policy: both start cold.
        let sims: Vec<SimWorker> = if real {
            Vec::new()
        } else {
            (0..args.sim_workers)
                .map(|i| {
                    SimWorker::spawn(SimConfig {
                        name: format!("sim{i}"),
                        prefill_per_char: Duration::from_micros(args.prefill_us_per_char),
                        cache_chars: sim_cache_chars(args),
                        tokens: 1,
                        ..SimConfig::default()
                    })
                })
                .collect::<std::io::Result<_>>()?
        };
        let urls = if real {
            args.worker_urls.clone()
        } else {
            sims.iter().map(SimWorker::url).collect()
        };
        let router = start_router(policy, urls).await?;
        let c = bench_client()?;
        let _ = c.post(format!("{}/flush_cache", router.url())).send().await;
        let (wall, prompt, cached) = run_workload(&router.url(), &prompts, args).await?;
        let spread: Vec<u64> = router
            .state()
            .workers
            .all()
            .iter()
            .map(|w| w.processed())
            .collect();
        router.shutdown().await?;
        let hit = cached as f64 / prompt.max(1) as f64;
        let rps = prompts.len() as f64 / wall.as_secs_f64();
        println!(
            "{:>12}: {:6.2} s  {:7.1} req/s  cache hit rate {:5.1}%  requests per worker {spread:?}",
            policy.as_str(),
            wall.as_secs_f64(),
            rps,
            hit * 100.0
        );
        outcomes.push((rps, hit));
    }
    if let [(ca_rps, ca_hit), (rr_rps, rr_hit)] = outcomes[..] {
        println!(
            "peer: round_robin -> throughput ratio {:.2}x, hit rate {:.1}% vs {:.1}%",
            ca_rps / rr_rps.max(1e-9),
            ca_hit * 100.0,
            rr_hit * 100.0
        );
    }
    Ok(())
}

/// Each simulated cache holds its fair share of the groups with a quarter to spare, so
/// a partitioned workload fits and a spread one does not.
fn sim_cache_chars(args: &BenchArgs) -> usize {
    let share = args.groups.div_ceil(args.sim_workers.max(1));
    (share + share / 4 + 1) * (args.prefix_chars + 120)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_ranked_values() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn random_text_has_the_requested_length() {
        let mut rng = StdRng::seed_from_u64(1);
        for n in [0, 1, 50, 999] {
            assert_eq!(random_text(&mut rng, n).len(), n);
        }
    }
}
