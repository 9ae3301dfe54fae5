//! SGLang's own Python frontend (`sglang.RuntimeEndpoint`: `gen`, `select`, `fork`, `regex`,
//! batches, streaming) against the real server: runs
//! `engine/tests/python/test_sglang_frontend.py` with the server's URL in the environment.
//!
//! Needs `python3` with `sglang==0.4.3` installed without dependencies plus its light imports
//! (scripts/test.sh installs them).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::Server;

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn sglang_frontend_programs() {
    assert!(
        python_has("sglang"),
        "the `sglang` Python package is missing: python3 -m pip install --no-deps sglang==0.4.3 \
         and python3 -m pip install -r engine/tests/python/requirements.txt"
    );
    let server = Server::start("sglang-frontend", &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_sglang_frontend.py");
    let mut cmd = Command::new("python3");
    if python_has("pytest") {
        cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(&script);
    } else {
        cmd.arg(&script);
    }
    let out = cmd
        .env("SGL_BASE_URL", &server.base)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sglang frontend tests failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log_tail()
    );
    println!("{stdout}");
}
