//! A local server that speaks the Hugging Face Hub's download protocol over files on disk:
//!
//! - `GET /api/models/{org}/{name}/revision/{rev}`: `sha` and `siblings` (the revision API);
//! - `GET /api/models/{org}/{name}/tree/{rev}[/]`: the file listing `huggingface_hub` 1.x+
//!   reads (`oid`, `size`, `lfs.oid` = sha256);
//! - `HEAD|GET /{org}/{name}/resolve/{rev}/{file}`: small files answer 200 with `ETag` (the
//!   git blob id) and `X-Repo-Commit`; LFS files (weights) answer 302 to the "CDN" with
//!   `X-Linked-Etag` (sha256), `X-Linked-Size` and `X-Repo-Commit`;
//! - `GET /cdn/{sha256}` on a second listener (another origin, as the Hub's CDN is): the
//!   content, with range requests (206 + `Content-Range`).
//!
//! Errors carry the Hub's `X-Error-Code` header: `RepoNotFound` (401), `RevisionNotFound`
//! (404), `EntryNotFound` (404), `GatedRepo` (401 without a token, 403 with a wrong one).
//! Every request is counted, and faults can be injected: cut a download at a byte offset, or
//! corrupt a byte of it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha1::Sha1;
use sha2::{Digest, Sha256};

pub const TOKEN: &str = "hf_test_token_abc";

#[derive(Clone)]
pub struct RepoFile {
    pub disk: PathBuf,
    pub size: u64,
    pub sha256: String,
    pub git_oid: String,
    pub lfs: bool,
}

#[derive(Clone)]
pub struct Repo {
    pub commit: String,
    /// Branch and tag names besides the commit id.
    pub refs: Vec<String>,
    pub files: BTreeMap<String, RepoFile>,
    pub gated: bool,
}

#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub api: usize,
    pub tree: usize,
    pub resolve_head: usize,
    pub resolve_get: usize,
    pub cdn_get: usize,
    pub cdn_bytes: u64,
    /// Start offsets of range requests on the CDN.
    pub ranges: Vec<u64>,
}

impl Counters {
    /// Requests for file content or file metadata (not the listing APIs).
    pub fn file_requests(&self) -> usize {
        self.resolve_head + self.resolve_get + self.cdn_get
    }
}

#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Stop every CDN body of this blob (sha256) at this absolute offset, then drop the
    /// connection.
    pub cut: Option<(String, u64)>,
    /// Flip the first byte of this blob (sha256) in every CDN body.
    pub corrupt: Option<String>,
}

struct Inner {
    repos: HashMap<String, Repo>,
    counters: Mutex<Counters>,
    faults: Mutex<Faults>,
    cdn_base: String,
}

pub struct HubServer {
    inner: Arc<Inner>,
    pub endpoint: String,
    _rt: tokio::runtime::Runtime,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl RepoFile {
    pub fn from_disk(disk: PathBuf, lfs: bool) -> RepoFile {
        let data = std::fs::read(&disk).unwrap();
        let sha256 = hex(&Sha256::digest(&data));
        let mut h = Sha1::new();
        h.update(format!("blob {}\0", data.len()).as_bytes());
        h.update(&data);
        RepoFile {
            disk,
            size: data.len() as u64,
            sha256,
            git_oid: hex(&h.finalize()),
            lfs,
        }
    }
}

/// Weights and big files are LFS files on the Hub.
pub fn is_lfs(name: &str) -> bool {
    [".safetensors", ".gguf", ".bin"]
        .iter()
        .any(|e| name.ends_with(e))
}

impl Repo {
    pub fn empty(commit: &str) -> Repo {
        Repo {
            commit: commit.to_string(),
            refs: vec!["main".into()],
            files: BTreeMap::new(),
            gated: false,
        }
    }

    /// A repository of every file under `dir` (names relative to it), at one commit.
    pub fn from_dir(dir: &std::path::Path, commit: &str) -> Repo {
        let mut files = BTreeMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let name = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                    let lfs = is_lfs(&name);
                    files.insert(name, RepoFile::from_disk(p, lfs));
                }
            }
        }
        Repo {
            commit: commit.to_string(),
            refs: vec!["main".into()],
            files,
            gated: false,
        }
    }
}

impl HubServer {
    pub fn start(repos: HashMap<String, Repo>) -> HubServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (hub, cdn) = rt.block_on(async {
            (
                tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
                tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            )
        });
        let endpoint = format!("http://{}", hub.local_addr().unwrap());
        let inner = Arc::new(Inner {
            repos,
            counters: Mutex::default(),
            faults: Mutex::default(),
            cdn_base: format!("http://{}", cdn.local_addr().unwrap()),
        });
        let app = Router::new()
            .route("/api/models/{org}/{name}/revision/{rev}", get(revision))
            .route("/api/models/{org}/{name}/tree/{rev}", get(tree))
            .route("/api/models/{org}/{name}/tree/{rev}/", get(tree))
            .route("/{org}/{name}/resolve/{rev}/{*file}", get(resolve))
            .route("/cdn/{sha}", get(cdn_get))
            .with_state(inner.clone());
        let app2 = app.clone();
        rt.spawn(async move { axum::serve(hub, app).await });
        rt.spawn(async move { axum::serve(cdn, app2).await });
        HubServer {
            inner,
            endpoint,
            _rt: rt,
        }
    }

    pub fn counters(&self) -> Counters {
        self.inner.counters.lock().unwrap().clone()
    }

    pub fn reset_counters(&self) {
        *self.inner.counters.lock().unwrap() = Counters::default();
    }

    pub fn set_faults(&self, f: Faults) {
        *self.inner.faults.lock().unwrap() = f;
    }

    pub fn repo(&self, id: &str) -> &Repo {
        &self.inner.repos[id]
    }
}

fn hub_error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut r = (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
    r.headers_mut()
        .insert("x-error-code", HeaderValue::from_str(code).unwrap());
    r.headers_mut()
        .insert("x-error-message", HeaderValue::from_str(message).unwrap());
    r
}

/// The repository and commit a request may see, or the Hub's error for it.
#[allow(clippy::result_large_err)]
fn lookup<'a>(
    inner: &'a Inner,
    org: &str,
    name: &str,
    rev: &str,
    headers: &HeaderMap,
) -> Result<&'a Repo, Response> {
    let id = format!("{org}/{name}");
    let Some(repo) = inner.repos.get(&id) else {
        return Err(hub_error(
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
            "Repository not found",
        ));
    };
    if repo.gated {
        let auth = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match auth {
            None => {
                return Err(hub_error(
                    StatusCode::UNAUTHORIZED,
                    "GatedRepo",
                    "Access to model is restricted. You must have access to it and be authenticated to access it. Please log in.",
                ));
            }
            Some(a) if a != format!("Bearer {TOKEN}") => {
                return Err(hub_error(
                    StatusCode::FORBIDDEN,
                    "GatedRepo",
                    "Access to model is restricted and you are not in the authorized list.",
                ));
            }
            Some(_) => {}
        }
    }
    if rev != repo.commit && !repo.refs.iter().any(|r| r == rev) {
        return Err(hub_error(
            StatusCode::NOT_FOUND,
            "RevisionNotFound",
            &format!("Invalid rev id: {rev}"),
        ));
    }
    Ok(repo)
}

async fn revision(
    State(inner): State<Arc<Inner>>,
    Path((org, name, rev)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    inner.counters.lock().unwrap().api += 1;
    let repo = match lookup(&inner, &org, &name, &rev, &headers) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let siblings: Vec<_> = repo
        .files
        .keys()
        .map(|f| serde_json::json!({ "rfilename": f }))
        .collect();
    axum::Json(serde_json::json!({
        "_id": format!("{org}-{name}"),
        "id": format!("{org}/{name}"),
        "modelId": format!("{org}/{name}"),
        "sha": repo.commit,
        "private": false,
        "gated": repo.gated,
        "disabled": false,
        "tags": [],
        "siblings": siblings,
    }))
    .into_response()
}

async fn tree(
    State(inner): State<Arc<Inner>>,
    Path((org, name, rev)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    inner.counters.lock().unwrap().tree += 1;
    let repo = match lookup(&inner, &org, &name, &rev, &headers) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let entries: Vec<_> = repo
        .files
        .iter()
        .map(|(path, f)| {
            let mut e = serde_json::json!({
                "type": "file",
                "oid": f.git_oid,
                "size": f.size,
                "path": path,
            });
            if f.lfs {
                e["lfs"] =
                    serde_json::json!({ "oid": f.sha256, "size": f.size, "pointerSize": 134 });
            }
            e
        })
        .collect();
    axum::Json(entries).into_response()
}

async fn resolve(
    State(inner): State<Arc<Inner>>,
    method: Method,
    Path((org, name, rev, file)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    {
        let mut c = inner.counters.lock().unwrap();
        if method == Method::HEAD {
            c.resolve_head += 1;
        } else {
            c.resolve_get += 1;
        }
    }
    let repo = match lookup(&inner, &org, &name, &rev, &headers) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let Some(f) = repo.files.get(&file) else {
        let mut r = hub_error(StatusCode::NOT_FOUND, "EntryNotFound", "Entry not found");
        r.headers_mut().insert(
            "x-repo-commit",
            HeaderValue::from_str(&repo.commit).unwrap(),
        );
        return r;
    };
    let commit = HeaderValue::from_str(&repo.commit).unwrap();
    if f.lfs {
        let location = format!("{}/cdn/{}", inner.cdn_base, f.sha256);
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::FOUND;
        let h = r.headers_mut();
        h.insert(header::LOCATION, HeaderValue::from_str(&location).unwrap());
        h.insert("x-repo-commit", commit);
        h.insert(
            "x-linked-etag",
            HeaderValue::from_str(&format!("\"{}\"", f.sha256)).unwrap(),
        );
        h.insert("x-linked-size", HeaderValue::from(f.size));
        h.insert(
            header::ETAG,
            HeaderValue::from_str(&format!("\"{}\"", f.git_oid)).unwrap(),
        );
        return r;
    }
    let data = std::fs::read(&f.disk).unwrap();
    let mut r = Response::new(Body::from(data));
    let h = r.headers_mut();
    h.insert("x-repo-commit", commit);
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{}\"", f.git_oid)).unwrap(),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(f.size));
    r
}

async fn cdn_get(
    State(inner): State<Arc<Inner>>,
    Path(sha): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(f) = inner
        .repos
        .values()
        .flat_map(|r| r.files.values())
        .find(|f| f.sha256 == sha)
        .cloned()
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let start = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.strip_suffix('-'))
        .and_then(|v| v.parse::<u64>().ok());
    {
        let mut c = inner.counters.lock().unwrap();
        c.cdn_get += 1;
        if let Some(s) = start {
            c.ranges.push(s);
        }
    }
    let start_at = start.unwrap_or(0);
    if start_at >= f.size {
        let mut r = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
        r.headers_mut().insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&format!("bytes */{}", f.size)).unwrap(),
        );
        return r;
    }
    let faults = inner.faults.lock().unwrap().clone();
    let mut data = std::fs::read(&f.disk).unwrap();
    if faults.corrupt.as_deref() == Some(sha.as_str()) {
        data[0] ^= 0xff;
    }
    let body_len = f.size - start_at;
    let cut = faults
        .cut
        .filter(|(s, _)| *s == sha)
        .map(|(_, at)| at.max(start_at));
    let end = cut.unwrap_or(f.size).min(f.size);
    let part = data[start_at as usize..end as usize].to_vec();
    inner.counters.lock().unwrap().cdn_bytes += part.len() as u64;
    // Pieces of 64 KiB, then (when cut) an error that aborts the response mid-body.
    let mut pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        part.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
    if cut.is_some_and(|c| c < f.size) {
        pieces.push(Err(std::io::Error::other("connection cut by the test")));
    }
    let mut r = Response::new(Body::from_stream(futures::stream::iter(pieces)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{sha}\"")).unwrap(),
    );
    if start.is_some() {
        h.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&format!("bytes {start_at}-{}/{}", f.size - 1, f.size)).unwrap(),
        );
        *r.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    r
}
