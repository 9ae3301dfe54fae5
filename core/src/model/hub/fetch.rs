//! Fetching a model: resolve the revision, pick the files, download what the cache lacks
//! (in parallel, resumable, checksummed), and link it into the snapshot folder.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::cache::RepoCache;
use super::client::{FileMeta, HubClient};
use super::progress::{Progress, human_bytes};
use super::select::{self, Plan};
use super::{HubError, HubSettings, RepoRef, Snapshot};

/// Attempts at one file that gain no bytes before the download gives up (the `.incomplete`
/// file stays, and the next run resumes it).
const MAX_STALLED_ATTEMPTS: u32 = 5;

fn disk_err(path: &Path, needed: Option<u64>) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Disk {
        path: path.to_path_buf(),
        source,
        needed,
    }
}

pub async fn fetch_model(
    repo: &RepoRef,
    revision: &str,
    settings: &HubSettings,
) -> Result<Snapshot, HubError> {
    let cache = RepoCache::new(&settings.cache_dir, repo);
    if settings.offline {
        let snap = from_cache(repo, revision, &cache)?;
        tracing::info!(
            "HF_HUB_OFFLINE: {repo}@{revision} from the cache ({})",
            snap.path.display()
        );
        return Ok(snap);
    }
    let client = HubClient::new(settings, repo)?;
    let info = match client.repo_info(revision).await {
        Ok(info) => info,
        Err(e @ HubError::Network { .. }) => {
            // As huggingface_hub does: with the Hub out of reach, a complete snapshot of this
            // revision in the cache still serves.
            return match from_cache(repo, revision, &cache) {
                Ok(snap) => {
                    tracing::warn!("{e}; using the cached snapshot {}", snap.path.display());
                    Ok(snap)
                }
                Err(_) => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    let commit = info.commit;
    let plan = select::plan(repo, revision, &info.files)?;
    cache.write_ref(revision, &commit)?;
    let dl = Downloader {
        client: &client,
        cache: &cache,
        commit: &commit,
        what: repo.to_string(),
        parallel: settings.max_parallel.max(1),
    };
    let (path, downloaded_bytes) = match plan {
        Plan::Gguf(file) => {
            let n = dl.fetch_all(std::slice::from_ref(&file)).await?;
            (cache.snapshot_file(&commit, &file), n)
        }
        Plan::Folder { mut files, index } => {
            let mut n = 0;
            if let Some(index) = index {
                n += dl.fetch_all(std::slice::from_ref(&index)).await?;
                let path = cache.snapshot_file(&commit, &index);
                let text = std::fs::read_to_string(&path).map_err(disk_err(&path, None))?;
                let shards = select::shards_from_index(&text, &info.files).map_err(|e| {
                    HubError::NoWeights {
                        repo: repo.id.clone(),
                        revision: revision.to_string(),
                        details: format!("{index}: {e}"),
                    }
                })?;
                files.push(index);
                files.extend(shards);
            }
            n += dl.fetch_all(&files).await?;
            (cache.snapshot_dir(&commit), n)
        }
    };
    Ok(Snapshot {
        path,
        commit,
        downloaded_bytes,
    })
}

/// A complete snapshot of `revision` from the cache alone, or what is missing.
pub fn from_cache(repo: &RepoRef, revision: &str, cache: &RepoCache) -> Result<Snapshot, HubError> {
    let missing = |what: String| HubError::Offline {
        repo: repo.id.clone(),
        revision: revision.to_string(),
        cache: cache.root.clone(),
        missing: what,
    };
    let commit = cache
        .commit_of(revision)
        .ok_or_else(|| missing(format!("refs/{revision} (this revision was never fetched)")))?;
    let dir = cache.snapshot_dir(&commit);
    if !dir.is_dir() {
        return Err(missing(format!("snapshots/{commit}")));
    }
    let snap = |path: PathBuf| Snapshot {
        path,
        commit: commit.clone(),
        downloaded_bytes: 0,
    };
    if let Some(file) = &repo.gguf_file {
        return if cache.has_file(&commit, file) {
            Ok(snap(cache.snapshot_file(&commit, file)))
        } else {
            Err(missing(file.clone()))
        };
    }
    let names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(disk_err(&dir, None))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    let has = |f: &str| names.iter().any(|n| n == f);
    let index = select::SAFETENSORS_INDEX;
    if has(index) {
        let path = dir.join(index);
        let text = std::fs::read_to_string(&path).map_err(disk_err(&path, None))?;
        // Shards must be present, so compare against what is here.
        select::shards_from_index(&text, &names).map_err(|e| missing(format!("{index}: {e}")))?;
    } else if !names.iter().any(|n| n.ends_with(".safetensors")) {
        let ggufs: Vec<&String> = names.iter().filter(|n| n.ends_with(".gguf")).collect();
        if let [one] = ggufs.as_slice() {
            return Ok(snap(dir.join(one)));
        }
        return Err(missing("the weights (*.safetensors)".into()));
    }
    if !has("config.json") {
        return Err(missing("config.json".into()));
    }
    Ok(snap(dir))
}

struct Downloader<'a> {
    client: &'a HubClient,
    cache: &'a RepoCache,
    commit: &'a str,
    what: String,
    parallel: usize,
}

impl Downloader<'_> {
    /// Make every file of `files` present in the snapshot; returns the bytes downloaded.
    async fn fetch_all(&self, files: &[String]) -> Result<u64, HubError> {
        let missing: Vec<&String> = files
            .iter()
            .filter(|f| !self.cache.has_file(self.commit, f))
            .collect();
        if missing.is_empty() {
            return Ok(0);
        }
        let metas: Vec<(String, FileMeta)> = futures::stream::iter(missing)
            .map(|f| async move {
                let meta = self.client.file_meta(self.commit, f).await?;
                Ok::<_, HubError>((f.clone(), meta))
            })
            .buffer_unordered(self.parallel)
            .try_collect()
            .await?;
        let mut to_fetch = Vec::new();
        for (file, meta) in metas {
            if self.cache.blob(&meta.etag).is_file() {
                // Same content under another name or commit: no bytes to fetch.
                self.cache.link(self.commit, &file, &meta.etag)?;
            } else {
                to_fetch.push((file, meta));
            }
        }
        if to_fetch.is_empty() {
            return Ok(0);
        }
        let blobs = self.cache.root.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(disk_err(&blobs, None))?;
        let total: u64 = to_fetch.iter().filter_map(|(_, m)| m.size).sum();
        let on_disk: u64 = to_fetch
            .iter()
            .map(|(_, m)| file_len(&self.cache.incomplete(&m.etag)))
            .sum();
        let needed = total.saturating_sub(on_disk);
        if let Some(free) = available_space(&blobs)
            && free < needed
        {
            return Err(HubError::Disk {
                path: blobs,
                source: std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!("{} free", human_bytes(free)),
                ),
                needed: Some(needed),
            });
        }
        let progress = Progress::start(&self.what, to_fetch.len(), total);
        let got: Vec<u64> = futures::stream::iter(to_fetch)
            .map(|(file, meta)| {
                let progress = &progress;
                async move { self.fetch_one(&file, &meta, progress).await }
            })
            .buffer_unordered(self.parallel)
            .try_collect()
            .await?;
        progress.finish();
        Ok(got.iter().sum())
    }

    /// Download one blob under the cache's lock for it, verify it, link it.
    async fn fetch_one(
        &self,
        file: &str,
        meta: &FileMeta,
        progress: &Progress,
    ) -> Result<u64, HubError> {
        let lock_path = self.cache.lock(&meta.etag);
        let _lock = lock_file(&lock_path).await?;
        let blob = self.cache.blob(&meta.etag);
        if blob.is_file() {
            // Another process finished it while we waited for the lock.
            self.cache.link(self.commit, file, &meta.etag)?;
            progress.file_done();
            return Ok(0);
        }
        let part = self.cache.incomplete(&meta.etag);
        let fetched = self.download_part(file, meta, &part, progress).await?;
        let len = file_len(&part);
        if let Some(size) = meta.size
            && len != size
        {
            return Err(HubError::BadResponse(format!(
                "{file}: the download ended at {len} of {size} bytes; run again to resume"
            )));
        }
        verify(file, &meta.etag, &part).await?;
        std::fs::rename(&part, &blob).map_err(disk_err(&blob, None))?;
        self.cache.link(self.commit, file, &meta.etag)?;
        progress.file_done();
        Ok(fetched)
    }

    /// Fill `part` up to the file's size, continuing what is there with range requests and
    /// retrying interruptions while they make progress.
    async fn download_part(
        &self,
        file: &str,
        meta: &FileMeta,
        part: &Path,
        progress: &Progress,
    ) -> Result<u64, HubError> {
        let mut offset = file_len(part);
        if meta.size.is_some_and(|s| offset > s) {
            truncate(part)?;
            offset = 0;
        }
        if offset > 0 {
            tracing::info!("{file}: resuming at byte {offset}");
        }
        progress.add_resumed(offset);
        let mut fetched = 0u64;
        let mut stalled = 0u32;
        loop {
            if meta.size == Some(offset) {
                return Ok(fetched);
            }
            let before = offset;
            let result = self.get_into(file, meta, part, &mut offset, progress).await;
            fetched += offset.saturating_sub(before);
            let err = match result {
                Ok(()) if meta.size.is_none_or(|s| offset >= s) => return Ok(fetched),
                Ok(()) => HubError::Interrupted {
                    file: file.to_string(),
                    offset,
                    message: "the connection closed early".into(),
                },
                Err(
                    e @ (HubError::Network { .. }
                    | HubError::Http { .. }
                    | HubError::Interrupted { .. }),
                ) => e,
                Err(e) => return Err(e),
            };
            let retryable = match &err {
                HubError::Http { status, .. } => *status >= 500 || *status == 429,
                _ => true,
            };
            stalled = if offset > before { 0 } else { stalled + 1 };
            if !retryable || stalled >= MAX_STALLED_ATTEMPTS {
                return Err(err);
            }
            tracing::warn!(
                "{file}: {err}; retrying from byte {offset} ({stalled} failed attempt(s) in a row)"
            );
            tokio::time::sleep(Duration::from_millis(300 * u64::from(stalled.max(1)))).await;
        }
    }

    /// One GET from `offset`, appended to `part`; `offset` follows what was written.
    async fn get_into(
        &self,
        file: &str,
        meta: &FileMeta,
        part: &Path,
        offset: &mut u64,
        progress: &Progress,
    ) -> Result<(), HubError> {
        let resp = self.client.get_content(&meta.location, *offset).await?;
        let status = resp.status().as_u16();
        let range_start = resp
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.parse::<u64>().ok());
        let restart = match status {
            206 => range_start != Some(*offset),
            // The server ignored the range, or the partial file is not a prefix of this one.
            200 => *offset > 0,
            416 => {
                truncate(part)?;
                *offset = 0;
                return Err(HubError::Interrupted {
                    file: file.to_string(),
                    offset: 0,
                    message: "the range request was refused; starting the file again".into(),
                });
            }
            _ => {
                return Err(HubError::Http {
                    url: meta.location.to_string(),
                    status,
                    message: "unexpected status for a download".into(),
                });
            }
        };
        if restart {
            tracing::info!("{file}: the server sent the whole file; starting again");
            truncate(part)?;
            *offset = 0;
        }
        let remaining = meta.size.map(|s| s.saturating_sub(*offset));
        let mut out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(part)
            .map_err(disk_err(part, remaining))?;
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| HubError::Interrupted {
                file: file.to_string(),
                offset: *offset,
                message: error_chain(&e),
            })?;
            let remaining = meta.size.map(|s| s.saturating_sub(*offset));
            out.write_all(&chunk).map_err(disk_err(part, remaining))?;
            *offset += chunk.len() as u64;
            progress.add_bytes(chunk.len() as u64);
        }
        out.flush().map_err(disk_err(part, None))?;
        out.sync_all().map_err(disk_err(part, None))?;
        Ok(())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    message
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn truncate(path: &Path) -> Result<(), HubError> {
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map(|_| ())
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(disk_err(path, None))
}

/// Take the exclusive lock `huggingface_hub` also takes on a blob (flock on
/// `.locks/<repo>/<etag>.lock`), waiting for another process that holds it.
async fn lock_file(path: &Path) -> Result<std::fs::File, HubError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(disk_err(dir, None))?;
    }
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(disk_err(path, None))?;
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || f.lock().map(|()| f))
        .await
        .map_err(|e| HubError::BadResponse(format!("lock task: {e}")))?
        .map_err(disk_err(&p, None))
}

/// Check `path` against the ETag: sha256 for LFS files (64 hex digits), the git blob id for
/// small files (40); an ETag of another form (some mirrors) cannot be checked.
async fn verify(file: &str, etag: &str, path: &Path) -> Result<(), HubError> {
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let kind = match etag.len() {
        64 if hex(etag) => 256,
        40 if hex(etag) => 1,
        _ => {
            tracing::debug!("{file}: ETag {etag} is not a checksum; not verified");
            return Ok(());
        }
    };
    let p = path.to_path_buf();
    let actual = tokio::task::spawn_blocking(move || digest_file(&p, kind))
        .await
        .map_err(|e| HubError::BadResponse(format!("checksum task: {e}")))?
        .map_err(disk_err(path, None))?;
    if actual.eq_ignore_ascii_case(etag) {
        return Ok(());
    }
    let _ = std::fs::remove_file(path);
    Err(HubError::Checksum {
        file: file.to_string(),
        expected: etag.to_string(),
        actual,
    })
}

fn digest_file(path: &Path, kind: u32) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut sha256 = Sha256::new();
    let mut sha1 = Sha1::new();
    if kind == 1 {
        sha1.update(format!("blob {len}\0").as_bytes());
    }
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if kind == 1 {
            sha1.update(&buf[..n]);
        } else {
            sha256.update(&buf[..n]);
        }
    }
    let bytes: Vec<u8> = if kind == 1 {
        sha1.finalize().to_vec()
    } else {
        sha256.finalize().to_vec()
    };
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Free bytes for an unprivileged writer on the filesystem holding `dir`.
fn available_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data; all-zero is a valid value for it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)]
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_git_and_sha256() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello\n").expect("write");
        // `git hash-object` of "hello\n", and sha256sum of the same bytes.
        assert_eq!(
            digest_file(&p, 1).expect("sha1"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            digest_file(&p, 256).expect("sha256"),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert!(available_space(dir.path()).is_some_and(|n| n > 0));
    }
}
