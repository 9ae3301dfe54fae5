//! Rollouts under streaming load through the router (q1): an engine flag change, a
//! scale-down and an image change, with no failed and no truncated stream; the streams
//! themselves are counted by [`crate::rollout`].

use kube::ResourceExt;
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    delete_service, ensure_chart, ensure_namespace, pod_ip, router_pods, wait_ready_pods,
    wait_serving,
};
use crate::rollout::{self, MODEL};

/// The service of test q1: real engines behind a router, at `dp` replicas, with `image` and
/// `--max-running-requests` given (each a change of the engine's pod template).
fn rolling_service(ns: &str, dp: i32, image: &str, max_running: u32) -> String {
    format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: rolling
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
    servedModelName: {MODEL}
  image: {image}
  device: cpu
  tpSize: 1
  dpSize: {dp}
  maxRunningRequests: {max_running}
  terminationGracePeriodSeconds: 120
  router:
    policy: round_robin
"#
    )
}

/// Starts `n` streams through the router and waits until each has its first event, so each
/// is running on an engine that serves now.
async fn start_long_streams(
    http: &reqwest::Client,
    router_ip: &str,
    n: usize,
    max_tokens: u32,
) -> Vec<tokio::task::JoinHandle<rollout::Record>> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let flags: Vec<Arc<AtomicBool>> = (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let tasks = flags
        .iter()
        .enumerate()
        .map(|(k, flag)| {
            let (http, ip, flag) = (http.clone(), router_ip.to_string(), flag.clone());
            tokio::spawn(async move {
                let prompt = format!("Long story {k}: begin.");
                rollout::stream_chat(&http, &ip, max_tokens, &prompt, Some(&flag)).await
            })
        })
        .collect();
    wait_for("the long streams' first events", WAIT, || async {
        flags
            .iter()
            .all(|f| f.load(Ordering::Acquire))
            .then_some(())
            .ok_or("waiting".to_string())
    })
    .await;
    tasks
}

async fn join_records(
    tasks: Vec<tokio::task::JoinHandle<rollout::Record>>,
) -> Vec<rollout::Record> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| panic!("a stream task: {e}")));
    }
    out
}

/// Streams of `tokens` tokens per second per stream with `n` streams of 32 tokens at once
/// through the router (alongside whatever load runs).
async fn stream_rate(http: &reqwest::Client, router_ip: &str, n: usize) -> f64 {
    let tokens = 32;
    let t = std::time::Instant::now();
    let probes = join_records(start_long_streams(http, router_ip, n, tokens).await).await;
    for r in &probes {
        assert_eq!(r.outcome, rollout::Outcome::Complete, "{r:?}");
    }
    f64::from(tokens) / t.elapsed().as_secs_f64()
}

/// Rollouts under steady streaming load through the router lose nothing: an engine flag
/// change at dpSize 3 and an image change at dpSize 1 complete (every engine pod of the new
/// template, the old ones gone) with no failed and no truncated stream, and so does the
/// scale-down between them. Streams that started on the old engine before the image change
/// outlive its stop signal (they are longer than the preStop wait) and still complete: the
/// engine drains after SIGTERM.
#[tokio::test]
async fn q1_rollouts_under_streaming_load_lose_no_stream() {
    let (c, _turn) = cluster!();
    let t_test = std::time::Instant::now();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let (ns, name) = ("rollout-e2e", "rolling");
    ensure_namespace(c, ns);
    let (old_image, new_image) = (
        "ghcr.io/sgl-rs/sgl-engine:0.1.0",
        "ghcr.io/sgl-rs/sgl-engine:0.1.1",
    );
    c.apply(&rolling_service(ns, 3, old_image, 8));
    wait_serving(c, &client, ns, name, 3).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let router_ip = pod_ip(
        &router_pods(&client, ns, name)
            .await
            .unwrap_or_else(|e| panic!("{e}"))[0],
    );
    // Steady load: three clients, streams of about 2 s each at the rate of one stream per
    // engine with three engines sharing the CPU.
    let rate = stream_rate(&http, &router_ip, 3).await;
    let steady_tokens = ((rate * 2.0) as u32).clamp(16, 512);
    // Long streams: about 16 s at that rate, past a new engine's start and the 5 s preStop
    // wait (about 9 s in all), so they are running when the old engine gets SIGTERM. The old
    // engine serves little else once the new one is ready, so they may run faster than this.
    let long_tokens = ((rate * 16.0) as u32).clamp(64, 2000);
    let load = rollout::StreamLoad::start(&http, &router_ip, 3, steady_tokens);
    wait_for("steady streams to complete", WAIT, || async {
        let n = rollout::tally(&load.records()).0;
        (n >= 2).then_some(()).ok_or(format!("{n} complete"))
    })
    .await;
    let t_load = t_test.elapsed().as_secs_f64();

    // dpSize 3, an engine flag change.
    let before = load.records().len();
    c.apply(&rolling_service(ns, 3, old_image, 6));
    let flag_rollout = rollout::wait_rolled_out(c, &client, ns, name, 3, |p| {
        rollout::engine_args(p)
            .windows(2)
            .any(|w| w[0] == "--max-running-requests" && w[1] == "6")
    })
    .await;
    let during_flag = load.records().len() - before;

    // Down to dpSize 1 (the two engines that go drain as in a rollout), then an image change.
    c.apply(&rolling_service(ns, 1, old_image, 6));
    let selector = format!("serving.sgl-rs.io/engine={name}");
    let old_name =
        wait_ready_pods(c, &client, ns, &selector, 1, "one ready engine").await[0].name_any();
    let long = start_long_streams(&http, &router_ip, 2, long_tokens).await;
    let before = load.records().len();
    let applied = std::time::SystemTime::now();
    c.apply(&rolling_service(ns, 1, new_image, 6));
    let image_rollout = rollout::wait_rolled_out(c, &client, ns, name, 1, |p| {
        rollout::engine_image(p) == new_image
    })
    .await;
    let during_image = load.records().len() - before;
    let long = join_records(long).await;
    let records = load.stop().await;

    let sigterm = rollout::stop_signal_time(&c.pod_log(ns, &old_name))
        .unwrap_or_else(|| panic!("{old_name} logged no stop signal"));
    for r in &long {
        assert_eq!(r.outcome, rollout::Outcome::Complete, "{r:?}");
    }
    let outlived = long.iter().filter(|r| r.ended_at > sigterm).count();
    let sigterm_after = sigterm
        .duration_since(applied)
        .unwrap_or_default()
        .as_secs_f64();
    let long_secs: Vec<String> = long
        .iter()
        .map(|r| format!("{:.1}", r.took.as_secs_f64()))
        .collect();
    let (complete, failed, truncated) = rollout::tally(&records);
    eprintln!(
        "q1: {rate:.1} tokens/s per stream; load from {t_load:.1} s; flag rollout at dp 3 in {:.1} s ({during_flag} streams ended meanwhile); image rollout at dp 1 in {:.1} s (old engine's SIGTERM {sigterm_after:.1} s after the apply; {during_image} steady streams ended meanwhile; {outlived} of 2 long streams of {long_tokens} tokens, {long_secs:?} s, outlived the SIGTERM); steady streams of {steady_tokens} tokens: {complete} complete, {} failed, {} truncated; {:.1} s to here",
        flag_rollout.as_secs_f64(),
        image_rollout.as_secs_f64(),
        failed.len(),
        truncated.len(),
        t_test.elapsed().as_secs_f64(),
    );
    assert!(
        failed.is_empty() && truncated.is_empty(),
        "failed: {failed:?}; truncated: {truncated:?}"
    );
    assert!(
        outlived >= 1,
        "no long stream was running when {old_name} got SIGTERM (the streams are too short to show the drain): {long:?}"
    );
    assert!(
        during_image >= 1 && during_flag >= 1,
        "the load did not run through the rollouts: {during_flag} and {during_image} streams ended during them"
    );
    delete_service(&client, ns, name).await;
    eprintln!(
        "q1: {:.1} s with the deletion",
        t_test.elapsed().as_secs_f64()
    );
}
