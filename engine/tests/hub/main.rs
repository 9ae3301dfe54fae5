//! Models from the Hugging Face Hub, end to end: a local server speaking the Hub's download
//! protocol (`server.rs`), checked against the real `huggingface_hub` client; the real
//! `sgl-engine` binary downloading from it, sharing the cache with `huggingface_hub` both
//! ways, resuming an interrupted download, serving the downloaded model, and failing with a
//! clear message for each kind of error.
//!
//! The faithfulness test needs `python3` with `huggingface_hub` (installed with pip when
//! missing; the test is skipped, saying so, only when that fails).

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod fixtures;
mod server;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use server::{Faults, HubServer, Repo, RepoFile, TOKEN};

const TINY: &str = "test-org/tiny-llama";
const GATED: &str = "test-org/gated-llama";
const GGUF_REPO: &str = "test-org/smollm2-gguf";
const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const PICKLES: &str = "test-org/pickles-only";
const TINY_COMMIT: &str = "4c1f1c7e0b9d2a3f5e6d7c8b9a0f1e2d3c4b5a69";
const GGUF_COMMIT: &str = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d";
const PICKLES_COMMIT: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";

/// Files of the tiny Llama the engine needs (the repository also has README.md and a pickle).
const TINY_NEEDED: [&str; 7] = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

struct Fixtures {
    _dir: tempfile::TempDir,
    tiny: Repo,
    gguf: Repo,
    pickles: Repo,
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let model = common::model_path();
        let dir = tempfile::tempdir().unwrap();
        let tiny_dir = dir.path().join("tiny-llama");
        fixtures::write_tiny_llama(&tiny_dir, &model);
        let mut tiny = Repo::from_dir(&tiny_dir, TINY_COMMIT);
        tiny.refs.push("v1.0".into());

        let other = dir.path().join("other.Q8_0.gguf");
        std::fs::write(&other, b"GGUF not really").unwrap();
        let readme = dir.path().join("README.md");
        std::fs::write(&readme, "# SmolLM2 GGUF\n").unwrap();
        let mut gguf = Repo::empty(GGUF_COMMIT);
        gguf.files
            .insert(GGUF_FILE.into(), RepoFile::from_disk(model.clone(), true));
        gguf.files
            .insert("other.Q8_0.gguf".into(), RepoFile::from_disk(other, true));
        gguf.files
            .insert("README.md".into(), RepoFile::from_disk(readme, false));

        let pickles_dir = dir.path().join("pickles");
        std::fs::create_dir_all(&pickles_dir).unwrap();
        std::fs::copy(
            tiny_dir.join("config.json"),
            pickles_dir.join("config.json"),
        )
        .unwrap();
        std::fs::write(pickles_dir.join("pytorch_model.bin"), vec![1u8; 1024]).unwrap();
        let pickles = Repo::from_dir(&pickles_dir, PICKLES_COMMIT);
        Fixtures {
            _dir: dir,
            tiny,
            gguf,
            pickles,
        }
    })
}

/// A server of its own for each test, so request counts are the test's own.
fn hub(with_gguf: bool) -> HubServer {
    let f = fixtures();
    let mut repos = HashMap::new();
    repos.insert(TINY.to_string(), f.tiny.clone());
    let mut gated = f.tiny.clone();
    gated.gated = true;
    repos.insert(GATED.to_string(), gated);
    repos.insert(PICKLES.to_string(), f.pickles.clone());
    if with_gguf {
        repos.insert(GGUF_REPO.to_string(), f.gguf.clone());
    }
    HubServer::start(repos)
}

/// `sgl-engine` with a clean Hub environment: this endpoint and cache, no token or offline
/// flag inherited from the machine.
fn engine(endpoint: &str, cache: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sgl-engine"));
    for k in [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_REVISION",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN_PATH",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_CACHE", cache)
        .env("HF_HOME", cache.join("hf-home"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn download(
    endpoint: &str,
    cache: &Path,
    model: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    engine(endpoint, cache, env)
        .args(["download", model])
        .args(args)
        .output()
        .unwrap()
}

/// `(path, commit)` printed by a successful `sgl-engine download`.
fn downloaded(out: &Output) -> (PathBuf, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "download failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |k: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no `{k}` line in {stdout}"))
            .trim()
            .to_string()
    };
    (PathBuf::from(field("path ")), field("commit "))
}

/// The failure message of a download that must fail.
fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "expected a failure, got: {}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

fn sha256_file(p: &Path) -> String {
    use sha2::Digest;
    let data = std::fs::read(p).unwrap();
    sha2::Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

/// `python3` with `huggingface_hub`, installing it with pip when missing; `None` (and a
/// printed reason) when that is not possible here.
fn huggingface_hub_python() -> Option<()> {
    if common::python_has("huggingface_hub") {
        return Some(());
    }
    let _ = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "huggingface_hub"])
        .status();
    if common::python_has("huggingface_hub") {
        return Some(());
    }
    eprintln!(
        "SKIPPED: python3 with huggingface_hub is not available and `pip install huggingface_hub` failed"
    );
    None
}

fn snapshot_download(endpoint: &str, cache: &Path, args: Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/hub_snapshot.py");
    let mut args = args;
    args["cache"] = json!(cache);
    let out = Command::new("python3")
        .arg(script)
        .arg(args.to_string())
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", cache.join("hf-home"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "snapshot_download failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn huggingface_hub_and_the_engine_share_one_cache() {
    if huggingface_hub_python().is_none() {
        return;
    }
    let hub = hub(false);
    let tiny = hub.repo(TINY);

    // The real client downloads everything from the test server, byte for byte.
    let cache_a = tempfile::tempdir().unwrap();
    let py = snapshot_download(&hub.endpoint, cache_a.path(), json!({"repo": TINY}));
    let files = py["files"].as_object().unwrap();
    assert_eq!(files.len(), tiny.files.len(), "{py}");
    for (name, f) in &tiny.files {
        assert_eq!(files[name], json!(f.sha256), "{name}");
    }
    let repo_dir = cache_a.path().join("models--test-org--tiny-llama");
    let blob = |f: &RepoFile| {
        repo_dir
            .join("blobs")
            .join(if f.lfs { &f.sha256 } else { &f.git_oid })
    };
    for (name, f) in &tiny.files {
        assert!(blob(f).is_file(), "huggingface_hub stored {name} elsewhere");
    }
    let c = hub.counters();
    assert!(c.cdn_get >= 3 && c.resolve_head > 0, "{c:?}");

    // The engine finds everything it needs in that cache: one API call, no file request.
    hub.reset_counters();
    let (path, commit) = downloaded(&download(&hub.endpoint, cache_a.path(), TINY, &[], &[]));
    assert_eq!(commit, TINY_COMMIT);
    assert_eq!(
        path.canonicalize().unwrap(),
        Path::new(py["path"].as_str().unwrap())
            .canonicalize()
            .unwrap()
    );
    let c = hub.counters();
    assert_eq!((c.api, c.file_requests()), (1, 0), "{c:?}");

    // The other way round: what the engine fetched, huggingface_hub reuses.
    let cache_b = tempfile::tempdir().unwrap();
    hub.reset_counters();
    let (path_b, _) = downloaded(&download(&hub.endpoint, cache_b.path(), TINY, &[], &[]));
    assert_eq!(files_in(&path_b), TINY_NEEDED);
    let c = hub.counters();
    assert_eq!((c.cdn_get, c.resolve_get), (2, 5), "{c:?}");
    hub.reset_counters();
    let py_b = snapshot_download(
        &hub.endpoint,
        cache_b.path(),
        json!({"repo": TINY, "allow": ["*.json", "*.safetensors"]}),
    );
    assert_eq!(py_b["files"].as_object().unwrap().len(), TINY_NEEDED.len());
    assert_eq!(
        Path::new(py_b["path"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        path_b.canonicalize().unwrap()
    );
    let c = hub.counters();
    assert_eq!(c.file_requests(), 0, "huggingface_hub fetched again: {c:?}");
}

/// A running `sgl-engine serve` (the workspace's child-process harness), killed on drop.
struct Serving {
    _process: sgl_test_harness::Server,
    base: String,
}

fn serve(mut cmd: Command, model: &str, extra: &[&str], log: &Path) -> Serving {
    cmd.args([
        "serve",
        "--model-path",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ])
    .args(["--max-total-tokens", "4096", "--num-threads", "1"])
    .args(extra);
    let process = sgl_test_harness::Server::start(
        &format!("sgl-engine serve {model}"),
        cmd,
        "listening on ",
        Duration::from_secs(300),
        log.to_path_buf(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    Serving {
        base: process.url().to_string(),
        _process: process,
    }
}

fn post(base: &str, path: &str, body: Value) -> Value {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let resp = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .json(&body)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let v: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "{path}: {v}");
        v
    })
}

fn get(base: &str, path: &str) -> Value {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(format!("{base}{path}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    })
}

#[test]
fn serves_a_safetensors_model_from_the_hub_then_from_the_cache() {
    let hub = hub(false);
    let cache = tempfile::tempdir().unwrap();
    let log = cache.path().join("serve.log");

    let s = serve(
        engine(&hub.endpoint, cache.path(), &[]),
        TINY,
        &["--revision", "v1.0"],
        &log,
    );
    let done = post(
        &s.base,
        "/v1/completions",
        json!({"model": TINY, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
    );
    let n = done["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&n), "{done}");
    assert_eq!(get(&s.base, "/v1/models")["data"][0]["id"], TINY);
    drop(s);
    let repo_dir = cache.path().join("models--test-org--tiny-llama");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/v1.0")).unwrap(),
        TINY_COMMIT
    );
    let snapshot = repo_dir.join("snapshots").join(TINY_COMMIT);
    assert_eq!(files_in(&snapshot), TINY_NEEDED);
    for name in TINY_NEEDED {
        assert_eq!(
            sha256_file(&snapshot.join(name)),
            hub.repo(TINY).files[name].sha256
        );
    }
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("downloaded test-org/tiny-llama"),
        "{log_text}"
    );

    // A second start fetches nothing: one revision lookup, no file request.
    hub.reset_counters();
    let s = serve(
        engine(&hub.endpoint, cache.path(), &[]),
        TINY,
        &["--revision", "v1.0"],
        &log,
    );
    let c = hub.counters();
    assert_eq!((c.api, c.file_requests()), (1, 0), "{c:?}");
    drop(s);

    // Offline, with the Hub unreachable, the cache alone serves.
    hub.reset_counters();
    let s = serve(
        engine(
            "http://hub.invalid",
            cache.path(),
            &[("HF_HUB_OFFLINE", "1")],
        ),
        TINY,
        &["--revision", "v1.0"],
        &log,
    );
    let done = post(
        &s.base,
        "/generate",
        json!({"text": "Hello", "sampling_params": {"max_new_tokens": 4, "ignore_eos": true}}),
    );
    assert_eq!(done["meta_info"]["completion_tokens"], 4, "{done}");
    let c = hub.counters();
    assert_eq!(c.api + c.file_requests(), 0, "{c:?}");
}

#[test]
fn gguf_repository_takes_a_file_name() {
    let hub = hub(true);
    let cache = tempfile::tempdir().unwrap();

    let err = failure(&download(&hub.endpoint, cache.path(), GGUF_REPO, &[], &[]));
    assert!(
        err.contains("2 GGUF files") && err.contains("test-org/smollm2-gguf/<file>"),
        "{err}"
    );

    let model = format!("{GGUF_REPO}/{GGUF_FILE}");
    let log = cache.path().join("serve.log");
    let s = serve(engine(&hub.endpoint, cache.path(), &[]), &model, &[], &log);
    let done = post(
        &s.base,
        "/v1/chat/completions",
        json!({"model": model, "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 6, "temperature": 0}),
    );
    assert!(
        done["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{done}"
    );
    drop(s);
    let snapshot = cache
        .path()
        .join("models--test-org--smollm2-gguf/snapshots")
        .join(GGUF_COMMIT);
    assert_eq!(files_in(&snapshot), [GGUF_FILE]);
    assert_eq!(
        sha256_file(&snapshot.join(GGUF_FILE)),
        hub.repo(GGUF_REPO).files[GGUF_FILE].sha256
    );
}

#[test]
fn an_interrupted_download_resumes_where_it_stopped() {
    let hub = hub(false);
    let cache = tempfile::tempdir().unwrap();
    let shard = hub.repo(TINY).files["model-00001-of-00002.safetensors"].clone();
    let cut = 3_000_000u64;
    assert!(shard.size > cut + 1_000_000);
    hub.set_faults(Faults {
        cut: Some((shard.sha256.clone(), cut)),
        corrupt: None,
    });
    let err = failure(&download(&hub.endpoint, cache.path(), TINY, &[], &[]));
    assert!(
        err.contains("model-00001-of-00002.safetensors") && err.contains("run again to resume"),
        "{err}"
    );
    let blobs = cache.path().join("models--test-org--tiny-llama/blobs");
    let part = blobs.join(format!("{}.incomplete", shard.sha256));
    // What reached the client before the connection broke (the server's last buffered
    // frames may be lost with it) is kept for the next run.
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(kept > 0 && kept <= cut, "{kept}");
    assert!(
        !blobs.join(&shard.sha256).exists(),
        "a partial blob was kept as complete"
    );
    let snapshot = cache
        .path()
        .join("models--test-org--tiny-llama/snapshots")
        .join(TINY_COMMIT);
    assert!(!snapshot.join("model-00001-of-00002.safetensors").exists());

    hub.set_faults(Faults::default());
    hub.reset_counters();
    let (path, _) = downloaded(&download(&hub.endpoint, cache.path(), TINY, &[], &[]));
    let c = hub.counters();
    assert_eq!(c.ranges, vec![kept], "{c:?}");
    assert_eq!(c.cdn_bytes, shard.size - kept, "{c:?}");
    assert!(!part.exists());
    assert_eq!(
        sha256_file(&path.join("model-00001-of-00002.safetensors")),
        shard.sha256
    );
}

#[test]
fn each_failure_says_what_to_do() {
    let hub = hub(false);
    let cache = tempfile::tempdir().unwrap();
    let ep = hub.endpoint.as_str();
    let c = cache.path();

    let err = failure(&download(ep, c, GATED, &[], &[]));
    assert!(err.contains("gated") && err.contains("HF_TOKEN"), "{err}");
    let err = failure(&download(ep, c, GATED, &[], &[("HF_TOKEN", "hf_wrong")]));
    assert!(err.contains("HF_TOKEN has no access"), "{err}");
    let (_, commit) = downloaded(&download(ep, c, GATED, &[], &[("HF_TOKEN", TOKEN)]));
    assert_eq!(commit, TINY_COMMIT);

    let err = failure(&download(ep, c, "test-org/no-such-model", &[], &[]));
    assert!(
        err.contains("test-org/no-such-model was not found") && err.contains("HF_TOKEN"),
        "{err}"
    );
    let err = failure(&download(ep, c, TINY, &["--revision", "nope"], &[]));
    assert!(err.contains("revision nope was not found"), "{err}");
    let err = failure(&download(ep, c, PICKLES, &[], &[]));
    assert!(
        err.contains("no weights") && err.contains("pytorch_model.bin"),
        "{err}"
    );
    let err = failure(&download("http://hub.invalid", c, TINY, &[], &[]));
    assert!(err.contains("cannot reach http://hub.invalid"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = failure(&download(
        ep,
        empty.path(),
        TINY,
        &[],
        &[("HF_HUB_OFFLINE", "1")],
    ));
    assert!(
        err.contains("HF_HUB_OFFLINE") && err.contains("never fetched"),
        "{err}"
    );

    // A model larger than the disk's free space is refused before a byte is written, with
    // what is needed and how to go on (the Hub's metadata says 1 PiB for one shard).
    let mut huge = hub.repo(TINY).clone();
    if let Some(shard) = huge.files.get_mut("model-00002-of-00002.safetensors") {
        shard.size = 1 << 50;
    }
    let big_hub = HubServer::start(HashMap::from([(TINY.to_string(), huge)]));
    let fresh = tempfile::tempdir().unwrap();
    let err = failure(&download(&big_hub.endpoint, fresh.path(), TINY, &[], &[]));
    assert!(
        err.contains("no space left on the device holding")
            && err.contains("HF_HUB_CACHE")
            && err.contains("run again to resume"),
        "{err}"
    );
    // Nothing of the shard was written, and nothing is left looking complete.
    let big_shard = hub.repo(TINY).files["model-00002-of-00002.safetensors"]
        .sha256
        .clone();
    let blobs = fresh.path().join("models--test-org--tiny-llama/blobs");
    let written = if blobs.exists() {
        files_in(&blobs)
    } else {
        Vec::new()
    };
    assert!(
        !written
            .iter()
            .any(|f| f.starts_with(big_shard.as_str()) || f.ends_with(".incomplete")),
        "the shard that cannot fit was started: {written:?}"
    );
    let err = failure(&download(
        &big_hub.endpoint,
        fresh.path(),
        TINY,
        &[],
        &[("HF_HUB_OFFLINE", "1")],
    ));
    assert!(err.contains("is not complete in the cache"), "{err}");

    // A corrupted transfer is caught and nothing of it is kept.
    let shard = hub.repo(TINY).files["model-00002-of-00002.safetensors"].clone();
    hub.set_faults(Faults {
        cut: None,
        corrupt: Some(shard.sha256.clone()),
    });
    let fresh = tempfile::tempdir().unwrap();
    let err = failure(&download(ep, fresh.path(), TINY, &[], &[]));
    assert!(err.contains("checksum mismatch"), "{err}");
    let blobs = fresh.path().join("models--test-org--tiny-llama/blobs");
    assert!(!blobs.join(&shard.sha256).exists());
    assert!(!blobs.join(format!("{}.incomplete", shard.sha256)).exists());
    hub.set_faults(Faults::default());

    // `serve` stops with the same message before loading anything.
    let out = engine(ep, c, &[])
        .args([
            "serve",
            "--model-path",
            "test-org/no-such-model",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("test-org/no-such-model was not found"),
        "{err}"
    );
}

#[test]
fn concurrent_downloads_into_one_cache_fetch_each_file_once() {
    let hub = hub(false);
    let cache = tempfile::tempdir().unwrap();
    // Two downloaders at once (engine replicas sharing a volume): the blob lock makes the
    // later one wait and reuse what the first fetched, whichever order they run in.
    let children: Vec<Child> = (0..2)
        .map(|_| {
            engine(&hub.endpoint, cache.path(), &[])
                .args(["download", TINY])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let paths: Vec<PathBuf> = outs.iter().map(|o| downloaded(o).0).collect();
    assert_eq!(paths[0], paths[1]);
    let c = hub.counters();
    let lfs_bytes: u64 = hub
        .repo(TINY)
        .files
        .iter()
        .filter(|(n, f)| f.lfs && TINY_NEEDED.contains(&n.as_str()))
        .map(|(_, f)| f.size)
        .sum();
    assert_eq!((c.cdn_get, c.cdn_bytes), (2, lfs_bytes), "{c:?}");
    for name in TINY_NEEDED {
        assert_eq!(
            sha256_file(&paths[0].join(name)),
            hub.repo(TINY).files[name].sha256
        );
    }
}
