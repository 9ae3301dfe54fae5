//! SGLang's own Python frontend (`sglang.RuntimeEndpoint`: `gen`, `select`, `fork`, `regex`,
//! batches, streaming) and benchmark client (`sglang.bench_serving`) against the real server:
//! runs `engine/tests/python/test_sglang_frontend.py` and `test_bench_serving_client.py` with
//! the server's URL in the environment.
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

/// `bench_serving`'s streaming client at concurrency 16 counts no request as failed, also
/// while streams wait in the queue (one request runs at a time, held by a long one for 7 s)
/// past the keep-alive interval.
#[test]
fn bench_serving_client_at_concurrency_16() {
    assert!(
        python_has("sglang.bench_serving") || python_has("sglang"),
        "the `sglang` Python package is missing (see sglang_frontend_programs)"
    );
    let server = Server::start(
        "bench-serving",
        &["--max-running-requests", "1", "--num-threads", "1"],
    );
    run_python_tests("test_bench_serving_client.py", &server, &[]);
}
