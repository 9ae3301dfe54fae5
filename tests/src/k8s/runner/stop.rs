//! Stopping a container as the kubelet does: the preStop hook, SIGTERM, SIGKILL after the grace
//! period, the pod object removed; and the termination message a stopped container reports.

use super::*;

impl PodWorker {
    /// Where the container's `terminationMessagePath` points on this machine.
    pub(super) fn termination_file(&self, container: &Container) -> PathBuf {
        self.dir.join(format!("{}.termination-log", container.name))
    }

    /// The termination message as the kubelet makes it: the termination message file (at most
    /// 4 KiB), else, with `FallbackToLogsOnError` and a failure, the tail of the output.
    pub(super) async fn termination_message(
        &self,
        container: &Container,
        log_name: &str,
        code: i32,
    ) -> String {
        const MAX_FILE: usize = 4096;
        let written = tokio::fs::read(self.termination_file(container))
            .await
            .unwrap_or_default();
        if !written.is_empty() {
            let end = written.len().min(MAX_FILE);
            return String::from_utf8_lossy(&written[..end]).into_owned();
        }
        let fallback =
            container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
        if fallback && code != 0 {
            self.log_tail(log_name).await
        } else {
            String::new()
        }
    }

    pub(super) async fn log_tail(&self, log_name: &str) -> String {
        const TAIL: u64 = 2048;
        let Ok(mut f) = tokio::fs::File::open(self.dir.join(log_name)).await else {
            return String::new();
        };
        let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
        let _ = f
            .seek(std::io::SeekFrom::Start(len.saturating_sub(TAIL)))
            .await;
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf).await;
        String::from_utf8_lossy(&buf).trim().to_string()
    }

    /// When a stopping container is killed: the pod's grace period when it is being deleted,
    /// 5 s when the runner stops.
    pub(super) fn stop_deadline(&self) -> tokio::time::Instant {
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30)
            .max(0) as u64;
        let wait = if self.deleting() { grace } else { 5 };
        tokio::time::Instant::now() + Duration::from_secs(wait)
    }

    /// SIGTERM to the container's process group, SIGKILL at `deadline`.
    pub(super) async fn stop_child(
        &self,
        mut child: tokio::process::Child,
        deadline: tokio::time::Instant,
    ) {
        if let Some(pid) = child.id() {
            // SAFETY: signalling our own child's process group.
            unsafe { libc::kill(-(pid as i32), libc::SIGTERM) };
        }
        if tokio::time::timeout_at(deadline, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(pod = %self.name, "grace period over: SIGKILL");
            if let Some(pid) = child.id() {
                // SAFETY: as above.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            let _ = child.kill().await;
        }
    }

    /// preStop, SIGTERM, SIGKILL after the grace period; then the pod object goes.
    pub(super) async fn finish(&mut self, child: Option<tokio::process::Child>) {
        let deadline = self.stop_deadline();
        let deleting = self.deleting();
        if let Some(child) = child {
            if deleting {
                self.pre_stop(deadline).await;
            }
            self.stop_child(child, deadline).await;
        }
        if let Some(ip) = self.ip.take() {
            self.ips.release(ip).await;
        }
        if deleting {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: self.pod.uid().map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.pods().delete(&self.name, &dp).await {
                Ok(_) => tracing::info!(pod = %self.name, "pod stopped and removed"),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => tracing::warn!(pod = %self.name, error = %e, "pod delete failed"),
            }
        }
    }

    pub(super) async fn pre_stop(&self, deadline: tokio::time::Instant) {
        let Some(container) = self.container().cloned() else {
            return;
        };
        let Some(hook) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.clone())
        else {
            return;
        };
        let ip = self.ip.map(|i| i.to_string()).unwrap_or_default();
        if let Some(get) = &hook.http_get {
            if let Some(port) = resolve_port(&container, &get.port) {
                let http = reqwest::Client::new();
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let _ = http_get(&http, &ip, port, get, left).await;
            }
        } else if let Some(exec) = &hook.exec {
            let command = exec.command.clone().unwrap_or_default();
            if let Some((program, args)) = command.split_first() {
                let run = tokio::process::Command::new(program)
                    .args(args)
                    .current_dir(&self.dir)
                    .kill_on_drop(true)
                    .status();
                let _ = tokio::time::timeout_at(deadline, run).await;
            }
        } else if let Some(sleep) = &hook.sleep {
            let until =
                tokio::time::Instant::now() + Duration::from_secs(sleep.seconds.max(0) as u64);
            tokio::time::sleep_until(until.min(deadline)).await;
        }
    }
}
