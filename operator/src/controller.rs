//! The reconcile loop: validate, apply the plan with server-side apply, remove what the spec
//! no longer asks for, and write status. Errors requeue with backoff and show as `Degraded`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use sgl_crds::{SGLangService, SGLangServiceStatus};

use crate::Error;
use crate::metrics::Metrics;
use crate::objects::{self, Kind, MANAGER, Names, Plan, engine_selector_string};
use crate::status::{self, DEGRADED, Observed, Outcome, READY};

/// Label selector of every engine pod the operator manages, whatever its service.
const ENGINE_POD_SELECTOR: &str =
    "app.kubernetes.io/name=sglang,app.kubernetes.io/component=engine";

/// Event reason when another field manager held fields of an owned object.
pub const FIELD_CONFLICT: &str = "FieldManagerConflict";

/// Requeue period of a ready service (drift check).
const READY_RESYNC: Duration = Duration::from_secs(300);
/// Requeue period while replicas are starting.
const STARTING_RESYNC: Duration = Duration::from_secs(10);
const BACKOFF_BASE: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Shared state of every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// How the objects are planned (the KEDA option).
    pub options: objects::PlanOptions,
    /// Consecutive failures per object, for exponential backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            options: objects::PlanOptions::default(),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The same context, planning with `options`.
    pub fn with_options(mut self, options: objects::PlanOptions) -> Self {
        self.options = options;
        self
    }

    fn record_failure(&self, key: &str) -> u32 {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    fn clear_failures(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

fn key(svc: &SGLangService) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// Delay before retrying after the `n`th consecutive failure: 5 s doubling, capped at 5 min.
pub fn backoff(n: u32) -> Duration {
    let factor = 1u32 << n.saturating_sub(1).min(10);
    (BACKOFF_BASE * factor).min(BACKOFF_MAX)
}

/// Reconciles one `SGLangService`, timing it and counting failures.
pub async fn reconcile(svc: Arc<SGLangService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&svc, &ctx).await;
    let ns = svc.namespace().unwrap_or_default();
    ctx.metrics.observe(
        &ns,
        started.elapsed(),
        result.as_ref().err().map(Error::metric_label),
    );
    if result.is_ok() {
        ctx.clear_failures(&key(&svc));
    }
    result
}

/// Requeues a failed reconcile with exponential backoff per object.
pub fn error_policy(svc: Arc<SGLangService>, error: &Error, ctx: Arc<Context>) -> Action {
    let n = ctx.record_failure(&key(&svc));
    let delay = backoff(n);
    tracing::warn!(object = %key(&svc), %error, attempt = n, ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile_inner(svc: &SGLangService, ctx: &Context) -> Result<Action, Error> {
    // Owned objects carry ownerReferences: the garbage collector removes them.
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let names = Names::of(svc)?;
    let plan = match objects::plan_with(svc, &ctx.options) {
        Ok(plan) => plan,
        Err(Error::InvalidSpec(e)) => {
            tracing::info!(object = %key(svc), error = %e, "invalid spec");
            let outcome = Outcome::InvalidSpec(e.to_string());
            write_status(svc, ctx, &names, &Observed::default(), &outcome).await?;
            return Ok(Action::await_change());
        }
        Err(e) => return Err(e),
    };
    match apply(svc, ctx, &names, &plan).await {
        Ok(observed) => {
            let status = write_status(svc, ctx, &names, &observed, &Outcome::Applied).await?;
            Ok(Action::requeue(if status::is_ready(&status) {
                READY_RESYNC
            } else {
                STARTING_RESYNC
            }))
        }
        Err(e) => {
            let outcome = Outcome::ApplyFailed(e.to_string());
            if let Err(status_error) =
                write_status(svc, ctx, &names, &Observed::default(), &outcome).await
            {
                tracing::warn!(object = %key(svc), error = %status_error, "could not record Degraded status");
            }
            Err(e)
        }
    }
}

fn dynamic_api(client: &Client, namespace: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &kind.api_resource())
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Whether `obj` names `svc` (by uid) among its owners.
fn owned_by(obj: &DynamicObject, svc: &SGLangService) -> bool {
    let Some(uid) = svc.metadata.uid.as_deref() else {
        return false;
    };
    obj.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid)
}

fn typed<T: serde::de::DeserializeOwned>(obj: &DynamicObject) -> Result<T, Error> {
    Ok(serde_json::from_value(serde_json::to_value(obj)?)?)
}

/// Applies every object of the plan and deletes the ones it excludes.
async fn apply(
    svc: &SGLangService,
    ctx: &Context,
    names: &Names,
    plan: &Plan,
) -> Result<Observed, Error> {
    let mut observed = Observed::default();
    for m in &plan.apply {
        let api = dynamic_api(&ctx.client, &names.namespace, m.kind);
        match apply_owned(svc, ctx, &api, m).await {
            Ok(applied) => match m.kind {
                Kind::Deployment if m.name == names.engine => {
                    observed.engine = Some(typed::<Deployment>(&applied)?);
                }
                Kind::Deployment => observed.router = Some(typed::<Deployment>(&applied)?),
                _ => {}
            },
            // The Prometheus Operator is optional: without its CRD, say so and go on.
            Err(e) if m.kind == Kind::ServiceMonitor && is_not_found(&e) => {
                publish(
                    svc,
                    ctx,
                    EventType::Warning,
                    "ServiceMonitorUnavailable",
                    "monitoring.serviceMonitor is on but the ServiceMonitor CRD is not installed"
                        .into(),
                )
                .await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    for (kind, name) in &plan.delete {
        // An older operator's engine StatefulSet serves until its Deployment can take over.
        if *kind == Kind::StatefulSet && !status::engines_available(observed.engine.as_ref()) {
            continue;
        }
        let api = dynamic_api(&ctx.client, &names.namespace, *kind);
        // Only an object that exists and that this service owns: a read first (what the plan
        // excludes is usually absent, and a delete that finds nothing is still a write
        // request), and a same-named object someone else made is not the operator's to remove.
        // A kind whose CRD is not installed answers a bare 404 (no Status body, so not the
        // NotFound that `get_opt` looks for): absent too.
        let existing = match api.get(name).await {
            Ok(obj) => obj,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        if !owned_by(&existing, svc) {
            tracing::debug!(object = %key(svc), ?kind, %name, "left alone: not owned by this service");
            continue;
        }
        // The uid precondition: if the object was replaced since the read, the new one is
        // left for the next reconcile to judge.
        let params = DeleteParams {
            preconditions: existing.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(object = %key(svc), ?kind, %name, "deleted object the spec no longer asks for")
            }
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Pods tell what the Deployment's counts do not: why an engine does not run.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    observed.engine_pods = pods
        .list(&ListParams::default().labels(&engine_selector_string(names)))
        .await?
        .items;
    Ok(observed)
}

/// Server-side applies one owned object. Another field manager holding a field the operator
/// sets (someone's `kubectl apply --server-side --force-conflicts`, a controller's update) is
/// a conflict: it is reported as a Warning Event on the service, naming the manager and the
/// fields, and the operator's values are applied over it, so the spec stays the one source.
async fn apply_owned(
    svc: &SGLangService,
    ctx: &Context,
    api: &Api<DynamicObject>,
    m: &objects::Manifest,
) -> Result<DynamicObject, kube::Error> {
    let (name, object) = (m.name.as_str(), &m.object);
    match api
        .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(object))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let kind = object["kind"].as_str().unwrap_or("object");
            tracing::warn!(object = %key(svc), kind, name, conflict = %s.message, "overriding another field manager");
            publish(
                svc,
                ctx,
                EventType::Warning,
                FIELD_CONFLICT,
                format!(
                    "{kind} {name}: {}; the operator's values were applied over it",
                    s.message
                ),
            )
            .await;
            api.patch(
                name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(object),
            )
            .await
        }
        other => other,
    }
}

/// The service an engine pod belongs to, from the labels the operator put on it.
fn service_of_pod(pod: Pod) -> Option<ObjectRef<SGLangService>> {
    let labels = pod.metadata.labels.as_ref()?;
    if labels
        .get("app.kubernetes.io/managed-by")
        .map(String::as_str)
        != Some(MANAGER)
    {
        return None;
    }
    let instance = labels.get("app.kubernetes.io/instance")?;
    Some(ObjectRef::new(instance).within(pod.metadata.namespace.as_deref()?))
}

async fn publish(svc: &SGLangService, ctx: &Context, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &svc.object_ref(&())).await {
        tracing::warn!(object = %key(svc), error = %e, "could not publish event");
    }
}

/// Computes status, writes it when it changed, and emits one Event per changed condition.
async fn write_status(
    svc: &SGLangService,
    ctx: &Context,
    names: &Names,
    observed: &Observed,
    outcome: &Outcome,
) -> Result<SGLangServiceStatus, Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut new = status::compute(svc, names, observed, outcome, &now);
    let old = svc.status.clone().unwrap_or_default();
    if matches!(outcome, Outcome::InvalidSpec(_) | Outcome::ApplyFailed(_)) {
        // Nothing was observed: keep the last known counts rather than reporting zero.
        new.replicas = old.replicas;
        new.ready_replicas = old.ready_replicas;
        new.ready = old.ready.clone().or(new.ready);
        new.model_commit = old.model_commit.clone();
    }
    if new == old {
        return Ok(new);
    }
    let api: Api<SGLangService> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let patch = status::merge_patch(&serde_json::to_value(&old)?, &serde_json::to_value(&new)?);
    api.patch_status(
        &names.instance,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": patch })),
    )
    .await?;
    for c in status::changed_conditions(&old.conditions, &new.conditions) {
        let warning = (c.type_ == DEGRADED && c.status == "True")
            || (c.type_ == READY
                && c.status == "False"
                && old
                    .conditions
                    .iter()
                    .any(|o| o.type_ == READY && o.status == "True"));
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(
            svc,
            ctx,
            type_,
            &c.reason,
            format!("{}={}: {}", c.type_, c.status, c.message),
        )
        .await;
    }
    Ok(new)
}

/// Runs the controller until a shutdown signal.
pub async fn run(ctx: Arc<Context>) -> Result<(), Error> {
    let client = ctx.client.clone();
    let services: Api<SGLangService> = Api::all(client.clone());
    // Fail fast with a clear message when the CRD is missing.
    services.list(&ListParams::default().limit(1)).await?;
    Controller::new(services, watcher::Config::default().any_semantic())
        .owns(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default(),
        )
        // Engine pods are the Deployment's ReplicaSets', not the service's: map them back by label, so a
        // crash loop or an unschedulable pod shows in status as soon as it happens.
        .watches(
            Api::<Pod>::all(client),
            watcher::Config::default().labels(ENGINE_POD_SELECTOR),
            service_of_pod,
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(object = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile did not complete"),
            }
        })
        .await;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "controller_tests.rs"]
mod tests;
