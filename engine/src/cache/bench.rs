//! Micro-benchmark of the radix cache on a serving-shaped workload (criterion, `harness = false`).
//!
//! Workload: requests made of one of 8 shared system prompts (1,024 tokens) plus 256 unique
//! tokens, each generating 128 tokens, through a 64k-slot pool (so eviction runs). Per request,
//! the scheduler's calls: `match_prefix`, `inc_lock_ref`, `alloc` (after `evict` when short),
//! `cache_unfinished_request` after prefill, `alloc` for the decoded tokens,
//! `cache_finished_request`.
//!
//! Peer: a lower bound, one pass over the request's data (copying its tokens and slots), which
//! any prefix cache must at least do. The ratio printed at the end is radix time / lower bound.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group};
use sgl_engine::cache::{KvPool, RadixCache};

const SYSTEM_PROMPTS: usize = 8;
const SYSTEM_LEN: usize = 1024;
const UNIQUE_LEN: usize = 256;
const OUTPUT_LEN: usize = 128;
const POOL_SLOTS: usize = 64 * 1024;

struct Workload {
    systems: Vec<Vec<u32>>,
    rng: u64,
}

impl Workload {
    fn new() -> Self {
        let mut w = Self {
            systems: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
        };
        w.systems = (0..SYSTEM_PROMPTS).map(|_| w.tokens(SYSTEM_LEN)).collect();
        w
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| (self.next() % 32_000) as u32).collect()
    }

    /// (prompt, output) of the next request.
    fn request(&mut self) -> (Vec<u32>, Vec<u32>) {
        let sys = (self.next() % SYSTEM_PROMPTS as u64) as usize;
        let mut prompt = self.systems[sys].clone();
        prompt.extend(self.tokens(UNIQUE_LEN));
        (prompt, self.tokens(OUTPUT_LEN))
    }
}

fn alloc(cache: &mut RadixCache, pool: &mut KvPool, n: usize) -> Vec<u32> {
    if pool.available() < n {
        cache.evict(n - pool.available(), pool);
    }
    pool.alloc(n).expect("pool larger than one request")
}

/// One request through the cache, as the scheduler drives it.
fn serve(cache: &mut RadixCache, pool: &mut KvPool, prompt: &[u32], output: &[u32]) {
    let m = cache.match_prefix(prompt);
    cache.inc_lock_ref(m.last_node);
    let mut slots = m.slots;
    slots.extend(alloc(cache, pool, prompt.len() - slots.len()));
    let m = cache
        .cache_unfinished_request(prompt, &slots, m.last_node, pool)
        .expect("consistent request");
    let mut slots = m.slots;
    slots.extend(alloc(cache, pool, output.len()));
    let tokens = [prompt, output].concat();
    cache
        .cache_finished_request(&tokens, &slots, m.last_node, pool)
        .expect("consistent request");
}

/// The lower bound: touch the request's tokens and slots once.
fn one_pass(prompt: &[u32], output: &[u32], slots: &[u32]) -> usize {
    let tokens = black_box([prompt, output].concat());
    let copy = black_box(slots.to_vec());
    tokens.len() + copy.len()
}

fn requests(n: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut w = Workload::new();
    (0..n).map(|_| w.request()).collect()
}

fn bench(c: &mut Criterion) {
    let reqs = requests(4096);
    let slots: Vec<u32> = (0..(SYSTEM_LEN + UNIQUE_LEN + OUTPUT_LEN) as u32).collect();
    let mut group = c.benchmark_group("radix_cache_request");
    group.bench_function("radix", |b| {
        let (mut cache, mut pool) = (RadixCache::new(false), KvPool::new(POOL_SLOTS));
        let mut i = 0;
        b.iter(|| {
            let (p, o) = &reqs[i % reqs.len()];
            serve(&mut cache, &mut pool, p, o);
            i += 1;
        });
    });
    group.bench_function("one_pass_lower_bound", |b| {
        let mut i = 0;
        b.iter(|| {
            let (p, o) = &reqs[i % reqs.len()];
            i += 1;
            one_pass(p, o, &slots)
        });
    });
    group.finish();
}

/// A plain timed run for the printed ratio (criterion's numbers are the detailed ones).
fn summary() {
    let reqs = requests(4096);
    let slots: Vec<u32> = (0..(SYSTEM_LEN + UNIQUE_LEN + OUTPUT_LEN) as u32).collect();
    let (mut cache, mut pool) = (RadixCache::new(false), KvPool::new(POOL_SLOTS));
    for (p, o) in &reqs[..512] {
        serve(&mut cache, &mut pool, p, o); // warm up to steady-state eviction
    }
    let start = Instant::now();
    for (p, o) in &reqs {
        serve(&mut cache, &mut pool, p, o);
    }
    let radix = start.elapsed().as_secs_f64() / reqs.len() as f64;
    let start = Instant::now();
    for (p, o) in &reqs {
        black_box(one_pass(p, o, &slots));
    }
    let floor = start.elapsed().as_secs_f64() / reqs.len() as f64;
    println!(
        "workload: {SYSTEM_PROMPTS} system prompts x {SYSTEM_LEN} tok + {UNIQUE_LEN} unique + \
         {OUTPUT_LEN} output, pool {POOL_SLOTS} slots, {} requests",
        reqs.len()
    );
    println!(
        "radix: {:.2} us/request ({:.1} ns/token); lower bound (one pass): {:.2} us/request; \
         ratio {:.1}x; tree {} tokens in {} nodes",
        radix * 1e6,
        radix * 1e9 / (SYSTEM_LEN + UNIQUE_LEN + OUTPUT_LEN) as f64,
        floor * 1e6,
        radix / floor,
        cache.total_size(),
        cache.node_count()
    );
}

criterion_group!(benches, bench);

fn main() {
    summary();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
