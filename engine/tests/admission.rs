//! Load shedding: beyond the waiting bound a request gets 429 at once, a request that waits
//! past the queue deadline gets 503, both with `Retry-After`, and neither leaves anything
//! behind in the server. Once the rate at which waiting requests start is measured, a request
//! that would not start before the deadline gets its 503 at once; an idle or lightly loaded
//! engine refuses nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Server;
use futures::StreamExt;
use serde_json::{Value, json};

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

/// One answer: status, `Retry-After`, body, and how long it took from the send.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: Value,
    took: Duration,
}

impl Answer {
    fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_default()
    }
}

/// `/generate` of `max_new` greedy tokens (EOS ignored, so every accepted one costs the same).
async fn generate(s: &Server, client: &reqwest::Client, text: String, max_new: u32) -> Answer {
    let started = Instant::now();
    let resp = client
        .post(s.url("/generate"))
        .json(&json!({"text": text,
                      "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                          "ignore_eos": true}}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: Value = resp.json().await.unwrap();
    Answer {
        status,
        retry_after,
        body,
        took: started.elapsed(),
    }
}

/// `n` requests sent at once.
async fn burst(s: &Server, tag: &str, n: usize, max_new: u32) -> Vec<Answer> {
    let client = s.client();
    let sends = (0..n).map(|i| generate(s, &client, format!("{tag} request {i}:"), max_new));
    futures::future::join_all(sends).await
}

/// The value of the series `name{model_name=...}` in `/metrics`.
async fn metric(s: &Server, name: &str) -> f64 {
    let (status, text) = s.get("/metrics").await;
    assert_eq!(status, 200, "{text}");
    let text = text.as_str().unwrap_or_default().to_string();
    let prefix = format!("{name}{{");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("/metrics has no series {name}:\n{text}"));
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unparsable sample line {line:?}"))
}

/// Waits (with a deadline) until nothing waits or runs.
async fn wait_idle(s: &Server) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, info) = s.get("/get_server_info").await;
        if info["num_queue_reqs"] == 0 && info["num_running_reqs"] == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "still busy: {info}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn statuses(answers: &[Answer]) -> Vec<(u16, &str)> {
    answers.iter().map(|a| (a.status, a.message())).collect()
}

/// The `Retry-After` of a 503 from the estimate, checked to be the wait its message names
/// ("would wait about N s", to the nearest second) rounded up into 1..=60 seconds.
fn retry_after_of_estimate(a: &Answer) -> u32 {
    let estimate: u32 = a
        .message()
        .split_once("would wait about ")
        .and_then(|(_, rest)| rest.split_once(" s"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no estimated wait in {}", a.body));
    let retry: u32 = a
        .retry_after
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("503 without a Retry-After in seconds: {}", a.body));
    assert!(
        retry == estimate.clamp(1, 60) || retry == (estimate + 1).clamp(1, 60),
        "Retry-After {retry} for an estimated wait of {estimate} s: {}",
        a.body
    );
    retry
}

/// 503s that the estimate gave at submission (not the deadline's).
fn refused_at_once(answers: &[Answer]) -> Vec<&Answer> {
    answers
        .iter()
        .filter(|a| a.status == 503 && a.message().contains("would wait"))
        .collect()
}

#[tokio::test]
async fn far_above_capacity_the_excess_gets_503_at_once() {
    const DEADLINE: u64 = 20;
    const TOKENS: u32 = 24;
    // One request runs at a time; the count bound is far away, so only the estimate and the
    // deadline can refuse.
    let s = Server::start(
        "admission-estimate",
        &[
            "--max-running-requests",
            "1",
            "--num-threads",
            "1",
            "--max-queued-requests",
            "1000",
            "--queue-timeout-secs",
            &DEADLINE.to_string(),
            "--enable-metrics",
        ],
    );

    // Cold start: nothing measured, so a burst the engine serves well within the deadline is
    // all accepted (only the hard bounds apply); its starts are the first measurement.
    let cold = burst(&s, "cold", 8, TOKENS).await;
    assert!(
        cold.iter().all(|a| a.status == 200),
        "cold burst: {:?}",
        statuses(&cold)
    );
    wait_idle(&s).await;
    assert_eq!(
        metric(&s, "sglang:estimated_queue_time_seconds").await,
        0.0,
        "nothing waits"
    );

    // Far above capacity: what the measured rate cannot start in time is refused at once.
    let n = 150;
    let (answers, peak_estimate) = {
        let watch = async {
            let mut peak: f64 = 0.0;
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                peak = peak.max(metric(&s, "sglang:estimated_queue_time_seconds").await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            peak
        };
        tokio::join!(burst(&s, "hot", n, TOKENS), watch)
    };
    assert!(
        answers.iter().all(|a| a.status == 200 || a.status == 503),
        "only 200 or 503 expected: {:?}",
        statuses(&answers)
    );
    let at_once = refused_at_once(&answers);
    let accepted: Vec<_> = answers.iter().filter(|a| a.status == 200).collect();
    let late = answers.iter().filter(|a| a.status == 503).count() - at_once.len();
    let slowest_refusal = at_once.iter().map(|a| a.took).max().unwrap_or_default();
    println!(
        "{n} at once: {} accepted, {} refused at once (slowest answer {slowest_refusal:?}), \
         {late} after the deadline; peak estimate {peak_estimate:.1} s",
        accepted.len(),
        at_once.len()
    );
    assert!(
        at_once.len() >= n / 3 && !accepted.is_empty(),
        "{} refused at once, {} accepted, {late} after the deadline: {:?}",
        at_once.len(),
        accepted.len(),
        statuses(&answers)
    );
    let mut advised = Vec::new();
    for a in &at_once {
        let retry = retry_after_of_estimate(a);
        // Refused because the wait is past 3/4 of the deadline, so the advice is too.
        assert!(
            f64::from(retry) >= 0.75 * DEADLINE as f64 - 1.0,
            "Retry-After {retry}"
        );
        advised.push(retry);
        assert!(a.message().contains("--queue-timeout-secs"), "{}", a.body);
        // Answered on arrival, nowhere near the deadline.
        assert!(
            a.took < Duration::from_secs(DEADLINE / 4),
            "refused after {:?}",
            a.took
        );
    }
    println!(
        "Retry-After of the refused: {}..={} s",
        advised.iter().min().unwrap_or(&0),
        advised.iter().max().unwrap_or(&0)
    );
    for a in &accepted {
        assert_eq!(
            a.body["meta_info"]["completion_tokens"], TOKENS,
            "{}",
            a.body
        );
    }
    assert!(
        peak_estimate > 0.5 * DEADLINE as f64,
        "/metrics showed an estimated wait of at most {peak_estimate} s"
    );
    let started = metric(&s, "sglang:queue_time_seconds_count").await;
    assert!(
        started >= (cold.len() + accepted.len()) as f64,
        "{started} starts counted"
    );
    wait_idle(&s).await;
}

#[tokio::test]
async fn an_idle_or_lightly_loaded_engine_refuses_nothing() {
    const DEADLINE: u64 = 4;
    const TOKENS: u32 = 24;
    let s = Server::start(
        "admission-light",
        &[
            "--max-running-requests",
            "4",
            "--num-threads",
            "1",
            "--max-queued-requests",
            "1000",
            "--queue-timeout-secs",
            &DEADLINE.to_string(),
        ],
    );

    // Measure, then overload until the estimate refuses: from here on it is armed.
    let cold = burst(&s, "cold", 8, TOKENS).await;
    assert!(
        cold.iter().all(|a| a.status == 200 || a.status == 503),
        "{:?}",
        statuses(&cold)
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let hot = burst(&s, "hot", 60, TOKENS).await;
        println!(
            "60 at once: {} accepted, {} refused at once",
            hot.iter().filter(|a| a.status == 200).count(),
            refused_at_once(&hot).len()
        );
        let refused = refused_at_once(&hot);
        if !refused.is_empty() {
            // A shorter deadline, a shorter wait to advise than the test above.
            for a in refused {
                let retry = retry_after_of_estimate(a);
                assert!(
                    retry <= 3 * DEADLINE as u32,
                    "Retry-After {retry} with a {DEADLINE} s deadline"
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the estimate never refused: {:?}",
            statuses(&hot)
        );
    }
    wait_idle(&s).await;

    // Idle: one request after another.
    let client = s.client();
    for i in 0..3 {
        let a = generate(&s, &client, format!("alone {i}:"), TOKENS).await;
        assert_eq!(a.status, 200, "{}", a.body);
    }
    // Light: three clients back to back on four running slots.
    let clients = (0..3).map(|c| {
        let (s, client) = (&s, &client);
        async move {
            let mut out = Vec::new();
            for i in 0..4 {
                out.push(generate(s, client, format!("client {c} request {i}:"), TOKENS).await);
            }
            out
        }
    });
    let light: Vec<Answer> = futures::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(
        light.iter().all(|a| a.status == 200),
        "light load: {:?}",
        statuses(&light)
    );
}
