//! The test side of the control plane: one cluster per test process, started on first use
//! by `tests/k8s/cluster.sh up` with the pod runner, stopped by the script's watchdog when
//! the process exits (passed, failed or killed), which then deletes its work folder
//! (`$TMPDIR/sgl-k8s-<pid>`; `SGL_K8S_KEEP_WORK=1` keeps it to read the logs). Tests take
//! [`Cluster::lock`] so they run one at a time on it (two cores).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::{default_model, release_binary, workspace_root};

/// Set to 1 (as `.ci/run` does) to make a missing control plane a failure instead of a skip.
pub const REQUIRED_ENV: &str = "SGL_K8S_REQUIRED";

/// A running test cluster.
#[derive(Debug)]
pub struct Cluster {
    pub work: PathBuf,
    pub kubeconfig: PathBuf,
    pub bin: PathBuf,
    pub model_dir: PathBuf,
}

static CLUSTER: OnceLock<Result<Option<Cluster>, String>> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::new(());

/// A deadline for waits: generous, since two cores run the whole cluster and the engines.
pub const WAIT: Duration = Duration::from_secs(180);

impl Cluster {
    /// The shared cluster with the lock that serializes the tests, or `None` (after printing
    /// why) when the control plane is not built and [`REQUIRED_ENV`] is not set.
    /// `runner` is the pod runner binary (`env!("CARGO_BIN_EXE_k8s-pod-runner")`).
    pub fn get(runner: &str) -> Option<(&'static Cluster, MutexGuard<'static, ()>)> {
        let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let cluster = CLUSTER.get_or_init(|| Self::start(Path::new(runner)));
        match cluster {
            Ok(Some(c)) => Some((c, guard)),
            Ok(None) => None,
            Err(e) => panic!("the test control plane did not start: {e}"),
        }
    }

    fn start(runner: &Path) -> Result<Option<Cluster>, String> {
        let root = workspace_root();
        let required = std::env::var(REQUIRED_ENV).is_ok_and(|v| v == "1");
        let check = Command::new(root.join("tests/k8s/build.sh"))
            .arg("--check")
            .output()
            .map_err(|e| format!("cannot run tests/k8s/build.sh: {e}"))?;
        if !check.status.success() {
            let why = String::from_utf8_lossy(&check.stderr).trim().to_string();
            if required {
                return Err(format!(
                    "{REQUIRED_ENV}=1 but the control plane is missing: {why}"
                ));
            }
            eprintln!(
                "SKIPPED: the Kubernetes control plane is not built ({why}); \
                 run tests/k8s/build.sh (or set {REQUIRED_ENV}=1 to fail instead)"
            );
            return Ok(None);
        }
        for b in ["sgl-engine", "sgl-router", "sgl-operator"] {
            release_binary(b)?;
        }
        let bin = PathBuf::from(String::from_utf8_lossy(&check.stdout).trim());
        let model = default_model()?;
        let model_dir = model
            .parent()
            .ok_or_else(|| format!("{} has no folder", model.display()))?
            .to_path_buf();
        sweep_stale_work(&std::env::temp_dir());
        let work = std::env::temp_dir().join(format!("sgl-k8s-{}", std::process::id()));
        let started = Instant::now();
        let out = Command::new(root.join("tests/k8s/cluster.sh"))
            .arg("up")
            .arg("--work")
            .arg(&work)
            .arg("--owner-pid")
            .arg(std::process::id().to_string())
            .arg("--remove-work")
            .arg("--runner")
            .arg(runner)
            .arg("--")
            .arg("--work-dir")
            .arg(work.join("pods"))
            .arg("--bin-dir")
            .arg(root.join("target/release"))
            .arg("--map-path")
            .arg(format!("/models={}", model_dir.display()))
            .output()
            .map_err(|e| format!("cannot run tests/k8s/cluster.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cluster.sh up failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        eprintln!(
            "test control plane up in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            work.display()
        );
        Ok(Some(Cluster {
            kubeconfig: work.join("admin.kubeconfig"),
            work,
            bin,
            model_dir,
        }))
    }

    /// An admin client (create it in each test: a client belongs to its tokio runtime).
    pub async fn client(&self) -> Result<Client, String> {
        let kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| e.to_string())?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        Client::try_from(config).map_err(|e| e.to_string())
    }

    fn tool(&self, name: &str, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut cmd = Command::new(self.bin.join(name));
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.work.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.work.join("helm/config"))
            .env("HELM_DATA_HOME", self.work.join("helm/data"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            });
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!("cannot run {name}: {e}"),
        };
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let _ = pipe.write_all(input.as_bytes());
        }
        match child.wait_with_output() {
            Ok(o) => o,
            Err(e) => panic!("{name} {args:?}: {e}"),
        }
    }

    /// Runs kubectl; returns its output whatever the status.
    pub fn kubectl_raw(&self, args: &[&str], stdin: Option<&str>) -> Output {
        self.tool("kubectl", args, stdin)
    }

    /// Runs kubectl and panics with its stderr when it fails; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        checked("kubectl", args, self.kubectl_raw(args, None))
    }

    /// `kubectl apply -f -` of a YAML document.
    pub fn apply(&self, yaml: &str) -> String {
        let args = ["apply", "--server-side", "--field-manager=e2e", "-f", "-"];
        checked("kubectl", &args, self.kubectl_raw(&args, Some(yaml)))
    }

    /// Runs helm and returns its output whatever the status.
    pub fn helm_raw(&self, args: &[&str]) -> Output {
        self.tool("helm", args, None)
    }

    /// Runs helm and panics with its stderr when it fails; returns stdout.
    pub fn helm(&self, args: &[&str]) -> String {
        checked("helm", args, self.helm_raw(args))
    }

    /// The pod runner's and control plane's logs, for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let path = self.work.join("logs").join(format!("{name}.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The output of a pod's process, as the runner keeps it.
    pub fn pod_log(&self, namespace: &str, pod: &str) -> String {
        let dir = self.work.join("pods");
        let prefix = format!("{namespace}_{pod}_");
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    out.push_str(
                        &std::fs::read_to_string(e.path().join("container.log"))
                            .unwrap_or_default(),
                    );
                }
            }
        }
        out
    }
}

/// Deletes the work folders (`sgl-k8s-<pid>`) of test processes that are gone and left no
/// process running: those of runs before the watchdog deleted them, or whose watchdog was
/// killed. A folder with a live owner, or with a component still running (a watchdog that
/// is stopping it), is left alone.
fn sweep_stale_work(tmp: &Path) {
    let alive = |pid: &str| pid.parse::<u32>().is_ok() && Path::new("/proc").join(pid).exists();
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(owner) = name.strip_prefix("sgl-k8s-") else {
            continue;
        };
        if owner.parse::<u32>().is_err() || alive(owner) {
            continue;
        }
        let running = std::fs::read_dir(e.path().join("pids"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|f| std::fs::read_to_string(f.path()).is_ok_and(|pid| alive(pid.trim())));
        if running {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => eprintln!("removed {} (its test process is gone)", e.path().display()),
            Err(err) => eprintln!("could not remove {}: {err}", e.path().display()),
        }
    }
}

fn checked(name: &str, args: &[&str], out: Output) -> String {
    if !out.status.success() {
        panic!(
            "{name} {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` until it returns `Some`, or fails with `what` and the last state seen.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
