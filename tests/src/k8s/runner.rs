//! The pod runner: a small kubelet for the test control plane's kwok nodes.
//!
//! kwok nodes run no containers. For each pod bound to one of them whose image is one of our
//! own binaries (`sgl-engine`, `sgl-router`, `sgl-operator`), the runner starts the container's
//! command as a local process and owns the pod's status, as a kubelet would:
//!
//! - the pod gets an IP from its node's pod CIDR (in 127.0.0.0/8, so the process can bind it);
//!   `0.0.0.0` in the arguments (all interfaces of the pod) becomes that IP;
//! - the environment is the container's: plain values with `$(VAR)` expansion, Secret and
//!   ConfigMap keys, `envFrom`, and downward API fields; a missing key leaves the container
//!   waiting with `CreateContainerConfigError`, as the kubelet does;
//! - Secret, ConfigMap, downward API and emptyDir volumes are written to a per-pod folder and
//!   their mount paths are rewritten in the arguments and environment (a path the image
//!   would hold, such as `/models`, is mapped with `--map-path`);
//! - the pod's service account token (a bound TokenRequest) reaches the process through a
//!   kubeconfig in `KUBECONFIG`, so the process acts with the pod's own RBAC;
//! - PersistentVolumeClaims bound to a `hostPath` PersistentVolume mount that host folder, so
//!   every pod of the claim shares it;
//! - init containers run first, one after the other, each to completion (a failed one is
//!   restarted with the back-off, `Init:CrashLoopBackOff`), reported in
//!   `initContainerStatuses` while the pod is `Pending` and its containers `PodInitializing`;
//! - readiness comes from the container's own readiness probe (httpGet or tcpSocket),
//!   after its startup probe passed;
//! - a process that exits is reported `terminated` with its exit code and its termination
//!   message as the kubelet writes it: what the process wrote to its `terminationMessagePath`
//!   (a per-container file the path is mapped to), else, with `FallbackToLogsOnError` and a
//!   failure, the tail of its output; then restarted with the kubelet's back-off
//!   (restartPolicy Always);
//! - on deletion: the preStop hook, SIGTERM, SIGKILL after the grace period, then the pod
//!   object is removed.
//!
//! Pods of other images on kwok nodes are left to kwok (see `tests/k8s/kwok.yaml`).
//! Liveness probes are not run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, HTTPGetAction, Node, PersistentVolume, PersistentVolumeClaim,
    Pod, Probe, Secret, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::{Mutex, mpsc};

mod init;
mod setup;
mod stop;
pub use setup::{expand, rewrite_paths};

/// What the runner needs besides the cluster.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// Image name (last path segment, without tag) or command name → local executable.
    pub binaries: BTreeMap<String, PathBuf>,
    /// Paths the image would hold → local paths (prefix rewrite in args and env).
    pub path_map: Vec<(String, PathBuf)>,
    /// Per-pod folders (logs, volumes, kubeconfig).
    pub work_dir: PathBuf,
    /// The API server URL and CA file written into each pod's kubeconfig.
    pub server: String,
    pub ca_file: PathBuf,
}

impl RunnerConfig {
    fn binary_for_image(&self, image: &str) -> Option<&PathBuf> {
        let name = image.rsplit('/').next().unwrap_or(image);
        let name = name.split(['@', ':']).next().unwrap_or(name);
        self.binaries.get(name)
    }
}

/// Runs until the pod watch fails for good or `shutdown` fires; on return every process it
/// started has been stopped.
pub async fn run(
    client: Client,
    config: RunnerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let config = Arc::new(config);
    let nodes: Api<Node> = Api::all(client.clone());
    let mut cidrs = HashMap::new();
    for node in nodes
        .list(&ListParams::default().labels("type=kwok"))
        .await
        .context("listing kwok nodes")?
    {
        if let Some(cidr) = node.spec.as_ref().and_then(|s| s.pod_cidr.clone()) {
            cidrs.insert(node.name_any(), cidr);
        }
    }
    if cidrs.is_empty() {
        bail!("no node labelled type=kwok with a podCIDR");
    }
    tracing::info!(nodes = ?cidrs, "pod runner started");
    let ips = Arc::new(IpPool {
        cidrs,
        used: Mutex::new(HashSet::new()),
    });
    let pods: Api<Pod> = Api::all(client.clone());
    let mut stream = std::pin::pin!(watcher(pods, watcher::Config::default()));
    let mut workers: HashMap<String, mpsc::UnboundedSender<Option<Pod>>> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let event = tokio::select! {
            _ = &mut shutdown => break,
            event = stream.next() => event,
        };
        let event = match event {
            None => break,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "pod watch failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Some(Ok(event)) => event,
        };
        let (pod, gone) = match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, false),
            watcher::Event::Delete(p) => (p, true),
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let uid = pod.uid().unwrap_or_default();
        if let Some(tx) = workers.get(&uid) {
            if tx.send((!gone).then_some(pod)).is_err() || gone {
                workers.remove(&uid);
            }
            continue;
        }
        if gone || !ours(&config, &ips, &pod) {
            continue;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        workers.insert(uid, tx);
        let worker = PodWorker::new(client.clone(), config.clone(), ips.clone(), pod);
        tasks.spawn(worker.run(rx));
        workers.retain(|_, tx| !tx.is_closed());
    }
    // Dropping the senders tells each worker that the runner stops: it kills its process.
    for tx in workers.values() {
        let _ = tx.send(None);
    }
    drop(workers);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

fn ours(config: &RunnerConfig, ips: &IpPool, pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let on_kwok = spec
        .node_name
        .as_ref()
        .is_some_and(|n| ips.cidrs.contains_key(n));
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    on_kwok
        && !finished
        && spec.containers.iter().any(|c| {
            c.image
                .as_deref()
                .is_some_and(|i| config.binary_for_image(i).is_some())
        })
}

/// Pod IPs from the kwok nodes' CIDRs, handed out from the top of each range down (kwok
/// hands out its own pods' IPs from the bottom up).
struct IpPool {
    cidrs: HashMap<String, String>,
    used: Mutex<HashSet<Ipv4Addr>>,
}

impl IpPool {
    async fn allocate(&self, node: &str, taken: &HashSet<Ipv4Addr>) -> Result<Ipv4Addr> {
        let cidr = self
            .cidrs
            .get(node)
            .ok_or_else(|| anyhow!("node {node} has no pod CIDR"))?;
        let (base, bits) = cidr
            .split_once('/')
            .ok_or_else(|| anyhow!("bad CIDR {cidr}"))?;
        let base: Ipv4Addr = base.parse().with_context(|| format!("bad CIDR {cidr}"))?;
        let bits: u32 = bits.parse().with_context(|| format!("bad CIDR {cidr}"))?;
        let size = 1u32 << (32 - bits.min(30));
        let mut used = self.used.lock().await;
        for offset in (2..size - 1).rev() {
            let ip = Ipv4Addr::from(u32::from(base) + offset);
            if !used.contains(&ip) && !taken.contains(&ip) {
                used.insert(ip);
                return Ok(ip);
            }
        }
        bail!("pod CIDR {cidr} of node {node} is full")
    }

    async fn release(&self, ip: Ipv4Addr) {
        self.used.lock().await.remove(&ip);
    }
}

/// The container's state as the runner reports it.
#[derive(Clone, Debug, PartialEq)]
enum State {
    Waiting { reason: String, message: String },
    Running { started: String },
}

struct PodWorker {
    client: Client,
    config: Arc<RunnerConfig>,
    ips: Arc<IpPool>,
    pod: Pod,
    name: String,
    namespace: String,
    dir: PathBuf,
    ip: Option<Ipv4Addr>,
    restarts: i32,
    last_terminated: Option<Value>,
    state: State,
    /// `initContainerStatuses`, in the pod's order, as reported.
    init_statuses: Vec<Value>,
    /// Every init container has completed.
    initialized: bool,
    ready: bool,
    started_ok: bool,
    start_time: String,
}

fn now() -> String {
    Timestamp::now().to_string()
}

impl PodWorker {
    fn new(client: Client, config: Arc<RunnerConfig>, ips: Arc<IpPool>, pod: Pod) -> Self {
        let name = pod.name_any();
        let namespace = pod.namespace().unwrap_or_else(|| "default".into());
        let dir = config.work_dir.join(format!(
            "{namespace}_{name}_{}",
            pod.uid().unwrap_or_default()
        ));
        Self {
            client,
            config,
            ips,
            pod,
            name,
            namespace,
            dir,
            ip: None,
            restarts: 0,
            last_terminated: None,
            init_statuses: Vec::new(),
            initialized: false,
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            },
            ready: false,
            started_ok: false,
            start_time: now(),
        }
    }

    /// The pod's Ready condition as the API holds it, when it has one.
    fn api_ready(&self) -> Option<bool> {
        let conditions = self.pod.status.as_ref()?.conditions.as_ref()?;
        let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
        Some(ready.status == "True")
    }

    fn container(&self) -> Option<&Container> {
        let spec = self.pod.spec.as_ref()?;
        spec.containers.iter().find(|c| {
            c.image
                .as_deref()
                .is_some_and(|i| self.config.binary_for_image(i).is_some())
        })
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn run(mut self, mut updates: mpsc::UnboundedReceiver<Option<Pod>>) {
        if let Err(e) = tokio::fs::create_dir_all(&self.dir).await {
            tracing::error!(pod = %self.name, error = %e, "cannot create the pod folder");
            return;
        }
        match self.assign_ip().await {
            Ok(ip) => self.ip = Some(ip),
            Err(e) => {
                tracing::error!(pod = %self.name, error = %e, "no pod IP");
                return;
            }
        }
        if !self.run_init_containers(&mut updates).await {
            self.finish(None).await;
            return;
        }
        let mut backoff = Duration::from_secs(10);
        loop {
            if self.deleting() {
                self.finish(None).await;
                return;
            }
            let Some(main) = self.container().cloned() else {
                return;
            };
            let child = match self.prepare_and_spawn(&main, MAIN_LOG).await {
                Ok(child) => child,
                Err(e) => {
                    tracing::warn!(pod = %self.name, error = format!("{e:#}"), "container not started");
                    self.state = State::Waiting {
                        reason: "CreateContainerConfigError".into(),
                        message: format!("{e:#}"),
                    };
                    self.report().await;
                    if !self
                        .wait_or_update(&mut updates, Duration::from_secs(3))
                        .await
                    {
                        self.finish(None).await;
                        return;
                    }
                    continue;
                }
            };
            self.state = State::Running { started: now() };
            self.ready = false;
            self.started_ok = false;
            self.report().await;
            match self.supervise(child, &mut updates).await {
                Outcome::Stopped => return,
                Outcome::Exited(status) => {
                    let code = exit_code(status);
                    let message = self.termination_message(&main, MAIN_LOG, code).await;
                    tracing::warn!(pod = %self.name, code, "container exited");
                    let started = match &self.state {
                        State::Running { started } => started.clone(),
                        State::Waiting { .. } => now(),
                    };
                    self.last_terminated = Some(json!({
                        "exitCode": code,
                        "reason": if code == 0 { "Completed" } else { "Error" },
                        "message": message,
                        "startedAt": started,
                        "finishedAt": now(),
                    }));
                    self.restarts += 1;
                    self.ready = false;
                    self.state = State::Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: format!(
                            "back-off {}s restarting failed container={} pod={}_{}",
                            backoff.as_secs(),
                            self.container().map(|c| c.name.as_str()).unwrap_or(""),
                            self.name,
                            self.namespace
                        ),
                    };
                    self.report().await;
                    if !self.wait_or_update(&mut updates, backoff).await {
                        self.finish(None).await;
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(300));
                }
            }
        }
    }

    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }

    /// Waits `delay` while taking pod updates; false when the pod is going away.
    async fn wait_or_update(
        &mut self,
        updates: &mut mpsc::UnboundedReceiver<Option<Pod>>,
        delay: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + delay;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return true,
                update = updates.recv() => match update {
                    Some(Some(pod)) => {
                        self.pod = pod;
                        if self.deleting() {
                            return false;
                        }
                    }
                    _ => return false,
                },
            }
        }
    }

    async fn assign_ip(&self) -> Result<Ipv4Addr> {
        if let Some(ip) = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok())
        {
            self.ips.used.lock().await.insert(ip);
            return Ok(ip);
        }
        let node = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let all: Api<Pod> = Api::all(self.client.clone());
        let taken: HashSet<Ipv4Addr> = all
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?
            .items
            .iter()
            .filter_map(|p| p.status.as_ref()?.pod_ip.as_deref()?.parse().ok())
            .collect();
        self.ips.allocate(&node, &taken).await
    }

    /// Writes the pod's status as the kubelet would from what the worker knows.
    async fn report(&self) {
        let Some(container) = self.container() else {
            return;
        };
        let ip = self.ip.map(|ip| ip.to_string());
        let ready = self.ready && matches!(self.state, State::Running { .. });
        let state = match &self.state {
            _ if !self.initialized => json!({"waiting": {"reason": "PodInitializing"}}),
            State::Waiting { reason, message } => {
                json!({"waiting": {"reason": reason, "message": message}})
            }
            State::Running { started } => json!({"running": {"startedAt": started}}),
        };
        let mut status_entry = json!({
            "name": container.name,
            "image": container.image,
            "imageID": "",
            "ready": ready,
            "started": matches!(self.state, State::Running { .. }),
            "restartCount": self.restarts,
            "state": state,
        });
        if let Some(t) = &self.last_terminated {
            status_entry["lastState"] = json!({"terminated": t});
        }
        let ts = now();
        let flag = |b: bool| if b { "True" } else { "False" };
        let mut conditions: Vec<Value> = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .filter(|c| {
                        !matches!(
                            c.type_.as_str(),
                            "Ready"
                                | "ContainersReady"
                                | "Initialized"
                                | "PodReadyToStartContainers"
                        )
                    })
                    .filter_map(|c| serde_json::to_value(c).ok())
                    .collect()
            })
            .unwrap_or_default();
        let old = |t: &str| {
            self.pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == t))
                .map(|c| (c.status.clone(), c.last_transition_time.clone()))
        };
        for (t, value) in [
            ("PodReadyToStartContainers", true),
            ("Initialized", self.initialized),
            ("ContainersReady", ready),
            ("Ready", ready),
        ] {
            let since = match old(t) {
                Some((s, Some(time))) if s == flag(value) => time.0.to_string(),
                _ => ts.clone(),
            };
            let mut c = json!({"type": t, "status": flag(value), "lastTransitionTime": since});
            if t == "Initialized" && !value {
                let pending: Vec<&str> = self
                    .init_statuses
                    .iter()
                    .filter(|s| s["state"].get("terminated").is_none())
                    .filter_map(|s| s["name"].as_str())
                    .collect();
                c["reason"] = "ContainersNotInitialized".into();
                c["message"] =
                    format!("containers with incomplete status: [{}]", pending.join(" ")).into();
            } else if !value {
                c["reason"] = "ContainersNotReady".into();
                c["message"] =
                    format!("containers with unready status: [{}]", container.name).into();
            }
            conditions.push(c);
        }
        let mut patch = json!({
            "status": {
                "phase": if self.initialized { "Running" } else { "Pending" },
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "podIP": ip,
                "podIPs": ip.as_ref().map(|ip| vec![json!({"ip": ip})]),
                "startTime": self.start_time,
                "conditions": conditions,
                "containerStatuses": [status_entry],
            }
        });
        if !self.init_statuses.is_empty() {
            patch["status"]["initContainerStatuses"] = json!(self.init_statuses);
        }
        if let Err(e) = self
            .pods()
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(pod = %self.name, error = %e, "status update failed");
        }
    }

    async fn prepare_and_spawn(
        &mut self,
        container: &Container,
        log_name: &str,
    ) -> Result<tokio::process::Child> {
        let image = container.image.clone().unwrap_or_default();
        let ip = self.ip.ok_or_else(|| anyhow!("no pod IP"))?.to_string();
        // A fresh, empty termination message file for each start, as the kubelet makes.
        let termination = self.termination_file(container);
        tokio::fs::write(&termination, b"").await?;
        let mut paths = vec![(
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
            termination,
        )];
        // Mounts shadow what the image holds at the same path.
        paths.extend(self.write_volumes(container).await?);
        paths.extend(self.config.path_map.clone());
        let mut env = self.resolve_env(container, &ip).await?;
        if let Some(kubeconfig) = self.write_kubeconfig().await? {
            env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        }
        let map_value = |v: &str| -> String {
            let v = v.replace("0.0.0.0", &ip);
            rewrite_paths(&v, &paths)
        };
        let env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k, map_value(&v))).collect();
        let lookup: HashMap<&str, &str> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut argv: Vec<String> = match &container.command {
            Some(cmd) if !cmd.is_empty() => cmd.clone(),
            _ => vec![String::new()],
        };
        argv.extend(container.args.clone().unwrap_or_default());
        let argv: Vec<String> = argv
            .iter()
            .map(|a| map_value(&expand(a, &lookup)))
            .collect();
        let program = if argv[0].is_empty() {
            self.config.binary_for_image(&image).cloned()
        } else {
            let base = argv[0].rsplit('/').next().unwrap_or(&argv[0]);
            self.config.binaries.get(base).cloned()
        }
        .ok_or_else(|| anyhow!("no local binary for {:?} of image {image}", argv[0]))?;
        let log = std::fs::File::create(self.dir.join(log_name))?;
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&argv[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &self.dir)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; the child dies with the runner's thread.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        tracing::info!(pod = %self.name, container = %container.name, program = %program.display(), args = ?&argv[1..], "starting container");
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        Ok(child)
    }

    /// Runs the probes and waits for the process to exit or the pod to go away.
    async fn supervise(
        &mut self,
        mut child: tokio::process::Child,
        updates: &mut mpsc::UnboundedReceiver<Option<Pod>>,
    ) -> Outcome {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap_or_default();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut failures = 0;
        loop {
            tokio::select! {
                status = child.wait() => {
                    return match status {
                        Ok(s) => Outcome::Exited(s),
                        Err(_) => Outcome::Exited(std::process::ExitStatus::from_raw(1 << 8)),
                    };
                }
                update = updates.recv() => match update {
                    Some(Some(pod)) => {
                        self.pod = pod;
                        if self.deleting() {
                            self.finish(Some(child)).await;
                            return Outcome::Stopped;
                        }
                        // Another writer changed the pod's Ready condition (the node controller
                        // marks a node's pods not ready when its heartbeats stop, as in an API
                        // server outage): write what the probes say again, as a kubelet's
                        // status sync does.
                        let ours = self.ready && matches!(self.state, State::Running { .. });
                        if self.api_ready().is_some_and(|theirs| theirs != ours) {
                            tracing::info!(pod = %self.name, ready = ours, "Ready condition restored");
                            self.report().await;
                        }
                    }
                    _ => {
                        self.finish(Some(child)).await;
                        return Outcome::Stopped;
                    }
                },
                _ = tick.tick() => {
                    let Some(container) = self.container().cloned() else { continue };
                    if !self.started_ok {
                        self.started_ok = match &container.startup_probe {
                            Some(p) => self.probe(&http, &container, p).await,
                            None => true,
                        };
                        if !self.started_ok {
                            continue;
                        }
                    }
                    let ok = match &container.readiness_probe {
                        Some(p) => self.probe(&http, &container, p).await,
                        None => true,
                    };
                    let threshold = container
                        .readiness_probe
                        .as_ref()
                        .and_then(|p| p.failure_threshold)
                        .unwrap_or(3);
                    failures = if ok { 0 } else { failures + 1 };
                    let ready = if ok { true } else if failures >= threshold { false } else { self.ready };
                    if ready != self.ready {
                        self.ready = ready;
                        tracing::info!(pod = %self.name, ready, "readiness changed");
                        self.report().await;
                    }
                }
            }
        }
    }

    async fn probe(&self, http: &reqwest::Client, container: &Container, probe: &Probe) -> bool {
        let ip = self.ip.map(|i| i.to_string()).unwrap_or_default();
        let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
        if let Some(get) = &probe.http_get {
            let Some(port) = resolve_port(container, &get.port) else {
                return false;
            };
            return http_get(http, &ip, port, get, timeout).await;
        }
        if let Some(tcp) = &probe.tcp_socket {
            let Some(port) = resolve_port(container, &tcp.port) else {
                return false;
            };
            let host = tcp.host.clone().unwrap_or(ip);
            return tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port)))
                .await
                .is_ok_and(|r| r.is_ok());
        }
        // exec probes and gRPC probes are not run: count them as passing.
        true
    }
}

enum Outcome {
    Exited(std::process::ExitStatus),
    Stopped,
}

/// The main container's output file in the pod folder (init containers write `<name>.log`).
const MAIN_LOG: &str = "container.log";

/// The exit code the kubelet reports: the process's, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn resolve_port(container: &Container, port: &IntOrString) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

async fn http_get(
    http: &reqwest::Client,
    ip: &str,
    port: u16,
    get: &HTTPGetAction,
    timeout: Duration,
) -> bool {
    let host = get.host.clone().unwrap_or_else(|| ip.to_string());
    let scheme = get.scheme.as_deref().unwrap_or("HTTP").to_lowercase();
    let path = get.path.as_deref().unwrap_or("/");
    let mut req = http
        .get(format!("{scheme}://{host}:{port}{path}"))
        .timeout(timeout);
    for h in get.http_headers.iter().flatten() {
        req = req.header(&h.name, &h.value);
    }
    req.send()
        .await
        .is_ok_and(|r| (200..400).contains(&r.status().as_u16()))
}

/// The runner's defaults: our three binaries from a folder (target/release).
pub fn default_binaries(dir: &Path) -> BTreeMap<String, PathBuf> {
    ["sgl-engine", "sgl-router", "sgl-operator"]
        .into_iter()
        .map(|b| (b.to_string(), dir.join(b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_map_by_their_last_segment() {
        let c = RunnerConfig {
            binaries: default_binaries(Path::new("/bin")),
            path_map: vec![],
            work_dir: PathBuf::new(),
            server: String::new(),
            ca_file: PathBuf::new(),
        };
        assert!(
            c.binary_for_image("ghcr.io/sgl-rs/sgl-engine:0.1.0")
                .is_some()
        );
        assert!(c.binary_for_image("sgl-router@sha256:abc").is_some());
        assert!(c.binary_for_image("nginx:1.27").is_none());
        assert!(c.binary_for_image("ghcr.io/x/sgl-engine-extra:1").is_none());
    }
}
