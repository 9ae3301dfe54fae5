//! SGLang's own Python frontend (`sglang.RuntimeEndpoint`: `gen`, `select`, `fork`, `regex`,
//! batches, streaming) against the real server: runs
//! `engine/tests/python/test_sglang_frontend.py` with the server's URL in the environment.
//!
//! Needs `python3` with `sglang==0.4.3` installed without dependencies plus its light imports
//! (scripts/test.sh installs them).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, python_has, run_python_tests};

#[test]
fn sglang_frontend_programs() {
    assert!(
        python_has("sglang"),
        "the `sglang` Python package is missing: python3 -m pip install --no-deps sglang==0.4.3 \
         and python3 -m pip install -r engine/tests/python/requirements-sglang.txt"
    );
    let server = Server::start("sglang-frontend", &[]);
    run_python_tests("test_sglang_frontend.py", &server, &[]);
}
