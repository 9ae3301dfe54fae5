//! The operator through restarts and outages: a restarted operator that writes nothing to
//! objects that are up to date (f1), two replicas electing one leader and the follower taking
//! over when the leader dies (l1), and 20 s without the API server ridden out with no restart
//! (n1).

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use sgl_crds::SGLangService;
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    CHART_NS, RELEASE, cluster_script, delete_service, ensure_chart, ensure_namespace,
    fake_service, lease_holder, operator_deployment, operator_metric, operator_pods,
    operator_restarts, pod_ip, ready_pods, wait_engine_replicas, wait_serving,
};

#[tokio::test]
async fn f1_operator_restart_makes_no_writes() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "restart-e2e";
    ensure_namespace(c, ns);
    c.apply(&fake_service(ns, "steady", 2, ""));
    wait_serving(c, &client, ns, "steady", 2).await;
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    wait_for("the service to be Ready", WAIT, || async {
        let s = api.get("steady").await.map_err(|e| e.to_string())?;
        let ready = s.status.as_ref().is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        ready.then_some(()).ok_or(format!("{:?}", s.status))
    })
    .await;
    let versions = || async {
        let out = c.kubectl(&[
            "get",
            "sglangservices,statefulsets,deployments,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets",
            "-n",
            ns,
            "-o",
            "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion}{\"\\n\"}{end}",
        ]);
        out.lines().map(str::to_string).collect::<Vec<_>>()
    };
    let before = versions().await;
    assert!(before.len() >= 4, "{before:?}");
    // Restart: delete the operator pods; the Deployment brings up new ones, which reconcile
    // every service on start.
    let old: HashSet<String> = ready_pods(
        &client,
        CHART_NS,
        &format!("app.kubernetes.io/instance={RELEASE}"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .iter()
    .map(|p| p.name_any())
    .collect();
    c.kubectl(&[
        "delete",
        "pods",
        "-n",
        CHART_NS,
        "-l",
        &format!("app.kubernetes.io/instance={RELEASE}"),
        "--wait=true",
    ]);
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("a new operator to reconcile the service", WAIT, || async {
        let pods = ready_pods(
            &client,
            CHART_NS,
            &format!("app.kubernetes.io/instance={RELEASE}"),
        )
        .await?;
        for p in pods.iter().filter(|p| !old.contains(&p.name_any())) {
            let url = format!("http://{}:8080/metrics", pod_ip(p));
            let text = http
                .get(&url)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            let reconciled = text
                .lines()
                .filter(|l| l.starts_with("sgl_operator_reconciliations_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
            if reconciled >= 1.0 {
                return Ok(());
            }
        }
        Err("no new operator has reconciled yet".into())
    })
    .await;
    let after = versions().await;
    assert_eq!(
        before, after,
        "the restarted operator wrote to objects that were up to date"
    );
    delete_service(&client, ns, "steady").await;
}

#[tokio::test]
async fn l1_two_operators_elect_one_leader_and_the_follower_takes_over_when_it_dies() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let ns = "leader-e2e";
    ensure_namespace(c, ns);
    let (leader, follower) = wait_for("two operators, one of them leading", WAIT, || async {
        let pods = ready_pods(
            &client,
            CHART_NS,
            &format!("app.kubernetes.io/instance={RELEASE}"),
        )
        .await?;
        if pods.len() != 2 {
            return Err(format!("{} ready operator pods", pods.len()));
        }
        let holder = lease_holder(&client).await?;
        let (lead, follow): (Vec<Pod>, Vec<Pod>) =
            pods.into_iter().partition(|p| p.name_any() == holder);
        match (lead.as_slice(), follow.as_slice()) {
            ([l], [f]) => Ok((l.clone(), f.clone())),
            _ => Err(format!(
                "the lease holder {holder} is not one of the two pods"
            )),
        }
    })
    .await;
    // One leads and reconciles; the other follows and does not.
    assert_eq!(
        operator_metric(&http, &leader, "sgl_operator_leader").await,
        Ok(1.0)
    );
    assert_eq!(
        operator_metric(&http, &follower, "sgl_operator_leader").await,
        Ok(0.0)
    );
    let follower_before = operator_metric(&http, &follower, "sgl_operator_reconciliations_total")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    c.apply(&fake_service(ns, "led", 1, ""));
    wait_engine_replicas(&client, ns, "led", 1).await;
    let leader_count = operator_metric(&http, &leader, "sgl_operator_reconciliations_total")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(leader_count >= 1.0, "the leader has not reconciled");
    assert_eq!(
        operator_metric(&http, &follower, "sgl_operator_reconciliations_total").await,
        Ok(follower_before),
        "the follower reconciled while another replica led"
    );
    // Kill the leader and keep it dead. Scaling the Deployment down alone is not enough: the
    // ReplicaSet picks the pod to remove from its own cache, ranking a pod that is not ready
    // (a probe timing out on a busy machine) or whose deletion cost it has not seen yet ahead
    // of the cost, and once removed the follower instead (the leader kept the lease and
    // the test waited in vain). So the leader is deleted first: the ReplicaSet no longer
    // counts it, and the replacement it may start is newer and not yet ready, so the scale
    // down removes that one. The deletion costs stay for the case where the scale reaches the
    // ReplicaSet before the deletion does.
    let deployment = operator_deployment(&client).await.name_any();
    for (pod, cost) in [(&leader, "-100"), (&follower, "100")] {
        c.kubectl(&[
            "annotate",
            "pod",
            "-n",
            CHART_NS,
            &pod.name_any(),
            &format!("controller.kubernetes.io/pod-deletion-cost={cost}"),
            "--overwrite",
        ]);
    }
    c.kubectl(&[
        "delete",
        "pod",
        "-n",
        CHART_NS,
        &leader.name_any(),
        "--wait=false",
    ]);
    c.kubectl(&[
        "scale",
        "deployment",
        "-n",
        CHART_NS,
        &deployment,
        "--replicas=1",
    ]);
    wait_for("the follower to take the lease over", WAIT, || async {
        let holder = lease_holder(&client).await?;
        let left: Vec<String> = operator_pods(&client)
            .await?
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        (holder == follower.name_any() && left == [follower.name_any()])
            .then_some(())
            .ok_or(format!("holder {holder}, pods {left:?}"))
    })
    .await;
    // A change made after the takeover is reconciled by the new leader.
    c.apply(&fake_service(ns, "led", 3, ""));
    wait_engine_replicas(&client, ns, "led", 3).await;
    assert_eq!(
        operator_metric(&http, &follower, "sgl_operator_leader").await,
        Ok(1.0)
    );
    let taken_over = operator_metric(&http, &follower, "sgl_operator_reconciliations_total")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        taken_over > follower_before,
        "the new leader has not reconciled"
    );
    delete_service(&client, ns, "led").await;
    c.kubectl(&[
        "scale",
        "deployment",
        "-n",
        CHART_NS,
        &deployment,
        "--replicas=2",
    ]);
    ensure_chart(c, &client).await;
}

#[tokio::test]
async fn n1_the_operator_rides_out_20s_without_the_api_server() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let ns = "outage-e2e";
    ensure_namespace(c, ns);
    // Engines that no node takes: the service stays Progressing and is reconciled every few
    // seconds, so reconciles run into the outage.
    let pinned = "  nodeSelector: {sgl-e2e/nowhere: \"true\"}\n";
    c.apply(&fake_service(ns, "patient", 1, pinned));
    wait_engine_replicas(&client, ns, "patient", 1).await;
    let restarts = operator_restarts(&client).await;
    assert_eq!(restarts.len(), 2, "{restarts:?}");
    let failures = |pods: Vec<Pod>| {
        let http = http.clone();
        async move {
            let mut sum = 0.0;
            for p in &pods {
                sum += operator_metric(&http, p, "sgl_operator_reconcile_failures_total")
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "operator {} does not answer (did it exit?): {e}",
                            p.name_any()
                        )
                    });
            }
            sum
        }
    };
    let pods = operator_pods(&client)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let failed_before = failures(pods.clone()).await;
    // A change, then the API server goes away while the operator reconciles it.
    c.apply(&fake_service(ns, "patient", 2, pinned));
    cluster_script(c, "apiserver-stop");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let failed_during = failures(pods.clone()).await;
    cluster_script(c, "apiserver-start");
    assert!(
        failed_during > failed_before,
        "no reconcile failed while the API server was away ({failed_before} -> {failed_during})"
    );
    wait_engine_replicas(&client, ns, "patient", 2).await;
    // The watches came back: a change made after the outage is seen and applied.
    c.apply(&fake_service(ns, "patient", 3, pinned));
    wait_engine_replicas(&client, ns, "patient", 3).await;
    // One leader again, and no operator process was restarted.
    wait_for("one operator to lead again", WAIT, || async {
        let holder = lease_holder(&client).await?;
        let mut leading = Vec::new();
        for p in &pods {
            if operator_metric(&http, p, "sgl_operator_leader").await? == 1.0 {
                leading.push(p.name_any());
            }
        }
        (leading == [holder.clone()])
            .then_some(())
            .ok_or(format!("lease held by {holder}, leading: {leading:?}"))
    })
    .await;
    assert_eq!(
        operator_restarts(&client).await,
        restarts,
        "an operator was restarted"
    );
    delete_service(&client, ns, "patient").await;
}
