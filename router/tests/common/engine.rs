//! A real engine: the `sgl-engine` release binary on the default model, as a child process of
//! the workspace's one harness (`sgl-test-harness`).

use std::process::Command;
use std::time::Duration;

use sgl_test_harness::{Server, default_model, log_path, release_binary};

/// A running `sgl-engine serve`, killed when dropped.
pub struct Engine {
    process: Server,
    pub url: String,
}

impl Engine {
    /// On a free loopback port.
    pub fn start() -> Engine {
        Self::start_on(0)
    }

    /// On loopback port `port` (0: a free one). Returns once the engine is listening.
    pub fn start_on(port: u16) -> Engine {
        Self::start_with(port, &[])
    }

    /// On loopback port `port` (0: a free one), with more engine flags.
    pub fn start_with(port: u16, extra: &[&str]) -> Engine {
        let binary = release_binary("sgl-engine").unwrap_or_else(|e| panic!("{e}"));
        let model = default_model().unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = Command::new(binary);
        cmd.arg("serve")
            .arg("--model-path")
            .arg(model)
            .args(["--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--num-threads", "1"])
            .args(extra);
        let process = Server::start(
            "sgl-engine",
            cmd,
            "listening on ",
            Duration::from_secs(300),
            log_path("router-test-engine"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Engine {
            url: process.url().to_string(),
            process,
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.process.port().expect("the engine's URL has a port")
    }

    /// Freezes the process (SIGSTOP): its socket still accepts connections, nothing answers.
    pub fn freeze(&self) {
        self.process
            .signal("STOP")
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Lets a frozen process run again (SIGCONT).
    pub fn thaw(&self) {
        self.process
            .signal("CONT")
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Kills the process (SIGKILL, frozen or not) and reaps it: its port refuses connections.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}
