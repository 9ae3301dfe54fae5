//! End-to-end tests of the HTTP API: the real binary serving the real model, called over HTTP.
//!
//! Most tests share one server started with `--api-key --enable-metrics --enable-cache-report
//! --log-requests --tool-call-parser qwen25`; the `skip_tokenizer` tests share a second one
//! started with `--skip-tokenizer-init`, and the structured-output tests of the outlines
//! backend a third one started with `--grammar-backend outlines` (and no tool call parser).
//! Tests run in parallel against the shared server, so checks of global counters wait for the
//! server to be idle.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod errors;
mod lifecycle;
mod native;
mod openai;
mod overlap;
mod sampling;
mod structured;
mod tools;

use std::sync::OnceLock;

use common::{API_KEY, Server};
use serde_json::{Value, json};

pub fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        Server::start(
            "api",
            &[
                "--api-key",
                API_KEY,
                "--enable-metrics",
                "--enable-cache-report",
                "--log-requests",
                "--tool-call-parser",
                "qwen25",
            ],
        )
        .with_key(API_KEY)
    })
}

pub fn skip_tokenizer_server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| Server::start("skip-tokenizer", &["--skip-tokenizer-init"]))
}

pub fn outlines_server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| Server::start("outlines", &["--grammar-backend", "outlines"]))
}

pub async fn served_model(s: &Server) -> String {
    let (status, models) = s.get("/v1/models").await;
    assert_eq!(status, 200, "{models}");
    models["data"][0]["id"].as_str().unwrap().to_string()
}

pub async fn context_length(s: &Server) -> u64 {
    let (_, info) = s.get("/get_server_info").await;
    info["context_length"].as_u64().unwrap()
}

pub fn assert_error(status: u16, body: &Value, want_status: u16, want_text: &str, case: &str) {
    assert_eq!(status, want_status, "{case}: {body}");
    let msg = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: no error.message in {body}"));
    assert!(
        msg.to_lowercase().contains(&want_text.to_lowercase()),
        "{case}: message {msg:?} should mention {want_text:?}"
    );
    assert_eq!(
        body["error"]["code"].as_u64(),
        Some(want_status as u64),
        "{case}: {body}"
    );
}

pub fn greedy_chat(content: &str, max_tokens: u64) -> Value {
    json!({
        "model": "default",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}
