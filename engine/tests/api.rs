//! End-to-end tests of the HTTP API: the real binary serving the real model, called over HTTP.
//!
//! Most tests share one server started with `--api-key --enable-metrics --enable-cache-report
//! --log-requests`; the `skip_tokenizer` tests share a second one started with
//! `--skip-tokenizer-init`. Tests run in parallel against the shared server, so checks of
//! global counters wait for the server to be idle.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{API_KEY, Server, sse_json};
use futures::StreamExt;
use serde_json::{Value, json};

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        Server::start(
            "api",
            &[
                "--api-key",
                API_KEY,
                "--enable-metrics",
                "--enable-cache-report",
                "--log-requests",
            ],
        )
        .with_key(API_KEY)
    })
}

fn skip_tokenizer_server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| Server::start("skip-tokenizer", &["--skip-tokenizer-init"]))
}

async fn served_model(s: &Server) -> String {
    let (status, models) = s.get("/v1/models").await;
    assert_eq!(status, 200, "{models}");
    models["data"][0]["id"].as_str().unwrap().to_string()
}

async fn context_length(s: &Server) -> u64 {
    let (_, info) = s.get("/get_server_info").await;
    info["context_length"].as_u64().unwrap()
}

fn assert_error(status: u16, body: &Value, want_status: u16, want_text: &str, case: &str) {
    assert_eq!(status, want_status, "{case}: {body}");
    let msg = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: no error.message in {body}"));
    assert!(
        msg.to_lowercase().contains(&want_text.to_lowercase()),
        "{case}: message {msg:?} should mention {want_text:?}"
    );
    assert_eq!(
        body["error"]["code"].as_u64(),
        Some(want_status as u64),
        "{case}: {body}"
    );
}

fn greedy_chat(content: &str, max_tokens: u64) -> Value {
    json!({
        "model": "default",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

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
    assert_ne!(
        info["api_key"],
        json!(API_KEY),
        "the API key must not be shown"
    );

    let (status, _) = s.get("/health_generate").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn auth_required_except_health() {
    let s = server();
    let anon = reqwest::Client::new();
    let health = anon.get(s.url("/health")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    for (method, path) in [
        ("GET", "/v1/models"),
        ("POST", "/generate"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/get_server_info"),
        ("GET", "/metrics"),
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
async fn chat_completion() {
    let s = server();
    let model = served_model(s).await;
    let (status, body) = s
        .post(
            "/v1/chat/completions",
            &greedy_chat("What is the capital of France?", 16),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], json!("chat.completion"));
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["model"], json!(model));
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], json!(0));
    assert_eq!(choice["message"]["role"], json!("assistant"));
    assert!(
        !choice["message"]["content"].as_str().unwrap().is_empty(),
        "{body}"
    );
    let reason = choice["finish_reason"].as_str().unwrap();
    assert!(reason == "stop" || reason == "length", "{body}");
    let u = &body["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 5 && c >= 1 && c <= 16, "{u}");
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + c);
    if reason == "length" {
        assert_eq!(c, 16);
    }
    // max_completion_tokens is the newer name of max_tokens.
    let mut req = greedy_chat("Say hello.", 16);
    req.as_object_mut().unwrap().remove("max_tokens");
    req["max_completion_tokens"] = json!(3);
    let (status, body) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
}

#[tokio::test]
async fn completions_prompt_forms_and_echo() {
    let s = server();
    let prompt = "The capital of France is";
    let base = json!({"model": "default", "prompt": prompt, "max_tokens": 6, "temperature": 0});
    let (status, one) = s.post("/v1/completions", &base).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["object"], json!("text_completion"));
    let text = one["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());

    let mut echo = base.clone();
    echo["echo"] = json!(true);
    let (_, e) = s.post("/v1/completions", &echo).await;
    assert_eq!(
        e["choices"][0]["text"].as_str().unwrap(),
        format!("{prompt}{text}")
    );

    let mut list = base.clone();
    list["prompt"] = json!([prompt, "One, two, three,"]);
    let (status, l) = s.post("/v1/completions", &list).await;
    assert_eq!(status, 200, "{l}");
    let choices = l["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(
        choices[0]["text"].as_str().unwrap(),
        text,
        "batched greedy equals single greedy"
    );
    assert_eq!(choices[1]["index"], json!(1));

    // Token ids: take them from /generate's view of the same prompt.
    let (_, g) = s
        .post(
            "/generate",
            &json!({"text": prompt, "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
    let n_prompt = g["meta_info"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(n_prompt, one["usage"]["prompt_tokens"].as_u64().unwrap());
    let mut ids = base.clone();
    ids["prompt"] = json!([1, 2, 3, 4]);
    let (status, r) = s.post("/v1/completions", &ids).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], json!(4));
    ids["prompt"] = json!([[1, 2, 3], [4, 5]]);
    let (status, r) = s.post("/v1/completions", &ids).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    assert_eq!(r["usage"]["prompt_tokens"], json!(5));

    // n samples per prompt: choice i*n+j; each prompt's tokens count once in usage.
    let mut two = base.clone();
    two["prompt"] = json!([prompt, "One, two, three,"]);
    two["n"] = json!(2);
    let (status, r) = s.post("/v1/completions", &two).await;
    assert_eq!(status, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert_eq!(
        choices[0]["text"], choices[1]["text"],
        "greedy samples agree"
    );
    assert_eq!(choices[1]["text"].as_str().unwrap(), text);
    assert_eq!(choices[3]["index"], json!(3));
    assert_eq!(
        r["usage"]["prompt_tokens"].as_u64().unwrap(),
        l["usage"]["prompt_tokens"].as_u64().unwrap()
    );
}

/// Content pieces of chat chunks, checking the chunk shapes on the way.
fn chat_stream_text(chunks: &[Value]) -> (String, usize, Option<Value>, Option<Value>) {
    assert_eq!(
        chunks[0]["choices"][0]["delta"]["role"],
        json!("assistant"),
        "{}",
        chunks[0]
    );
    let mut text = String::new();
    let mut pieces = 0;
    let mut finish = None;
    let mut usage = None;
    for c in chunks {
        assert_eq!(c["object"], json!("chat.completion.chunk"), "{c}");
        if c["choices"].as_array().unwrap().is_empty() {
            usage = Some(c["usage"].clone());
            continue;
        }
        let choice = &c["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str()
            && !t.is_empty()
        {
            text.push_str(t);
            pieces += 1;
        }
        if !choice["finish_reason"].is_null() {
            assert!(finish.is_none(), "two finish chunks");
            finish = Some(choice.clone());
        }
    }
    (text, pieces, finish, usage)
}

#[tokio::test]
async fn chat_streaming_matches_non_streaming() {
    let s = server();
    let req = greedy_chat("Write one sentence about the sea.", 12);
    let (_, full) = s.post("/v1/chat/completions", &req).await;
    let want = full["choices"][0]["message"]["content"].as_str().unwrap();
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let chunks = sse_json(&s.post_sse("/v1/chat/completions", &sreq).await);
    let (text, pieces, finish, usage) = chat_stream_text(&chunks);
    assert_eq!(text, want);
    let completion = full["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(
        pieces > 1 && pieces * 2 >= completion,
        "{pieces} pieces for {completion} tokens: not token by token"
    );
    assert_eq!(
        finish.unwrap()["finish_reason"],
        full["choices"][0]["finish_reason"]
    );
    let usage = usage.expect("usage chunk");
    assert_eq!(
        usage["completion_tokens"],
        full["usage"]["completion_tokens"]
    );
    assert_eq!(usage["prompt_tokens"], full["usage"]["prompt_tokens"]);
}

#[tokio::test]
async fn completion_streaming_arrives_incrementally() {
    let s = server();
    let req = json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "ignore_eos": true, "stream": true});
    let resp = s
        .client()
        .post(s.url("/v1/completions"))
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // Read the body as it arrives: chunks must come over time, not all at the end.
    let mut body = resp.bytes_stream();
    let mut arrivals = Vec::new();
    let mut text = String::new();
    while let Some(part) = body.next().await {
        let part = part.unwrap();
        text.push_str(&String::from_utf8_lossy(&part));
        arrivals.push(Instant::now());
    }
    assert!(
        arrivals.len() > 2,
        "the stream came in {} reads",
        arrivals.len()
    );
    let chunks = sse_json(&common::sse_data(&text));
    let mut out = String::new();
    for c in &chunks {
        assert_eq!(c["object"], json!("text_completion"));
        out.push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], json!("length"));
    let (_, full) = s.post("/v1/completions", &json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "ignore_eos": true})).await;
    assert_eq!(out, full["choices"][0]["text"].as_str().unwrap());
}

#[tokio::test]
async fn stop_strings_trim_output() {
    let s = server();
    let base = json!({"prompt": "List the days of the week: Monday, Tuesday,", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let (_, full) = s.post("/v1/completions", &base).await;
    let full_text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let words: Vec<&str> = full_text.split_whitespace().collect();
    assert!(
        words.len() >= 4,
        "need a few words to pick a stop string from: {full_text:?}"
    );
    let stop = words[2].to_string();
    let cut = full_text.find(&stop).unwrap();
    let want = &full_text[..cut];

    let mut req = base.clone();
    req["stop"] = json!([stop.clone(), "never-generated-stop"]);
    let (status, r) = s.post("/v1/completions", &req).await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!(
        choice["text"].as_str().unwrap(),
        want,
        "stop {stop:?} in {full_text:?}"
    );
    assert_eq!(choice["finish_reason"], json!("stop"));
    assert_eq!(choice["matched_stop"], json!(stop));

    // The same in a stream: nothing after (or of) the stop string reaches the client.
    req["stream"] = json!(true);
    let chunks = sse_json(&s.post_sse("/v1/completions", &req).await);
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(text, want);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        json!("stop")
    );

    // A single string works too, and /generate's sampling_params.stop the same way.
    let (_, g) = s
        .post(
            "/generate",
            &json!({"text": base["prompt"], "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": true, "stop": stop}}),
        )
        .await;
    assert_eq!(g["text"].as_str().unwrap(), want);
    assert_eq!(g["meta_info"]["finish_reason"]["type"], json!("stop"));
    assert_eq!(g["meta_info"]["finish_reason"]["matched"], json!(stop));
}

#[tokio::test]
async fn concurrent_requests_match_sequential() {
    let s = server();
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("Count from {i} to {}:", i + 5))
        .collect();
    let req = |p: &str| json!({"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let bodies: Vec<Value> = prompts.iter().map(|p| req(p)).collect();
    let mut sequential = Vec::new();
    for p in &prompts {
        let (status, r) = s.post("/v1/completions", &req(p)).await;
        assert_eq!(status, 200, "{r}");
        sequential.push(r["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let concurrent =
        futures::future::join_all(bodies.iter().map(|b| s.post("/v1/completions", b))).await;
    for (i, (status, r)) in concurrent.into_iter().enumerate() {
        assert_eq!(status, 200, "{r}");
        assert_eq!(
            r["choices"][0]["text"].as_str().unwrap(),
            sequential[i],
            "prompt {i} differs when batched"
        );
        assert_eq!(r["usage"]["completion_tokens"], json!(8));
    }
}

/// Wait until nothing runs or waits, then flush the cache: every KV slot must be free again.
/// `within` must be far shorter than the abandoned generations would take to finish, so that
/// only an abort can make the server idle in time.
async fn assert_no_leak(s: &Server, within: Duration) {
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

#[tokio::test]
async fn generate_native_single_batch_and_ids() {
    let s = server();
    let (status, r) = s
        .post("/generate", &json!({"text": "The sky is", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["text"].is_string());
    let m = &r["meta_info"];
    for key in [
        "id",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "finish_reason",
        "e2e_latency",
    ] {
        assert!(m.get(key).is_some(), "meta_info lacks {key}: {r}");
    }
    assert!(m["completion_tokens"].as_u64().unwrap() <= 5);
    let single_text = r["text"].as_str().unwrap().to_string();

    let (status, b) = s
        .post(
            "/generate",
            &json!({"text": ["The sky is", "Water is"], "sampling_params": [{"max_new_tokens": 5, "temperature": 0}, {"max_new_tokens": 3, "temperature": 0}], "rid": ["r-a", "r-b"]}),
        )
        .await;
    assert_eq!(status, 200, "{b}");
    let list = b.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["text"].as_str().unwrap(), single_text);
    assert_eq!(list[0]["meta_info"]["id"], json!("r-a"));
    assert!(list[1]["meta_info"]["completion_tokens"].as_u64().unwrap() <= 3);

    let (status, i) = s
        .post("/generate", &json!({"input_ids": [504, 3459, 314], "sampling_params": {"max_new_tokens": 4, "ignore_eos": true}}))
        .await;
    assert_eq!(status, 200, "{i}");
    assert_eq!(i["output_ids"].as_array().unwrap().len(), 4, "{i}");
    assert_eq!(
        i["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 4})
    );
    assert_eq!(i["meta_info"]["prompt_tokens"], json!(3));

    let (status, ib) = s
        .post("/generate", &json!({"input_ids": [[504, 3459], [314]], "sampling_params": {"max_new_tokens": 2, "ignore_eos": true}}))
        .await;
    assert_eq!(status, 200, "{ib}");
    assert_eq!(ib.as_array().unwrap().len(), 2);

    // Streaming: cumulative text, the last chunk carries finish_reason.
    let chunks = sse_json(
        &s.post_sse(
            "/generate",
            &json!({"text": "The sky is", "stream": true, "sampling_params": {"max_new_tokens": 5, "temperature": 0}}),
        )
        .await,
    );
    assert!(chunks.len() >= 2, "{chunks:?}");
    let mut prev = String::new();
    for c in &chunks {
        let t = c["text"].as_str().unwrap();
        assert!(
            t.starts_with(&prev),
            "text must be cumulative: {prev:?} then {t:?}"
        );
        prev = t.to_string();
    }
    assert_eq!(prev, single_text);
    assert!(!chunks.last().unwrap()["meta_info"]["finish_reason"].is_null());
    assert!(chunks[0]["meta_info"]["finish_reason"].is_null());

    // A streamed batch tags each chunk with its prompt's index.
    let chunks = sse_json(
        &s.post_sse(
            "/generate",
            &json!({"input_ids": [[504, 3459], [314]], "stream": true, "sampling_params": {"max_new_tokens": 3, "ignore_eos": true}}),
        )
        .await,
    );
    for index in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["index"] == json!(index))
            .collect();
        let last = mine
            .last()
            .unwrap_or_else(|| panic!("no chunk for index {index}"));
        assert_eq!(last["output_ids"].as_array().unwrap().len(), 3, "{last}");
        assert_eq!(last["meta_info"]["finish_reason"]["type"], json!("length"));
    }
}

#[tokio::test]
async fn metrics_have_sglang_names() {
    let s = server();
    let (status, _) = s
        .post(
            "/generate",
            &json!({"text": "Hello", "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    assert_eq!(status, 200);
    let resp = s.client().get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    for name in [
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_used_tokens",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}");
    }
}

#[tokio::test]
async fn cache_report_counts_a_repeated_prompt() {
    let s = server();
    let prompt = "Here is a long shared prefix about rivers, mountains, forests and the sea, repeated so \
                  that the radix cache has something to keep: rivers, mountains, forests and the sea. ";
    let req = json!({"prompt": prompt.repeat(3), "max_tokens": 2, "temperature": 0});
    // Another test may flush the cache between two requests: try a few times.
    let mut cached = 0;
    for _ in 0..4 {
        let (status, r) = s.post("/v1/completions", &req).await;
        assert_eq!(status, 200, "{r}");
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cache report");
        if cached > 0 {
            assert!(cached <= r["usage"]["prompt_tokens"].as_u64().unwrap());
            break;
        }
    }
    assert!(cached > 0, "a repeated prompt must hit the radix cache");
}

#[tokio::test]
async fn skip_tokenizer_takes_ids_only() {
    let s = skip_tokenizer_server();
    let (status, r) = s
        .post("/generate", &json!({"input_ids": [504, 3459, 314], "sampling_params": {"max_new_tokens": 3, "ignore_eos": true}}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output_ids"].as_array().unwrap().len(), 3);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/generate", json!({"text": "hello"}), "skip-tokenizer-init"),
        (
            "/generate",
            json!({"input_ids": [1, 2], "sampling_params": {"stop": "x"}}),
            "skip-tokenizer-init",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            "tokenizer",
        ),
        ("/v1/completions", json!({"prompt": "hello"}), "tokenizer"),
    ];
    for (path, body, text) in cases {
        let (got, resp) = s.post(path, &body).await;
        assert_error(got, &resp, 400, text, &format!("{path} {body}"));
    }
    // Routes are open without --api-key.
    let (status, _) = s.get("/v1/models").await;
    assert_eq!(status, 200);
    // Metrics are off without --enable-metrics.
    let (status, _) = s.get("/metrics").await;
    assert_eq!(status, 404);
}
