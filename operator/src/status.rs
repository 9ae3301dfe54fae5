//! Status computed from what exists: replica counts, endpoint and the three conditions.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use sgl_crds::{SGLangService, SGLangServiceStatus};

use crate::objects::{Names, engine_selector_string};

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";

/// How the last attempt to converge went.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every object was applied.
    Applied,
    /// The spec breaks a validation rule; nothing was applied.
    InvalidSpec(String),
    /// The API server refused or failed a request.
    ApplyFailed(String),
}

/// The workloads as the API server returned them.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub engine: Option<StatefulSet>,
    pub router: Option<Deployment>,
}

struct EngineCounts {
    desired: i32,
    replicas: i32,
    ready: i32,
    rolled_out: bool,
}

fn engine_counts(svc: &SGLangService, sts: Option<&StatefulSet>) -> EngineCounts {
    let Some(sts) = sts else {
        return EngineCounts {
            desired: svc.spec.dp_size,
            replicas: 0,
            ready: 0,
            rolled_out: false,
        };
    };
    let status = sts.status.clone().unwrap_or_default();
    let desired = sts.spec.replicas.unwrap_or(svc.spec.dp_size);
    let generation_seen = match (sts.metadata.generation, status.observed_generation) {
        (Some(g), Some(o)) => o >= g,
        (None, _) => true,
        (Some(_), None) => false,
    };
    let updated = status.updated_replicas.unwrap_or(0);
    EngineCounts {
        desired,
        replicas: status.replicas,
        ready: status.ready_replicas.unwrap_or(0),
        rolled_out: generation_seen && updated >= desired && status.replicas == desired,
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// Keeps the transition time of conditions whose status did not change.
fn carry_transition_times(old: &[Condition], new: &mut [Condition]) {
    for c in new.iter_mut() {
        if let Some(prev) = old
            .iter()
            .find(|p| p.type_ == c.type_ && p.status == c.status)
        {
            c.last_transition_time = prev.last_transition_time.clone();
        }
    }
}

/// The status the resource should show after `outcome`, given what was observed.
pub fn compute(
    svc: &SGLangService,
    names: &Names,
    observed: &Observed,
    outcome: &Outcome,
    now: &Time,
) -> SGLangServiceStatus {
    let old = svc.status.clone().unwrap_or_default();
    let generation = svc.metadata.generation;
    let engines = engine_counts(svc, observed.engine.as_ref());
    let router_ready = observed
        .router
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let router_ok = !svc.spec.router.enabled || router_ready >= 1;
    let engines_ok = engines.desired > 0 && engines.ready >= engines.desired;

    let (ready, ready_reason, ready_msg) = match outcome {
        Outcome::InvalidSpec(_) => (
            false,
            "InvalidSpec",
            "the spec is invalid; see Degraded".to_string(),
        ),
        _ if engines.desired == 0 => (
            false,
            "ScaledToZero",
            "no engine replicas requested".to_string(),
        ),
        _ if !engines_ok => (
            false,
            "EnginesNotReady",
            format!(
                "{} of {} engine replicas ready",
                engines.ready, engines.desired
            ),
        ),
        _ if !router_ok => (
            false,
            "RouterNotReady",
            "no router replica is ready".to_string(),
        ),
        _ => (
            true,
            "AllReplicasReady",
            format!("{} engine replicas ready", engines.ready),
        ),
    };
    let (progressing, prog_reason, prog_msg) = match outcome {
        Outcome::Applied if !engines.rolled_out => (
            true,
            "RollingOut",
            "engine StatefulSet is rolling out".to_string(),
        ),
        Outcome::Applied if !engines_ok || !router_ok => (
            true,
            "WaitingForReplicas",
            "waiting for replicas to become ready".to_string(),
        ),
        Outcome::Applied => (false, "Stable", "all replicas are up to date".to_string()),
        _ => (
            false,
            "Blocked",
            "changes are not being applied; see Degraded".to_string(),
        ),
    };
    let (degraded, deg_reason, deg_msg) = match outcome {
        Outcome::Applied => (
            false,
            "ReconcileSucceeded",
            "all objects applied".to_string(),
        ),
        Outcome::InvalidSpec(m) => (true, "InvalidSpec", m.clone()),
        Outcome::ApplyFailed(m) => (true, "ApplyFailed", m.clone()),
    };
    let mut conditions = vec![
        condition(READY, ready, ready_reason, ready_msg, generation, now),
        condition(
            PROGRESSING,
            progressing,
            prog_reason,
            prog_msg,
            generation,
            now,
        ),
        condition(DEGRADED, degraded, deg_reason, deg_msg, generation, now),
    ];
    carry_transition_times(&old.conditions, &mut conditions);

    SGLangServiceStatus {
        conditions,
        observed_generation: generation,
        replicas: engines.replicas,
        ready_replicas: engines.ready,
        ready: Some(format!("{}/{}", engines.ready, engines.desired)),
        endpoint: Some(names.endpoint(svc)),
        selector: Some(engine_selector_string(names)),
    }
}

/// Conditions whose status (or reason) differs from before: each becomes an Event.
pub fn changed_conditions<'a>(old: &[Condition], new: &'a [Condition]) -> Vec<&'a Condition> {
    new.iter()
        .filter(|c| {
            !old.iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
        })
        .collect()
}

/// Whether the resource is fully ready per `status`.
pub fn is_ready(status: &SGLangServiceStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == READY && c.status == "True")
}
