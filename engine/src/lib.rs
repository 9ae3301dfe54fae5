//! sgl-engine: an SGLang-compatible LLM serving engine.
//!
//! Data flow: the HTTP layer ([`api`]) validates and tokenizes a request, hands it to the
//! scheduler thread through an [`engine::EngineHandle`], and streams back the tokens the
//! scheduler sends. The scheduler ([`scheduler`]) owns the KV pool and radix cache ([`cache`])
//! and the [`backend`], which runs the model ([`model`]).

pub mod api;
pub mod backend;
pub mod cache;
pub mod config;
pub mod engine;
pub mod error;
pub mod grammar;
pub mod metrics;
pub mod model;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod stop;
pub mod tokenizer;
pub mod tool_parser;
