//! The real Kubernetes control plane of the end-to-end tests (`tests/k8s/cluster.sh`) and
//! the pod runner that runs our binaries in its pods.

pub mod cluster;
pub mod runner;
