//! Pure builders: one `SGLangService` in, every Kubernetes object the operator owns out.
//!
//! Nothing here talks to a cluster. The controller applies what [`plan`] returns and the
//! `render` command prints it, so the two can never disagree.

mod engine;
mod keda;
mod router;
mod scaling;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Lifecycle, LifecycleHandler, PodSecurityContext, ResourceRequirements,
    SeccompProfile, SecurityContext, SleepAction,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use sgl_crds::SGLangService;

use crate::Error;

pub use engine::{ENGINE_PORT, MODEL_DOWNLOAD, download_args, engine_args, is_hub_id};
pub use router::router_args;
pub use scaling::{
    CACHE_MISS_METRIC, KV_USAGE_METRIC, KV_USAGE_TARGET, QUEUE_METRIC, ROUTER_WAITING_METRIC,
    SCALE_DOWN_BRAKE_METRIC,
};

/// Field manager name for server-side apply.
pub const MANAGER: &str = "sgl-operator";
/// Label on engine pods that the router selects on (`--selector`).
pub const ENGINE_LABEL: &str = "serving.sgl-rs.io/engine";

/// The kinds of object the operator creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Service,
    StatefulSet,
    ServiceAccount,
    Role,
    RoleBinding,
    Deployment,
    HorizontalPodAutoscaler,
    PodDisruptionBudget,
    ServiceMonitor,
    ScaledObject,
}

impl Kind {
    /// Group, version, kind and plural for the dynamic API.
    pub fn api_resource(self) -> ApiResource {
        use k8s_openapi::api::{
            apps::v1 as apps, autoscaling::v2 as autoscaling, core::v1 as core,
            policy::v1 as policy, rbac::v1 as rbac,
        };
        match self {
            Self::Service => ApiResource::erase::<core::Service>(&()),
            Self::StatefulSet => ApiResource::erase::<apps::StatefulSet>(&()),
            Self::ServiceAccount => ApiResource::erase::<core::ServiceAccount>(&()),
            Self::Role => ApiResource::erase::<rbac::Role>(&()),
            Self::RoleBinding => ApiResource::erase::<rbac::RoleBinding>(&()),
            Self::Deployment => ApiResource::erase::<apps::Deployment>(&()),
            Self::HorizontalPodAutoscaler => {
                ApiResource::erase::<autoscaling::HorizontalPodAutoscaler>(&())
            }
            Self::PodDisruptionBudget => ApiResource::erase::<policy::PodDisruptionBudget>(&()),
            Self::ServiceMonitor => ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
                "servicemonitors",
            ),
            Self::ScaledObject => ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
                "scaledobjects",
            ),
        }
    }
}

/// One object to apply, already serialized with `apiVersion` and `kind`.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub kind: Kind,
    pub name: String,
    pub object: serde_json::Value,
}

/// What one reconcile converges to: objects to apply, and owned objects that must not exist.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub apply: Vec<Manifest>,
    pub delete: Vec<(Kind, String)>,
}

impl Plan {
    pub fn get(&self, kind: Kind) -> Option<&Manifest> {
        self.apply.iter().find(|m| m.kind == kind)
    }

    /// The object of `kind` named `name` (the engine and the router are both Deployments).
    pub fn get_named(&self, kind: Kind, name: &str) -> Option<&Manifest> {
        self.apply.iter().find(|m| m.kind == kind && m.name == name)
    }
}

/// Names of the objects of one service, derived from its own name.
#[derive(Clone, Debug)]
pub struct Names {
    pub namespace: String,
    pub instance: String,
    pub engine: String,
    pub router: String,
}

impl Names {
    pub fn of(svc: &SGLangService) -> Result<Self, Error> {
        let instance = svc
            .metadata
            .name
            .clone()
            .ok_or(Error::MissingField("metadata.name"))?;
        let namespace = svc
            .namespace()
            .ok_or(Error::MissingField("metadata.namespace"))?;
        Ok(Self {
            engine: format!("{instance}-engine"),
            router: format!("{instance}-router"),
            namespace,
            instance,
        })
    }

    /// The URL clients use: the router's Service, or the engines' headless Service.
    pub fn endpoint(&self, svc: &SGLangService) -> String {
        let host = if svc.spec.router.enabled {
            &self.router
        } else {
            &self.engine
        };
        format!("http://{host}.{}.svc:{ENGINE_PORT}", self.namespace)
    }
}

/// Seconds a stopping pod keeps serving before it gets SIGTERM, so that Services and the
/// routers' pod discovery stop sending it new work first.
pub const PRE_STOP_SECONDS: i64 = 5;

/// Wait [`PRE_STOP_SECONDS`] before SIGTERM (the kubelet's own sleep: images need no shell).
fn pre_stop() -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            sleep: Some(SleepAction {
                seconds: PRE_STOP_SECONDS,
            }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// A pod security context the `restricted` Pod Security Standard admits: a non-root user and
/// the runtime's default seccomp profile.
fn restricted_pod(uid: i64, fs_group: Option<i64>) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        fs_group,
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// A container security context the `restricted` Pod Security Standard admits.
fn restricted_container(read_only_root: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        read_only_root_filesystem: read_only_root.then_some(true),
        ..SecurityContext::default()
    }
}

/// `res` with a CPU and a memory request added where it names neither a request nor a limit
/// of that resource, so the pod is never BestEffort (a request above a limit the user set
/// would be refused, and a limit alone already becomes the request).
fn with_default_requests(
    res: Option<ResourceRequirements>,
    cpu: &str,
    memory: &str,
) -> ResourceRequirements {
    let mut res = res.unwrap_or_default();
    for (name, value) in [("cpu", cpu), ("memory", memory)] {
        let named = |list: &Option<BTreeMap<String, Quantity>>| {
            list.as_ref().is_some_and(|l| l.contains_key(name))
        };
        if !named(&res.requests) && !named(&res.limits) {
            res.requests
                .get_or_insert_with(BTreeMap::new)
                .insert(name.into(), Quantity(value.into()));
        }
    }
    res
}

/// Labels on every object of one service.
fn common_labels(names: &Names, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(names, component);
    labels.insert("app.kubernetes.io/managed-by".into(), MANAGER.into());
    labels
}

/// Labels a component's pods are selected by; immutable once a workload exists.
pub fn selector_labels(names: &Names, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "sglang".to_string()),
        (
            "app.kubernetes.io/instance".to_string(),
            names.instance.clone(),
        ),
        (
            "app.kubernetes.io/component".to_string(),
            component.to_string(),
        ),
    ])
}

/// The engine pod selector as a string, for `status.selector` and the scale subresource.
pub fn engine_selector_string(names: &Names) -> String {
    selector_labels(names, "engine")
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn owner_ref(svc: &SGLangService) -> Result<OwnerReference, Error> {
    svc.controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid"))
}

fn meta(
    svc: &SGLangService,
    names: &Names,
    name: &str,
    component: &str,
) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(names.namespace.clone()),
        labels: Some(common_labels(names, component)),
        owner_references: Some(vec![owner_ref(svc)?]),
        ..ObjectMeta::default()
    })
}

fn manifest<K>(kind: Kind, object: &K) -> Result<Manifest, Error>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut value = serde_json::to_value(object)?;
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), K::api_version(&()).into());
        map.insert("kind".into(), K::kind(&()).into());
    }
    let name = object.meta().name.clone().unwrap_or_default();
    Ok(Manifest {
        kind,
        name,
        object: value,
    })
}

/// How the operator was started, as far as the objects it plans depend on it.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// Scale services with `minReplicas: 0` with a KEDA ScaledObject whose triggers query this
    /// Prometheus, instead of the operator's HPA (see `keda.rs`).
    pub keda_prometheus_url: Option<String>,
}

/// Everything the operator applies for `svc`, in apply order, and what it removes.
pub fn plan(svc: &SGLangService) -> Result<Plan, Error> {
    plan_with(svc, &PlanOptions::default())
}

/// [`plan`] for an operator started with `options`.
pub fn plan_with(svc: &SGLangService, options: &PlanOptions) -> Result<Plan, Error> {
    svc.validate()?;
    let names = Names::of(svc)?;
    let mut apply = vec![
        manifest(Kind::Service, &engine::headless_service(svc, &names)?)?,
        manifest(Kind::Deployment, &engine::deployment(svc, &names)?)?,
        manifest(Kind::PodDisruptionBudget, &scaling::pdb(svc, &names)?)?,
    ];
    // Engines ran as a StatefulSet before they ran as a Deployment; the controller deletes an
    // old one only once the Deployment's replicas are all available.
    let mut delete = vec![(Kind::StatefulSet, names.engine.clone())];

    let router_kinds = [
        Kind::ServiceAccount,
        Kind::Role,
        Kind::RoleBinding,
        Kind::Deployment,
        Kind::Service,
        Kind::PodDisruptionBudget,
    ];
    if svc.spec.router.enabled {
        apply.push(manifest(
            Kind::ServiceAccount,
            &router::service_account(svc, &names)?,
        )?);
        apply.push(manifest(Kind::Role, &router::role(svc, &names)?)?);
        apply.push(manifest(
            Kind::RoleBinding,
            &router::role_binding(svc, &names)?,
        )?);
        apply.push(manifest(
            Kind::Deployment,
            &router::deployment(svc, &names)?,
        )?);
        apply.push(manifest(Kind::Service, &router::service(svc, &names)?)?);
        apply.push(manifest(
            Kind::PodDisruptionBudget,
            &scaling::router_pdb(svc, &names)?,
        )?);
    } else {
        delete.extend(router_kinds.iter().map(|k| (*k, names.router.clone())));
    }

    let to_zero = svc
        .spec
        .autoscaling
        .as_ref()
        .filter(|a| a.enabled && a.min_replicas == 0);
    match (to_zero, &options.keda_prometheus_url) {
        (Some(a), Some(url)) => {
            apply.push(Manifest {
                kind: Kind::ScaledObject,
                name: names.engine.clone(),
                object: keda::scaled_object(svc, &names, a, url)?,
            });
            delete.push((Kind::HorizontalPodAutoscaler, names.engine.clone()));
        }
        _ => {
            match scaling::hpa(svc, &names)? {
                Some(hpa) => apply.push(manifest(Kind::HorizontalPodAutoscaler, &hpa)?),
                None => delete.push((Kind::HorizontalPodAutoscaler, names.engine.clone())),
            }
            // Only an operator that may create ScaledObjects looks for one to remove.
            if options.keda_prometheus_url.is_some() {
                delete.push((Kind::ScaledObject, names.engine.clone()));
            }
        }
    }
    if svc.spec.monitoring.service_monitor {
        apply.push(Manifest {
            kind: Kind::ServiceMonitor,
            name: names.instance.clone(),
            object: scaling::service_monitor(svc, &names)?,
        });
    } else {
        delete.push((Kind::ServiceMonitor, names.instance.clone()));
    }
    Ok(Plan { apply, delete })
}

/// The plan as a multi-document YAML stream, as `sgl-operator render` prints it.
pub fn render_yaml(svc: &SGLangService, options: &PlanOptions) -> Result<String, Error> {
    let plan = plan_with(svc, options)?;
    let mut out = String::new();
    for m in &plan.apply {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&m.object)?);
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
