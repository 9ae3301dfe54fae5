//! The official `openai` Python package against the real server:
//! runs `engine/tests/python/test_openai_client.py` (pytest when installed, else the script's
//! own runner) with the server's URL and key in the environment.
//!
//! Needs `python3` with the packages of `engine/tests/python/requirements.txt`
//! (`python3 -m pip install -r engine/tests/python/requirements.txt`).

#![allow(clippy::unwrap_used)]

mod common;

use common::{API_KEY, Server, python_has, run_python_tests};

#[test]
fn openai_python_client() {
    assert!(
        python_has("openai"),
        "the `openai` Python package is missing: python3 -m pip install -r engine/tests/python/requirements.txt"
    );
    let server = Server::start(
        "openai-client",
        &["--api-key", API_KEY, "--tool-call-parser", "qwen25"],
    )
    .with_key(API_KEY);
    run_python_tests(
        "test_openai_client.py",
        &server,
        &[("SGL_API_KEY", API_KEY)],
    );
}
