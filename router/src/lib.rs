//! sgl-router: a cache-aware load balancer in front of SGLang engine replicas.

pub mod error;
pub mod tree;

pub use error::RouterError;
