//! Requests built to take a server down: each gets a clear 4xx, and the server keeps serving.
//!
//! One server of its own (the real binary on the real model), so that a request that kills it
//! fails these tests and no others.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::OnceLock;

use common::Server;
use serde_json::{Value, json};

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| Server::start("hardening", &[]))
}

/// The server still answers a normal request with generated text.
async fn still_serves(s: &Server, after: &str) {
    let (status, body) = s
        .post(
            "/generate",
            &json!({"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}),
        )
        .await;
    assert_eq!(
        status,
        200,
        "after {after}: {body}\nserver log:\n{}",
        s.log_tail()
    );
    assert!(body["text"].is_string(), "after {after}: {body}");
}

fn assert_400(status: u16, body: &Value, want: &str, case: &str) {
    assert_eq!(status, 400, "{case}: {body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(want),
        "{case}: message {msg:?} should mention {want:?}"
    );
}

#[tokio::test]
async fn deeply_nested_grammar_is_a_400_on_every_route() {
    let s = server();
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
    for (path, body) in cases {
        let (status, answer) = s.post(path, &body).await;
        assert_400(status, &answer, "nested more than", path);
        still_serves(s, path).await;
    }
}

#[tokio::test]
async fn other_deep_inputs_are_400s() {
    let s = server();
    let depth = 10_000;
    let nested_json = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    // The body itself nested 10,000 deep: the JSON parser's recursion limit answers.
    let resp = s
        .client()
        .post(s.url("/generate"))
        .header("content-type", "application/json")
        .body(format!("{{\"text\": \"Hi\", \"x\": {nested_json}}}"))
        .send()
        .await
        .unwrap();
    let (status, body) = common::read(resp).await;
    assert_400(status, &body, "recursion limit", "nested body");
    still_serves(s, "nested body").await;

    let deep_regex = format!("{}a{}", "(".repeat(depth), ")".repeat(depth));
    let deep_lark = format!("start: {}\"a\"{}", "(".repeat(depth), ")".repeat(depth));
    let chain: String = (0..20_000)
        .map(|i| format!("\"d{i}\":{{\"$ref\":\"#/$defs/d{}\"}},", i + 1))
        .collect();
    let ref_chain = format!(
        "{{\"$ref\":\"#/$defs/d0\",\"$defs\":{{{chain}\"d20000\":{{\"type\":\"string\"}}}}}}"
    );
    let cases = [
        ("regex", json!({"regex": deep_regex}), "regex"),
        ("lark", json!({"ebnf": deep_lark}), "ebnf"),
        (
            "json_schema $ref chain",
            json!({"json_schema": ref_chain}),
            "json_schema",
        ),
    ];
    for (case, extra, field) in cases {
        let mut sampling = json!({"max_new_tokens": 2, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            sampling[k] = v.clone();
        }
        let (status, body) = s
            .post(
                "/generate",
                &json!({"text": "Hi", "sampling_params": sampling}),
            )
            .await;
        // Refused (or, for the $ref chain, possibly compiled and served); never a crash.
        if status != 200 {
            assert_400(status, &body, field, case);
        }
        still_serves(s, case).await;
    }
}

#[tokio::test]
async fn completions_without_max_tokens_get_openais_default_of_16() {
    let s = server();
    for max_tokens in [None, Some(Value::Null)] {
        let mut body = json!({"model": "default", "prompt": "Once upon a time",
                              "temperature": 0, "ignore_eos": true});
        if let Some(m) = &max_tokens {
            body["max_tokens"] = m.clone();
        }
        let (status, r) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(
            r["usage"]["completion_tokens"], 16,
            "max_tokens {max_tokens:?}: {r}"
        );
        assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    }
}

#[tokio::test]
async fn every_error_has_a_json_body_405_included() {
    let s = server();
    let c = s.client();
    for (method, path, want) in [
        (reqwest::Method::GET, "/generate", 405),
        (reqwest::Method::DELETE, "/v1/chat/completions", 405),
        (reqwest::Method::POST, "/health", 405),
        (reqwest::Method::GET, "/no/such/route", 404),
    ] {
        let resp = c.request(method.clone(), s.url(path)).send().await.unwrap();
        let (status, body) = common::read(resp).await;
        assert_eq!(status, want, "{method} {path}: {body}");
        assert_eq!(body["error"]["code"], want, "{method} {path}: {body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(path), "{method} {path}: {body}");
    }
}

#[tokio::test]
async fn stop_strings_are_bounded_and_many_still_match() {
    let s = server();
    let base = json!({"model": "default", "prompt": "Once upon a time", "max_tokens": 32,
                      "temperature": 0, "ignore_eos": true});
    let with = |stop: Value| {
        let mut b = base.clone();
        b["stop"] = stop;
        b
    };
    let too_many: Vec<String> = (0..65).map(|i| format!("never-{i}")).collect();
    let (status, body) = s.post("/v1/completions", &with(json!(too_many))).await;
    assert_400(status, &body, "at most 64", "65 stop strings");
    let (status, body) = s
        .post("/v1/completions", &with(json!(["x".repeat(300)])))
        .await;
    assert_400(status, &body, "at most 256", "a 300-byte stop string");
    let ids: Vec<u32> = (0..1025).collect();
    let mut b = base.clone();
    b["stop_token_ids"] = json!(ids);
    let (status, body) = s.post("/v1/completions", &b).await;
    assert_400(status, &body, "at most 1024", "1025 stop token ids");

    // 64 stop strings, the last two of which the output is bound to contain.
    let mut stops: Vec<String> = (0..62).map(|i| format!("never-{i}")).collect();
    stops.push(" ".into());
    stops.push("\n".into());
    let (status, r) = s.post("/v1/completions", &with(json!(stops))).await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{r}");
    let matched = choice["matched_stop"].as_str().unwrap_or_default();
    assert!(matched == " " || matched == "\n", "{r}");
    let text = choice["text"].as_str().unwrap();
    assert!(!text.contains(matched), "the stop string is trimmed: {r}");
}

mod connections {
    //! The listener's limits, on a small app served by `serve_with_limits` over loopback.

    use std::time::{Duration, Instant};

    use axum::Router;
    use axum::routing::get;
    use sgl_http::listen::{ConnLimits, serve_with_limits};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(limits: ConnLimits) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let app = Router::new().route("/", get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with_limits(listener, app, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Reads until the server closes the connection (or answers); false at the deadline.
    async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
        let mut buf = [0u8; 1024];
        let start = Instant::now();
        while start.elapsed() < limit {
            match tokio::time::timeout(limit - start.elapsed(), stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
        false
    }

    #[tokio::test]
    async fn half_sent_headers_and_idle_connections_are_closed() {
        let (addr, _stop) = start(ConnLimits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(1),
        })
        .await;
        let mut half = TcpStream::connect(&addr).await.unwrap();
        half.write_all(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-")
            .await
            .unwrap();
        assert!(
            closed_within(&mut half, Duration::from_secs(20)).await,
            "a half-sent request head is dropped"
        );
        let mut idle = TcpStream::connect(&addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = idle.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
        assert!(
            closed_within(&mut idle, Duration::from_secs(20)).await,
            "an idle keep-alive connection is closed"
        );
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_for_a_free_slot() {
        let (addr, _stop) = start(ConnLimits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(3600),
        })
        .await;
        // Two clients that hold their connections without finishing a request.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            held.push(s);
        }
        let mut third = TcpStream::connect(&addr).await.unwrap();
        third
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        // While both slots are held the third connection is not served.
        let early = tokio::time::timeout(Duration::from_secs(1), third.read(&mut buf)).await;
        assert!(early.is_err(), "served beyond the connection cap");
        drop(held.pop());
        let n = tokio::time::timeout(Duration::from_secs(20), third.read(&mut buf))
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    }
}

/// Tensor-parallel flags are checked before anything loads, each refusal saying why: a size
/// that is not a power of two up to 8, a CPU engine, a model whose heads do not split, and
/// the multi-node flags (accepted by name, refused for now).
#[test]
fn parallelism_and_quantization_flags_get_clear_errors() {
    let model = common::model_path();
    let check = |extra: &[&str]| -> (bool, String) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sgl-engine"))
            .args(["serve", "--check", "--model-path"])
            .arg(&model)
            .args(extra)
            .output()
            .expect("run sgl-engine serve --check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    for (flags, says) in [
        (&["--tp-size", "3"][..], "expected 1, 2, 4 or 8"),
        (&["--tp-size", "16"][..], "expected 1, 2, 4 or 8"),
        (&["--tp-size", "2", "--device", "cpu"][..], "--device cuda"),
        // SmolLM2-135M has 9 attention heads (3 KV heads)
        (
            &["--tp-size", "2", "--device", "cuda"][..],
            "9 attention heads",
        ),
        (&["--nnodes", "2"][..], "multi-node"),
        (&["--dist-init-addr", "10.0.0.1:5000"][..], "multi-node"),
        (&["--quantization", "awq"][..], "is not supported: fp8"),
        (
            &["--quantization", "fp8", "--device", "cpu"][..],
            "--quantization fp8 runs on the GPU (--device cuda)",
        ),
        (
            &["--kv-cache-dtype", "fp8_e5m2", "--device", "cpu"][..],
            "--kv-cache-dtype fp8_e4m3 and fp8_e5m2 run on the GPU (--device cuda)",
        ),
        (
            &["--kv-cache-dtype", "int4"][..],
            "--kv-cache-dtype int4 is not supported (auto, fp8_e4m3, fp8_e5m2)",
        ),
    ] {
        let (ok, text) = check(flags);
        assert!(!ok, "{flags:?} was accepted: {text}");
        assert!(
            text.contains(says),
            "{flags:?}: expected {says:?} in: {text}"
        );
    }
    let (ok, text) = check(&["--tp-size", "1", "--device", "cpu"]);
    assert!(ok, "tp 1 refused: {text}");
}
