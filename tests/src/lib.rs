//! Helpers for the workspace end-to-end tests (in `tests/tests/`): locating the release
//! binaries and the default model, and running binaries as child processes that are killed
//! when dropped.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The workspace root (this crate lives in `<root>/tests`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// A binary of `cargo build --release --workspace`, or an error that says how to build it.
pub fn release_binary(name: &str) -> Result<PathBuf, String> {
    let path = workspace_root().join("target").join("release").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: run `cargo build --release --workspace --bins` first",
            path.display()
        ))
    }
}

/// The default model's GGUF file, fetched once by `scripts/fetch-model.sh`.
pub fn default_model() -> Result<PathBuf, String> {
    let script = workspace_root().join("scripts").join("fetch-model.sh");
    let out = Command::new(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.lines().last().unwrap_or("").trim();
    if path.is_empty() {
        return Err(format!("{} printed no path", script.display()));
    }
    Ok(PathBuf::from(path))
}

/// Keeps the last lines a child wrote to one of its pipes.
type LogTail = Arc<Mutex<VecDeque<String>>>;

const LOG_LINES: usize = 200;

fn drain<R: Read + Send + 'static>(
    pipe: R,
    tail: LogTail,
    found: Option<(String, mpsc::Sender<String>)>,
) {
    std::thread::spawn(move || {
        let mut found = found;
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if let Some((marker, tx)) = &found
                && let Some(pos) = line.find(marker.as_str())
            {
                let _ = tx.send(line[pos + marker.len()..].trim().to_string());
                found = None;
            }
            if let Ok(mut t) = tail.lock() {
                if t.len() == LOG_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }
    });
}

/// A child process serving HTTP; killed (SIGKILL) and reaped when dropped.
pub struct Server {
    name: String,
    child: Child,
    url: String,
    log: LogTail,
}

impl Server {
    /// Starts `binary args...` and waits until it prints `<marker><url>` on stdout.
    pub fn start(
        name: &str,
        binary: &Path,
        args: &[String],
        marker: &str,
        wait: Duration,
    ) -> Result<Self, String> {
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let log: LogTail = Arc::default();
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            drain(out, log.clone(), Some((marker.to_string(), tx)));
        }
        if let Some(err) = child.stderr.take() {
            drain(err, log.clone(), None);
        }
        let mut server = Self {
            name: name.to_string(),
            child,
            url: String::new(),
            log,
        };
        match rx.recv_timeout(wait) {
            Ok(url) => {
                server.url = url;
                Ok(server)
            }
            Err(_) => Err(format!(
                "{name} did not print `{marker}` within {wait:?}; its output:\n{}",
                server.log_tail()
            )),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The last lines the process wrote (stdout and stderr), for failure messages.
    pub fn log_tail(&self) -> String {
        self.log
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    /// Kills the process at once (no graceful shutdown) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts an engine on the default model, on a free loopback port.
pub fn start_engine(name: &str, extra: &[&str]) -> Result<Server, String> {
    let model = default_model()?;
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--model-path".into(),
        model.to_string_lossy().into_owned(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "0".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start(
        name,
        &release_binary("sgl-engine")?,
        &args,
        "listening on ",
        Duration::from_secs(300),
    )
}

/// Starts a router in front of `workers`, on a free loopback port.
pub fn start_router(workers: &[&Server], extra: &[&str]) -> Result<Server, String> {
    let mut args: Vec<String> = vec![
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "0".into(),
    ];
    if !workers.is_empty() {
        args.push("--worker-urls".into());
        args.extend(workers.iter().map(|w| w.url().to_string()));
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start(
        "router",
        &release_binary("sgl-router")?,
        &args,
        "sgl-router listening on ",
        Duration::from_secs(60),
    )
}

pub mod k8s;
