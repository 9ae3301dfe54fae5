//! Which files of a repository the engine needs.

use super::{HubError, RepoRef};

/// Files read beside the weights of a Hugging Face folder (those present are fetched).
const FOLDER_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
];

pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// config, tokenizer files and safetensors weights; with an index, the shards it names
    /// are known only once the index is read.
    Folder {
        files: Vec<String>,
        index: Option<String>,
    },
    /// One GGUF file, which carries its tokenizer and chat template.
    Gguf(String),
}

fn top_level(f: &str) -> bool {
    !f.contains('/')
}

fn ends_with_ci(f: &str, ext: &str) -> bool {
    f.to_ascii_lowercase().ends_with(ext)
}

pub fn plan(repo: &RepoRef, revision: &str, files: &[String]) -> Result<Plan, HubError> {
    let no_weights = |details: String| HubError::NoWeights {
        repo: repo.id.clone(),
        revision: revision.to_string(),
        details,
    };
    if let Some(gguf) = &repo.gguf_file {
        if files.iter().any(|f| f == gguf) {
            return Ok(Plan::Gguf(gguf.clone()));
        }
        return Err(HubError::FileNotFound {
            repo: repo.id.clone(),
            revision: revision.to_string(),
            file: gguf.clone(),
        });
    }
    let has = |name: &str| files.iter().any(|f| f == name);
    let safetensors: Vec<&String> = files
        .iter()
        .filter(|f| top_level(f) && ends_with_ci(f, ".safetensors"))
        .collect();
    if has(SAFETENSORS_INDEX) || !safetensors.is_empty() {
        if !has("config.json") {
            return Err(no_weights(
                "it has safetensors weights but no config.json".into(),
            ));
        }
        let mut wanted: Vec<String> = FOLDER_FILES
            .iter()
            .filter(|f| has(f))
            .map(|f| f.to_string())
            .collect();
        if has(SAFETENSORS_INDEX) {
            return Ok(Plan::Folder {
                files: wanted,
                index: Some(SAFETENSORS_INDEX.to_string()),
            });
        }
        // A single-file checkpoint next to other exports (e.g. consolidated.safetensors):
        // the transformers name wins.
        if has("model.safetensors") {
            wanted.push("model.safetensors".into());
        } else {
            wanted.extend(safetensors.into_iter().cloned());
        }
        return Ok(Plan::Folder {
            files: wanted,
            index: None,
        });
    }
    let ggufs: Vec<&String> = files.iter().filter(|f| ends_with_ci(f, ".gguf")).collect();
    match ggufs.as_slice() {
        [one] => return Ok(Plan::Gguf((*one).clone())),
        [] => {}
        many => {
            let list: Vec<&str> = many.iter().take(12).map(|s| s.as_str()).collect();
            return Err(no_weights(format!(
                "it holds {} GGUF files; name one as --model-path {}/<file>: {}{}",
                many.len(),
                repo.id,
                list.join(", "),
                if many.len() > list.len() { ", ..." } else { "" }
            )));
        }
    }
    let other: Vec<&str> = files
        .iter()
        .filter(|f| {
            [".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx"]
                .iter()
                .any(|e| ends_with_ci(f, e))
        })
        .take(6)
        .map(|s| s.as_str())
        .collect();
    Err(no_weights(if other.is_empty() {
        "no *.safetensors or *.gguf files".into()
    } else {
        format!(
            "no *.safetensors or *.gguf files (found {}; this engine reads safetensors and GGUF)",
            other.join(", ")
        )
    }))
}

/// The shard files named by a `model.safetensors.index.json`, each once, in order.
pub fn shards_from_index(text: &str, available: &[String]) -> Result<Vec<String>, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no weight_map object")?;
    let mut shards: Vec<String> = Vec::new();
    for file in map.values() {
        let f = file
            .as_str()
            .ok_or("a weight_map value is not a file name")?;
        if !shards.iter().any(|s| s == f) {
            shards.push(f.to_string());
        }
    }
    shards.sort();
    if shards.is_empty() {
        return Err("the weight_map is empty".into());
    }
    if let Some(missing) = shards.iter().find(|s| !available.contains(s)) {
        return Err(format!(
            "it names {missing}, which the repository does not have"
        ));
    }
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn folder_takes_config_tokenizer_and_weights_only() {
        let repo = RepoRef::parse("org/m").expect("id");
        let files = names(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors",
            "consolidated.safetensors",
            "pytorch_model.bin",
            "original/params.json",
        ]);
        let p = plan(&repo, "main", &files).expect("plan");
        assert_eq!(
            p,
            Plan::Folder {
                files: names(&[
                    "config.json",
                    "tokenizer.json",
                    "tokenizer_config.json",
                    "model.safetensors"
                ]),
                index: None
            }
        );
    }

    #[test]
    fn gguf_repos_need_one_file() {
        let repo = RepoRef::parse("org/m-GGUF").expect("id");
        let one = names(&["README.md", "m.Q4_1.gguf"]);
        assert_eq!(
            plan(&repo, "main", &one).expect("plan"),
            Plan::Gguf("m.Q4_1.gguf".into())
        );
        let many = names(&["m.Q4_1.gguf", "m.Q8_0.gguf"]);
        let err = plan(&repo, "main", &many)
            .expect_err("ambiguous")
            .to_string();
        assert!(
            err.contains("org/m-GGUF/<file>") && err.contains("m.Q8_0.gguf"),
            "{err}"
        );
        let named = RepoRef::parse("org/m-GGUF/m.Q8_0.gguf").expect("id");
        assert_eq!(
            plan(&named, "main", &many).expect("plan"),
            Plan::Gguf("m.Q8_0.gguf".into())
        );
        let missing = RepoRef::parse("org/m-GGUF/m.F16.gguf").expect("id");
        assert!(matches!(
            plan(&missing, "main", &many),
            Err(HubError::FileNotFound { .. })
        ));
    }

    #[test]
    fn pickles_are_not_weights() {
        let repo = RepoRef::parse("org/m").expect("id");
        let err = plan(&repo, "main", &names(&["config.json", "pytorch_model.bin"]))
            .expect_err("no usable weights")
            .to_string();
        assert!(
            err.contains("pytorch_model.bin") && err.contains("safetensors"),
            "{err}"
        );
    }

    #[test]
    fn index_names_its_shards() {
        let avail = names(&["a.safetensors", "b.safetensors"]);
        let idx = r#"{"metadata":{},"weight_map":{"x":"b.safetensors","y":"a.safetensors","z":"b.safetensors"}}"#;
        assert_eq!(shards_from_index(idx, &avail).expect("shards"), avail);
        let bad = r#"{"weight_map":{"x":"c.safetensors"}}"#;
        assert!(shards_from_index(bad, &avail).is_err());
    }
}
