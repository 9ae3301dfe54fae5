//! sgl-core: the SGLang-compatible serving engine's core, with no web framework.
//!
//! Data flow: a caller (the HTTP server, `sgl-engine`, or a benchmark) hands a
//! [`request::GenerateRequest`] to the scheduler thread through an [`engine::EngineHandle`]
//! and reads back the tokens the scheduler sends. The scheduler ([`scheduler`]) owns the KV
//! pool and radix cache ([`cache`]) and the [`backend`], which runs the model ([`model`]).
//! [`engine::launch`] builds all of it from the server's flags ([`config::ServerArgs`]).
//! Errors are one [`error::EngineError`] that carries its HTTP status code as a number.

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
