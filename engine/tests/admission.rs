//! Load shedding: beyond the waiting bound a request gets 429 at once, a request that waits
//! past the queue deadline gets 503, both with `Retry-After`, and neither leaves anything
//! behind in the server.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Server;
use futures::StreamExt;
use serde_json::json;

const QUEUE: usize = 4;
const TIMEOUT_SECS: u64 = 3;

#[tokio::test]
async fn beyond_the_bound_429_at_once_past_the_deadline_503() {
    // One request runs at a time (on one thread, so a long one takes well over the deadline).
    let s = Server::start(
        "admission",
        &[
            "--max-running-requests",
            "1",
            "--num-threads",
            "1",
            "--max-queued-requests",
            &QUEUE.to_string(),
            "--queue-timeout-secs",
            &TIMEOUT_SECS.to_string(),
        ],
    );
    let (_, info) = s.get("/get_server_info").await;
    assert_eq!(info["max_queued_requests"], QUEUE, "{info}");
    assert_eq!(info["queue_timeout_secs"], TIMEOUT_SECS, "{info}");

    // A long stream holds the only running slot; its first chunk shows it runs.
    let blocker = s
        .client()
        .post(s.url("/generate"))
        .json(&json!({"text": "Hold the slot:", "stream": true,
                      "sampling_params": {"max_new_tokens": 1900, "ignore_eos": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(blocker.status().as_u16(), 200);
    let mut blocker = blocker.bytes_stream();
    blocker.next().await.unwrap().unwrap();

    // 12 at once: QUEUE wait, the rest are refused.
    let started = Instant::now();
    let sends = (0..12).map(|i| {
        let s = &s;
        async move {
            let resp = s
                .client()
                .post(s.url("/generate"))
                .json(&json!({"text": format!("Request {i}"),
                              "sampling_params": {"max_new_tokens": 4}}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let retry = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body: serde_json::Value = resp.json().await.unwrap();
            (status, retry, body, started.elapsed())
        }
    });
    let answers = futures::future::join_all(sends).await;
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    let expired: Vec<_> = answers.iter().filter(|a| a.0 == 503).collect();
    assert_eq!(
        (refused.len(), expired.len()),
        (12 - QUEUE, QUEUE),
        "statuses: {:?}",
        answers.iter().map(|a| (a.0, &a.2)).collect::<Vec<_>>()
    );
    for (_, retry, body, took) in &refused {
        assert!(retry.is_some(), "429 without Retry-After: {body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("--max-queued-requests"), "{body}");
        // Refused on arrival, not after waiting for the deadline.
        assert!(
            *took < Duration::from_secs(TIMEOUT_SECS),
            "429 after {took:?}"
        );
    }
    for (_, retry, body, took) in &expired {
        assert!(retry.is_some(), "503 without Retry-After: {body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("--queue-timeout-secs"), "{body}");
        assert!(
            *took >= Duration::from_secs(TIMEOUT_SECS),
            "503 before the deadline: {took:?}"
        );
    }

    // The blocker leaves; nothing waits or runs afterwards, and the server serves.
    drop(blocker);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, info) = s.get("/get_server_info").await;
        let idle = info["num_queue_reqs"] == 0 && info["num_running_reqs"] == 0;
        if idle {
            break;
        }
        assert!(Instant::now() < deadline, "still busy: {info}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, body) = s
        .post(
            "/generate",
            &json!({"text": "Hello", "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}
