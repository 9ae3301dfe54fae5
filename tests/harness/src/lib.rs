//! The one child-process server harness of the integration tests (`engine/tests`,
//! `router/tests`, `tests/tests`): start a binary of the workspace, wait for the line on its
//! stdout that says where it listens, keep everything it writes in a log file, and make sure
//! it dies with the test.
//!
//! - [`Server::start`] runs a prepared [`Command`] (the caller sets the binary, the flags and
//!   the environment), waits up to a deadline for a stdout line containing the marker
//!   (`listening on `) and takes the rest of that line as the server's URL. stderr, and every
//!   stdout line marked `[stdout]`, go to the log file, so the server never blocks on a full
//!   pipe and a failing test can show what the server said.
//! - A server is killed (SIGKILL) and reaped when dropped. A server kept in a `static` is
//!   never dropped: a watchdog process (`sh`, reading our end of a pipe) sends it SIGTERM, then
//!   SIGKILL, once the test process exits, however it exits.
//! - [`Server::signal`] sends any signal (`STOP` and `CONT` freeze and thaw a server whose
//!   socket keeps accepting).
//!
//! Binaries come from `cargo build --release` ([`release_binary`]) or, in a crate's own
//! integration tests, from `env!("CARGO_BIN_EXE_<name>")`; the model from [`default_model`].

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// The workspace root (this crate lives in `<root>/tests/harness`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .unwrap_or(manifest)
        .to_path_buf()
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

/// The test model: `$SGL_TEST_MODEL`, or the default model's GGUF file that
/// `scripts/fetch-model.sh` fetches once and prints.
pub fn default_model() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("SGL_TEST_MODEL") {
        return Ok(PathBuf::from(p));
    }
    let script = workspace_root().join("scripts").join("fetch-model.sh");
    let out = Command::new("bash")
        .arg(&script)
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

/// A fresh log file path for a server named `name`, under the build's `target/tmp`.
pub fn log_path(name: &str) -> PathBuf {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("tmp");
    let _ = std::fs::create_dir_all(&dir);
    dir.join(format!(
        "sgl-{name}-{}-{}.log",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The last 4000 bytes of a file (on a character boundary).
fn file_tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let start = s.len().saturating_sub(4000);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

/// A server running as a child process; killed and reaped when dropped.
pub struct Server {
    name: String,
    child: Child,
    /// Closing this pipe (our process exiting) makes the watchdog kill the server.
    _watchdog_pipe: ChildStdin,
    watchdog: Child,
    url: String,
    log: PathBuf,
}

impl Server {
    /// Starts `cmd` with its output going to the file `log`, and waits up to `wait` for a
    /// stdout line containing `marker`; the rest of that line (trimmed, without a trailing
    /// `/`) is the server's URL. On failure the process is killed and the error carries the
    /// end of its log.
    pub fn start(
        name: &str,
        mut cmd: Command,
        marker: &str,
        wait: Duration,
        log: PathBuf,
    ) -> Result<Server, String> {
        let log_file =
            File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let stderr = log_file
            .try_clone()
            .map_err(|e| format!("cannot share {}: {e}", log.display()))?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        let pid = child.id();
        let mut watchdog = match Command::new("sh")
            .arg("-c")
            .arg(format!(
                "read _ignored; kill -TERM {pid} 2>/dev/null; sleep 5; kill -KILL {pid} 2>/dev/null"
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(w) => w,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("cannot start the watchdog of {name}: {e}"));
            }
        };
        let (Some(pipe), Some(stdout)) = (watchdog.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            return Err(format!("{name}: no pipe to the child process"));
        };
        // Read stdout on a thread: find the marker, and copy every line to the log so that
        // the server never blocks on a full pipe.
        let (tx, rx) = mpsc::channel();
        let wanted = marker.to_string();
        let mut copy = log_file;
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(copy, "[stdout] {line}");
                if let Some(pos) = line.find(wanted.as_str())
                    && let Some(t) = tx.take()
                {
                    let rest = line[pos + wanted.len()..].trim();
                    let _ = t.send(rest.trim_end_matches('/').to_string());
                }
            }
        });
        let mut server = Server {
            name: name.to_string(),
            child,
            _watchdog_pipe: pipe,
            watchdog,
            url: String::new(),
            log,
        };
        match rx.recv_timeout(wait) {
            Ok(url) => {
                server.url = url;
                Ok(server)
            }
            Err(_) => {
                let _ = server.child.kill();
                let status = server.child.wait().ok();
                Err(format!(
                    "{name} did not print `{marker}` within {wait:?} (exit status {status:?}); log {}:\n{}",
                    server.log.display(),
                    server.log_tail()
                ))
            }
        }
    }

    /// Where it listens, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port of its URL.
    pub fn port(&self) -> Option<u16> {
        self.url.rsplit(':').next()?.parse().ok()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file: stderr, and stdout lines marked `[stdout]`.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The whole log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The end of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        file_tail(&self.log)
    }

    /// Sends signal `name` (`STOP`, `CONT`, `TERM`, ...) to the process.
    pub fn signal(&self, name: &str) -> Result<(), String> {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{name} {} failed: {status}", self.child.id()))
        }
    }

    /// Kills the process at once (SIGKILL, frozen or not, no graceful shutdown) and reaps it:
    /// its port refuses connections afterwards.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}
