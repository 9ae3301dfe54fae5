//! The router Deployment and Service, with the RBAC its pod discovery needs.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, PodSpec, PodTemplateSpec, Probe,
    Service, ServiceAccount, ServicePort, ServiceSpec, TCPSocketAction,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sgl_crds::SGLangService;

use super::{
    ENGINE_LABEL, ENGINE_PORT, Names, PRE_STOP_SECONDS, common_labels, meta, pre_stop,
    restricted_container, restricted_pod, selector_labels, with_default_requests,
};

/// The router image's user (distroless `nonroot`).
const ROUTER_UID: i64 = 65532;
use crate::Error;

/// The router's command line (after `sgl-router`).
pub fn router_args(svc: &SGLangService, names: &Names) -> Vec<String> {
    let r = &svc.spec.router;
    vec![
        "--host".into(),
        "0.0.0.0".into(),
        "--port".into(),
        ENGINE_PORT.to_string(),
        "--policy".into(),
        r.policy.as_flag().into(),
        "--cache-threshold".into(),
        r.cache_threshold.to_string(),
        "--balance-abs-threshold".into(),
        r.balance_abs_threshold.to_string(),
        "--balance-rel-threshold".into(),
        r.balance_rel_threshold.to_string(),
        "--queue-size".into(),
        r.queue_size.to_string(),
        "--queue-timeout-secs".into(),
        r.queue_timeout_seconds.to_string(),
        "--service-discovery".into(),
        "--selector".into(),
        format!("{ENGINE_LABEL}={}", names.instance),
        "--service-discovery-port".into(),
        ENGINE_PORT.to_string(),
        "--service-discovery-namespace".into(),
        names.namespace.clone(),
    ]
}

pub fn service_account(svc: &SGLangService, names: &Names) -> Result<ServiceAccount, Error> {
    Ok(ServiceAccount {
        metadata: meta(svc, names, &names.router, "router")?,
        ..ServiceAccount::default()
    })
}

/// The router watches this namespace's engine pods and nothing else.
pub fn role(svc: &SGLangService, names: &Names) -> Result<Role, Error> {
    Ok(Role {
        metadata: meta(svc, names, &names.router, "router")?,
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
    })
}

pub fn role_binding(svc: &SGLangService, names: &Names) -> Result<RoleBinding, Error> {
    Ok(RoleBinding {
        metadata: meta(svc, names, &names.router, "router")?,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: names.router.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: names.router.clone(),
            namespace: Some(names.namespace.clone()),
            ..Subject::default()
        }]),
    })
}

pub fn deployment(svc: &SGLangService, names: &Names) -> Result<Deployment, Error> {
    let r = &svc.spec.router;
    let container = Container {
        name: "router".into(),
        image: Some(r.image.clone()),
        image_pull_policy: svc.spec.image_pull_policy.map(|p| p.as_str().into()),
        command: Some(vec!["sgl-router".into()]),
        args: Some(router_args(svc, names)),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: ENGINE_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        resources: Some(with_default_requests(r.resources.clone(), "100m", "128Mi")),
        // The router checks clients' keys and forwards the same key to the engines.
        env: svc.spec.api_key_secret_ref.as_ref().map(|key| {
            vec![EnvVar {
                name: "SGL_ROUTER_API_KEY".into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(key.clone()),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            }]
        }),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/health".into()),
                port: IntOrString::String("http".into()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(10),
            ..Probe::default()
        }),
        liveness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("http".into()),
                ..TCPSocketAction::default()
            }),
            period_seconds: Some(20),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        lifecycle: Some(pre_stop()),
        security_context: Some(restricted_container(true)),
        ..Container::default()
    };
    Ok(Deployment {
        metadata: meta(svc, names, &names.router, "router")?,
        spec: DeploymentSpec {
            replicas: Some(r.replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names, "router")),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(common_labels(names, "router")),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(names.router.clone()),
                    containers: vec![container],
                    // The router proxies the engines' streams: it waits as long as they do.
                    termination_grace_period_seconds: Some(
                        svc.spec.termination_grace_period_seconds + PRE_STOP_SECONDS,
                    ),
                    security_context: Some(restricted_pod(ROUTER_UID, None)),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    })
}

pub fn service(svc: &SGLangService, names: &Names) -> Result<Service, Error> {
    Ok(Service {
        metadata: meta(svc, names, &names.router, "router")?,
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(names, "router")),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: ENGINE_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}
