//! HTTP serving shared by the engine and the router.

pub mod listen;
