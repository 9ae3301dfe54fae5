//! KEDA as test s3 sees it: the operator release switched to its KEDA option, KEDA's
//! ScaledObject read through the dynamic API, a trigger's value through KEDA's metrics API,
//! and a watch of the service, its ScaledObject and KEDA's HPA that keeps a history for the
//! failure messages.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;
use sgl_crds::SGLangService;
use sgl_e2e_tests::k8s::cluster::Cluster;

use crate::common::{CHART_NS, RELEASE, chart_dir};
use crate::metrics::quantity;

/// Whether KEDA (its operator and metrics API server) is built (`tests/k8s/build.sh`); prints
/// a skip otherwise, and fails with `SGL_K8S_REQUIRED=1`.
pub(crate) fn keda_built(c: &Cluster) -> bool {
    if c.bin.join("keda-operator").is_file() && c.bin.join("keda-adapter").is_file() {
        return true;
    }
    let why = format!(
        "KEDA is not built in {} (tests/k8s/build.sh builds it)",
        c.bin.display()
    );
    assert!(
        std::env::var(sgl_e2e_tests::k8s::cluster::REQUIRED_ENV).as_deref() != Ok("1"),
        "{why}"
    );
    eprintln!("SKIPPED: {why}");
    false
}

/// A value of the cluster's `ports.env` (`PROMETHEUS_URL`, `KEDA_HEALTH_PORT`, …).
pub(crate) fn ports_env(c: &Cluster, key: &str) -> String {
    let path = c.work.join("ports.env");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {}", path.display()))
        .to_string()
}

/// The main release with the chart's KEDA option on (`keda.enabled`, `keda.prometheusUrl`)
/// while it lives; dropped, the option is off again, so the tests after it meet the chart
/// as installed (after deleting `namespace` when the test failed, so that no ScaledObject is
/// left to a KEDA that an operator without the option no longer manages).
pub(crate) struct KedaChart<'a> {
    c: &'a Cluster,
    namespace: &'a str,
}

impl<'a> KedaChart<'a> {
    pub(crate) fn enable(c: &'a Cluster, prometheus_url: &str, namespace: &'a str) -> Self {
        upgrade(
            c,
            &[
                "--set",
                "keda.enabled=true",
                "--set",
                &format!("keda.prometheusUrl={prometheus_url}"),
            ],
        );
        Self { c, namespace }
    }
}

impl Drop for KedaChart<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.c.kubectl_raw(
                &["delete", "namespace", self.namespace, "--wait=true"],
                None,
            );
        }
        let args = upgrade_args(&["--set", "keda.enabled=false"]);
        let out = self
            .c
            .helm_raw(&args.iter().map(String::as_str).collect::<Vec<_>>());
        if !out.status.success() && !std::thread::panicking() {
            panic!(
                "turning the chart's KEDA option off failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

fn upgrade_args(set: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "upgrade",
        RELEASE,
        &chart_dir(),
        "-n",
        CHART_NS,
        "--reuse-values",
        "--wait",
        "--timeout",
        "5m",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(set.iter().map(|s| s.to_string()));
    args
}

fn upgrade(c: &Cluster, set: &[&str]) {
    let args = upgrade_args(set);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.helm(&args);
}

/// KEDA's ScaledObjects in `ns`.
pub(crate) fn scaled_objects(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// A condition of a ScaledObject's status: `(status, reason)`.
pub(crate) fn so_condition(so: &DynamicObject, type_: &str) -> Option<(String, String)> {
    so.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("status"), s("reason"))
        })
}

/// What one sample saw.
#[derive(Clone, Debug, Default)]
pub(crate) struct KedaScaling {
    /// The service's `spec.dpSize` (what KEDA writes through the scale subresource).
    pub(crate) dp_size: i32,
    /// The service's `status.replicas` and `status.readyReplicas`.
    pub(crate) replicas: (i32, i32),
    /// The service's `Ready` condition: `(status, reason)`.
    pub(crate) ready: Option<(String, String)>,
    /// The ScaledObject's `Ready` and `Active` conditions.
    pub(crate) so_ready: Option<(String, String)>,
    pub(crate) so_active: Option<(String, String)>,
    /// The ScaledObject's whole status.
    pub(crate) so_status: Value,
    /// Whether the HPA the ScaledObject names exists, and its `ScalingActive` condition.
    pub(crate) keda_hpa: bool,
    pub(crate) hpa_active: Option<(String, String)>,
}

/// Samples a service, its ScaledObject and KEDA's HPA once a second, keeping a history of
/// what changed for the failure messages (with the ScaledObject and KEDA's log).
pub(crate) struct KedaWatch<'a> {
    c: &'a Cluster,
    services: Api<SGLangService>,
    sos: Api<DynamicObject>,
    hpas: Api<HorizontalPodAutoscaler>,
    ns: &'a str,
    name: &'a str,
    started: std::time::Instant,
    last: String,
    pub(crate) history: Vec<String>,
}

impl<'a> KedaWatch<'a> {
    pub(crate) fn new(c: &'a Cluster, client: &Client, ns: &'a str, name: &'a str) -> Self {
        Self {
            c,
            services: Api::namespaced(client.clone(), ns),
            sos: scaled_objects(client, ns),
            hpas: Api::namespaced(client.clone(), ns),
            ns,
            name,
            started: std::time::Instant::now(),
            last: String::new(),
            history: Vec::new(),
        }
    }

    async fn sample(&mut self) -> Result<KedaScaling, String> {
        let svc = self
            .services
            .get(self.name)
            .await
            .map_err(|e| e.to_string())?;
        let so = self
            .sos
            .get_opt(&format!("{}-engine", self.name))
            .await
            .map_err(|e| e.to_string())?;
        let status = svc.status.clone().unwrap_or_default();
        let hpa_name = so
            .as_ref()
            .and_then(|so| so.data["status"]["hpaName"].as_str().map(str::to_string));
        let hpa = match hpa_name {
            Some(h) => self.hpas.get_opt(&h).await.map_err(|e| e.to_string())?,
            None => None,
        };
        let hpa_active = hpa.as_ref().and_then(|h| {
            let c = h
                .status
                .as_ref()?
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "ScalingActive")?;
            Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
        });
        let s = KedaScaling {
            dp_size: svc.spec.dp_size,
            replicas: (status.replicas, status.ready_replicas),
            ready: status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| (c.status.clone(), c.reason.clone())),
            so_ready: so.as_ref().and_then(|so| so_condition(so, "Ready")),
            so_active: so.as_ref().and_then(|so| so_condition(so, "Active")),
            so_status: so.map(|so| so.data["status"].clone()).unwrap_or_default(),
            keda_hpa: hpa.is_some(),
            hpa_active,
        };
        let hpa_line = if s.keda_hpa {
            format!("ScalingActive {:?}", s.hpa_active)
        } else {
            "absent".to_string()
        };
        let line = format!(
            "dpSize {} replicas {:?} Ready {:?}; ScaledObject Ready {:?} Active {:?}; KEDA's HPA {hpa_line}",
            s.dp_size, s.replicas, s.ready, s.so_ready, s.so_active,
        );
        if line != self.last {
            let at = self.started.elapsed().as_secs_f64();
            self.history.push(format!("{at:6.1} s  {line}"));
            self.last = line;
        }
        Ok(s)
    }

    pub(crate) fn report(&self) -> String {
        let so = self
            .c
            .kubectl_raw(&["get", "scaledobjects", "-n", self.ns, "-o", "yaml"], None);
        format!(
            "what the test saw (seconds since the service was applied):\n{}\n\
             the ScaledObjects:\n{}{}\nKEDA's log:\n{}",
            self.history.join("\n"),
            String::from_utf8_lossy(&so.stdout),
            String::from_utf8_lossy(&so.stderr),
            self.c.log_tail("keda-operator", 30)
        )
    }

    /// Samples once a second until `check` says done; fails after `timeout` with the history,
    /// the ScaledObject and KEDA's log.
    pub(crate) async fn until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&KedaScaling) -> bool,
    ) -> KedaScaling {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let last = match self.sample().await {
                Ok(s) if check(&s) => return s,
                Ok(_) => "not yet".to_string(),
                Err(e) => e,
            };
            if std::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what} ({last})\n{}",
                    self.report()
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// One of a ScaledObject's metrics through KEDA's metrics API (`external.metrics.k8s.io`, what
/// KEDA's HPA reads), served by KEDA's metrics API server from the operator's trigger query.
pub(crate) fn external_metric(
    c: &Cluster,
    ns: &str,
    so: &str,
    metric: &str,
) -> Result<f64, String> {
    let path = format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}?labelSelector=scaledobject.keda.sh%2Fname%3D{so}"
    );
    let out = c.kubectl_raw(&["get", "--raw", &path], None);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let list: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let items = list["items"]
        .as_array()
        .ok_or(format!("no items: {list}"))?;
    match items.as_slice() {
        [one] => quantity(one["value"].as_str().ok_or(format!("no value: {one}"))?),
        _ => Err(format!("{} values: {list}", items.len())),
    }
}

/// The reasons and messages of the events KEDA recorded on a ScaledObject, one a line.
pub(crate) fn scaled_object_events(c: &Cluster, ns: &str, so: &str) -> String {
    c.kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        &format!("involvedObject.kind=ScaledObject,involvedObject.name={so}"),
        "--sort-by",
        ".metadata.creationTimestamp",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ])
}
