//! Where a model lives on disk: one GGUF file, or a Hugging Face folder (`config.json`, the
//! weights in `*.safetensors` shards, and the tokenizer files).

use std::path::{Path, PathBuf};

use super::error::LoadError;

/// Name of the index that maps each tensor of a sharded checkpoint to its file.
const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";

/// Where a model lives on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// One GGUF file holding weights, tokenizer and chat template.
    Gguf(PathBuf),
    /// A Hugging Face folder: config.json, *.safetensors, tokenizer.json, tokenizer_config.json.
    HfDir(PathBuf),
}

impl ModelFiles {
    /// What `path` holds: a `.gguf` file, a folder with `config.json`, or a folder with
    /// exactly one `.gguf` file.
    pub fn detect(path: &Path) -> Result<Self, LoadError> {
        if path.is_file() {
            if has_extension(path, "gguf") {
                return Ok(ModelFiles::Gguf(path.to_path_buf()));
            }
            return Err(LoadError::NotAModel {
                path: path.to_path_buf(),
                why: "a file but not a .gguf; pass a GGUF file or a Hugging Face model folder",
            });
        }
        if path.is_dir() {
            if path.join("config.json").is_file() {
                return Ok(ModelFiles::HfDir(path.to_path_buf()));
            }
            let ggufs = files_with_extension(path, "gguf")?;
            if let [one] = ggufs.as_slice() {
                return Ok(ModelFiles::Gguf(one.clone()));
            }
            return Err(LoadError::NotAModel {
                path: path.to_path_buf(),
                why: "has no config.json and not exactly one .gguf file",
            });
        }
        Err(LoadError::NotFound {
            path: path.to_path_buf(),
        })
    }

    /// The folder or file itself.
    pub fn path(&self) -> &Path {
        match self {
            ModelFiles::Gguf(p) | ModelFiles::HfDir(p) => p,
        }
    }
}

fn has_extension(p: &Path, ext: &str) -> bool {
    p.extension().and_then(|e| e.to_str()) == Some(ext)
}

/// The files of `dir` named `*.{ext}`, sorted.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, LoadError> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| LoadError::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| has_extension(p, ext))
        .collect();
    v.sort();
    Ok(v)
}

/// The safetensors files of a Hugging Face folder: those its `model.safetensors.index.json`
/// names when there is one (a folder may hold other `.safetensors` files, such as a second
/// copy in another layout), else every `*.safetensors` file; sorted.
pub fn safetensors_shards(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let index = dir.join(SAFETENSORS_INDEX);
    let files = if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|source| LoadError::Io {
            path: index.clone(),
            source,
        })?;
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: std::collections::BTreeMap<String, String>,
        }
        let parsed: Index = serde_json::from_str(&text).map_err(|source| LoadError::Json {
            path: index.clone(),
            source,
        })?;
        let mut files: Vec<PathBuf> = parsed.weight_map.values().map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        files
    } else {
        files_with_extension(dir, "safetensors")?
    };
    if files.is_empty() {
        return Err(LoadError::NotAModel {
            path: dir.to_path_buf(),
            why: "no *.safetensors files",
        });
    }
    Ok(files)
}
