//! The official `openai` Python package against the real server:
//! runs `engine/tests/python/test_openai_client.py` (pytest when installed, else the script's
//! own runner) with the server's URL and key in the environment.
//!
//! Needs `python3` with the packages of `engine/tests/python/requirements.txt`
//! (`python3 -m pip install -r engine/tests/python/requirements.txt`).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{API_KEY, Server};

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_openai_client.py");
    let mut cmd = Command::new("python3");
    if python_has("pytest") {
        cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(&script);
    } else {
        cmd.arg(&script);
    }
    let out = cmd
        .env("SGL_BASE_URL", &server.base)
        .env("SGL_API_KEY", API_KEY)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python client tests failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log_tail()
    );
    println!("{stdout}");
}
