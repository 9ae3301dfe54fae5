//! A real engine: the `sgl-engine` release binary on the default model, as a child process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The default model's GGUF file (fetched once by `scripts/fetch-model.sh`).
fn model_path() -> String {
    let out = Command::new("bash")
        .arg(workspace_root().join("scripts/fetch-model.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/fetch-model.sh");
    assert!(out.status.success(), "scripts/fetch-model.sh failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A running `sgl-engine serve`, killed when dropped.
pub struct Engine {
    child: Child,
    pub url: String,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.kill();
    }
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
        let binary = workspace_root().join("target/release/sgl-engine");
        assert!(
            binary.is_file(),
            "{} is missing: run `cargo build --release -p sgl-engine` first",
            binary.display()
        );
        let mut child = Command::new(&binary)
            .args([
                "serve",
                "--model-path",
                &model_path(),
                "--host",
                "127.0.0.1",
            ])
            .args(["--port", &port.to_string(), "--num-threads", "1"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sgl-engine");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.trim().strip_prefix("listening on ")
                    && let Some(t) = tx.take()
                {
                    let _ = t.send(rest.trim().trim_end_matches('/').to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("sgl-engine printed `listening on ...` within 300 s");
        Engine { child, url }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Freezes the process (SIGSTOP): its socket still accepts connections, nothing answers.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Lets a frozen process run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    /// Kills the process (SIGKILL, frozen or not) and reaps it: its port refuses connections.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
