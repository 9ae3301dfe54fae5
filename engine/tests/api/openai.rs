//! The OpenAI-compatible routes: chat, completions, streaming, stop strings, batching.

use std::time::Instant;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{self, sse_json};
use crate::{greedy_chat, served_model, server};

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
    assert!(p > 5 && (1..=16).contains(&c), "{u}");
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
