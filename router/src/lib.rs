//! sgl-router: a cache-aware load balancer in front of SGLang engine replicas.
//!
//! It speaks the engine's APIs (`/generate`, `/v1/chat/completions`, `/v1/completions`,
//! model and server info, health, `/flush_cache`) and sends each request to the replica
//! most likely to hold its prefix in cache (see [`policy::CacheAwarePolicy`]), without
//! overloading any. Workers come from `--worker-urls`, `POST /add_worker`, or Kubernetes
//! Pods ([`discovery`]); dead ones are found by health checks and circuit breakers, and
//! failed requests are retried elsewhere before any byte reaches the client. With no worker
//! available, requests wait in a bounded queue ([`queue`]): the router is the activator of a
//! service scaled to zero.
//!
//! The binary is a thin shell over [`launch::launch`], which tests and benchmarks (`sgl-bench
//! router`) use too.

pub mod app;
pub mod breaker;
pub mod config;
pub mod discovery;
pub mod error;
pub mod launch;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod queue;
pub mod request_text;
pub mod retry;
pub mod server;
pub mod sim;
pub mod tree;
pub mod usage;
pub mod worker;

pub use app::AppState;
pub use config::{PolicyKind, RouterConfig};
pub use error::RouterError;
pub use launch::{RunningRouter, launch};
