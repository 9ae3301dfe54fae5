//! The `huggingface_hub` cache layout of one repository: content-addressed blobs, refs from
//! branch or tag to commit, and per-commit snapshot folders of relative symlinks.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{HubError, RepoRef};

/// Whether `s` is a full commit id (40 lowercase hex digits).
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn disk(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Disk {
        path: path.to_path_buf(),
        source,
        needed: None,
    }
}

/// One repository's folder in the cache, `$HF_HUB_CACHE/models--org--name`.
#[derive(Debug, Clone)]
pub struct RepoCache {
    pub root: PathBuf,
    locks: PathBuf,
}

impl RepoCache {
    pub fn new(cache_dir: &Path, repo: &RepoRef) -> Self {
        let folder = repo.cache_folder();
        RepoCache {
            root: cache_dir.join(&folder),
            locks: cache_dir.join(".locks").join(folder),
        }
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    /// A download in progress; continued with a range request after an interruption.
    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(format!("{etag}.incomplete"))
    }

    /// The lock file `huggingface_hub` also takes (flock) while writing a blob.
    pub fn lock(&self, etag: &str) -> PathBuf {
        self.locks.join(format!("{etag}.lock"))
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    pub fn snapshot_file(&self, commit: &str, file: &str) -> PathBuf {
        self.snapshot_dir(commit).join(file)
    }

    /// Whether `file` of `commit` is in the snapshot and its blob is there.
    pub fn has_file(&self, commit: &str, file: &str) -> bool {
        self.snapshot_file(commit, file).is_file()
    }

    /// The commit a revision stands for, from the cache alone.
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_string())
    }

    /// Record that `revision` (a branch or tag) points at `commit`, atomically.
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit || self.commit_of(revision).as_deref() == Some(commit) {
            return Ok(());
        }
        let path = self.root.join("refs").join(revision);
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir).map_err(disk(dir))?;
        let mut tmp = tempfile_in(dir)?;
        tmp.1.write_all(commit.as_bytes()).map_err(disk(&tmp.0))?;
        drop(tmp.1);
        std::fs::rename(&tmp.0, &path).map_err(disk(&path))
    }

    /// Point `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative symlink (replacing
    /// whatever was there), so the cache can be moved as a whole.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf, HubError> {
        let dst = self.snapshot_file(commit, file);
        let dir = dst.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(disk(&dir))?;
        // From snapshots/<commit>/<a/b/file> up to the repository folder: two levels plus
        // one per folder inside the repository.
        let ups = 2 + file.matches('/').count();
        let mut target = PathBuf::new();
        for _ in 0..ups {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            dst.file_name().and_then(|n| n.to_str()).unwrap_or("link"),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).map_err(disk(&tmp))?;
        std::fs::rename(&tmp, &dst).map_err(disk(&dst))?;
        Ok(dst)
    }
}

/// A fresh file in `dir` with a unique name (path, handle).
fn tempfile_in(dir: &Path) -> Result<(PathBuf, std::fs::File), HubError> {
    for n in 0..100u32 {
        let path = dir.join(format!(".tmp.{}.{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(disk(&path)(e)),
        }
    }
    Err(HubError::BadResponse(format!(
        "cannot create a temporary file in {}",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_and_refs_round_trip() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = RepoRef::parse("org/name").expect("id");
        let cache = RepoCache::new(tmp.path(), &repo);
        let etag = "a".repeat(64);
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(cache.root.join("blobs")).expect("mkdir");
        std::fs::write(cache.blob(&etag), b"weights").expect("write blob");
        let link = cache
            .link(commit, "sub/dir/model.gguf", &etag)
            .expect("link");
        let target = std::fs::read_link(&link).expect("a symlink");
        assert_eq!(target, Path::new("../../../../blobs").join(&etag));
        assert_eq!(std::fs::read(&link).expect("read through link"), b"weights");
        assert!(cache.has_file(commit, "sub/dir/model.gguf"));
        assert!(!cache.has_file(commit, "config.json"));

        assert_eq!(cache.commit_of("main"), None);
        cache.write_ref("main", commit).expect("write ref");
        assert_eq!(cache.commit_of("main").as_deref(), Some(commit));
        assert_eq!(cache.commit_of(commit).as_deref(), Some(commit));
    }
}
