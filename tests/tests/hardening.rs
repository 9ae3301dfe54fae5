//! Requests built to take a fleet down, sent through the router to three real engines.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use sgl_e2e_tests::{Server, start_engine, start_router};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

async fn post(c: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let resp = c.post(url).json(body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Waits until the router sees every worker healthy.
async fn all_healthy(c: &reqwest::Client, router: &str, n: usize) -> bool {
    for _ in 0..600 {
        let v: Value = c
            .get(format!("{router}/list_workers"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let healthy = v["workers"]
            .as_array()
            .map(|w| w.iter().filter(|w| w["healthy"] == true).count())
            .unwrap_or(0);
        if healthy == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_grammar_through_the_router_leaves_every_engine_alive() {
    let engines: Vec<Server> = (0..3)
        .map(|i| start_engine(&format!("engine{i}"), &["--num-threads", "1"]).unwrap())
        .collect();
    let refs: Vec<&Server> = engines.iter().collect();
    let router = start_router(&refs, &[]).unwrap();
    let c = client();
    assert!(
        all_healthy(&c, router.url(), 3).await,
        "{}",
        router.log_tail()
    );

    let depth = 10_000;
    let ebnf = format!("root ::= {}\"a\"{}", "(".repeat(depth), ")".repeat(depth));
    let cases = [
        (
            "/generate",
            json!({"text": "Hi", "sampling_params": {"max_new_tokens": 4, "ebnf": ebnf}}),
        ),
        (
            "/v1/completions",
            json!({"model": "default", "prompt": "Hi", "max_tokens": 4, "ebnf": ebnf}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": 4, "ebnf": ebnf}),
        ),
    ];
    for (path, body) in &cases {
        let (status, answer) = post(&c, &format!("{}{path}", router.url()), body).await;
        assert_eq!(status, 400, "{path}: {answer}");
        let msg = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("nested more than"), "{path}: {msg}");
    }
    // A prompt far past the context: each engine refuses it, and the router keeps none of it.
    let long = "word ".repeat(400_000);
    let (status, answer) = post(
        &c,
        &format!("{}/generate", router.url()),
        &json!({"text": long, "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");

    // Every engine is alive and serves.
    for e in &engines {
        let (status, r) = post(
            &c,
            &format!("{}/generate", e.url()),
            &json!({"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}),
        )
        .await;
        assert_eq!(status, 200, "{}: {r}\n{}", e.name(), e.log_tail());
    }
    let workers: Value = c
        .get(format!("{}/list_workers", router.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for w in workers["workers"].as_array().unwrap() {
        assert_eq!(w["healthy"], true, "{w}");
        assert_eq!(w["tree_chars"], 0, "refused text is not kept: {w}");
    }
}
