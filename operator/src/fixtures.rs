//! Test fixtures: sample resources and a scripted API server behind `tower_test::mock`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use sgl_crds::SGLangService;

use crate::controller::Context;
use crate::metrics::Metrics;

/// A valid service as a user would write it, with what the API server adds.
pub fn service(extra_spec: Value) -> SGLangService {
    let mut spec = json!({"model": {"path": "meta-llama/Llama-3.1-8B-Instruct"}, "dpSize": 2});
    if let (Some(base), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        base.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "serving.sgl-rs.io/v1alpha1",
        "kind": "SGLangService",
        "metadata": {"name": "llama", "namespace": "ml", "uid": "1234-abcd", "generation": 1},
        "spec": spec,
    }))
    .unwrap()
}

/// One request the operator made.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    pub path: String,
    /// The query string, decoded (`labelSelector=a=b,c=d`).
    pub query: String,
    pub body: Value,
}

impl Call {
    pub fn is(&self, method: &str, path_part: &str) -> bool {
        self.method == method && self.path.contains(path_part)
    }
}

/// Decides a response to a call; `None` falls back to the default behaviour.
pub type Responder = Box<dyn Fn(&Call) -> Option<(u16, Value)> + Send + Sync>;

/// A fake API server: answers every request, records them all.
pub struct FakeApi {
    pub calls: Arc<Mutex<Vec<Call>>>,
}

fn status_error(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": format!("{reason} (from the test API server)")})
}

/// What the real API server would answer by default: apply echoes the object (plus the given
/// engine and router Deployment status), deletes and gets find nothing, events are created.
fn default_response(
    call: &Call,
    svc: &Value,
    engine_status: &Value,
    deploy_status: &Value,
) -> (u16, Value) {
    match call.method.as_str() {
        "PATCH" if call.path.ends_with("/status") => (200, svc.clone()),
        "PATCH" => {
            let mut obj = call.body.clone();
            if call.path.contains("/deployments/llama-engine") {
                obj["metadata"]["generation"] = json!(1);
                obj["status"] = engine_status.clone();
            } else if call.path.contains("/deployments/") {
                obj["status"] = deploy_status.clone();
            }
            (200, obj)
        }
        "POST" => (201, call.body.clone()),
        "GET" if call.path.ends_with("/pods") => (200, pod_list(vec![])),
        "DELETE" | "GET" => (404, status_error(404, "NotFound")),
        _ => (405, status_error(405, "MethodNotAllowed")),
    }
}

/// Answers a GET of a path containing one of `parts` (ending in the object's name) with that
/// object, owned by the service of uid `owner` (`None`: by nobody, as if someone else made it).
pub fn existing(parts: &'static [&'static str], owner: Option<&'static str>) -> Responder {
    Box::new(move |call| {
        if call.method != "GET" {
            return None;
        }
        let part = parts.iter().find(|p| call.path.contains(*p))?;
        let name = part.rsplit('/').next().unwrap_or_default();
        let mut meta = json!({"name": name, "namespace": "ml", "uid": format!("uid-of-{name}")});
        if let Some(uid) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "serving.sgl-rs.io/v1alpha1",
                "kind": "SGLangService", "name": "llama", "uid": uid, "controller": true}]);
        }
        Some((
            200,
            json!({"apiVersion": "v1", "kind": "Object", "metadata": meta}),
        ))
    })
}

/// A PodList as the API server answers a list.
pub fn pod_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})
}

/// An engine pod of the `llama` service with the given `status`.
pub fn engine_pod(name: &str, status: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": {
            "app.kubernetes.io/name": "sglang", "app.kubernetes.io/instance": "llama",
            "app.kubernetes.io/component": "engine", "app.kubernetes.io/managed-by": "sgl-operator"}},
        "status": status,
    })
}

/// Engine and router status that make a 2-replica service ready.
pub fn ready_statuses() -> (Value, Value) {
    (
        json!({"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2,
               "observedGeneration": 1}),
        json!({"replicas": 1, "readyReplicas": 1}),
    )
}

impl FakeApi {
    /// A client wired to a fake server that answers with `responder`, then the defaults.
    pub fn start(
        svc: &SGLangService,
        statuses: (Value, Value),
        responder: Responder,
    ) -> (Arc<Context>, Self) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recorded = calls.clone();
        let svc_json = serde_json::to_value(svc).unwrap();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let query = request
                    .uri()
                    .query()
                    .map(|q| {
                        q.replace("%3D", "=")
                            .replace("%2C", ",")
                            .replace("%2F", "/")
                    })
                    .unwrap_or_default();
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let call = Call {
                    method,
                    path,
                    query,
                    body,
                };
                let (code, reply) = responder(&call).unwrap_or_else(|| {
                    default_response(&call, &svc_json, &statuses.0, &statuses.1)
                });
                recorded.lock().unwrap().push(call);
                let response = Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap();
                send.send_response(response);
            }
        });
        let ctx = Context::new(
            client,
            Arc::new(Metrics::new().unwrap()),
            Some("test".into()),
        );
        (Arc::new(ctx), Self { calls })
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The body of the first call matching `method` and `path_part`.
    pub fn body(&self, method: &str, path_part: &str) -> Value {
        self.calls()
            .into_iter()
            .find(|c| c.is(method, path_part))
            .unwrap_or_else(|| panic!("no {method} {path_part} among {:#?}", self.summary()))
            .body
    }

    pub fn summary(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| format!("{} {}", c.method, c.path))
            .collect()
    }
}

/// Runs a future with a timeout, so a missing response fails the test instead of hanging.
pub async fn timeout<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("timed out")
}
