//! Init containers: each runs to completion, in the pod's order, before the main container
//! starts, as the kubelet runs them.

use super::*;

impl PodWorker {
    /// Runs every init container to completion; false when the pod goes away (or the runner
    /// stops) first. A failed one is restarted with the kubelet's back-off (restartPolicy
    /// Always), its last exit in `lastState`.
    pub(super) async fn run_init_containers(
        &mut self,
        updates: &mut mpsc::UnboundedReceiver<Option<Pod>>,
    ) -> bool {
        let inits = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default();
        self.init_statuses = inits
            .iter()
            .map(|c| init_status(c, 0, json!({"waiting": {"reason": "PodInitializing"}})))
            .collect();
        for (i, container) in inits.iter().enumerate() {
            let log_name = format!("{}.log", container.name);
            let mut backoff = Duration::from_secs(10);
            let mut restarts = 0;
            loop {
                if self.deleting() {
                    return false;
                }
                let child = match self.prepare_and_spawn(container, &log_name).await {
                    Ok(child) => child,
                    Err(e) => {
                        tracing::warn!(pod = %self.name, container = %container.name, error = format!("{e:#}"), "init container not started");
                        self.init_statuses[i] = init_status(
                            container,
                            restarts,
                            json!({"waiting": {"reason": "CreateContainerConfigError", "message": format!("{e:#}")}}),
                        );
                        self.report().await;
                        if !self.wait_or_update(updates, Duration::from_secs(3)).await {
                            return false;
                        }
                        continue;
                    }
                };
                let started = now();
                let last = self.init_statuses[i].get("lastState").cloned();
                self.init_statuses[i] = init_status(
                    container,
                    restarts,
                    json!({"running": {"startedAt": started}}),
                );
                if let Some(last) = &last {
                    self.init_statuses[i]["lastState"] = last.clone();
                }
                self.report().await;
                let Some(status) = self.wait_init(child, updates).await else {
                    return false;
                };
                let code = exit_code(status);
                let terminated = json!({
                    "exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "message": self.termination_message(container, &log_name, code).await,
                    "startedAt": started,
                    "finishedAt": now(),
                });
                tracing::info!(pod = %self.name, container = %container.name, code, "init container exited");
                if code == 0 {
                    self.init_statuses[i] =
                        init_status(container, restarts, json!({"terminated": terminated}));
                    if let Some(last) = last {
                        self.init_statuses[i]["lastState"] = last;
                    }
                    self.init_statuses[i]["ready"] = true.into();
                    break;
                }
                restarts += 1;
                self.init_statuses[i] = init_status(
                    container,
                    restarts,
                    json!({"waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": format!(
                            "back-off {}s restarting failed container={} pod={}_{}",
                            backoff.as_secs(),
                            container.name,
                            self.name,
                            self.namespace
                        ),
                    }}),
                );
                self.init_statuses[i]["lastState"] = json!({"terminated": terminated});
                self.report().await;
                if !self.wait_or_update(updates, backoff).await {
                    return false;
                }
                backoff = (backoff * 2).min(Duration::from_secs(300));
            }
        }
        self.initialized = true;
        true
    }

    /// Waits for an init container to exit; `None` when the pod goes away first (the
    /// process is stopped then: no preStop hook, init containers have none).
    async fn wait_init(
        &mut self,
        mut child: tokio::process::Child,
        updates: &mut mpsc::UnboundedReceiver<Option<Pod>>,
    ) -> Option<std::process::ExitStatus> {
        loop {
            tokio::select! {
                status = child.wait() => {
                    return Some(status.unwrap_or_else(|_| std::process::ExitStatus::from_raw(1 << 8)));
                }
                update = updates.recv() => {
                    if let Some(Some(pod)) = update {
                        self.pod = pod;
                        if !self.deleting() {
                            continue;
                        }
                    }
                    self.stop_child(child, self.stop_deadline()).await;
                    return None;
                }
            }
        }
    }
}

/// One entry of `initContainerStatuses`.
fn init_status(container: &Container, restarts: i32, state: Value) -> Value {
    json!({
        "name": container.name,
        "image": container.image,
        "imageID": "",
        "ready": false,
        "started": state.get("running").is_some(),
        "restartCount": restarts,
        "state": state,
    })
}
