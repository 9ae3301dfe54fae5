//! The operator's own Prometheus metrics and its `/metrics` + `/health` server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// Counters and histograms of reconciliation.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub reconciliations: IntCounterVec,
    pub failures: IntCounterVec,
    pub duration: HistogramVec,
    pub leader: IntGauge,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconciliations = IntCounterVec::new(
            Opts::new(
                "sgl_operator_reconciliations_total",
                "Reconciliations started",
            ),
            &["namespace"],
        )?;
        let failures = IntCounterVec::new(
            Opts::new(
                "sgl_operator_reconcile_failures_total",
                "Reconciliations that failed, by cause",
            ),
            &["namespace", "error"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "sgl_operator_reconcile_duration_seconds",
                "Time to reconcile one SGLangService",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["namespace"],
        )?;
        let leader = IntGauge::new(
            "sgl_operator_leader",
            "1 while this replica holds the leader lease",
        )?;
        registry.register(Box::new(reconciliations.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Self {
            registry,
            reconciliations,
            failures,
            duration,
            leader,
        })
    }

    pub fn observe(&self, namespace: &str, took: Duration, error: Option<&str>) {
        self.reconciliations.with_label_values(&[namespace]).inc();
        self.duration
            .with_label_values(&[namespace])
            .observe(took.as_secs_f64());
        if let Some(e) = error {
            self.failures.with_label_values(&[namespace, e]).inc();
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

async fn metrics_text(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match m.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

pub fn app(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/health", get(|| async { "ok" }))
        .with_state(metrics)
}

/// Serves `/metrics` and `/health` until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics and /health");
    axum::serve(listener, app(metrics)).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::{Metrics, app};

    async fn get(metrics: Arc<Metrics>, path: &str) -> (StatusCode, String) {
        let response = app(metrics)
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn serves_reconcile_metrics_and_health() {
        let metrics = Arc::new(Metrics::new().unwrap());
        metrics.observe("ml", Duration::from_millis(30), None);
        metrics.observe("ml", Duration::from_millis(70), Some("kube"));
        let (status, body) = get(metrics.clone(), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains(r#"sgl_operator_reconciliations_total{namespace="ml"} 2"#),
            "{body}"
        );
        assert!(
            body.contains(
                r#"sgl_operator_reconcile_failures_total{error="kube",namespace="ml"} 1"#
            )
        );
        assert!(
            body.contains(r#"sgl_operator_reconcile_duration_seconds_count{namespace="ml"} 2"#)
        );
        assert_eq!(
            get(metrics, "/health").await,
            (StatusCode::OK, "ok".to_string())
        );
    }
}
