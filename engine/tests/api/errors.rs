//! Bad input, authentication and size limits: clear 4xx answers, never a crash.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{self, API_KEY, Server};
use crate::{assert_error, context_length, greedy_chat, server};

#[tokio::test]
async fn auth_required_except_health_and_metrics() {
    let s = server();
    let anon = reqwest::Client::new();
    let health = anon.get(s.url("/health")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    // Prometheus scrapes a keyed engine without the key.
    let metrics = anon.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let text = metrics.text().await.unwrap();
    assert!(text.contains("sglang:num_running_reqs"), "{text}");
    for (method, path) in [
        ("GET", "/v1/models"),
        ("POST", "/generate"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/get_server_info"),
    ] {
        let req = match method {
            "GET" => anon.get(s.url(path)),
            _ => anon.post(s.url(path)).json(&json!({"text": "hi"})),
        };
        let (status, body) = common::read(req.send().await.unwrap()).await;
        assert_error(status, &body, 401, "API key", &format!("no key on {path}"));
        let req = match method {
            "GET" => anon.get(s.url(path)),
            _ => anon.post(s.url(path)).json(&json!({"text": "hi"})),
        };
        let (status, body) = common::read(req.bearer_auth("wrong-key").send().await.unwrap()).await;
        assert_error(
            status,
            &body,
            401,
            "invalid API key",
            &format!("wrong key on {path}"),
        );
    }
}

#[tokio::test]
async fn bad_inputs_get_clear_400s() {
    let s = server();
    let ctx = context_length(s).await;
    let chat = |extra: Value| {
        let mut b = greedy_chat("Hi", 4);
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let ctx_msg = format!("context length {ctx}");
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            "/v1/chat/completions",
            json!({"model": "default"}),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"content": "hi"}]}),
            400,
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": -0.5})),
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": "hot"})),
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": 0})),
            400,
            "top_p",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": 1.5})),
            400,
            "top_p",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_k": 0})),
            400,
            "top_k",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_k": -3})),
            400,
            "top_k",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"min_p": 1.5})),
            400,
            "min_p",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 0})),
            400,
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": "many"})),
            400,
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": ctx})),
            400,
            &ctx_msg,
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop": 5})),
            400,
            "stop",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream": "yes"})),
            400,
            "stream",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"model": "gpt-4"})),
            404,
            "default",
        ),
        ("/v1/completions", json!({"max_tokens": 4}), 400, "prompt"),
        ("/v1/completions", json!({"prompt": ""}), 400, "empty"),
        ("/v1/completions", json!({"prompt": []}), 400, "empty"),
        (
            "/v1/completions",
            json!({"prompt": [1, "a"]}),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 99999999]}),
            400,
            "vocabulary",
        ),
        (
            "/generate",
            json!({"sampling_params": {}}),
            400,
            "input_ids",
        ),
        (
            "/generate",
            json!({"text": "a", "input_ids": [1]}),
            400,
            "not both",
        ),
        ("/generate", json!({"text": ""}), 400, "empty"),
        ("/generate", json!({"input_ids": []}), 400, "empty"),
        (
            "/generate",
            json!({"text": ["a", "b"], "sampling_params": [{}]}),
            400,
            "sampling_params",
        ),
        (
            "/generate",
            json!({"text": "a", "sampling_params": {"max_new_tokens": -1}}),
            400,
            "sampling_params.max_new_tokens",
        ),
        (
            "/generate",
            json!({"text": "a", "sampling_params": {"top_k": 0}}),
            400,
            "sampling_params.top_k",
        ),
        (
            "/generate",
            json!({"text": "a", "sampling_params": {"max_new_tokens": ctx}}),
            400,
            "prompt has",
        ),
    ];
    for (path, body, status, text) in &cases {
        let (got, resp) = s.post(path, body).await;
        assert_error(got, &resp, *status, text, &format!("{path} {body}"));
    }

    // Bodies that are not JSON objects.
    let client = s.client();
    for (raw, text) in [
        ("{\"messages\": [", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ("", "empty"),
    ] {
        let resp = client
            .post(s.url("/v1/chat/completions"))
            .body(raw)
            .send()
            .await
            .unwrap();
        let (got, body) = common::read(resp).await;
        assert_error(got, &body, 400, text, raw);
    }
    // Too large: announce 33 MiB and send a little; the server answers from the header.
    let status = oversized_body_status(s).await;
    assert_eq!(status, 413);
    // Unknown route.
    let (got, body) = s.get("/v1/nothing-here").await;
    assert_error(got, &body, 404, "no route", "unknown route");
}

/// Status line of a request whose `Content-Length` is over the 32 MiB limit.
async fn oversized_body_status(s: &Server) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://").to_string();
    let conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {API_KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"prompt\": \"aaaa",
        33 * 1024 * 1024
    );
    let (mut rd, mut wr) = conn.into_split();
    // Keep sending in the background in case the server reads up to the limit first.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(head.as_bytes()).await;
        let block = vec![b'a'; 1024 * 1024];
        for _ in 0..34 {
            if wr.write_all(&block).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(60), rd.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    writer.abort();
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    status.parse().unwrap()
}
