//! Start the real `sgl-engine` binary on the real model for end-to-end tests.
//!
//! `Server::start` runs `sgl-engine serve --model-path <gguf> --port 0 ...` through the
//! workspace's one child-process harness (`sgl-test-harness`: waits for the
//! `listening on http://127.0.0.1:<port>` line, logs to a file, kills the process on drop and,
//! for a server kept in a `static`, when the test process exits), and adds the HTTP helpers
//! these tests share.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// Model load plus start-up on a busy 2-core machine can be slow.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// API key of the servers started with `--api-key`.
pub const API_KEY: &str = "sk-sgl-test-key";

pub struct Server {
    process: sgl_test_harness::Server,
    pub base: String,
    pub api_key: Option<String>,
}

/// Path of the test model: `$SGL_TEST_MODEL`, or what `scripts/fetch-model.sh` prints.
pub fn model_path() -> PathBuf {
    sgl_test_harness::default_model().unwrap_or_else(|e| panic!("{e}"))
}

impl Server {
    /// Start a server; `name` names its log file; `args` are extra `serve` flags.
    pub fn start(name: &str, args: &[&str]) -> Server {
        Server::start_model(name, &model_path(), args)
    }

    /// [`Server::start`] on another model (a file or a folder).
    pub fn start_model(name: &str, model: &Path, args: &[&str]) -> Server {
        let log = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("sgl-engine-{name}-{}.log", std::process::id()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sgl-engine"));
        cmd.arg("serve")
            .arg("--model-path")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args);
        let process = sgl_test_harness::Server::start(
            &format!("sgl-engine {name}"),
            cmd,
            "listening on ",
            START_TIMEOUT,
            log,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Server {
            base: process.url().to_string(),
            process,
            api_key: None,
        }
    }

    pub fn with_key(mut self, key: &str) -> Server {
        self.api_key = Some(key.to_string());
        self
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A client that sends this server's API key (if any).
    pub fn client(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(k) = &self.api_key {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {k}").parse().unwrap(),
            );
        }
        reqwest::Client::builder()
            .default_headers(headers)
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap()
    }

    /// The whole server log so far (stderr, and stdout lines marked `[stdout]`).
    pub fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// Last lines of the server log, for failure messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// POST JSON, return the status and the body parsed as JSON (or as a string).
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .client()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        read(resp).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.client().get(self.url(path)).send().await.unwrap();
        read(resp).await
    }

    /// POST a streaming request and collect the `data:` payloads (`[DONE]` included).
    pub async fn post_sse(&self, path: &str, body: &Value) -> Vec<String> {
        let resp = self
            .client()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path} {body}");
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
        let text = resp.text().await.unwrap();
        sse_data(&text)
    }
}

pub async fn read(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

/// The `data:` payloads of an SSE body, in order (comments and blank lines skipped).
pub fn sse_data(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d).to_string())
        .collect()
}

/// Parse every payload but the final `[DONE]`, which must be there.
pub fn sse_json(data: &[String]) -> Vec<Value> {
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream must end with [DONE]: {data:?}"
    );
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d}: {e}")))
        .collect()
}

/// Whether `python3` can import `module`.
pub fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Run `engine/tests/python/<script>` (under pytest when installed, else its own runner) with
/// `SGL_BASE_URL` set to `server` and the extra `env`; fail with its output and the server's
/// log tail unless it passes.
pub fn run_python_tests(script: &str, server: &Server, env: &[(&str, &str)]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut cmd = Command::new("python3");
    if python_has("pytest") {
        cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(&path);
    } else {
        cmd.arg(&path);
    }
    cmd.env("SGL_BASE_URL", &server.base)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log_tail()
    );
    println!("{stdout}");
}
