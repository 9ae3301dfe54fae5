//! sgl-engine: the HTTP server of the SGLang-compatible serving engine.
//!
//! [`api`] serves SGLang's native routes and the OpenAI-compatible ones on axum: it validates
//! and tokenizes a request, hands it to the engine core (`sgl_core`) through an
//! [`EngineHandle`](sgl_core::engine::EngineHandle), and streams back the tokens the
//! scheduler sends. The core's errors get their one HTTP mapping here (`api/error.rs`). The
//! `sgl-engine` binary (`main.rs`) parses the flags, launches the core and serves [`api`].

pub mod api;
