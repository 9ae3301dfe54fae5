//! Server-level routes and request lifecycle: info, health, client disconnects, cache flush.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use crate::common::{API_KEY, Server};
use crate::{assert_error, greedy_chat, served_model, server};

#[tokio::test]
async fn models_and_server_info() {
    let s = server();
    let model = served_model(s).await;
    let (status, card) = s.get(&format!("/v1/models/{model}")).await;
    assert_eq!(status, 200, "{card}");
    assert_eq!(card["id"], json!(model));

    let (status, info) = s.get("/get_model_info").await;
    assert_eq!(status, 200);
    assert!(
        info["model_path"].as_str().unwrap().ends_with(".gguf"),
        "{info}"
    );
    assert_eq!(info["is_generation"], json!(true));

    let (status, info) = s.get("/get_server_info").await;
    assert_eq!(status, 200);
    for key in [
        "context_length",
        "max_total_num_tokens",
        "num_running_reqs",
        "num_used_tokens",
        "version",
    ] {
        assert!(
            info.get(key).is_some(),
            "get_server_info lacks {key}: {info}"
        );
    }
    assert_eq!(info["enable_metrics"], json!(true));
    assert_eq!(info["schedule_conservativeness"], json!(1.0), "{info}");
    assert_ne!(
        info["api_key"],
        json!(API_KEY),
        "the API key must not be shown"
    );

    let (status, _) = s.get("/health_generate").await;
    assert_eq!(status, 200);

    // No --device was given: a build without CUDA serves on the CPU and says why.
    if !cfg!(feature = "cuda") {
        assert_eq!(info["device"], json!("cpu"), "{info}");
        let log = s.log_text();
        assert!(
            log.contains("device: cpu (this build has no CUDA support"),
            "no device line in the log:\n{}",
            s.log_tail()
        );
    }
}

/// `serve --check` on the real model: reads the config, tokenizer and chat template, binds
/// nothing, loads no weights; a flag the model cannot honour fails with the reason.
#[test]
fn serve_check_validates_without_serving() {
    let model = crate::common::model_path();
    let check = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sgl-engine"))
            .arg("serve")
            .arg("--model-path")
            .arg(&model)
            .args(["--check", "--port", "1"])
            .args(extra)
            .output()
            .expect("run sgl-engine serve --check");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = check(&[]);
    assert!(ok, "{stdout}\n{stderr}");
    // SmolLM2-135M: 30 layers, hidden 576, 9 query / 3 KV heads, 49,152 tokens.
    assert!(
        stdout.starts_with("ok: ")
            && stdout.contains("30 layers, hidden 576, 9 attention / 3 KV heads"),
        "{stdout}"
    );
    assert!(stdout.contains("tokens"), "{stdout}");

    let (ok, _, stderr) = check(&["--context-length", "100000000"]);
    assert!(!ok);
    assert!(
        stderr.contains("--context-length 100000000 is longer than the model's"),
        "{stderr}"
    );

    let (ok, _, stderr) = check(&["--tp-size", "3"]);
    assert!(!ok);
    assert!(stderr.contains("--tp-size"), "{stderr}");

    for bad in ["-1", "nan", "inf"] {
        let (ok, _, stderr) = check(&["--schedule-conservativeness", bad]);
        assert!(!ok, "--schedule-conservativeness {bad} was accepted");
        assert!(stderr.contains("--schedule-conservativeness"), "{stderr}");
    }

    if !cfg!(feature = "cuda") {
        let (ok, _, stderr) = check(&["--device", "cuda"]);
        assert!(!ok);
        assert!(stderr.contains("CUDA"), "{stderr}");
    }
}

/// Wait until nothing runs or waits, then flush the cache: every KV slot must be free again.
/// `within` must be far shorter than the abandoned generations would take to finish, so that
/// only an abort can make the server idle in time.
pub async fn assert_no_leak(s: &Server, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (_, info) = s.get("/get_server_info").await;
        let idle = info["num_running_reqs"] == json!(0) && info["num_queue_reqs"] == json!(0);
        if idle {
            let (status, _) = s.post("/flush_cache", &json!({})).await;
            if status == 200 {
                let (_, info) = s.get("/get_server_info").await;
                if info["num_used_tokens"] == json!(0) {
                    return;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "requests or KV tokens still held after clients left: {info}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn client_disconnect_frees_the_request() {
    let s = server();
    // Generations of 7000 tokens take minutes on a CPU; aborted, they end at once.
    // Streaming: read two chunks, then hang up.
    let req = json!({"prompt": "Tell me a very long story.", "max_tokens": 7000, "ignore_eos": true, "stream": true});
    let resp = s
        .client()
        .post(s.url("/v1/completions"))
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.bytes_stream();
    for _ in 0..2 {
        body.next().await.unwrap().unwrap();
    }
    // While it runs, the cache cannot be flushed (SGLang answers 400 then too).
    let (status, resp) = s.post("/flush_cache", &json!({})).await;
    assert_error(status, &resp, 400, "not flushed", "flush while busy");
    drop(body);
    // Non-streaming: give up waiting after a moment.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let r = impatient
        .post(s.url("/generate"))
        .bearer_auth(API_KEY)
        .json(&json!({"text": "Another long story:", "sampling_params": {"max_new_tokens": 7000, "ignore_eos": true}}))
        .send()
        .await;
    assert!(
        r.is_err(),
        "the request should have timed out on the client"
    );

    assert_no_leak(s, Duration::from_secs(45)).await;
    // With --log-requests the server says why each request ended early.
    let aborted = s
        .log_text()
        .matches("request aborted: the client went away")
        .count();
    assert!(
        aborted >= 2,
        "{aborted} aborts logged; log tail:\n{}",
        s.log_tail()
    );
    // And the server still serves.
    let (status, body) = s.post("/v1/chat/completions", &greedy_chat("Hi", 2)).await;
    assert_eq!(status, 200, "{body}");
}
