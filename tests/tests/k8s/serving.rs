//! Services that serve: the CPU example through its router, its printer columns and a scale
//! to three engines that all get requests (c1), an engine behind an API key whose `/metrics`
//! stays open to the scraper (i1), the GPU examples admitted or refused, each saying why it
//! does not serve (j1), and a Hub model downloaded once into a shared cache that every
//! replica starts from (k1).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::Value;
use sgl_crds::SGLangService;
use sgl_e2e_tests::default_model;
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    chat, delete_service, download_state, engine_request_counts, ensure_chart, ensure_namespace,
    example, host_path_claim, pod_ip, ready_pods, router_pods, wait_ready_pods,
    wait_ready_without_reason, wait_serving,
};
use crate::hub;

#[tokio::test]
async fn c1_cpu_example_serves_chat_through_the_router_and_scales_to_three() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let (ns, name) = ("default", "smollm2");
    c.apply(&example("cpu-smollm2.yaml"));
    wait_serving(c, &client, ns, name, 1).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let router = router_pods(&client, ns, name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let router_ip = pod_ip(&router[0]);
    let body = wait_for("a chat completion through the router", WAIT, || {
        let http = http.clone();
        let ip = router_ip.clone();
        async move { chat(&http, &ip, "smollm2", "Say hello.").await }
    })
    .await;
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    assert!(!content.is_empty(), "empty completion: {body}");
    assert!(
        body["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{body}"
    );

    // `kubectl get sgls` shows the printer columns.
    let table = wait_for("the service to report ready", WAIT, || async {
        let t = c.kubectl(&["get", "sgls", "-n", ns]);
        t.contains("1/1").then_some(t.clone()).ok_or(t)
    })
    .await;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // The printer columns, in order (others may stand between them).
    let mut at = 0;
    for column in ["NAME", "MODEL", "TP", "READY", "ENDPOINT", "AGE"] {
        match header[at..].iter().position(|h| *h == column) {
            Some(i) => at += i + 1,
            None => panic!("column {column} missing or out of order: {table}"),
        }
    }
    let row = table.lines().nth(1).unwrap_or("");
    assert!(
        row.starts_with(name) && row.contains("/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{table}"
    );

    // `kubectl scale` → three ready engines, and the router sends requests to each.
    c.kubectl(&["scale", "sgls", name, "-n", ns, "--replicas=3"]);
    let engines = wait_serving(c, &client, ns, name, 3).await;
    // Ready again: the reason and message shown while scaling are gone, not left stale.
    wait_ready_without_reason(&client, ns, name).await;
    let before = engine_request_counts(&http, &engines).await;
    wait_for(
        "the router to send requests to all three engines",
        WAIT,
        || {
            let http = http.clone();
            let ip = router_ip.clone();
            let engines = engines.clone();
            let before = before.clone();
            async move {
                for i in 0..3 {
                    chat(&http, &ip, "smollm2", &format!("Count to {i}.")).await?;
                }
                let now = engine_request_counts(&http, &engines).await;
                let idle: Vec<&String> = now
                    .iter()
                    .filter(|(pod, n)| before.get(*pod).copied().unwrap_or(0.0) >= **n)
                    .map(|(pod, _)| pod)
                    .collect();
                idle.is_empty().then_some(()).ok_or(format!(
                    "no request reached {idle:?} (before {before:?}, now {now:?})"
                ))
            }
        },
    )
    .await;
    c.kubectl(&["scale", "sgls", name, "-n", ns, "--replicas=1"]);
}

#[tokio::test]
async fn i1_engine_metrics_stay_open_with_an_api_key() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "apikey-e2e";
    ensure_namespace(c, ns);
    c.apply(&format!(
        r#"apiVersion: v1
kind: Secret
metadata:
  name: engine-key
  namespace: {ns}
stringData:
  key: s3cret-key
---
apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: keyed
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
  device: cpu
  tpSize: 1
  dpSize: 1
  apiKeySecretRef: {{name: engine-key, key: key}}
"#
    ));
    let engines = wait_for("a ready engine", WAIT, || async {
        let pods = ready_pods(&client, ns, "serving.sgl-rs.io/engine=keyed").await?;
        (!pods.is_empty())
            .then_some(pods.clone())
            .ok_or(c.log_tail("pod-runner", 10))
    })
    .await;
    let ip = pod_ip(&engines[0]);
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let status = |path: &'static str, key: Option<&'static str>| {
        let http = http.clone();
        let url = format!("http://{ip}:30000{path}");
        async move {
            let mut req = http.get(url);
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            req.send().await.map(|r| r.status().as_u16()).unwrap_or(0)
        }
    };
    // The key from the Secret reached the engine through $(SGLANG_API_KEY).
    assert_eq!(status("/v1/models", None).await, 401);
    assert_eq!(status("/v1/models", Some("s3cret-key")).await, 200);
    // Prometheus scrapes without the key: /metrics must stay open.
    assert_eq!(
        status("/metrics", None).await,
        200,
        "/metrics refused a scrape without the API key"
    );
    delete_service(&client, ns, "keyed").await;
}

#[tokio::test]
async fn j1_gpu_examples_are_admitted_or_refused_and_say_why_they_do_not_serve() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    for file in [
        "llama-8b-tp1-dp2.yaml",
        "llama-70b-tp4.yaml",
        "autoscaled.yaml",
    ] {
        let yaml = example(file);
        let out = c.kubectl_raw(&["apply", "--server-side", "-f", "-"], Some(&yaml));
        if !out.status.success() {
            // Refused at admission: the refusal must say why.
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("SGLangService") && stderr.contains("spec"),
                "{file}: {stderr}"
            );
            continue;
        }
        let name = yaml
            .split("kind: SGLangService")
            .nth(1)
            .and_then(|rest| rest.lines().find_map(|l| l.trim().strip_prefix("name: ")))
            .unwrap_or_else(|| panic!("{file}: no SGLangService name"))
            .to_string();
        let api: Api<SGLangService> = Api::namespaced(client.clone(), "default");
        let sts: Api<Deployment> = Api::namespaced(client.clone(), "default");
        wait_for(&format!("{file}: its engine Deployment"), WAIT, || async {
            sts.get(&format!("{name}-engine"))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await;
        wait_for(
            &format!("{file}: a status that says why it is not serving"),
            WAIT,
            || async {
                let s = api.get(&name).await.map_err(|e| e.to_string())?;
                let conds = s.status.map(|st| st.conditions).unwrap_or_default();
                let ready = conds.iter().find(|c| c.type_ == "Ready");
                match ready {
                    Some(r) if r.status == "False" && !r.message.is_empty() => {
                        let why = conds.iter().any(|c| {
                            (c.type_ == "Degraded" && c.status == "True")
                                || c.type_ == "Progressing"
                        });
                        why.then_some(()).ok_or(format!("{conds:?}"))
                    }
                    _ => Err(format!("{conds:?}")),
                }
            },
        )
        .await;
        delete_service(&client, "default", &name).await;
    }
}

#[tokio::test]
async fn k1_a_hub_model_is_downloaded_once_into_the_cache_and_every_replica_starts_from_it() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let (ns, name) = ("cache-e2e", "hubmodel");
    ensure_namespace(c, ns);
    let model = default_model().unwrap_or_else(|e| panic!("{e}"));
    let file = model
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_else(|| panic!("{}: no file name", model.display()))
        .to_string();
    let size = std::fs::metadata(&model)
        .unwrap_or_else(|e| panic!("{}: {e}", model.display()))
        .len();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let hub = hub::HubServer::start("test-org/smollm2", commit, std::slice::from_ref(&model))
        .unwrap_or_else(|e| panic!("hub server: {e}"));
    let cache = c.work.join(format!("pv-{ns}-hf-cache"));
    let _ = std::fs::remove_dir_all(&cache);
    host_path_claim(c, &client, ns, "hf-cache", &cache.display().to_string()).await;

    // One replica first: its init container downloads the model into the claim.
    c.apply(&format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: {name}
  namespace: {ns}
spec:
  model:
    path: test-org/smollm2/{file}
  device: cpu
  dpSize: 1
  modelCache:
    claimName: hf-cache
    mountPath: /hf-cache
  env:
    - name: HF_ENDPOINT
      value: {endpoint}
  router:
    enabled: false
"#,
        endpoint = hub.endpoint
    ));
    let engines = format!("serving.sgl-rs.io/engine={name}");
    let wait_engines = |n: usize| {
        let engines = engines.clone();
        let client = client.clone();
        async move {
            wait_ready_pods(
                c,
                &client,
                ns,
                &engines,
                n,
                &format!("{n} ready engine pods"),
            )
            .await
        }
    };
    let first = wait_engines(1).await;
    let done = download_state(&first[0])
        .unwrap_or_else(|| panic!("no finished model-download in {:?}", first[0].status));
    assert_eq!(done.exit_code, 0, "{done:?}");
    let fetched = hub.counters();
    assert_eq!(
        (fetched.cdn_get, fetched.cdn_bytes),
        (1, size),
        "the model is fetched once, whole: {fetched:?}"
    );
    // The engine itself started from the cache, offline.
    let snapshot = cache.join(format!(
        "hub/models--test-org--smollm2/snapshots/{commit}/{file}"
    ));
    assert!(snapshot.is_file(), "{} is missing", snapshot.display());
    // The status names the commit the download resolved (from the init container's
    // termination message).
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let shown = c.kubectl(&[
            "get",
            "sgls",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.modelCommit}",
        ]);
        if shown.trim() == commit {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "status.modelCommit is {shown:?}, not {commit}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A second replica starts from the cache: not one file request reaches the Hub.
    c.kubectl(&["scale", "sgls", name, "-n", ns, "--replicas=2"]);
    let both = wait_engines(2).await;
    for p in &both {
        let done = download_state(p)
            .unwrap_or_else(|| panic!("{}: no finished model-download", p.name_any()));
        assert_eq!(done.exit_code, 0, "{done:?}");
    }
    let after = hub.counters();
    assert_eq!(
        after.file_requests(),
        fetched.file_requests(),
        "the second start fetched from the Hub: before {fetched:?}, after {after:?}"
    );
    assert_eq!(after.cdn_bytes, size, "{after:?}");

    // Both engines serve the model from the cache.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    for p in &both {
        let ip = pod_ip(p);
        let models: Value = http
            .get(format!("http://{ip}:30000/v1/models"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let id = models["data"][0]["id"].as_str().unwrap_or("").to_string();
        let body = chat(&http, &ip, &id, "Say hello.")
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", p.name_any()));
        assert!(
            body["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
            "{body}"
        );
    }
    assert_eq!(
        hub.counters().file_requests(),
        fetched.file_requests(),
        "serving reached the Hub"
    );

    delete_service(&client, ns, name).await;
    c.kubectl(&["delete", "pvc", "hf-cache", "-n", ns, "--wait=false"]);
    c.kubectl(&["delete", "pv", &format!("{ns}-hf-cache"), "--wait=false"]);
}
