//! End to end on a real control plane (`tests/k8s/cluster.sh`): the chart installed with the
//! real Helm, the operator running with the chart's service account, engines and routers
//! running as processes in pods bound to kwok nodes (the pod runner), checked with kubectl,
//! the Kubernetes API and HTTP on the pod IPs.
//!
//! Skipped (with a message) when the control plane is not built; `SGL_K8S_REQUIRED=1` (set by
//! `.ci/run`) makes that a failure. The tests share one cluster and take turns on it.
//!
//! This file is the test binary's root: the tests live in topic modules under `k8s/`, what
//! they share in the helper modules beside them. The harness starts them in the order of
//! their paths (module, then name), and they take their turns in about that order; KEDA's
//! module comes last, since test s3 leaves KEDA running on the cluster.
#![allow(
    clippy::await_holding_lock,
    reason = "each test holds the cluster's turn (a std mutex) for its whole body, on its own runtime"
)]

/// The shared cluster and this test's turn on it; returns from the test when the control
/// plane is not built (and not required).
macro_rules! cluster {
    () => {
        match ::sgl_e2e_tests::k8s::cluster::Cluster::get($crate::common::RUNNER) {
            Some(c) => c,
            None => return,
        }
    };
}

// What the tests share.
#[path = "k8s/common.rs"]
mod common;
#[path = "k8s/hub.rs"]
mod hub;
#[path = "k8s/keda.rs"]
mod keda;
#[path = "k8s/metrics.rs"]
mod metrics;
#[path = "k8s/rollout.rs"]
mod rollout;

// The tests, by topic.
#[path = "k8s/autoscaling.rs"]
mod autoscaling;
#[path = "k8s/install.rs"]
mod install;
#[path = "k8s/operator.rs"]
mod operator;
#[path = "k8s/pod_security.rs"]
mod pod_security;
#[path = "k8s/resilience.rs"]
mod resilience;
#[path = "k8s/rolling_updates.rs"]
mod rolling_updates;
#[path = "k8s/scale_to_zero.rs"]
mod scale_to_zero;
#[path = "k8s/serving.rs"]
mod serving;
#[path = "k8s/shared_prefix.rs"]
mod shared_prefix;
#[path = "k8s/zero_with_keda.rs"]
mod zero_with_keda;
