//! Hub repository ids as `--model-path` takes them: `org/name`, or `org/name/file.gguf` for
//! one GGUF file of a repository that holds several.

use std::fmt;
use std::path::Path;

use super::HubError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `org/name`.
    pub id: String,
    /// A GGUF file inside the repository (may include folders), when one was named.
    pub gguf_file: Option<String>,
}

impl fmt::Display for RepoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gguf_file {
            Some(file) => write!(f, "{}/{file}", self.id),
            None => f.write_str(&self.id),
        }
    }
}

/// One part of a repository id: letters, digits, `-`, `_`, `.`, not starting or ending with
/// `-` or `.`, without `--` or `..` (the Hub's own rule), at most 96 characters.
fn valid_id_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("--")
        && !s.contains("..")
}

fn valid_file_part(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['\\', '\0'])
}

impl RepoRef {
    /// Parse `org/name` or `org/name/path/to/file.gguf`.
    pub fn parse(s: &str) -> Result<Self, HubError> {
        let bad = || {
            HubError::InvalidRepoId(format!(
                "{s:?} is not a Hugging Face repository id (org/name, or org/name/file.gguf for one GGUF file)"
            ))
        };
        let parts: Vec<&str> = s.split('/').collect();
        if parts.len() < 2 || !valid_id_part(parts[0]) || !valid_id_part(parts[1]) {
            return Err(bad());
        }
        let id = format!("{}/{}", parts[0], parts[1]);
        if parts.len() == 2 {
            return Ok(RepoRef {
                id,
                gguf_file: None,
            });
        }
        let rest = &parts[2..];
        let is_gguf = rest
            .last()
            .is_some_and(|f| f.to_ascii_lowercase().ends_with(".gguf"));
        if !is_gguf || !rest.iter().all(|p| valid_file_part(p)) {
            return Err(bad());
        }
        Ok(RepoRef {
            id,
            gguf_file: Some(rest.join("/")),
        })
    }

    /// `Some` when `--model-path` names a Hub repository: no such local path, and the value
    /// reads as a repository id (relative paths like `./x` or `models/x/y` that do not parse
    /// stay local paths, and get the "does not exist" error).
    pub fn from_model_path(path: &Path) -> Option<Self> {
        if path.exists() || path.is_absolute() {
            return None;
        }
        let s = path.to_str()?;
        if s.starts_with("./") || s.starts_with("../") || s.starts_with('~') {
            return None;
        }
        RepoRef::parse(s).ok()
    }

    /// The cache folder name, `models--org--name`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.id.replace('/', "--"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ids_and_gguf_files() {
        let r = RepoRef::parse("meta-llama/Llama-3.1-8B-Instruct").expect("valid id");
        assert_eq!(r.id, "meta-llama/Llama-3.1-8B-Instruct");
        assert_eq!(r.gguf_file, None);
        assert_eq!(
            r.cache_folder(),
            "models--meta-llama--Llama-3.1-8B-Instruct"
        );
        let g = RepoRef::parse("org/repo-GGUF/q4/model.Q4_1.gguf").expect("valid gguf ref");
        assert_eq!(g.id, "org/repo-GGUF");
        assert_eq!(g.gguf_file.as_deref(), Some("q4/model.Q4_1.gguf"));
        assert_eq!(g.to_string(), "org/repo-GGUF/q4/model.Q4_1.gguf");
    }

    #[test]
    fn rejects_what_is_not_an_id() {
        for bad in [
            "gpt2",
            "org/",
            "/abs/path",
            "org/name/config.json",
            "org/na me",
            "-org/name",
            "org/name.",
            "org/na--me",
            "org/name/../x.gguf",
            "org/name//x.gguf",
        ] {
            assert!(RepoRef::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn local_paths_stay_local() {
        let dir = std::env::temp_dir();
        assert_eq!(RepoRef::from_model_path(&dir), None);
        assert_eq!(RepoRef::from_model_path(Path::new("./org/name")), None);
        assert!(RepoRef::from_model_path(Path::new("no-such-org-xyz/name")).is_some());
    }
}
