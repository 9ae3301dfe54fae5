//! The router in front of real engine processes (the default model) on loopback.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use sgl_e2e_tests::{Server, start_engine, start_router};

/// Engines are CPU-heavy: run one test of this file at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn engines(n: usize) -> Vec<Server> {
    (0..n)
        .map(|i| start_engine(&format!("engine{i}"), &["--num-threads", "1"]).unwrap())
        .collect()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

async fn generate(
    c: &reqwest::Client,
    router: &str,
    text: &str,
    max_new_tokens: u32,
) -> (u16, Value) {
    let resp = c
        .post(format!("{router}/generate"))
        .json(&json!({
            "text": text,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": true},
        }))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Requests each worker has received, from the router's `/list_workers`.
async fn processed(c: &reqwest::Client, router: &str) -> HashMap<String, u64> {
    let v: Value = c
        .get(format!("{router}/list_workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["url"].as_str().unwrap().to_string(),
                w["processed"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn system_prompt(group: usize) -> String {
    let topics = ["astronomy", "cooking", "sailing", "chess"];
    format!(
        "<|im_start|>system\nYou are a patient tutor of {topic}. Explain every idea about {topic} \
         step by step, with one short example from the history of {topic}, and end with a \
         question that checks understanding.<|im_end|>\n<|im_start|>user\n",
        topic = topics[group % topics.len()]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_groups_stay_on_one_engine_and_hit_its_cache() {
    let _serial = SERIAL.lock().await;
    let engines = engines(2);
    let router = start_router(&[&engines[0], &engines[1]], &["--policy", "cache_aware"]).unwrap();
    let c = client();
    let url = router.url();
    let mut served_by: HashMap<usize, HashSet<String>> = HashMap::new();
    for round in 0..3 {
        for group in 0..3 {
            let before = processed(&c, url).await;
            let prompt = format!("{}Question {round}: why?", system_prompt(group));
            let (status, body) = generate(&c, url, &prompt, 1).await;
            assert_eq!(status, 200, "{body}\n{}", router.log_tail());
            let after = processed(&c, url).await;
            let worker: Vec<&String> = after.keys().filter(|k| after[*k] > before[*k]).collect();
            assert_eq!(worker.len(), 1, "one attempt per request");
            served_by
                .entry(group)
                .or_default()
                .insert(worker[0].clone());
            let meta = &body["meta_info"];
            let (cached, total) = (
                meta["cached_tokens"].as_u64().unwrap(),
                meta["prompt_tokens"].as_u64().unwrap(),
            );
            if round > 0 {
                assert!(
                    cached * 2 > total,
                    "group {group} round {round}: only {cached} of {total} prompt tokens were cached"
                );
            }
        }
    }
    for (group, workers) in &served_by {
        assert_eq!(workers.len(), 1, "group {group} was split over {workers:?}");
    }
    let used: HashSet<&String> = served_by.values().flatten().collect();
    assert_eq!(used.len(), 2, "three groups use both engines");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_engine_mid_load_loses_no_request() {
    let _serial = SERIAL.lock().await;
    let mut engines = engines(2);
    let router = start_router(
        &[&engines[0], &engines[1]],
        &[
            "--policy",
            "round_robin",
            "--health-check-interval-secs",
            "1",
        ],
    )
    .unwrap();
    let c = client();
    let url = router.url().to_string();
    let total: u64 = 16;
    let tasks: Vec<_> = (0..total)
        .map(|i| {
            let c = c.clone();
            let url = url.clone();
            tokio::spawn(async move {
                generate(&c, &url, &format!("Count from {i} to {}:", i + 5), 256).await
            })
        })
        .collect();
    // Kill engine 1 once every request has been routed and its share is queued or running.
    let start = Instant::now();
    while processed(&c, &url).await.values().sum::<u64>() < total
        && start.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    engines[1].kill();
    // Requests the killed engine held are answered 502 and not sent on to the other engine
    // (a request that kills its engine must not walk through the fleet); every other one
    // is served.
    let mut cut = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        if status == 502 {
            let msg = body["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("not retried"), "{body}");
            cut += 1;
            continue;
        }
        assert_eq!(status, 200, "{body}\n{}", router.log_tail());
        assert!(
            body["text"].as_str().is_some_and(|t| !t.is_empty()),
            "{body}"
        );
    }
    assert!(
        cut <= total / 2,
        "only the killed engine's share failed: {cut}"
    );
    // New requests go around the dead engine (its refused connections are retried).
    for i in 0..4 {
        let (status, body) = generate(&c, &url, &format!("After the kill {i}:"), 4).await;
        assert_eq!(status, 200, "{body}\n{}", router.log_tail());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_arrive_token_by_token_and_every_route_is_served() {
    let _serial = SERIAL.lock().await;
    let engines = engines(1);
    let router = start_router(&[&engines[0]], &[]).unwrap();
    let c = client();
    let url = router.url();
    let prompt = "The three primary colors are";
    let (status, whole) = generate(&c, url, prompt, 48).await;
    assert_eq!(status, 200);

    let resp = c
        .post(format!("{url}/generate"))
        .json(&json!({
            "text": prompt,
            "stream": true,
            "sampling_params": {"temperature": 0, "max_new_tokens": 48, "ignore_eos": true},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut events: Vec<(Instant, String)> = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event = buf[..end].trim().to_string();
            buf.drain(..end + 2);
            if let Some(data) = event.strip_prefix("data: ") {
                events.push((Instant::now(), data.to_string()));
            }
        }
    }
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let texts: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        texts.len() >= 6,
        "one event per token or so, got {}",
        texts.len()
    );
    assert_eq!(
        texts.last().unwrap()["text"],
        whole["text"],
        "the stream adds up to the answer"
    );
    // Decoding takes time per token: the first event must not wait for the last.
    let spread = events[events.len() - 2].0 - events[0].0;
    assert!(
        spread > Duration::from_millis(20),
        "events arrived together ({spread:?})"
    );

    for path in [
        "/v1/models",
        "/get_model_info",
        "/get_server_info",
        "/health",
        "/health_generate",
    ] {
        let resp = c.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let chat: Value = c
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": "default", "max_tokens": 4,
                      "messages": [{"role": "user", "content": "Say hi."}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant", "{chat}");
    let resp = c.post(format!("{url}/flush_cache")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let flushed: Value = resp.json().await.unwrap();
    assert_eq!(flushed["flushed"], json!([engines[0].url()]));
}
