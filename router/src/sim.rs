//! A simulated engine worker, for benchmarks and tests of the router.
//!
//! It serves the engine's routes with SGLang-shaped JSON and SSE, and models what matters
//! to a router: a prefix cache (a prompt costs time only for the characters it does not
//! share with a cached prompt, and prefill on one worker runs one request at a time),
//! fixed latency, a failure rate, health that can be switched off, token streams that can
//! be held at a gate, and sudden death (its runtime is dropped: every connection closes),
//! on demand or when a request carries a poison text (as an engine that crashes on one
//! request would).
//! Each response carries the header `x-sim-worker` with the worker's name.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// Behaviour of a simulated worker.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub name: String,
    /// Added to every generation request.
    pub latency: Duration,
    /// Prefill time per prompt character not found in the cache.
    pub prefill_per_char: Duration,
    /// Characters of prompts the cache keeps (least recently used go first); 0: no cache.
    pub cache_chars: usize,
    /// Fraction of generation requests answered with `failure_status` instead.
    pub failure_rate: f64,
    pub failure_status: u16,
    /// Tokens in each answer (one SSE event each when streaming).
    pub tokens: usize,
    /// Pause between streamed tokens.
    pub token_interval: Duration,
    /// A generation request whose prompt contains this text kills the worker while it
    /// handles it: every open connection closes, the request's included, before any answer.
    pub poison: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            name: "sim".into(),
            latency: Duration::ZERO,
            prefill_per_char: Duration::ZERO,
            cache_chars: 0,
            failure_rate: 0.0,
            failure_status: 503,
            tokens: 4,
            token_interval: Duration::ZERO,
            poison: None,
        }
    }
}

/// Counters and switches shared with the running worker.
pub struct SimState {
    config: SimConfig,
    healthy: AtomicBool,
    requests: AtomicU64,
    flushes: AtomicU64,
    prompt_chars: AtomicU64,
    cached_chars: AtomicU64,
    prompts: Mutex<Vec<String>>,
    cache: Mutex<VecDeque<String>>,
    /// Held while "computing" a prefill: one request at a time, like one accelerator.
    compute: tokio::sync::Mutex<()>,
    gate_enabled: AtomicBool,
    gate: Semaphore,
    /// Stops the worker's runtime (a clone of the owner's `kill` switch).
    die: Mutex<Option<std::sync::mpsc::Sender<()>>>,
}

fn lcp_chars(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

impl SimState {
    /// Looks `prompt` up in the cache, inserts it, returns the cached characters.
    fn cache_lookup(&self, prompt: &str) -> usize {
        if self.config.cache_chars == 0 {
            return 0;
        }
        let mut cache = self.cache.lock();
        let best = cache
            .iter()
            .enumerate()
            .map(|(i, p)| (lcp_chars(p, prompt), i))
            .max();
        let cached = best.map_or(0, |(n, _)| n);
        if let Some((n, i)) = best
            && n > 0
            && let Some(hit) = cache.remove(i)
        {
            // A radix cache stores a shared prefix once: a prompt that extends most of a
            // cached one takes its place; one sharing less keeps it alive beside itself.
            if n * 2 < hit.chars().count() {
                cache.push_front(hit);
            }
        }
        cache.push_front(prompt.to_string());
        let mut total: usize = cache.iter().map(|p| p.chars().count()).sum();
        while total > self.config.cache_chars {
            match cache.pop_back() {
                Some(p) => total -= p.chars().count(),
                None => break,
            }
        }
        cached
    }
}

/// A simulated worker serving on its own runtime and thread.
pub struct SimWorker {
    addr: SocketAddr,
    state: Arc<SimState>,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimWorker {
    /// Serves on `listener` (bind it to port 0 for a free port).
    pub fn start(config: SimConfig, listener: std::net::TcpListener) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let state = Arc::new(SimState {
            config,
            healthy: AtomicBool::new(true),
            requests: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            prompt_chars: AtomicU64::new(0),
            cached_chars: AtomicU64::new(0),
            prompts: Mutex::new(Vec::new()),
            cache: Mutex::new(VecDeque::new()),
            compute: tokio::sync::Mutex::new(()),
            gate_enabled: AtomicBool::new(false),
            gate: Semaphore::new(0),
            die: Mutex::new(Some(stop_tx.clone())),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let app = app(state.clone());
        let thread = std::thread::spawn(move || {
            let serving = runtime.spawn(async move {
                if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                    let _ = axum::serve(listener, app).await;
                }
            });
            // Waits for `kill` or the owner's drop.
            let _ = stop_rx.recv();
            serving.abort();
            // Dropping every task closes every connection at once: a sudden death.
            runtime.shutdown_background();
        });
        Ok(Self {
            addr,
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Binds a loopback port and starts.
    pub fn spawn(config: SimConfig) -> std::io::Result<Self> {
        Self::start(config, std::net::TcpListener::bind("127.0.0.1:0")?)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn name(&self) -> &str {
        &self.state.config.name
    }

    /// Stops at once: open connections are closed mid-response, new ones are refused.
    pub fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Holds every token after the first of each answer until `release` lets it through.
    pub fn hold_streams(&self) {
        self.state.gate_enabled.store(true, Ordering::Relaxed);
    }

    /// Lets `n` held tokens through.
    pub fn release(&self, n: usize) {
        self.state.gate.add_permits(n);
    }

    /// Generation requests received (failed ones included).
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// Prompts of the generation requests received, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.state.prompts.lock().clone()
    }

    pub fn flushes(&self) -> u64 {
        self.state.flushes.load(Ordering::Relaxed)
    }

    /// (prompt characters served, of which found in the cache).
    pub fn cache_stats(&self) -> (u64, u64) {
        (
            self.state.prompt_chars.load(Ordering::Relaxed),
            self.state.cached_chars.load(Ordering::Relaxed),
        )
    }
}

impl Drop for SimWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn app(state: Arc<SimState>) -> Router {
    let name = HeaderValue::from_str(&state.config.name).unwrap_or(HeaderValue::from_static("sim"));
    Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .route("/generate", post(generate))
        .route("/v1/completions", post(openai))
        .route("/v1/chat/completions", post(openai))
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/parse_function_call", post(parse_function_call))
        .route("/function_call", post(parse_function_call))
        .route("/get_model_info", get(model_info))
        .route("/get_server_info", get(server_info))
        .route("/flush_cache", post(flush_cache))
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let name = name.clone();
            async move {
                r.headers_mut().insert("x-sim-worker", name);
                r
            }
        }))
        .with_state(state)
}

async fn health(State(s): State<Arc<SimState>>) -> StatusCode {
    if s.healthy.load(Ordering::Relaxed) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(s): State<Arc<SimState>>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": "sim-model", "object": "model", "owned_by": s.config.name}]}),
    )
}

async fn model(State(s): State<Arc<SimState>>, Path(id): Path<String>) -> Response {
    if id != "sim-model" {
        let msg = format!("the model `{id}` does not exist");
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"object": "error", "error": {"message": msg, "code": 404}})),
        )
            .into_response();
    }
    Json(json!({"id": "sim-model", "object": "model", "owned_by": s.config.name})).into_response()
}

/// Echoes the text back as normal text, with no calls.
async fn parse_function_call(Json(body): Json<Value>) -> Json<Value> {
    Json(json!({"normal_text": body.get("text").cloned().unwrap_or(Value::Null), "calls": []}))
}

async fn model_info() -> Json<Value> {
    Json(json!({"model_path": "sim-model", "tokenizer_path": "sim-model", "is_generation": true}))
}

async fn server_info(State(s): State<Arc<SimState>>) -> Json<Value> {
    Json(json!({"worker": s.config.name, "version": "sim"}))
}

async fn flush_cache(State(s): State<Arc<SimState>>) -> &'static str {
    s.flushes.fetch_add(1, Ordering::Relaxed);
    s.cache.lock().clear();
    "Cache flushed.\n"
}

/// The prompt of a request as the router sees it, without validation.
fn prompt_of(body: &Value) -> String {
    let field = ["text", "prompt", "input_ids"]
        .iter()
        .find_map(|k| body.get(*k));
    match (field, body.get("messages")) {
        (Some(Value::String(s)), _) => s.clone(),
        (Some(v), _) => v.to_string(),
        (None, Some(m)) => m.to_string(),
        (None, None) => String::new(),
    }
}

/// Records the request, applies failures and simulated prefill; returns the cached chars.
async fn admit(s: &SimState, prompt: &str) -> Result<usize, Response> {
    s.requests.fetch_add(1, Ordering::Relaxed);
    s.prompts.lock().push(prompt.to_string());
    if s.config
        .poison
        .as_deref()
        .is_some_and(|p| prompt.contains(p))
    {
        if let Some(die) = s.die.lock().take() {
            let _ = die.send(());
        }
        // The runtime is going away with this task in it; no answer is ever sent.
        std::future::pending::<()>().await;
    }
    if s.config.failure_rate > 0.0 && rand::rng().random_bool(s.config.failure_rate.min(1.0)) {
        let status = StatusCode::from_u16(s.config.failure_status)
            .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return Err((
            status,
            Json(json!({"error": {"message": "simulated failure"}})),
        )
            .into_response());
    }
    let total = prompt.chars().count();
    let cached = s.cache_lookup(prompt);
    s.prompt_chars.fetch_add(total as u64, Ordering::Relaxed);
    s.cached_chars.fetch_add(cached as u64, Ordering::Relaxed);
    let prefill = s.config.prefill_per_char * (total - cached) as u32;
    if !prefill.is_zero() {
        let _busy = s.compute.lock().await;
        tokio::time::sleep(prefill).await;
    }
    if !s.config.latency.is_zero() {
        tokio::time::sleep(s.config.latency).await;
    }
    Ok(cached)
}

fn sse(events: impl futures::Stream<Item = String> + Send + 'static) -> Response {
    use futures::StreamExt;
    let body = Body::from_stream(
        events.map(|e| Ok::<_, std::convert::Infallible>(format!("data: {e}\n\n"))),
    );
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The token stream of one answer; tokens after the first wait at the gate when it is on.
fn tokens(s: Arc<SimState>) -> impl futures::Stream<Item = (usize, String)> + Send + 'static {
    futures::stream::unfold(0usize, move |i| {
        let s = s.clone();
        async move {
            if i >= s.config.tokens {
                return None;
            }
            if i > 0 {
                if s.gate_enabled.load(Ordering::Relaxed)
                    && let Ok(p) = s.gate.acquire().await
                {
                    p.forget();
                }
                if !s.config.token_interval.is_zero() {
                    tokio::time::sleep(s.config.token_interval).await;
                }
            }
            Some(((i, format!("tok{i} ")), i + 1))
        }
    })
}

async fn generate(State(s): State<Arc<SimState>>, Json(body): Json<Value>) -> Response {
    let prompt = prompt_of(&body);
    let cached = match admit(&s, &prompt).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let n = s.config.tokens;
    let meta = move |done: usize| {
        json!({"id": "sim", "prompt_tokens": prompt.chars().count(), "completion_tokens": done,
               "cached_tokens": cached, "finish_reason": {"type": "length", "length": n}})
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        use futures::StreamExt;
        let mut text = String::new();
        let events = tokens(s.clone())
            .map(move |(i, t)| {
                text.push_str(&t);
                json!({"text": text, "meta_info": meta(i + 1)}).to_string()
            })
            .chain(futures::stream::once(async { "[DONE]".to_string() }));
        return sse(events);
    }
    use futures::StreamExt;
    let text: String = tokens(s.clone())
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .await
        .concat();
    Json(json!({"text": text, "meta_info": meta(n)})).into_response()
}

async fn openai(State(s): State<Arc<SimState>>, Json(body): Json<Value>) -> Response {
    use futures::StreamExt;
    let prompt = prompt_of(&body);
    let chat = body.get("messages").is_some();
    let cached = match admit(&s, &prompt).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let usage = json!({"prompt_tokens": prompt.chars().count(), "completion_tokens": s.config.tokens,
                       "prompt_tokens_details": {"cached_tokens": cached}});
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        let events = tokens(s.clone())
            .map(move |(_, t)| {
                let choice = if chat {
                    json!({"index": 0, "delta": {"content": t}, "finish_reason": null})
                } else {
                    json!({"index": 0, "text": t, "finish_reason": null})
                };
                json!({"id": "sim", "object": "chunk", "model": "sim-model", "choices": [choice]})
                    .to_string()
            })
            .chain(futures::stream::once(async { "[DONE]".to_string() }));
        return sse(events);
    }
    let text: String = tokens(s.clone())
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .await
        .concat();
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
    } else {
        json!({"index": 0, "text": text, "finish_reason": "length"})
    };
    Json(
        json!({"id": "sim", "object": if chat { "chat.completion" } else { "text_completion" },
                "model": "sim-model", "choices": [choice], "usage": usage}),
    )
    .into_response()
}
