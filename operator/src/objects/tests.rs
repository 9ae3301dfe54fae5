//! Each spec field lands where the engine, router or autoscaler reads it.

use serde_json::{Value, json};

use super::{Kind, Plan, plan};
use crate::fixtures::service;

fn planned(spec: Value) -> Plan {
    plan(&service(spec)).unwrap()
}

fn object(p: &Plan, kind: Kind) -> &Value {
    &p.get(kind)
        .unwrap_or_else(|| panic!("no {kind:?} planned"))
        .object
}

fn named<'a>(p: &'a Plan, kind: Kind, name: &str) -> &'a Value {
    &p.get_named(kind, name)
        .unwrap_or_else(|| panic!("no {kind:?} {name} planned"))
        .object
}

/// The engine Deployment of the `llama` service.
fn engines(p: &Plan) -> &Value {
    named(p, Kind::Deployment, "llama-engine")
}

/// The router Deployment of the `llama` service.
fn routers(p: &Plan) -> &Value {
    named(p, Kind::Deployment, "llama-router")
}

fn engine(p: &Plan) -> &Value {
    &engines(p)["spec"]["template"]["spec"]["containers"][0]
}

fn router(p: &Plan) -> &Value {
    &routers(p)["spec"]["template"]["spec"]["containers"][0]
}

fn strings(v: &Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

#[test]
fn engine_flags_follow_the_spec() {
    let cases = [
        (
            json!({"model": {"path": "m", "servedModelName": "chat"}}),
            "--served-model-name",
            "chat",
        ),
        (
            json!({"model": {"path": "m", "tokenizerPath": "/tok"}}),
            "--tokenizer-path",
            "/tok",
        ),
        (
            json!({"model": {"path": "m", "chatTemplate": "/t/chatml.jinja"}}),
            "--chat-template",
            "/t/chatml.jinja",
        ),
        (
            json!({"model": {"path": "m", "chatTemplateConfigMap": {"name": "t", "key": "k"}}}),
            "--chat-template",
            "/etc/sgl-engine/chat-template/chat_template.jinja",
        ),
        (
            json!({"model": {"path": "org/name", "revision": "v2"}}),
            "--revision",
            "v2",
        ),
        (
            json!({"model": {"path": "/models/x"}}),
            "--model-path",
            "/models/x",
        ),
        (json!({"tpSize": 8}), "--tp-size", "8"),
        (json!({"device": "cpu"}), "--device", "cpu"),
        (
            json!({"quantization": "awq_marlin"}),
            "--quantization",
            "awq_marlin",
        ),
        (
            json!({"kvCacheDtype": "fp8_e4m3"}),
            "--kv-cache-dtype",
            "fp8_e4m3",
        ),
        (
            json!({"grammarBackend": "xgrammar"}),
            "--grammar-backend",
            "xgrammar",
        ),
        (json!({"contextLength": 4096}), "--context-length", "4096"),
        (
            json!({"memFractionStatic": 0.9}),
            "--mem-fraction-static",
            "0.9",
        ),
        (
            json!({"maxRunningRequests": 64}),
            "--max-running-requests",
            "64",
        ),
        (
            json!({"maxTotalTokens": 100000}),
            "--max-total-tokens",
            "100000",
        ),
        (
            json!({"chunkedPrefillSize": -1}),
            "--chunked-prefill-size",
            "-1",
        ),
        (
            json!({"schedulePolicy": "dfs-weight"}),
            "--schedule-policy",
            "dfs-weight",
        ),
        (json!({"logLevel": "debug"}), "--log-level", "debug"),
    ];
    let baseline = strings(&engine(&planned(json!({})))["args"]);
    for (spec, flag, value) in cases {
        // Rendered without the CRD's rules: values the engine does not serve yet (tpSize 8,
        // quantization) still have their flag ready for the day it does.
        let args = super::engine_args(&service(spec.clone()));
        assert!(
            has_pair(&args, flag, value),
            "{spec}: {flag} {value} not in {args:?}"
        );
        assert_ne!(args, baseline, "{spec} changed nothing");
    }
    assert!(baseline.contains(&"--enable-metrics".to_string()));
    // Secrets never appear on the command line.
    let keyed = strings(
        &engine(&planned(
            json!({"apiKeySecretRef": {"name": "s", "key": "k"}, "model": {"path": "org/m", "hfTokenSecretRef": {"name": "hf", "key": "t"}}}),
        ))["args"],
    );
    assert!(
        !keyed
            .iter()
            .any(|a| a.contains("key") || a.contains("KEY") || a.contains("TOKEN")),
        "{keyed:?}"
    );
    let extra = strings(&engine(&planned(json!({"extraArgs": ["--random-seed", "7"]})))["args"]);
    assert_eq!(&extra[extra.len() - 2..], ["--random-seed", "7"]);
}

#[test]
fn pod_settings_follow_the_spec() {
    let p = planned(json!({
        "image": "registry.local/engine:dev",
        "imagePullPolicy": "Always",
        "resources": {"requests": {"cpu": "4"}, "limits": {"memory": "32Gi"}},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "env": [{"name": "RUST_LOG", "value": "debug"}],
        "model": {"path": "m", "revision": "v2", "hfTokenSecretRef": {"name": "hf", "key": "token"}},
        "apiKeySecretRef": {"name": "api", "key": "key"},
        "modelCache": {"claimName": "weights", "mountPath": "/cache", "readOnly": true},
    }));
    let c = engine(&p);
    let pod = &engines(&p)["spec"]["template"]["spec"];
    assert_eq!(c["image"], "registry.local/engine:dev");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(router(&p)["imagePullPolicy"], "Always");
    assert_eq!(c["resources"]["requests"]["cpu"], "4");
    assert_eq!(c["resources"]["requests"]["nvidia.com/gpu"], "1");
    assert_eq!(c["resources"]["limits"]["memory"], "32Gi");
    assert_eq!(pod["nodeSelector"]["pool"], "gpu");
    let tolerations: Vec<&str> = pod["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["key"].as_str())
        .collect();
    assert_eq!(tolerations, ["dedicated", "nvidia.com/gpu"]);
    assert!(pod["affinity"]["podAntiAffinity"].is_object());
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["value"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert!(env.contains(&("HF_HOME".into(), "/cache".into())));
    let from_secret = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"]["secretKeyRef"].clone())
    };
    assert_eq!(
        from_secret("HF_TOKEN"),
        Some(json!({"name": "hf", "key": "token"}))
    );
    assert_eq!(
        from_secret("SGLANG_API_KEY"),
        Some(json!({"name": "api", "key": "key"}))
    );
    assert!(has_pair(&strings(&c["args"]), "--revision", "v2"));
    assert_eq!(c["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert!(env.contains(&("RUST_LOG".into(), "debug".into())));
    assert_eq!(
        pod["volumes"][1]["persistentVolumeClaim"],
        json!({"claimName": "weights", "readOnly": true})
    );
    assert_eq!(c["volumeMounts"][1]["mountPath"], "/cache");
    assert_eq!(pod["volumes"][0]["emptyDir"]["medium"], "Memory");
    // Memory-backed: without a limit a process could fill the node's memory through it.
    assert_eq!(pod["volumes"][0]["emptyDir"]["sizeLimit"], "1Gi");
    assert_eq!(c["volumeMounts"][0]["mountPath"], "/dev/shm");
}

#[test]
fn engines_prefer_distinct_nodes_and_scaling_keeps_the_pod_template() {
    let template = |dp: i32| {
        let p = planned(json!({"dpSize": dp}));
        engines(&p)["spec"]["template"].clone()
    };
    let t = template(1);
    assert_eq!(
        t["spec"]["topologySpreadConstraints"],
        json!([{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {
                "app.kubernetes.io/name": "sglang",
                "app.kubernetes.io/instance": "llama",
                "app.kubernetes.io/component": "engine",
            }},
        }])
    );
    // The constraint selects exactly the engine pods of this service.
    let pod_labels = t["metadata"]["labels"].as_object().unwrap();
    for (k, v) in t["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(pod_labels.get(k), Some(v), "{k}");
    }
    assert_eq!(template(4), t, "a scale changed the pod template");
}

#[test]
fn probes_wait_for_a_slow_load_and_spare_a_busy_engine() {
    let p = planned(json!({}));
    let c = engine(&p);
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/health", "{probe}");
    }
    let patience = |probe: &str| {
        c[probe]["periodSeconds"].as_i64().unwrap() * c[probe]["failureThreshold"].as_i64().unwrap()
    };
    assert!(patience("startupProbe") >= 1800);
    assert!(patience("livenessProbe") >= 120);
    assert!(c["livenessProbe"]["timeoutSeconds"].as_i64().unwrap() >= 10);
}

#[test]
fn cpu_services_request_no_gpu() {
    let p = planned(json!({"device": "cpu"}));
    let c = engine(&p);
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "1", "memory": "2Gi"}})
    );
    assert!(
        engines(&p)["spec"]["template"]["spec"]
            .get("tolerations")
            .is_none()
    );
}

#[test]
fn router_follows_the_spec_and_discovers_only_its_engines() {
    let p = planned(
        json!({"router": {"replicas": 3, "policy": "round_robin", "cacheThreshold": 0.3,
        "balanceAbsThreshold": 8, "balanceRelThreshold": 1.5, "image": "r:1", "queueSize": 7,
        "queueTimeoutSeconds": 20}, "apiKeySecretRef": {"name": "s", "key": "k"}}),
    );
    let r = router(&p);
    let args = strings(&r["args"]);
    for (flag, value) in [
        ("--policy", "round_robin"),
        ("--cache-threshold", "0.3"),
        ("--balance-abs-threshold", "8"),
        ("--balance-rel-threshold", "1.5"),
        ("--queue-size", "7"),
        ("--queue-timeout-secs", "20"),
        ("--selector", "serving.sgl-rs.io/engine=llama"),
        ("--service-discovery-namespace", "ml"),
    ] {
        assert!(
            has_pair(&args, flag, value),
            "{flag} {value} not in {args:?}"
        );
    }
    assert_eq!(r["image"], "r:1");
    assert_eq!(r["env"][0]["name"], "SGL_ROUTER_API_KEY");
    assert_eq!(routers(&p)["spec"]["replicas"], 3);
    let engine_labels = &engines(&p)["spec"]["template"]["metadata"]["labels"];
    assert_eq!(engine_labels["serving.sgl-rs.io/engine"], "llama");
    let role = object(&p, Kind::Role);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])
    );
    assert_eq!(
        routers(&p)["spec"]["template"]["spec"]["serviceAccountName"],
        "llama-router"
    );
}

#[test]
fn autoscaling_targets_the_engines_with_both_metrics() {
    let p = planned(
        json!({"autoscaling": {"minReplicas": 2, "maxReplicas": 10, "targetQueueLength": 2.5,
        "targetCacheHitRate": 0.8, "scaleDownStabilizationSeconds": 120}}),
    );
    let hpa = object(&p, Kind::HorizontalPodAutoscaler);
    assert_eq!(
        hpa["spec"]["scaleTargetRef"],
        json!({"apiVersion": "serving.sgl-rs.io/v1alpha1", "kind": "SGLangService", "name": "llama"})
    );
    assert_eq!(hpa["spec"]["minReplicas"], 2);
    assert_eq!(
        hpa["spec"]["metrics"][0]["pods"]["metric"]["name"],
        super::QUEUE_METRIC
    );
    assert_eq!(
        hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"],
        "2500m"
    );
    assert_eq!(
        hpa["spec"]["metrics"][1]["pods"]["metric"]["name"],
        super::KV_USAGE_METRIC
    );
    assert_eq!(
        hpa["spec"]["metrics"][1]["pods"]["target"]["averageValue"],
        "800m"
    );
    assert_eq!(
        hpa["spec"]["metrics"][2]["pods"]["metric"]["name"],
        super::SCALE_DOWN_BRAKE_METRIC
    );
    assert_eq!(
        hpa["spec"]["metrics"][2]["pods"]["target"]["averageValue"],
        "1"
    );
    assert_eq!(
        hpa["spec"]["metrics"][3]["pods"]["metric"]["name"],
        super::CACHE_MISS_METRIC
    );
    assert_eq!(
        hpa["spec"]["metrics"][3]["pods"]["target"]["averageValue"],
        "200m"
    );
    assert_eq!(
        hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
        120
    );
    // The StatefulSet follows dpSize, which the HPA writes through the scale subresource.
    assert_eq!(engines(&p)["spec"]["replicas"], 2);

    let off = planned(json!({"autoscaling": {"enabled": false, "maxReplicas": 3}}));
    assert!(off.get(Kind::HorizontalPodAutoscaler).is_none());
    assert!(
        off.delete
            .contains(&(Kind::HorizontalPodAutoscaler, "llama-engine".into()))
    );
    assert_eq!(engines(&off)["spec"]["replicas"], 2);
}

#[test]
fn scale_to_zero_adds_the_routers_waiting_requests() {
    let p = planned(json!({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}));
    let hpa = object(&p, Kind::HorizontalPodAutoscaler);
    assert_eq!(hpa["spec"]["minReplicas"], 0);
    let metrics = hpa["spec"]["metrics"].as_array().unwrap();
    assert_eq!(metrics.len(), 4, "{metrics:?}");
    assert_eq!(
        metrics[3],
        json!({"type": "Object", "object": {
            "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "llama-router"},
            "metric": {"name": super::ROUTER_WAITING_METRIC},
            "target": {"type": "Value", "value": "1"}}})
    );
    // With one engine at least, the router's queue plays no part.
    let one = planned(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}));
    let hpa = object(&one, Kind::HorizontalPodAutoscaler);
    assert!(
        hpa["spec"]["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["type"] == "Pods"),
        "{hpa}"
    );
    // Without the router nothing could hold the first request: the spec is refused.
    let svc = service(json!({"router": {"enabled": false},
        "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}));
    let err = plan(&svc).unwrap_err().to_string();
    assert!(err.contains("needs the router"), "{err}");
}

#[test]
fn with_keda_scale_to_zero_is_a_scaled_object_instead_of_the_hpa() {
    let keda = super::PlanOptions {
        keda_prometheus_url: Some("http://prometheus.monitoring.svc:9090".into()),
    };
    let svc = service(json!({"autoscaling": {"minReplicas": 0, "maxReplicas": 3,
        "targetQueueLength": 2, "scaleDownStabilizationSeconds": 60}}));
    let p = super::plan_with(&svc, &keda).unwrap();
    assert!(p.get(Kind::HorizontalPodAutoscaler).is_none());
    assert!(
        p.delete
            .contains(&(Kind::HorizontalPodAutoscaler, "llama-engine".into()))
    );
    let so = object(&p, Kind::ScaledObject);
    assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
    assert_eq!(
        so["spec"]["scaleTargetRef"],
        json!({"apiVersion": "serving.sgl-rs.io/v1alpha1", "kind": "SGLangService", "name": "llama"})
    );
    assert_eq!(so["spec"]["minReplicaCount"], 0);
    assert_eq!(so["spec"]["maxReplicaCount"], 3);
    assert_eq!(so["spec"]["cooldownPeriod"], 60);
    assert_eq!(so["spec"]["initialCooldownPeriod"], 60);
    assert_eq!(so["spec"]["pollingInterval"], 5);
    let waiting = &so["spec"]["triggers"][0];
    assert_eq!(waiting["type"], "prometheus");
    assert_eq!(
        waiting["metadata"]["serverAddress"],
        "http://prometheus.monitoring.svc:9090"
    );
    assert_eq!(
        waiting["metadata"]["query"],
        r#"sum(sgl_router_pending_requests{namespace="ml",service="llama-router"}) or vector(0)"#
    );
    assert_eq!(waiting["metadata"]["activationThreshold"], "0");
    assert_eq!(waiting["metadata"]["threshold"], "2");
    assert_eq!(
        so["metadata"]["ownerReferences"][0]["kind"],
        "SGLangService"
    );

    // A service that keeps an engine keeps the operator's HPA, and loses any ScaledObject.
    let one = service(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}));
    let p = super::plan_with(&one, &keda).unwrap();
    assert!(p.get(Kind::HorizontalPodAutoscaler).is_some());
    assert!(p.get(Kind::ScaledObject).is_none());
    assert!(
        p.delete
            .contains(&(Kind::ScaledObject, "llama-engine".into()))
    );
    // Without the option the operator never touches ScaledObjects.
    let p = plan(&svc).unwrap();
    assert!(p.get(Kind::HorizontalPodAutoscaler).is_some());
    assert!(!p.delete.iter().any(|(k, _)| *k == Kind::ScaledObject));
}

#[test]
fn monitoring_adds_a_service_monitor() {
    let p = planned(json!({"monitoring": {"serviceMonitor": true, "interval": "15s"}}));
    let sm = object(&p, Kind::ServiceMonitor);
    assert_eq!(
        sm["spec"]["endpoints"][0],
        json!({"port": "http", "path": "/metrics", "interval": "15s"})
    );
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "llama"
    );
    assert!(
        planned(json!({}))
            .delete
            .contains(&(Kind::ServiceMonitor, "llama".into()))
    );
}

#[test]
fn service_monitor_labels_are_added_and_ours_keep_their_values() {
    let p = planned(json!({"monitoring": {"serviceMonitor": true, "labels": {
        "release": "kube-prometheus-stack",
        "app.kubernetes.io/instance": "other",
    }}}));
    let labels = &object(&p, Kind::ServiceMonitor)["metadata"]["labels"];
    assert_eq!(labels["release"], "kube-prometheus-stack");
    assert_eq!(labels["app.kubernetes.io/instance"], "llama");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "sgl-operator");
    // Only the ServiceMonitor carries them.
    let sts = engines(&p);
    assert!(sts["metadata"]["labels"].get("release").is_none());
}

#[test]
fn every_example_renders() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut rendered = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc).unwrap();
            if value["kind"] != "SGLangService" {
                continue;
            }
            let mut svc: sgl_crds::SGLangService = serde_json::from_value(value).unwrap();
            svc.metadata.uid = Some("uid".into());
            // An example that needs what the engine does not serve yet says so, and is
            // refused (tests/engine_flags.rs checks the messages).
            if text.contains("refused at apply time") {
                assert!(
                    super::render_yaml(&svc, &Default::default()).is_err(),
                    "{}",
                    path.display()
                );
                continue;
            }
            let yaml = super::render_yaml(&svc, &Default::default())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(yaml.contains("kind: Deployment"), "{}", path.display());
            assert!(!yaml.contains("kind: StatefulSet"), "{}", path.display());
            rendered += 1;
        }
    }
    assert!(rendered >= 3, "only {rendered} examples rendered");
}

#[test]
fn a_chat_template_config_map_is_mounted_where_the_flag_points() {
    let p = planned(
        json!({"model": {"path": "m", "chatTemplateConfigMap": {"name": "templates", "key": "llama.jinja"}}}),
    );
    let c = engine(&p);
    let pod = &engines(&p)["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "chat-template")
        .unwrap();
    assert_eq!(
        volume["configMap"],
        json!({"name": "templates", "items": [{"key": "llama.jinja", "path": "chat_template.jinja"}]})
    );
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "chat-template")
        .unwrap();
    assert_eq!(mount["readOnly"], true);
    let flag = format!(
        "{}/chat_template.jinja",
        mount["mountPath"].as_str().unwrap()
    );
    assert!(has_pair(&strings(&c["args"]), "--chat-template", &flag));
}

#[test]
fn no_pod_is_best_effort() {
    let p = planned(json!({}));
    assert_eq!(
        engine(&p)["resources"]["requests"],
        json!({"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"})
    );
    assert_eq!(
        router(&p)["resources"]["requests"],
        json!({"cpu": "100m", "memory": "128Mi"})
    );
    // What the user names stays theirs: a limit alone becomes the request (a default request
    // above it would be refused).
    let p = planned(json!({
        "resources": {"limits": {"memory": "1Gi"}},
        "router": {"resources": {"requests": {"cpu": "2"}}},
    }));
    assert_eq!(
        engine(&p)["resources"],
        json!({"requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}})
    );
    assert_eq!(
        router(&p)["resources"]["requests"],
        json!({"cpu": "2", "memory": "128Mi"})
    );
}

#[test]
fn pods_meet_the_restricted_pod_security_standard() {
    let p = planned(json!({"modelCache": {"claimName": "weights"},
        "model": {"path": "m", "chatTemplateConfigMap": {"name": "t", "key": "k"}}}));
    for (kind, c) in [("engine", engine(&p)), ("router", router(&p))] {
        let workload = if kind == "engine" {
            engines(&p)
        } else {
            routers(&p)
        };
        let pod = &workload["spec"]["template"]["spec"];
        let sc = &pod["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{kind:?}");
        assert!(sc["runAsUser"].as_i64().unwrap() > 0, "{kind:?}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{kind:?}");
        let csc = &c["securityContext"];
        assert_eq!(csc["allowPrivilegeEscalation"], false, "{kind:?}");
        assert_eq!(csc["capabilities"], json!({"drop": ["ALL"]}), "{kind:?}");
        assert!(csc.get("privileged").is_none(), "{kind:?}");
        // Only volume types the standard allows.
        for v in pod["volumes"].as_array().into_iter().flatten() {
            assert!(
                ["emptyDir", "persistentVolumeClaim", "configMap", "secret"]
                    .iter()
                    .any(|t| v.get(*t).is_some()),
                "{v}"
            );
        }
    }
    assert_eq!(
        router(&p)["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    assert_eq!(
        engines(&p)["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"],
        "1Gi"
    );
}

#[test]
fn stopping_pods_drain_within_the_spec_grace_period() {
    for (spec, grace) in [
        (json!({}), 300),
        (json!({"terminationGracePeriodSeconds": 900}), 900),
    ] {
        let p = planned(spec);
        for (kind, workload) in [("engine", engines(&p)), ("router", routers(&p))] {
            let c = &workload["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(
                c["lifecycle"]["preStop"]["sleep"]["seconds"],
                super::PRE_STOP_SECONDS,
                "{kind:?}"
            );
            assert_eq!(
                workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
                grace + super::PRE_STOP_SECONDS,
                "{kind:?}"
            );
            assert_eq!(c["terminationMessagePolicy"], "FallbackToLogsOnError");
        }
    }
}

/// An update starts a new engine before it stops an old one, and an older operator's engine
/// StatefulSet is on the list of what goes.
#[test]
fn engine_updates_bring_a_new_replica_up_first() {
    let p = planned(json!({"dpSize": 3}));
    let spec = &engines(&p)["spec"];
    assert_eq!(spec["replicas"], 3);
    assert_eq!(
        spec["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    assert_eq!(spec["progressDeadlineSeconds"], 1800);
    assert!(p.get(Kind::StatefulSet).is_none());
    assert!(
        p.delete
            .contains(&(Kind::StatefulSet, "llama-engine".into()))
    );
}

#[test]
fn the_router_has_a_disruption_budget() {
    let p = planned(json!({"router": {"replicas": 3}}));
    let pdb = p
        .apply
        .iter()
        .find(|m| m.kind == Kind::PodDisruptionBudget && m.name == "llama-router")
        .unwrap();
    assert_eq!(pdb.object["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb.object["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        "router"
    );
    let off = planned(json!({"router": {"enabled": false}}));
    assert!(
        off.delete
            .contains(&(Kind::PodDisruptionBudget, "llama-router".into()))
    );
    // The engines' budget stays.
    assert!(
        off.apply
            .iter()
            .any(|m| m.kind == Kind::PodDisruptionBudget && m.name == "llama-engine")
    );
}

fn env_value(c: &Value, name: &str) -> Option<Value> {
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| {
            e.get("value")
                .cloned()
                .unwrap_or_else(|| e["valueFrom"].clone())
        })
}

#[test]
fn a_hub_model_with_a_cache_is_downloaded_once_before_the_engine_starts() {
    let p = planned(json!({
        "model": {"path": "org/llama-7b", "revision": "v2", "hfTokenSecretRef": {"name": "hf", "key": "token"}},
        "modelCache": {"claimName": "weights", "mountPath": "/cache"},
        "env": [{"name": "HF_ENDPOINT", "value": "http://mirror.local"}],
        "apiKeySecretRef": {"name": "api", "key": "key"},
    }));
    let pod = &engines(&p)["spec"]["template"]["spec"];
    let init = pod["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 1);
    let d = &init[0];
    assert_eq!(d["name"], "model-download");
    assert_eq!(d["image"], engine(&p)["image"]);
    assert_eq!(strings(&d["command"]), ["sgl-engine"]);
    assert_eq!(
        strings(&d["args"]),
        [
            "download",
            "org/llama-7b",
            "--termination-message-path",
            "/dev/termination-log",
            "--revision",
            "v2"
        ]
    );
    assert_eq!(
        d["volumeMounts"],
        json!([{"name": "model-cache", "mountPath": "/cache", "readOnly": false}])
    );
    assert_eq!(d["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert!(d["resources"]["limits"].get("nvidia.com/gpu").is_none());
    // The download reads the Hub settings; the API key is the engine's alone.
    assert_eq!(env_value(d, "HF_HOME"), Some(json!("/cache")));
    assert_eq!(
        env_value(d, "HF_ENDPOINT"),
        Some(json!("http://mirror.local"))
    );
    assert_eq!(
        env_value(d, "HF_TOKEN"),
        Some(json!({"secretKeyRef": {"name": "hf", "key": "token"}}))
    );
    assert_eq!(env_value(d, "SGLANG_API_KEY"), None);
    assert_eq!(env_value(d, "HF_HUB_OFFLINE"), None);
    // The engine starts from the cache and never reaches the Hub.
    let c = engine(&p);
    assert_eq!(env_value(c, "HF_HUB_OFFLINE"), Some(json!("1")));
    assert_eq!(env_value(c, "HF_HOME"), Some(json!("/cache")));
    assert!(has_pair(
        &strings(&c["args"]),
        "--model-path",
        "org/llama-7b"
    ));
    assert!(has_pair(&strings(&c["args"]), "--revision", "v2"));

    // A GGUF file of a repository is a Hub id too.
    let gguf = planned(json!({"device": "cpu",
        "model": {"path": "org/smol/smol.Q4.gguf"}, "modelCache": {"claimName": "w"}}));
    let pod = &engines(&gguf)["spec"]["template"]["spec"];
    assert_eq!(
        strings(&pod["initContainers"][0]["args"]),
        [
            "download",
            "org/smol/smol.Q4.gguf",
            "--termination-message-path",
            "/dev/termination-log"
        ]
    );
}

#[test]
fn no_download_without_a_writable_cache_or_a_hub_id() {
    for (spec, offline) in [
        // No cache: the engine fetches the model itself at start.
        (json!({"model": {"path": "org/name"}}), None),
        // A local path: nothing to fetch.
        (
            json!({"model": {"path": "/models/m"}, "modelCache": {"claimName": "w"}}),
            None,
        ),
        // A read-only cache holds the weights already: the engine reads it offline.
        (
            json!({"model": {"path": "org/name"}, "modelCache": {"claimName": "w", "readOnly": true}}),
            Some(json!("1")),
        ),
        // The spec's own value wins, once.
        (
            json!({"model": {"path": "org/name"}, "modelCache": {"claimName": "w"},
                "env": [{"name": "HF_HUB_OFFLINE", "value": "0"}]}),
            Some(json!("0")),
        ),
    ] {
        let p = planned(spec.clone());
        let c = engine(&p);
        assert_eq!(env_value(c, "HF_HUB_OFFLINE"), offline, "{spec}");
        let names: Vec<&Value> = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| &e["name"])
            .collect();
        let unique: std::collections::HashSet<String> =
            names.iter().map(|n| n.to_string()).collect();
        assert_eq!(unique.len(), names.len(), "{spec}: {names:?}");
        let pod = &engines(&p)["spec"]["template"]["spec"];
        let downloads = pod.get("initContainers").is_some();
        assert_eq!(
            downloads,
            spec["modelCache"].is_object()
                && spec["model"]["path"] == "org/name"
                && offline != Some(json!("1")),
            "{spec}"
        );
    }
}

#[test]
fn hub_ids_are_told_from_local_paths() {
    for id in [
        "org/name",
        "meta-llama/Llama-3.1-8B-Instruct",
        "o/n/sub/f.GGUF",
    ] {
        assert!(super::is_hub_id(id), "{id}");
    }
    for path in [
        "/models/m",
        "m",
        "./org/name",
        "org/name/config.json",
        "org--x/name",
        "org/name/../f.gguf",
        "",
    ] {
        assert!(!super::is_hub_id(path), "{path}");
    }
}
