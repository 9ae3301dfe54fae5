//! A local server that speaks as much of the Hugging Face Hub's download protocol as
//! `sgl-engine download` uses, over files on disk (the approach of the engine's own Hub
//! tests, `engine/tests/hub/server.rs`, reduced to LFS files):
//!
//! - `GET /api/models/{org}/{name}/revision/{rev}`: the commit (`sha`) and the file list;
//! - `HEAD|GET /{org}/{name}/resolve/{rev}/{file}`: 302 to the "CDN" route (absolute) with
//!   `X-Linked-Etag` (the sha256), `X-Linked-Size`, `ETag` and `X-Repo-Commit`;
//! - `GET /cdn/{sha256}`: the content, with range requests (206 + `Content-Range`).
//!
//! It listens on a loopback port of its own thread (the engines run as processes of the pod
//! runner and reach it through `HF_ENDPOINT`) and counts every request.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

/// Requests the server answered, by kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    /// Revision API calls (which commit a revision names).
    pub api: usize,
    pub resolve_head: usize,
    pub resolve_get: usize,
    pub cdn_get: usize,
    /// Content bytes sent.
    pub cdn_bytes: u64,
}

impl Counters {
    /// Requests for a file's metadata or content: none means nothing was fetched.
    pub fn file_requests(&self) -> usize {
        self.resolve_head + self.resolve_get + self.cdn_get
    }
}

struct File {
    disk: PathBuf,
    size: u64,
    sha256: String,
}

struct Repo {
    id: String,
    commit: String,
    files: BTreeMap<String, File>,
}

struct Inner {
    repo: Repo,
    /// The server's own URL: the content's Location is absolute, as the Hub's CDN is another
    /// origin (a relative one means a renamed repository to the engine).
    base: String,
    counters: Mutex<Counters>,
}

/// One repository at one commit, on `main`, its files served as LFS files.
pub struct HubServer {
    inner: Arc<Inner>,
    pub endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HubServer {
    pub fn start(id: &str, commit: &str, files: &[PathBuf]) -> Result<HubServer, String> {
        let mut repo = Repo {
            id: id.into(),
            commit: commit.into(),
            files: BTreeMap::new(),
        };
        for path in files {
            let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| format!("{} has no file name", path.display()))?;
            let sha256: String = Sha256::digest(&data)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            repo.files.insert(
                name.into(),
                File {
                    disk: path.clone(),
                    size: data.len() as u64,
                    sha256,
                },
            );
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let endpoint = format!(
            "http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let inner = Arc::new(Inner {
            repo,
            base: endpoint.clone(),
            counters: Mutex::default(),
        });
        let app = Router::new()
            .route("/api/models/{org}/{name}/revision/{rev}", get(revision))
            .route("/{org}/{name}/resolve/{rev}/{*file}", get(resolve))
            .route("/cdn/{sha}", get(cdn))
            .with_state(inner.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Ok(HubServer {
            inner,
            endpoint,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn counters(&self) -> Counters {
        self.inner
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn count(inner: &Inner, f: impl FnOnce(&mut Counters)) {
    f(&mut inner.counters.lock().unwrap_or_else(|p| p.into_inner()));
}

fn hub_error(status: StatusCode, code: &'static str) -> Response {
    let mut r = (status, code).into_response();
    r.headers_mut()
        .insert("x-error-code", HeaderValue::from_static(code));
    r
}

/// The repository when `org/name` and `rev` name it (`main` or its commit), else the Hub's
/// status and error code.
fn lookup<'a>(
    inner: &'a Inner,
    org: &str,
    name: &str,
    rev: &str,
) -> Result<&'a Repo, (StatusCode, &'static str)> {
    let repo = &inner.repo;
    if format!("{org}/{name}") != repo.id {
        return Err((StatusCode::UNAUTHORIZED, "RepoNotFound"));
    }
    if rev != "main" && rev != repo.commit {
        return Err((StatusCode::NOT_FOUND, "RevisionNotFound"));
    }
    Ok(repo)
}

fn header_value(v: &str) -> HeaderValue {
    HeaderValue::from_str(v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

async fn revision(
    State(inner): State<Arc<Inner>>,
    Path((org, name, rev)): Path<(String, String, String)>,
) -> Response {
    count(&inner, |c| c.api += 1);
    let repo = match lookup(&inner, &org, &name, &rev) {
        Ok(r) => r,
        Err((status, code)) => return hub_error(status, code),
    };
    let siblings: Vec<_> = repo
        .files
        .keys()
        .map(|f| serde_json::json!({ "rfilename": f }))
        .collect();
    axum::Json(serde_json::json!({
        "id": repo.id,
        "modelId": repo.id,
        "sha": repo.commit,
        "private": false,
        "gated": false,
        "siblings": siblings,
    }))
    .into_response()
}

async fn resolve(
    State(inner): State<Arc<Inner>>,
    method: Method,
    Path((org, name, rev, file)): Path<(String, String, String, String)>,
) -> Response {
    count(&inner, |c| {
        if method == Method::HEAD {
            c.resolve_head += 1;
        } else {
            c.resolve_get += 1;
        }
    });
    let repo = match lookup(&inner, &org, &name, &rev) {
        Ok(r) => r,
        Err((status, code)) => return hub_error(status, code),
    };
    let Some(f) = repo.files.get(&file) else {
        return hub_error(StatusCode::NOT_FOUND, "EntryNotFound");
    };
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::FOUND;
    let h = r.headers_mut();
    h.insert(
        header::LOCATION,
        header_value(&format!("{}/cdn/{}", inner.base, f.sha256)),
    );
    h.insert("x-repo-commit", header_value(&repo.commit));
    h.insert("x-linked-etag", header_value(&format!("\"{}\"", f.sha256)));
    h.insert("x-linked-size", HeaderValue::from(f.size));
    h.insert(header::ETAG, header_value(&format!("\"{}\"", f.sha256)));
    r
}

async fn cdn(
    State(inner): State<Arc<Inner>>,
    Path(sha): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(f) = inner.repo.files.values().find(|f| f.sha256 == sha) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let start = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.strip_suffix('-'))
        .and_then(|v| v.parse::<u64>().ok());
    let from = start.unwrap_or(0);
    if from >= f.size && f.size > 0 {
        return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
    }
    let data = match tokio::fs::read(&f.disk).await {
        Ok(d) => d,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let part = data[from as usize..].to_vec();
    count(&inner, |c| {
        c.cdn_get += 1;
        c.cdn_bytes += part.len() as u64;
    });
    let mut r = Response::new(Body::from(part));
    let h = r.headers_mut();
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::ETAG, header_value(&format!("\"{sha}\"")));
    if start.is_some() {
        h.insert(
            header::CONTENT_RANGE,
            header_value(&format!("bytes {from}-{}/{}", f.size - 1, f.size)),
        );
        *r.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    r
}
