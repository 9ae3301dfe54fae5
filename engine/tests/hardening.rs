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
