//! Helpers for the workspace end-to-end tests (in `tests/tests/`): the release binaries and
//! the default model, and the engine and the router started as child processes through the
//! workspace's one server harness (`sgl-test-harness`), killed when dropped.

use std::process::Command;
use std::time::Duration;

pub use sgl_test_harness::{Server, default_model, log_path, release_binary, workspace_root};

/// Starts an engine on the default model, on a free loopback port.
pub fn start_engine(name: &str, extra: &[&str]) -> Result<Server, String> {
    let model = default_model()?;
    let mut cmd = Command::new(release_binary("sgl-engine")?);
    cmd.arg("serve")
        .arg("--model-path")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(extra);
    Server::start(
        name,
        cmd,
        "listening on ",
        Duration::from_secs(300),
        log_path(name),
    )
}

/// Starts a router in front of `workers`, on a free loopback port.
pub fn start_router(workers: &[&Server], extra: &[&str]) -> Result<Server, String> {
    let mut cmd = Command::new(release_binary("sgl-router")?);
    cmd.args(["--host", "127.0.0.1", "--port", "0"]);
    if !workers.is_empty() {
        cmd.arg("--worker-urls")
            .args(workers.iter().map(|w| w.url()));
    }
    cmd.args(extra);
    Server::start(
        "router",
        cmd,
        "sgl-router listening on ",
        Duration::from_secs(60),
        log_path("router"),
    )
}

pub mod k8s;
