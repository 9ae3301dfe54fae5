//! Models named by a Hugging Face Hub id: `--model-path org/name` becomes a local snapshot
//! folder (or a GGUF file inside one) before anything is loaded, so the loaders only ever see
//! plain files.
//!
//! What is fetched: the files the engine reads (config, generation config, tokenizer files,
//! `*.safetensors` with their index), or one GGUF file named as `org/name/file.gguf`. Files
//! download in parallel, resume from a `.incomplete` file with a range request after an
//! interruption, and are checked against the Hub's checksums (the ETag of an LFS file is its
//! sha256, that of a small file its git blob id) before they are moved into place.
//!
//! The cache is `huggingface_hub`'s, so either tool reuses what the other fetched:
//!
//! ```text
//! $HF_HUB_CACHE/models--org--name/
//!     blobs/<etag>                      the content, named by its checksum
//!     refs/<revision>                   the commit a branch or tag pointed at
//!     snapshots/<commit>/<file>      -> ../../blobs/<etag>
//! ```
//!
//! Environment, as `huggingface_hub` reads it: `HF_TOKEN` (else `HF_TOKEN_PATH`, else
//! `$HF_HOME/token`), `HF_HUB_CACHE` (else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`),
//! `HF_ENDPOINT` (a mirror) and `HF_HUB_OFFLINE` (use the cache only).
//!
//! Written on `reqwest` rather than the `hf-hub` crate: hf-hub 1.0 restarts an interrupted
//! file from zero, verifies no checksum, ignores `HF_HUB_OFFLINE`, and brings the Xet client
//! and a second `reqwest` major version into the build; hf-hub 0.4 resumes into its own
//! `.sync.part` files (not `huggingface_hub`'s `.incomplete`), verifies no checksum and reads
//! neither `HF_HUB_CACHE`, `HF_TOKEN` nor `HF_HUB_OFFLINE`.

mod cache;
mod client;
mod fetch;
mod progress;
mod repo;
mod select;

use std::path::{Path, PathBuf};

pub use cache::RepoCache;
pub use repo::RepoRef;

/// What went wrong while fetching a model from the Hub. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    InvalidRepoId(String),
    #[error(
        "{repo} needs a token: {message} (set HF_TOKEN to a token that can read it{})",
        if *.gated { ", after accepting the model's terms on its Hub page" } else { "" }
    )]
    Unauthorized {
        repo: String,
        gated: bool,
        message: String,
    },
    #[error(
        "repository {repo} was not found on {endpoint} (check the id; a private repository also needs HF_TOKEN)"
    )]
    RepoNotFound { repo: String, endpoint: String },
    #[error(
        "revision {revision} was not found in {repo} (a branch, tag or commit of the repository)"
    )]
    RevisionNotFound { repo: String, revision: String },
    #[error("{repo}@{revision} has no file {file}")]
    FileNotFound {
        repo: String,
        revision: String,
        file: String,
    },
    #[error(
        "cannot reach {endpoint}: {message} (no network? HF_ENDPOINT names a mirror; HF_HUB_OFFLINE=1 uses only the cache)"
    )]
    Network { endpoint: String, message: String },
    #[error(
        "the download of {file} broke off at byte {offset}: {message}; run again to resume (the partial file is kept)"
    )]
    Interrupted {
        file: String,
        offset: u64,
        message: String,
    },
    #[error("{url}: HTTP {status}: {message}")]
    Http {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{0}")]
    BadResponse(String),
    #[error("{}", disk_message(path, source, *needed))]
    Disk {
        path: PathBuf,
        source: std::io::Error,
        /// Bytes still to write, when known.
        needed: Option<u64>,
    },
    #[error(
        "HF_HUB_OFFLINE is set and {repo}@{revision} is not complete in the cache {cache}: missing {missing}"
    )]
    Offline {
        repo: String,
        revision: String,
        cache: PathBuf,
        missing: String,
    },
    #[error("{repo}@{revision} has no weights this engine can read: {details}")]
    NoWeights {
        repo: String,
        revision: String,
        details: String,
    },
    #[error(
        "{file}: checksum mismatch (expected {expected}, got {actual}); the partial download was removed, run again to fetch it anew"
    )]
    Checksum {
        file: String,
        expected: String,
        actual: String,
    },
}

fn disk_message(path: &Path, e: &std::io::Error, needed: Option<u64>) -> String {
    let need = needed
        .map(|n| format!(" ({} still to write)", progress::human_bytes(n)))
        .unwrap_or_default();
    if e.kind() == std::io::ErrorKind::StorageFull {
        format!(
            "no space left on the device holding {}{need}; free space or point HF_HUB_CACHE at a larger disk, then run again to resume",
            path.display()
        )
    } else {
        format!("{}: {e}", path.display())
    }
}

/// Where models come from and go to, read from the environment as `huggingface_hub` reads it.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// Base URL of the Hub or a mirror, without a trailing slash.
    pub endpoint: String,
    pub token: Option<String>,
    pub cache_dir: PathBuf,
    pub offline: bool,
    /// Files downloaded at once.
    pub max_parallel: usize,
}

impl HubSettings {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let home = var("HOME").map(PathBuf::from).unwrap_or_else(|| "/".into());
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join(".cache"))
                .join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = var("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| hf_home.join("token"));
                std::fs::read_to_string(path).ok()
            })
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let endpoint = var("HF_ENDPOINT")
            .unwrap_or_else(|| "https://huggingface.co".into())
            .trim_end_matches('/')
            .to_string();
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "on" | "yes" | "true"
            )
        });
        HubSettings {
            endpoint,
            token,
            cache_dir,
            offline,
            max_parallel: 8,
        }
    }
}

/// A model fetched into (or found in) the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// What the loader opens: the snapshot folder, or the GGUF file inside it.
    pub path: PathBuf,
    /// The commit the revision resolved to.
    pub commit: String,
    /// Bytes downloaded by this call (0 when everything came from the cache).
    pub downloaded_bytes: u64,
}

/// Fetch what the engine needs of `repo` at `revision` (default `main`) into the cache and
/// return the local path. Files already in the cache are not fetched again; with
/// `settings.offline` only the cache is used.
pub async fn fetch(
    repo: &RepoRef,
    revision: Option<&str>,
    settings: &HubSettings,
) -> Result<Snapshot, HubError> {
    fetch::fetch_model(repo, revision.unwrap_or("main"), settings).await
}

#[cfg(test)]
mod tests {
    use super::HubError;

    #[test]
    fn a_full_disk_says_so_and_how_to_resume() {
        let e = HubError::Disk {
            path: "/cache/models--org--name/blobs".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            needed: Some(16_100_000_000),
        };
        let m = e.to_string();
        assert!(
            m.contains("no space left") && m.contains("16.1 GB") && m.contains("HF_HUB_CACHE"),
            "{m}"
        );
    }
}
