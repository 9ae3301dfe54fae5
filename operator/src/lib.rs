//! `sgl-operator`: reconciles `SGLangService` objects into engines, a router, an autoscaler and
//! their wiring, and reports what exists back in the resource's status.

pub mod controller;
pub mod leader;
pub mod metrics;
pub mod objects;
pub mod status;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod fixtures;

/// Every failure of the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    InvalidSpec(#[from] sgl_crds::CrdError),
    #[error("the object has no {0}")]
    MissingField(&'static str),
    #[error("could not serialize: {0}")]
    Json(#[from] serde_json::Error),
    #[error("could not write YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("lost the leader lease to another replica")]
    LostLease,
}

impl Error {
    /// A short, bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Self::Kube(_) => "kube",
            Self::InvalidSpec(_) => "invalid_spec",
            Self::MissingField(_) => "missing_field",
            Self::Json(_) | Self::Yaml(_) => "serialize",
            Self::LostLease => "lost_lease",
        }
    }
}
